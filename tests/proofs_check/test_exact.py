"""Unit tests of the exact machinery the theorem checks rely on."""

from __future__ import annotations

from fractions import Fraction

import pytest

from proofs_check.chain_literal import asps_literal, block_literal, rational_rows, simplest_row, sps_literal
from proofs_check.dyspec import TokenTree, brute_force_best, dp_best, greedy_subtree, rooted_subtrees
from proofs_check.exact import (
    ExactTree,
    Shape,
    compose,
    limit_kernel,
    power,
    product_defect,
    sub_defect,
    walk_kernel,
)
from proofs_check.neighbour import ASPS, SPS, output_law
from proofs_check.speculative import paper_example
from tmc import paper_toy_model
from tmc.tree import TreeSpace

HALF = Fraction(1, 2)


def test_shape_is_a_value_comparable_tree_space() -> None:
    a, b = Shape.full(2, 2), Shape.full(2, 2)
    assert a == b and TreeSpace(a) == TreeSpace(b)
    assert len(a.nodes()) == 7 and a.children((0,)) == (0, 1) and a.is_leaf((0, 1))


def test_shape_rejects_unreachable_nodes() -> None:
    with pytest.raises(ValueError, match="not reachable"):
        Shape.from_children({(): [0], (1,): [0]})


def test_exact_tree_rejects_masses_not_summing_to_one() -> None:
    with pytest.raises(ValueError, match="not exactly 1"):
        ExactTree(Shape.full(2, 1), {(0,): HALF})


def test_exact_tree_conditionals_are_undefined_outside_the_support() -> None:
    p = ExactTree(Shape.full(2, 1), {(0,): Fraction(1)})
    with pytest.raises(ValueError, match="outside the support"):
        p.cond((1,))
    assert p.cond(()) == {0: 1, 1: 0}


def test_sub_defect_and_product_defect_on_a_hand_pair() -> None:
    shape = Shape.full(2, 1)
    p2 = ExactTree(shape, {(0,): HALF, (1,): HALF})
    thinned = ExactTree(shape, {(): HALF, (0,): Fraction(1, 4), (1,): Fraction(1, 4)})
    skewed = ExactTree(shape, {(): HALF, (0,): Fraction(1, 2)})
    assert sub_defect(thinned, p2) == 0 and product_defect(thinned, p2) == 0
    assert sub_defect(skewed, p2) > 0 and product_defect(skewed, p2) > 0
    assert sub_defect(p2, thinned) > 0  # c = 2 > 1
    assert product_defect(p2, thinned, termination=False) == 0  # only the termination clause sees it


def test_limit_of_a_stopping_walk_is_the_target() -> None:
    shape = Shape.full(2, 2)
    kernel = walk_kernel(
        lambda prefix, node: {} if len(node) == 2 else {0: Fraction(1, 4), 1: Fraction(1, 4)}
    )
    limit = limit_kernel(kernel)(())
    assert limit == {leaf: Fraction(1, 4) for leaf in shape.nodes() if len(leaf) == 2}
    assert power(kernel, 0)(()) == {(): 1}
    assert compose(kernel, kernel)(()) == power(kernel, 2)(())


def test_paper_example_output_laws_keep_the_target_marginals() -> None:
    case = paper_example()
    for coupling in (SPS, ASPS):
        law = output_law(case, coupling)
        assert sum(law.values()) == 1
        # the first token of the output follows p exactly: (0.3, 0.4, 0.3)
        first = {a: sum(v for s, v in law.items() if s[:1] == (a,)) for a in range(3)}
        assert first == {0: Fraction(3, 10), 1: Fraction(2, 5), 2: Fraction(3, 10)}


def test_paper_example_is_tmc_paper_toy_model_read_exactly() -> None:
    case, model = paper_example(), paper_toy_model()
    for s in case.ref.support():
        if case.continues(s):
            assert [float(x) for x in case.ref.cond(s).values()] == list(model.q(s))
    for s in case.shape.inner():
        assert [float(x) for x in case.target.cond(s).values()] == list(model.p(s))
    assert case.ref.cond(()) == {0: HALF, 1: Fraction(3, 10), 2: Fraction(1, 5)}


def test_simplest_row_reads_decimals_and_thirds_and_refuses_the_rest() -> None:
    assert simplest_row([0.3, 0.4, 0.3]) == (Fraction(3, 10), Fraction(2, 5), Fraction(3, 10))
    assert simplest_row([1 / 3] * 3) == (Fraction(1, 3),) * 3
    with pytest.raises(ValueError, match="denominator"):
        simplest_row([1e-12, 1 - 1e-12])
    with pytest.raises(ValueError, match="sum to exactly 1"):
        simplest_row([0.5, 0.4])


def test_chain_literals_on_the_paper_toy_draft_aa() -> None:
    q_rows, p_rows = paper_toy_model().chain_rows((0, 0))
    q, p = [list(simplest_row(r)) for r in q_rows], [list(simplest_row(r)) for r in p_rows]
    sps, asps = sps_literal([0, 0], q, p), asps_literal([0, 0], q, p)
    assert sum(map(sum, sps)) == sum(map(sum, asps)) == 1
    # Tables 2 (SpS) and 3 (ASpS), column aa, over P_ref(aa) = 0.2: outputs b and c get 0.04 or 0.05
    assert sps[0] == [0, Fraction(1, 5), Fraction(1, 5)] and asps[0] == [0, Fraction(1, 4), Fraction(1, 4)]
    assert block_literal([0, 0], q, p) == asps
    assert rational_rows(q_rows) != q  # binary values of 0.3 etc., not 3/10


def test_rooted_subtree_counts_of_a_complete_binary_tree() -> None:
    children = lambda s: [s + (0,), s + (1,)] if len(s) < 2 else []  # noqa: E731
    counts = [sum(1 for _ in rooted_subtrees((), children, k)) for k in range(1, 8)]
    # each child branch is absent, the child alone, it plus one of 2 leaves, or all three:
    # 1 + x + 2x^2 + x^3; the root times its square has coefficients 1, 2, 5, 6, 6, 4, 1
    assert counts == [1, 2, 5, 6, 6, 4, 1]


def test_greedy_matches_brute_force_and_dp_on_a_hand_tree() -> None:
    rows = {
        (): (Fraction(3, 5), Fraction(2, 5)),
        (0,): (HALF, HALF),
        (1,): (Fraction(9, 10), Fraction(1, 10)),
    }
    tree = TokenTree(2, 2, rows)
    for size in range(1, 8):
        chosen = greedy_subtree((), tree.children, tree.weight, size)
        got = sum(tree.weight(u) for u in chosen)
        assert (
            got
            == brute_force_best((), tree.children, tree.weight, size)[0]
            == dp_best((), tree.children, tree.weight, size)
        )


def test_greedy_rejects_a_bad_size() -> None:
    with pytest.raises(ValueError, match="size"):
        greedy_subtree((), lambda s: [], lambda s: Fraction(1), 0)
