"""``tmc bench decode``: speculative decoding against plain and assisted decoding on one model pair.

Side by side in one run, on the same prompts, every method decodes exactly
``new_tokens`` tokens per prompt (EOS does not stop it) at each temperature:

* ``ar``: Hugging Face ``generate`` (dynamic cache), the baseline of the speedups;
* ``ar-static``: ``generate(..., cache_implementation="static")``; on CUDA
  transformers compiles the forward for a static cache, so this is the strong
  baseline (a warm-up run of full length pays the compilation first);
* ``ar-loop``: :func:`spec.llm.generate.ar_generate`, our own plain loop, on
  the same KV cache as our speculative methods (``--cache``; on CUDA by
  default the static cache with captured graphs), so it shows what the cache
  and graphs alone give;
* ``hf-assisted``: ``generate(..., assistant_model=draft)`` (transformers'
  assisted generation, its default schedule);
* ``BUILDER:VERIFIER[@BUDGET]``: :func:`spec.llm.generate.generate` with that
  tree builder and lossless verifier (budget: draft nodes per step);
  ``BUILDER/KEY=VALUE/...:VERIFIER`` sets builder parameters
  (``wetap/w_min=4/w_max=16:traversal@16``), as ``tmc decode --param`` does;
  ``chain:VERIFIER:host[@BUDGET]`` runs a chain through the host builder
  (``chain_on_device=False``) instead of the device path, for a side-by-side
  of the two (same tokens), and ``fixed/draw=iid:VERIFIER:host`` does the same
  for a fixed i.i.d. tree (``fixed/draw=topk:…:host`` for a top-k one); a ``:torch`` or ``:numpy`` flag after the
  verifier sets ``verify_backend`` (default ``auto``: numpy, but torch for
  a chain drafted on a GPU with a chain verifier and large rows, as
  :func:`~spec.llm.generate.resolve_verify_backend` says), e.g. ``dyspec:traversal:torch`` beside
  ``dyspec:traversal:numpy`` (same tokens), and ``:device`` walks ``multidraft`` / ``traversal`` /
  ``ordered_traversal`` / ``kseq`` on a tree drafted on the device there too (``fixed/draw=iid:traversal:device``); a ``:dtemp=T`` flag drafts at temperature ``T``
  (``generate``'s ``draft_temperature``) instead of the row's, e.g.
  ``fixed/draw=topk:traversal:dtemp=1``, whose tree at temperature 0 branches;
  a ``:graph`` flag (a ``chain`` with a chain verifier, or a ``chain`` / ``fixed``
  tree drawn ``iid``, ``swor`` or ``topk`` with ``multidraft`` / ``traversal`` / ``ordered_traversal`` (at most
  2 children a node drawn ``swor``), or ``iid`` with ``kseq``) runs every
  step after the first as one fixed-shape piece of device work, captured as one
  CUDA graph (``generate``'s ``step_graph``, on the static cache whatever
  ``--cache`` says), e.g. ``chain:sps:graph`` or
  ``fixed/draw=topk:traversal:dtemp=1:graph@6``; ``:compiled`` does the same with the step's
  draws and verifier compiled by ``torch.compile`` first (``compile_step``), ``:whole`` with the
  whole step compiled (``compile_step="whole"``); a row without one of them runs unfused
  (``step_graph=False``, not ``generate``'s default ``"auto"``), so it and its ``:graph`` twin
  compare the two.  A fused row's steps are not split into builder,
  verifier and forwards, so its cost columns come from
  :meth:`~spec.llm.step_graph.ChainStepGraph.profile` after the first prompt:
  the step against its forwards alone (``bld+ver %``: the difference, of the
  target forward), with ``step_*`` fields in the JSON.

Figures per method and temperature: tokens per target step, tokens/s
(prefill included, all prompts together), speedup against ``ar``,
``ar-static`` and ``hf-assisted``, and the per-step costs of our loop as a
percentage of the target forward time: the builder's own work (builder time
minus draft forwards), the verifier, and the draft forwards.  At temperature
0 the ``=ar`` column is the share of prompts whose tokens equal ``ar``'s
(greedy decoding): 1.0 in float32; in bfloat16 a tree forward and a one-token
forward round differently, so an argmax tie can flip.  Where HF ``generate``
is known to leave greedy decoding (a ``longrope`` target across its switch
on transformers 5.17-5.19: :func:`_hf_generate_off_greedy`) the column
compares with ``ar-loop``'s tokens instead (``reference_why`` in the
report), and the table says so.  ``reference`` names the row compared
with, ``None`` when that row is not among the methods (no ``=ar`` then).

HF generate is called with no EOS token, like our loops, so every row decodes
``max_new_tokens`` tokens from the same law (masking the EOS instead, with
``min_new_tokens``, changed the law wherever the EOS was likely), and, at
temperature > 0, with ``top_k=0, top_p=1.0``, so its law is the plain
softmax our methods use; the models' own ``generation_config`` is set aside
for the call (only its special tokens but the EOS, and the assistant's
schedule, are kept), so no ``repetition_penalty``, ``no_repeat_ngram_size``, ``min_p``,
``suppress_tokens`` ... of a checkpoint's config reaches the baselines (our
loops never read it).  A decode that would run past a model's learned
position table is refused before any run.  The prompts are held out by the
corpus options of the pair's training (``report.json`` of
:mod:`spec.llm.train` in the pair's folder), or by its defaults when there is
no such file.  Timings are wall-clock seconds with the device
synchronised; one untimed warm-up decode per method (the first prompt, full length) comes
first, after the shared static caches are sized for the longest run, so no timed run grows a
cache or captures a graph the warm-up did not.  Batch size 1.
The methods take turns prompt by prompt (interleaved, the order rotated from
one prompt to the next) rather than one after another, so that a slow spell
of a shared machine does not fall on a few methods only (``--order
sequential`` runs them one after another); ``--rounds R`` repeats the set
and reports each speedup's range over the rounds.  ``--count-ops`` adds the
torch operations each of our loops dispatches outside the model forwards per
step (:mod:`spec.llm.opcount`: on a GPU each is host work, most of them a
kernel launch); compiled rows (``compiled``, ``whole``) are not counted, since
torch.compile refuses to trace under the counting dispatch mode.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["DEFAULT_METHODS", "Method", "add_options", "bench", "heldout_options", "heldout_prompts", "parse_method",
           "render", "run_as_module", "run_decode_bench"]

#: Printed by the command line when a multi-threaded CPU run has sleeping OpenMP workers.
PASSIVE_WARNING = (
    "note: OMP_WAIT_POLICY=PASSIVE puts torch's OpenMP workers to sleep between operations; on the 2-core CPU "
    "a 5-token forward of the CPU pair's target took 2-3x as long as without it (a 1-token forward did not), "
    "which penalises every multi-token method; unset it (or use --threads 1) for timings"
)

#: Baselines that are not our loop.
BASELINES = ("ar", "ar-static", "ar-loop", "hf-assisted")
DEFAULT_METHODS = (
    "ar", "ar-static", "ar-loop", "hf-assisted",
    "chain:sps", "chain:asps", "chain:block",
    "fixed:multidraft", "fixed:traversal", "fixed:ordered_traversal", "fixed/draw=iid:kseq",
    "dyspec:traversal", "dyspec:multidraft",
    "dynatree:traversal", "wetap:traversal",
    "fixed/draw=topk:traversal:dtemp=1@6",  # a top-k tree of the draft at 1: at T = 0 it branches (README)
    # assisted generation's own rule (up to 20 tokens, stop after q(x) < 0.4), as an argmax chain and a sampled one
    "chain/draw=topk/confidence=0.4:sps:dtemp=1@20", "chain/confidence=0.4:block:dtemp=1@20",
)


@dataclass(frozen=True)
class Method:
    """A row of the benchmark: a baseline name, or builder + verifier (+ budget)."""

    name: str
    builder: str | None = None
    verifier: str | None = None
    budget: int | None = None
    on_host: bool = False  # a chain through the host builder (generate's chain_on_device=False)
    params: tuple[tuple[str, Any], ...] = ()  # builder parameters (generate's builder_params), in the given order
    backend: str = "auto"  # generate's verify_backend
    draft_temperature: float | None = None  # generate's draft_temperature (None: the row's temperature)
    step_graph: bool = False  # generate's step_graph: each chain step one fixed-shape graph
    compile_step: bool | str = False  # generate's compile_step: the fused step's draws and verifier, or "whole"

    @property
    def ours(self) -> bool:
        """Decoded by this project's loop (:mod:`spec.llm.generate`), not by an HF baseline."""
        return self.builder is not None or self.name == "ar-loop"

    @property
    def label(self) -> str:
        if self.builder is None:
            return self.name
        shown = "".join(f"/{k}={v}" for k, v in self.params)
        return (f"{self.builder}{shown}+{self.verifier}@{self.budget}" + ("/host" if self.on_host else "")
                + ("" if self.backend == "auto" else f"/{self.backend}")
                + ("" if self.draft_temperature is None else f"/dtemp={self.draft_temperature:g}")
                + ("/whole" if self.compile_step == "whole" else "/compiled" if self.compile_step
                   else "/graph" if self.step_graph else ""))


