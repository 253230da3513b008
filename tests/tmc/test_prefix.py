"""Tests for tmc.prefix: prefix samplers, composition and convergence.

TMC paper Defs A.23-A.28 and Thms A.27-A.32.

Exact first: composed kernels are checked against hand computation, against
other compositions with a known answer, and against a closed form for the
total variation after n steps.  One calibrated sampling test checks that the
samplers draw from their kernels.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tests.tmc.test_tree import product_of_conditionals
from verification.strategies import (
    Rows,
    conditional_rows,
    from_rows,
    tree_distributions,
)
from tmc.order import total_variation
from tmc.prefix import (
    PrefixKernel,
    PrefixSampler,
    ancestral_step_kernel,
    ancestral_step_sampler,
    check_prefix_sampler,
    check_prefix_sub_sampler,
    compose_kernels,
    compose_samplers,
    empirical_law,
    induced_distribution,
    is_degenerate,
    push_forward,
    self_compose_kernel,
    self_compose_sampler,
    tempered_step_kernel,
    truncating_kernel,
    truncating_sampler,
)
from tmc.tree import Path, TreeDistribution, TreeSpace

# Leaf-only hand example on the binary depth-2 tree:
#   root 0: .25, 1: .75;  below (0,): .5/.5;  below (1,): .2/.8.
HAND_SPACE = TreeSpace.full(2, 2)
HAND_ROWS: Rows = {(): {0: 0.25, 1: 0.75}, (0,): {0: 0.5, 1: 0.5}, (1,): {0: 0.2, 1: 0.8}}


def hand() -> TreeDistribution:
    return from_rows(HAND_SPACE, HAND_ROWS)


def close(a: dict[Path, float], b: dict[Path, float], tol: float = 1e-12) -> bool:
    """Two laws agree on every path within ``tol``."""
    return all(abs(a.get(s, 0.0) - b.get(s, 0.0)) <= tol for s in set(a) | set(b))


# -- composition (Def A.26) --------------------------------------------------------


def test_composition_runs_inner_first() -> None:
    def append(token: int) -> PrefixSampler:
        return lambda rng, s: s + (token,)

    def append_kernel(token: int) -> PrefixKernel:
        return lambda s: {s + (token,): 1.0}

    rng = np.random.default_rng(0)
    assert compose_samplers(append(1), append(0))(rng, ()) == (0, 1)
    assert compose_kernels(append_kernel(1), append_kernel(0))(()) == {(0, 1): 1.0}


def test_composed_kernel_hand_example_equals_hand_law() -> None:
    # Inner: one ancestral step -> (0,) .25, (1,) .75.  Outer: truncating walk with
    # stop .5; from (0,): stay .5, else (0,0) .25, (0,1) .25; from (1,): stay .5,
    # else (1,0) .1, (1,1) .4.  Mixing with .25/.75 gives the law below.
    expected = {
        (0,): 0.125, (0, 0): 0.0625, (0, 1): 0.0625, (1,): 0.375, (1, 0): 0.075, (1, 1): 0.3,
    }
    law = compose_kernels(truncating_kernel(hand(), 0.5), ancestral_step_kernel(hand(), 1))(())
    assert close(law, expected)


def test_zero_fold_self_composition_is_identity() -> None:
    rng = np.random.default_rng(1)
    before = rng.bit_generator.state
    assert self_compose_sampler(truncating_sampler(hand(), 0.5), 0)(rng, (1,)) == (1,)
    assert rng.bit_generator.state == before  # no randomness used
    assert self_compose_kernel(truncating_kernel(hand(), 0.5), 0)((1,)) == {(1,): 1.0}


@given(tree_distributions(leaf_only=True), st.integers(0, 3), st.integers(0, 3))
@settings(max_examples=30)
def test_ancestral_steps_compose_additively_on_leaf_only(
    p: TreeDistribution, i: int, j: int
) -> None:
    # On a leaf-only P a walk only stops early at a leaf, where a later walk also
    # stays, so i steps after j steps is exactly i + j steps.
    composed = compose_kernels(ancestral_step_kernel(p, i), ancestral_step_kernel(p, j))
    repeated = self_compose_kernel(ancestral_step_kernel(p, 1), i + j)
    for prefix in p.support():
        assert close(composed(prefix), ancestral_step_kernel(p, i + j)(prefix))
        assert close(repeated(prefix), ancestral_step_kernel(p, i + j)(prefix))


# -- samplers draw from their kernels (calibrated) -------------------------------------
#
# Weissman et al. (2003): for a law on k cells, P(||emp - law||_1 >= eps) <=
# (2^k - 2) exp(-n eps^2 / 2).  k is bounded by the number of paths of the space
# (7), so the bound holds whatever the sampler's true support.  Total false-fail
# rate 1e-9, split over the cases; a sampler whose law is >= 2 eps away in L1
# from its kernel fails with probability >= 1 - alpha.

FALSE_FAIL = 1e-9
L1_EPS = 0.05
SAMPLER_CASES = [
    pytest.param(
        lambda p: compose_samplers(truncating_sampler(p, 0.3), ancestral_step_sampler(p, 1)),
        lambda p: compose_kernels(truncating_kernel(p, 0.3), ancestral_step_kernel(p, 1)),
        id="truncating-after-ancestral",
    ),
    pytest.param(
        lambda p: self_compose_sampler(truncating_sampler(p, 0.6), 2),
        lambda p: self_compose_kernel(truncating_kernel(p, 0.6), 2),
        id="truncating-twice",
    ),
]


def required_samples(k_cells: int, eps: float, alpha: float) -> int:
    return math.ceil(2.0 * math.log((2**k_cells - 2) / alpha) / eps**2)


@pytest.mark.parametrize("make_sampler, make_kernel", SAMPLER_CASES)
def test_composed_sampler_matches_composed_kernel_l1_below_eps(
    make_sampler: Callable[[TreeDistribution], PrefixSampler],
    make_kernel: Callable[[TreeDistribution], PrefixKernel],
) -> None:
    p = hand()
    k_cells = len(list(HAND_SPACE.paths()))
    n = 22_000
    assert n >= required_samples(k_cells, L1_EPS, FALSE_FAIL / len(SAMPLER_CASES))
    emp = empirical_law(make_sampler(p), (), n, np.random.default_rng(20240517))
    exact = make_kernel(p)(())
    l1 = sum(abs(emp.get(s, 0.0) - exact.get(s, 0.0)) for s in set(emp) | set(exact))
    assert l1 < L1_EPS


# -- sub-samplers (Def A.28, Thms A.27, A.29, A.30) -----------------------------------


@given(tree_distributions(leaf_only=True), st.floats(0.0, 1.0))
@settings(max_examples=25)
def test_compositions_of_sub_samplers_are_sub_samplers_thm_a29_a30(
    p: TreeDistribution, stop: float
) -> None:
    step, trunc = ancestral_step_kernel(p, 1), truncating_kernel(p, stop)
    kernels = {
        "ancestral": step,
        "truncating": trunc,
        "identity": self_compose_kernel(trunc, 0),
        "trunc o step": compose_kernels(trunc, step),
        "step o trunc": compose_kernels(step, trunc),
        "trunc^2": self_compose_kernel(trunc, 2),
    }
    for name, kernel in kernels.items():
        assert check_prefix_sampler(kernel, p.space, p.support()).holds, name
        assert check_prefix_sub_sampler(kernel, p).holds, name
    # Thm A.30: composing can only raise path probabilities of the inner sampler.
    for prefix in p.support():
        inner = induced_distribution(trunc, p.space, prefix)
        outer = induced_distribution(kernels["step o trunc"], p.space, prefix)
        assert all(outer.path_prob(s) >= inner.path_prob(s) - 1e-12 for s in inner.support())


@given(tree_distributions(leaf_only=True), st.floats(0.0, 1.0))
@settings(max_examples=20)
def test_implementing_kernel_is_fixed_point_thm_a27(p: TreeDistribution, stop: float) -> None:
    exact = truncating_kernel(p, 0.0)  # never stops early: implements P (Def A.25)
    after = compose_kernels(exact, truncating_kernel(p, stop))
    for prefix in p.support():
        target = p.condition(prefix)
        assert total_variation(induced_distribution(exact, p.space, prefix), target) <= 1e-12
        assert total_variation(induced_distribution(after, p.space, prefix), target) <= 1e-12


def has_unequal_siblings(rows: Rows, margin: float) -> bool:
    """Some support node has two children whose probabilities differ by > margin."""
    for node, row in rows.items():
        probs = sorted(row.values())
        reachable = product_of_conditionals(rows, node) > 0
        if reachable and len(probs) > 1 and probs[-1] - probs[0] > margin:
            return True
    return False


@given(st.builds(TreeSpace.full, st.integers(1, 3), st.integers(1, 3)).flatmap(
    lambda sp: st.tuples(st.just(sp), conditional_rows(sp, leaf_only=True))
))
@settings(max_examples=30)
def test_tempered_kernel_is_sub_sampler_iff_siblings_are_equal(
    pair: tuple[TreeSpace, Rows],
) -> None:
    space, rows = pair
    unequal = has_unequal_siblings(rows, 1e-6)
    assume(unequal or not has_unequal_siblings(rows, 0.0))
    p = from_rows(space, rows)
    result = check_prefix_sub_sampler(tempered_step_kernel(p, 2.0), p)
    assert result.holds is not unequal
    if unequal:
        assert result.order is not None and result.order.witness is not None
        # One step re-weights only the prefix's own children.
        assert result.prefix == result.order.witness.node


def test_tempered_kernel_hand_example_witness() -> None:
    # Root .25/.75 tempered at T=2: weights .5 and .866, so the ratio to P differs per child.
    result = check_prefix_sub_sampler(tempered_step_kernel(hand(), 2.0), hand())
    assert not result.holds and result.prefix == ()
    assert result.order is not None and result.order.witness is not None
    assert set(result.order.witness.children) == {0, 1}


def test_kernel_leaving_the_prefix_is_rejected() -> None:
    def back_up(prefix: Path) -> dict[Path, float]:
        return {prefix[:-1]: 1.0} if prefix else {prefix: 1.0}

    result = check_prefix_sampler(back_up, HAND_SPACE, [(), (0,)])
    assert not result.holds and result.prefix == (0,) and "does not extend" in result.reason
    assert not check_prefix_sub_sampler(back_up, hand()).holds
    short = check_prefix_sampler(lambda s: {s: 0.9}, HAND_SPACE, [()])
    assert not short.holds and "sum to" in short.reason


# -- convergence (Thms A.31, A.32) and degeneracy (Def A.24) ----------------------------


def tv_closed_form(n: int, stop: float, depth: int) -> float:
    """TV(P_sub^n(.; root), P) for the truncating walk; P leaf-only with every leaf at ``depth``.

    The law lies on non-leaves exactly when fewer than ``depth`` steps were taken
    in total; each application takes Geometric(stop) steps, so the total after n
    applications is negative binomial: P(k) = C(k+n-1, k) (1-stop)^k stop^n.
    """
    if n == 0:
        return 1.0
    return math.fsum(math.comb(k + n - 1, k) * (1 - stop) ** k * stop**n for k in range(depth))


def depth3_leaf_only_rows(vocab: int) -> st.SearchStrategy[tuple[int, Rows]]:
    rows = conditional_rows(TreeSpace.full(vocab, 3), leaf_only=True)
    return rows.map(lambda r: (vocab, r))


@given(st.integers(1, 3).flatmap(depth3_leaf_only_rows), st.floats(0.0, 0.5))
@settings(max_examples=15)
def test_truncating_self_composition_converges_monotonically_thm_a31_a32(
    vocab_rows: tuple[int, Rows], stop: float
) -> None:
    vocab, rows = vocab_rows
    p = from_rows(TreeSpace.full(vocab, 3), rows)
    kernel = truncating_kernel(p, stop)
    law: dict[Path, float] = {(): 1.0}
    previous: TreeDistribution | None = None
    for n in range(61):
        current = TreeDistribution.from_point_masses(p.space, law)
        tv = total_variation(current, p)
        assert tv == pytest.approx(tv_closed_form(n, stop, 3), abs=1e-12)
        if previous is not None:  # Thm A.32 (TV) and Thm A.30 (path probabilities) are monotone
            assert tv <= total_variation(previous, p) + 1e-15
            assert all(current.path_prob(s) >= previous.path_prob(s) - 1e-12 for s in p.support())
        previous, law = current, push_forward(kernel, law)
    assert tv < 1e-6


def test_degenerate_kernels_are_flagged_and_do_not_converge() -> None:
    p = hand()
    assert is_degenerate(truncating_kernel(p, 1.0), p.space, p.support())
    assert is_degenerate(ancestral_step_kernel(p, 0), p.space, p.support())
    assert not is_degenerate(truncating_kernel(p, 0.5), p.space, p.support())
    assert not is_degenerate(ancestral_step_kernel(p, 1), p.space, p.support())
    stuck = self_compose_kernel(truncating_kernel(p, 1.0), 60)
    assert total_variation(induced_distribution(stuck, p.space, ()), p) == 1.0


# -- bad input --------------------------------------------------------------------------


def test_bad_arguments_raise_naming_them() -> None:
    p = hand()
    with pytest.raises(ValueError, match="stop_prob"):
        truncating_kernel(p, 1.5)
    with pytest.raises(ValueError, match="stop_prob"):
        truncating_sampler(p, float("nan"))
    with pytest.raises(ValueError, match="steps"):
        ancestral_step_kernel(p, -1)
    with pytest.raises(ValueError, match="temperature"):
        tempered_step_kernel(p, 0.0)
    with pytest.raises(ValueError, match="n must be"):
        self_compose_kernel(truncating_kernel(p, 0.5), -1)
    with pytest.raises(ValueError, match="n_samples"):
        empirical_law(truncating_sampler(p, 0.5), (), 0, np.random.default_rng(0))


def test_walk_kernel_takes_a_walk_of_exactly_max_nodes_nodes():
    """A walk that ends on its ``max_nodes``-th node raised "visits more than max_nodes" (the loop looked
    for an empty stack only at the top of the next turn)."""
    from tmc.prefix import walk_kernel

    assert walk_kernel(lambda prefix, node: {}, max_nodes=1)(()) == {(): 1.0}
    rule = lambda prefix, node: {0: 0.5} if len(node) < 2 else {}  # noqa: E731  # three nodes
    assert walk_kernel(rule, max_nodes=3)(()) == pytest.approx({(): 0.5, (0,): 0.25, (0, 0): 0.25})
    with pytest.raises(ValueError, match="more than max_nodes=2"):
        walk_kernel(rule, max_nodes=2)(())
