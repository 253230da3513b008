"""Bad input raises ValueError naming the argument and the row (DESIGN.md §3, §5)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pytest

from tmc import (
    asps_kernel,
    asps_sample,
    asps_sample_from_uniforms,
    block_kernel,
    block_sample,
    block_sample_from_uniforms,
    sps_kernel,
    sps_sample,
    sps_sample_from_uniforms,
)

KERNELS = [sps_kernel, asps_kernel, block_kernel]
SAMPLERS = [sps_sample, asps_sample, block_sample]

Q = np.array([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
P = np.array([[0.2, 0.3, 0.5], [0.1, 0.1, 0.8], [1 / 3, 1 / 3, 1 / 3]])
REF = [0, 2]


def _calls():
    rng = np.random.default_rng(0)
    for fn in KERNELS:
        yield fn.__name__, (lambda r, q, p, fn=fn: fn(r, q, p))
    for fn in SAMPLERS:
        yield fn.__name__, (lambda r, q, p, fn=fn: fn(r, q, p, rng))


CALLS = dict(_calls())


def _with(arr, idx, value):
    out = np.array(arr, dtype=float)
    out[idx] = value
    return out


BAD_INPUTS = [
    ("nan in p", REF, Q, _with(P, (1, 0), np.nan), r"p_rows row 1 contains NaN or infinite"),
    ("inf in q", REF, _with(Q, (1, 2), np.inf), P, r"q_rows row 1 contains NaN or infinite"),
    ("negative p", REF, Q, _with(P, (2, 1), -0.1), r"p_rows row 2 has a negative entry"),
    ("negative q", REF, _with(Q, (0, 2), -1e-9), P, r"q_rows row 0 has a negative entry"),
    ("unnormalised p", REF, Q, _with(P, (0, 0), 0.3), r"p_rows row 0 sums to"),
    ("unnormalised q", REF, _with(Q, (1, 1), 0.31), P, r"q_rows row 1 sums to"),
    ("zero-q draft token", [2, 2], Q, P, r"ref\[0\] = 2 has q_rows\[0, 2\] = 0"),
    ("token out of range", [0, 3], Q, P, r"ref\[1\] = 3 is outside the vocabulary \[0, 3\)"),
    ("negative token", [-1, 0], Q, P, r"ref\[0\] = -1 is outside"),
    # past int64: OverflowError before, and a uint64 2**64 - 1 was reported as -1
    ("huge int token", [0, 2**70], Q, P, r"ref\[1\] = 1180591620717411303424 is outside"),
    ("huge float token", [1e30, 0], Q, P, r"ref\[0\] = 1000000000000000019884624838656 is outside"),
    ("uint64 token", np.array([0, 2**64 - 1], dtype=np.uint64), Q, P, r"ref\[1\] = 18446744073709551615 is outside"),
    ("non-integer token", [0.5, 1], Q, P, r"integer token ids"),
    ("q rows vs ref length", [0], Q, P[:2], r"q_rows has shape \(2, 3\); expected \(n, V\) = \(1, 3\)"),
    ("p rows too short", REF, Q, P[:2], r"p_rows has shape \(2, 3\); expected \(n \+ 1, V\) = \(3, 3\)"),
    ("vocab mismatch", REF, Q[:, :2] / Q[:, :2].sum(1, keepdims=True), P, r"q_rows has shape \(2, 2\)"),
    ("1-D p", [], np.zeros((0, 3)), P[0], r"p_rows must be a 2-D array"),
    ("ragged p", REF, Q, [[0.2, 0.3, 0.5], [1.0], [0.5, 0.5, 0.0]], r"p_rows is ragged"),  # numpy's own message
    ("empty vocabulary", [], np.zeros((0, 0)), np.zeros((1, 0)), r"p_rows has vocabulary size 0"),
]


@pytest.mark.parametrize("call", sorted(CALLS))
@pytest.mark.parametrize(("case", "ref", "q", "p", "match"), BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_raises_named_value_error(call, case, ref, q, p, match):
    with pytest.raises(ValueError, match=match):
        CALLS[call](ref, q, p)


@pytest.mark.parametrize("u", [[0.1, 0.2, 1.0], [0.1, -0.1, 0.5], [0.5, 0.5], [np.nan, 0.1, 0.1]])
def test_bad_uniforms_raise(u):
    with pytest.raises(ValueError, match=r"u"):
        sps_sample_from_uniforms(REF, Q, P, u)


@pytest.mark.parametrize("fn", KERNELS)
def test_vocabulary_of_one(fn):
    kern = fn([0, 0], np.ones((2, 1)), np.ones((3, 1)))
    np.testing.assert_array_equal(kern, [[0.0], [0.0], [1.0]])


@pytest.mark.parametrize("fn", KERNELS)
def test_no_draft_tokens_samples_the_target(fn):
    kern = fn([], np.zeros((0, 3)), P[:1])
    np.testing.assert_allclose(kern, P[:1], atol=1e-15)


@pytest.mark.parametrize("fn", KERNELS)
def test_identical_draft_and_target_accept_everything(fn):
    # p == q exactly: residual mass 0, no 0/0, everything accepted.
    kern = fn(REF, P[:2], P)
    expected = np.zeros_like(P)
    expected[2] = P[2]
    np.testing.assert_allclose(kern, expected, atol=1e-15)


@pytest.mark.parametrize("fn", KERNELS)
def test_greedy_target_temperature_zero(fn):
    # Temperature 0: one-hot p.  Output is the target's argmax path.
    p = np.eye(3)[[1, 2, 0]]
    kern = fn([1, 0], Q, p)
    expected = np.zeros_like(p)
    expected[1, 2] = 1.0  # accept 1, reject 0, emit the target's 2
    np.testing.assert_allclose(kern, expected, atol=1e-15)


@pytest.mark.parametrize("fn", KERNELS)
def test_rows_within_tolerance_are_renormalised(fn):
    q = Q * (1 + 5e-7)
    kern = fn(REF, q, P)
    assert kern.sum() == pytest.approx(1.0, abs=1e-15)


# ------------------------------------------------ issue 9: inputs that cannot slip through

from tmc import DraftTree, Draw, ToyModel, multidraft_kernel, multidraft_sample  # noqa: E402

QROW = [0.5, 0.3, 0.2]


@pytest.mark.parametrize(
    ("parents", "tokens", "draws", "q_rows", "vocab", "match"),
    [
        ((0,), (1,), ("iid",), {-1: QROW}, 3, r"node 0 has parent 0"),  # a self-loop
        ((-1, 1), (1, 2), ("iid", "iid"), {-1: QROW, 0: QROW}, 3, r"node 1 has parent 1"),  # cycle / forward parent
        ((-1,), (2,), ("iid",), {-1: [0.5, 0.5, 0.0]}, 3, r"where q = 0"),  # sampled child with q = 0
        ((-1, -1), (1, 1), ("swor", "swor"), {-1: QROW}, 3, r"repeat a token"),
        ((-1, -1), (1, 1), ("topk", "topk"), {}, 3, r"repeat a token"),
        ((-1,), (1,), ("iid",), {-1: [0.25, 0.15, 0.1]}, 3, r"q_rows\[-1\] row 0 sums to 0.5"),
        ((-1,), (1,), ("iid",), {}, 3, r"no q_rows\[-1\]"),
        ((-1, -1), (0, 1), ("iid", "topk"), {-1: QROW}, 3, r"mix draw kinds"),
        ((-1,), (1.7,), ("iid",), {-1: QROW}, 3, r"tokens\[0\] must be an integer, got 1.7"),
        ((0.5,), (1,), ("iid",), {-1: QROW}, 3, r"parents\[0\] must be an integer, got 0.5"),
        ((-1,), (1,), ("iid",), {-1: QROW}, "3", r"vocab must be an integer"),
        ((-1,), (1,), ("iid",), {-1: QROW}, True, r"vocab must be an integer"),
        ((-1,), (1,), ("iid",), None, 3, r"q_rows must be a mapping"),
        ((-1,), (1,), ("iid",), {-1: [0.5 + 0j, 0.3, 0.2]}, 3, r"complex"),
        ((-1,), (1,), ("iid",), {-1: ["a", "b", "c"]}, 3, r"real numbers"),
        ((-1,), (1,), ("bogus",), {-1: QROW}, 3, r"draws\[0\] must be one of"),
        ((-1,), (3,), ("iid",), {-1: QROW}, 3, r"outside the vocabulary"),
        ((-1,), (1,), ("iid",), {5: QROW, -1: QROW}, 3, r"q_rows key 5 is not a node"),
    ],
)
def test_draft_tree_cannot_exist_unvalidated(parents, tokens, draws, q_rows, vocab, match):
    with pytest.raises(ValueError, match=match):
        DraftTree(parents, tokens, draws, q_rows, vocab)


def test_draft_tree_accepts_integral_floats_and_numpy_ints():
    tree = DraftTree((np.int64(-1), -1.0), (np.int32(0), 1.0), (Draw.IID, "iid"), {np.int64(-1): np.array(QROW)}, np.int64(3))
    assert tree.parents == (-1, -1) and tree.tokens == (0, 1) and tree.vocab == 3
    assert all(type(x) is int for x in tree.parents + tree.tokens)
    assert tree.draws == (Draw.IID, Draw.IID)


def test_draft_tree_rows_are_read_only_copies():
    row = np.array(QROW)
    tree = DraftTree((-1,), (0,), ("iid",), {-1: row}, 3)
    row[0] = 0.9  # the caller's array changes; the tree keeps the validated row
    assert tree.q_rows[-1][0] == 0.5
    with pytest.raises(ValueError):
        tree.q_rows[-1][0] = 0.1


@pytest.mark.parametrize("bad", [1.7, "0", None, np.nan])
def test_non_integer_chain_tokens_are_rejected(bad):
    with pytest.raises(ValueError, match="integer token ids"):
        sps_kernel([0, bad], Q, P)


def test_integral_float_chain_tokens_are_accepted():
    np.testing.assert_array_equal(sps_kernel([0.0, 2.0], Q, P), sps_kernel([0, 2], Q, P))


@pytest.mark.parametrize(
    ("q", "p", "match"),
    [
        (Q.astype(complex), P, r"q_rows has complex entries"),
        (Q, None, r"p_rows is None"),
        (None, P, r"q_rows is None"),
        (Q, [["a", "b", "c"]] * 3, r"p_rows must hold real numbers"),
    ],
)
def test_rows_must_be_real_numbers(q, p, match):
    with pytest.raises(ValueError, match=match):
        sps_kernel(REF, q, p)


@pytest.mark.parametrize("fn", SAMPLERS)
def test_integer_seed_is_a_valid_rng(fn):
    assert fn(REF, Q, P, 7) == fn(REF, Q, P, np.random.default_rng(7))


@pytest.mark.parametrize("bad", ["7", 1.5, None, -1, True])
def test_rng_must_be_a_generator_or_a_seed(bad):
    with pytest.raises(ValueError, match="rng"):
        sps_sample(REF, Q, P, bad)


def test_tree_sampler_takes_a_seed_and_checks_its_tree():
    tree = DraftTree.build([-1], [0], "iid", {-1: QROW}, 3)
    p = np.array([[0.2, 0.3, 0.5], [1 / 3, 1 / 3, 1 / 3]])
    assert multidraft_sample(tree, p, 3) == multidraft_sample(tree, p, np.random.default_rng(3))
    with pytest.raises(ValueError, match="tree must be a DraftTree"):
        multidraft_sample("not a tree", p, 0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"p_rows has shape \(1, 3\)"):
        multidraft_kernel(tree, p[:1])


@pytest.mark.parametrize(
    ("obj", "match"),
    [
        ([1, 2], "must be an object"),
        ({"vocab": True, "draft": {"*": [1]}, "target": {"*": [1]}}, "vocab"),
        ({"vocab": "3", "draft": {"*": QROW}, "target": {"*": QROW}}, "vocab"),
        ({"vocab": 3, "draft": {"*": None}, "target": {"*": QROW}}, r"draft\['\*'\]"),
        ({"vocab": 3, "draft": {"*": {"a": 1}}, "target": {"*": QROW}}, r"draft\['\*'\]"),
        ({"vocab": 3, "draft": {"*": [0.5, "x", 0.5]}, "target": {"*": QROW}}, r"draft\['\*'\]"),
    ],
)
def test_toy_model_from_dict_rejects_malformed_input(obj, match):
    with pytest.raises(ValueError, match=match):
        ToyModel.from_dict(obj)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (("3", {}, {}, np.array(QROW), np.array(QROW)), "vocab"),
        ((3, None, {}), "draft_rows"),
        ((3, {(): [0.5, 0.5]}, {}), r"draft_rows\[\(\)\] has shape"),
        ((3, {}, {}, None, np.array([0.5, 0.5, 0.5])), r"target_default row 0 sums to"),
    ],
)
def test_toy_model_validates_on_construction(args, match):
    with pytest.raises(ValueError, match=match):
        ToyModel(*args)


def test_toy_model_random_takes_a_seed():
    a, b = ToyModel.random(3, 1, 5), ToyModel.random(3, 1, np.random.default_rng(5))
    np.testing.assert_array_equal(a.q((1,)), b.q((1,)))


@pytest.mark.parametrize(
    ("row", "match"),
    [
        ([1.2, -0.2, 0.0], r"row 1 has a negative entry -0.2 at token 1"),  # sums to 1: only the minimum sees it
        ([np.inf, -np.inf, 1.0], r"row 1 contains NaN or infinite"),  # the sum is NaN
        ([-np.inf, 0.5, 0.5], r"row 1 contains NaN or infinite"),
        ([np.nan, 0.5, 0.5], r"row 1 contains NaN or infinite"),
        ([0.5, 0.5, 1e-5], r"row 1 sums to 1.00001"),
    ],
)
def test_check_prob_rows_names_faults_its_two_reductions_flag(row, match):
    """check_prob_rows decides with a row sum and a row minimum; every fault must still be caught and named."""
    from tmc.validate import check_prob_rows

    good = [0.2, 0.3, 0.5]
    with pytest.raises(ValueError, match=match):
        check_prob_rows("rows", np.array([good, row, good]))
    out = check_prob_rows("rows", np.array([good, [0.0, 1.0, 0.0], [1 / 3] * 3]))
    np.testing.assert_allclose(out.sum(axis=1), 1.0, rtol=0, atol=1e-15)


# ------------------------------------------------------- row sums at the caller's precision


def _off_by(vocab: int, excess: float, dtype) -> np.ndarray:
    """One row of ``vocab`` equal entries whose float64 sum is ``1 + excess`` (within rounding), in ``dtype``."""
    return np.full((1, vocab), (1.0 + excess) / vocab).astype(dtype)


def test_row_sum_tolerance_follows_the_precision_the_rows_came_in():
    from tmc.validate import ROW_SUM_TOL, ROW_SUM_TOLS, check_prob_rows, row_sum_tol

    assert row_sum_tol(np.float64) == row_sum_tol("float64") == row_sum_tol(None) == ROW_SUM_TOL
    assert row_sum_tol(np.dtype(np.float32)) == row_sum_tol("torch.float32") == ROW_SUM_TOLS["float32"]
    assert row_sum_tol("torch.bfloat16") == ROW_SUM_TOLS["bfloat16"]
    # 2e-5 off: what a float32 softmax over a 256k vocabulary gives (tmc.validate), accepted in float32 only
    f32 = _off_by(4096, 2e-5, np.float32)
    assert abs(float(f32.astype(np.float64).sum()) - 1.0 - 2e-5) < 1e-6
    got = check_prob_rows("p_rows", f32)
    assert abs(got.sum() - 1.0) < 1e-12  # renormalised in float64
    with pytest.raises(ValueError, match=r"p_rows row 0 sums to .*tolerance 1e-06"):
        check_prob_rows("p_rows", f32.astype(np.float64))
    with pytest.raises(ValueError, match=r"p_rows row 0 sums to .*tolerance 0.0001"):
        check_prob_rows("p_rows", _off_by(4096, 1e-3, np.float32))  # not a rounding: refused in float32 too
    with pytest.raises(ValueError, match=r"tolerance 0.01"):
        check_prob_rows("p_rows", _off_by(8, 0.05, np.float16))
    # the caller's precision passed on by a function that converted the rows first
    check_prob_rows("p_rows", f32.astype(np.float64), dtype=np.float32)


def test_rows_given_as_lists_are_checked_at_each_row_precision():
    """A list of float32 rows (a float32 softmax off by 2e-5) was refused at float64's 1e-6: a list has no
    dtype.  A DraftTree whose rows mix precisions checked every row at the least precise one's tolerance, so
    a float64 row off by 5e-3 passed beside a float16 row.  Each row is now checked at its own precision."""
    from tmc import DraftTree, traversal_kernel
    from tmc.validate import check_prob_rows, given_dtype

    f32 = _off_by(4096, 2e-5, np.float32)
    assert given_dtype(list(f32)) == np.float32 and given_dtype([[0.5, 0.5]]) == np.float64
    assert abs(check_prob_rows("p_rows", list(f32)).sum() - 1.0) < 1e-12
    assert abs(check_prob_rows("p_rows", [f32[0], f32[0]]).sum() - 2.0) < 1e-12
    with pytest.raises(ValueError, match=r"p_rows row 1 sums to .*tolerance 1e-06"):  # row by row
        check_prob_rows("p_rows", [f32[0], f32[0].astype(np.float64)])
    ref = [0]
    q, p = [f32[0]], [f32[0], f32[0]]
    assert sps_kernel(ref, q, p).sum() == pytest.approx(1.0, abs=1e-12)
    tree = DraftTree.chain([0], np.array(q))
    assert traversal_kernel(tree, list(p)).sum() == pytest.approx(1.0, abs=1e-12)
    off64 = np.array([0.4, 0.605])  # sums to 1.005: refused in float64 whatever the other rows' precision
    for other in (np.array([0.5, 0.5]), np.array([0.5, 0.5], dtype=np.float16)):
        with pytest.raises(ValueError, match=r"q_rows\[-1\] row 0 sums to 1.005.*tolerance 1e-06"):
            DraftTree.build([-1, 0], [0, 1], "iid", {-1: off64, 0: other}, 2)
    off16 = np.array([0.4, 0.605], dtype=np.float16)  # within float16's 1e-2: accepted beside a float64 row
    tree = DraftTree.build([-1, 0], [0, 1], "iid", {-1: off16, 0: np.array([0.5, 0.5])}, 2)
    assert tree.q_rows[-1].sum() == pytest.approx(1.0, abs=1e-15)


def test_rows_of_float32_numbers_keep_float32s_tolerance_and_are_converted_once():
    """A list of rows that are themselves lists of float32 numbers is float32 (numpy builds a float32 array
    from it); reading each row's precision off the row alone called such a row float64 and refused a float32
    softmax off by 2e-5.  The precision now comes from the one conversion of the rows."""
    from tmc.kseq import kseq_residual
    from tmc.lp import hu_closed_form_acceptance
    from tmc.validate import as_real_array_with_dtype, check_chain, check_prob_rows

    f32 = np.repeat(_off_by(4096, 2e-5, np.float32), 2, axis=0)
    as_numbers = [list(row) for row in f32]
    assert type(as_numbers[0][0]) is np.float32
    arr, given = as_real_array_with_dtype("p_rows", as_numbers)
    assert given == np.float32 and arr.dtype == np.float64 and np.array_equal(arr, f32.astype(np.float64))
    assert as_real_array_with_dtype("x", [[0.5, 0.5]])[1] == np.float64
    assert as_real_array_with_dtype("x", np.array([0.5, 0.5], dtype=np.float16))[1] == np.float16
    assert abs(check_prob_rows("p_rows", as_numbers).sum() - 2.0) < 1e-12
    ref, q, p = check_chain([0], as_numbers[:1], as_numbers)
    assert q.sum() == pytest.approx(1.0, abs=1e-12) and p.sum() == pytest.approx(2.0, abs=1e-12)
    with pytest.raises(ValueError, match=r"p_rows row 0 sums to .*tolerance 1e-06"):  # Python floats: float64
        check_prob_rows("p_rows", [[float(x) for x in f32[0]], f32[1]])
    small = _off_by(3, 2e-5, np.float32)[0]
    assert kseq_residual(list(small), list(small), 2).sum() == pytest.approx(1.0, abs=1e-12)
    assert hu_closed_form_acceptance(list(small), {(0,): 1.0}) == pytest.approx(float(small[0] / small.sum()))


def test_float32_rows_off_by_their_rounding_are_accepted_by_every_chain_sampler():
    """Rows whose float64 sums are 1 + 1.2e-5 in float32 (a float32 softmax over 128k tokens is off by about
    that much, :data:`tmc.validate.ROW_SUM_TOLS`): every sampler gives the tokens of the same rows renormalised
    in float64."""
    rng = np.random.default_rng(0)
    for fn in (sps_sample_from_uniforms, asps_sample_from_uniforms, block_sample_from_uniforms):
        for _ in range(20):
            vocab = int(rng.integers(2, 40))
            q = rng.dirichlet(np.ones(vocab), size=3)
            p = rng.dirichlet(np.ones(vocab), size=4)
            ref = [int(rng.choice(vocab, p=row)) for row in q]
            q32, p32 = (q * (1 + 1.2e-5)).astype(np.float32), (p * (1 + 1.2e-5)).astype(np.float32)
            assert np.abs(p32.astype(np.float64).sum(axis=1) - 1.0).min() > 1e-6
            q64 = q32.astype(np.float64) / q32.astype(np.float64).sum(axis=1, keepdims=True)
            p64 = p32.astype(np.float64) / p32.astype(np.float64).sum(axis=1, keepdims=True)
            u = rng.random(1 if fn is asps_sample_from_uniforms else 4)
            assert fn(ref, q32, p32, u) == fn(ref, q64, p64, u)


@pytest.mark.parametrize("u", [np.array([0.1, 0.2j, 0.3]), [True, False, True], ["0.1", "0.2", "0.3"], [0.1, None, 0.3]])
def test_uniforms_must_be_real_numbers(u):
    with pytest.raises(ValueError, match=r"^u "):
        sps_sample_from_uniforms(REF, Q, P, u)


class _Row(NamedTuple):
    a: object
    b: object


@pytest.mark.parametrize(
    ("call", "where"),
    [(lambda: sps_kernel([1, True], [[0.4, 0.6], [0.4, 0.6]], [[0.5, 0.5]] * 3), r"ref\[1\]"),
     (lambda: sps_sample_from_uniforms([0, True], [[0.4, 0.6], [0.4, 0.6]], [[0.5, 0.5]] * 3, [0.1] * 3), r"ref\[1\]"),
     (lambda: sps_kernel([1], [[0.0, True]], [[0.5, 0.5]] * 2), r"q_rows\[0\]\[1\]"),
     (lambda: sps_kernel([1], [np.array([0.0, 1.0]), np.array([False, True])], [[0.5, 0.5]] * 2), r"q_rows\[1\]"),
     (lambda: sps_sample_from_uniforms([0], [[0.4, 0.6]], [[0.5, 0.5]] * 2, [0.5, True]), r"u\[1\]"),
     (lambda: sps_sample_from_uniforms([0], [[0.4, 0.6]], [[0.5, 0.5]] * 2, (np.False_, 0.3)), r"u\[0\]"),
     # the scan reads the types of a row at once: a boolean late in long rows, a 0-d boolean array, a tuple subclass
     (lambda: sps_kernel([0], [[1e-3] * 999 + [False]], [[1e-3] * 1000] * 2), r"q_rows\[0\]\[999\]"),
     (lambda: sps_kernel([0], [[0.5, np.array(True)]], [[0.5, 0.5]] * 2), r"q_rows\[0\]\[1\]"),
     (lambda: sps_kernel([0], [_Row(0.5, np.True_)], [[0.5, 0.5]] * 2), r"q_rows\[0\]\[1\]")],
)
def test_a_boolean_among_numbers_is_refused(call, where):
    """numpy reads ``[1, True]`` as ``[1, 1]`` and ``[0.5, True]`` as ``[0.5, 1.0]``, so a boolean inside a list
    passed the checks that refuse a boolean array; it is refused where it stands."""
    with pytest.raises(ValueError, match=where + r" is a boolean"):
        call()


# --- entry points around the verifiers (an audit's findings, each a wrong answer or a bare error before) -----------


def test_rows_given_as_torch_tensors_numpy_cannot_read_are_read_through_the_tensor():
    """bfloat16, a tensor that requires grad: numpy cannot take them as they are (torch's TypeError and
    RuntimeError came out of the core); they are read as the values they hold, at their precision's tolerance."""
    torch = pytest.importorskip("torch")
    from tmc import DraftTree, kseq_rho, multidraft_kernel

    q, p = [[0.5, 0.5]], [[0.5, 0.5], [0.3, 0.7]]
    want = sps_kernel([1], q, np.array(p))
    for given in (torch.tensor(p, dtype=torch.float64, requires_grad=True), torch.tensor(p, dtype=torch.bfloat16)):
        got = sps_kernel([1], q, given)
        np.testing.assert_allclose(got, want, atol=2e-3)  # bfloat16 holds 0.3 as 0.30078125
        assert got.sum() == pytest.approx(1.0)
    tree = DraftTree((-1,), (1,), ("iid",), {-1: torch.tensor([0.5, 0.5], dtype=torch.bfloat16)}, 2)
    assert tree.q_rows[-1].tolist() == [0.5, 0.5]
    assert multidraft_kernel(tree, torch.tensor(p, dtype=torch.bfloat16)).sum() == pytest.approx(1.0)
    assert kseq_rho(torch.tensor([0.5, 0.5], dtype=torch.bfloat16), [0.5, 0.5], 2) == pytest.approx(1.0, abs=1e-6)


