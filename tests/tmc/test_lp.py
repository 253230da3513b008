"""Tests of the optimal lossless-verification LP (DESIGN.md §6).

Expected values come from outside the LP and outside ``tmc.chain``: the
literal exact-rational references of SpS, ASpS (Algorithm 1) and block
verification in ``tests/tmc/reference.py``, enumerated over every draft chain
in ``fractions.Fraction`` (:func:`literal_expected_length`); the closed form
of Hu et al. (ICLR 2025) for one level of ``k`` drafts; hand computations;
and the paper toy example's 2.60 / 2.56 (TMC paper Table 3, issue #2).  LP
values carry the solver's tolerance, so they are compared within
``TOL = 1e-6``.
"""

from __future__ import annotations

from fractions import Fraction
from itertools import combinations, permutations, product

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tmc import paper_toy_model
from tmc.enumeration import completion_error
from tmc.lp import (
    DraftOutcome,
    LPResult,
    build_lp,
    chain_optimal_length,
    chain_outcomes,
    hu_closed_form_acceptance,
    one_level_draft_law,
    one_level_outcomes,
    optimal_length,
    solve_lp,
)
from tmc.toy import ToyModel
from verification.strategies import toy_models

from .reference import (
    asps_literal,
    block_literal,
    literal_expected_length,
    rational_model,
    sps_literal,
)

TOL = 1e-6  # HiGHS's feasibility tolerance is 1e-7; values are compared at 1e-6
CHAIN_CASES = [(vocab, n, seed) for vocab in (2, 3, 4) for n in (1, 2, 3) for seed in range(4)]


def _literal_exact(model: ToyModel, n: int, literal, prefix: tuple[int, ...] = ()) -> Fraction:
    """Exact E[len] of a literal reference verifier over all draft chains (reference.py)."""
    q_row, p_row = rational_model(model, prefix)
    return literal_expected_length(q_row, p_row, model.vocab, n, literal)


def _literal(model: ToyModel, n: int, literal, prefix: tuple[int, ...] = ()) -> float:
    return float(_literal_exact(model, n, literal, prefix))


def _check_optimum(model: ToyModel, result: LPResult, outcomes: list[DraftOutcome]) -> None:
    """The LP's optimal law is a lossless verifier: non-negative, per-draft mass w_d, complete."""
    for outcome, law in zip(outcomes, result.joint):
        assert all(mass >= -1e-9 for mass in law.values())
        assert sum(law.values()) == pytest.approx(outcome.weight, abs=TOL)
    assert all(mass >= -1e-9 for mass in result.output_law.values())
    assert sum(result.output_law.values()) == pytest.approx(1.0, abs=TOL)
    assert completion_error(model, result.output_law, result.length) <= TOL
    mean = sum(len(s) * m for s, m in result.output_law.items())
    assert mean == pytest.approx(result.expected_length, abs=TOL)


# ------------------------------------------------------------------ chains


def test_chain_lp_paper_toy_equals_asps_value():
    # Issue #2 and TMC paper Table 3: ASpS reaches 2.60 on the paper's toy
    # model (n = 2), SpS 2.56.  The literal references reproduce the paper's
    # figures, and the LP (the best any lossless verifier can do) is 2.60.
    model = paper_toy_model()
    asps, sps = _literal(model, 2, asps_literal), _literal(model, 2, sps_literal)
    assert asps == pytest.approx(2.60, abs=1e-12)
    assert _literal(model, 2, block_literal) == pytest.approx(2.60, abs=1e-12)
    assert sps == pytest.approx(2.56, abs=1e-12)
    result = chain_optimal_length(model, 2)
    assert result.expected_length == pytest.approx(2.60, abs=TOL)
    assert result.expected_length - sps == pytest.approx(0.04, abs=TOL)
    _check_optimum(model, result, chain_outcomes(model, 2))


