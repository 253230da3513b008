"""``spec``'s part of the ``tmc`` command (registered through entry points, DESIGN.md §2).

* ``tmc acceptance MODEL.json --builder NAME --budget B [--verifier NAME|all] [--json]``:
  expected tokens per step of a tree builder with the lossless tree verifiers,
  exact where the builder's randomness enumerates, else Monte Carlo with a 95%
  interval, next to the LP limit of the same draft law (added to the core's
  ``acceptance`` command through the ``tmc.acceptance`` group);
* ``tmc decode --target DIR --draft DIR --prompt TEXT``: speculative decoding
  with a Hugging Face model pair (:func:`spec.llm.generate.generate`);
* ``tmc bench masks``: DySpec App. C's block count of the tree attention mask
  in DFS vs BFS order (the ``tmc.benchmarks`` group, :mod:`spec.bench_masks`);
  ``tmc bench builders`` (:mod:`spec.bench_builders`) and ``tmc bench decode``
  (:mod:`spec.bench_decode`, whose options come through ``tmc.bench_options``).

Registration only adds options; the work is imported when a handler runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tmc.cli import add_json, add_seed, fail, nonnegative_int, positive_int

#: Builder names on the command line (equal to ``spec.builders.BUILDERS``; a test checks).
BUILDER_NAMES = ("chain", "fixed", "dyspec", "dyspec-threshold", "dynatree", "wetap")


def parse_param(text: str) -> tuple[str, Any]:
    """A builder parameter ``KEY=VALUE``: the key with ``-`` read as ``_``, the value as JSON (``4``,
    ``1.2``, ``null``, ``true``) or else the bare word (``swor``); ``ValueError`` without a key or ``=``."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ValueError(f"a builder parameter is KEY=VALUE, got {text!r}")
    try:
        parsed: Any = json.loads(value)
    except json.JSONDecodeError:
        parsed = value
    return key.replace("-", "_"), parsed


