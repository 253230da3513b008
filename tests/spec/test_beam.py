"""The beam primitive (``spec.draft.select_beam``, ``BeamDraft``) and WETAP through it.

``select_beam`` is checked against a full sort of every candidate (a second,
independent computation); a draft that selects its beam itself must give
WETAP exactly the trees the row path gives, without any row being fetched.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from spec.builders import WetapBuilder
from spec.builders.base import Growing
from spec.draft import BeamDraft, DraftModel, HashedDraft, ToyDraft, beam_candidates, draft_rows, select_beam, select_top
from tmc.multidraft import ROOT
from tmc.toy import Path

from tests.spec.conftest import models


def by_full_sort(rows: np.ndarray, weights: np.ndarray, k: int) -> list[int]:
    """Positions of every candidate with f > 0 and f >= the k-th largest f, from one sort of all of them."""
    f = [float(w) * float(x) for w, row in zip(weights, rows) for x in row]
    kth = sorted(f, reverse=True)[k - 1] if len(f) >= k else -np.inf
    return [i for i, v in enumerate(f) if v > 0.0 and v >= kth]


def random_rows(rng: np.random.Generator, n: int, vocab: int) -> np.ndarray:
    """Rows with exact zeros and exact ties (values from a small set)."""
    raw = rng.choice([0.0, 1.0, 2.0, 2.0, 3.0, 5.0], size=(n, vocab))
    raw[:, 0] += 1.0  # no all-zero row
    return raw / raw.sum(axis=1, keepdims=True)


def test_select_beam_equals_a_full_sort_with_zeros_and_ties() -> None:
    rng = np.random.default_rng(0)
    for trial in range(300):
        n, vocab = int(rng.integers(1, 6)), int(rng.integers(1, 7))
        rows = random_rows(rng, n, vocab)
        weights = rng.choice([0.0, 0.25, 0.5, 1.0], size=n)
        k = int(rng.integers(1, n * vocab + 3))
        pos, val = select_beam(rows, weights, k)
        assert pos.dtype == np.int64 and pos.tolist() == by_full_sort(rows, weights, k), trial
        np.testing.assert_array_equal(val, (weights[:, None] * rows).ravel()[pos])
        positive = int(((weights[:, None] * rows) > 0).sum())
        assert len(pos) >= min(k, positive)  # the k best are always there (ties may add more)


def test_select_beam_equals_a_full_sort_on_rows_large_enough_to_prefilter() -> None:
    """Rows of up to 40 x 600 (``select_beam`` then partitions only the values at or above the ``k``-th largest
    of about ``4k`` block maxima): exact ties and zeros, and peaked rows like a draft's at T = 1, against one
    sort of every candidate."""
    rng = np.random.default_rng(1)
    for trial in range(80):
        n, vocab = int(rng.integers(1, 41)), int(rng.integers(50, 601))
        if trial % 2:
            rows = random_rows(rng, n, vocab)
        else:
            logits = rng.standard_normal((n, vocab)) * rng.choice([0.5, 3.0, 8.0])
            rows = np.exp(logits - logits.max(axis=1, keepdims=True))
            rows /= rows.sum(axis=1, keepdims=True)
        weights = rng.choice([0.0, 0.25, 0.5, 1.0], size=n) if trial % 3 == 0 else rng.random(n)
        k = int(rng.integers(1, min(n * vocab, 300)))
        pos, val = select_beam(rows, weights, k)
        f = (weights[:, None] * rows).ravel()
        kth = np.sort(f)[::-1][k - 1]
        assert pos.tolist() == np.flatnonzero((f > 0.0) & (f >= kth)).tolist(), trial
        np.testing.assert_array_equal(val, f[pos])


class RankingToy:
    """A toy draft that also selects beams and ranks rows itself (from its own rows), counting each kind of call:
    a :class:`BeamDraft` and a :class:`spec.draft.TopDraft` (``tests/spec/test_top.py``)."""

    def __init__(self, draft: DraftModel) -> None:
        self.inner, self.row_calls, self.beam_calls, self.top_calls = draft, 0, 0, 0

    @property
    def vocab(self) -> int:
        return self.inner.vocab

    def rows(self, paths: Sequence[Path]) -> np.ndarray:
        self.row_calls += 1
        return self.inner.rows(paths)

    def beam_candidates(self, paths: Sequence[Path], weights: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        self.beam_calls += 1
        return select_beam(draft_rows(self.inner, paths), weights, k)

    def top_candidates(self, paths: Sequence[Path], k: int) -> tuple[np.ndarray, np.ndarray]:
        self.top_calls += 1
        return select_top(draft_rows(self.inner, paths), k)


def test_wetap_gives_the_same_trees_through_a_beam_draft_and_fetches_no_row() -> None:
    drafts: list[DraftModel] = [ToyDraft(m) for m in models(4, range(4))]
    drafts += [HashedDraft(7, seed=s, concentration=c) for s in range(3) for c in (0.2, 1.0)]
    for draft in drafts:
        for params in ({"length": 3, "w_min": 2, "w_max": 4}, {"length": 5, "w_min": 1, "w_max": 9}):
            builder = WetapBuilder(**params)  # type: ignore[arg-type]
            for budget in (1, 4, 12):
                want = builder.build(draft, budget)
                beam = RankingToy(draft)
                assert isinstance(beam, BeamDraft)
                got = builder.build(beam, budget)
                assert (got.parents, got.tokens, got.draws) == (want.parents, want.tokens, want.draws)
                assert beam.row_calls == 0 and beam.beam_calls >= 1
                assert dict(got.q_rows) == {}  # topk nodes only: no row needed, none recorded
                assert set(want.q_rows) == {ROOT} | set(want.parents)  # the row path keeps its rows


def test_growing_beam_falls_back_to_rows_and_keeps_them() -> None:
    draft = HashedDraft(5, seed=1)
    grow = Growing(draft, 5)
    empty = grow.beam([], [], 2)
    assert empty[0].size == 0 and empty[1].size == 0 and draft.calls == 0
    pos, val = grow.beam([ROOT], [1.0], 2)
    assert grow.has_row(ROOT) and draft.calls == 1
    assert pos.tolist() == sorted(np.argsort(-grow.row(ROOT))[:2].tolist())
    np.testing.assert_array_equal(val, grow.row(ROOT)[pos])


class _Liar:
    """A BeamDraft whose answer is malformed in one chosen way."""

    vocab = 3

    def __init__(self, pos: object, val: object) -> None:
        self.pos, self.val = pos, val

    def rows(self, paths: Sequence[Path]) -> np.ndarray:
        return np.full((len(paths), 3), 1 / 3)

    def beam_candidates(self, paths: Sequence[Path], weights: np.ndarray, k: int) -> tuple[object, object]:
        return self.pos, self.val


@pytest.mark.parametrize(
    ("pos", "val", "message"),
    [
        ([0, 1], [0.5], "1-D arrays of one length"),
        ([0.5], [0.5], "integers"),
        ([3], [0.5], r"outside \[0, 3\)"),
        ([2, 1], [0.5, 0.5], "not ascending"),
        ([1, 1], [0.5, 0.5], "not ascending"),
        ([1], [0.0], "finite and > 0"),
        ([1], [float("nan")], "finite and > 0"),
        ([1], [5.0], "summing to 5.0 for path 0 of weight 1.0"),  # WETAP had built a tree from it
        ([0, 2], [0.6, 0.6], "summing to 1.2"),
    ],
)
def test_a_malformed_beam_answer_is_refused(pos: object, val: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        beam_candidates(_Liar(pos, val), [()], [1.0], 1)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("weights", "k", "message"),
    [
        ([1.0, 1.0], 1, "one number per path"),
        ([float("nan")], 1, "finite and >= 0"),
        ([-0.5], 1, "finite and >= 0"),
        ([1.0], 0, "k must be >= 1"),
        ([True], 1, "weights must hold real numbers, got dtype bool"),  # had been read as 1.0
        (["1.0"], 1, "weights must hold real numbers"),
    ],
)
def test_bad_beam_arguments_are_refused(weights: list[float], k: int, message: str) -> None:
    for draft in (HashedDraft(3), _Liar([0], [1.0])):
        with pytest.raises(ValueError, match=message):
            beam_candidates(draft, [()], weights, k)  # type: ignore[arg-type]


def test_an_empty_beam_asks_nothing() -> None:
    liar = _Liar([5], [1.0])  # would be refused if it were asked
    pos, val = beam_candidates(liar, [], [], 3)  # type: ignore[arg-type]
    assert pos.size == 0 and val.size == 0


@pytest.mark.parametrize(
    ("rows", "weights", "k", "message"),
    [
        (np.full((2, 3), 1 / 3), [1.0], 1, "one number per path"),
        (np.full(3, 1 / 3), [1.0], 1, "2-D"),
        (np.full((1, 3), 1 / 3), [np.inf], 1, "finite and >= 0"),
        (np.full((1, 3), 1 / 3), [1.0], 0, "k must be >= 1"),
        (np.full((1, 3), 1 / 3), [1.0], 1.5, "k"),
    ],
)
def test_select_beam_refuses_bad_arguments(rows: np.ndarray, weights: list[float], k: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        select_beam(rows, np.asarray(weights), k)  # type: ignore[arg-type]
