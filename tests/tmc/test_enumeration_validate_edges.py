"""Edges of tmc.enumeration, tmc.residual and tmc.validate that a mutation audit (2026-11-28) changed without
any test failing.

Each case is a documented rule of its function, with the expected value derived by hand in the comment or by
exact rational arithmetic (never read off the code): a prefix passed through, the exact residual at a token
both rows hold above 1/2, the degenerate residual, a refusal at the public boundary.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from tmc import ToyModel, multidraft_kernel, sps_kernel
from tmc.enumeration import (
    averaged_chain_law,
    averaged_tree_law,
    chain_joint_law,
    chain_output_law,
    enumerate_draft_trees,
    tree_output_law,
    tree_p_rows,
)
from tmc.residual import acceptance_at, residual
from tmc.validate import check_int, check_prob_rows

# --- enumeration after a prefix ---------------------------------------------------------------------------
#
# Two tokens.  After the prefix (1,) the target is p = (0.9, 0.1) and the draft q = (0.2, 0.8); every other
# prefix has p = q = (0.5, 0.5).  One SpS step of one draft token after (1,), by hand:
#   draft 0 (q = 0.2): p(0) >= q(0), accepted; bonus token from p(.|1, 0) = (.5, .5): (0, 0) and (0, 1), 0.1 each;
#   draft 1 (q = 0.8): accepted with p(1) / q(1) = 1/8, so 0.1 in all; bonus from (.5, .5): (1, 0), (1, 1), 0.05 each;
#                      rejected with 0.7: the residual norm((p - q)_+) = norm(0.7, 0) emits (0,).
# From the root instead (p = q = (0.5, 0.5)) every draft token is accepted: a different law.

PREFIX = (1,)
HALF = [0.5, 0.5]


def _model() -> ToyModel:
    return ToyModel(2, {PREFIX: [0.2, 0.8]}, {(): HALF, PREFIX: [0.9, 0.1]}, np.array(HALF), np.array(HALF))


SPS_LAW = {(0,): 0.7, (0, 0): 0.1, (0, 1): 0.1, (1, 0): 0.05, (1, 1): 0.05}
SPS_JOINT = {((0,), (0, 0)): 0.1, ((0,), (0, 1)): 0.1, ((1,), (0,)): 0.7, ((1,), (1, 0)): 0.05, ((1,), (1, 1)): 0.05}


def test_chain_laws_enumerate_the_drafts_after_the_prefix() -> None:
    """chain_output_law, averaged_chain_law and chain_joint_law draft and verify after ``prefix``: SpS after (1,)
    has the hand-enumerated law above, E[len] = 0.7 * 1 + 0.3 * 2 = 1.3 and, lossless, completion error 0."""
    model = _model()
    out = chain_output_law(model, 1, sps_kernel, PREFIX)
    assert out.output_law == pytest.approx(SPS_LAW, abs=1e-15)
    assert out.expected_length == pytest.approx(1.3, abs=1e-15)
    assert out.completion_error <= 1e-15
    assert out.n_drafts == 2
    law, n = averaged_chain_law(model, 1, sps_kernel, PREFIX)
    assert (law, n) == (pytest.approx(SPS_LAW, abs=1e-15), 2)
    assert chain_joint_law(model, 1, sps_kernel, PREFIX) == pytest.approx(SPS_JOINT, abs=1e-15)


def test_tree_laws_enumerate_the_draft_trees_after_the_prefix() -> None:
    """A width-1, depth-1 draft tree is one draft token: residual verification after (1,) is SpS there, so
    tree_output_law and averaged_tree_law give the same hand-enumerated law, with completion error 0."""
    model = _model()
    out = tree_output_law(model, (1,), "iid", multidraft_kernel, PREFIX)
    assert out.output_law == pytest.approx(SPS_LAW, abs=1e-15)
    assert out.completion_error <= 1e-15
    law, n = averaged_tree_law(model, (1,), "iid", multidraft_kernel, PREFIX)
    assert (law, n) == (pytest.approx(SPS_LAW, abs=1e-15), 2)


def test_draft_trees_and_their_target_rows_follow_the_prefix() -> None:
    """enumerate_draft_trees weighs each one-token tree by q(x | 1) = (0.2, 0.8); tree_p_rows gives the root
    row p(. | 1) = (0.9, 0.1) and then p(. | 1, x) = (0.5, 0.5), each row read after the prefix."""
    model = _model()
    trees = list(enumerate_draft_trees(model, (1,), "iid", PREFIX))
    assert sorted((t.tokens, w) for w, t in trees) == [((0,), pytest.approx(0.2)), ((1,), pytest.approx(0.8))]
    for _, tree in trees:
        np.testing.assert_allclose(tree_p_rows(model, tree, PREFIX), [[0.9, 0.1], HALF], rtol=0, atol=1e-15)


# --- residual -----------------------------------------------------------------------------------------------


def _exact_residual(r: list[Fraction], law: list[Fraction]) -> list[float]:
    """norm((r - law)_+) in rational arithmetic."""
    pos = [max(a - b, Fraction(0)) for a, b in zip(r, law)]
    total = sum(pos)
    return [float(x / total) for x in pos]


def test_residual_at_a_token_both_rows_hold_above_one_half_is_the_difference_of_the_rests() -> None:
    """row_difference's documented case: q = [1e-17, 0, 1.0], p = [1e-30, 1e-30, 1.0].  Token 2 stands for
    1 - 1e-17 and 1 - 2e-30, so after rejecting token 0 the residual is almost all at token 2, not at 1."""
    q, p = np.array([1e-17, 0.0, 1.0]), np.array([1e-30, 1e-30, 1.0])
    f = [Fraction(x) for x in (1e-30, 1e-30, 1e-17)]
    exact = _exact_residual([f[0], f[1], 1 - f[0] - f[1]], [f[2], Fraction(0), 1 - f[2]])
    np.testing.assert_allclose(residual(p, q, 0), exact, rtol=1e-12, atol=1e-300)
    assert exact[2] > 1 - 1e-12


def test_acceptance_reads_r_at_least_law_from_the_rests() -> None:
    """acceptance_at is 1 wherever both rows hold the token above 1/2 and r(tok) >= law(tok) by the rests:
    the docstring's rows (r's rest 1e-12 - 4e-28 below law's), and rows whose rests are equal (0.1 each)
    though the token's entries differ by one rounding."""
    r = np.array([9.999999999989997e-13, 0.9999999999989999])
    law = np.array([9.999999999990001e-13, 0.999999999999])
    assert Fraction(law[0]) > Fraction(r[0])  # the rests: r(1) > law(1)
    assert acceptance_at(r, law, 1) == 1.0
    r2, law2 = np.array([0.1, 0.9]), np.array([0.1, 0.9000000000000001])
    assert r2[1] < law2[1]  # the entries as floats, while the rests tie
    assert acceptance_at(r2, law2, 1) == 1.0


