"""Exact output laws of chain verifiers by enumerating every draft chain.

For a toy model (:class:`tmc.toy.ToyModel`) the draft chain ``d`` of length
``n`` is drawn autoregressively from ``q`` with probability ``w_d``.  A
chain verifier's kernel gives the law of the step's output given ``d``; the
*averaged output law* is ``K̄(s) = Σ_d w_d K_d(s)`` over output strings ``s``
(accepted draft tokens plus the corrected or bonus token).

The **completion identity** (DESIGN.md §4) is the exact test of losslessness
used everywhere in this project: after a lossless step, continuing from its
output with the target must give the target's law at any length ``L`` at
least as long as every output, i.e. for every path ``t`` of length ``L``::

    Σ_{s ≤ t} K̄(s) · P(t | s) = P(t).

It is evaluated by one pass over the tree of paths:
``M(σ + a) = M(σ) p(a | σ) + K̄(σ + a)`` and ``M(t) = P(t)`` at depth ``L``.
An output ``s`` with ``P(s) = 0`` is itself a violation of size ``K̄(s)``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import permutations, product

import numpy as np
from numpy.typing import ArrayLike, NDArray

from tmc.multidraft import Draw, DraftTree, multidraft_kernel, swor_sequence_prob, tree_kernel_outputs
from tmc.prefix import PrefixKernel
from tmc.toy import Path, ToyModel
from tmc.tree import TreeDistribution, TreeSpace

FloatArray = NDArray[np.float64]
ChainKernel = Callable[[ArrayLike | Sequence[int], ArrayLike, ArrayLike], FloatArray]
TreeKernel = Callable[[DraftTree, ArrayLike], FloatArray]


@dataclass(frozen=True)
class DraftChain:
    """One draft chain with its probability and the rows along it."""

    ref: Path  # the n draft tokens
    weight: float  # probability that the draft model produces ref
    q_rows: FloatArray  # (n, V) draft rows along ref
    p_rows: FloatArray  # (n + 1, V) target rows along ref


@dataclass(frozen=True)
class OutputLaw:
    """Exact averaged output law of a verifier on a toy model."""

    output_law: dict[Path, float]  # K̄(s) for each output string s with K̄(s) > 0
    expected_length: float  # E[len(s)]: tokens emitted per step
    completion_error: float  # worst violation of the completion identity
    n_drafts: int  # number of draft chains / trees with positive probability


ChainLaw = OutputLaw  # the chain case keeps its own name in the public API


def enumerate_drafts(model: ToyModel, n: int, prefix: Path = ()) -> Iterator[DraftChain]:
    """Every draft chain of length ``n`` with positive draft probability."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    for ref in product(range(model.vocab), repeat=n):
        q_rows, p_rows = model.chain_rows(ref, prefix)
        weight = float(np.prod(q_rows[np.arange(n), list(ref)])) if n else 1.0
        if weight > 0.0:
            yield DraftChain(ref, weight, q_rows, p_rows)


def kernel_outputs(ref: Path, kernel: FloatArray) -> Iterator[tuple[Path, float]]:
    """``(output string, probability)`` for each positive cell of a chain kernel."""
    for k, b in zip(*np.nonzero(kernel)):
        yield tuple(ref[: int(k)]) + (int(b),), float(kernel[k, b])


def chain_joint_law(
    model: ToyModel, n: int, kernel_fn: ChainKernel, prefix: Path = ()
) -> dict[tuple[Path, Path], float]:
    """Joint law of (draft chain, output string): ``w_d · K_d(s)``."""
    joint: dict[tuple[Path, Path], float] = {}
    for d in enumerate_drafts(model, n, prefix):
        for s, prob in kernel_outputs(d.ref, kernel_fn(d.ref, d.q_rows, d.p_rows)):
            joint[(d.ref, s)] = d.weight * prob
    return joint