def test_a_value_numpy_cannot_read_is_a_value_error_naming_the_argument():
    class Unreadable:
        def __array__(self, *args, **kwargs):
            raise TypeError("no array here")

    with pytest.raises(ValueError, match=r"^p_rows cannot be read as an array \(Unreadable: no array here\)"):
        sps_kernel([1], [[0.5, 0.5]], Unreadable())


@pytest.mark.parametrize("node", [-2, -3, 2, 5, 1.5, "0", None])
@pytest.mark.parametrize("method", ["children", "node_depth", "path"])
def test_draft_tree_node_lookups_refuse_nodes_it_does_not_have(method, node):
    """``path(-2)`` gave node 0's path and ``node_depth(-2)`` its depth (a negative index wrapped around)."""
    from tmc import DraftTree

    tree = DraftTree((-1, 0), (1, 0), ("iid", "iid"), {-1: [0.5, 0.5], 0: [0.5, 0.5]}, 2)
    with pytest.raises(ValueError, match=r"^node"):
        getattr(tree, method)(node)
    assert (tree.path(1), tree.node_depth(1), tree.children(-1)) == ((1, 0), 2, (0,))


def test_toy_model_rows_given_as_lists_are_stored_as_arrays():
    """A list row passed validation and then reached the swor enumeration as a list (AttributeError)."""
    from tmc import Draw, ToyModel, tree_output_law
    from tmc.multidraft import multidraft_kernel

    model = ToyModel(2, {(): [0.5, 0.5]}, {}, [0.5, 0.5], [0.2, 0.8])
    assert isinstance(model.q(()), np.ndarray) and isinstance(model.p((1,)), np.ndarray)
    law = tree_output_law(model, [2], Draw.SWOR, multidraft_kernel)
    assert law.completion_error < 1e-12


