"""Hypothesis strategies: draft/target toy models and tree distributions (DESIGN.md §5).

Rows are drawn as small integer weights normalised to 1, which produces
exact zeros and exact ties naturally.  A model-wide *relation* between the
target ``p`` and the draft ``q`` covers the cases that break verifiers:
independent rows, identical rows (``p == q``, zero residual mass), near ties
(``p = q`` up to 1e-12), one-hot greedy targets, and rows with tiny
probabilities (1e-12).  Tree distributions have exact zeros, ties and near
ties (siblings equal up to a relative 1e-12 or 1e-9); :data:`chain_lengths`
and :func:`tree_shapes` give the draft lengths and tree widths.
"""

from __future__ import annotations

import functools
from itertools import product

import numpy as np
from hypothesis import strategies as st
from numpy.typing import NDArray

from tmc.toy import Path, ToyModel
from tmc.tree import TreeDistribution, TreeSpace

FloatArray = NDArray[np.float64]

#: Every relation :func:`target_row` accepts between the target row ``p`` and
#: the draft row ``q``; :func:`toy_models` draws from all of them by default.
ALL_RELATIONS: tuple[str, ...] = ("independent", "identical", "near_tie", "greedy", "tiny", "disjoint")

#: The relations the bias audit searches (``verification.audit``), in its
#: shrinking order: :data:`ALL_RELATIONS` without ``near_tie`` and ``disjoint``.
RELATIONS: tuple[str, ...] = ("independent", "identical", "greedy", "tiny")


def check_relation(relation: object) -> str:
    """``relation`` if it is one of :data:`ALL_RELATIONS`; ``ValueError`` naming them otherwise."""
    if not isinstance(relation, str) or relation not in ALL_RELATIONS:
        raise ValueError(f"relation must be one of {', '.join(ALL_RELATIONS)}; got {relation!r}")
    return relation


def _some_weight(weights: list[int]) -> bool:
    return sum(weights) > 0


@functools.lru_cache(maxsize=None)
def _weight_lists(vocab: int, max_weight: int) -> st.SearchStrategy[list[int]]:
    """Integer weight rows with positive total, built once per shape.

    Building the filtered strategy anew at every draw made hypothesis re-analyse
    the filter's source each time (most of the time of an exact audit).
    """
    return st.lists(st.integers(0, max_weight), min_size=vocab, max_size=vocab).filter(_some_weight)


@st.composite
def prob_rows(draw: st.DrawFn, vocab: int, *, tiny: bool = False, max_weight: int = 6) -> FloatArray:
    """One probability row over ``vocab`` tokens with exact zeros and ties.

    Entries are integer weights ``0..max_weight`` normalised; with ``tiny`` the
    zeros become 1e-12 of the total instead.
    """
    weights = draw(_weight_lists(vocab, max_weight))
    row = np.asarray(weights, dtype=np.float64)
    if tiny:
        small = row == 0
        row[small] = 1e-12 * row.sum()
    out: FloatArray = row / row.sum()
    return out


@st.composite
def target_row(draw: st.DrawFn, relation: str, q: FloatArray, *, max_weight: int = 6) -> FloatArray:
    """A target row standing in ``relation`` (one of :data:`ALL_RELATIONS`) to the draft row ``q``."""
    check_relation(relation)
    vocab = q.shape[0]
    if relation == "identical":
        return q.copy()
    if relation == "near_tie":
        bump = 1e-12 * np.asarray(draw(st.lists(st.integers(-3, 3), min_size=vocab, max_size=vocab)), dtype=np.float64)
        row = np.maximum(q + bump * (q > 0), 0.0)
        out: FloatArray = row / row.sum()
        return out
    if relation == "greedy":
        hot = np.zeros(vocab)
        hot[draw(st.integers(0, vocab - 1))] = 1.0
        return hot
    if relation == "disjoint" and vocab > 1 and (q == 0).any():
        flipped = np.where(q == 0, 1.0, 0.0)
        other: FloatArray = flipped / flipped.sum()
        return other
    row2: FloatArray = draw(prob_rows(vocab, tiny=relation == "tiny", max_weight=max_weight))
    return row2


