"""Long chains and extreme probabilities (issue #2: n = 64, V = 32000, down to 1e-30)."""

from __future__ import annotations

import numpy as np
import pytest

from tmc import asps_kernel, block_kernel, sps_kernel

from .reference import asps_literal, decimal_rows, rational_rows, sps_literal, to_float

KERNELS = [sps_kernel, asps_kernel, block_kernel]


def _softmax(logits):
    x = np.exp(logits - logits.max(axis=1, keepdims=True))
    return x / x.sum(axis=1, keepdims=True)


def _floor(rows, floor):
    rows = np.maximum(rows, floor)
    return rows / rows.sum(axis=1, keepdims=True)


def _llm_like(n, vocab, gap, rng, floor=1e-30):
    logits = 8.0 * rng.standard_normal((n + 1, vocab))
    p = _floor(_softmax(logits), floor)
    q = _floor(_softmax(logits[:n] + gap * rng.standard_normal((n, vocab))), floor)
    return p, q


@pytest.mark.parametrize("gap", [0.0, 1e-12, 1e-6, 1e-2, 2.0])
@pytest.mark.parametrize("draft_choice", ["sampled", "least_likely"])
def test_long_chain_large_vocab_is_a_distribution(gap, draft_choice):
    rng = np.random.default_rng(7)
    n, vocab = 64, 32000
    p, q = _llm_like(n, vocab, gap, rng)
    if draft_choice == "sampled":
        ref = np.array([rng.choice(vocab, p=q[i]) for i in range(n)])
    else:  # tokens of probability ~1e-30 under the draft
        ref = np.argmin(q, axis=1)
    kernels = [fn(ref, q, p) for fn in KERNELS]
    for kern in kernels:
        assert np.isfinite(kern).all()
        assert (kern >= 0).all()
        # tmc/chain.py promises normalisation to ~1e-12 here; measured worst
        # |sum − 1| over these 10 cases and 3 kernels: 4.4e-16.
        assert abs(kern.sum() - 1.0) <= 1e-12
        assert (kern[np.arange(n), ref] == 0).all()
    np.testing.assert_allclose(kernels[1], kernels[2], rtol=0, atol=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_long_chain_matches_exact_rationals(seed):
    # n = 64 on V = 4 with entries down to 1e-30, against 60-digit arithmetic.
    rng = np.random.default_rng(seed)
    n, vocab = 64, 4
    p, q = _llm_like(n, vocab, 0.3, rng, floor=1e-30)
    q[:, 3], p[:, 3] = 1e-30, 2e-30  # a token that is almost impossible under both
    q, p = q / q.sum(1, keepdims=True), p / p.sum(1, keepdims=True)
    ref = np.array([rng.choice(vocab, p=q[i]) for i in range(n)])
    ref[5] = 3  # force one 1e-30 draft token into the chain
    qr, pr = decimal_rows(q), decimal_rows(p)
    q64 = np.array(to_float(qr))
    p64 = np.array(to_float(pr))
    want_sps = np.array(to_float(sps_literal(ref, qr, pr)))
    want_asps = np.array(to_float(asps_literal(ref, qr, pr)))
    np.testing.assert_allclose(sps_kernel(ref, q64, p64), want_sps, rtol=1e-9, atol=1e-15)
    np.testing.assert_allclose(asps_kernel(ref, q64, p64), want_asps, rtol=1e-9, atol=1e-15)
    np.testing.assert_allclose(block_kernel(ref, q64, p64), want_asps, rtol=1e-9, atol=1e-15)


def _dyadic_rows(weights):
    """Rows m / 2**52 with integer m summing to 2**52: floats that sum to exactly 1.

    Renormalisation is then the identity, so the float kernel and the exact
    rational reference see bit-identical inputs.
    """
    m = np.asarray(weights, dtype=np.int64)
    m[:, -1] += 2**52 - m.sum(axis=1)
    return m / 2.0**52


def test_nearly_equal_rows_keep_relative_accuracy():
    # p and q differ by ~1e-13 relative: the emitted mass is a tiny difference
    # and must come out with full relative accuracy, not rounding noise.
    rng = np.random.default_rng(3)
    n, vocab = 6, 5
    base = rng.integers(2**40, 2**49, size=(n + 1, vocab))
    p = _dyadic_rows(base)
    q = _dyadic_rows(base[:n] + rng.integers(-2000, 2000, size=(n, vocab)))
    assert (p.sum(axis=1) == 1.0).all() and (q.sum(axis=1) == 1.0).all()
    ref = np.array([rng.choice(vocab, p=q[i]) for i in range(n)])
    qr, pr = rational_rows(q), rational_rows(p)
    for fn, literal in ((sps_kernel, sps_literal), (asps_kernel, asps_literal), (block_kernel, asps_literal)):
        want = np.array(to_float(literal(ref, qr, pr)))
        got = fn(ref, q, p)
        assert (want[:n] > 0).any(), "the case must exercise tiny emitted masses"
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=0, err_msg=fn.__name__)


def test_a_subnormal_draft_probability_raises_no_overflow_warning():
    """A drafted token with ``q = 1e-310`` (valid: positive) made ``p / q`` overflow in numpy scalars, and the
    test configuration (warnings are errors) turned the RuntimeWarning into an exception in every chain kernel,
    SpS's samplers and K-SEQ.  The ratio is +inf, so the draft is accepted: ``K[1] = p_1`` exactly (SpS's
    closed form), and K-SEQ's kernel is the limit of ``q(0) -> 0`` (1e-300 is far past its rounding)."""
    from tmc import DraftTree, kseq_kernel
    from tmc.chain import chain_sample_trusted, sps_sample_from_uniforms

    q, p = np.array([[1e-310, 1.0]]), np.array([[0.5, 0.5], [0.25, 0.75]])
    for kernel in KERNELS:
        np.testing.assert_array_equal(kernel([0], q, p), [[0.0, 0.0], [0.25, 0.75]])
    assert sps_sample_from_uniforms([0], q, p, [0.999, 0.5]) == [0, 1]
    assert chain_sample_trusted("sps", np.array([0]), q, p, np.array([0.999, 0.5])) == [0, 1]
    tree = DraftTree.build([-1, -1], [0, 1], "iid", {-1: q[0]}, 2)
    near = DraftTree.build([-1, -1], [0, 1], "iid", {-1: [1e-300, 1.0]}, 2)
    rows = p[[0, 1, 1]]
    got = kseq_kernel(tree, rows)
    assert got.sum() == pytest.approx(1.0, abs=1e-15)
    np.testing.assert_allclose(got, kseq_kernel(near, rows), rtol=0, atol=1e-12)