def test_degenerate_residual_drops_the_rejected_token_or_returns_r() -> None:
    """With no mass in (r - law)_+ (r == law) the rule returns r without the rejected token, renormalised:
    (0.25, 0.75) less token 0 is (0, 1); if that token held all of r, r itself: a row summing to 1 again."""
    row = np.array([0.25, 0.75])
    np.testing.assert_array_equal(residual(row, row.copy(), 0), [0.0, 1.0])
    point = np.array([0.0, 1.0])
    np.testing.assert_array_equal(residual(point, point.copy(), 1), [0.0, 1.0])


# --- validation at the public boundary -------------------------------------------------------------------------


def test_check_int_refuses_booleans_and_values_below_the_minimum_in_every_integer_type() -> None:
    """Ids are integers: ``True`` is not one (though Python's bool is an int), and the minimum holds for
    numpy integers and integral floats as it does for plain ints."""
    with pytest.raises(ValueError, match=r"vocab must be an integer, got True"):
        check_int("vocab", True)
    for zero in (np.int64(0), 0.0):
        with pytest.raises(ValueError, match=r"width must be >= 1, got 0"):
            check_int("width", zero, minimum=1)


def test_probability_rows_refuse_a_boolean_in_an_object_array() -> None:
    """Probabilities are real numbers: an object array holding ``True`` is refused, not read as 1.0."""
    with pytest.raises(ValueError, match=r"p_rows has a non-numeric entry True"):
        check_prob_rows("p_rows", np.array([[0.0, True]], dtype=object))


def test_empty_draft_rows_must_still_be_a_2d_table() -> None:
    """``n = 0`` allows q_rows of shape (0, V); a 1-D empty q_rows is a ValueError naming q_rows."""
    with pytest.raises(ValueError, match=r"q_rows must be a 2-D array"):
        sps_kernel([], np.zeros(0), [HALF])


def test_chain_target_rows_must_be_exactly_one_more_than_the_draft_tokens() -> None:
    """p_rows has shape (n + 1, V): for one draft token, three target rows are refused as well as one."""
    for rows in (1, 3):
        with pytest.raises(ValueError, match=rf"p_rows has shape \({rows}, 2\); expected \(n \+ 1, V\) = \(2, 2\)"):
            sps_kernel([0], [HALF], [HALF] * rows)


def test_a_negative_entry_is_named_by_its_row_and_its_token() -> None:
    """The error names the row and then the token of the first negative entry: -0.5 in row 2 at token 0."""
    rows = np.array([[0.2, 0.3, 0.5], [0.2, 0.3, 0.5], [-0.5, 0.75, 0.75]])
    with pytest.raises(ValueError, match=r"^rows row 2 has a negative entry -0.5 at token 0$"):
        check_prob_rows("rows", rows)