def test_chain_lp_sps_gap_by_hand():
    # Stationary V = 2 model: q = (1/2, 1/2), p = (1/3, 2/3) after every
    # prefix, n = 2.  Per-token ratios p/q: token 0 -> 2/3, token 1 -> 4/3.
    # SpS accepts each draft w.p. β = Σ min(p, q) = 5/6, so
    #   E_SpS = 1 + β + β² = 91/36.
    # Block verification (= ASpS) with a_i = min(1, a_{i-1} p(y_i)/q(y_i)),
    # E[len] = 1 + E[τ], each draft chain w.p. 1/4:
    #   (1,1): a = (1, 1)                                   -> E τ = 2
    #   (1,0): a = (1, 2/3), stop at 1 surely (h_1 = 1/6)   -> E τ = 2·2/3 + 1/3 = 5/3
    #   (0,1): a = (2/3, 8/9), h_1 = 0 so no stop at 1      -> E τ = 2·8/9 = 16/9
    #   (0,0): a = (2/3, 4/9), h_1 = 0                      -> E τ = 2·4/9 = 8/9
    #   E_ASpS = 1 + (2 + 5/3 + 16/9 + 8/9)/4 = 1 + 57/36 = 31/12.
    # SpS loses on (0,1): it rejects token 0 w.p. 1/3 and ends the step,
    # while the path ratio P(0,1)/Q(0,1) = (2/9)/(1/4) = 8/9 lets ASpS keep
    # the whole block w.p. 8/9 > 2/3.  So the gap is 31/12 − 91/36 = 1/18 > 0.
    half = [Fraction(1, 2), Fraction(1, 2)]
    thirds = [Fraction(1, 3), Fraction(2, 3)]
    exact = {
        lit: literal_expected_length(lambda path: half, lambda path: thirds, 2, 2, lit)
        for lit in (sps_literal, asps_literal, block_literal)
    }
    assert exact[sps_literal] == Fraction(91, 36)
    assert exact[asps_literal] == Fraction(31, 12)
    assert exact[block_literal] == Fraction(31, 12)
    model = ToyModel(2, {}, {}, np.array([0.5, 0.5]), np.array([1 / 3, 2 / 3]))
    result = chain_optimal_length(model, 2)
    assert result.expected_length == pytest.approx(31 / 12, abs=TOL)
    assert result.expected_length - 91 / 36 == pytest.approx(1 / 18, abs=TOL)
    _check_optimum(model, result, chain_outcomes(model, 2))


@pytest.mark.parametrize(("vocab", "n", "seed"), CHAIN_CASES)
def test_chain_lp_equals_literal_asps_and_block_bounds_sps(vocab, n, seed):
    # LP and the literal Algorithm 1 / block references are independent
    # computations of the same number (measured: they agree to 2e-15).
    model = ToyModel.random(vocab, n, np.random.default_rng(seed))
    lp = chain_optimal_length(model, n).expected_length
    assert lp == pytest.approx(_literal(model, n, asps_literal), abs=TOL)
    assert lp == pytest.approx(_literal(model, n, block_literal), abs=TOL)
    sps_gap = lp - _literal(model, n, sps_literal)
    assert sps_gap >= -TOL  # no lossless verifier beats the LP
    if n == 1:
        # One draft token: any lossless verifier emits the drafted token with
        # probability at most Σ_y min(p(y), q(y)) (coupling inequality), and
        # SpS reaches it, so SpS is optimal and the gap is 0.
        assert sps_gap == pytest.approx(0.0, abs=TOL)


@settings(max_examples=30)
@given(model=toy_models(depth=3), n=st.integers(1, 3))
def test_chain_lp_equals_literal_asps_on_hypothesis_models(model, n):
    result = chain_optimal_length(model, n)
    assert result.expected_length == pytest.approx(_literal(model, n, asps_literal), abs=TOL)
    assert _literal(model, n, sps_literal) <= result.expected_length + TOL
    _check_optimum(model, result, chain_outcomes(model, n))


@pytest.mark.parametrize("seed", range(3))
def test_chain_lp_optimum_is_lossless(seed):
    model = ToyModel.random(3, 3, np.random.default_rng(100 + seed))
    _check_optimum(model, chain_optimal_length(model, 3), chain_outcomes(model, 3))


def test_chain_lp_after_a_prefix_equals_literal_asps():
    model = ToyModel.random(3, 4, np.random.default_rng(7))
    prefix = (1,)
    result = optimal_length(model, chain_outcomes(model, 2, prefix), prefix)
    expected = _literal(model, 2, asps_literal, prefix)
    assert result.expected_length == pytest.approx(expected, abs=TOL)
    assert completion_error(model, result.output_law, result.length, prefix) <= TOL


def test_lp_longer_completion_length_gives_same_optimum():
    model = ToyModel.random(2, 3, np.random.default_rng(3))
    outcomes = chain_outcomes(model, 2)
    short = optimal_length(model, outcomes)
    longer = optimal_length(model, outcomes, length=short.length + 1)
    assert longer.expected_length == pytest.approx(short.expected_length, abs=TOL)
    assert short.expected_length == pytest.approx(_literal(model, 2, asps_literal), abs=TOL)