@pytest.mark.parametrize(
    ("rows", "match"),
    [
        ({"0": [0.9, 0.1]}, r"draft_rows key '0' is not a prefix"),  # never looked up: rows are read by tuple
        ({0: [0.9, 0.1]}, r"draft_rows key 0 is not a prefix"),
        ({(5,): [0.9, 0.1]}, r"draft_rows key \(5,\) has a token outside \[0, 2\)"),
        ({(0, -1): [0.9, 0.1]}, r"draft_rows key \(0, -1\) has a token outside"),
        ({(1.5,): [0.9, 0.1]}, r"draft_rows key \(1.5,\): token must be an integer"),
    ],
)
def test_toy_model_refuses_table_keys_that_are_no_prefix(rows, match):
    from tmc import ToyModel

    with pytest.raises(ValueError, match=match):
        ToyModel(2, rows, {}, [0.5, 0.5], [0.5, 0.5])


@pytest.mark.parametrize("prefix", [(7,), (-1,), "ab", 0, (0.5,)])
def test_a_prefix_off_the_vocabulary_is_refused(prefix):
    """A prefix token past the vocabulary fell back to the default row: an output law for a context that
    cannot exist (``chain_output_law(prefix=(7,))`` on V = 3 summed to 1)."""
    from tmc import Draw, ToyModel, chain_drafts, chain_output_law, tree_output_law
    from tmc.multidraft import multidraft_kernel

    model = ToyModel(3, {}, {}, np.full(3, 1 / 3), np.array([0.2, 0.3, 0.5]))
    with pytest.raises(ValueError, match=r"^prefix"):
        chain_output_law(model, 1, sps_kernel, prefix)
    with pytest.raises(ValueError, match=r"^prefix"):
        tree_output_law(model, [2], Draw.IID, multidraft_kernel, prefix)
    with pytest.raises(ValueError, match=r"^prefix"):
        chain_drafts(model, 1, prefix)
    with pytest.raises(ValueError, match=r"^prefix"):
        model.q(prefix if isinstance(prefix, tuple) else (9,))


