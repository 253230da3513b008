"""Tests for tmc.order: the sub-distribution order (Def A.11, Thms A.12-A.16) and distances.

The two checks (child conditionals, Def A.11; path-probability products,
Thm A.16) are compared with each other, with pairs built to satisfy Def A.11
by construction, with pairs broken at one node (an independent grid search
over c confirms the break), and with hand examples.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from verification.strategies import (
    Rows,
    conditional_rows,
    from_rows,
    spaces,
    tree_distributions,
    weight_rows,
)
from tmc.order import (
    OrderResult,
    check_product_form,
    check_sub_distribution,
    pointwise_distance,
    total_variation,
)
from tmc.tree import Path, TreeDistribution, TreeSpace

CHECKS = [check_sub_distribution, check_product_form]
# Scales stay clear of subnormal floats: a path probability below ~1e-308 has
# lost relative precision, so the conditionals derived from it would be off
# by more than the check's tolerance (a documented limit of tmc.tree).
SCALES = st.one_of(st.just(0.0), st.just(1.0), st.floats(1e-200, 1.0))


@st.composite
def sub_pairs(draw: st.DrawFn) -> tuple[TreeSpace, Rows, Rows]:
    """(space, rows1, rows2) with P1(.|s) = c_s P2(.|s), c_s in [0, 1]: P1 <= P2 by Def A.11."""
    space = draw(spaces)
    rows2 = draw(conditional_rows(space))
    rows1 = {}
    for node, row in rows2.items():
        c = draw(SCALES)
        rows1[node] = {a: c * p for a, p in row.items()}
    return space, rows1, rows2


# Two independently drawn distributions on one random space.
independent_pairs = spaces.flatmap(
    lambda sp: st.tuples(st.just(sp), conditional_rows(sp), conditional_rows(sp))
)


def min_residual_over_c(r1: dict[int, float], r2: dict[int, float], kids: tuple[int, ...]) -> float:
    """min over a grid of c in [0, 1] of max_a |r1(a) - c r2(a)| (an independent Def A.11 oracle).

    The grid step is 1e-4, so the true minimum is at most 5e-5 below this value.
    """
    x = np.array([r1.get(a, 0.0) for a in kids])
    y = np.array([r2.get(a, 0.0) for a in kids])
    c = np.linspace(0.0, 1.0, 10_001)[:, None]
    return float(np.abs(x[None, :] - c * y[None, :]).max(axis=1).min())


# -- agreement of the two implementations ---------------------------------------


@given(sub_pairs())
@settings(max_examples=60)
def test_constructed_sub_distribution_holds_in_both_forms_and_thms_a12_a14(
    pair: tuple[TreeSpace, Rows, Rows],
) -> None:
    space, rows1, rows2 = pair
    p1, p2 = from_rows(space, rows1), from_rows(space, rows2)
    for check in CHECKS:
        result = check(p1, p2)
        assert result.holds and result.witness is None, (check.__name__, result)
    assert set(p1.support()) <= set(p2.support())  # Thm A.13
    for s in p1.support():
        assert p1.path_prob(s) <= p2.path_prob(s) + 1e-12  # Thm A.12
        assert pointwise_distance(p1, p2, s) >= -1e-12
        assert p1.termination(s) >= p2.termination(s) - 1e-12  # Thm A.14


@given(sub_pairs(), st.data())
@settings(max_examples=60)
def test_one_broken_node_fails_in_both_forms_with_witness_at_that_node(
    pair: tuple[TreeSpace, Rows, Rows], data: st.DataObject
) -> None:
    space, rows1, rows2 = pair
    p1 = from_rows(space, rows1)
    node = data.draw(st.sampled_from([s for s in p1.support() if not space.is_leaf(s)]))
    kids = space.children(node)
    probs = data.draw(weight_rows(n_children=len(kids), leaf_only=False))
    broken = {a: p for a, p in zip(kids, probs) if p > 0.0}
    # Keep only breaks that no c in [0, 1] can repair, by a clear margin.
    assume(min_residual_over_c(broken, rows2[node], kids) > 1e-3)
    p1_broken = from_rows(space, {**rows1, node: broken})
    p2 = from_rows(space, rows2)
    for check in CHECKS:
        result = check(p1_broken, p2)
        assert not result.holds, check.__name__
        assert result.witness is not None and result.witness.node == node
        assert result.worst_violation > 1e-12
        assert str(node) in result.witness.reason


@given(independent_pairs)
@settings(max_examples=80)
def test_two_implementations_agree_on_independent_pairs(pair: tuple[TreeSpace, Rows, Rows]) -> None:
    space, rows1, rows2 = pair
    p1, p2 = from_rows(space, rows1), from_rows(space, rows2)
    by_def, by_thm = check_sub_distribution(p1, p2, tol=1e-9), check_product_form(p1, p2, tol=1e-9)
    # The two violation measures differ in scale (one is a residual, the other
    # a product of conditionals), so compare verdicts away from the threshold.
    assume(not (1e-13 < by_def.worst_violation < 1e-6))
    assume(not (1e-13 < by_thm.worst_violation < 1e-6))
    assert by_def.holds == by_thm.holds


@given(tree_distributions())
@settings(max_examples=20)
def test_every_distribution_is_a_sub_distribution_of_itself(p: TreeDistribution) -> None:
    for check in CHECKS:
        result = check(p, p)
        assert result.holds and result.worst_violation <= 1e-15


# -- witnesses on hand examples ---------------------------------------------------

ONE_LEVEL = TreeSpace.full(2, 1)


def root_only(row: dict[int, float]) -> TreeDistribution:
    return TreeDistribution.from_conditionals(ONE_LEVEL, lambda s: row)


# Each case: P1 root row, P2 root row, then for (Def A.11, Thm A.16):
# witness children, ratios, worst violation, and a phrase of the reason.
#  - ratios differ: P1/P2 = .2/.5 = .4 for child 0 and .6/.5 = 1.2 for child 1;
#    c = (.2+.6)/1 = .8 leaves residual |.2 - .4| = .2; cross gap |.2*.5 - .6*.5| = .2.
#  - c > 1: P1 = 1.5 P2 on both children; clipped c = 1 leaves residual .3 - .2 = .1;
#    termination gap .6 - .4 = .2, and c = (1 - .4) / (1 - .6) = 1.5.
#  - stray child: child 1 has P1 = .5 but P2 = 0; residual .5; cross gap .5 * 1 = .5.
WITNESS_CASES = [
    pytest.param(
        {0: 0.2, 1: 0.6}, {0: 0.5, 1: 0.5},
        ((0, 1), (0.4, 1.2), 0.2, "not proportional"),
        ((0, 1), (0.4, 1.2), 0.2, "differs from"),
        id="ratios-differ",
    ),
    pytest.param(
        {0: 0.3, 1: 0.3}, {0: 0.2, 1: 0.2},
        ((0, 1), (1.5,), 0.1, "c = 1.5 > 1"),
        ((), (1.5,), 0.2, "P1(tau|s) = 0.4 < P2(tau|s) = 0.6"),
        id="c-above-1",
    ),
    pytest.param(
        {0: 0.5, 1: 0.5}, {0: 1.0},
        ((1,), (math.inf,), 0.5, "child 1 is possible under P1"),
        ((0, 1), (0.5, math.inf), 0.5, "differs from"),
        id="child-not-in-P2",
    ),
]


@pytest.mark.parametrize("row1, row2, by_def, by_thm", WITNESS_CASES)
def test_witness_hand_examples_name_node_children_ratios(
    row1: dict[int, float],
    row2: dict[int, float],
    by_def: tuple[tuple[int, ...], tuple[float, ...], float, str],
    by_thm: tuple[tuple[int, ...], tuple[float, ...], float, str],
) -> None:
    for check, (children, ratios, violation, phrase) in zip(CHECKS, [by_def, by_thm]):
        result = check(root_only(row1), root_only(row2))
        assert not result.holds and result.witness is not None
        assert result.witness.node == ()
        assert result.witness.children == children
        assert result.witness.ratios == pytest.approx(ratios, rel=1e-12)
        assert result.worst_violation == pytest.approx(violation, rel=1e-12)
        assert phrase in result.witness.reason


def test_witness_deep_node_is_reported() -> None:
    # Same uniform root; below (1,) P1 goes .9/.1 where P2 goes .5/.5.
    space = TreeSpace.full(2, 2)
    p2 = TreeDistribution.from_conditionals(space, lambda s: {0: 0.5, 1: 0.5})
    p1 = TreeDistribution.from_conditionals(
        space, lambda s: {0: 0.9, 1: 0.1} if s == (1,) else {0: 0.5, 1: 0.5}
    )
    for check in CHECKS:
        result: OrderResult = check(p1, p2)
        assert result.witness is not None and result.witness.node == (1,)
        assert set(result.witness.children) == {0, 1}


def test_different_spaces_raise() -> None:
    p = root_only({0: 1.0})
    q = TreeDistribution.from_conditionals(TreeSpace.full(3, 1), lambda s: {0: 1.0})
    fns: list[Callable[[TreeDistribution, TreeDistribution], object]] = [
        check_sub_distribution, check_product_form, total_variation,
    ]
    for fn in fns:
        with pytest.raises(ValueError, match="same TreeSpace"):
            fn(p, q)


# -- distances --------------------------------------------------------------------
#
# P1: the hand example of test_tree (masses ()=.2, (1,)=.15, (0,0)=.2, (0,1)=.3, (1,1)=.15);
# P2: uniform leaf-only on the binary depth-2 tree (.25 on each leaf).
# TV = (.2 + .15 + .05 + .05 + .25 + .1) / 2 = .4.


def hand_pair() -> tuple[TreeDistribution, TreeDistribution]:
    space = TreeSpace.full(2, 2)
    rows = {(): {0: 0.5, 1: 0.3}, (0,): {0: 0.4, 1: 0.6}, (1,): {1: 0.5}}
    p1 = TreeDistribution.from_conditionals(space, lambda s: rows[s])
    p2 = TreeDistribution.from_conditionals(space, lambda s: {0: 0.5, 1: 0.5})
    return p1, p2


def test_total_variation_hand_example_equals_hand_value_and_max_over_events() -> None:
    p1, p2 = hand_pair()
    assert total_variation(p1, p2) == pytest.approx(0.4, abs=1e-15)
    # Second method: the definition, max over every event U of the finite space.
    points = list(TreeSpace.full(2, 2).paths())
    best = 0.0
    for r in range(len(points) + 1):
        for event in itertools.combinations(points, r):
            gap = sum(p1.point_mass(s) for s in event) - sum(p2.point_mass(s) for s in event)
            best = max(best, abs(gap))
    assert total_variation(p1, p2) == pytest.approx(best, abs=1e-12)


@pytest.mark.parametrize(
    "path, distance", [((), 0.0), ((0,), 0.0), ((1,), 0.2), ((1, 1), 0.1), ((1, 0), 0.25)]
)
def test_pointwise_distance_hand_example(path: Path, distance: float) -> None:
    p1, p2 = hand_pair()
    assert pointwise_distance(p1, p2, path) == pytest.approx(distance, abs=1e-15)


@given(independent_pairs)
@settings(max_examples=30)
def test_total_variation_is_a_bounded_symmetric_distance(
    pair: tuple[TreeSpace, Rows, Rows],
) -> None:
    space, rows1, rows2 = pair
    p1, p2 = from_rows(space, rows1), from_rows(space, rows2)
    tv = total_variation(p1, p2)
    assert 0.0 <= tv <= 1.0 + 1e-12
    assert tv == pytest.approx(total_variation(p2, p1), abs=1e-15)
    assert total_variation(p1, p1) == 0.0
    # TV bounds every single-path event gap |P1^({s}) - P2^({s})|.
    for s in space.paths():
        assert abs(p1.point_mass(s) - p2.point_mass(s)) <= tv + 1e-12
