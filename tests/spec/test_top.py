"""The per-row ranking primitive (``spec.draft.select_top``, ``TopDraft``) and DynaTree through it.

``select_top`` (``top_tokens`` row by row, padded) is checked against a full
sort of each row (a second computation); a draft that
ranks its rows itself must give DynaTree exactly the trees the row path gives,
without any row being fetched.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from spec.builders import DynaTreeBuilder
from spec.builders.base import Growing, top_tokens
from spec.draft import DraftModel, HashedDraft, ToyDraft, TopDraft, select_top, top_candidates
from tmc.multidraft import ROOT
from tmc.toy import Path

from tests.spec.conftest import models
from tests.spec.test_beam import RankingToy, random_rows


def by_full_sort(row: np.ndarray, k: int) -> list[int]:
    """The k best ids with q > 0 from one stable sort of the whole row (ties keep the lower id first)."""
    order = sorted(range(row.size), key=lambda t: (-row[t], t))
    return [t for t in order if row[t] > 0.0][:k]


def test_select_top_equals_a_full_sort_of_each_row_with_zeros_and_ties() -> None:
    rng = np.random.default_rng(0)
    for trial in range(400):
        n, vocab = int(rng.integers(1, 6)), int(rng.integers(1, 9))
        rows = random_rows(rng, n, vocab)
        k = int(rng.integers(1, vocab + 3))
        tokens, values = select_top(rows, k)
        assert tokens.shape == values.shape == (n, k) and tokens.dtype == np.int64, trial
        for i, row in enumerate(rows):
            want = top_tokens(row, k)
            assert want == by_full_sort(row, k), trial
            assert tokens[i].tolist() == want + [-1] * (k - len(want)), trial
            np.testing.assert_array_equal(values[i], np.concatenate([row[want], np.zeros(k - len(want))]))


def test_select_top_of_a_large_row_and_of_no_rows() -> None:
    rng = np.random.default_rng(1)
    rows = rng.dirichlet(np.full(4096, 0.05), size=3)
    rows[1, 100:110] = rows[1].max()  # a tie at the top
    tokens, values = select_top(rows, 5)
    for i in range(3):
        assert tokens[i].tolist() == top_tokens(rows[i], 5)
    assert tokens[1].tolist() == list(range(100, 105))
    empty = select_top(np.zeros((0, 7)), 3)
    assert empty[0].shape == empty[1].shape == (0, 3)


@pytest.mark.parametrize(("rows", "k", "message"), [(np.ones(3) / 3, 1, "2-D"), (np.ones((1, 3)) / 3, 0, "k must be >= 1")])
def test_select_top_refuses_bad_arguments(rows: np.ndarray, k: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        select_top(rows, k)


DYNATREES = [
    DynaTreeBuilder(),
    DynaTreeBuilder(base_depth=2.0, max_depth=4, b_min=1, b_mid=2, b_max=4, tau_high=0.6, tau_low=0.2, prune=0.0),
    DynaTreeBuilder(root_top1=False, b_min=2, b_mid=3, b_max=5, rho_stop=0.001, rho_deep=0.05, prune=0.01),
]


def test_dynatree_gives_the_same_trees_through_a_top_draft_and_fetches_no_row() -> None:
    drafts: list[DraftModel] = [ToyDraft(m) for m in models(4, range(4))]
    drafts += [HashedDraft(7, seed=s, concentration=c) for s in range(3) for c in (0.2, 1.0, 5.0)]
    sizes = set()
    for draft in drafts:
        for builder in DYNATREES:
            state = builder.initial_state()
            for budget in (1, 3, 8, 20):
                want = builder.build(draft, budget, state=state)
                top = RankingToy(draft)
                assert isinstance(top, TopDraft)
                got = builder.build(top, budget, state=state)
                assert (got.parents, got.tokens, got.draws) == (want.parents, want.tokens, want.draws)
                assert top.row_calls == 0 and top.top_calls >= 1
                assert dict(got.q_rows) == {}  # topk nodes only: no row needed, none recorded
                sizes.add(want.size)
                state = builder.next_state(state, want, min(1, want.size))  # the history moves on
    assert len(sizes) >= 5  # the cases are not all one shape


def test_growing_top_falls_back_to_rows_and_keeps_them() -> None:
    draft = HashedDraft(5, seed=1)
    grow = Growing(draft, 5)
    tokens, values = grow.top([], 2)
    assert tokens.shape == values.shape == (0, 2) and draft.calls == 0
    tokens, values = grow.top([ROOT], 2)
    assert grow.has_row(ROOT) and draft.calls == 1
    assert tokens[0].tolist() == top_tokens(grow.row(ROOT), 2)
    np.testing.assert_array_equal(values[0], grow.row(ROOT)[tokens[0]])


class _Liar:
    """A TopDraft whose answer is malformed in one chosen way."""

    vocab = 4

    def __init__(self, tok: object, val: object) -> None:
        self.tok, self.val = tok, val

    def rows(self, paths: Sequence[Path]) -> np.ndarray:
        return np.full((len(paths), 4), 0.25)

    def top_candidates(self, paths: Sequence[Path], k: int) -> tuple[object, object]:
        return self.tok, self.val


@pytest.mark.parametrize(
    ("tok", "val", "message"),
    [
        ([[0, 1, 2]], [[0.5, 0.3]], r"expected two \(1, 3\) arrays"),
        ([[0.0, 1.0, 2.0]], [[0.5, 0.3, 0.2]], "the tokens integers"),
        ([[0, 4, 2]], [[0.5, 0.3, 0.2]], r"outside \[0, 4\)"),
        ([[0, -1, 2]], [[0.5, 0.0, 0.2]], "padding"),
        ([[0, 1, -5]], [[0.5, 0.3, 0.0]], "padding"),  # an id below -1 is no padding
        ([[0, 1, -1]], [[0.5, 0.0, 0.0]], "not finite and > 0"),
        ([[0, 1, -1]], [[0.5, 0.3, 0.1]], "0 for padding"),
        ([[0, 1, 2]], [[0.5, np.nan, 0.2]], "not finite"),
        ([[0, 1, 2]], [[0.2, 0.3, 0.1]], "increase"),
        ([[0, 1, 0]], [[0.5, 0.3, 0.2]], "same id twice"),
        ([[0, 1, 2]], [[4.0, 3.0, 2.0]], r"summing to 9.0 in row 0: not probabilities"),  # had built a tree
        ([[0, 1, 2]], [[0.9, 0.9, 0.1]], "summing to 1.9"),
        # a row of padding only: at the root DynaTree later blamed "token -1", at an inner node it built no children
        ([[-1, -1, -1]], [[0.0, 0.0, 0.0]], "no token at all in row 0"),
    ],
)
def test_top_candidates_refuses_a_malformed_answer(tok: object, val: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        top_candidates(_Liar(tok, val), [()], 3)  # type: ignore[arg-type]


def test_a_width_above_the_vocabulary_asks_for_the_vocabulary() -> None:
    """DynaTree's ``b_max`` (and any ``k`` of ``Growing.top``) had no upper limit and sized two ``(rows, k)``
    arrays: ``b_max = 10**9`` on a vocabulary of 8 asked for 7.45 GiB a row.  Now ``k`` is cut to ``V``; the
    tree is the one ``b_max = V`` builds, and a ``10**7`` (160 MB a row before) allocates no wide array."""
    import tracemalloc

    draft = HashedDraft(8, seed=1)
    grow = Growing(draft, 8)
    tokens, values = grow.top([ROOT], 10**7)
    assert tokens.shape == values.shape == (1, 8)
    narrow = DynaTreeBuilder(b_max=8).build(draft, 6, rng=3)
    tracemalloc.start()
    wide = DynaTreeBuilder(b_max=10**7).build(draft, 6, rng=3)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 8 * 2**20, peak
    assert (wide.parents, wide.tokens) == (narrow.parents, narrow.tokens)


def test_top_candidates_of_no_paths_and_of_other_drafts() -> None:
    liar = _Liar([[0]], [[1.0]])
    tokens, values = top_candidates(liar, [], 2)  # type: ignore[arg-type]
    assert tokens.shape == values.shape == (0, 2)
    assert top_candidates(HashedDraft(5), [()], 2) is None  # rows only: the caller ranks them
    with pytest.raises(ValueError, match="k must be >= 1"):
        top_candidates(HashedDraft(5), [()], 0)
    ok = top_candidates(_Liar([[2, 0, -1]], [[0.5, 0.5, 0.0]]), [()], 3)  # type: ignore[arg-type]
    assert ok is not None and ok[0].tolist() == [[2, 0, -1]]