def _builder_params(text: str, fields: list[str]) -> tuple[tuple[str, Any], ...]:
    """``KEY=VALUE`` fields after a builder name (values as ``tmc decode --param`` reads them)."""
    from spec.cli import parse_param

    out: dict[str, Any] = {}
    for field in fields:
        bad = ValueError(f"method {text!r}: builder parameters are /KEY=VALUE, got {field!r}")
        key, sep, value = (part.strip() for part in field.partition("="))
        if not value:  # parse_param would read an empty value as the text ""
            raise bad
        try:
            name, parsed = parse_param(f"{key}{sep}{value}")
        except ValueError:
            raise bad from None
        if name in out:
            raise ValueError(f"method {text!r}: builder parameter {name!r} given twice")
        out[name] = parsed
    return tuple(out.items())


def parse_method(text: str, budget: int, chain_budget: int) -> Method:
    """``ar`` / ``ar-static`` / ``ar-loop`` / ``hf-assisted``, or ``BUILDER[/KEY=VALUE...]:VERIFIER[:FLAG...][@BUDGET]``
    (``ValueError`` else, bad builder parameters included).

    ``/KEY=VALUE`` fields set builder parameters, e.g. ``wetap/w_min=4/w_max=16:traversal@16``.
    Flags: ``host`` (the chain and fixed builders only: the host builder
    instead of drafting on the device, ``chain_on_device=False``), ``torch``, ``numpy`` or ``device`` (the
    ``verify_backend``; default ``auto``) and ``dtemp=T`` (``draft_temperature``; default: the
    row's temperature), e.g. ``chain:sps:host:torch`` or ``fixed/draw=topk:traversal:dtemp=1``.
    """
    from spec.builders import BUILDERS, make_builder
    from spec.llm.generate import VERIFIERS, check_decode_options
    from spec.builders import FixedBuilder
    from spec.llm.tree_device import DEVICE_TREE_METHODS, walks_on_device
    from spec.llm.verify import CHAIN_METHODS

    text = text.strip()
    if text in BASELINES:
        return Method(text)
    spec, _, b = text.partition("@")
    builder, sep, verifier = spec.partition(":")
    builder, *fields = builder.split("/")
    verifier, *flags = verifier.split(":")
    dtemp = [f for f in flags if f.startswith("dtemp=")]
    flags = [f for f in flags if not f.startswith("dtemp=")]
    unknown = [f for f in flags if f not in ("host", "torch", "numpy", "device", "graph", "compiled", "whole")]
    backends = {"torch", "numpy", "device"} & set(flags)
    if unknown or len(set(flags)) != len(flags) or len(backends) > 1 or len(dtemp) > 1:
        raise ValueError(f"method {text!r}: the fields after the verifier are flags, each at most once: 'host', "
                         f"one of 'graph' / 'compiled' / 'whole', one of 'torch' / 'numpy' / 'device', and 'dtemp=T'; "
                         f"got {':'.join(flags + dtemp)!r}")
    draft_temperature = None
    if dtemp:
        try:
            draft_temperature = float(dtemp[0].partition("=")[2])
        except ValueError:
            draft_temperature = -1.0
        if not 0 <= draft_temperature < float("inf"):
            raise ValueError(f"method {text!r}: dtemp takes a finite draft temperature >= 0, got {dtemp[0]!r}")
    on_host = "host" in flags
    if on_host and builder not in ("chain", "fixed"):
        raise ValueError(f"method {text!r}: only the chain and fixed builders (drafted on the device) take the flag "
                         f"'host'")
    compile_step: bool | str = "whole" if "whole" in flags else "compiled" in flags
    step_graph = "graph" in flags or bool(compile_step)
    fused_needs = (f"method {text!r}: the flag 'graph' (generate's step_graph), 'compiled' (step_graph and "
                   f"compile_step) or 'whole' (compile_step='whole'), one of them, takes the chain builder with a "
                   f"chain verifier, or the chain (no confidence stop) or fixed builder with "
                   f"{' / '.join(DEVICE_TREE_METHODS)} (ordered_traversal: no node with 3 or more children "
                   f"drawn swor), drafting on the device, without 'host' or 'numpy'")
    if len({"graph", "compiled", "whole"} & set(flags)) > 1 or (
            step_graph and (builder not in ("chain", "fixed") or on_host or "numpy" in flags)):
        raise ValueError(fused_needs)
    backend = next((f for f in flags if f not in ("host", "graph", "compiled", "whole")), "auto")
    if not sep or builder not in BUILDERS or verifier not in VERIFIERS:
        raise ValueError(
            f"method {text!r}: use one of {', '.join(BASELINES)} or BUILDER:VERIFIER[@BUDGET] with a builder of "
            f"{', '.join(BUILDERS)} and a verifier of {', '.join(VERIFIERS)}"
        )
    if b:
        try:
            n = int(b)
        except ValueError:
            n = 0
        if n < 1:
            raise ValueError(f"method {text!r}: the budget after @ must be a positive integer")
    else:
        n = chain_budget if builder == "chain" else budget
    params = _builder_params(text, fields)
    try:  # refuse unknown or bad parameters, budgets and pairings before any model loads
        made = make_builder(builder, **dict(params))
        # the row's temperature is not known yet: 0 (a one-hot draft) refuses only what no temperature
        # allows; check_rows repeats the check at each row's temperature
        check_decode_options(made, verifier, n, temperature=0.0, draft_temperature=draft_temperature)
    except ValueError as err:
        raise ValueError(f"method {text!r}: {err}") from None
    # a fixed tree or a chain of fixed length is fused at both of the bench's temperatures (generate._device_shape):
    # drawn iid; or topk / swor from a draft above temperature 0, whose rows keep width tokens (the bench sets no
    # top-k or top-p); or from a greedy draft, whose rows are one-hot and make the tree a chain
    # (ordered Traversal has no device walk at a node with 3 or more children drawn swor)
    shape = made.full_shape(n) if isinstance(made, FixedBuilder) else tuple(range(-1, n - 1))
    fused_tree = (walks_on_device(verifier, shape, getattr(made, "draw", "iid"))
                  and getattr(made, "confidence", None) is None)
    if step_graph and not (fused_tree or (builder == "chain" and verifier in CHAIN_METHODS)):
        raise ValueError(fused_needs)
    return Method(text, builder, verifier, n, on_host, params, backend, draft_temperature, step_graph, compile_step)