def completion_error(
    model: ToyModel, output_law: dict[Path, float], length: int, prefix: Path = ()
) -> float:
    """Worst violation of the completion identity over all paths of ``length``.

    ``length`` must be at least the longest output.  Outputs with target
    probability 0 count as violations of their own mass.
    """
    longest = max((len(s) for s in output_law), default=0)
    if length < longest:
        raise ValueError(f"length {length} is shorter than the longest output ({longest})")
    worst = 0.0
    for s, mass in output_law.items():
        if model.target_path_prob(s, prefix) == 0.0:
            worst = max(worst, mass)

    def walk(node: Path, m: float, prob: float) -> float:
        if len(node) == length:
            return abs(m - prob)
        row = model.p(tuple(prefix) + node)
        err = 0.0
        for a in range(model.vocab):
            child = node + (a,)
            err = max(err, walk(child, m * row[a] + output_law.get(child, 0.0), prob * row[a]))
        return err

    return max(worst, walk((), output_law.get((), 0.0), 1.0))


def chain_output_law(
    model: ToyModel, n: int, kernel_fn: ChainKernel, prefix: Path = ()
) -> OutputLaw:
    """Averaged output law, expected length and completion error of a chain verifier."""
    law, count = averaged_chain_law(model, n, kernel_fn, prefix)
    return _summarise(model, law, n + 1, count, prefix)


def averaged_chain_law(
    model: ToyModel, n: int, kernel_fn: ChainKernel, prefix: Path = ()
) -> tuple[dict[Path, float], int]:
    """``(K̄, number of drafts)``: the averaged output law without the completion check."""
    law: dict[Path, float] = defaultdict(float)
    count = 0
    for d in enumerate_drafts(model, n, prefix):
        count += 1
        for s, prob in kernel_outputs(d.ref, kernel_fn(d.ref, d.q_rows, d.p_rows)):
            law[s] += d.weight * prob
    return dict(law), count


def _summarise(
    model: ToyModel, law: dict[Path, float], length: int, count: int, prefix: Path
) -> OutputLaw:
    out = dict(law)
    expected = sum(len(s) * m for s, m in out.items())
    return OutputLaw(out, expected, completion_error(model, out, length, prefix), count)


# ------------------------------------------------------------------ trees


def child_options(model: ToyModel, path: Path, width: int, draw: Draw) -> list[tuple[tuple[int, ...], float]]:
    """Every ordered tuple of children a node at ``path`` can get, with its probability.

    ``iid``: ``width`` i.i.d. draws from ``q``.  ``swor``: ``min(width, |supp q|)``
    distinct draws, each from ``q`` renormalised without the earlier ones.
    ``topk``: the ``width`` most likely tokens under ``q`` (ties to the lower
    id), probability 1.
    """
    q = model.q(path)
    if draw == Draw.TOPK:
        order = sorted(range(model.vocab), key=lambda t: (-q[t], t))
        return [(tuple(order[:width]), 1.0)]
    if draw == Draw.IID:
        combos = product(range(model.vocab), repeat=width)
        out = [(c, float(np.prod([q[t] for t in c]))) for c in combos]
        return [(c, w) for c, w in out if w > 0.0]
    support = [t for t in range(model.vocab) if q[t] > 0.0]
    return [(combo, swor_sequence_prob(q, combo)) for combo in permutations(support, min(width, len(support)))]


