"""A whole chain step as one fixed-shape piece of device work, captured as ONE CUDA graph (DESIGN.md §8).

With the static cache (:mod:`spec.llm.static_cache`) every forward of a step
replays a captured graph, yet a chain step on a GPU still dispatches some
150 torch operations from Python between them: the draws, the rows, the
forwards' inputs, the verifier (:mod:`spec.llm.opcount`).  On an H100 that
host work costs more than the target forward it surrounds.
:class:`ChainStepGraph` removes it for the one step whose shape no draw can
change, a chain of ``k`` tokens verified by a chain verifier (``sps``,
``asps``, ``block``): everything the step does is tensor work on the
device whose shapes are fixed in advance, so it can be captured once and
replayed.

**Lengths live on the device.**  Per step the host uploads six integers and
the step's uniforms in one copy: the target cache length ``t_len`` (the
context before the root), the draft cache length ``d_len``, the root token,
and the draft's one or two *pending* tokens (the tokens of the context the
draft has not fed yet).  Every position, write slot and mask row is formed
from those on the device: both caches hold the context at slots equal to its
positions (a chain's accepted path is a prefix, so no gather is ever
needed), so a token at position ``s`` may see exactly the slots ``≤ s``
(cut to ``> s - window`` in a sliding window's layers).

**One pending token or two.**  A step feeds the draft its pending tokens,
then draws ``x_1`` and feeds ``x_1 .. x_{k-1}`` one forward each, drawing
``x_{i+1}`` from the row after ``x_i``; ``x_k`` is never fed.  So after a
step that accepted all ``k`` drafts the draft lacks ``x_k`` and the target's
extra token ``y`` (two pending tokens), and after any other step only ``y``
(one).  The first draft forward therefore always takes two tokens: the
pending pair, or ``y`` and a padding row at the next slot (the row after
``y`` is then read from row 0, and ``x_1``'s forward overwrites the padding
row's keys and values before anything can attend to them).

**One transfer a step.**  The graph's output holds a fault flag (logits
:func:`~spec.llm.sampling.process_logits` would refuse), the accepted count
``n``, the emitted token ``y`` and the drafts; the host reads it once and
works out the next step's lengths and pending tokens itself.  Where the upload
and that transfer run is :data:`STEP_IO` (``io``): by default (``"graph"``)
both are nodes of the captured graph, the output landing in a pinned host
buffer, so a replayed step costs the host one launch and one wait.  Side by
side on an H100 (README, "H100, io modes"), this cut what the decode's call
adds to the replay from 0.084 to 0.040 ms for a compiled SpS chain.

**Fewer kernels** (``compile_backend``, :func:`~spec.llm.generate.generate`'s
``compile_step``).  Captured as it is, the step holds some 95-160 small
kernels besides the forwards' (draws, rows, masks, the verifier's head:
counted on the CPU with :func:`spec.llm.opcount.count_ops`, non-view
operations, ``k = 4``, ``V = 4096``; the draws and an SpS head are 79 of
them); a GPU runs each for a few microseconds even inside a graph.  With a backend named, each
draw and the verifier's head go through ``torch.compile`` as whole graphs
of fixed shapes first (``fullgraph``: a host read is an error, not a
silent split), so the capture records inductor's fused kernels instead
(``compile_scope="parts"``; a tree's head takes the target's logits, so its
rows, the fault flags and the accepted path's cache slots are compiled with
the walk).  That leaves 65 operations outside the forwards for a fixed tree
of 7 nodes, 57 of them also in a forwards-only run (the forwards' inputs and
masks); the other 8 are two concatenations, two picks, and the cache moves'
two gathers and two writes; ``compile_scope="whole"``
compiles the whole step, the two models' forwards included, as one graph
(dynamo traces through the models and the static caches), so inductor may
fuse those too and the forwards' own small operations with them.  Measured
on an H200 (README, "H200, 2026-11-26, second lease"): ``"parts"`` cut what
a chain SpS step adds to its forwards from 0.23 to 0.10 ms (a 1.37 ms target
forward), ``"whole"`` ran the step in 1.30 ms against 2.43 ms graphed eager;
in a third lease the compiled forms of the draw and of row totals took the
SpS step to 0.07 ms (``categorical_draw``, ``spec.llm.verify._total``).

The work is :func:`spec.llm.generate._chain_step`'s, on the same uniforms in
the same order, so the tokens are the same (tested on the CPU, where the
same buffers run eagerly; a test checks that the step dispatches no
operation that synchronises with the host).  Batch size 1, both models on
one device, both caches :class:`~spec.llm.static_cache.StaticTreeCache`.
"""

from __future__ import annotations

import functools
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, TypeVar

import numpy as np
import torch
from numpy.typing import ArrayLike, NDArray

from spec.llm.adapter import fit_vocabulary, sync
from spec.llm.sampling import Sampling, categorical_draw, logits_of, step_fault
from spec.llm.static_cache import StaticTreeCache, _round_capacity, _Size, weights_key
from spec.llm.verify import _CHAIN_STEPS, CHAIN_METHODS, _prepare_chain, noise_size
from tmc.noise import check_uniforms
from tmc.validate import check_int