def test_target_path_probabilities_and_completion_refuse_tokens_off_the_vocabulary():
    """``target_path_prob((-1,))`` read token 2's probability (a wrapped index)."""
    from tmc import ToyModel
    from tmc.laws import completion_error

    model = ToyModel(3, {}, {}, np.full(3, 1 / 3), np.array([0.2, 0.3, 0.5]))
    assert model.target_path_prob((2, 0)) == pytest.approx(0.5 * 0.2)
    for path in [(-1,), (3,)]:
        with pytest.raises(ValueError, match=r"^path\[0\] = -?\d is outside the vocabulary \[0, 3\)"):
            model.target_path_prob(path)
    with pytest.raises(ValueError, match=r"^output_law key \(3,\)"):
        completion_error(model, {(0,): 0.3, (1,): 0.4, (3,): 0.3}, 1)


def test_child_options_checks_its_width():
    """``width = -1`` with topk returned the whole ranking (a slice to -1)."""
    from tmc import ToyModel
    from tmc.drafts import child_options

    model = ToyModel(3, {}, {}, np.array([0.5, 0.3, 0.2]), np.full(3, 1 / 3))
    assert child_options(model, (), 0, "swor") == [((), 1.0)]
    assert child_options(model, (), 2, "topk") == [((0, 1), 1.0)]
    for width, match in [(-1, "width must be >= 0"), (1.5, "width must be an integer")]:
        for draw in ("topk", "iid", "swor"):
            with pytest.raises(ValueError, match=match):
                child_options(model, (), width, draw)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"concentration": 0.0}, "concentration must be a finite number > 0"),
        ({"concentration": -1.0}, "concentration must be a finite number > 0"),
        ({"concentration": np.nan}, "concentration"),
        ({"zero_prob": 2.0}, r"zero_prob must be in \[0, 1\]"),
        ({"zero_prob": np.nan}, "zero_prob"),
        ({"zero_prob": "0.2"}, "zero_prob has a non-numeric entry"),
    ],
)
def test_random_toy_models_check_their_parameters(kwargs, match):
    """``zero_prob = 2`` made every row one-hot silently; ``concentration = 0`` was reported as NaN rows."""
    from tmc import ToyModel

    with pytest.raises(ValueError, match=match):
        ToyModel.random(3, 1, 0, **kwargs)