def test_lp_deduplicates_repeated_paths():
    model = paper_toy_model()
    once = optimal_length(model, [DraftOutcome(1.0, ((0,),))])
    twice = optimal_length(model, [DraftOutcome(1.0, ((), (0,), (0,)))])
    assert twice.n_variables == once.n_variables
    # Hand value: the draft is token 0 surely, so a lossless verifier emits
    # 0 (then a bonus token) at most w.p. p(0) = 0.3: E[len] = 1.3.
    assert once.expected_length == pytest.approx(1.3, abs=TOL)
    assert twice.expected_length == pytest.approx(1.3, abs=TOL)


def test_lp_leaves_out_outputs_of_target_probability_zero():
    # p(1) = 0 at the root: (1,) and everything below it get no variable.
    q = np.array([0.5, 0.5])
    p = np.array([1.0, 0.0])
    model = ToyModel(2, {}, {(): p}, q, np.array([0.5, 0.5]))
    result = chain_optimal_length(model, 1)
    assert all(s[0] == 0 for s in result.output_law)
    # Hand value: the draft is 0 with probability 1/2 and then always accepted.
    assert result.expected_length == pytest.approx(1.5, abs=TOL)


# -------------------------------------------------------- tiny probabilities


def _tiny_model() -> ToyModel:
    """Draft ≈ token 0, target ≈ token 1, with 1e-12 on the other token."""
    eps = 1e-12
    return ToyModel(2, {}, {}, np.array([1 - eps, eps]), np.array([eps, 1 - eps]))


def test_lp_solves_tiny_probabilities():
    # By hand, with ε = 1e-12, q = (1 − ε, ε), p = (ε, 1 − ε) at every prefix:
    # n = 1: E = 1 + Σ min(p, q) = 1 + 2ε.
    # n = 2 (block verification, r = ε/(1 − ε) the ratio of token 0):
    #   (0,0) w (1−ε)²: a = (r, r²), h_1 = 0          -> E τ = 2r²
    #   (0,1) w ε(1−ε): a = (r, 1)                    -> E τ = 2
    #   (1,0) w ε(1−ε): a = (1, r), stop at 1 surely  -> E τ = 1 + r
    #   (1,1) w ε²:     a = (1, 1)                    -> E τ = 2
    #   E = 1 + 2ε² + 2ε(1−ε) + ε + 2ε² = 1 + 3ε + 2ε².
    # (The float rows are read exactly and renormalised, which moves ε by
    # ~1e-16 relative: far inside rel=1e-9.)
    model = _tiny_model()
    eps = 1e-12
    by_hand = {1: 2 * eps, 2: 3 * eps + 2 * eps**2}
    for n, excess in by_hand.items():
        assert float(_literal_exact(model, n, asps_literal) - 1) == pytest.approx(excess, rel=1e-9)
    for n in (1, 2, 3):
        result = chain_optimal_length(model, n)
        assert result.expected_length == pytest.approx(_literal(model, n, asps_literal), abs=TOL)


@settings(max_examples=15)
@given(model=toy_models(depth=3, relation="tiny"), n=st.integers(1, 3))
def test_lp_equals_literal_asps_on_tiny_hypothesis_models(model, n):
    result = chain_optimal_length(model, n)
    assert result.expected_length == pytest.approx(_literal(model, n, asps_literal), abs=TOL)


def test_lp_naive_scaling_fails_on_tiny_probabilities():
    # Regression for the scaling (module doc of tmc.lp): §6's literal rows
    # Σ x / P(s) = 1 have a coefficient 1 / P((0, 0)) = 1e24 here, and HiGHS
    # refuses the model; the unit and conditional forms solve it.
    model = _tiny_model()
    outcomes = chain_outcomes(model, 1)
    with pytest.raises(RuntimeError, match="HiGHS did not solve"):
        solve_lp(build_lp(model, outcomes, scaling="naive"))
    for scaling in ("unit", "conditional"):
        result = solve_lp(build_lp(model, outcomes, scaling=scaling))
        assert result.expected_length == pytest.approx(1.0, abs=TOL)