def param_dict(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """The ``--param KEY=VALUE`` pairs as keyword arguments; ``ValueError`` for a key given twice (``dict`` kept the
    last one silently)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"--param {key} given twice ({out[key]!r} and {value!r})")
        out[key] = value
    return out


def _param(text: str) -> tuple[str, Any]:
    try:
        return parse_param(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--param takes KEY=VALUE, got {text!r}") from None


def extend_acceptance(
    parser: argparse.ArgumentParser, shape: argparse._MutuallyExclusiveGroup
) -> Callable[[argparse.Namespace], int | None]:
    """Add ``--builder`` (a shape), ``--budget``, ``--verifier``, ``--param`` and the Monte Carlo options."""
    shape.add_argument("--builder", choices=BUILDER_NAMES, metavar="NAME",
                       help=f"a tree builder of spec: {', '.join(BUILDER_NAMES)} (needs --budget)")
    parser.add_argument("--budget", type=positive_int, metavar="B", help="--builder: node budget of the draft tree")
    parser.add_argument("--verifier", default=None, metavar="NAME",
                        help="--builder: tree verifier (multidraft = residual, the default; traversal, "
                        "ordered_traversal, kseq) or 'all' for every lossless one")
    parser.add_argument("--param", type=_param, action="append", default=[], metavar="KEY=VALUE",
                        help="--builder: a builder parameter (repeatable), e.g. --param width=3 --param draw=iid")
    parser.add_argument("--samples", type=_samples, default=None,
                        help=f"--builder: sampled trees when the exact enumeration is too large (default 2000, "
                             f"at least {MIN_SAMPLES}, below which the interval is wide; the 95%% interval is a betting one, valid "
                             f"at any sample size; drawn with "
                             f"--seed, which also seeds a --random model)")
    parser.add_argument("--max-runs", type=positive_int, default=None,
                        help="--builder: largest exact enumeration, in builder runs (default 20000)")
    if parser.description:
        parser.description += (" With --builder, the same for the trees a tree builder of spec draws "
                               "(DySpec, DynaTree, WETAP, fixed, chain).")
    return _acceptance_hook


#: Fewest Monte Carlo trees ``--samples`` takes (its 95% betting interval is wide below that).
MIN_SAMPLES = 30
#: Largest ``--budget`` with ``--builder``: tmc acceptance's deepest ``--chain`` / ``--tree`` (a chain builder of
#: budget 1000 on V = 1 ran 36 s, its builder re-run once a draw).
MAX_BUILDER_BUDGET = 100
#: Largest ``--random V`` with ``--builder``: the model holds two rows of ``V`` for each of the
#: ``1 + V + V²`` prefixes up to depth 2, some ``2 V³`` numbers (268 MB at 256; 16 GB at 1000).
MAX_BUILDER_RANDOM_VOCAB = 256


def _samples(text: str) -> int:
    n = positive_int(text)
    if n < MIN_SAMPLES:
        raise argparse.ArgumentTypeError(f"--samples must be at least {MIN_SAMPLES} (a 95% interval from fewer "
                                         f"trees is not one), got {n}")
    return n


def _acceptance_hook(args: argparse.Namespace) -> int | None:
    if args.builder is None:
        if (args.budget is not None or args.verifier is not None or args.param or args.samples is not None
                or args.max_runs is not None):
            fail("--budget, --verifier, --param, --samples and --max-runs go with --builder")
        return None
    if args.budget is None:
        fail("--builder needs --budget B")
    if args.budget > MAX_BUILDER_BUDGET:
        fail(f"--budget {args.budget}: at most {MAX_BUILDER_BUDGET} with --builder")
    if args.draw is not None:
        fail("--draw goes with --tree; a builder's draws are its parameter: --param draw=iid|swor|topk")
    if (args.model is None) == (args.random is None):
        fail("give either MODEL.json or --random V")
    if args.random is not None and args.random > MAX_BUILDER_RANDOM_VOCAB:
        fail(f"--random {args.random} with --builder builds rows for every prefix up to depth 2 (2 V^3 numbers); "
             f"at most V = {MAX_BUILDER_RANDOM_VOCAB}")
    from spec.acceptance import DEFAULT_MAX_RUNS, builder_report, random_stationary_model, render_builder_report
    from spec.builders import make_builder
    from tmc.toy import load_model

    model = load_model(args.model) if args.model else random_stationary_model(args.random, args.seed)
    builder = make_builder(args.builder, **param_dict(args.param))
    verifier = args.verifier or "multidraft"
    report = builder_report(model, builder, args.budget, verifier,
                            max_runs=DEFAULT_MAX_RUNS if args.max_runs is None else args.max_runs,
                            samples=2000 if args.samples is None else args.samples, seed=args.seed,
                            progress=lambda m: print(f"{builder.name}, budget {args.budget}: {m}", file=sys.stderr))
    entries = report["entries"]
    if args.json:
        out = {"model": model.name, "vocab": model.vocab, "budget": args.budget, "exact": report["exact"],
               "estimated_runs": report["estimated_runs"], "trees": report["trees"],
               builder.name: entries if verifier == "all" else entries[0], "lp": report["lp"]}
        print(json.dumps(out, indent=2))
    else:
        print(render_builder_report(report, model))
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``tmc decode`` (speculative decoding with a Hugging Face model pair)."""
    dec = sub.add_parser(
        "decode",
        help="speculative decoding with a target/draft model pair (needs the llm extra)",
        description="Generate with a Hugging Face causal LM pair (local folders or hub ids): any tree builder x "
        "lossless verifier, at temperature 0 or above; prints the text, tokens per step and speed against plain "
        "autoregressive decoding with the same settings. Generation stops at the target's stop tokens (its "
        "generation_config.eos_token_id, one id or a list, and the tokenizer's eos token). Batch size 1.",
    )
    dec.add_argument("--target", required=True, metavar="DIR", help="target model folder or hub id")
    dec.add_argument("--draft", required=True, metavar="DIR", help="draft model folder or hub id (same tokenizer)")
    dec.add_argument("--prompt", required=True, metavar="TEXT", help="prompt text (tokenised with the target's tokenizer)")
    dec.add_argument("--builder", choices=BUILDER_NAMES, default="dyspec", help="tree builder (default dyspec)")
    dec.add_argument("--verifier", default="traversal",
                     help="sps, asps, block (chain builder), multidraft, traversal, ordered_traversal, kseq (default traversal)")
    dec.add_argument("--budget", type=positive_int, default=16, help="draft nodes per step (default 16, at most 4096)")
    dec.add_argument("--param", type=_param, action="append", default=[], metavar="KEY=VALUE", help="a builder parameter (repeatable)")
    dec.add_argument("--temperature", type=float, default=1.0, help="0 = greedy (default 1)")
    dec.add_argument("--draft-temperature", type=float, default=None, metavar="T",
                     help="the draft's own temperature (default: --temperature); lossless at any value. At "
                          "--temperature 0, 1 lets sampled and top-k trees branch (README, 'Draft temperature')")
    dec.add_argument("--top-k", type=positive_int, default=None)
    dec.add_argument("--top-p", type=float, default=None)
    dec.add_argument("--max-new-tokens", type=positive_int, default=64)
    dec.add_argument("--device", default="cpu", help="torch device (default cpu)")
    dec.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None,
                     help="model dtype (default: as stored)")
    dec.add_argument("--cache", choices=["auto", "dynamic", "static"], default="auto",
                     help="KV cache: static (explicit slots; CUDA graphs on cuda), dynamic, or auto "
                          "(static on cuda, dynamic elsewhere and for layer kinds it cannot hold; default)")
    dec.add_argument("--host-chain", action="store_true",
                     help="chain builder, or fixed builder drawing iid (or topk) with a tree verifier: draft through "
                          "the host builder, one row transfer per layer, instead of on the model's device (same "
                          "tokens; for comparison)")
    dec.add_argument("--verify-backend", choices=["auto", "torch", "numpy", "device"], default="auto",
                     help="verifier implementation: the torch ports or their numpy references (same tokens); auto "
                          "(default): numpy, but torch for a chain drafted on a GPU with sps/asps/block whose "
                          "(budget + 1) x vocabulary rows exceed 2**17 entries (the copy to the host would cost more); "
                          "device: torch, with multidraft/traversal/ordered_traversal/kseq on a tree drafted on "
                          "the device walked there too (ordered_traversal: at most 2 children a node drawn swor)")
    dec.add_argument("--step-graph", nargs="?", const="on", choices=["auto", "on", "off"], default="auto",
                     help="run every step after the first as ONE fixed-shape piece of device work, one CUDA graph on "
                          "cuda (generate's step_graph): the chain builder with sps/asps/block, or a fixed / chain "
                          "tree drawn iid, topk or swor with multidraft/traversal (ordered_traversal, and iid with "
                          "kseq, when asked: on); needs the static cache (--cache static, or auto on cuda). Same "
                          "tokens. auto (default): where both models' caches capture CUDA graphs and the method "
                          "allows it; on (the flag alone): insist, an error names what is missing; off: never")
    dec.add_argument("--compile-step", nargs="?", const="parts", choices=["parts", "whole"], default=None,
                     help="with --step-graph: the step's draws and verifier through torch.compile (inductor) first "
                          "(parts, the default), or the whole step, both models' forwards included (whole); "
                          "generate's compile_step, the first step pays the compilation")
    dec.add_argument("--no-ar", action="store_true", help="skip the autoregressive baseline run")
    dec.add_argument("--warmup", type=nonnegative_int, default=1, metavar="N",
                     help="untimed decodes of each run (speculative, and autoregressive unless --no-ar) before the "
                          "timed one, with the same settings and seed (default 1): the first call pays "
                          "torch.compile, graph captures and allocations; 0 times that first call")
    add_seed(dec, "builder draws and verifier uniforms")
    add_json(dec)
    dec.set_defaults(func=_cmd_decode)