__all__ = ["COMPILE_SCOPES", "STEP_IO", "STEP_IO_MODES", "ChainStepGraph", "ChainStepResult", "FusedStep", "clamp_ids",
           "resolve_io", "shared_chain_step", "target_rows_and_fault"]

_INTS = 6  # t_len, d_len, root, pending[0], pending[1], two pending tokens (0/1)


class ChainStepResult(NamedTuple):
    """What one step emitted, and the state the next step starts from (host values)."""

    n_accepted: int  # drafts accepted
    tokens: list[int]  # the accepted drafts, then the target's token
    drafted: list[int]  # the k draft tokens
    t_past: int  # target cache length after the step (the next root is tokens[-1])
    d_past: int  # draft cache length after the step
    pending: tuple[int, ...]  # the draft's pending tokens for the next step (one or two)


def _vocab_of(model: Any) -> int:
    return int(model.config.vocab_size)


#: What ``compile_backend`` compiles (module doc): each draw and the verifier's head, or the whole step.
COMPILE_SCOPES: tuple[str, ...] = ("parts", "whole")

#: Where a fused step's upload and its one transfer back run (:attr:`FusedStep.io`).  ``"host"``: the decode's
#: call copies the staged integers and uniforms to the device before the run or replay and reads the output
#: tensor back after it (``tolist``: a copy to pageable memory that waits for the step).  ``"upload"``: the
#: upload is the first node of the step's work (captured in its graph), the output read back as for ``"host"``.
#: ``"graph"``: the upload and a copy of the output into a pinned host buffer are both part of the step's work,
#: so a replayed step is ONE launch, then one wait for the stream and a read of host memory.  The tokens are the
#: same in every mode (the same device work on the same values); only the host's calls per step differ.
STEP_IO_MODES: tuple[str, ...] = ("host", "upload", "graph")

#: The mode a fused step takes when none is named (``io=None``); read when the step is made.
STEP_IO = "graph"


def resolve_io(io: str | None) -> str:
    """``io``, or :data:`STEP_IO` for ``None``; ``ValueError`` unless one of :data:`STEP_IO_MODES`."""
    got = STEP_IO if io is None else io
    if not isinstance(got, str) or got not in STEP_IO_MODES:
        raise ValueError(f"io must be one of {STEP_IO_MODES} or None, got {got!r}")
    return got


#: Graphs dynamo may keep per code object (``_draw_row``, ``_verify_head``): one per setting (sampling, verifier,
#: chain length, vocabulary) a process decodes with; its default (8) is hit by a benchmark's rows.
RECOMPILE_LIMIT = 256


def _compiled(fn: Any, backend: str) -> Any:
    """``fn`` through ``torch.compile`` as one whole graph (``fullgraph``: a break, e.g. a host read, is an error,
    not a silent split) of fixed shapes, called with dynamo's recompile limit raised to :data:`RECOMPILE_LIMIT`
    (each setting is a specialisation of the same code)."""
    compiled: Any = torch.compile(fn, fullgraph=True, dynamic=False, backend=backend)
    config = torch._dynamo.config
    limit = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"  # older torch's name

    def call(*args: Any) -> Any:
        with config.patch(**{limit: max(RECOMPILE_LIMIT, getattr(config, limit))}):
            return compiled(*args)

    return call


