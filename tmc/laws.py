"""Exact output laws, the completion identity and total variation (the one home of each).

Notation (DESIGN.md §3): ``p`` is the target, ``q`` the draft.  A verifier's
kernel is its exact output law given one draft (indexing: :mod:`tmc`).  Over
the drafts of :mod:`tmc.drafts`, with weights ``w_d``, the **averaged output
law** is ``K̄(s) = Σ_d w_d K_d(s)`` over emitted strings ``s`` (accepted draft
tokens plus one corrected or bonus token).

The **completion identity** (DESIGN.md §4) is the exact test of losslessness
used everywhere in this project: continuing each output with the target up to
a length ``L`` no output exceeds must give the target's law, i.e. for every
path ``t`` of length ``L``::

    C(t) = Σ_{s ≤ t} K̄(s) · P(t | s) = P(t).

:func:`completed_law` computes ``C`` by one pass over the tree of paths
(``M(σ + a) = M(σ) p(a | σ) + K̄(σ + a)``); :func:`completion_error` is the
worst ``|C(t) − P(t)|`` (an output with ``P(s) = 0`` counts with its whole
mass); :func:`completion_tv` is ``½ Σ_t |C(t) − P(t)|``, the audit's measure
of bias.  :func:`total_variation` is ``½ Σ |a − b|`` over two laws given as
``{outcome: mass}`` maps, shared with :func:`tmc.order.total_variation`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
from numpy.typing import ArrayLike, NDArray

from tmc.drafts import Draft, DraftChain
from tmc.multidraft import DraftTree, tree_kernel_outputs
from tmc.toy import Path, ToyModel

FloatArray = NDArray[np.float64]
ChainKernel = Callable[[ArrayLike | Sequence[int], ArrayLike, ArrayLike], FloatArray]
TreeKernel = Callable[[DraftTree, ArrayLike], FloatArray]
K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class OutputLaw:
    """Exact averaged output law of a verifier on a toy model."""

    output_law: dict[Path, float]  # K̄(s) for each output string s with K̄(s) > 0
    expected_length: float  # E[len(s)]: tokens emitted per step
    completion_error: float  # worst violation of the completion identity
    n_drafts: int  # number of draft chains / trees with positive probability


def chain_kernel_outputs(ref: Path, kernel: FloatArray) -> Iterable[tuple[Path, float]]:
    """``(output string, probability)`` for each positive cell of a chain kernel ``(n + 1, V)``."""
    for k, b in zip(*np.nonzero(kernel)):
        yield tuple(ref[: int(k)]) + (int(b),), float(kernel[k, b])


def draft_outputs(draft: Draft, kernel_fn: ChainKernel | TreeKernel) -> Iterable[tuple[Path, float]]:
    """``(output string, probability)`` of one draft under a verifier's kernel."""
    if isinstance(draft, DraftChain):
        chain_fn: ChainKernel = kernel_fn  # type: ignore[assignment]
        return chain_kernel_outputs(draft.ref, chain_fn(draft.ref, draft.q_rows, draft.p_rows))
    tree_fn: TreeKernel = kernel_fn  # type: ignore[assignment]
    return tree_kernel_outputs(draft.tree, tree_fn(draft.tree, draft.p_rows)).items()


def averaged_law(drafts: Sequence[Draft], kernel_fn: ChainKernel | TreeKernel) -> dict[Path, float]:
    """``K̄(s) = Σ_d w_d K_d(s)`` over the given drafts (chains or trees)."""
    if not callable(kernel_fn):
        raise ValueError(f"kernel_fn must be a kernel function, got {type(kernel_fn).__name__}")
    law: dict[Path, float] = defaultdict(float)
    for d in drafts:
        for s, prob in draft_outputs(d, kernel_fn):
            law[s] += d.weight * prob
    return dict(law)


def joint_law(drafts: Sequence[DraftChain], kernel_fn: ChainKernel) -> dict[tuple[Path, Path], float]:
    """Joint law of (draft chain, output string): ``w_d · K_d(s)``."""
    return {
        (d.ref, s): d.weight * prob
        for d in drafts
        for s, prob in chain_kernel_outputs(d.ref, kernel_fn(d.ref, d.q_rows, d.p_rows))
    }