def heldout_prompts(tokenizer: Any, n: int, length: int, val_every: int = 50, max_chars: int | None = None,
                    roots: Sequence[str] | None = None) -> list[list[int]]:
    """``n`` prompts of exactly ``length`` tokens from standard-library files that training held out.

    :mod:`spec.llm.train` holds out every ``val_every``-th file of its walk
    of ``roots`` (the standard library first; default: the standard library
    alone), capped at ``max_chars`` characters, so the split rebuilt here with
    the options the pair was trained with (:func:`heldout_options`) names
    files it never trained on, on the machine that trained it.  Only held-out
    files under the first root (the standard library) give prompts.  Each
    prompt is a window starting a third of the way into its file; files too
    short are skipped.
    """
    from spec.llm.train import collect_corpus, source_roots, split_corpus

    roots = tuple(roots) if roots else source_roots(False)
    _, val = split_corpus(collect_corpus(roots, max_chars), val_every)
    stdlib = f"{Path(roots[0]).name}/"  # collect_corpus names a file by its root's folder name
    prompts = []
    for doc in val:
        if not doc.name.startswith(stdlib):
            continue
        ids = tokenizer(doc.text)["input_ids"]
        start = len(ids) // 3
        if len(ids) - start >= length:
            prompts.append(list(ids[start : start + length]))
    if len(prompts) < n:
        raise ValueError(f"only {len(prompts)} held-out files have {length} tokens past their first third; lower --prompts")
    step = len(prompts) / n
    return [prompts[int(i * step)] for i in range(n)]


def heldout_options(folder: str | Path | None) -> tuple[dict[str, Any], str]:
    """(:func:`heldout_prompts`' corpus options, a line saying where they come from) for a pair in ``folder``.

    From ``folder/report.json`` when :mod:`spec.llm.train` wrote one there (its ``config``: ``val_every``,
    ``max_chars``, ``roots``); recorded roots that are not on this machine are replaced by this machine's
    (:func:`spec.llm.train.source_roots`, the same files if it has the same Python).  Without such a file,
    spec.llm.train's defaults (every 50th standard-library file, no cap): a pair trained with other corpus
    options may then have trained on some of the prompts.  A ``report.json`` that cannot be read raises a
    one-line ``ValueError`` naming it.
    """
    from spec.llm.train import TrainConfig, source_roots

    report = None if folder is None else Path(folder, "report.json")
    config: Any = None
    if report is not None and report.is_file():
        try:
            config = json.loads(report.read_text(encoding="utf-8")).get("config")
        except (OSError, UnicodeDecodeError, ValueError, AttributeError) as err:
            raise ValueError(f"{report}: cannot read spec.llm.train's report: {' '.join(str(err).split())[:200]}") from None
    if not isinstance(config, dict) or "val_every" not in config:
        default = TrainConfig(out="")
        where = ("target and draft are not in one folder" if folder is None
                 else f"no spec.llm.train report.json in {folder}")
        return ({"val_every": default.val_every, "max_chars": default.max_chars, "roots": list(source_roots(False))},
                f"prompts: {where}, so held out as spec.llm.train's defaults hold out (every {default.val_every}th "
                f"standard-library file, no --max-chars); a pair trained with other corpus options may have trained "
                f"on them")
    _check_report_fields(report, config)
    options = {"val_every": config["val_every"], "max_chars": config.get("max_chars"),
               "roots": list(config.get("roots") or source_roots(False))}
    note = ""
    if not all(Path(r).is_dir() for r in options["roots"]):
        options["roots"] = list(source_roots(bool(config.get("site_packages", len(options["roots"]) > 1))))
        note = f"; its roots are not on this machine, this machine's are used ({', '.join(options['roots'])})"
    return options, (f"prompts: held out as the pair's training held them out ({report}: val_every="
                     f"{options['val_every']}, max_chars={options['max_chars']}){note}")


def _check_report_fields(report: Path | None, config: dict[str, Any]) -> None:
    """``ValueError`` naming ``report`` unless its corpus fields have spec.llm.train's types (a ``null`` or a text
    ``val_every`` / ``max_chars`` had reached the corpus split as a ``TypeError``)."""
    def whole(value: object) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)

    val_every, max_chars, roots = config.get("val_every"), config.get("max_chars"), config.get("roots")
    if not whole(val_every) or val_every < 2:  # type: ignore[operator]
        raise ValueError(f"{report}: config.val_every must be an integer >= 2, got {val_every!r}")
    if max_chars is not None and (not whole(max_chars) or max_chars < 1):
        raise ValueError(f"{report}: config.max_chars must be null or an integer >= 1, got {max_chars!r}")
    if roots is not None and (not isinstance(roots, list) or not all(isinstance(r, str) for r in roots)):
        raise ValueError(f"{report}: config.roots must be a list of folder names, got {roots!r}")