def _cmd_decode(args: argparse.Namespace) -> int:
    try:
        import torch
        import transformers  # noqa: F401
    except ImportError:
        fail("tmc decode needs torch and transformers: pip install 'tmc-spec[llm]' (CPU torch: pip install torch==2.13.0)")
    from spec.llm.generate import ar_generate, check_decode_options, generate
    from spec.llm.models import draft_tokenizer_note, load_for_decoding, stop_token_ids

    try:  # names and settings refused before any model loads (minutes for a large pair, or a download)
        params = param_dict(args.param)
        check_decode_options(args.builder, args.verifier, args.budget, params, args.temperature, args.top_k,
                             args.top_p, args.draft_temperature)
    except ValueError as err:
        fail(str(err))
    for flag, path in (("--target", args.target), ("--draft", args.draft)):  # the hub's retries take about a minute
        if not Path(path).is_dir():
            print(f"note: {flag} {path} is not a folder here: loading it as a Hugging Face hub id", file=sys.stderr)
    try:
        dtype = None if args.dtype is None else getattr(torch, args.dtype)
        target, draft, tok = load_for_decoding(args.target, args.draft, args.device, dtype)
    except ValueError as err:
        fail(str(err))
    note = draft_tokenizer_note(tok, args.draft)
    if note:
        print(note, file=sys.stderr)
    t_vocab, d_vocab = int(target.config.vocab_size), int(draft.config.vocab_size)
    if t_vocab != d_vocab:
        print(f"note: the draft has {d_vocab} token ids and the target {t_vocab}; the draft's rows are "
              f"{'padded with zeros' if d_vocab < t_vocab else 'cut'} to the target's ids (lossless; it assumes one "
              "tokenizer, as padded embeddings of one model family have)", file=sys.stderr)
    ids = tok(args.prompt)["input_ids"]
    if not ids:
        fail("--prompt tokenises to no tokens")
    settings = {"temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p,
                "max_new_tokens": args.max_new_tokens, "seed": args.seed,
                "eos_token_id": stop_token_ids(target, tok)}
    dtype_name = str(target.dtype).replace("torch.", "")
    warm = f", after {args.warmup} untimed warm-up run{'s' if args.warmup != 1 else ''}" if args.warmup else ""
    print(f"decoding {args.max_new_tokens} tokens with {args.builder} + {args.verifier} on {args.device} "
          f"({dtype_name}{warm}) ...", file=sys.stderr)

    def speculative() -> Any:
        return generate(target, draft, ids, args.builder, args.verifier, budget=args.budget,
                        builder_params=params, cache=args.cache, chain_on_device=not args.host_chain,
                        verify_backend=args.verify_backend, draft_temperature=args.draft_temperature,
                        step_graph={"on": True, "off": False}.get(args.step_graph, "auto"),
                        compile_step=args.compile_step or False, **settings)

    def autoregressive() -> Any:
        return None if args.no_ar else ar_generate(target, ids, cache=args.cache, **settings)

    with torch.inference_mode():
        for _ in range(args.warmup):  # untimed: both timed runs below start warm, so their ratio is fair
            speculative()
            autoregressive()
        out = speculative()
        ar = autoregressive()
    summary = out.summary()
    report: dict[str, Any] = {"builder": args.builder, "verifier": args.verifier, "budget": args.budget,
                              "text": tok.decode(out.tokens), "tokens": out.tokens,
                              "stop_token_ids": settings["eos_token_id"],
                              "dtype": dtype_name, "warmup": args.warmup, **summary}
    if ar is not None:
        report["ar_tokens_per_s"] = ar.summary()["tokens_per_s"]
        report["speedup_vs_ar"] = summary["tokens_per_s"] / report["ar_tokens_per_s"] if report["ar_tokens_per_s"] else None
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(report["text"])
    times = (f"builder {summary['build_s']:.2f} s, target {summary['target_s']:.2f} s, "
             f"verifier {summary['verify_s']:.2f} s")
    if summary["graph_s"] > 0:  # a fused step records its time whole (graph_s), none of it in the three above
        times = f"unfused steps: {times}; fused steps {summary['graph_s']:.2f} s, not split"
    print(f"\n{len(out.tokens)} tokens in {len(out.steps)} steps: {out.tokens_per_step:.2f} tokens/step, "
          f"{summary['tokens_per_s']:.1f} tokens/s ({times})")
    if ar is not None:
        print(f"autoregressive: {report['ar_tokens_per_s']:.1f} tokens/s; speedup {report['speedup_vs_ar']:.2f}x")
    return 0