def test_lp_conditional_scaling_fails_where_unit_solves():
    # Regression for the unit form: with P(t | s) rows and right-hand sides
    # P(t) (down to 2e-10 here), HiGHS 1.12 declares this feasible LP
    # infeasible with and without presolve; the unit form solves it.  Only
    # one of 1600 random chain models (V <= 4, n <= 4) did this, so the test
    # is skipped if a future HiGHS solves it.
    model = ToyModel.random(4, 4, np.random.default_rng(337))
    outcomes = chain_outcomes(model, 4)
    result = solve_lp(build_lp(model, outcomes))
    assert result.expected_length == pytest.approx(_literal(model, 4, asps_literal), abs=TOL)
    try:
        solve_lp(build_lp(model, outcomes, scaling="conditional"))
    except RuntimeError as err:
        assert "infeasible" in str(err)
    else:
        pytest.skip("this HiGHS solves the conditional form too")


# ------------------------------------------------- one level of k drafts


def _draft_law_by_hand(q: np.ndarray, k: int, draws: str) -> dict[tuple[int, ...], float]:
    """Joint law of k ordered draws from q, written out independently of tmc.lp."""
    law: dict[tuple[int, ...], float] = {}
    tokens = [a for a in range(q.shape[0]) if q[a] > 0]
    tuples = product(tokens, repeat=k) if draws == "iid" else permutations(tokens, k)
    for tup in tuples:
        prob = 1.0
        for i, tok in enumerate(tup):
            removed = 0.0 if draws == "iid" else sum(q[t] for t in tup[:i])
            prob *= q[tok] / (1.0 - removed)
        law[tup] = prob
    return law


ONE_LEVEL_CASES = [
    (vocab, k, draws, seed)
    for vocab in (2, 3, 4)
    for k in (1, 2, 3)
    for draws in ("iid", "swor")
    for seed in range(2)
    if draws == "iid" or k <= vocab
]


@pytest.mark.parametrize(("vocab", "k", "draws", "seed"), ONE_LEVEL_CASES)
def test_one_level_lp_equals_hu_closed_form(vocab, k, draws, seed):
    # Without replacement needs k tokens with q > 0: no exact zeros then.
    zero_prob = 0.0 if draws == "swor" else 0.2
    model = ToyModel.random(vocab, 1, np.random.default_rng(seed), zero_prob=zero_prob)
    q = model.q(())
    by_hand = _draft_law_by_hand(q, k, draws)
    law = one_level_draft_law(model, k, draws)
    assert law.keys() == by_hand.keys()
    assert all(law[t] == pytest.approx(by_hand[t], abs=1e-12) for t in law)
    result = optimal_length(model, one_level_outcomes(model, k, draws))
    expected = 1.0 + hu_closed_form_acceptance(model.p(()), by_hand)
    assert result.expected_length == pytest.approx(expected, abs=TOL)


@pytest.mark.parametrize("seed", range(3))
def test_one_level_iid_closed_form_uses_q_of_h_to_the_k(seed):
    # For i.i.d. drafts Q(all ∈ H) = q(H)^k: evaluate the min over H directly.
    rng = np.random.default_rng(seed)
    vocab, k = 4, 3
    p, q = rng.dirichlet(np.ones(vocab)), rng.dirichlet(np.ones(vocab))
    direct = 1.0 + min(
        sum(p[a] for a in h) - sum(q[a] for a in h) ** k
        for r in range(vocab + 1)
        for h in combinations(range(vocab), r)
    )
    joint = _draft_law_by_hand(q, k, "iid")
    assert hu_closed_form_acceptance(p, joint) == pytest.approx(direct, abs=1e-12)


def test_one_level_single_draft_is_sum_of_min():
    # k = 1: the optimum is SpS's acceptance Σ min(p, q) = 0.2 + 0.3 + 0 = 0.5.
    q = np.array([0.2, 0.3, 0.5])
    p = np.array([0.5, 0.5, 0.0])
    model = ToyModel(3, {}, {}, q, p)
    result = optimal_length(model, one_level_outcomes(model, 1, "iid"))
    assert result.expected_length == pytest.approx(1.5, abs=TOL)
    joint = {(0,): 0.2, (1,): 0.3, (2,): 0.5}
    assert hu_closed_form_acceptance(p, joint) == pytest.approx(0.5, abs=1e-12)


def test_hu_closed_form_by_hand_two_iid_drafts():
    # p = one-hot on token 0, q uniform on {0, 1}, two i.i.d. drafts: 0 is
    # drafted with probability 1 − 1/4, and then it can always be emitted.
    joint = {(0, 0): 0.25, (0, 1): 0.25, (1, 0): 0.25, (1, 1): 0.25}
    assert hu_closed_form_acceptance([1.0, 0.0], joint) == pytest.approx(0.75, abs=1e-12)


# ---------------------------------------------------------------- bad input