def _hf_kwargs(temperature: float, new_tokens: int, pad: int) -> dict[str, Any]:
    kw: dict[str, Any] = {"max_new_tokens": new_tokens, "pad_token_id": pad}
    if temperature > 0:
        kw.update(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
    else:
        kw.update(do_sample=False, temperature=None, top_k=None, top_p=None)
    return kw


#: What a baseline keeps of a model's ``generation_config``: its special tokens but the EOS (our loops decode
#: every row to ``new_tokens`` with no EOS: an HF call that kept it would stop there, and one that masked it with
#: ``min_new_tokens`` would sample another law wherever the EOS is likely), ...
_TOKEN_FIELDS = ("bos_token_id", "pad_token_id", "decoder_start_token_id")
#: ... and, for the assistant, the schedule of assisted generation (how far it drafts; not the law)
_SCHEDULE_FIELDS = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")


@contextmanager
def _plain_generation_config(models: Sequence[tuple[Any, tuple[str, ...]]]) -> Iterator[None]:
    """Each ``(model, fields)``'s ``generation_config`` replaced, for the ``with`` block, by a fresh one that
    holds only ``fields`` of it.

    HF ``generate`` fills every setting the call does not give from the model's config, and in
    transformers 5 every ``None`` field of a config passed to it too (so a fresh ``GenerationConfig``
    argument is not enough): a checkpoint's ``repetition_penalty``, ``no_repeat_ngram_size``, ``min_p``,
    ``suppress_tokens``, ... would change the law a baseline samples from, while our loops never read
    them (with ``repetition_penalty`` 1.05 a tiny pair's ``ar`` agreed with ``ar-loop`` on 1 prompt of 4
    at T = 0).  The schedule fields are copied back on the way out: a ``heuristic`` schedule carries its
    ``num_assistant_tokens`` from one call to the next.
    """
    from transformers import GenerationConfig

    saved = [(model, getattr(model, "generation_config", None), fields) for model, fields in models]
    try:
        for model, old, fields in saved:
            kept = {f: getattr(old, f, None) for f in fields}
            model.generation_config = GenerationConfig(  # type: ignore[no-untyped-call]
                **{f: v for f, v in kept.items() if v is not None})
        yield
    finally:
        for model, old, fields in saved:
            if old is not None:
                for f in set(fields) & set(_SCHEDULE_FIELDS):
                    setattr(old, f, getattr(model.generation_config, f, None))
            model.generation_config = old


def _run_one(method: Method, target: Any, draft: Any, prompt: list[int], temperature: float, new_tokens: int,
             seed: int, cache: str = "auto") -> dict[str, Any]:
    """Decode one prompt; tokens, seconds and per-step costs."""
    import torch

    from spec.llm.adapter import sync
    from spec.llm.static_cache import model_device
    from spec.llm.generate import ar_generate, generate

    device = model_device(target)
    if method.step_graph:  # the fused steps run on the static cache whatever the others use
        cache = "static"
    if method.ours:
        if method.builder is None:
            out = ar_generate(target, prompt, temperature=temperature, max_new_tokens=new_tokens, seed=seed,
                              cache=cache)
        else:
            assert method.verifier is not None and method.budget is not None  # parse_method sets all three
            out = generate(target, draft, prompt, method.builder, method.verifier, budget=method.budget,
                           temperature=temperature, max_new_tokens=new_tokens, seed=seed, cache=cache,
                           builder_params=dict(method.params), chain_on_device=not method.on_host,
                           verify_backend=method.backend, draft_temperature=method.draft_temperature,
                           step_graph=method.step_graph, compile_step=method.compile_step)
        s = out.summary()
        return {"tokens": out.tokens, "seconds": out.total_s, "steps": len(out.steps), "tree": s["mean_tree_size"],
                "build_s": s["build_s"], "draft_s": s["draft_s"], "target_s": s["target_s"], "verify_s": s["verify_s"],
                "graph_s": s["graph_s"], "loop_s": s["loop_s"]}
    ids = torch.tensor([prompt], device=device)
    kw = _hf_kwargs(temperature, new_tokens, pad=0)
    if method.name == "ar-static":
        kw["cache_implementation"] = "static"
    calls = [0]
    handle = None
    plain: list[tuple[Any, tuple[str, ...]]] = [(target, _TOKEN_FIELDS)]
    if method.name == "hf-assisted":
        kw["assistant_model"] = draft
        plain.append((draft, _TOKEN_FIELDS + _SCHEDULE_FIELDS))
        handle = target.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    try:
        with _plain_generation_config(plain):
            torch.manual_seed(seed)
            sync(device)
            t0 = time.perf_counter()
            seq = target.generate(ids, attention_mask=torch.ones_like(ids), **kw)
            sync(device)
            seconds = time.perf_counter() - t0
    finally:
        if handle is not None:
            handle.remove()
    tokens = seq[0, len(prompt):].tolist()
    steps = calls[0] if method.name == "hf-assisted" else len(tokens)
    return {"tokens": tokens, "seconds": seconds, "steps": steps, "tree": None,
            "build_s": None, "draft_s": None, "target_s": None, "verify_s": None}


def _ops_per_step(method: Method, target: Any, draft: Any, prompt: list[int], temperature: float, new_tokens: int,
                  seed: int, cache: str) -> tuple[float, float]:
    """Torch operations dispatched outside the models' forwards per step, over one untimed decode: all of them,
    and those that are not views (each a kernel on a GPU)."""
    from spec.llm.opcount import count_ops

    run, count = count_ops(lambda: _run_one(method, target, draft, prompt, temperature, new_tokens, seed, cache),
                           (target, draft))
    steps = max(1, run["steps"])
    return count.per(steps), count.per(steps, kernels=True)


def _step_profile(method: Method, target: Any, draft: Any, prompt: list[int], temperature: float,
                  cache: str, reps: int = 50) -> dict[str, float]:
    """A ``graph`` row's costs, which its fused steps do not split: :meth:`ChainStepGraph.profile
    <spec.llm.step_graph.ChainStepGraph.profile>` (or :class:`~spec.llm.tree_step_graph.TreeStepGraph`'s) after
    the prompt, on the step graph the row's decodes used."""
    from spec.builders import ChainBuilder, make_builder
    from spec.llm.generate import (
        COMPILE_BACKEND, _device_shape, _draft_sampling, _new_cache, _prefill, _Shape, cache_capacity,
    )
    from spec.llm.sampling import Sampling
    from spec.llm.step_graph import FusedStep, shared_chain_step
    from spec.llm.tree_device import DEVICE_TREE_METHODS
    from spec.llm.tree_step_graph import shared_tree_step
    from tmc.multidraft import Draw

    assert method.verifier is not None and method.budget is not None and method.builder is not None
    sampling = Sampling(temperature)
    dtemp = method.draft_temperature
    d_sampling = sampling if dtemp is None else _draft_sampling(dtemp, None, None)
    built = make_builder(method.builder, **dict(method.params))
    vocab = int(target.config.vocab_size)
    slots = cache_capacity(len(prompt), 0, method.budget)
    t_cache, d_cache = (_new_cache(m, cache, role, slots, None) for m, role in ((target, "target"), (draft, "draft")))
    for model, kv in ((target, t_cache), (draft, d_cache)):
        _prefill(model, kv, prompt[:-1])
    compile_backend = COMPILE_BACKEND if method.compile_step else None
    scope = "whole" if method.compile_step == "whole" else "parts"
    step: FusedStep
    if method.verifier in DEVICE_TREE_METHODS:  # the shape and layout generate gives the tree (its default order)
        got = _device_shape(built, method.verifier, method.budget, d_sampling, vocab)
        assert got is not None  # parse_method: a chain or fixed tree, which generate drafts on the device
        parents, kind = got  # a greedy draft's fixed tree is a chain
        shape = _Shape.of(parents, kind, "dfs", vocab, t_cache.device)
        step = shared_tree_step(target, draft, t_cache, d_cache, parents=parents, order=shape.order,
                                verifier=method.verifier, sampling=sampling, d_sampling=d_sampling, vocab=vocab,
                                draw=kind, compile_backend=compile_backend, compile_scope=scope)
    else:
        assert isinstance(built, ChainBuilder)
        step = shared_chain_step(target, draft, t_cache, d_cache, k=method.budget, verifier=method.verifier,
                                 iid=built.draw == Draw.IID, sampling=sampling, d_sampling=d_sampling, vocab=vocab,
                                 compile_backend=compile_backend, compile_scope=scope)
    past = len(prompt) - 1
    return step.profile(past, prompt[-1], past, [prompt[-1]], reps=reps)


def _pct(part: float | None, whole: float | None) -> float | None:
    return None if part is None or not whole else 100.0 * part / whole


def _row(method: Method, temp: float, runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One table row from a method's runs at one temperature (every prompt, every round)."""
    n_tok = sum(len(r["tokens"]) for r in runs)
    secs = sum(r["seconds"] for r in runs)
    steps = sum(r["steps"] for r in runs)
    row: dict[str, Any] = {
        "method": method.label, "temperature": temp, "runs": len(runs), "new_tokens": n_tok,
        "seconds": secs, "tokens_per_s": n_tok / secs if secs > 0 else 0.0,
        "tokens_per_step": n_tok / steps if steps else 0.0,
    }
    if method.builder is not None:
        tot = {k: sum(r[k] for r in runs) for k in ("build_s", "draft_s", "target_s", "verify_s", "graph_s", "loop_s")}
        # draft nodes per step over every step of every run (not a mean of the runs' means)
        row.update(mean_tree=sum(r["tree"] * r["steps"] for r in runs) / steps if steps else 0.0, **tot,
                   builder_pct=_pct(tot["build_s"] - tot["draft_s"], tot["target_s"]),
                   verify_pct=_pct(tot["verify_s"], tot["target_s"]),
                   loop_pct=_pct(tot["loop_s"], tot["target_s"]),
                   called_pct=_pct(tot["build_s"] - tot["draft_s"] + tot["verify_s"] + tot["loop_s"], tot["target_s"]),
                   draft_pct=_pct(tot["draft_s"], tot["target_s"]),
                   overhead_pct=_pct(tot["build_s"] - tot["draft_s"] + tot["verify_s"], tot["target_s"]))
    return row


#: How a round orders its runs (:func:`run_decode_bench`).
RUN_ORDERS = ("interleaved", "sequential")


def _schedule(n_methods: int, n_prompts: int, rnd: int, order: str) -> list[tuple[int, int]]:
    """Round ``rnd``'s runs as (prompt, method) pairs: every method on a prompt before the next prompt, the
    method order rotated by one per prompt (``interleaved``), or every prompt of a method before the next
    method (``sequential``)."""
    if order == "sequential":
        return [(i, k) for k in range(n_methods) for i in range(n_prompts)]
    out = []
    for i in range(n_prompts):
        shift = (rnd * n_prompts + i) % n_methods
        out += [(i, k) for k in [*range(shift, n_methods), *range(shift)]]
    return out


def _check_positions(target: Any, draft: Any, prompts: Sequence[Sequence[int]], methods: Sequence[Method],
                     new_tokens: int) -> None:
    """Refuse, before any run, a decode that would feed a model past its learned position table.

    Our loops check this themselves (:func:`~spec.llm.adapter.check_positions`, a one-line ``ValueError``),
    but only when their turn comes; HF ``generate`` does not, and a baseline failed with an ``IndexError``
    deep in the forward (a 32-position GPT-2 pair, a 40-token prompt).  A speculative row feeds both
    models one position further (its last step's trees are cut to the table); HF's assistant drafts no
    further than its target.
    """
    from spec.llm.adapter import check_positions

    reach = max(len(p) for p in prompts) + new_tokens - 1
    ours = any(m.builder is not None for m in methods)
    ahead = 1 if ours else 0
    check_positions(target, "target", reach + ahead, speculative=ours)
    if ours or any(m.name == "hf-assisted" for m in methods):
        check_positions(draft, "draft", reach + ahead, speculative=ours)


def _hf_generate_off_greedy(target: Any, prompts: Sequence[Sequence[int]], new_tokens: int) -> str | None:
    """Why Hugging Face ``generate`` leaves the target's greedy decoding on this run, or ``None``.

    transformers 5.17-5.19: a ``longrope`` model (Phi-3 128k, Phi-4-mini) drops its cache when the sequence
    first passes its switch ``s`` but still feeds only the newest token, so that forward, which decodes position
    ``s + 1``, sees no context (5.20 feeds the whole sequence there).  A prompt of at most ``s`` tokens that
    decodes to ``s + 2`` or more meets it.  ``ar`` and ``ar-static`` are then no reference for the ``=ar``
    column; ``ar-loop`` (:func:`~spec.llm.generate.ar_generate`, which recomputes its cache there) is.
    """
    from spec.llm.adapter import rope_switches

    version = _transformers_version()
    if tuple(int(part) for part in version.split(".")[:2]) >= (5, 20):
        return None
    met = [s for s in rope_switches(target.config) if any(len(p) <= s < len(p) + new_tokens - 1 for p in prompts)]
    if not met:
        return None
    return (f"transformers {version}'s generate feeds a longrope target only its newest token when it drops its "
            f"cache at the switch ({met[0]}), fixed in 5.20")


def _transformers_version() -> str:
    import transformers

    return str(transformers.__version__)


def _presize_static_caches(target: Any, draft: Any, prompts: Sequence[Sequence[int]], methods: Sequence[Method],
                           new_tokens: int) -> None:
    """Grow the models' shared static caches to the largest capacity any of our runs asks for.

    Each decode asks for :func:`~spec.llm.generate.cache_capacity` slots and a shared cache grows
    to it, dropping the graphs it captured.  Sized once up front, the caches never grow during the
    warm-up or the timed runs, so the warm-up's captures are the ones the timed runs replay (before
    this, a row whose budget asked for more slots than the rows before it paid new captures, and
    so did the rows after it, in their timed runs).
    """
    from spec.builders import make_builder
    from spec.llm.generate import cache_capacity
    from spec.llm.static_cache import shared_static_cache

    ours = [m for m in methods if m.ours]
    if not ours:
        return
    longest = max(len(p) for p in prompts)
    slots = max(cache_capacity(longest, new_tokens, m.budget or 0) for m in ours)
    shared_static_cache(target, "target", slots)
    d_slots, vocab = 0, int(target.config.vocab_size)  # WETAP feeds its draft more nodes than its budget
    for m in ours:
        if m.builder is not None and m.budget is not None:
            fed = make_builder(m.builder, **dict(m.params)).draft_nodes(m.budget, vocab)
            d_slots = max(d_slots, cache_capacity(longest, new_tokens, m.budget, fed))
    if d_slots:
        shared_static_cache(draft, "draft", d_slots)


def run_decode_bench(
    target: Any,
    draft: Any,
    prompts: Sequence[Sequence[int]],
    methods: Sequence[Method],
    temperatures: Sequence[float] = (0.0, 1.0),
    new_tokens: int = 128,
    seed: int = 0,
    warmup: bool = True,
    cache: str = "auto",
    progress: Callable[[str], None] | None = None,
    rounds: int = 1,
    order: str = "interleaved",
    count_ops: bool = False,
) -> dict[str, Any]:
    """Every method × temperature on every prompt (module doc); a JSON-able report.

    ``cache`` is the KV cache of our loop (``generate``'s ``cache``: auto,
    dynamic or static); the HF baselines use their own.  The methods are
    interleaved: each prompt is decoded by every method in turn (the order
    rotated by one from prompt to prompt), so a slow spell of a shared
    machine falls on all methods alike instead of on the ones that ran
    during it (``order="sequential"``: each method decodes every prompt
    before the next method starts).  ``rounds`` repeats the whole set
    (same prompts and seeds, so the same tokens); with ``rounds > 1`` each
    row also gets its tok/s per round and the range over rounds of its
    speedups (``speedup_ar_range``, ...), each round's ratio taken within
    that round.  ``count_ops``: after the timed rounds, each of our loops
    (not the HF baselines, whose compiled forwards a dispatch mode would
    disturb) decodes the first prompt once more, untimed, under
    :func:`spec.llm.opcount.count_ops`; the row gets ``ops_per_step``, the
    torch operations dispatched outside the two models' forwards per step, and
    ``kernels_per_step``, those of them that are not views (each a kernel on a GPU).
    """
    import torch
    import transformers

    if not prompts:
        raise ValueError("prompts must hold at least one prompt")
    if new_tokens < 1:
        raise ValueError(f"new_tokens must be >= 1, got {new_tokens}")
    check_rows(methods, temperatures)
    if not isinstance(rounds, int) or isinstance(rounds, bool) or rounds < 1:
        raise ValueError(f"rounds must be a positive integer, got {rounds!r}")
    if order not in RUN_ORDERS:
        raise ValueError(f"order must be one of {RUN_ORDERS}, got {order!r}")
    from spec.llm.generate import resolve_cache
    from spec.llm.static_cache import model_device

    _check_positions(target, draft, prompts, methods, new_tokens)
    cache = resolve_cache(target, cache, draft)
    device = model_device(target)
    if cache == "static" or any(m.step_graph for m in methods):  # no timed run may grow a shared cache:
        # growing drops every graph it captured
        _presize_static_caches(target, draft, prompts, methods, new_tokens)
    rows: list[dict[str, Any]] = []
    n = len(methods)
    hf_off = _hf_generate_off_greedy(target, prompts, new_tokens)
    wanted = "ar" if hf_off is None else "ar-loop"  # whose tokens the =ar column compares with
    reference = wanted if any(m.name == wanted for m in methods) else None  # None: no =ar column
    with torch.inference_mode():
        for temp in temperatures:
            if warmup:  # compilation, graph capture and allocator growth happen here, untimed: a full decode
                for method in methods:
                    _run_one(method, target, draft, list(prompts[0]), temp, new_tokens, seed, cache)
            runs: list[list[list[dict[str, Any]]]] = [[[] for _ in range(rounds)] for _ in methods]
            for rnd in range(rounds):
                t0 = time.perf_counter()
                for i, k in _schedule(n, len(prompts), rnd, order):
                    runs[k][rnd].append(_run_one(methods[k], target, draft, list(prompts[i]), temp, new_tokens,
                                                 seed + i, cache))
                if progress:
                    progress(f"  T={temp:g} round {rnd + 1}/{rounds}: {len(prompts)} prompts x {n} methods in "
                             f"{time.perf_counter() - t0:.1f} s")
            ref = next(([r["tokens"] for r in runs[k][0]] for k, m in enumerate(methods) if m.name == reference),
                       None)
            for method, per_round in zip(methods, runs):
                row = {"prompts": len(prompts), **_row(method, temp, [r for rr in per_round for r in rr])}
                if method.step_graph:  # its fused steps are one graph: the split comes from a profile
                    prof = _step_profile(method, target, draft, list(prompts[0]), temp, "static")
                    row.update({f"step_{k}": v for k, v in prof.items()}, overhead_pct=prof["overhead_pct"],
                               builder_pct=None, verify_pct=None, loop_pct=None,
                               called_pct=prof["call_overhead_pct"], host_pct=prof["host_pct"],
                               draft_pct=100.0 * (prof["forwards_ms"] - prof["target_ms"]) / prof["target_ms"])
                if count_ops and method.ours and not method.compile_step:  # a dispatch mode stops torch.compile
                    row["ops_per_step"], row["kernels_per_step"] = _ops_per_step(
                        method, target, draft, list(prompts[0]), temp, new_tokens, seed, cache)
                if rounds > 1:
                    row["tokens_per_s_rounds"] = [_row(method, temp, rr)["tokens_per_s"] for rr in per_round]
                row["tokens"] = [[r["tokens"] for r in rr] for rr in per_round]  # [round][prompt]: read back later
                if temp == 0 and ref is not None:
                    row["agree_ar"] = sum(r["tokens"] == ref[i] for rr in per_round for i, r in enumerate(rr)) / (
                        rounds * len(prompts))
                rows.append(row)
                if progress:
                    progress(f"  T={temp:g} {method.label}: {row['tokens_per_s']:.1f} tok/s, "
                             f"{row['tokens_per_step']:.2f} tok/step")
    by = {(r["temperature"], r["method"]): r for r in rows}
    for r in rows:
        for base, key in (("ar", "speedup_ar"), ("ar-static", "speedup_ar_static"), ("hf-assisted", "speedup_assisted")):
            b = by.get((r["temperature"], base))
            r[key] = r["tokens_per_s"] / b["tokens_per_s"] if b and b["tokens_per_s"] > 0 else None
            if rounds > 1:
                per_round = [] if b is None or r[key] is None else [
                    x / y for x, y in zip(r["tokens_per_s_rounds"], b["tokens_per_s_rounds"])]
                r[key + "_range"] = [min(per_round), max(per_round)] if per_round else None
    from tmc.commands.bench import cpu_name

    env = {"torch": torch.__version__, "threads": torch.get_num_threads(),
           "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"), "transformers": transformers.__version__, "python": platform.python_version(),
           "device": torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name(),  # CPU model, cores
           "dtype": str(next(target.parameters()).dtype).replace("torch.", ""), "cache": cache,
           "target_params": sum(p.numel() for p in target.parameters()),
           "draft_params": sum(p.numel() for p in draft.parameters())}
    return {"environment": env, "prompts": len(prompts), "prompt_tokens": [len(p) for p in prompts],
            "new_tokens": new_tokens, "temperatures": list(temperatures), "seed": seed, "rounds": rounds,
            "order": order, "reference": reference, "reference_why": hf_off, "rows": rows}


def _fmt(v: Any, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def _range(v: Any) -> str:
    return "-" if v is None else f"{v[0]:.2f}-{v[1]:.2f}"


def render(report: dict[str, Any]) -> str:
    """The report as one table per temperature; with several rounds, the speedups' ranges over rounds too."""
    from tmc.commands.table import format_table

    env = report["environment"]
    rounds = report.get("rounds", 1)
    ops = any("ops_per_step" in r for r in report["rows"])
    out = []
    for temp in report["temperatures"]:
        table = []
        for r in report["rows"]:
            if r["temperature"] != temp:
                continue
            spread = [_range(r.get("speedup_ar_range")), _range(r.get("speedup_assisted_range"))] if rounds > 1 else []
            table.append([r["method"], _fmt(r["tokens_per_step"], ".2f"), _fmt(r["tokens_per_s"], ".1f"),
                          _fmt(r["speedup_ar"], ".2f"), _fmt(r["speedup_ar_static"], ".2f"),
                          _fmt(r["speedup_assisted"], ".2f"), *spread, _fmt(r.get("overhead_pct"), ".1f"),
                          _fmt(r.get("builder_pct"), ".1f"), _fmt(r.get("verify_pct"), ".1f"),
                          _fmt(r.get("loop_pct"), ".1f"), _fmt(r.get("called_pct"), ".1f"), _fmt(r.get("host_pct"), ".1f"),
                          _fmt(r.get("draft_pct"), ".1f"), _fmt(r.get("agree_ar"), ".2f") if temp == 0 else "-",
                          *([_fmt(r.get("ops_per_step"), ".0f"), _fmt(r.get("kernels_per_step"), ".0f")]
                            if ops else [])])
        ranges = ["×ar per round", "×assisted per round"] if rounds > 1 else []
        out.append(format_table(
            ["method", "tok/step", "tok/s", "×ar", "×ar-static", "×assisted", *ranges, "bld+ver %", "builder %",
             "verifier %", "loop %", "as called %", "host %", "draft fwd %", "=ar", *(["ops/step", "kernels/step"] if ops else [])], table,
            title=f"T = {temp:g}: {report['prompts']} prompts × {report['new_tokens']} new tokens"
                  f"{f', {rounds} rounds' if rounds > 1 else ''}, methods {report.get('order', 'sequential')}, {env['device']}, "
                  f"{env['dtype']}, our cache {env.get('cache', 'dynamic')}, torch {env['torch']} ({env['threads']} CPU threads"
                  f"{', OMP_WAIT_POLICY=' + env['omp_wait_policy'] if env.get('omp_wait_policy') else ''}), "
                  f"transformers {env['transformers']} "
                  f"(% columns: of the target forward time)"))
    if report.get("reference_why"):
        out.append(f"=ar compares with {report['reference']}'s tokens: {report['reference_why']}"
                   if report.get("reference") else
                   f"=ar left out (add ar-loop for a reference): {report['reference_why']}")
    return "\n\n".join(out)


def plot(report: dict[str, Any], path: str | Path) -> None:
    """Tokens/s per method, one bar group per temperature, AR as a dashed line (needs matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    temps = report["temperatures"]
    methods = list(dict.fromkeys(r["method"] for r in report["rows"]))
    by = {(r["temperature"], r["method"]): r["tokens_per_s"] for r in report["rows"]}
    fig, axes = plt.subplots(len(temps), 1, figsize=(max(6.0, 0.7 * len(methods)), 3.2 * len(temps)), squeeze=False)
    for ax, temp in zip(axes[:, 0], temps):
        vals = [by.get((temp, m), 0.0) for m in methods]
        ax.bar(range(len(methods)), vals, color=["0.6" if m in BASELINES else "C0" for m in methods])
        if (temp, "ar") in by:
            ax.axhline(by[(temp, "ar")], ls="--", color="C3", lw=1, label="ar")
            ax.legend(loc="upper right")
        ax.set_xticks(range(len(methods)), methods, rotation=40, ha="right", fontsize=8)
        ax.set_ylabel("tokens / s")
        ax.set_title(f"T = {temp:g}", fontsize=9)
    env = report["environment"]
    fig.suptitle(f"tmc bench decode: {env['device']}, {env['dtype']}, {report['new_tokens']} new tokens", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --- command line ---------------------------------------------------------------------------


def add_options(parser: argparse.ArgumentParser) -> None:
    """The ``decode:`` options of ``tmc bench`` (also used by ``python -m spec.bench_decode``)."""
    g = parser.add_argument_group("decode (tmc bench decode)")
    g.add_argument("--pair", metavar="DIR", help="decode: a folder with target/ and draft/ (spec.llm.train's output; "
                                                  "its report.json decides which files the prompts are held out from)")
    g.add_argument("--target", metavar="DIR", help="decode: target model folder (instead of --pair)")
    g.add_argument("--draft", metavar="DIR", help="decode: draft model folder (instead of --pair)")
    g.add_argument("--methods", default=",".join(DEFAULT_METHODS),
                   help="decode: comma-separated ar, ar-static, ar-loop, hf-assisted, "
                        "BUILDER[/KEY=VALUE...]:VERIFIER[:FLAG...][@BUDGET] with flags host (chain, fixed), "
                        "torch, numpy or device (the verifier backend), dtemp=T (the draft's own temperature), graph "
                        "(chain + chain verifier, or a chain / fixed tree drawn iid, swor or topk + multidraft / "
                        "traversal: each step one fixed-shape CUDA graph, generate's step_graph), "
                        "compiled (graph, with the step's draws and verifier compiled first: compile_step), "
                        "whole (graph, the whole step compiled, both models' forwards included: "
                        "compile_step='whole')")
    g.add_argument("--budget", type=int, default=16, help="decode: tree budget of methods without @ (default 16)")
    g.add_argument("--chain-budget", type=int, default=4, help="decode: chain length of chain methods without @ (default 4)")
    g.add_argument("--prompts", type=int, default=8, help="decode: held-out prompts (default 8)")
    g.add_argument("--prompt-tokens", type=int, default=64, help="decode: tokens per prompt (default 64)")
    g.add_argument("--new-tokens", type=int, default=128, help="decode: new tokens per prompt (default 128)")
    g.add_argument("--temperatures", default="0,1", help="decode: comma-separated temperatures (default 0,1)")
    g.add_argument("--device", default=None, help="decode, verify: torch device (default cuda when available, else cpu)")
    g.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None,
                   help="decode: model dtype (default bfloat16 on cuda, float32 on cpu)")
    g.add_argument("--threads", type=int, default=None,
                   help="decode: torch CPU threads (default: torch's; 4 measured best on a 16-core GPU host, README)")
    g.add_argument("--cache", choices=["auto", "dynamic", "static"], default="auto",
                   help="decode: KV cache of our loop: static (with CUDA graphs on cuda), dynamic, or auto "
                        "(static on cuda, dynamic on cpu and for layer kinds it cannot hold; default)")
    g.add_argument("--rounds", type=int, default=1,
                   help="decode: decode the whole set this many times (same prompts and seeds), giving each "
                        "speedup's range over rounds (default 1)")
    g.add_argument("--order", choices=RUN_ORDERS, default="interleaved",
                   help="decode: interleaved (default: every method on a prompt before the next prompt, the order "
                        "rotated) or sequential (every prompt of a method before the next method)")
    g.add_argument("--save", metavar="DIR", help="decode: write decode.json and decode.png into DIR")
    g.add_argument("--count-ops", action="store_true",
                   help="decode: after the timed rounds, count the torch operations each of our loops dispatches "
                        "outside the model forwards per step (one untimed decode of the first prompt; compiled rows "
                        "are left uncounted: torch.compile does not trace under the counting mode)")


def _floats(text: str) -> list[float]:
    try:
        vals = [float(x) for x in text.split(",")]
    except ValueError:
        raise ValueError(f"--temperatures takes comma-separated numbers, got {text!r}") from None
    if not vals or any(not v >= 0 or v == float("inf") for v in vals):
        raise ValueError(f"--temperatures must be finite and >= 0, got {text!r}")
    return vals


def check_rows(methods: Sequence[Method], temperatures: Sequence[float]) -> None:
    """``ValueError`` unless ``methods`` names a method and neither it nor ``temperatures`` repeats one (rows
    are keyed by (temperature, label), so a repeat would overwrite a row and compare it with itself), and
    each of our methods passes :func:`spec.llm.generate.check_decode_options` at every temperature (a chain
    verifier on a ``topk`` tree takes only a one-hot draft: ``fixed/draw=topk:sps`` at temperature 0 or with
    ``dtemp=0``)."""
    from spec.builders import make_builder
    from spec.llm.generate import check_decode_options

    if not methods:
        raise ValueError("methods must name at least one method")
    for what, values in (("methods", [m.label for m in methods]), ("temperatures", [str(float(t)) for t in temperatures])):
        repeated = sorted({v for v in values if values.count(v) > 1})
        if repeated:
            raise ValueError(f"{what} repeat {', '.join(repeated)}: each may appear once (rows are keyed by it)")
    for m in methods:
        if m.builder is None or m.verifier is None or m.budget is None:
            continue
        for temp in temperatures:
            try:
                check_decode_options(make_builder(m.builder, **dict(m.params)), m.verifier, m.budget,
                                     temperature=float(temp), draft_temperature=m.draft_temperature)
            except ValueError as err:
                raise ValueError(f"method {m.name!r} at temperature {float(temp):g}: {err}") from None


def bench(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """``tmc bench decode``: load the pair, pick held-out prompts, run, print; save JSON and PNG with --save."""
    from tmc.cli import fail

    try:
        import torch
        import transformers  # noqa: F401
    except ImportError:
        fail("needs torch and transformers: pip install 'tmc-spec[llm]' (CPU torch: pip install torch==2.13.0)")
    if args.pair:
        if args.target or args.draft:
            fail("give --pair or --target and --draft, not both")
        target_dir, draft_dir = str(Path(args.pair, "target")), str(Path(args.pair, "draft"))
    elif args.target and args.draft:
        target_dir, draft_dir = args.target, args.draft
    else:
        fail("needs --pair DIR or --target DIR and --draft DIR")
    for name, v in (("--budget", args.budget), ("--chain-budget", args.chain_budget), ("--prompts", args.prompts),
                    ("--prompt-tokens", args.prompt_tokens), ("--new-tokens", args.new_tokens),
                    ("--threads", 1 if args.threads is None else args.threads), ("--rounds", args.rounds)):
        if v < 1:
            fail(f"{name} must be a positive integer, got {v}")
    try:
        temps = _floats(args.temperatures)
        methods = [parse_method(m, args.budget, args.chain_budget) for m in args.methods.split(",") if m.strip()]
        check_rows(methods, temps)  # before either model loads (a large pair takes minutes)
    except ValueError as err:
        fail(str(err))
    if args.save:  # made before the run, so a path that cannot be a folder fails now, not after it
        try:
            Path(args.save).mkdir(parents=True, exist_ok=True)
        except OSError as err:
            fail(f"--save {args.save}: {err.strerror or err}")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    from spec.llm.models import DRAFT_DIR, TARGET_DIR, load_for_decoding, parse_device

    try:
        device = parse_device(args.device)
    except ValueError as err:
        fail(str(err))
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    if args.pair:  # a folder, never a hub id: a missing one went to the hub (55 s of retries, a network error)
        missing = [f"{d}/" for d in (TARGET_DIR, DRAFT_DIR) if not Path(args.pair, d).is_dir()]
        if missing:
            fail(f"--pair {args.pair}: " + ("no such folder" if not Path(args.pair).is_dir() else
                                            f"no {' or '.join(missing)} folder in it")
                 + " (--pair takes a folder with target/ and draft/, as spec.llm.train writes it)")
    for flag, path in (("--target", args.target), ("--draft", args.draft)):  # folders too, as --pair's
        if path and not Path(path).is_dir():
            fail(f"{flag} {path}: no such folder (the benchmark takes model folders; tmc decode also takes hub ids)")
    # the folder that holds both models may hold spec.llm.train's report.json: which files it held out
    folder = Path(target_dir).parent
    try:
        options, note = heldout_options(folder if Path(draft_dir).parent == folder and folder.is_dir() else None)
        target, draft, tok = load_for_decoding(target_dir, draft_dir, device, dtype)
        prompts = heldout_prompts(tok, args.prompts, args.prompt_tokens, **options)
    except ValueError as err:
        fail(str(err))
    print(note, file=sys.stderr)
    print(f"decoding {args.prompts} prompts x {args.new_tokens} tokens with {len(methods)} methods ({args.order}, "
          f"{args.rounds} round{'s' if args.rounds > 1 else ''}) at T in {temps} "
          f"on {device} ({str(dtype).replace('torch.', '')}) ...", file=sys.stderr)
    if device.type == "cpu" and torch.get_num_threads() > 1 and os.environ.get("OMP_WAIT_POLICY", "").upper() == "PASSIVE":
        print(PASSIVE_WARNING, file=sys.stderr)
    report = run_decode_bench(target, draft, prompts, methods, temps, args.new_tokens, seed=args.seed,
                              cache=args.cache, progress=lambda m: print(m, file=sys.stderr, flush=True),
                              rounds=args.rounds, order=args.order, count_ops=args.count_ops)
    report["pair"] = {"target": target_dir, "draft": draft_dir}
    report["heldout"] = {**options, "note": note}
    text = render(report)
    if args.save:
        save(report, Path(args.save))
    return report, text


def save(report: dict[str, Any], out: Path) -> None:
    """Write ``decode.json`` and ``decode.png`` into ``out``.  A write that fails (a full disk, a ``decode.json``
    that is a folder) is reported on stderr and in ``report["save_error"]``, and the run's table is still printed
    (the command then exits 1): an error here had lost the table of a run of many minutes."""
    written: list[Path] = []
    try:
        (out / "decode.json").write_text(json.dumps(report, indent=2))
        written.append(out / "decode.json")
        try:
            plot(report, out / "decode.png")
            written.append(out / "decode.png")
        except ImportError:
            print("tmc bench decode: matplotlib is not installed; decode.png not written", file=sys.stderr)
    except OSError as err:
        report["save_error"] = f"--save {out}: {err.strerror or err} ({getattr(err, 'filename', None) or out})"
        print(f"tmc bench decode: {report['save_error']}; the table follows, the report is not saved", file=sys.stderr)
    if written:
        print(f"wrote {' and '.join(map(str, written))}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m spec.bench_decode``: the same as ``tmc bench decode`` without an installed package."""
    from tmc.cli import Parser, add_json, add_seed

    p = Parser(prog="python -m spec.bench_decode", description=__doc__.split("\n\n")[0])
    add_options(p)
    add_seed(p, "benchmark inputs")  # tmc bench's flag: an integer >= 0, refused before any model is loaded
    add_json(p)
    return run_as_module("decode", bench, p.parse_args(argv))


def run_as_module(name: str, handler: Callable[[argparse.Namespace], tuple[dict[str, Any], str]],
                  args: argparse.Namespace) -> int:
    """A ``tmc bench NAME`` handler run by ``python -m``: its table (or, with ``--json``, its report)
    on stdout; a usage error or ``ValueError`` in one line on stderr, as ``tmc bench`` prints it, and 2."""
    from tmc.cli import UsageError

    try:
        report, text = handler(args)
    except (UsageError, ValueError) as err:
        print(f"tmc bench {name}: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=2) if args.json else text)
    return 1 if report.get("save_error") else 0


if __name__ == "__main__":
    raise SystemExit(main())
