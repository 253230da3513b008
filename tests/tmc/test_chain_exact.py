"""Exact tests of the chain kernels (STYLE rule 7: exact before statistical).

Expected values come from outside the code under test: the TMC paper's
published Tables 2 and 3, the issue's hand-computed expected lengths, the
closed form of Leviathan et al. for context-free rows, and the literal
exact-rational implementations in ``reference.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tmc import asps_kernel, block_kernel, chain_output_law, paper_toy_model, sps_kernel
from tmc.commands.demo import PAPER_DRAFT_COLUMNS, PAPER_OUTPUT_ROWS, paper_joint_table
from tmc.enumeration import enumerate_drafts
from tmc.toy import ToyModel
from tmc.validate import check_chain
from verification.strategies import chain_lengths, toy_models

from .reference import asps_literal, block_literal, rational_rows, sps_literal, to_float

KERNELS = {"sps": sps_kernel, "asps": asps_kernel, "block": block_kernel}

# Published entries (rows: output; columns: draft aa, ab, ac, b, c).
PAPER_TABLE_2 = {
    "aa": [0.1, 0, 0, 0, 0],
    "ab": [0, 0.1, 0, 0, 0],
    "ac": [0.02, 0.02, 0.06, 0, 0],
    "aτ": [0, 0, 0, 0, 0],
    "b": [0.04, 0.04, 0.02, 0.3, 0],
    "c": [0.04, 0.04, 0.02, 0, 0.2],
}
PAPER_TABLE_3 = {
    "aa": [0.1, 0, 0, 0, 0],
    "ab": [0, 0.1, 0, 0, 0],
    "ac": [0, 0, 0.1, 0, 0],
    "aτ": [0, 0, 0, 0, 0],
    "b": [0.05, 0.05, 0, 0.3, 0],
    "c": [0.05, 0.05, 0, 0, 0.2],
}


@pytest.mark.parametrize(
    ("kernel", "published"), [(sps_kernel, PAPER_TABLE_2), (asps_kernel, PAPER_TABLE_3)], ids=["sps", "asps"]
)
def test_joint_table_equals_paper(kernel, published):
    table = paper_joint_table(kernel)
    for out in PAPER_OUTPUT_ROWS:
        for col, expected in zip(PAPER_DRAFT_COLUMNS, published[out]):
            assert table.get((out, col), 0.0) == pytest.approx(expected, abs=1e-12), (out, col)


@pytest.mark.parametrize(("name", "expected"), [("sps", 2.56), ("asps", 2.60), ("block", 2.60)])
def test_paper_toy_expected_length(name, expected):
    law = chain_output_law(paper_toy_model(), 2, KERNELS[name])
    assert law.expected_length == pytest.approx(expected, abs=1e-12)
    assert law.completion_error <= 1e-12


@pytest.mark.parametrize("n", [0, 1, 2, 5])
def test_sps_length_matches_leviathan_closed_form(n):
    # Context-free rows: E[len] = (1 - α^{n+1}) / (1 - α), α = Σ min(p, q).
    q = np.array([0.5, 0.25, 0.125, 0.125])
    p = np.array([0.125, 0.375, 0.25, 0.25])
    model = ToyModel(4, {}, {}, q, p)
    alpha = np.minimum(p, q).sum()
    law = chain_output_law(model, n, sps_kernel)
    assert law.expected_length == pytest.approx((1 - alpha ** (n + 1)) / (1 - alpha), abs=1e-12)


def _drafts(model: ToyModel, n: int):
    return list(enumerate_drafts(model, n))


@settings(max_examples=60)
@given(model=toy_models(depth=3), n=st.integers(0, 3), data=st.data())
def test_kernels_equal_literal_rational_references(model, n, data):
    drafts = _drafts(model, n)
    d = drafts[data.draw(st.integers(0, len(drafts) - 1))]
    q, p = rational_rows(d.q_rows), rational_rows(d.p_rows)
    for fn, ref_fn in ((sps_kernel, sps_literal), (asps_kernel, asps_literal), (block_kernel, block_literal)):
        got = fn(d.ref, d.q_rows, d.p_rows)
        want = np.array(to_float(ref_fn(d.ref, q, p)))
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12, err_msg=fn.__name__)


@settings(max_examples=60)
@given(model=toy_models(depth=4), n=st.integers(0, 4))
def test_kernel_contract_and_asps_equals_block(model, n):
    for d in _drafts(model, n):
        kernels = {k: fn(d.ref, d.q_rows, d.p_rows) for k, fn in KERNELS.items()}
        for name, kern in kernels.items():
            assert kern.shape == (n + 1, model.vocab)
            assert (kern >= 0).all(), name
            assert kern.sum() == pytest.approx(1.0, abs=1e-12), name
            for k, tok in enumerate(d.ref):
                # exact for SpS / ASpS; block only up to rounding, a few 1e-16 (module doc of tmc.chain)
                assert kern[k, tok] == 0.0 or (name == "block" and kern[k, tok] <= 1e-14), (name, k, kern[k, tok])
        np.testing.assert_allclose(kernels["asps"], kernels["block"], rtol=0, atol=1e-12)


def test_block_kernel_keeps_only_rounding_at_the_drafted_token():
    """Rows of the "tiny" relation, equal but for their last bits: after renormalisation ``p_0``
    lies above ``q_0`` at both tokens, so ``(p_0 - q_0)_+`` keeps 4e-28 at the drafted token
    while ``a_1 = 1``; ``h_1 = 0`` then lets the scan pass position 1, leaving ``tau = 0`` a
    rounding-sized probability.  (The kind of case hypothesis found in CI; in exact arithmetic
    ``K[0] = 0``.)  Position 1 has ``a_1 = 1`` and ``p_1(0) < q_1(0)``, so exactly ``h_1 > 0 = 1 − a_1`` and
    the scan stops there: the kernel now has ``K[0] = 0`` as the exact law (``block_literal``) does."""
    q = [[9.99999999999e-13, 0.9999999999990001], [9.999999999990001e-13, 0.999999999999],
         [9.99999999999e-13, 0.9999999999989999], [9.99999999999e-13, 0.9999999999989999]]
    p = [[9.99999999999e-13, 0.9999999999989999], [9.99999999999e-13, 0.9999999999990001],
         [9.99999999999e-13, 0.9999999999989999], [9.999999999990001e-13, 0.999999999999],
         [9.99999999999e-13, 0.9999999999990001]]
    ref = [0, 0, 0, 0]
    block = block_kernel(ref, q, p)
    exact = np.array(to_float(block_literal(ref, rational_rows(q), rational_rows(p))))
    assert block[0].sum() == 0.0 == exact[0].sum()
    np.testing.assert_allclose(block, exact, rtol=0, atol=1e-15)
    for fn in (sps_kernel, asps_kernel, block_kernel):
        kern = fn(ref, q, p)
        assert all(kern[k, tok] == 0.0 for k, tok in enumerate(ref)), fn.__name__
    np.testing.assert_allclose(asps_kernel(ref, q, p), block, rtol=0, atol=1e-12)


@settings(max_examples=60)
@given(model=toy_models(depth=4), n=st.integers(1, 4))
def test_completion_identity_and_asps_dominates_sps(model, n):
    laws = {k: chain_output_law(model, n, fn) for k, fn in KERNELS.items()}
    for name, law in laws.items():
        assert law.completion_error <= 1e-12, name
    # Thm 5.6 / B.9: ASpS expected length >= SpS's; block has the same law as ASpS.
    assert laws["asps"].expected_length >= laws["sps"].expected_length - 1e-12
    assert laws["block"].expected_length == pytest.approx(laws["asps"].expected_length, abs=1e-12)


@settings(max_examples=20, deadline=None)
@given(model=toy_models(max_vocab=2, depth=6), n=chain_lengths)
def test_completion_identity_on_chains_of_every_length_up_to_six(model, n):
    """DESIGN §5's chains of length 1..6 (two tokens, so 64 drafts at most): the three chain verifiers are lossless
    and ASpS still dominates SpS; the tests above go to 4 on up to 4 tokens."""
    laws = {k: chain_output_law(model, n, fn) for k, fn in KERNELS.items()}
    for name, law in laws.items():
        assert law.completion_error <= 1e-12, name
    assert laws["asps"].expected_length >= laws["sps"].expected_length - 1e-12


@settings(max_examples=60)
@given(model=toy_models(depth=4), n=st.integers(1, 4))
def test_asps_continuing_mass_dominates_sps_at_every_prefix(model, n):
    # Thm 5.5 / B.8: the mass that has accepted ref[:k] (the bonus row of the
    # kernel truncated to ref[:k]) is at least as large under ASpS.
    for d in _drafts(model, n):
        for k in range(n + 1):
            q, p = d.q_rows[:k], d.p_rows[: k + 1]
            assert asps_kernel(d.ref[:k], q, p)[k].sum() >= sps_kernel(d.ref[:k], q, p)[k].sum() - 1e-12


@settings(max_examples=60)
@given(model=toy_models(depth=1))
def test_asps_equals_sps_for_one_draft_token(model):
    # The paper (§2 and Thm B.8's base case): with one reference token the
    # maximal coupling cannot be improved, so ASpS is SpS.
    for d in _drafts(model, 1):
        np.testing.assert_allclose(
            asps_kernel(d.ref, d.q_rows, d.p_rows), sps_kernel(d.ref, d.q_rows, d.p_rows), atol=1e-12
        )


def test_asps_strictly_longer_than_sps_on_paper_toy():
    sps = chain_output_law(paper_toy_model(), 2, sps_kernel).expected_length
    asps = chain_output_law(paper_toy_model(), 2, asps_kernel).expected_length
    assert asps - sps == pytest.approx(0.04, abs=1e-12)


def test_completion_identity_flags_biased_kernel():
    # Negative control: on rejection, resample from p instead of the residual.
    def biased(ref, q_rows, p_rows):
        k = sps_kernel(ref, q_rows, p_rows)
        if len(ref):
            k[0] = k[0].sum() * np.asarray(p_rows)[0]
        return k

    law = chain_output_law(paper_toy_model(), 2, biased)
    assert law.completion_error > 1e-3


def test_asps_rejection_at_full_weight_whose_residual_rounds_away():
    """``q = [1e-300, 1.0]`` sums to 1 in floats, and ``(p − q)_+`` loses q's tiny entry: the ASpS kernel summed
    to 0 and both samplers raised AssertionError.  It now takes the residual rule there: for one draft it is
    SpS's kernel (Thm: ASpS = SpS at n = 1), and on a longer chain whose weight climbs back to 1 before such a
    step it is the limit of the same chain with ``q = [eps, 1 - eps]`` as eps -> 0 (computed at eps = 1e-10)."""
    from tmc.chain import asps_sample_from_uniforms

    q, p = np.array([[1e-300, 1.0]]), np.array([[0.0, 1.0], [0.5, 0.5]])
    kernel = asps_kernel([0], q, p)
    assert kernel.sum() == 1.0 and np.array_equal(kernel, sps_kernel([0], q, p))
    assert asps_sample_from_uniforms([0], q, p, [0.3]) == [1]
    ref = [1, 1, 0]
    q = np.array([[0.0, 1.0], [0.9996889, 3.111e-4], [1.7e-300, 1.0]])
    p = np.array([[0.9215, 0.0785], [0.6624, 0.3376], [0.0, 1.0], [0.0, 1.0]])
    near = q.copy()
    near[2] = [1e-10, 1.0 - 1e-10]
    assert asps_kernel(ref, q, p).sum() == 1.0
    np.testing.assert_allclose(asps_kernel(ref, q, p), asps_kernel(ref, near, p), atol=1e-9)
    np.testing.assert_allclose(asps_kernel(ref, near, p), block_kernel(ref, near, p), atol=1e-9)


def test_block_stop_at_full_weight_whose_residual_rounds_away():
    """After a first draft with ``p > q`` the weight is back at 1, and ``q = [1e-168, 1.0]`` next to
    ``p = [1e-281, 1.0]`` leaves no residual mass in floats: the stop test at that position was skipped, so the
    scan passed to position 0 and emitted token 0 there with probability 1.  Exactly (the float rows as rationals,
    ``block_literal``), ``h > 0 = 1 − a`` there, so the scan stops and emits ``[0, 1]``: total variation 1."""
    from tmc.chain import block_sample_from_uniforms

    ref = [0, 0]
    q = np.array([[0.3, 0.7], [1e-168, 1.0]])
    p = np.array([[0.4, 0.6], [1e-281, 1.0], [0.5, 0.5]])
    exact = np.array(to_float(block_literal(ref, rational_rows(q), rational_rows(p))))
    assert exact[1, 1] == pytest.approx(1.0, abs=1e-100)
    np.testing.assert_allclose(block_kernel(ref, q, p), exact, rtol=1e-12, atol=1e-300)
    np.testing.assert_allclose(block_kernel(ref, q, p), asps_kernel(ref, q, p), rtol=1e-12, atol=1e-300)
    assert block_sample_from_uniforms(ref, q, p, [0.5, 0.5, 0.5]) == [0, 1]


#: Rows equal but for one entry a few ulps lower in ``p`` (renormalised, ``p ≤ q`` everywhere): at full weight the
#: residual ``(p − q)_+`` is exactly 0 and so is ``1 − a``, yet ``p(y) < q(y)``.  A fuzz of such rows hit this
#: in 2792 of 20000 draws; the stop rule there (``block_forward``'s ``denom == 0`` branch) is needed by these.
ULP_DEFICIT_Q = [0.23647332296682896, 0.21234389431188713, 0.1509652469496739, 0.40021753577161007]
ULP_DEFICIT_P = [0.23647332296682896, 0.21234389431188708, 0.1509652469496739, 0.40021753577161007]


def test_block_stops_where_a_row_falls_short_of_its_draft_by_ulps():
    """First draft ``p = q`` (never rejected), then the ulp-deficit rows: exactly (``block_literal``) the scan
    stops at position 1 with probability ~2e-16 and never at 0.  Without the stop rule at full weight the
    scan passed position 1 and put that mass on position 0, rejecting a draft whose ``p`` equals its ``q``."""
    from tmc.chain import block_forward

    ref = [0, 1]
    q = np.array([ULP_DEFICIT_Q, ULP_DEFICIT_Q])
    p = np.array([ULP_DEFICIT_Q, ULP_DEFICIT_P, ULP_DEFICIT_Q])
    toks, qq, pp = check_chain(ref, q, p)
    assert float(np.maximum(pp[1] - qq[1], 0.0).sum()) == 0.0 and pp[1][1] < qq[1][1]  # the case itself
    exact = np.array(to_float(block_literal(ref, rational_rows(q), rational_rows(p))))
    assert exact[0].tolist() == [0.0] * 4 and 1e-16 < exact[1].sum() < 1e-15
    kernel = block_kernel(ref, q, p)
    assert kernel[0].tolist() == [0.0] * 4
    np.testing.assert_allclose(kernel, exact, rtol=0, atol=1e-16)
    assert block_forward(toks, qq, pp)[1][1] == 0.0  # log stop at position 1
    np.testing.assert_allclose(kernel.sum(axis=1), sps_kernel(ref, q, p).sum(axis=1), rtol=0, atol=1e-30)
    # ASpS: at full weight its row is SpS's residual (D = 0 here left the row at 0: the kernel summed to
    # 1 − 2.6e-16); SpS has no such branch
    for name, fn, literal in (("asps", asps_kernel, asps_literal), ("sps", sps_kernel, sps_literal)):
        want = np.array(to_float(literal(ref, rational_rows(q), rational_rows(p))))
        got = fn(ref, q, p)
        assert got[0].tolist() == [0.0] * 4 and got[1].sum() > 1e-16, name
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-16, err_msg=name)
        assert abs(got.sum() - 1.0) <= 2.3e-16, name


def test_chain_kernels_at_the_subnormal_edge_equal_exact_rationals():
    """Two valid inputs at the edge of the float range, against the literal exact-rational implementations:
    a draft of ``p = 0`` (weight 0), then a draft of subnormal ``q``: ``p / q`` overflowed to +inf,
    ``−inf + inf`` was NaN and ``min(0, NaN)`` a weight of 1, so ASpS and block accepted both (total variation 1);
    a drafted ``q = 5e-324`` with ``p = 0``: ``q / 2`` rounds to 0, so ``log1p(−1)`` raised a domain error."""
    cases = [([0, 1], [[0.5, 0.5], [1.0, 1e-310]], [[0.0, 1.0], [0.5, 0.5], [0.5, 0.5]]),
             ([0], [[5e-324, 1.0]], [[0.0, 1.0], [0.5, 0.5]])]
    literals = {"sps": sps_literal, "asps": asps_literal, "block": block_literal}
    for ref, q, p in cases:
        for name, kernel in KERNELS.items():
            exact = np.array(to_float(literals[name](ref, rational_rows(q), rational_rows(p))))
            np.testing.assert_allclose(kernel(ref, q, p), exact, rtol=1e-12, atol=1e-300, err_msg=name)
            assert exact[0].tolist() == [0.0, 1.0]


#: Drafts whose token lies below the rounding of an entry near 1.0 that both rows share, found by an audit
#: against exact rationals: ``1.0 − 1.0`` is 0 where the rows stand for ``1 − 1e-17`` and ``1 − 2e-30``, and the
#: residual (or the stop test, or the weight) went elsewhere: total variation about 1 for the draft.
SHARED_DOMINANT_CHAINS = [
    ([0], [[1e-17, 0.0, 1.0]], [[1e-30, 1e-30, 1.0], [1 / 3, 1 / 3, 1 / 3]]),
    ([3], [[0.0, 0.0, 1.0, 1e-168]], [[1e-300, 0.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]]),
    ([2], [[0.0, 1.0, 1e-281]], [[5e-324, 1.0, 0.0], [0.2, 0.3, 0.5]]),
    ([0, 1], [[1.0, 0.0], [1.0, 1e-30]], [[1.0, 1e-20], [1.0, 0.0], [0.5, 0.5]]),
]


@pytest.mark.parametrize(("ref", "q", "p"), SHARED_DOMINANT_CHAINS)
def test_chain_kernels_beside_a_shared_entry_near_one_equal_exact_rationals(ref, q, p):
    """Each kernel equals its literal exact-rational implementation on the float rows (renormalised exactly),
    entry by entry to 1e-9 of its size: the difference at a token both rows hold above 1/2 is formed from
    the rest of the rows (tmc.residual.row_difference)."""
    literals = {"sps": sps_literal, "asps": asps_literal, "block": block_literal}
    for name, kernel in KERNELS.items():
        exact = np.array(to_float(literals[name](ref, rational_rows(q), rational_rows(p))))
        np.testing.assert_allclose(kernel(ref, q, p), exact, rtol=1e-9, atol=1e-300, err_msg=name)
