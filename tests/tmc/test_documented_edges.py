"""Edges of the tmc core that a mutation audit (2026-11-28) changed without any test failing.

Each case is a documented rule of its function, with the expected value derived by hand in the comment
(never read off the code): a tolerance, a refusal, a tie-break, an order, a boundary of the unit interval.
Each was checked to fail on the audit's mutant of the line it pins (the survivor's id in brackets).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from tmc import drafts, laws, lp
from tmc import prefix as px
from tmc.noise import categorical
from tmc.order import check_product_form, check_sub_distribution
from tmc.residual import acceptance_probability
from tmc.toy import ToyModel
from tmc.tree import TreeDistribution, TreeSpace

ONE_LEVEL = TreeSpace.full(2, 1)


def _dist(space: TreeSpace, masses: dict[tuple[int, ...], float]) -> TreeDistribution:
    return TreeDistribution.from_point_masses(space, masses)


# --- order ----------------------------------------------------------------------------------------


def test_order_checks_hold_to_their_default_tolerance_of_1e_12() -> None:
    """[O6, O7] Root children 0.5 + 1e-8 : 0.5 - 1e-8 against 0.5 : 0.5, no termination mass to absorb the
    difference: not a sub-distribution and not of product form; a default tolerance of 1e-6 said both held."""
    p2 = _dist(ONE_LEVEL, {(0,): 0.5, (1,): 0.5})
    p1 = _dist(ONE_LEVEL, {(0,): 0.5 + 1e-8, (1,): 0.5 - 1e-8})
    assert not check_sub_distribution(p1, p2).holds
    assert not check_product_form(p1, p2).holds


def test_product_form_witness_names_the_cross_product_clause_on_a_tie() -> None:
    """[O4] At the root, P1 children 0.5 : 0.5 (no stop) and P2 stops with 0.25, children 0.625 : 0.125: the
    cross gap |0.5 * 0.125 - 0.5 * 0.625| = 0.25 equals the stop gap 0.25 - 0 (all dyadic, so exact); the
    witness names the children (0, 1), not the termination clause."""
    p1 = _dist(ONE_LEVEL, {(0,): 0.5, (1,): 0.5})
    p2 = _dist(ONE_LEVEL, {(): 0.25, (0,): 0.625, (1,): 0.125})
    result = check_product_form(p1, p2)
    assert not result.holds and result.worst_violation == 0.25
    assert result.witness is not None
    assert (result.witness.node, result.witness.children) == ((), (0, 1))


# --- prefix samplers -------------------------------------------------------------------------------


def test_prefix_checks_refuse_negative_mass_skip_prefixes_off_the_support_and_take_the_tolerance() -> None:
    """[P1] a kernel with an output of probability -0.2 (total still 1) is no sampler; [P5] a prefix outside
    supp(P) is skipped, as the docstring says (P = point mass at (0,), prefix (1,)); [P6] the caller's ``tol``
    reaches the check: a law 1e-8 off the target passes at tol = 1e-6."""
    negative = lambda pre: {(0,): 0.6, (1,): 0.6, (): -0.2}  # noqa: E731
    assert not px.check_prefix_sampler(negative, ONE_LEVEL, [()]).holds
    point = _dist(ONE_LEVEL, {(0,): 1.0})
    assert px.check_prefix_sub_sampler(px.ancestral_step_kernel(point, 1), point, [(), (1,)]).holds
    uniform = _dist(ONE_LEVEL, {(0,): 0.5, (1,): 0.5})
    near = lambda pre: {(0,): 0.5 + 1e-8, (1,): 0.5 - 1e-8} if pre == () else {pre: 1.0}  # noqa: E731
    assert px.check_prefix_sub_sampler(near, uniform, [()], tol=1e-6).holds


def test_walks_split_the_unit_interval_half_open_and_refuse_a_rule_above_one() -> None:
    """[P9] child 0 takes u in [0, 0.5), so u = 0.5 stops at the root; [P17] step probabilities summing to
    1.4 are no sub-probability."""
    assert px._pick({0: 0.5}, 0.5) is None

    class Half:
        def random(self) -> float:
            return 0.5

    assert px.walk_sampler(lambda pre, node: {0: 0.5} if node == () else {})(Half(), ()) == ()
    with pytest.raises(ValueError):
        px.walk_kernel(lambda pre, node: {0: 0.7, 1: 0.7} if node == () else {})(())


def test_tempered_kernel_is_ancestral_at_one_and_reweights_by_p_to_the_one_over_t() -> None:
    """[P12] at T = 1 the tempered kernel is the ancestral one, termination included ({(): .5, (0,): .25,
    (1,): .25} from the root); [P13] at T = 2 root children (0.8, 0.2) reweight to sqrt: 2/3 and 1/3."""
    stops = _dist(ONE_LEVEL, {(): 0.5, (0,): 0.25, (1,): 0.25})
    got = px.tempered_step_kernel(stops, 1.0)(())
    assert got == pytest.approx({(): 0.5, (0,): 0.25, (1,): 0.25}, abs=1e-15)
    assert got == pytest.approx(px.ancestral_step_kernel(stops, 1)(()), abs=1e-15)
    hot = px.tempered_step_kernel(_dist(ONE_LEVEL, {(0,): 0.8, (1,): 0.2}), 2.0)(())
    assert hot == pytest.approx({(0,): 2 / 3, (1,): 1 / 3}, abs=1e-12)  # sqrt(.8) : sqrt(.2) = 2 : 1


# --- tree distributions ----------------------------------------------------------------------------


def test_conditionals_within_prob_tol_are_renormalised_and_beyond_it_refused() -> None:
    """[T6] conditionals summing to 1 + 5e-10 (within the 1e-9 tolerance) are renormalised, so a depth-3 chain
    keeps total mass 1; [T7] 1 + 1e-6 is refused; [T8] the uniform law on one level visits 3 nodes, so
    ``max_nodes=2`` is refused."""
    chain = TreeSpace.full(1, 3)
    masses = dict(TreeDistribution.from_conditionals(chain, lambda s: {0: 1 + 5e-10}).masses)
    assert math.fsum(masses.values()) <= 1.0 and masses[(0, 0, 0)] == pytest.approx(1.0, abs=1e-15)
    with pytest.raises(ValueError):
        TreeDistribution.from_conditionals(ONE_LEVEL, lambda s: {0: 0.5, 1: 0.5 + 1e-6})
    with pytest.raises(ValueError):
        TreeDistribution.from_conditionals(ONE_LEVEL, lambda s: {0: 0.5, 1: 0.5}, max_nodes=2)
    assert TreeDistribution.from_conditionals(ONE_LEVEL, lambda s: {0: 0.5, 1: 0.5}, max_nodes=3)


def test_support_order_pseudo_leaves_negative_masses_and_points_off_the_space() -> None:
    """[T11] ``support()`` lists shorter paths first, then lexicographically; [T14] a root terminating with
    1 - 1e-13 is pseudo leaf-only (1 within 1e-12); [T15] a negative point mass is refused even when the total
    is 1; [T18] ``point_mass`` of a path outside the space (token 5, or below the depth cut) is refused."""
    two = TreeSpace.full(2, 2)
    assert _dist(two, {(1, 0): 0.5, (0,): 0.5}).support() == ((), (0,), (1,), (1, 0))  # every reached node
    assert _dist(ONE_LEVEL, {(): 1 - 1e-13, (0,): 1e-13}).is_pseudo_leaf_only()
    with pytest.raises(ValueError):
        _dist(ONE_LEVEL, {(): -0.2, (0,): 0.6, (1,): 0.6})
    point = _dist(ONE_LEVEL, {(0,): 1.0})
    for path in ((5,), (0, 0)):
        with pytest.raises(ValueError):
            point.point_mass(path)


def test_mass_keys_naming_the_same_path_add_up() -> None:
    """[T20] ``(0,)`` and ``range(1)`` are different keys for the one path (0,): their masses 0.5 and 0.5 add
    to 1 (keeping only the last would leave a total of 0.5, which is refused)."""
    dist = _dist(ONE_LEVEL, {(0,): 0.5, range(1): 0.5})  # type: ignore[dict-item]
    assert dict(dist.masses) == {(0,): 1.0}


# --- drafts, laws, residual ------------------------------------------------------------------------

Q_TIED = np.array([0.4, 0.2, 0.4])
TIED = ToyModel(3, {}, {}, draft_default=Q_TIED, target_default=[0.3, 0.3, 0.4])


def test_top_k_draws_break_ties_to_the_lower_id_and_weigh_one() -> None:
    """[D8] ``sample_children`` of q = (.4, .2, .4), width 1, top-k: token 0 (ties to the lower id); [D9] a top-k
    tree is deterministic: weight 1, as ``tree_drafts`` lists it; [D6] only nodes above the last depth get q rows,
    so a sampled top-k tree is the enumerated one (for widths (1,): the root's row only)."""
    assert list(drafts.sample_children(Q_TIED, 1, "topk", np.random.default_rng(0))) == [0]
    sampled = drafts.sample_tree_draft(TIED, [2, 1], "topk", np.random.default_rng(0))
    (listed,) = drafts.tree_drafts(TIED, [2, 1], "topk")
    assert sampled.weight == 1.0 == listed.weight and sampled.tree == listed.tree
    assert sorted(drafts.tree_drafts(TIED, [1], "topk")[0].tree.q_rows) == [-1]


def test_laws_refuse_long_outputs_count_impossible_outputs_in_full_and_read_the_prefix() -> None:
    """[L2] an output longer than ``length`` is refused, not dropped; [L3] an output with P(s) = 0 counts with
    its whole mass: all mass on token 2 where p(2) = 0 gives completion error 1; [L8, L9] with prefix (1,) the
    law p(. | 1) = (.5, .5) emitted exactly has error 0 and TV 0 (p(. | ()) = (.9, .1) would give 0.4);
    [L5] V = 2, depth 1: 2 + 4 = 6 completion cells."""
    zero = ToyModel(3, {}, {}, draft_default=[0.25, 0.25, 0.5], target_default=[0.5, 0.5, 0.0])
    with pytest.raises(ValueError):
        laws.completed_law(zero, {(0, 0): 1.0}, 1)
    assert laws.completion_error(zero, {(2,): 1.0}, 2) == 1.0
    rows = ToyModel(2, {}, {(): [0.9, 0.1], (0,): [0.5, 0.5], (1,): [0.5, 0.5]}, draft_default=[0.5, 0.5],
                    target_default=[0.5, 0.5])
    exact = {(0,): 0.5, (1,): 0.5}
    assert laws.summarise(rows, exact, 1, 1, (1,)).completion_error == pytest.approx(0.0, abs=1e-15)
    assert laws.completion_tv(rows, exact, 1, (1,)) == pytest.approx(0.0, abs=1e-15)
    assert laws.completion_cells(2, 1) == 6


def test_acceptance_probability_with_no_law_and_no_room_is_zero() -> None:
    """[R3] law(x) = 0 counts as 1 when r(x) > 0 and 0 otherwise: (r, law) = (0, 0) gives 0."""
    assert acceptance_probability(0.0, 0.0) == 0.0
    assert acceptance_probability(0.5, 0.0) == 1.0


# --- noise, LP -------------------------------------------------------------------------------------


def test_inverse_cdf_fallback_takes_the_last_positive_weight_and_refuses_no_mass() -> None:
    """[N5] a subnormal total (5e-324): u * total rounds up to the total, and the fallback must pick the last
    token of positive weight (0), never the zero-weight 1; [N6] all-zero weights are a ``ValueError``."""
    assert categorical(np.array([5e-324, 0.0]), 0.9) == 0
    with pytest.raises(ValueError):
        categorical(np.array([0.0, 0.0]), 0.5)


def test_lp_refuses_weights_and_joints_that_are_not_laws() -> None:
    """[LP4] draft outcomes weighing 1.001 in all; [LP16] a joint summing to 1.0005: both refused, not solved."""
    m = ToyModel(2, {}, {}, draft_default=[0.5, 0.5], target_default=[0.7, 0.3])
    with pytest.raises(ValueError):
        lp.build_lp(m, [lp.DraftOutcome(0.5005, ((0,),)), lp.DraftOutcome(0.5005, ((1,),))])
    with pytest.raises(ValueError):
        lp.hu_closed_form_acceptance([0.5, 0.5], {(0,): 0.5005, (1,): 0.5})


def _three_token_model() -> ToyModel:
    """q uniform over 3 tokens, p = (0.5, 0, 0.5) at every prefix: token 1 never occurs under the target."""
    return ToyModel(3, {}, {}, draft_default=np.full(3, 1 / 3), target_default=[0.5, 0.0, 0.5])


def test_lp_rows_cover_exactly_the_paths_the_target_can_produce() -> None:
    """[LP5] The completion rows are the length-L paths with P(t) > 0: with p = (0.5, 0, 0.5) and one-token
    chains (L = 2) they are the four paths over {0, 2}, each of probability 0.25 (enumerated here)."""
    problem = lp.build_lp(_three_token_model(), lp.chain_outcomes(_three_token_model(), 1))
    assert problem.length == 2
    expected = [(a, b) for a in (0, 2) for b in (0, 2)]
    assert sorted(problem.leaves) == expected
    assert np.array_equal(problem.leaf_probs, np.full(4, 0.25))
    assert all(1 not in s for s in problem.outputs)  # outputs with P(s) = 0 get no variable


def test_lp_scalings_agree_where_the_naive_form_is_well_conditioned() -> None:
    """[LP9] Module doc: the three forms are one LP written three ways, so on a model with no tiny
    probabilities (the TMC paper's toy pair, chains of 2) the naive ``1 / P(s)`` rows give the unit optimum."""
    from tmc import paper_toy_model

    model = paper_toy_model()
    outcomes = lp.chain_outcomes(model, 2)
    values = [lp.solve_lp(lp.build_lp(model, outcomes, scaling=f)).expected_length for f in lp.SCALINGS]
    assert max(values) - min(values) <= 1e-6


def test_solve_lp_starts_without_presolve_retries_once_and_keeps_every_nonzero_value(monkeypatch) -> None:
    """[LP17] presolve is off by default; [LP11] a failed solve is retried once with presolve on; [LP18] the
    joint and output law carry every nonzero value the solver returns, however small (no threshold)."""
    model = _three_token_model()
    problem = lp.build_lp(model, lp.chain_outcomes(model, 1))
    real = lp._linprog(problem, False)
    assert real.status == 0
    tiny = int(np.flatnonzero(real.x[: len(problem.variables)] == 0.0)[0])
    calls: list[bool] = []

    class _Failed:
        status, message = 4, "numerical difficulties (simulated)"

    class _Solved:
        status, message, fun = 0, real.message, real.fun
        x = real.x.copy()
        x[tiny] = 1e-12

    def fake(prob: lp.LPProblem, presolve: bool) -> object:
        calls.append(presolve)
        return _Failed() if len(calls) == 1 else _Solved()

    monkeypatch.setattr(lp, "_linprog", fake)
    result = lp.solve_lp(problem)
    assert calls == [False, True]
    d, s = problem.variables[tiny]
    assert result.joint[d][s] == 1e-12 and result.output_law[s] >= 1e-12


def test_hu_closed_form_takes_the_largest_documented_vocabulary() -> None:
    """[LP14] ``V = MAX_CLOSED_FORM_VOCAB`` (22, 2^22 subsets) is solved: one draft of token 0 under a
    uniform p accepts with Σ min(p, q) = 1/22; V = 23 is refused."""
    vocab = lp.MAX_CLOSED_FORM_VOCAB
    assert vocab == 22
    assert lp.hu_closed_form_acceptance(np.full(vocab, 1 / vocab), {(0,): 1.0}) == pytest.approx(1 / vocab, abs=1e-12)
    with pytest.raises(ValueError, match="V = 23"):
        lp.hu_closed_form_acceptance(np.full(vocab + 1, 1 / (vocab + 1)), {(0,): 1.0})