@st.composite
def toy_models(
    draw: st.DrawFn, *, min_vocab: int = 1, max_vocab: int = 4, depth: int = 3, relation: str | None = None
) -> ToyModel:
    """A toy model with rows for every prefix of length ``<= depth``."""
    vocab = draw(st.integers(min_vocab, max_vocab))
    rel = check_relation(relation) if relation is not None else draw(st.sampled_from(ALL_RELATIONS))
    d_rows: dict[Path, FloatArray] = {}
    t_rows: dict[Path, FloatArray] = {}
    for length in range(depth + 1):
        for prefix in product(range(vocab), repeat=length):
            q = draw(prob_rows(vocab, tiny=rel == "tiny"))
            d_rows[prefix] = q
            t_rows[prefix] = draw(target_row(rel, q))
    return ToyModel(vocab, d_rows, t_rows, name=f"hypothesis-{rel}")


# ------------------------------------------------------ tree distributions

Rows = dict[Path, dict[int, float]]

# Unnormalised weights: exact zeros (pruned children) or values bounded away
# from 0, so normalised probabilities are >= 0.05 / 4 and never mere rounding.
WEIGHTS = st.one_of(st.just(0.0), st.floats(0.05, 1.0), st.floats(0.05, 1.0))

#: Relative offsets of a near tie: one sibling's weight is another's times ``1 + offset``.
NEAR_TIE_OFFSETS: tuple[float, ...] = (1e-12, -1e-12, 1e-9)

#: Draft chain lengths the exact checks cover (DESIGN.md §5: chains of length 1..6).
chain_lengths = st.integers(1, 6)


@st.composite
def tree_shapes(draw: st.DrawFn, *, max_depth: int = 3, max_width: int = 3, max_nodes: int = 12) -> list[int]:
    """Widths ``[w_1, ..., w_d]`` of a draft tree (every node at depth ``i - 1`` gets ``w_i`` children, as
    :func:`tmc.drafts.tree_drafts` takes them), at most ``max_nodes`` draft nodes in all."""
    widths = draw(st.lists(st.integers(1, max_width), min_size=1, max_size=max_depth))
    nodes, layer, out = 0, 1, []
    for w in widths:
        layer *= w
        if nodes + layer > max_nodes:
            break
        nodes += layer
        out.append(w)
    return out or [1]

spaces = st.builds(TreeSpace.full, st.integers(1, 3), st.integers(1, 3))


@st.composite
def weight_rows(draw: st.DrawFn, *, n_children: int, leaf_only: bool) -> list[float]:
    """Normalised ``[P(a_1|s), ..., P(a_k|s), P(tau|s)]`` for one node, with exact zeros and ties and, now and
    then, a near tie: one positive weight set to another's times ``1 + offset`` (:data:`NEAR_TIE_OFFSETS`)."""
    size = n_children if leaf_only else n_children + 1
    row = draw(st.lists(WEIGHTS, min_size=size, max_size=size).filter(any))
    positive = [i for i, w in enumerate(row) if w > 0.0]
    if len(row) >= 2 and positive and draw(st.booleans()):
        src = draw(st.sampled_from(positive))
        dst = draw(st.sampled_from([i for i in range(len(row)) if i != src]))
        row[dst] = row[src] * (1.0 + draw(st.sampled_from(NEAR_TIE_OFFSETS)))
    total = sum(row)
    return [w / total for w in row] + ([0.0] if leaf_only else [])


@st.composite
def conditional_rows(draw: st.DrawFn, space: TreeSpace, *, leaf_only: bool = False) -> Rows:
    """Child conditionals ``{node: {a: P(a|node)}}`` for every internal node of a finite space."""
    rows: Rows = {}
    for node in space.paths():
        kids = space.children(node)
        if kids:
            probs = draw(weight_rows(n_children=len(kids), leaf_only=leaf_only))
            rows[node] = {a: p for a, p in zip(kids, probs) if p > 0.0}
    return rows


def from_rows(space: TreeSpace, rows: Rows) -> TreeDistribution:
    """Distribution with the given child conditionals."""
    return TreeDistribution.from_conditionals(space, lambda s: rows[s])


@st.composite
def spaces_and_rows(draw: st.DrawFn, *, leaf_only: bool = False) -> tuple[TreeSpace, Rows]:
    space = draw(spaces)
    return space, draw(conditional_rows(space, leaf_only=leaf_only))


@st.composite
def tree_distributions(draw: st.DrawFn, *, leaf_only: bool = False) -> TreeDistribution:
    space, rows = draw(spaces_and_rows(leaf_only=leaf_only))
    return from_rows(space, rows)
