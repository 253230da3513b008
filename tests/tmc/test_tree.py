"""Tests for tmc.tree: tree spaces and tree distributions (TMC Defs A.1-A.7, A.17, A.20, B.1).

Expected values come from hand computation (written out next to each
example) or from a second method (products of the drawn conditionals).  The
hypothesis strategies for random tree distributions are in
verification/strategies.py.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tmc.tree import Path, TreeDistribution, TreeSpace, is_prefix, tail_mass_beyond
from verification.strategies import Rows, from_rows, spaces_and_rows, tree_distributions

def product_of_conditionals(rows: Rows, path: Path) -> float:
    """P(s) = prod_i P(s_i | s_{1:i-1}) (remark after Thm A.6), straight from the rows."""
    return math.prod(rows.get(path[:i], {}).get(path[i], 0.0) for i in range(len(path)))


# -- a hand example ----------------------------------------------------------
#
# Binary tree of depth 2.  Root: P(0)=.5, P(1)=.3, so P(tau|root)=.2.
# Node (0,): children .4/.6, no termination.  Node (1,): only child 1 with .5,
# so P(tau|(1,))=.5 and (1,0) is outside the support.
#   path probabilities: ()=1, (0,)=.5, (1,)=.3, (0,0)=.2, (0,1)=.3, (1,0)=0, (1,1)=.15
#   point masses:       ()=.2, (0,)=0, (1,)=.15, (0,0)=.2, (0,1)=.3, (1,1)=.15
#   E[len] = 1*.15 + 2*(.2+.3+.15) = 1.45;  P[len>0] = .8, P[len>1] = .65

HAND_SPACE = TreeSpace.full(2, 2)
HAND_ROWS: Rows = {(): {0: 0.5, 1: 0.3}, (0,): {0: 0.4, 1: 0.6}, (1,): {1: 0.5}}
HAND_PATH_PROBS = {
    (): 1.0, (0,): 0.5, (1,): 0.3, (0, 0): 0.2, (0, 1): 0.3, (1, 0): 0.0, (1, 1): 0.15,
}
HAND_MASSES = {(): 0.2, (1,): 0.15, (0, 0): 0.2, (0, 1): 0.3, (1, 1): 0.15}


def hand() -> TreeDistribution:
    return from_rows(HAND_SPACE, HAND_ROWS)


@pytest.mark.parametrize("path, expected", sorted(HAND_PATH_PROBS.items()))
def test_path_prob_hand_example_equals_hand_value(path: Path, expected: float) -> None:
    assert hand().path_prob(path) == pytest.approx(expected, abs=1e-15)


@pytest.mark.parametrize("build", ["conditionals", "point_masses"])
def test_point_masses_hand_example_equal_hand_values(build: str) -> None:
    if build == "conditionals":
        dist = hand()
    else:
        dist = TreeDistribution.from_point_masses(HAND_SPACE, HAND_MASSES)
    got = dist.point_masses()
    assert set(got) == set(HAND_MASSES)
    for path, mass in HAND_MASSES.items():
        assert got[path] == pytest.approx(mass, abs=1e-15)
    assert dist.point_mass((0,)) == 0.0


@pytest.mark.parametrize(
    "path, termination", [((), 0.2), ((0,), 0.0), ((1,), 0.5), ((0, 0), 1.0), ((1, 1), 1.0)]
)
def test_termination_hand_example_equals_hand_value(path: Path, termination: float) -> None:
    assert hand().termination(path) == pytest.approx(termination, abs=1e-15)


def test_child_prob_hand_example_recovers_conditionals() -> None:
    dist = hand()
    assert dist.child_prob(1, ()) == pytest.approx(0.3, abs=1e-15)
    assert dist.child_prob(0, (1,)) == 0.0
    assert dist.child_probs((1,)) == pytest.approx({1: 0.5}, abs=1e-15)


def test_support_expected_length_and_tail_hand_example() -> None:
    dist = hand()
    assert set(dist.support()) == {p for p, v in HAND_PATH_PROBS.items() if v > 0}
    assert dist.expected_length() == pytest.approx(1.45, abs=1e-15)
    assert dist.tail_mass(0) == pytest.approx(0.8, abs=1e-15)
    assert dist.tail_mass(1) == pytest.approx(0.65, abs=1e-15)
    assert dist.tail_mass(2) == 0.0


def test_condition_hand_example_renormalises_subtree() -> None:
    # P|(0,) keeps (0,0), (0,1) scaled by 1/.5; P|(1,) keeps (1,) and (1,1) scaled by 1/.3.
    assert hand().condition((0,)).point_masses() == pytest.approx({(0, 0): 0.4, (0, 1): 0.6})
    assert hand().condition((1,)).point_masses() == pytest.approx({(1,): 0.5, (1, 1): 0.5})
    assert hand().condition((0,)).path_prob(()) == pytest.approx(1.0)


@given(spaces_and_rows())
@settings(max_examples=40)
def test_path_prob_random_tree_equals_product_of_conditionals(sr: tuple[TreeSpace, Rows]) -> None:
    space, rows = sr
    dist = from_rows(space, rows)
    for path in space.paths():
        assert dist.path_prob(path) == pytest.approx(product_of_conditionals(rows, path), abs=1e-12)
    assert math.fsum(dist.point_masses().values()) == pytest.approx(1.0, abs=1e-12)


@given(tree_distributions(), st.data())
@settings(max_examples=40)
def test_condition_random_tree_matches_def_a7(dist: TreeDistribution, data: st.DataObject) -> None:
    prefix = data.draw(st.sampled_from(dist.support()))
    cond = dist.condition(prefix)
    for path in dist.space.paths():
        if is_prefix(path, prefix):
            expected = 1.0
        elif is_prefix(prefix, path):
            expected = dist.path_prob(path) / dist.path_prob(prefix)
        else:
            expected = 0.0
        assert cond.path_prob(path) == pytest.approx(expected, abs=1e-12)


# -- predicates (Def A.20, Def B.1) -------------------------------------------


def test_leaf_predicates_on_three_hand_examples() -> None:
    # Leaf-only: all mass on depth-2 leaves.  Pseudo leaf-only: a depth-3 space
    # where every path stops at depth 2 (termination exactly 1 there, 0 above).
    leafy = from_rows(HAND_SPACE, {(): {0: 0.5, 1: 0.5}, (0,): {0: 1.0}, (1,): {1: 1.0}})
    pseudo = TreeDistribution.from_conditionals(
        TreeSpace.full(2, 3), lambda s: {0: 0.5, 1: 0.5} if len(s) < 2 else {}
    )
    assert (leafy.is_leaf_only(), leafy.is_pseudo_leaf_only()) == (True, True)
    assert (pseudo.is_leaf_only(), pseudo.is_pseudo_leaf_only()) == (False, True)
    assert (hand().is_leaf_only(), hand().is_pseudo_leaf_only()) == (False, False)


@given(tree_distributions(leaf_only=True))
@settings(max_examples=25)
def test_leaf_only_random_tree_has_mass_only_on_leaves(dist: TreeDistribution) -> None:
    assert dist.is_leaf_only()
    assert all(dist.space.is_leaf(s) for s in dist.point_masses())


# -- infinite trees and truncation (Def A.17) -----------------------------------


def test_tail_mass_geometric_tree_equals_closed_form() -> None:
    # Binary infinite tree, continue with rho (each child rho/2), stop with 1 - rho:
    # P(len >= k) = rho^k, so P^[len>d] = rho^(d+1) and, cut at d,
    # E[min(len, d)] = sum_{k=1..d} rho^k = rho (1 - rho^d) / (1 - rho).
    rho, d = 0.6, 4
    space = TreeSpace.full(2, None)

    def cond(s: Path) -> dict[int, float]:
        return {0: rho / 2, 1: rho / 2}

    cut = TreeDistribution.from_conditionals(space.truncated(d), cond)
    assert tail_mass_beyond(space, cond, d) == pytest.approx(rho ** (d + 1), rel=1e-12)
    assert cut.tail_mass(d - 1) == pytest.approx(rho**d, rel=1e-12)
    assert cut.expected_length() == pytest.approx(rho * (1 - rho**d) / (1 - rho), rel=1e-12)


def test_truncated_llm_like_tree_stays_leaf_only_with_closed_form_tail() -> None:
    # Token 0 is EOS (its node has no children); P(EOS) = e at every node.
    # Paths longer than d need d non-EOS tokens: P^[len>d] = (1 - e)^d;
    # reaching depth d needs d - 1 of them: P(len = d after the cut) = (1 - e)^(d-1).
    e, d = 0.3, 3
    space = TreeSpace(lambda s: () if s and s[-1] == 0 else (0, 1, 2))

    def cond(s: Path) -> dict[int, float]:
        return {0: e, 1: (1 - e) / 2, 2: (1 - e) / 2}

    cut = TreeDistribution.from_conditionals(space.truncated(d), cond)
    assert cut.is_leaf_only()
    assert tail_mass_beyond(space, cond, d) == pytest.approx((1 - e) ** d, rel=1e-12)
    # The cut folds that mass into the depth-d nodes not ending in EOS.
    at_cut = {s: m for s, m in cut.point_masses().items() if len(s) == d}
    assert math.fsum(m for s, m in at_cut.items() if s[-1] != 0) == pytest.approx(
        (1 - e) ** d, rel=1e-12
    )
    assert math.fsum(at_cut.values()) == pytest.approx((1 - e) ** (d - 1), rel=1e-12)


def test_infinite_support_without_max_depth_raises() -> None:
    space = TreeSpace.full(2, None)
    with pytest.raises(ValueError, match="max_depth"):
        TreeDistribution.from_conditionals(space, lambda s: {0: 0.5, 1: 0.25}, max_nodes=500)


def test_paths_full_space_bfs_order_and_count() -> None:
    got = list(TreeSpace.full(2, 2).paths())
    assert got == [(), (0,), (1,), (0, 0), (0, 1), (1, 0), (1, 1)]
    assert len(list(TreeSpace.full(3, None).paths(max_len=2))) == 1 + 3 + 9


# -- bad input ------------------------------------------------------------------


@pytest.mark.parametrize(
    "row, match",
    [
        ({0: -0.1}, r"cond\(\(\)\)\[0\] = -0.1 is not a probability"),
        ({0: float("nan")}, r"cond\(\(\)\)\[0\] = nan"),
        ({0: 1.5}, r"cond\(\(\)\)\[0\] = 1.5"),
        ({0: 0.7, 1: 0.4}, r"cond\(\(\)\) sums to 1.1"),
        ({0: 0.5, 2: 0.5}, r"cond\(\(\)\) gives mass to child 2, not in Sigma"),
    ],
)
def test_from_conditionals_bad_row_raises_naming_cond(row: dict[int, float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        TreeDistribution.from_conditionals(TreeSpace.full(2, 1), lambda s: row)


def test_from_conditionals_sum_within_tolerance_is_accepted() -> None:
    dist = TreeDistribution.from_conditionals(
        TreeSpace.full(2, 1), lambda s: {0: 0.5, 1: 0.5 + 1e-12}
    )
    assert dist.termination(()) == 0.0


def test_from_point_masses_rounding_above_one_is_accepted() -> None:
    # Regression: masses pushed through 60 kernel compositions came out as
    # 1.0000000000000002 on a single path; rounding must not be rejected.
    masses: dict[Path, float] = {(0,): 1.0 + 2.0**-52, (1,): 1e-17}
    dist = TreeDistribution.from_point_masses(TreeSpace.full(2, 1), masses)
    assert dist.path_prob(()) > 1.0 - 1e-12
    with pytest.raises(ValueError, match=r"masses\[\(0,\)\] = 1.000001"):
        TreeDistribution.from_point_masses(TreeSpace.full(2, 1), {(0,): 1.000001})


@pytest.mark.parametrize(
    "masses, match",
    [
        ({(0,): 0.5, (1,): 0.4}, "masses sum to"),
        ({(0,): 1.2, (1,): -0.2}, r"masses\[\(0,\)\] = 1.2"),
        ({(0,): 0.5, (2,): 0.5}, r"masses has path \(2,\), which is not in the tree space"),
    ],
)
def test_from_point_masses_bad_input_raises_naming_masses(
    masses: dict[Path, float], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        TreeDistribution.from_point_masses(TreeSpace.full(2, 1), masses)


def test_queries_outside_support_or_space_raise() -> None:
    dist = hand()
    with pytest.raises(ValueError, match="outside the support"):
        dist.child_prob(0, (1, 0))
    with pytest.raises(ValueError, match="outside the support"):
        dist.termination((1, 0))
    with pytest.raises(ValueError, match="prefix .* outside the support"):
        dist.condition((1, 0))
    with pytest.raises(ValueError, match=r"child 2 is not in Sigma"):
        dist.child_prob(2, ())
    with pytest.raises(ValueError, match="not in the tree space"):
        dist.path_prob((0, 5))
    with pytest.raises(ValueError, match="depth must be >= 0"):
        dist.tail_mass(-1)


def test_space_bad_arguments_raise() -> None:
    with pytest.raises(ValueError, match="vocab must be >= 1"):
        TreeSpace.full(0, 2)
    with pytest.raises(ValueError, match="max_depth must be >= 0"):
        TreeSpace(lambda s: (0,), -1)


@pytest.mark.parametrize("path", [[0.9], (1.7, 0), [True], "10", b"\x01", [None]])
def test_paths_must_hold_integer_tokens(path):
    """``int()`` read 0.9 as token 0, 1.7 as 1, True as 1 and the text "10" as (1, 0): a wrong answer
    instead of a ValueError.  Integral floats (1.0) and numpy integers are tokens (tmc.validate.check_int)."""
    dist = TreeDistribution.from_point_masses(TreeSpace.full(2, 2), {(0,): 0.25, (1, 0): 0.75})
    with pytest.raises(ValueError, match=r"^path"):
        dist.path_prob(path)
    with pytest.raises(ValueError, match=r"^prefix"):
        dist.condition(path)
    assert dist.path_prob([1.0, 0]) == dist.path_prob((1, 0)) == 0.75