def _draw_row(logits: torch.Tensor, u: torch.Tensor, *, sampling: Sampling, iid: bool,
              top: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One draft draw: the processed row ``(1, V)`` of ``logits`` and the token ``(1,)`` drawn from it by
    inverse CDF with ``u`` ``(1,)`` (``iid``) or its argmax, clamped to ``[0, top]``
    (:meth:`spec.llm.adapter.LLMDraft.draft_tree`'s rule)."""
    row = sampling.probs_unchecked(logits)
    tok = categorical_draw(row, u) if iid else row.argmax(dim=-1)
    return row, clamp_ids(tok, top, row.shape[-1])


def clamp_ids(tok: torch.Tensor, top: int, width: int) -> torch.Tensor:
    """``tok`` clamped to ``[0, top]``, or ``tok`` itself when ``top`` is the last of ``width`` ids: a draw
    (:func:`~spec.llm.sampling.categorical_draw`'s ``minimum(i, last)``, an argmax, a ranked index) is an
    index into a row of ``width``, in range whatever the row holds (NaN included), so the clamp would be a
    kernel that changes nothing."""
    return tok if top >= width - 1 else tok.clamp(0, top)


def target_rows_and_fault(sampling: Sampling, t_logits: torch.Tensor, draft_raw: Sequence[torch.Tensor],
                          rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """A fused step's target rows and fault flag: ``t_logits`` (or its rows ``rows``, in that order) processed by
    ``sampling``, and a 0-d bool, True when the draft's logits ``draft_raw`` or the target's hold a value
    :func:`~spec.llm.sampling.process_logits` refuses (greedy rows give the target's part for free)."""
    p, t_fault = sampling.probs_with_fault(t_logits if rows is None else t_logits.index_select(0, rows))
    return p, step_fault(t_logits, t_fault, *draft_raw)


def _verify_head(t_logits: torch.Tensor, x: torch.Tensor, q: torch.Tensor | None, u: torch.Tensor,
                 draft_raw: torch.Tensor, *, sampling: Sampling, verifier: str) -> torch.Tensor:
    """The step's output row: the fault flag of the draft's and the target's logits, the verifier's accepted
    count and emitted token (its step of :mod:`spec.llm.verify` on the trusted inputs, as
    :func:`spec.llm.verify._chain_head` runs it, less the always-clear flag), then the drafts ``x``."""
    p, fault = target_rows_and_fault(sampling, t_logits, (draft_raw,))
    n, y = _CHAIN_STEPS[verifier](_prepare_chain(verifier, x, q, p, u, trusted=True))  # trusted: no flag to read
    return torch.cat([fault.to(torch.int64).reshape(1), n.reshape(1), y.reshape(1), x])


class FusedStep:
    """What every fused step shares: the two static caches it writes, the check that they fit, the
    draft's logits on the decode vocabulary, ONE CUDA graph captured from :meth:`_run` and replayed, and
    the profile's timing in turns.  Subclasses set up their buffers in :meth:`_prepare` and do the
    step's device work, with no host read, in :meth:`_run`."""

    sampling: Sampling  # processes the target's logits
    d_sampling: Sampling  # processes the draft's logits
    draft_uniforms: int  # the draws' uniforms a step (0: ranked draws)
    noise: int  # the verifier's uniforms a step

    def _setup(self, target: Any, draft: Any, t_cache: StaticTreeCache, d_cache: StaticTreeCache, vocab: int,
               io: str | None = None) -> None:
        self.io = resolve_io(io)  # where the upload and the transfer back run (STEP_IO_MODES)
        self._back: torch.Tensor | None = None  # io "graph": the output's host copy (pinned on CUDA)
        for name, cache, model in (("t_cache", t_cache, target), ("d_cache", d_cache, draft)):
            if not isinstance(cache, StaticTreeCache):
                raise ValueError(f"{name} must be a StaticTreeCache (cache='static'), got {type(cache).__name__}")
            if cache.model is not model:
                raise ValueError(f"{name} belongs to another model")
        if t_cache.device != d_cache.device:
            raise ValueError(f"target and draft caches must be on one device, got {t_cache.device} and {d_cache.device}")
        self.vocab = check_int("vocab", vocab, minimum=1)
        if _vocab_of(target) != self.vocab:
            raise ValueError(f"vocab {self.vocab} differs from the target's {_vocab_of(target)}")
        self.t_cache = t_cache
        self._d_cache_ref: Callable[[], StaticTreeCache | None] = lambda: d_cache  # weak when shared (hold_weakly)
        self.weights = (weights_key(target), weights_key(draft))  # what the vocabularies and graphs were made for
        self._d_vocab = _vocab_of(draft)
        self.device = t_cache.device
        self.graphs = t_cache.graphs and d_cache.graphs
        self.captures = 0
        self.replays = 0
        self._layout: tuple[torch.Tensor, torch.Tensor] | None = None  # the caches' kv the buffers were made for
        self._graph: Any = None
        self._out: Any = None

    @property
    def target(self) -> Any:
        return self.t_cache.model

    @property
    def draft(self) -> Any:
        return self.d_cache.model

    @property
    def d_cache(self) -> StaticTreeCache:
        cache = self._d_cache_ref()
        if cache is None:
            raise RuntimeError("the draft's cache of this fused step has been freed")
        return cache

    def hold_weakly(self) -> None:
        """Keep only a weak reference to the draft's cache (a step kept on the target's cache, the shared
        steps, would otherwise keep every draft's cache it was made with alive as long as the target's); when
        that cache is freed the step leaves the target cache's ``step_graphs``, with its buffers and graph."""
        steps = self.t_cache.step_graphs

        def drop(ref: Any) -> None:
            for key in [key for key, step in steps.items() if step._d_cache_ref is ref]:
                del steps[key]

        self._d_cache_ref = weakref.ref(self.d_cache, drop)

    def serves(self, target: Any, draft: Any, d_cache: StaticTreeCache) -> bool:
        """Whether this step may run for these models and draft cache: the same objects, the draft's cache
        alive, and their tensors those the step was made for (:func:`weights_key`; a resized vocabulary or
        replaced weights need a new step)."""
        cache = self._d_cache_ref()
        return (cache is d_cache and cache.model is draft and self.t_cache.model is target
                and self.weights == (weights_key(target), weights_key(draft)))

    def _grow(self, t_need: int, d_need: int) -> bool:
        """Grow the caches to hold ``t_need`` / ``d_need`` slots; ``True`` when their buffers are not those the
        step's buffers were made for (then the caller remakes them, and the graph is dropped)."""
        for cache, need in ((self.t_cache, t_need), (self.d_cache, d_need)):
            if need > cache.capacity:
                cache._allocate(_round_capacity(max(need, 2 * cache.capacity)))
        layout = (self.t_cache.kv, self.d_cache.kv)
        if self._layout is not None and layout[0] is self._layout[0] and layout[1] is self._layout[1]:
            return False
        self._layout = layout
        self._graph = None  # it points at the old buffers
        return True

    def _fit(self, logits: torch.Tensor) -> torch.Tensor:
        """The draft's logits on the decode vocabulary (``LLMDraft``'s rule, :func:`fit_vocabulary`)."""
        return fit_vocabulary(logits, self.vocab)

    def _draft_ids(self, tokens: torch.Tensor) -> torch.Tensor:
        """Ids the draft cannot embed go in as 0 (``LLMDraft``'s rule)."""
        return torch.where(tokens < self._d_vocab, tokens, 0) if self._d_vocab < self.vocab else tokens

    def _staging(self, uniforms: int) -> None:
        """The step's upload: a host buffer (pinned on CUDA) and its device twin of :data:`_INTS` integers and
        ``uniforms`` float64 uniforms, with device views ``_ints`` and ``_u``.  On the CPU the twin is the host
        buffer itself (nothing to copy)."""
        n = _INTS + uniforms
        with torch.inference_mode(False):
            self._host = torch.zeros(n, dtype=torch.int64, pin_memory=self.device.type == "cuda")
            on_host = self.device.type == "cpu"
            self._staged = self._host if on_host else torch.zeros(n, dtype=torch.int64, device=self.device)
        self._host_np: NDArray[np.int64] = self._host.numpy()
        self._host_u: NDArray[np.float64] = self._host_np[_INTS:].view(np.float64)  # the uniforms' host slots
        self._ints = self._staged[:_INTS]
        self._u = self._staged[_INTS:].view(torch.float64)

    def _kernels(self, draw: Any, head: Any, compile_backend: str | None, compile_scope: str = "parts") -> None:
        """The step's draw and verifier head, as given or through ``torch.compile`` with ``compile_backend``
        (``compile_scope="parts"``), or as given inside the whole step compiled (``"whole"``)."""
        if compile_backend is not None and not isinstance(compile_backend, str):
            raise ValueError(f"compile_backend must be None or a torch.compile backend name, got {compile_backend!r}")
        if compile_scope not in COMPILE_SCOPES:
            raise ValueError(f"compile_scope must be one of {COMPILE_SCOPES}, got {compile_scope!r}")
        self.compile_backend, self.compile_scope = compile_backend, compile_scope
        if compile_backend is None or compile_scope == "whole":
            self._draw, self._head = draw, head
        else:
            self._draw, self._head = _compiled(draw, compile_backend), _compiled(head, compile_backend)
        if compile_backend is not None and compile_scope == "whole":
            self._run = _compiled(self._run, compile_backend)  # type: ignore[method-assign]

    def _check_state(self, t_past: int, root: int, d_past: int, pending: Sequence[int]) -> tuple[int, int]:
        """``(t_past, d_past)`` as ints; ``ValueError`` unless the caches hold ``t_past`` / ``d_past``
        positions, ``pending`` is one or two ids ending in ``root`` with ``d_past + len(pending) = t_past + 1``
        (the draft's context is the target's) and the ids lie in the vocabulary (an id past the embedding would
        fault on the device, not raise)."""
        t_past, d_past = check_int("t_past", t_past, minimum=0), check_int("d_past", d_past, minimum=0)
        if self.t_cache.length != t_past or self.d_cache.length != d_past:
            raise ValueError(f"the caches hold {self.t_cache.length} / {self.d_cache.length} positions, "
                             f"not t_past {t_past} / d_past {d_past}")
        if not 1 <= len(pending) <= 2:
            raise ValueError(f"pending must hold one or two tokens, got {len(pending)}")
        for name, tok in (("root", root), *((f"pending[{i}]", t) for i, t in enumerate(pending))):
            if check_int(name, tok, minimum=0) >= self.vocab:
                raise ValueError(f"{name} = {tok} is outside the vocabulary [0, {self.vocab})")
        if d_past + len(pending) != t_past + 1 or pending[-1] != root:  # one context: the target's plus its root
            raise ValueError(f"the draft's context (d_past {d_past} + pending {list(pending)}) must be the target's "
                             f"(t_past {t_past} + root {root}): as long, and ending in the root")
        return t_past, d_past

    @staticmethod
    def _check_uniforms(u_draft: ArrayLike | None, u_verify: ArrayLike, draft_size: int | None, verify_size: int,
                        miscount: str) -> tuple[NDArray[np.float64] | None, NDArray[np.float64]]:
        """``(u_draft, u_verify)`` as float64 arrays of ``draft_size`` (``None``: ``u_draft`` must be ``None``)
        and ``verify_size`` values in [0, 1), checked by :func:`tmc.noise.check_uniforms` (which names the
        argument and refuses NaN, bool, complex or text entries and other shapes); ``ValueError(miscount + ",
        got ...")`` when one is missing, given where none is wanted, or holds another number of values."""
        def count(u: ArrayLike | None) -> int | None:
            return None if u is None else int(np.size(u))

        if count(u_draft) != draft_size or count(u_verify) != verify_size:
            raise ValueError(f"{miscount}, got {count(u_draft)} and {count(u_verify)}")
        return (None if u_draft is None or draft_size is None else check_uniforms("u_draft", u_draft, draft_size),
                check_uniforms("u_verify", u_verify, verify_size))

    def _put_uniforms(self, drawn: NDArray[np.float64] | None, verify: NDArray[np.float64]) -> None:
        """Write checked uniforms to the upload's host slots: the draws' (zeros where ``drawn`` is ``None`` and
        the layout keeps slots for them: a ``topk`` chain), then the verifier's."""
        u = self._host_u
        lead = len(u) - self.noise
        u[:lead] = 0.0 if drawn is None else drawn
        u[lead:] = verify

    def draw_step(self, t_past: int, root: int, d_past: int, pending: Sequence[int],
                  rng: np.random.Generator) -> ChainStepResult | None:
        """:meth:`step` with its uniforms drawn from ``rng`` straight into the upload's host slots: the same
        values, and the same state of ``rng`` after, as ``step(..., u_draft, u_verify)`` with ``u_draft =
        rng.random(draft_uniforms)`` (``None`` when that is 0) and then ``u_verify = rng.random(noise)``, since a
        generator's float64 draws come one per output whatever the batch.  No array is made or checked (a
        generator's draws lie in [0, 1)): this is the decode's call, a host cost per step that the fused
        step's whole point is to keep small (``host_ms`` of :meth:`profile`)."""
        if not isinstance(rng, np.random.Generator):
            raise ValueError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
        t_past, d_past = self._check_state(t_past, root, d_past, pending)
        u = self._host_u
        first = len(u) - self.noise - self.draft_uniforms
        u[:first] = 0.0
        rng.random(out=u[first:])
        return self._finish(t_past, root, d_past, pending)

    def _finish(self, t_past: int, root: int, d_past: int, pending: Sequence[int]) -> ChainStepResult | None:
        """The step from checked state, its uniforms in the upload's host slots: launch, read back, book."""
        raise NotImplementedError

    def _launch(self, t_past: int, root: int, d_past: int, pending: Sequence[int],
                needs: tuple[int, int]) -> list[int]:
        """Grow the caches to ``needs`` (target, draft slots), upload the six integers and the uniforms in the
        host slots in one copy, run or replay the step and read its one row back; logits a
        :class:`~spec.llm.sampling.Sampling` refuses (bit 0 of the row's first entry, the fault flag; a
        subclass may use the higher bits) raise its ``ValueError`` (the draft's first)."""
        self._stage(t_past, root, d_past, pending, needs)
        out, raw, t_logits = self._execute()
        got = self._read(out)  # the step's one transfer
        if got[0] & 1:  # name the fault: the draft's logits first, then the target's
            for row in raw:
                with logits_of("draft"):
                    self.d_sampling.probs(row)
            with logits_of("target"):
                self.sampling.probs(t_logits)
            raise RuntimeError("a logits fault was flagged but not found again")
        return got

    def _stage(self, t_past: int, root: int, d_past: int, pending: Sequence[int], needs: tuple[int, int]) -> None:
        """Grow the caches to ``needs`` and upload the six integers and the uniforms in the host slots in one
        copy (unchecked: :meth:`_launch` runs after the subclass's checks)."""
        self._prepare(*needs)
        self._host_np[:_INTS] = (t_past, d_past, root, pending[0], pending[-1], len(pending) - 1)
        if self._staged is not self._host and self.io == "host":  # else the step's work uploads (_body)
            self._staged.copy_(self._host, non_blocking=self.device.type == "cuda")

    def _body(self) -> Any:
        """The step's device work as it is run or captured: :meth:`_run`, after the upload when ``io`` is not
        ``"host"``, and followed by the output's copy into the host buffer ``_back`` when it is ``"graph"``
        (made at the first run, before any capture: a warm-up run comes first)."""
        cuda = self.device.type == "cuda"
        if self.io != "host" and self._staged is not self._host:
            self._staged.copy_(self._host, non_blocking=cuda)
        result = self._run()
        if self.io == "graph":
            out = result[0]
            if self._back is None:
                with torch.inference_mode(False):
                    self._back = torch.zeros(out.shape, dtype=out.dtype, pin_memory=cuda)
                self._back_np: NDArray[np.int64] = self._back.numpy()
            self._back.copy_(out, non_blocking=cuda)
        return result

    def _read(self, out: torch.Tensor) -> list[int]:
        """The step's output on the host: ``out`` read back (``io`` ``"host"`` / ``"upload"``), or the host
        buffer the step's work copied it into, once the device's stream has finished (``"graph"``)."""
        if self.io != "graph":
            got: list[int] = out.tolist()
            return got
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()
        back: list[int] = self._back_np.tolist()
        return back

    @staticmethod
    def _feed(cache: StaticTreeCache, buf: _Size, tokens: torch.Tensor, positions: torch.Tensor,
              slots: torch.Tensor, allowed: torch.Tensor, near: torch.Tensor | None = None) -> torch.Tensor:
        """Logits ``(n, V_model)`` of ``tokens`` written at ``slots``; the cache's host length is left alone.
        ``near``: ``allowed`` cut to the cache's sliding window (``None`` without one), for the windowed layers
        (every layer, or those of kind ``sliding_attention`` beside full ones that take ``allowed``)."""
        buf.index[0].copy_(tokens)
        buf.index[1].copy_(positions)
        buf.index[2].copy_(slots)
        if near is None:
            buf.allowed.copy_(allowed)
        elif buf.near is not None:
            buf.allowed.copy_(allowed)
            buf.near.copy_(near)
        else:
            buf.allowed.copy_(near)
        logits: torch.Tensor = cache._eager(buf)[0]
        return logits

    def _prepare(self, t_need: int, d_need: int) -> None:
        raise NotImplementedError

    def _run(self) -> Any:
        raise NotImplementedError

    def profile(self, t_past: int, root: int, d_past: int, pending: Sequence[int], reps: int = 50) -> dict[str, float]:
        """Milliseconds of the step, of its forwards alone and of the target forward (subclasses)."""
        raise NotImplementedError

    def _capture(self) -> None:
        """Warm up on a side stream (twice: the caches' slots past their lengths only), then capture."""
        stream = torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._body()
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):  # a pool of its own: it replays in any order with the caches' graphs
            self._out = self._body()
        self._graph = graph
        self.captures += 1

    def _execute(self) -> Any:
        if not self.graphs:
            return self._body()
        if self._graph is None:
            self._capture()
        self._graph.replay()
        self.replays += 1
        assert self._out is not None
        return self._out

    def _profile_calls(self, t_past: int, root: int, d_past: int,
                       pending: Sequence[int]) -> tuple[Callable[[], None], Callable[[], None]]:
        """:meth:`profile`'s ``(call, host)``: :meth:`draw_step` as the decode calls it (uniforms from a seeded
        generator), and the same call with the device work left out (an output of the step read back in its
        place: the graph's, or one run's when the step runs eagerly, which keeps no output between calls), each
        restoring the caches' lengths.  ``call`` runs once here (it stages, and captures)."""
        rng = np.random.default_rng(0)

        def call() -> None:
            self.draw_step(t_past, root, d_past, pending, rng)
            self.t_cache.length, self.d_cache.length = t_past, d_past

        call()
        last = self._out if self.graphs else self._body()

        def host() -> None:
            self._execute = lambda: last  # type: ignore[method-assign]
            try:
                call()
            finally:
                del self._execute

        return call, host

    def _captured(self, fn: Any) -> Any:
        """``fn`` captured as a CUDA graph of its own, after a warm-up on a side stream (:meth:`profile`)."""
        stream = torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            fn()
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        return graph

    def _time_in_turns(self, step: Any, forwards: Any, target: Any, reps: int,
                       calls: tuple[Callable[[], None], Callable[[], None]]) -> dict[str, float]:
        """:meth:`ChainStepGraph.profile`'s figures from the step (run or replayed by the caller first), its
        forwards alone, the target forward alone and ``calls`` (:meth:`_profile_calls`): the step as the decode
        calls it (the upload of its integers and uniforms, the run or replay, the one transfer back and the
        host's draws, checks and bookkeeping) and that call without the run or replay: each the median of
        ``reps`` runs, device synchronised around each, the five taking turns (order rotated) after two warm-up
        rounds.  With the whole step compiled the forwards are compiled
        alike, so the difference is what the draws, the verifier and the cache moves add to compiled forwards."""
        if self.compile_backend is not None and self.compile_scope == "whole":
            forwards, target = _compiled(forwards, self.compile_backend), _compiled(target, self.compile_backend)
        if self.graphs:
            assert self._graph is not None
            runs = {"step": self._graph.replay, "forwards": self._captured(forwards).replay,
                    "target": self._captured(target).replay, "call": calls[0], "host": calls[1]}
        else:
            runs = {"step": step, "forwards": forwards, "target": target, "call": calls[0], "host": calls[1]}
        names = list(runs)
        times: dict[str, list[float]] = {name: [] for name in names}
        for r in range(-2, reps):  # two warm-up rounds, then the five take turns, the order rotated
            turn = r % len(names)
            for name in names[turn:] + names[:turn]:
                sync(self.device)
                t0 = time.perf_counter()
                runs[name]()
                sync(self.device)
                if r >= 0:
                    times[name].append(time.perf_counter() - t0)
        step_ms, forwards_ms, target_ms, call_ms, host_ms = (1e3 * float(np.median(times[name])) for name in names)
        return {"step_ms": step_ms, "forwards_ms": forwards_ms, "target_ms": target_ms,
                "overhead_pct": 100.0 * (step_ms - forwards_ms) / target_ms,
                "call_ms": call_ms, "call_overhead_pct": 100.0 * (call_ms - forwards_ms) / target_ms,
                "host_ms": host_ms, "host_pct": 100.0 * host_ms / target_ms}


class ChainStepGraph(FusedStep):
    """One chain step of ``k`` draft tokens and a chain verifier, as fixed-shape device work (module doc).

    ``t_cache`` and ``d_cache``: the target's and the draft's
    :class:`StaticTreeCache`.  ``iid``: the drafts are drawn by inverse CDF
    from their rows (else each row's argmax, a ``topk`` chain, whose rows the
    verifier does not take).  ``sampling`` / ``d_sampling`` process the
    target's and the draft's logits; ``vocab`` is the decode's vocabulary
    (the target's; a draft of another size works on it as
    :class:`~spec.llm.adapter.LLMDraft` does).  The step is captured as one
    CUDA graph when both caches capture graphs (``graphs``), else it runs
    eagerly on the same buffers.  ``captures`` and ``replays`` count graphs
    captured and replayed.  ``compile_backend``: a ``torch.compile`` backend for the draws and the
    verifier's head, or for the whole step with ``compile_scope="whole"`` (module doc), or ``None``.
    ``io``: where the upload and the transfer back run, one of :data:`STEP_IO_MODES` (``None``: :data:`STEP_IO`).
    """

    def __init__(self, target: Any, draft: Any, t_cache: StaticTreeCache, d_cache: StaticTreeCache, *, k: int,
                 verifier: str, iid: bool, sampling: Sampling, d_sampling: Sampling, vocab: int,
                 compile_backend: str | None = None, compile_scope: str = "parts", io: str | None = None) -> None:
        self._setup(target, draft, t_cache, d_cache, vocab, io)
        if verifier not in CHAIN_METHODS:
            raise ValueError(f"verifier must be one of {CHAIN_METHODS} (a chain verifier), got {verifier!r}")
        self.k = self.size = self.forwards = check_int("k", k, minimum=1)  # drafts = draft forwards a step
        self.verifier, self.iid, self.sampling, self.d_sampling = verifier, bool(iid), sampling, d_sampling
        self.noise = noise_size(verifier, self.k)
        self.draft_uniforms = self.k if self.iid else 0
        self._staging(self.k + self.noise)
        with torch.inference_mode(False):
            self._steps = torch.arange(max(2, self.k + 1), dtype=torch.int64, device=self.device)
        draw = functools.partial(_draw_row, sampling=d_sampling, iid=self.iid, top=min(self.vocab, self._d_vocab) - 1)
        self._kernels(draw, functools.partial(_verify_head, sampling=sampling, verifier=verifier), compile_backend,
                      compile_scope)

    # --- buffers ---------------------------------------------------------------------------

    def _prepare(self, t_need: int, d_need: int) -> None:
        """Grow the caches to hold ``t_need`` / ``d_need`` slots; (re)make the buffers when a cache moved."""
        if not self._grow(t_need, d_need):
            return
        self._first = self.d_cache._new_size(2)  # the pending token(s): always two rows
        self._next = self.d_cache._new_size(1)  # x_1 .. x_{k-1}
        self._verify = self.t_cache._new_size(self.k + 1)  # the root and the k drafts
        with torch.inference_mode(False):
            self._t_cols = torch.arange(self.t_cache.capacity, dtype=torch.int64, device=self.device)
            self._d_cols = torch.arange(self.d_cache.capacity, dtype=torch.int64, device=self.device)

    # --- the step's device work --------------------------------------------------------------

    def _forward(self, cache: StaticTreeCache, buf: _Size, cols: torch.Tensor, tokens: torch.Tensor,
                 start: torch.Tensor) -> torch.Tensor:
        """Logits ``(n, V_model)`` of ``tokens`` at positions (= slots) ``start, start + 1, ...``, each seeing the
        slots up to its own (cut to the window where the model has one); the cache's host length is left alone."""
        pos = start + self._steps[: buf.size]
        seen = cols[None, :] <= pos[:, None]
        window = cache.window
        near = None if window is None else seen & (cols[None, :] > pos[:, None] - window.size)
        return self._feed(cache, buf, tokens, pos, pos, seen, near)

    def _draft_logits(self, buf: _Size, tokens: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        """The draft's logits on the decode vocabulary (``LLMDraft``'s rule: ids it cannot embed go in as 0)."""
        return self._fit(self._forward(self.d_cache, buf, self._d_cols, self._draft_ids(tokens), start))

    @torch.no_grad()
    def _run(self) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
        """The step from the staged inputs: ``(out, draft logits rows, target logits)``, with no host sync.

        ``out`` is int64 ``(3 + k,)``: the fault flag, the accepted count, the emitted token, the drafts."""
        ints, u, k = self._ints, self._u, self.k
        t_len, d_len, root, two = ints[0], ints[1], ints[2], ints[5]
        first = self._draft_logits(self._first, ints[3:5], d_len)  # (2, V)
        raw = [first.index_select(0, ints[5:6])]  # the row after the pending tokens
        start = d_len + 1 + two  # the slot of x_1
        rows, drafts = [], []
        for i in range(k):
            prev, tok = self._draw(raw[-1], u[i : i + 1])
            rows.append(prev)
            drafts.append(tok)
            if i < k - 1:
                raw.append(self._draft_logits(self._next, tok, start + i))
        x = torch.cat(drafts) if k > 1 else drafts[0]
        t_logits = self._forward(self.t_cache, self._verify, self._t_cols, torch.cat([root.reshape(1), x]), t_len)
        q = (torch.cat(rows) if k > 1 else rows[0]) if self.iid else None
        draft_raw = torch.cat(raw) if k > 1 else raw[0]
        return self._head(t_logits, x, q, u[k:], draft_raw), raw, t_logits

    # --- the host side -----------------------------------------------------------------------

    def step(self, t_past: int, root: int, d_past: int, pending: Sequence[int],
             u_draft: NDArray[np.float64] | None, u_verify: NDArray[np.float64]) -> ChainStepResult:
        """One step after ``t_past`` target positions (the root ``root`` not among them) and ``d_past``
        draft positions followed by ``pending`` (one or two tokens); one upload, one transfer back.

        ``u_draft``: the ``k`` uniforms of an ``iid`` chain (``None`` for ``topk``); ``u_verify``: the
        verifier's :func:`~spec.llm.verify.noise_size` uniforms.  Both caches' lengths must be
        ``t_past`` and ``d_past``; afterwards they hold the context and the accepted path.  Logits a
        :class:`~spec.llm.sampling.Sampling` refuses raise its ``ValueError`` (the draft's first); the caches'
        lengths are then still ``t_past`` / ``d_past`` and the context's slots untouched (they may have grown).
        """
        k = self.k
        t_past, d_past = self._check_state(t_past, root, d_past, pending)
        drawn, verify = self._check_uniforms(
            u_draft, u_verify, k if self.iid else None, self.noise,
            f"give {k} draft uniforms for an iid chain (None for topk) and {self.noise} verifier uniforms")
        self._put_uniforms(drawn, verify)
        return self._finish(t_past, root, d_past, pending)

    def _finish(self, t_past: int, root: int, d_past: int, pending: Sequence[int]) -> ChainStepResult:
        k = self.k
        got = self._launch(t_past, root, d_past, pending, (t_past + k + 1, d_past + k + 1))
        n, y, drafted = got[1], got[2], got[3:]
        t_next = t_past + 1 + n
        d_next = d_past + len(pending) + min(n, k - 1)
        self.t_cache.length, self.d_cache.length = t_next, d_next
        nxt = (drafted[-1], y) if n == k else (y,)
        return ChainStepResult(n, drafted[:n] + [y], drafted, t_next, d_next, nxt)

    @torch.no_grad()
    def profile(self, t_past: int, root: int, d_past: int, pending: Sequence[int], reps: int = 50) -> dict[str, float]:
        """Milliseconds per replay of the whole step and of its forwards alone, from the state a decode
        left (the caches' lengths do not change; slots past them are scratch).

        ``forwards_ms``: the same ``k`` draft forwards and target forward with no draws and no verifier
        (tokens = the root); ``target_ms``: the target forward alone.  So ``step_ms - forwards_ms`` is what
        the builder and the verifier add, ``overhead_pct`` that as a share of ``target_ms`` (the 5% bound of
        DESIGN.md §10).  ``call_ms``: the step as the decode calls it (:meth:`draw_step`), which adds the
        draws of its uniforms, the upload, the one transfer back and the host's checks to the replay;
        ``call_overhead_pct`` = (call - forwards) / target.  ``host_ms``: that call with the replay or run
        left out (the last output read back in its place), ``host_pct`` = host / target.  Each is the median of
        ``reps`` runs, device synchronised around each; the five take turns (order rotated), after two warm-up
        rounds, so a slow spell of the machine falls on all five.
        """
        reps = check_int("reps", reps, minimum=1)
        t_past, d_past = self._check_state(t_past, root, d_past, pending)  # ints: call() restores them
        k = self.k
        calls = self._profile_calls(t_past, root, d_past, pending)  # stages and captures

        def forwards() -> torch.Tensor:
            ints = self._ints
            x = ints[2].reshape(1)
            self._draft_logits(self._first, ints[3:5], ints[1])
            for i in range(k - 1):
                self._draft_logits(self._next, x, ints[1] + 2 + i)
            return self._forward(self.t_cache, self._verify, self._t_cols, ints[2].expand(k + 1).contiguous(), ints[0])

        def target() -> torch.Tensor:
            ints = self._ints
            return self._forward(self.t_cache, self._verify, self._t_cols, ints[2].expand(k + 1).contiguous(), ints[0])

        return self._time_in_turns(self._body, forwards, target, reps, calls)


def shared_chain_step(target: Any, draft: Any, t_cache: StaticTreeCache, d_cache: StaticTreeCache, *, k: int,
                      verifier: str, iid: bool, sampling: Sampling, d_sampling: Sampling, vocab: int,
                      compile_backend: str | None = None, compile_scope: str = "parts",
                      io: str | None = None) -> ChainStepGraph:
    """The :class:`ChainStepGraph` of these caches and settings, made once and reused across decodes (as
    :func:`~spec.llm.static_cache.shared_static_cache` reuses the caches), so a decode replays the graph an
    earlier one captured: only a cache that grew since makes it capture again."""
    io = resolve_io(io)
    key = (id(d_cache), k, verifier, bool(iid), sampling, d_sampling, vocab, compile_backend, compile_scope, io)
    return shared_step(t_cache, key, ChainStepGraph, target, draft, d_cache, lambda: ChainStepGraph(
        target, draft, t_cache, d_cache, k=k, verifier=verifier, iid=iid, sampling=sampling, d_sampling=d_sampling,
        vocab=vocab, compile_backend=compile_backend, compile_scope=compile_scope, io=io))


_Step = TypeVar("_Step", bound=FusedStep)


def shared_step(t_cache: StaticTreeCache, key: Any, kind: type[_Step], target: Any, draft: Any,
                d_cache: StaticTreeCache, make: Callable[[], _Step]) -> _Step:
    """The step kept under ``key`` on ``t_cache`` when it is a ``kind`` that :meth:`FusedStep.serves` these
    models and draft cache, else ``make()``'s, kept there with its draft cache held weakly (it leaves when
    that cache is freed: :meth:`FusedStep.hold_weakly`)."""
    step = t_cache.step_graphs.get(key)
    if not isinstance(step, kind) or not step.serves(target, draft, d_cache):
        step = make()
        step.hold_weakly()
        t_cache.step_graphs[key] = step
    return step