def test_random_toy_model_with_every_entry_zeroed_keeps_one_positive_entry_a_row():
    from tmc import ToyModel

    model = ToyModel.random(3, 1, 0, zero_prob=1.0)
    assert all(np.count_nonzero(row) == 1 for row in model.draft_rows.values())


@pytest.mark.parametrize("key", ["1_0", "-0", "+1", "0,+1", "１"])
def test_toy_model_file_keys_are_decimal_ids(key):
    """``int()`` read "1_0" as 10, "-0" as 0 and "+1" as 1: another prefix's row, silently."""
    from tmc import ToyModel

    obj = {"vocab": 12, "draft": {key: [1 / 12] * 12, "*": [1 / 12] * 12}, "target": {"*": [1 / 12] * 12}}
    with pytest.raises(ValueError, match="is not comma-separated token ids"):
        ToyModel.from_dict(obj)
    obj["draft"] = {" 1, 0": [1 / 12] * 12, "*": [1 / 12] * 12}  # spaces around the ids are read
    assert (1, 0) in ToyModel.from_dict(obj).draft_rows


def test_more_core_arguments_of_the_wrong_kind_are_value_errors(tmp_path):
    from tmc import ToyModel, chain_drafts, kseq_rho, load_model
    from tmc.laws import output_law

    model = ToyModel(2, {}, {}, np.array([0.5, 0.5]), np.array([0.5, 0.5]))
    with pytest.raises(ValueError, match="model must be a tmc.ToyModel, got NoneType"):
        chain_drafts(None, 1)
    with pytest.raises(ValueError, match="kernel_fn must be a kernel function, got NoneType"):
        output_law(model, chain_drafts(model, 1), None)
    with pytest.raises(ValueError, match="path must be a file path"):
        load_model(None)
    with pytest.raises(ValueError, match=r"k must be at most 9007199254740992 .*got an integer of 401 digits"):
        kseq_rho([0.5, 0.5], [0.5, 0.5], 10**400)