def enumerate_draft_trees(
    model: ToyModel, widths: Sequence[int], draw: Draw | str, prefix: Path = ()
) -> Iterator[tuple[float, DraftTree]]:
    """Every draft tree of the given shape with its probability under the draft.

    ``widths[d]`` is the number of children of every node at depth ``d``
    (the root is depth 0).  Nodes are numbered breadth first.
    """
    kind = Draw(draw)
    if any(w < 1 for w in widths):
        raise ValueError(f"widths must be positive, got {list(widths)}")

    def grow(
        queue: list[tuple[int, Path]], parents: list[int], tokens: list[int], weight: float
    ) -> Iterator[tuple[float, DraftTree]]:
        if not queue:
            rows = {node: model.q(tuple(prefix) + path) for node, path in _expanded(parents, tokens, len(widths))}
            yield weight, DraftTree(tuple(parents), tuple(tokens), (kind,) * len(tokens), rows, model.vocab)
            return
        (node, path), rest = queue[0], queue[1:]
        if len(path) == len(widths):
            yield from grow(rest, parents, tokens, weight)
            return
        for combo, prob in child_options(model, tuple(prefix) + path, widths[len(path)], kind):
            first = len(tokens)
            kids = [(first + i, path + (t,)) for i, t in enumerate(combo)]
            yield from grow(rest + kids, parents + [node] * len(combo), tokens + list(combo), weight * prob)

    yield from grow([(-1, ())], [], [], 1.0)


def _expanded(parents: list[int], tokens: list[int], depth: int) -> list[tuple[int, Path]]:
    paths: dict[int, Path] = {-1: ()}
    for i, (par, tok) in enumerate(zip(parents, tokens)):
        paths[i] = paths[par] + (tok,)
    return [(node, path) for node, path in paths.items() if len(path) < depth]


def tree_p_rows(model: ToyModel, tree: DraftTree, prefix: Path = ()) -> FloatArray:
    """Target rows ``(N + 1, V)``: the root, then each node's path."""
    rows = [model.p(tuple(prefix))] + [model.p(tuple(prefix) + tree.path(i)) for i in range(tree.size)]
    return np.array(rows)


def tree_output_law(
    model: ToyModel,
    widths: Sequence[int],
    draw: Draw | str,
    kernel_fn: TreeKernel = multidraft_kernel,
    prefix: Path = (),
) -> OutputLaw:
    """Averaged output law, expected length and completion error of a tree verifier."""
    law, count = averaged_tree_law(model, widths, draw, kernel_fn, prefix)
    return _summarise(model, law, len(widths) + 1, count, prefix)


def averaged_tree_law(
    model: ToyModel,
    widths: Sequence[int],
    draw: Draw | str,
    kernel_fn: TreeKernel = multidraft_kernel,
    prefix: Path = (),
) -> tuple[dict[Path, float], int]:
    """``(K̄, number of draft trees)``: the averaged output law without the completion check."""
    law: dict[Path, float] = defaultdict(float)
    count = 0
    for weight, tree in enumerate_draft_trees(model, widths, draw, prefix):
        count += 1
        kernel = kernel_fn(tree, tree_p_rows(model, tree, prefix))
        for s, prob in tree_kernel_outputs(tree, kernel).items():
            law[s] += weight * prob
    return dict(law), count


# ------------------------------------------- verifiers as prefix samplers


def target_tree_distribution(model: ToyModel, depth: int) -> TreeDistribution:
    """The target ``p`` as a leaf-only tree distribution on the full tree of ``depth``."""
    space = TreeSpace.full(model.vocab, depth)

    def cond(path: Path) -> dict[int, float]:
        row = model.p(path)
        return {a: float(row[a]) for a in range(model.vocab) if row[a] > 0.0}

    return TreeDistribution.from_conditionals(space, cond)


def speculative_prefix_kernel(model: ToyModel, n: int, kernel_fn: ChainKernel, depth: int) -> PrefixKernel:
    """One speculative step as an exact prefix sampler on the tree of ``depth`` (Thm 5.7).

    From a prefix ``σ`` the draft proposes ``min(n, depth − len(σ) − 1)``
    tokens and the verifier emits its output after ``σ``; at depth ``depth``
    (a leaf) the prefix is returned unchanged.  Composing it with itself is
    speculative decoding run for several steps (Def A.26).
    """

    def kernel(prefix: Path) -> dict[Path, float]:
        room = depth - len(prefix)
        if room <= 0:
            return {prefix: 1.0}
        law, _ = averaged_chain_law(model, min(n, room - 1), kernel_fn, prefix)
        return {prefix + s: m for s, m in law.items()}

    return kernel
