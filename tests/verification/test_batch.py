"""Batch samplers equal the scalar samplers step for step on the same noise (exactly).

Exact tests (STYLE rule 7): every batch output is compared with the scalar
``*_sample_from_uniforms`` on the same row of uniforms, as integers, for
random toy models (hypothesis) and for adversarial noise — exact zeros,
``1 − 2**-53``, and values one ulp below, at and above every acceptance
ratio, stop probability and CDF step.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from itertools import islice

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import verification.batch as batch
from tmc.kseq import kseq_node_rule, kseq_sample_from_uniforms
from tmc.ordered_traversal import ratio_ordered_children
from tmc.traversal import recorded_children, traversal_sample_from_uniforms, traversal_tests
from tmc.chain import (
    asps_kernel,
    asps_sample_from_uniforms,
    block_forward,
    block_sample_from_uniforms,
    sps_sample_from_uniforms,
)
from tmc.drafts import sample_tree_draft
from tmc.enumeration import enumerate_draft_trees, tree_p_rows
from tmc.multidraft import Draw, DraftTree, ProposalFn, check_tree_p_rows, multidraft_sample_from_uniforms, proposal_laws
from tmc.noise import categorical
from tmc.residual import residual
from tmc.toy import Path, ToyModel, paper_toy_model
from tmc.validate import check_chain
from verification.batch import (
    ChainBatch,
    asps_batch,
    block_batch,
    categorical_batch,
    check_uniform_batch,
    draft_chain_batch,
    kseq_batch,
    multidraft_batch,
    traversal_batch,
    speculative_step_batch,
    sps_batch,
)
from verification.bench_batch import bench, render, run_batch_bench
from verification.examples import iid_proposals
from verification.strategies import ALL_RELATIONS, RELATIONS, check_relation, toy_models

TOP = 1.0 - 2.0**-53  # the largest float64 below 1
CHAIN = {
    "sps": (sps_batch, sps_sample_from_uniforms),
    "asps": (asps_batch, asps_sample_from_uniforms),
    "block": (block_batch, block_sample_from_uniforms),
}


# ------------------------------------------------------ adversarial noise


def _around(values: Sequence[float]) -> list[float]:
    """Each value and its float64 neighbours, kept inside [0, 1), plus 0 and TOP."""
    out = {0.0, TOP}
    for v in values:
        for w in (np.nextafter(v, -1.0), v, np.nextafter(v, 2.0)):
            if 0.0 <= w < 1.0:
                out.add(float(w))
    return sorted(out)


def _cdf_points(rows: Sequence[np.ndarray]) -> list[float]:
    """Uniforms that land ``u * total`` on or next to each CDF step of each row."""
    pts: list[float] = []
    for row in rows:
        cdf = np.cumsum(row)
        if cdf[-1] > 0:
            pts.extend(float(c / cdf[-1]) for c in cdf)
    return _around(pts)


def _noise(columns: Sequence[Sequence[float]], rng: np.random.Generator, trials: int = 96) -> np.ndarray:
    """``(trials + extra, width)`` noise: random rows, random picks among each column's
    candidates, and one row per (column, candidate) with the rest random."""
    width = len(columns)
    rand = rng.random((trials, width))
    picks = np.column_stack([rng.choice(np.asarray(c), size=trials) for c in columns]) if width else rand
    sweeps = []
    for j, cands in enumerate(columns):
        block = rng.random((len(cands), width))
        block[:, j] = cands
        sweeps.append(block)
    return np.vstack([rand, picks, *sweeps]) if sweeps else rand


def _chain_noise(method: str, ref: Sequence[int], q: np.ndarray, p: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    toks, qq, pp = check_chain(ref, q, p)
    n = len(ref)
    if method == "asps":
        return _noise([_cdf_points([asps_kernel(ref, q, p).reshape(-1)])], rng)
    if method == "sps":
        tests = [_around([pp[i, toks[i]] / qq[i, toks[i]]]) for i in range(n)]
        finals = [residual(pp[i], qq[i], int(toks[i])) for i in range(n)] + [pp[n]]
    else:
        residuals, log_stop, _ = block_forward(toks, qq, pp)
        tests = [_around([math.exp(log_stop[i])]) for i in range(1, n + 1)]
        finals = list(residuals) + [pp[n]]
    return _noise(tests + [_cdf_points(finals)], rng)


def _assert_chain_equal(method: str, ref: Sequence[int], q: np.ndarray, p: np.ndarray, u: np.ndarray) -> None:
    fast, slow = CHAIN[method]
    got = fast(ref, q, p, u)
    assert got.lengths.dtype == np.int64 and got.last.dtype == np.int64
    assert got.tokens(ref) == [slow(ref, q, p, row) for row in u]


@st.composite
def draft_chains(draw: st.DrawFn, model: ToyModel, max_n: int) -> tuple[int, ...]:
    """A chain of draft tokens each with positive draft probability."""
    ref: tuple[int, ...] = ()
    for _ in range(draw(st.integers(0, max_n))):
        support = np.flatnonzero(model.q(ref) > 0)
        ref += (int(draw(st.sampled_from(support.tolist()))),)
    return ref


# ----------------------------------------------------- chain equality


@settings(max_examples=60)
@given(model=toy_models(max_vocab=4, depth=3), data=st.data())
def test_chain_batch_equals_scalar_step_for_step(model: ToyModel, data: st.DataObject) -> None:
    ref = data.draw(draft_chains(model, 3))
    q, p = model.chain_rows(ref)
    rng = np.random.default_rng(len(ref))
    for method in CHAIN:
        _assert_chain_equal(method, ref, q, p, _chain_noise(method, ref, q, p, rng))


def _edge_cases() -> list[tuple[str, list[int], np.ndarray, np.ndarray]]:
    third = np.full(3, 1 / 3)
    hot = np.array([0.0, 0.0, 1.0])
    q2 = np.array([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
    return [
        ("p(x)=0 drafted", [0, 2], q2, np.array([[0.0, 0.5, 0.5], [0.1, 0.1, 0.8], [0.25, 0.25, 0.5]])),
        ("all accepted", [1, 2], q2, np.array([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5], [0.0, 0.0, 1.0]])),
        ("all rejected", [0, 0], np.array([[1.0, 0.0, 0.0]] * 2), np.array([[0.0, 1.0, 0.0]] * 3)),
        ("p == q", [2, 0], np.array([third, [0.2, 0.3, 0.5]]), np.array([third, [0.2, 0.3, 0.5], third])),
        ("one-hot p", [0, 1], np.array([third, third]), np.array([hot, hot, hot])),
        ("V = 1", [0, 0, 0], np.ones((3, 1)), np.ones((4, 1))),
        ("n = 0", [], np.zeros((0, 3)), np.array([[0.2, 0.0, 0.8]])),
        ("tiny", [1], np.array([[1 - 1e-12, 1e-12]]), np.array([[1e-12, 1 - 1e-12], [0.5, 0.5]])),
        ("near tie", [0], np.array([[0.5 + 1e-12, 0.5 - 1e-12]]), np.array([[0.5, 0.5], [0.3, 0.7]])),
    ]


@pytest.mark.parametrize("method", list(CHAIN))
@pytest.mark.parametrize(("name", "ref", "q", "p"), _edge_cases(), ids=[c[0] for c in _edge_cases()])
def test_chain_batch_equals_scalar_on_edge_cases(method: str, name: str, ref: list[int], q: np.ndarray, p: np.ndarray) -> None:
    rng = np.random.default_rng(7)
    _assert_chain_equal(method, ref, q, p, _chain_noise(method, ref, q, p, rng))


def _tiny_row(weights: list[int]) -> np.ndarray:
    row = np.asarray(weights, dtype=np.float64)
    row[row == 0] = 1e-12 * row.sum()
    out: np.ndarray = row / row.sum()
    return out


def test_block_near_tie_never_draws_from_an_empty_residual() -> None:
    """Regression (found by the bit-equality property): with p = q up to 2e-28 rounding
    leaves (a_i p_i - q_i)_+ all zero while a stop draw u = 1 - 2^-53 still reaches
    tau = 0; both samplers must then draw from the one residual rule, not from a zero row."""
    q = np.array([_tiny_row([0, 0, 3])])
    p = np.array([_tiny_row([0, 0, 1]), _tiny_row([1, 2, 0])])
    u = np.array([[TOP, 0.5]])
    want = [block_sample_from_uniforms([0], q, p, row) for row in u]
    assert block_batch([0], q, p, u).tokens([0]) == want
    assert len(want[0]) == 1 and 0 <= want[0][0] < 3


def test_sps_batch_rejects_zero_target_token_with_u_zero() -> None:
    q = np.array([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
    p = np.array([[0.0, 0.5, 0.5], [0.1, 0.1, 0.8], [0.25, 0.25, 0.5]])
    out = sps_batch([0, 2], q, p, np.zeros((4, 3)))
    assert out.lengths.tolist() == [1] * 4 and out.last.tolist() == [2] * 4


def test_sps_batch_accept_boundary_is_strict() -> None:
    # p/q = 0.4 at ref[0]: u = 0.4 rejects, the float just below accepts.
    q = np.array([[0.5, 0.5]])
    p = np.array([[0.2, 0.8], [1.0, 0.0]])
    u = np.array([[np.nextafter(0.4, 0.0), 0.0], [0.4, 0.0]])
    assert sps_batch([0], q, p, u).tokens([0]) == [[0, 0], [1]]


def test_chain_batch_with_no_trials() -> None:
    q, p = np.array([[0.5, 0.5]]), np.array([[0.5, 0.5], [0.5, 0.5]])
    for method, (fast, _) in CHAIN.items():
        out = fast([0], q, p, np.zeros((0, 1 if method == "asps" else 2)))
        assert out.lengths.shape == (0,) and out.last.shape == (0,)


# ------------------------------------------------------ tree equality

TREE_SHAPES = [(1,), (2,), (3,), (2, 1), (2, 2), (1, 1, 1)]


def _tree_noise(
    tree: DraftTree, p_rows: np.ndarray, rng: np.random.Generator, proposals: ProposalFn = proposal_laws
) -> np.ndarray:
    plan = batch._tree_plan(tree, check_tree_p_rows(tree, p_rows), batch._residual_walk(proposals))
    tests: list[list[float]] = [[] for _ in range(tree.size)]
    for kids, ratios in zip(plan.kids, plan.ratios):
        for kid, ratio in zip(kids, ratios):
            if np.isfinite(ratio):
                tests[int(kid)] = _around([float(ratio)])
    finals = list(np.diff(plan.final.cdf, prepend=0.0, axis=1))
    return _noise(tests + [_cdf_points(finals)], rng, trials=48)


def _assert_tree_equal(
    tree: DraftTree, p_rows: np.ndarray, u: np.ndarray, proposals: ProposalFn = proposal_laws
) -> None:
    got = multidraft_batch(tree, p_rows, u, proposals)
    assert got.tokens(tree) == [multidraft_sample_from_uniforms(tree, p_rows, row, proposals) for row in u]


@settings(max_examples=40)
@given(
    model=toy_models(max_vocab=3, depth=3),
    widths=st.sampled_from(TREE_SHAPES),
    draw=st.sampled_from(list(Draw)),
    start=st.integers(0, 50),
)
def test_tree_batch_equals_scalar_step_for_step(model: ToyModel, widths: tuple[int, ...], draw: Draw, start: int) -> None:
    rng = np.random.default_rng(start)
    trees = islice(enumerate_draft_trees(model, widths, draw), start % 7, None, 7)
    for _, tree in islice(trees, 3):
        p_rows = tree_p_rows(model, tree)
        _assert_tree_equal(tree, p_rows, _tree_noise(tree, p_rows, rng))


@pytest.mark.parametrize("draw", list(Draw))
def test_tree_batch_equals_scalar_on_every_paper_tree(draw: Draw) -> None:
    model = paper_toy_model()
    rng = np.random.default_rng(3)
    for _, tree in enumerate_draft_trees(model, (2, 1), draw):
        p_rows = tree_p_rows(model, tree)
        _assert_tree_equal(tree, p_rows, _tree_noise(tree, p_rows, rng))


@settings(max_examples=30)
@given(
    model=toy_models(max_vocab=3, depth=3),
    widths=st.sampled_from(TREE_SHAPES),
    draw=st.sampled_from(list(Draw)),
    start=st.integers(0, 50),
)
def test_tree_batch_with_the_iid_rule_equals_scalar(model: ToyModel, widths: tuple[int, ...], draw: Draw, start: int) -> None:
    # The audit's i.i.d.-rule examples differ from multidraft only in `proposals`.
    rng = np.random.default_rng(start)
    trees = islice(enumerate_draft_trees(model, widths, draw), start % 5, None, 5)
    for _, tree in islice(trees, 2):
        p_rows = tree_p_rows(model, tree)
        _assert_tree_equal(tree, p_rows, _tree_noise(tree, p_rows, rng, iid_proposals), iid_proposals)


def _edge_trees() -> list[tuple[DraftTree, np.ndarray]]:
    """Trees where accept tests and final draws sit on their boundaries."""
    third = np.full(3, 1 / 3)
    hot = np.array([0.0, 1.0, 0.0])
    return [
        # p(x) = 0 for both drafted children, greedy (one-hot) target
        (DraftTree.build([-1, -1], [0, 2], "swor", {-1: third}, 3), np.array([hot, third, third])),
        # p == q everywhere: every child accepted when drawn i.i.d.
        (DraftTree.build([-1, -1, 0], [0, 0, 1], "iid", {-1: third, 0: third}, 3), np.array([third] * 4)),
        # top-k children of a one-hot target: the right one is accepted for sure
        (DraftTree.build([-1, -1, -1], [0, 1, 2], "topk", {}, 3), np.array([hot] * 4)),
        # no nodes at all: the final token is drawn from p at the root
        (DraftTree.build([], [], "iid", {}, 3), np.array([[0.2, 0.0, 0.8]])),
        # V = 1
        (DraftTree.build([-1, 0], [0, 0], "iid", {-1: [1.0], 0: [1.0]}, 1), np.ones((3, 1))),
    ]


def _with_extremes(u: np.ndarray) -> np.ndarray:
    """``u`` plus one all-zero row and one all-TOP row."""
    return np.vstack([u, np.zeros((1, u.shape[1])), np.full((1, u.shape[1]), TOP)])


def test_tree_batch_edge_cases() -> None:
    rng = np.random.default_rng(1)
    for tree, p_rows in _edge_trees():
        _assert_tree_equal(tree, p_rows, _with_extremes(_tree_noise(tree, p_rows, rng)))


def test_tree_batch_rejects_zero_target_child_with_u_zero() -> None:
    third = np.full(3, 1 / 3)
    tree = DraftTree.build([-1], [0], "iid", {-1: third}, 3)
    out = multidraft_batch(tree, np.array([[0.0, 0.5, 0.5], third]), np.zeros((5, 2)))
    assert out.nodes.tolist() == [-1] * 5 and out.last.tolist() == [1] * 5


# ----------------------------------------------- the inverse-CDF primitive


WEIGHT_ROWS = [
    np.array([0.5, 0.5, 0.0, 0.0]),
    np.array([0.0, 0.0, 0.0, 1.0]),
    np.array([1e-300, 0.0, 3e-310, 0.0]),  # subnormal total: u * total rounds up to total
    np.array([5e-324, 0.0, 0.0, 0.0]),
    np.array([0.1, 0.2, 0.3, 0.4]),
    np.array([1 / 3, 1 / 3, 1 / 3, 0.0]),
]


@pytest.mark.parametrize("path", ["few-rows", "count", "sort"])
def test_cdf_table_draw_equals_categorical(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if path != "few-rows":
        monkeypatch.setattr(batch, "FEW_ROWS", 0)
    if path == "sort":
        monkeypatch.setattr(batch, "COMPARE_MAX_VOCAB", 0)
    rng = np.random.default_rng(0)
    u = np.array(_cdf_points(WEIGHT_ROWS) + [2.0**-1074, 0.5, TOP] + rng.random(50).tolist())
    rows = np.repeat(np.arange(len(WEIGHT_ROWS)), u.size)
    uu = np.tile(u, len(WEIGHT_ROWS))
    got = batch._CdfTable.from_rows(WEIGHT_ROWS).draw(rows, uu)
    want = [categorical(WEIGHT_ROWS[r], float(x)) for r, x in zip(rows, uu)]
    assert got.tolist() == want
    assert (got == 0).any() and (got == 2).any()  # the subnormal row hit its clip at least once


def test_categorical_batch_equals_categorical() -> None:
    w = np.array([0.2, 0.0, 0.5, 0.3])
    u = _cdf_points([w]) + np.random.default_rng(2).random(40).tolist()
    assert categorical_batch(w, u).tolist() == [categorical(w, x) for x in u]
    assert categorical_batch(2 * w, u).tolist() == [categorical(2 * w, x) for x in u]  # not renormalised
    for bad in ([0.5, -0.1], [0.0, 0.0], [np.nan, 1.0], [[0.5, 0.5]]):
        with pytest.raises(ValueError, match="weights"):
            categorical_batch(bad, [0.1])


# -------------------------------------------------- draft + verify on toys


def _scalar_draft(model: ToyModel, noise_row: np.ndarray, prefix: Path = ()) -> Path:
    ref: Path = ()
    for x in noise_row:
        ref += (categorical(model.q(tuple(prefix) + ref), float(x)),)
    return ref


@settings(max_examples=30)
@given(model=toy_models(max_vocab=4, depth=3), n=st.integers(0, 3), method=st.sampled_from(list(CHAIN)))
def test_speculative_step_batch_equals_scalar_draft_then_verify(model: ToyModel, n: int, method: str) -> None:
    rng = np.random.default_rng(n)
    trials = 200
    points = _cdf_points([model.q(())])
    nd = rng.random((trials, n))
    nd[: trials // 2] = rng.choice(np.asarray(points), size=(trials // 2, n))
    nv = rng.random((trials, batch.chain_noise_width(method, n)))
    nv[::3] = rng.choice(np.asarray([0.0, TOP, 0.5]), size=nv[::3].shape)
    got = speculative_step_batch(model, n, method, nd, nv)
    assert got.drafts.tolist() == draft_chain_batch(model, n, nd).tolist()
    scalar = CHAIN[method][1]
    want = []
    for t in range(trials):
        ref = _scalar_draft(model, nd[t])
        assert tuple(got.drafts[t]) == ref
        want.append(tuple(scalar(ref, *model.chain_rows(ref), nv[t])))
    assert got.outputs() == want
    assert got.tokens.shape == (trials, n + 1)
    assert all((row[k:] == -1).all() for row, k in zip(got.tokens, got.lengths))


def test_draft_chain_batch_large_vocab_takes_the_sorting_paths() -> None:
    # V = 1500 > COMPARE_MAX_VOCAB and ~1000 distinct prefixes x V codes > 2**20:
    # exercises per-row searchsorted after sorting and np.unique regrouping.
    rng = np.random.default_rng(4)
    vocab = 1500
    model = ToyModel(vocab, {}, {}, rng.dirichlet(np.ones(vocab)), rng.dirichlet(np.ones(vocab)))
    noise = rng.random((1000, 3))
    noise[:5] = [[0.0, TOP, 0.0]] * 5
    got = draft_chain_batch(model, 3, noise, prefix=(7,))
    assert [tuple(r) for r in got.tolist()] == [_scalar_draft(model, row, (7,)) for row in noise]


# ------------------------------------------------------- result helpers


def test_chain_result_helpers() -> None:
    out = ChainBatch(np.array([1, 3, 2], dtype=np.int64), np.array([2, 0, 1], dtype=np.int64))
    assert out.cells(3).tolist() == [2, 6, 4]
    assert out.tokens([5, 6]) == [[2], [5, 6, 0], [5, 1]]
    assert out.counts(2, 3).tolist() == [[0, 0, 1], [0, 1, 0], [1, 0, 0]]


def test_tree_result_helpers_match_kernel_layout() -> None:
    third = np.full(3, 1 / 3)
    tree = DraftTree.build([-1, -1, 0], [0, 1, 2], "swor", {-1: third, 0: third}, 3)
    p_rows = np.array([[0.1, 0.1, 0.8], third, third, third])
    out = multidraft_batch(tree, p_rows, np.array([[0.0, 0.0, 0.0, 0.5], [TOP, TOP, TOP, 0.0]]))
    assert out.tokens(tree) == [[0, 2, 1], [2]]
    assert out.nodes.tolist() == [2, -1]
    assert out.cells(3).tolist() == [3 * 3 + 1, 0 * 3 + 2]
    assert out.counts(tree).sum() == 2 and out.counts(tree)[3, 1] == 1


# ---------------------------------------------------------- bad inputs

Q = np.array([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
P = np.array([[0.0, 0.5, 0.5], [0.1, 0.1, 0.8], [0.25, 0.25, 0.5]])


@pytest.mark.parametrize(
    ("u", "match"),
    [
        (np.zeros(3), r"u must have shape \(trials, 3\)"),
        (np.zeros((4, 2)), r"u must have shape \(trials, 3\)"),
        (np.array([[0.0, 0.0, 1.0]]), r"u\[0, 2\] = 1\.0 is not a uniform"),
        (np.array([[0.1, 0.1, 0.1], [0.0, -0.0, -1e-300]]), r"u\[1, 2\]"),
        (np.array([[0.1, np.nan, 0.1]]), r"u\[0, 1\]"),
        (np.array([[0.1, 0.2, np.inf]]), r"u\[0, 2\]"),
        # what the scalar samplers refuse: text and booleans were read as numbers, 0.5j dropped
        (np.array([["0.1", "0.2", "0.3"]]), "u must hold real numbers"),
        (np.array([[True, False, True]]), "u must hold real numbers"),
        (np.array([[0.1, 0.2 + 0.5j, 0.3]]), "u has complex entries"),
        (np.array([[0.1, object(), 0.3]], dtype=object), "u has a non-numeric entry"),
    ],
)
@pytest.mark.parametrize("fn", [sps_batch, block_batch])
def test_bad_uniforms_raise(fn: Callable[..., ChainBatch], u: np.ndarray, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        fn([1, 2], Q, P, u)


@pytest.mark.parametrize(
    ("ref", "q", "p", "match"),
    [
        ([0, 3], Q, P, r"ref\[1\] = 3 is outside"),
        ([2, 0], Q, P, r"q_rows\[0, 2\] = 0"),
        ([0, 0], Q * 1.1, P, r"q_rows row 0 sums"),
        ([0, 0], Q, np.where(P == 0, np.nan, P), r"p_rows row 0 contains NaN"),
        ([0, 0], Q, -P, r"p_rows row 0 has a negative"),
        ([0, 0], Q, P[:2], r"p_rows has shape"),
    ],
)
@pytest.mark.parametrize("method", list(CHAIN))
def test_bad_chain_inputs_raise(method: str, ref: list[int], q: np.ndarray, p: np.ndarray, match: str) -> None:
    width = batch.chain_noise_width(method, 2)
    with pytest.raises(ValueError, match=match):
        CHAIN[method][0](ref, q, p, np.zeros((2, width)))


def test_bad_tree_inputs_raise() -> None:
    third = np.full(3, 1 / 3)
    tree = DraftTree.build([-1], [0], "iid", {-1: third}, 3)
    with pytest.raises(ValueError, match="p_rows has shape"):
        multidraft_batch(tree, np.array([third]), np.zeros((1, 2)))
    with pytest.raises(ValueError, match=r"u must have shape \(trials, 2\)"):
        multidraft_batch(tree, np.array([third, third]), np.zeros((1, 3)))
    with pytest.raises(ValueError, match=r"u\[0, 0\]"):
        multidraft_batch(tree, np.array([third, third]), np.ones((1, 2)))


def test_bad_step_inputs_raise() -> None:
    model = paper_toy_model()
    with pytest.raises(ValueError, match="method must be one of"):
        speculative_step_batch(model, 2, "greedy", np.zeros((3, 2)), np.zeros((3, 3)))
    with pytest.raises(ValueError, match="noise_verify has 4 trials"):
        speculative_step_batch(model, 2, "sps", np.zeros((3, 2)), np.zeros((4, 3)))
    with pytest.raises(ValueError, match=r"noise_verify must have shape \(trials, 1\)"):
        speculative_step_batch(model, 2, "asps", np.zeros((3, 2)), np.zeros((3, 3)))
    with pytest.raises(ValueError, match=r"noise must have shape \(trials, 2\)"):
        draft_chain_batch(model, 2, np.zeros((3, 1)))
    with pytest.raises(ValueError, match="n must be >= 0"):
        draft_chain_batch(model, -1, np.zeros((3, 0)))
    with pytest.raises(ValueError, match="n must be an integer, got 1.5"):
        draft_chain_batch(model, 1.5, np.zeros((3, 1)))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="n must be an integer"):
        speculative_step_batch(model, "2", "sps", np.zeros((3, 2)), np.zeros((3, 3)))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"prefix\[0\] must be an integer"):
        draft_chain_batch(model, 1, np.zeros((3, 1)), prefix=(0.5,))  # type: ignore[arg-type]
    assert speculative_step_batch(model, 2.0, "sps", np.zeros((3, 2)), np.zeros((3, 3))).drafts.shape == (3, 2)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="draft_default row 0 sums"):  # ToyModel validates its rows
        ToyModel(2, {}, {}, np.array([0.7, 0.7]), np.array([0.5, 0.5]))


def test_relations_are_validated() -> None:
    assert set(RELATIONS) <= set(ALL_RELATIONS) and check_relation("near_tie") == "near_tie"
    for bad in ("nearly", None, 3):
        with pytest.raises(ValueError, match="relation must be one of independent"):
            check_relation(bad)


def test_check_uniform_batch_accepts_float32_and_lists() -> None:
    out = check_uniform_batch("u", [[0.0, np.float32(0.5)]], 2)
    assert out.dtype == np.float64 and out.shape == (1, 2)


# ------------------------------------------------------------ benchmark


def test_run_batch_bench_reports_every_verifier() -> None:
    report = run_batch_bench(trials=200, scalar_steps=5, vocabs=(3,), lengths=(1,), tree_widths=(2, 1), repeat=1)
    assert {"hardware", "trials", "scalar_steps", "goal_steps_per_s", "results"} <= set(report)
    names = {r["verifier"] for r in report["results"]}
    assert names == {"sps", "asps", "block", "draft+sps", "multidraft-iid", "multidraft-swor", "multidraft-topk"}
    for row in report["results"]:
        assert {"vocab", "shape", "trials", "batch_steps_per_s", "scalar_steps_per_s", "speedup", "meets_goal"} <= set(row)
    assert "multidraft-swor" in render(report)


def test_bench_tree_records_its_draw_kind() -> None:
    # The benchmark draws its trees with tmc.drafts.sample_tree_draft.
    model = ToyModel.random(4, 2, np.random.default_rng(0), zero_prob=0.0)
    tree = sample_tree_draft(model, (2, 2), Draw.SWOR, np.random.default_rng(1)).tree
    assert tree.size == 6 and set(tree.draws) == {Draw.SWOR}


def test_bench_entry_point_returns_report_and_table(monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    import verification.bench_batch as bench_batch

    small = bench_batch.run_batch_bench
    monkeypatch.setattr(
        bench_batch, "run_batch_bench",
        lambda seed=0: small(trials=100, scalar_steps=3, vocabs=(3,), lengths=(1,), tree_widths=(2,), repeat=1, seed=seed),
    )
    report, text = bench(argparse.Namespace(seed=4, n="1,4", vocab=32000, repeat=5, json=False))
    assert report["seed"] == 4 and len(report["results"]) == 7
    assert text.startswith("Batch vs scalar samplers") and "multidraft-topk" in text


# ------------------------------------------------- Traversal Verification


def _traversal_noise(
    tree: DraftTree, p_rows: np.ndarray, rng: np.random.Generator, update_value: bool, children=recorded_children
) -> np.ndarray:
    """Noise on and next to every acceptance value and every CDF step of every emitted row."""
    p = check_tree_p_rows(tree, p_rows)
    tests = list(traversal_tests(tree, p, update_value=update_value, children=children))
    columns: list[list[float]] = [[] for _ in range(tree.size)]
    for t in tests:
        if t.node >= 0:
            columns[t.node] = _around([t.value])
    return _noise(columns + [_cdf_points([t.row for t in tests])], rng, trials=48)


def _assert_traversal_equal(
    tree: DraftTree, p_rows: np.ndarray, u: np.ndarray, update_value: bool = True, children=recorded_children
) -> None:
    got = traversal_batch(tree, p_rows, u, update_value=update_value, children=children)
    rule = dict(update_value=update_value, children=children)
    assert got.tokens(tree) == [traversal_sample_from_uniforms(tree, p_rows, row, **rule) for row in u]


@settings(max_examples=40)
@given(
    model=toy_models(max_vocab=3, depth=3),
    widths=st.sampled_from(TREE_SHAPES),
    draw=st.sampled_from(list(Draw)),
    start=st.integers(0, 50),
    update_value=st.booleans(),
    children=st.sampled_from([recorded_children, ratio_ordered_children]),
)
def test_traversal_batch_equals_scalar_step_for_step(
    model: ToyModel, widths: tuple[int, ...], draw: Draw, start: int, update_value: bool, children
) -> None:
    """Bit-equal to :func:`tmc.traversal_sample_from_uniforms`, also for the BIASED variant's flag
    and for the ratio-ordered children rule (:mod:`tmc.ordered_traversal`)."""
    rng = np.random.default_rng(start)
    trees = islice(enumerate_draft_trees(model, widths, draw), start % 7, None, 7)
    for _, tree in islice(trees, 3):
        p_rows = tree_p_rows(model, tree)
        u = _traversal_noise(tree, p_rows, rng, update_value, children)
        _assert_traversal_equal(tree, p_rows, u, update_value, children)


def test_traversal_batch_edge_cases() -> None:
    rng = np.random.default_rng(2)
    for tree, p_rows in _edge_trees():
        _assert_traversal_equal(tree, p_rows, _with_extremes(_traversal_noise(tree, p_rows, rng, True)))


# ------------------------------------------------------------------ K-SEQ


def _kseq_noise(tree: DraftTree, p_rows: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Noise on and next to every acceptance probability and every CDF step of every final law."""
    p = check_tree_p_rows(tree, p_rows)
    columns: list[list[float]] = [[] for _ in range(tree.size)]
    finals = []
    for node in range(-1, tree.size):
        rule = kseq_node_rule(tree, node, p[node + 1])
        for kid, a in zip(tree.children(node), rule.accept):
            columns[kid] = _around([a])
        finals.append(rule.final)
    return _noise(columns + [_cdf_points(finals)], rng, trials=48)


@settings(max_examples=40)
@given(
    model=toy_models(max_vocab=3, depth=3),
    widths=st.sampled_from(TREE_SHAPES),
    draw=st.sampled_from(list(Draw)),
    start=st.integers(0, 50),
)
def test_kseq_batch_equals_scalar_step_for_step(model: ToyModel, widths: tuple[int, ...], draw: Draw, start: int) -> None:
    rng = np.random.default_rng(start)
    trees = islice(enumerate_draft_trees(model, widths, draw), start % 7, None, 7)
    for _, tree in islice(trees, 3):
        p_rows = tree_p_rows(model, tree)
        u = _kseq_noise(tree, p_rows, rng)
        assert kseq_batch(tree, p_rows, u).tokens(tree) == [kseq_sample_from_uniforms(tree, p_rows, row) for row in u]


def test_kseq_batch_edge_cases() -> None:
    rng = np.random.default_rng(3)
    for tree, p_rows in _edge_trees():
        u = _with_extremes(_kseq_noise(tree, p_rows, rng))
        assert kseq_batch(tree, p_rows, u).tokens(tree) == [kseq_sample_from_uniforms(tree, p_rows, row) for row in u]