def test_tree_spaces_and_conditionals_check_their_numbers():
    """``depth = 1.5`` cut at 2; a conditional keyed 1.7 gave child 1 its mass; "0.5" was read as 0.5."""
    from tmc.tree import TreeDistribution, TreeSpace

    for args, match in [((2, 1.5), "max_depth must be an integer"), ((np.nan, 1), "vocab must be an integer"),
                        (("3", 1), "vocab must be an integer"), ((1.5, 1), "vocab must be an integer")]:
        with pytest.raises(ValueError, match=match):
            TreeSpace.full(*args)
    with pytest.raises(ValueError, match="children_fn must be a function of a path, got NoneType"):
        TreeSpace(None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="depth must be an integer, got 1.5"):
        TreeSpace.full(2, None).truncated(1.5)  # type: ignore[arg-type]
    assert TreeSpace.full(2, 3).truncated(2.0).max_depth == 2  # an integral float is an integer (check_int)
    space = TreeSpace.full(2, 1)
    for cond, match in [({1.7: 0.5, 0: 0.5}, r"cond\(\(\)\) key must be an integer, got 1.7"),
                        ({0: "0.5"}, r"cond\(\(\)\)\[0\] has a non-numeric entry"),
                        ([0.5, 0.5], r"cond\(\(\)\) must return a mapping")]:
        with pytest.raises(ValueError, match=match):
            TreeDistribution.from_conditionals(space, lambda node, c=cond: c)
    dist = TreeDistribution.from_conditionals(space, lambda node: {0: 0.25, 1: 0.75})
    assert dist.masses == {(0,): 0.25, (1,): 0.75}