def test_lp_rejects_bad_outcomes():
    model = paper_toy_model()
    good = ((), (0,))
    cases = [
        ([], "empty"),
        ([DraftOutcome(-0.5, good), DraftOutcome(1.5, good)], "weight"),
        ([DraftOutcome(0.5, good), DraftOutcome(0.4, good)], "sum"),
        ([DraftOutcome(1.0, ((3,),))], "outside"),
        ([DraftOutcome(1.0, ((0, 1),))], "parent"),
        ([DraftOutcome(float("nan"), good)], "finite"),
        # audit of 2026-11-26: a token 1.9 was read as 1 (another optimum), a text weight raised TypeError
        ([DraftOutcome(0.5, ((1.9,),)), DraftOutcome(0.5, ((1,),))], r"token must be an integer, got 1.9"),
        ([DraftOutcome("0.5", good), DraftOutcome(0.5, good)], r"outcomes\[0\].weight has a non-numeric entry"),
    ]
    for outcomes, message in cases:
        with pytest.raises(ValueError, match=message):
            optimal_length(model, outcomes)


def test_lp_rejects_short_length_and_unknown_scaling():
    model = paper_toy_model()
    outcomes = chain_outcomes(model, 2)
    with pytest.raises(ValueError, match="shorter"):
        optimal_length(model, outcomes, length=2)
    with pytest.raises(ValueError, match="scaling"):
        build_lp(model, outcomes, scaling="log")
    for length in (3.5, "3", True):  # 2.5 enumerated leaves for ever (no path has a fractional length)
        with pytest.raises(ValueError, match="length must be an integer"):
            build_lp(model, outcomes, length=length)


def test_one_level_rejects_bad_draws():
    model = ToyModel(3, {}, {}, np.array([0.5, 0.5, 0.0]), np.array([1 / 3, 1 / 3, 1 / 3]))
    with pytest.raises(ValueError, match="draws"):
        one_level_outcomes(model, 2, "greedy")
    with pytest.raises(ValueError, match="without replacement"):
        one_level_outcomes(model, 3, "swor")
    with pytest.raises(ValueError, match="k must be"):
        one_level_outcomes(model, -1, "iid")


def test_hu_closed_form_rejects_bad_joint():
    with pytest.raises(ValueError, match="sums to"):
        hu_closed_form_acceptance([0.5, 0.5], {(0,): 0.5})
    with pytest.raises(ValueError, match="outside"):
        hu_closed_form_acceptance([0.5, 0.5], {(2,): 1.0})
    with pytest.raises(ValueError, match="finite"):
        hu_closed_form_acceptance([0.5, 0.5], {(0,): -1.0, (1,): 2.0})
    with pytest.raises(ValueError, match="p_row"):
        hu_closed_form_acceptance([0.5, 0.6], {(0,): 1.0})
    with pytest.raises(ValueError, match="must be a non-empty tuple"):  # TypeErrors before
        hu_closed_form_acceptance([0.5, 0.5], {0: 0.5, 1: 0.5})
    with pytest.raises(ValueError, match="token must be an integer"):
        hu_closed_form_acceptance([0.5, 0.5], {(0, 1.5): 0.5, (1, 1): 0.5})
    with pytest.raises(ValueError, match="non-numeric entry"):
        hu_closed_form_acceptance([0.5, 0.5], {(0,): "0.5", (1,): 0.5})


@pytest.mark.parametrize(
    "p_row, joint, message",
    [
        ([True, False], {(0,): 1.0}, r"p_row must hold real numbers, got dtype bool"),  # was read as [1, 0]
        ([1.0, False], {(0,): 1.0}, r"p_row\[1\] is a boolean; expected real numbers"),
        ("ab", {(0,): 1.0}, r"p_row must hold real numbers"),  # numpy's message named no argument
        ([0.5, 0.5j], {(0,): 1.0}, r"p_row has complex entries"),  # was a TypeError
        ([[0.5, 0.5]], {(0,): 1.0}, r"p_row must be a 1-D probability row, got shape \(1, 2\)"),
        ([0.5, 0.5], {}, r"joint must be a non-empty mapping"),
        ([0.5, 0.5], [(0,), (1,)], r"joint must be a non-empty mapping"),  # was an AttributeError
        ([0.5, 0.5], {(0,): 0.5, (0, 1): 0.5}, r"joint keys must all hold k tokens .* \[1, 2\]"),
    ],
)
def test_hu_closed_form_names_a_bad_p_row_or_joint(p_row, joint, message):
    with pytest.raises(ValueError, match=message):
        hu_closed_form_acceptance(p_row, joint)
