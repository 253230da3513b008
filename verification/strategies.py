"""Hypothesis strategies for draft/target toy models (DESIGN.md §5).

Rows are drawn as small integer weights normalised to 1, which produces
exact zeros and exact ties naturally.  A model-wide *relation* between the
target ``p`` and the draft ``q`` covers the cases that break verifiers:
independent rows, identical rows (``p == q``, zero residual mass), near ties
(``p = q`` up to 1e-12), one-hot greedy targets, and rows with tiny
probabilities (1e-12).
"""

from __future__ import annotations

from itertools import product

import numpy as np
from hypothesis import strategies as st
from numpy.typing import NDArray

from tmc.toy import Path, ToyModel

FloatArray = NDArray[np.float64]
RELATIONS = ("independent", "identical", "near_tie", "greedy", "tiny", "disjoint")


@st.composite
def prob_rows(draw: st.DrawFn, vocab: int, *, tiny: bool = False) -> FloatArray:
    """One probability row over ``vocab`` tokens with exact zeros and ties."""
    weights = draw(
        st.lists(st.integers(0, 6), min_size=vocab, max_size=vocab).filter(lambda w: sum(w) > 0)
    )
    row = np.asarray(weights, dtype=np.float64)
    if tiny:
        small = row == 0
        row[small] = 1e-12 * row.sum()
    out: FloatArray = row / row.sum()
    return out


@st.composite
def _target_row(draw: st.DrawFn, relation: str, q: FloatArray) -> FloatArray:
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
        row = np.where(q == 0, 1.0, 0.0)
        return row / row.sum()
    row2: FloatArray = draw(prob_rows(vocab, tiny=relation == "tiny"))
    return row2


@st.composite
def toy_models(
    draw: st.DrawFn, *, min_vocab: int = 1, max_vocab: int = 4, depth: int = 3, relation: str | None = None
) -> ToyModel:
    """A toy model with rows for every prefix of length ``<= depth``."""
    vocab = draw(st.integers(min_vocab, max_vocab))
    rel = relation if relation is not None else draw(st.sampled_from(RELATIONS))
    d_rows: dict[Path, FloatArray] = {}
    t_rows: dict[Path, FloatArray] = {}
    for length in range(depth + 1):
        for prefix in product(range(vocab), repeat=length):
            q = draw(prob_rows(vocab, tiny=rel == "tiny"))
            d_rows[prefix] = q
            t_rows[prefix] = draw(_target_row(rel, q))
    return ToyModel(vocab, d_rows, t_rows, name=f"hypothesis-{rel}")
