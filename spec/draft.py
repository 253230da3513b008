"""The draft-model interface every tree builder uses (DESIGN.md §7).

A builder only ever asks the draft model one question: *the next-token rows
``q(· | context + path)`` for these node paths*, where a path is the tuple of
draft tokens from the tree's root (the current context) down to a node, ``()``
for the root itself.  Builders ask for a whole layer of the tree in one call,
so an LLM adapter can evaluate the layer in one batched forward pass; a toy
model answers from its explicit rows.  The builder never knows which it has.

Notation (DESIGN.md §3): ``q`` is the draft, ``p`` the target.  Rows returned
must be probability rows (the processed law the builder samples from: after
temperature / top-k / top-p in the LLM case); :func:`draft_rows` validates
them at the boundary so a broken model gives a ``ValueError``, not a wrong tree.

One optional second question serves beam builders (WETAP), which keep the
``W`` best (node, token) continuations of a layer by path weight × ``q``:
:func:`select_beam` answers it from rows, and a :class:`BeamDraft` (the LLM
draft) answers it where its logits live, so ``W × V`` rows need not reach
the host.  Both answers are the same set (tested).

A third, for builders that keep each node's few most likely children
(DynaTree): :func:`select_top` ranks each row's ``k`` best tokens from rows,
and a :class:`TopDraft` ranks them on its device, so again no row travels.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np
from numpy.typing import ArrayLike, NDArray

from tmc.toy import Path, ToyModel
from tmc.validate import ROW_SUM_TOL, as_real_array, as_real_array_with_dtype, check_int, check_prob_rows

FloatArray = NDArray[np.float64]

IntArray = NDArray[np.int64]

__all__ = ["BeamDraft", "DraftModel", "HashedDraft", "ToyDraft", "TopDraft", "beam_candidates", "check_beam_args",
           "draft_rows", "select_beam", "select_top", "top_candidates", "top_tokens"]


@runtime_checkable
class DraftModel(Protocol):
    """What a builder needs: ``vocab`` and batched next-token rows for node paths."""

    @property
    def vocab(self) -> int:
        """Vocabulary size ``V``."""
        ...

    def rows(self, paths: Sequence[Path]) -> FloatArray:
        """``(len(paths), V)`` draft rows: row ``i`` is ``q(· | context + paths[i])``."""
        ...


def _path_list(paths: object) -> list[Path]:
    """``paths`` as a list of tuples of ints, before any draft call; ``ValueError`` naming ``paths`` or
    ``paths[i]`` otherwise (a generator, a 2-D array, an int among the paths, a non-integer token)."""
    if paths is None or isinstance(paths, (str, bytes)) or not isinstance(paths, (Sequence, np.ndarray)):
        raise ValueError(f"paths must be a sequence of token paths, got {type(paths).__name__}")
    out: list[Path] = []
    for i, path in enumerate(paths):
        if isinstance(path, (str, bytes)) or not isinstance(path, (Sequence, np.ndarray)):
            raise ValueError(f"paths[{i}] must be a sequence of token ids, got {type(path).__name__}")
        if any(isinstance(t, (bool, np.bool_)) or not isinstance(t, (int, np.integer)) for t in path):
            raise ValueError(f"paths[{i}] must hold integer token ids, got {list(path)!r}")
        out.append(tuple(int(t) for t in path))
    return out


def draft_rows(draft: DraftModel, paths: Sequence[Path]) -> FloatArray:
    """Ask ``draft`` for the rows of ``paths`` in one call; validate shape and values.

    Returns float64 rows renormalised to sum to exactly 1 (within rounding).
    ``ValueError`` names the path whose row is bad, or ``draft.vocab`` when it
    is not an integer ``>= 1``, or ``paths`` (``paths[i]``) when it is not a sequence of token-id sequences.
    """
    return rows_for_paths(draft, _path_list(paths))


def rows_for_paths(draft: DraftModel, paths: list[Path]) -> FloatArray:
    """:func:`draft_rows` for paths known to be a list of tuples of ints (a builder's own nodes): the rows are
    checked, the paths are not.  A builder's layer fetch takes this way; reading 784 paths of up to 7 tokens
    cost 1.5 ms a call (24 µs for 16), host time on every step of a decode."""
    vocab = check_int("draft.vocab", draft.vocab, minimum=1)
    if not paths:
        return np.zeros((0, vocab))
    raw = draft.rows(paths)
    # booleans, text and complex entries refused; the rows' own precision sets the tolerance
    arr, given = as_real_array_with_dtype("draft rows", raw)
    if arr.shape != (len(paths), vocab):
        raise ValueError(
            f"draft model returned rows of shape {arr.shape} for {len(paths)} paths; expected ({len(paths)}, {vocab})"
        )
    try:
        return check_prob_rows("draft rows", arr, dtype=given)
    except ValueError:
        for path, row in zip(paths, arr):
            check_prob_rows(f"draft row for path {tuple(path)}", row[None, :], dtype=given)
        raise


@runtime_checkable
class BeamDraft(Protocol):
    """A draft that selects a beam's best continuations itself (an LLM on its device).

    ``beam_candidates(paths, weights, k)`` must return what :func:`select_beam`
    returns for the draft's rows of ``paths``; a builder then never ships
    ``len(paths) × V`` rows to the host for a step that only needs ``k`` of them.
    """

    def beam_candidates(self, paths: Sequence[Path], weights: FloatArray, k: int) -> tuple[IntArray, FloatArray]:
        """``(positions, values)`` as :func:`select_beam` gives for these paths' rows."""
        ...


def check_beam_args(n: int, weights: ArrayLike, k: object) -> tuple[FloatArray, int]:
    """``weights`` as ``n`` finite numbers ``>= 0`` and ``k >= 1``, or ``ValueError`` naming the argument
    (bool and text weights too: ``[True]`` had been read as 1.0)."""
    w = as_real_array("weights", weights)
    if w.shape != (n,):
        raise ValueError(f"weights must hold one number per path ({n}), got shape {w.shape}")
    if not (np.isfinite(w).all() and (w >= 0.0).all()):
        raise ValueError(f"weights must be finite and >= 0, got {w.tolist()}")
    return w, check_int("k", k, minimum=1)


def select_beam(rows: FloatArray, weights: FloatArray, k: int) -> tuple[IntArray, FloatArray]:
    """The best continuations of a beam, from its rows (the reference of :class:`BeamDraft`).

    The candidates are every (row ``i``, token ``t``) with value
    ``f = weights[i] · rows[i, t]``.  Returned: the flat positions ``i · V + t``
    (ascending: row-major) and values ``f`` of every candidate with ``f > 0`` and
    ``f`` at least the ``k``-th largest value — the ``k`` best plus any ties
    with the ``k``-th, so a caller can break ties its own way.

    ``rows`` are probability rows as :func:`draft_rows` returns them (their
    values are not checked again here); the shapes, ``weights`` and ``k`` are.
    """
    rows = np.asarray(rows, dtype=np.float64)
    if rows.ndim != 2:
        raise ValueError(f"rows must be a 2-D (n, V) array, got shape {rows.shape}")
    weights, k = check_beam_args(rows.shape[0], weights, k)
    flat = (weights[:, None] * rows).ravel()
    chosen = flat > 0.0
    if flat.size > k:
        chosen &= flat >= _kth_largest(flat, k)
    pos = np.flatnonzero(chosen).astype(np.int64)
    return pos, flat[pos]


def _kth_largest(flat: FloatArray, k: int) -> float:
    """The ``k``-th largest value of ``flat`` (``k < flat.size``), whatever the tie order.

    A value-only partition finds it, but only among the values at or above a
    lower bound: split ``flat`` into about ``4k`` blocks and take the ``k``-th
    largest block maximum.  Those maxima are ``k`` distinct entries of
    ``flat``, so at least ``k`` entries reach the bound and the ``k``-th largest
    does too; every entry that ties with or beats it is kept.  For the peaked
    rows of a draft at ``T = 1`` the pool is then about ``k`` values instead of
    ``n · V`` (WETAP's beams of 16-128 rows at ``V = 4096``: 1.3-7x faster than
    partitioning a copy of all of them; ``/tmp/beam_bench.py``, may be gone).
    """
    size = flat.size // (4 * k)  # values per block
    pool = flat
    if size >= 2:
        maxima = flat[: flat.size - flat.size % size].reshape(-1, size).max(axis=1)
        pool = flat[flat >= np.partition(maxima, maxima.size - k)[maxima.size - k]]
    return float(np.partition(pool, pool.size - k)[pool.size - k])


def beam_candidates(
    draft: DraftModel, paths: Sequence[Path], weights: ArrayLike, k: int
) -> tuple[IntArray, FloatArray] | None:
    """:func:`select_beam` computed by a :class:`BeamDraft` (checked), or ``None`` for other drafts.

    ``weights`` are the beam's path weights (finite, ``>= 0``), one per path;
    ``k >= 1``.  ``None`` tells the caller to fetch the rows itself.  The answer is
    checked: 1-D, positions ascending in range, values finite and ``> 0``, and a
    path's values summing to at most its weight (beyond ``ROW_SUM_TOL``).
    """
    w, k = check_beam_args(len(paths), weights, k)
    if not isinstance(draft, BeamDraft):
        return None
    if not paths:
        return np.zeros(0, dtype=np.int64), np.zeros(0)
    pos, val = draft.beam_candidates(list(paths), w, k)
    pos = np.asarray(pos)
    val = np.asarray(val, dtype=np.float64)
    vocab = int(draft.vocab)
    size = len(paths) * vocab
    if pos.ndim != 1 or val.shape != pos.shape or (pos.size and not np.issubdtype(pos.dtype, np.integer)):
        raise ValueError(
            f"draft beam_candidates returned positions {pos.shape} and values {val.shape}; "
            "expected two 1-D arrays of one length, the positions integers"
        )
    pos = pos.astype(np.int64)
    if pos.size and (pos[0] < 0 or pos[-1] >= size or (np.diff(pos) <= 0).any()):
        raise ValueError(f"draft beam_candidates returned positions outside [0, {size}) or not ascending")
    if not (np.isfinite(val).all() and (val > 0.0).all()):
        raise ValueError("draft beam_candidates returned values that are not finite and > 0")
    # a path's candidates are weight x probability of distinct tokens of one row: at most the weight in all
    mass = np.bincount(pos // vocab, weights=val, minlength=len(paths))
    if (mass > w * (1.0 + ROW_SUM_TOL)).any():
        i = int(np.argmax(mass - w * (1.0 + ROW_SUM_TOL)))
        raise ValueError(f"draft beam_candidates returned values summing to {float(mass[i])!r} for path {i} of "
                         f"weight {float(w[i])!r}: more than the weight times a probability row")
    return pos, val


@runtime_checkable
class TopDraft(Protocol):
    """A draft that ranks each row's most likely tokens itself (an LLM on its device).

    ``top_candidates(paths, k)`` must return what :func:`select_top` returns for
    the draft's rows of ``paths``; a builder that keeps only the best few children
    of each node then never ships ``len(paths) × V`` rows to the host.
    """

    def top_candidates(self, paths: Sequence[Path], k: int) -> tuple[IntArray, FloatArray]:
        """``(tokens, values)`` as :func:`select_top` gives for these paths' rows."""
        ...


def top_tokens(row: FloatArray, k: int) -> list[int]:
    """The ``k`` most likely tokens with ``q > 0``, most likely first (ties to the lower id).

    When ``k`` is below the support size, a partition finds the ``k``-th largest
    value ``t`` first: the answer is every token above ``t`` and the lowest ids
    at ``t``, sorted as above; only those ``k`` are sorted, not the whole support
    (a ``V = 4096`` row: 0.36 ms for the full sort, 0.07–0.09 ms this way, and an
    ``argmax`` for ``k = 1``).
    """
    k = check_int("k", k, minimum=1)  # a negative k sliced from the end
    if k == 1:  # argmax takes the first maximum: the lowest id among ties
        best = int(np.argmax(row))
        return [best] if row[best] > 0.0 else []
    positive = np.flatnonzero(row > 0.0)
    if 0 < k < positive.size:
        values = row[positive]
        t = np.partition(values, positive.size - k)[positive.size - k]  # the k-th largest value
        above = positive[values > t]
        positive = np.concatenate([above, positive[values == t][: k - above.size]])  # ids ascending at t
    order = positive[np.lexsort((positive, -row[positive]))]
    return [int(x) for x in order[:k]]


def select_top(rows: ArrayLike, k: object) -> tuple[IntArray, FloatArray]:
    """Each row's ``k`` most likely tokens with ``q > 0``, most likely first, equal values by lowest id.

    Row ``i`` of the result is :func:`top_tokens` of ``rows[i]`` (the reference of
    :class:`TopDraft`): ``tokens`` ``(n, k)`` int64 and their ``values`` ``(n, k)``
    float64, a row with fewer than ``k`` tokens of ``q > 0`` padded at its end
    with token ``-1`` and value ``0``.  ``rows`` are probability rows as
    :func:`draft_rows` returns them (their values are not checked again here:
    a NaN entry gives answers that depend on ``k``).  Row by row: on the CPU that beat a
    vectorised partition of all rows at once (1.4–14× for 1–8 rows of
    ``V = 4096``, ``k = 3``; one-hot rows, the greedy case, gain most).
    """
    arr = np.asarray(rows, dtype=np.float64)
    if arr.ndim != 2:
        raise ValueError(f"rows must be a 2-D (n, V) array, got shape {arr.shape}")
    k = check_int("k", k, minimum=1)
    tokens = np.full((arr.shape[0], k), -1, dtype=np.int64)
    values = np.zeros((arr.shape[0], k))
    for i, row in enumerate(arr):
        best = top_tokens(row, k)
        tokens[i, : len(best)] = best
        values[i, : len(best)] = row[best]
    return tokens, values


def top_candidates(draft: DraftModel, paths: Sequence[Path], k: int) -> tuple[IntArray, FloatArray] | None:
    """:func:`select_top` computed by a :class:`TopDraft` (its answer checked), or ``None`` for other drafts.

    ``None`` tells the caller to fetch the rows itself.  ``ValueError`` when the
    answer is malformed: shapes, ids out of range or repeated in a row, values
    not positive or increasing along a row or summing past 1 (beyond
    ``ROW_SUM_TOL``), padding other than trailing ``(-1, 0)`` (the order of
    equal values is the draft's to get right).
    """
    k = check_int("k", k, minimum=1)
    if not isinstance(draft, TopDraft):
        return None
    if not paths:
        return np.zeros((0, k), dtype=np.int64), np.zeros((0, k))
    tok, val = draft.top_candidates(list(paths), k)
    tok, val = np.asarray(tok), np.asarray(val, dtype=np.float64)
    n, vocab = len(paths), int(draft.vocab)
    if tok.shape != (n, k) or val.shape != (n, k) or not np.issubdtype(tok.dtype, np.integer):
        raise ValueError(f"draft top_candidates returned tokens {tok.shape} and values {val.shape}; expected two "
                         f"({n}, {k}) arrays, the tokens integers")
    tok = tok.astype(np.int64, copy=False)
    real = tok >= 0
    if (tok >= vocab).any() or (tok < -1).any() or (real[:, 1:] > real[:, :-1]).any():
        raise ValueError(f"draft top_candidates returned ids outside [0, {vocab}) or padding (-1) before an id")
    if not real[:, 0].all():  # a probability row has a token of q > 0
        raise ValueError(f"draft top_candidates returned no token at all in row {int(np.argmin(real[:, 0]))}")
    with np.errstate(invalid="ignore"):
        if not (np.where(real, val > 0.0, val == 0.0) & (val < np.inf)).all():
            raise ValueError("draft top_candidates returned values that are not finite and > 0 (0 for padding)")
    over = val.sum(axis=1) > 1.0 + ROW_SUM_TOL  # probabilities of distinct tokens of one row
    if over.any():
        i = int(np.argmax(over))
        raise ValueError(f"draft top_candidates returned values summing to {float(val[i].sum())!r} in row {i}: "
                         f"not probabilities of one row")
    if k > 1:
        if (val[:, 1:] > val[:, :-1]).any():
            raise ValueError("draft top_candidates returned a row whose values increase")
        same = (tok[:, :, None] == tok[:, None, :]) & real[:, :, None]  # (n, k, k): an id met again in its row
        if np.triu(same, 1).any():
            raise ValueError("draft top_candidates returned the same id twice in one row")
    return tok, val


@dataclass
class ToyDraft:
    """The draft side of a :class:`tmc.ToyModel` below a fixed ``prefix``, counting its calls.

    ``calls`` is the number of batched ``rows`` calls and ``evaluated`` the
    number of rows returned: tests use them to check that builders evaluate a
    whole layer per call.
    """

    model: ToyModel
    prefix: Path = ()
    calls: int = field(default=0, compare=False)
    evaluated: int = field(default=0, compare=False)

    @property
    def vocab(self) -> int:
        return self.model.vocab

    def rows(self, paths: Sequence[Path]) -> FloatArray:
        self.calls += 1
        self.evaluated += len(paths)
        base = tuple(self.prefix)
        return np.array([self.model.q(base + tuple(path)) for path in paths], dtype=np.float64).reshape(
            len(paths), self.model.vocab
        )


@dataclass
class HashedDraft:
    """A synthetic draft model: each path's row is a Dirichlet draw seeded by ``(seed, path)``.

    Rows differ from prefix to prefix and are reproducible without storing
    them, so builders can grow trees of thousands of nodes (benchmarks).
    Smaller ``concentration`` gives more peaked rows.  The generator's seed is
    ``seed`` with the spawn key ``(len(path), *path)``: the length keeps a path
    and the path followed by token 0 apart (numpy pads short entropy with
    zeros, so ``(seed, *path)`` gave both one row), and a seed below ``2**64``
    fills the entropy words on its own, so no seed collides with another's paths.
    """

    vocab_size: int
    seed: int = 0
    concentration: float = 0.3
    calls: int = field(default=0, compare=False)

    def __post_init__(self) -> None:
        self.vocab_size = check_int("vocab_size", self.vocab_size, minimum=1)
        self.seed = check_int("seed", self.seed, minimum=0)
        if self.seed >= 2**64:
            raise ValueError(f"seed must be < 2**64, got {self.seed}")
        real = isinstance(self.concentration, numbers.Real) and not isinstance(self.concentration, bool)
        if not real or not 0.0 < self.concentration < math.inf:
            raise ValueError(f"concentration must be a finite number > 0, got {self.concentration!r}")

    @property
    def vocab(self) -> int:
        return self.vocab_size

    def rows(self, paths: Sequence[Path]) -> FloatArray:
        """One row per path; ``ValueError`` for a path token that is not an id in ``[0, vocab)`` (1.7 had been
        read as 1, and -1 failed inside numpy's seeding)."""
        self.calls += 1
        alpha = np.full(self.vocab_size, self.concentration)
        keys = []
        for i, path in enumerate(paths):
            toks = [check_int(f"paths[{i}][{j}]", t, minimum=0) for j, t in enumerate(path)]
            if any(t >= self.vocab_size for t in toks):
                raise ValueError(f"paths[{i}] = {tuple(toks)} holds a token outside [0, {self.vocab_size})")
            keys.append((len(toks), *toks))
        out = [np.random.default_rng(np.random.SeedSequence(self.seed, spawn_key=key)).dirichlet(alpha)
               for key in keys]
        return np.array(out).reshape(len(paths), self.vocab_size)
