"""Bad input raises ValueError naming the argument and the row (DESIGN.md §3, §5)."""

from __future__ import annotations

import numpy as np
import pytest

from tmc import (
    asps_kernel,
    asps_sample,
    block_kernel,
    block_sample,
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
    ("non-integer token", [0.5, 1], Q, P, r"integer token ids"),
    ("q rows vs ref length", [0], Q, P[:2], r"q_rows has shape \(2, 3\); expected \(n, V\) = \(1, 3\)"),
    ("p rows too short", REF, Q, P[:2], r"p_rows has shape \(2, 3\); expected \(n \+ 1, V\) = \(3, 3\)"),
    ("vocab mismatch", REF, Q[:, :2] / Q[:, :2].sum(1, keepdims=True), P, r"q_rows has shape \(2, 2\)"),
    ("1-D p", [], np.zeros((0, 3)), P[0], r"p_rows must be a 2-D array"),
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