def target_law(model: ToyModel, length: int, prefix: Path = ()) -> dict[Path, float]:
    """``P(t | prefix)`` for every ``t`` of ``length`` tokens with ``P(t) > 0``."""
    out: dict[Path, float] = {}
    stack: list[tuple[Path, float]] = [((), 1.0)]
    while stack:
        node, prob = stack.pop()
        if len(node) == length:
            out[node] = prob
            continue
        row = model.p(tuple(prefix) + node)
        stack.extend((node + (a,), prob * float(row[a])) for a in range(model.vocab) if row[a] > 0.0)
    return out


def completed_law(model: ToyModel, output_law: Mapping[Path, float], length: int, prefix: Path = ()) -> dict[Path, float]:
    """``C(t) = Σ_{s ≤ t} K̄(s) P(t | s)`` for every ``t`` of ``length`` with ``C(t) ≠ 0``.

    Outputs longer than ``length`` are an error (the identity needs ``L`` at
    least the longest output).
    """
    prefix = model.checked_path("prefix", prefix)
    for s in output_law:  # an output off the vocabulary is never reached below: it would be dropped silently
        model.checked_path(f"output_law key {s!r}", s)
    longest = max((len(s) for s in output_law), default=0)
    if length < longest:
        raise ValueError(f"length {length} is shorter than the longest output ({longest})")
    out: dict[Path, float] = {}
    stack: list[tuple[Path, float]] = [((), output_law.get((), 0.0))]
    while stack:
        node, mass = stack.pop()
        if len(node) == length:
            if mass != 0.0:
                out[node] = mass
            continue
        row = model.p(tuple(prefix) + node)
        for a in range(model.vocab):
            child = node + (a,)
            stack.append((child, mass * float(row[a]) + output_law.get(child, 0.0)))
    return out


def total_variation(a: Mapping[K, float], b: Mapping[K, float]) -> float:
    """``½ Σ |a − b|`` over the union of the outcomes of two laws."""
    return 0.5 * math.fsum(abs(a.get(t, 0.0) - b.get(t, 0.0)) for t in set(a) | set(b))


def completion_error(model: ToyModel, output_law: Mapping[Path, float], length: int, prefix: Path = ()) -> float:
    """Worst ``|C(t) − P(t)|`` over paths of ``length``; an output with ``P(s) = 0`` counts in full."""
    completed = completed_law(model, output_law, length, prefix)
    target = target_law(model, length, prefix)
    worst = max((abs(completed.get(t, 0.0) - target.get(t, 0.0)) for t in set(completed) | set(target)), default=0.0)
    for s, mass in output_law.items():
        if model.target_path_prob(s, prefix) == 0.0:
            worst = max(worst, mass)
    return worst


def completion_tv(model: ToyModel, output_law: Mapping[Path, float], length: int, prefix: Path = ()) -> float:
    """``½ Σ_t |C(t) − P(t)|``: the total variation the bias of a one-step verifier causes."""
    return total_variation(completed_law(model, output_law, length, prefix), target_law(model, length, prefix))


def summarise(model: ToyModel, law: Mapping[Path, float], length: int, n_drafts: int, prefix: Path = ()) -> OutputLaw:
    """:class:`OutputLaw` of an averaged law: expected length and completion error at ``length``."""
    out = dict(law)
    expected = math.fsum(len(s) * m for s, m in out.items())
    return OutputLaw(out, expected, completion_error(model, out, length, prefix), n_drafts)


def completion_cells(vocab: int, depth: int) -> float:
    """``Σ_{d ≤ depth} V^(d + 1)``: the (prefix, token) cells of every string up to ``depth + 1`` tokens, the size
    of a completion check or an LP limit over drafts of that depth (a float: it may pass any integer size)."""
    return sum(float(vocab) ** (d + 1) for d in range(depth + 1))


def draft_depth(drafts: Sequence[Draft]) -> int:
    """Deepest accepted path over the drafts: outputs are at most one token longer."""
    return max((len(path) for d in drafts for path in d.accepted_paths), default=0)


def output_law(model: ToyModel, drafts: Sequence[Draft], kernel_fn: ChainKernel | TreeKernel, prefix: Path = ()) -> OutputLaw:
    """Averaged output law, expected length and completion error of a verifier on the drafts."""
    return summarise(model, averaged_law(drafts, kernel_fn), draft_depth(drafts) + 1, len(drafts), prefix)
