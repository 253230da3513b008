"""Torch verifiers (spec.llm.verify) at the edges of their numerical rules, against the numpy references of tmc.

Each case puts a uniform at (or an ulp beside) a threshold where one of the
port's rules — the rests form of a difference, the log-ratio form of a running
weight, the proposal law of a first ``swor`` child or of a lone child, the
``1 − a`` form of a Traversal value, K-SEQ's capped residual — decides the
emitted tokens; plus one bad-input message and one top-k tie rule of
:func:`spec.llm.sampling.process_logits`.  The expected tokens come from
the numpy reference sampler on the same arrays and uniforms (STYLE.md rule
11), and where they are short, from a hand argument stated in the test too.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tmc import Draw, DraftTree  # noqa: E402
from tmc.chain import block_sample_from_uniforms  # noqa: E402
from tmc.kseq import kseq_sample_from_uniforms  # noqa: E402
from tmc.ordered_traversal import ordered_traversal_sample_from_uniforms  # noqa: E402
from tmc.multidraft import multidraft_sample_from_uniforms  # noqa: E402
from tmc.traversal import traversal_sample_from_uniforms  # noqa: E402

from spec.llm.sampling import process_logits  # noqa: E402
from spec.llm.verify import verify_chain, verify_tree  # noqa: E402

pytestmark = pytest.mark.llm

ONE_BELOW = math.nextafter(1.0, 0.0)


def one_child_tree(tok: int, q_row: list[float], p_root: list[float], kind: str = "iid") -> tuple[DraftTree, np.ndarray, np.ndarray]:
    """A one-node tree (a root child ``tok`` drawn from ``q_row``): the numpy tree, and the ``(2, V)`` draft and
    target rows of the torch API (the leaf's rows uniform; the leaf's draft row is never read)."""
    vocab = len(q_row)
    tree = DraftTree((-1,), (tok,), (Draw.parse(kind, "draws"),), {-1: np.array(q_row)}, vocab)
    flat = [1.0 / vocab] * vocab
    return tree, np.array([q_row, flat]), np.array([p_root, flat])


# ------------------------------------------------------------ validation


def test_a_bad_draft_row_is_named_by_its_row_in_draft_probs():
    """A tree whose root children are ``topk`` reads only row 1 of ``draft_probs`` (node 0's ``iid`` child); a
    bad row there is reported as ``draft_probs row 1``, its index in the caller's array (module doc)."""
    q = [[0.3, 0.7], [0.6, 0.6], [0.5, 0.5]]  # row 0 unread (topk), row 1 sums to 1.2
    p = [[0.5, 0.5]] * 3
    with pytest.raises(ValueError, match=r"^draft_probs row 1 sums to 1\.2"):
        verify_tree("multidraft", [0, 1], [-1, 0], ["topk", "iid"], q, p, [0.1, 0.2, 0.3])


# --------------------------------------------- the rests form of a difference


def test_residual_uses_the_rests_only_where_both_rows_exceed_one_half():
    """``tmc.residual.row_difference`` takes the difference of the rests only at a token where *both* rows exceed
    1/2; here only the target does (``p(2) = 0.864``, ``q(2) = 0.202``), and the last uniform sits on the
    boundary of the residual's first cell, where the two forms of ``p(2) − q(2)`` draw different tokens."""
    q_row = [0.7976390211525802, 0.0, 0.20236097884741983]
    p_root = [0.1246161283930244, 0.011361306324790025, 0.8640225652821855]
    tree, q, p = one_child_tree(0, q_row, p_root)
    u = np.array([0.24065064191450491, 0.01688101021082052])  # draft 0 rejected: 0.24 > 0.1246 / 0.7976
    want = multidraft_sample_from_uniforms(tree, p, u)
    assert want == [1]
    assert verify_tree("multidraft", [0], [-1], "iid", q, p, u).tokens.tolist() == want


def test_residual_keeps_the_plain_difference_at_exactly_one_half():
    """At a token where both rows hold exactly 1/2 the difference is ``0.5 − 0.5 = 0`` (the rests rule needs both
    strictly above 1/2), so the residual gives that token no mass and ``u = 0`` draws the next token with mass."""
    q_row = [0.5, 0.023389586482066117, 0.47661041351793393]
    p_root = [0.5, 0.4608494573363982, 0.0391505426636018]
    tree, q, p = one_child_tree(2, q_row, p_root)
    u = np.array([ONE_BELOW, 0.0])  # draft 2 rejected; the residual is (p − q)_+ = mass at token 1 only
    want = multidraft_sample_from_uniforms(tree, p, u)
    assert want == [1]
    assert verify_tree("multidraft", [2], [-1], "iid", q, p, u).tokens.tolist() == want


def test_a_token_both_rows_hold_near_one_is_accepted_when_its_rests_say_so():
    """Both rows hold token 0 as ``1 − tiny``; the target's rest ``p(1)`` is below the draft's, so
    ``p(0) ≥ q(0)`` by the rests and ``tmc.residual.acceptance_at`` accepts token 0 with probability 1, even at
    the last uniform below 1 (the float ratio alone could reject it, and the residual would re-emit token 0)."""
    q_row = [0.9999999999999998, 2.4760239495072857e-16]
    p_root = [0.9999999999999999, 2.4760239495070535e-16]
    tree, q, p = one_child_tree(0, q_row, p_root)
    u = np.array([ONE_BELOW, 0.0])
    want = multidraft_sample_from_uniforms(tree, p, u)
    assert want == [0, 0]
    assert verify_tree("multidraft", [0], [-1], "iid", q, p, u).tokens.tolist() == want


# --------------------------------------------------- chain running weights


def test_block_log_ratio_below_one_half_is_log_p_minus_log_q():
    """``tmc.chain._log_ratio`` uses ``log1p((p − q)/q)`` only for ``q/2 ≤ p ≤ 2q``; at a drafted ratio of 0.403 it
    is ``log p − log q``, and the first uniform sits on the stop threshold that form gives (no stop: the
    residual of row 0 emits token 1)."""
    q = np.array([[0.7405922601312885, 0.2594077398687116]])
    p = np.array([[0.29826489593142463, 0.7017351040685754], [0.36225576296309814, 0.637744237036902]])
    u = np.array([0.40273833793314245, 0.4604378467301887])
    want = block_sample_from_uniforms([0], q, p, u)
    assert want == [1]
    assert verify_chain("block", [0], torch.as_tensor(q), torch.as_tensor(p), torch.as_tensor(u)).tokens.tolist() == want


def test_block_excess_switches_to_its_one_minus_a_form_at_a_half():
    """``tmc.chain._scaled_excess`` forms ``a p − q`` as ``(p − q) − (1 − a) p`` for every weight ``a ≥ 1/2`` (not
    only at ``a = 1``); the last uniform sits on a boundary of the residual that form gives."""
    ref = [2, 0, 3]
    q = np.array([[0.0, 0.22506695076856678, 0.6919868150048173, 0.08294623422661593],
                  [0.8830734931847811, 0.05343752778908641, 0.0, 0.0634889790261325],
                  [0.176525579814295, 0.0, 0.021704854294428005, 0.8017695658912769]])
    p = np.array([[0.007936356790154354, 0.0, 0.41851194900779437, 0.5735516942020512],
                  [0.19931340701441666, 0.14025833474959176, 0.0, 0.6604282582359916],
                  [0.33753062747856183, 0.0, 0.0, 0.6624693725214381],
                  [0.3750385513755285, 0.24500467677368148, 0.37995677185079, 0.0]])
    u = np.array([0.455900512875024, 0.12344146015396296, 0.7145197417311282, 0.0854562553822511])
    want = block_sample_from_uniforms(ref, q, p, u)
    assert want == [2, 3]
    assert verify_chain("block", ref, torch.as_tensor(q), torch.as_tensor(p), torch.as_tensor(u)).tokens.tolist() == want


# ------------------------------------------------------------------ trees


def test_first_swor_child_is_tested_against_the_stored_row():
    """The first child drawn without replacement has the stored draft row as its law, not renormalised again
    (``tmc.multidraft.proposal_laws``); the first uniform sits on its ratio ``p(0) / q(0)``: rejected, and the
    residual then emits token 2 (the second child, token 1, has no target mass)."""
    q_row = [0.8056860644950632, 0.1013109114903529, 0.09300302401458377]
    p_root = [0.6854351945163296, 0.0, 0.3145648054836704]
    tree = DraftTree((-1, -1), (0, 1), (Draw.SWOR,) * 2, {-1: np.array(q_row)}, 3)
    q = np.array([q_row, [1 / 3] * 3, [1 / 3] * 3])
    p = np.array([p_root, [1 / 3] * 3, [1 / 3] * 3])
    u = np.array([0.8507472385610927, 0.5, 0.5])
    want = multidraft_sample_from_uniforms(tree, p, u)
    assert want == [2]
    assert verify_tree("multidraft", [0, 1], [-1, -1], "swor", q, p, u).tokens.tolist() == want


def test_traversal_child_value_is_one_minus_its_miss_at_exactly_one_half():
    """``tmc.traversal._child_state`` returns ``a = 1 − m`` whenever the child's miss ``m ≤ 1/2``.  Here
    ``r(1) = 0.25 − 2^-55`` and ``q(1) = 0.5``: ``q − r`` rounds to 0.25, so ``m = 0.5`` exactly and ``a = 0.5``,
    while ``r/q`` is ``0.5 − 2^-54``; at ``u = 0.5 − 2^-54`` the child is accepted (u < 0.5)."""
    r1 = 0.25 - 2.0**-55
    assert 0.75 + r1 == 1.0  # the row needs no renormalisation
    tree, q, p = one_child_tree(1, [0.5, 0.5], [0.75, r1])
    u = np.array([0.5 - 2.0**-54, 0.9])
    want = traversal_sample_from_uniforms(tree, p, u)
    assert want == [1, 1]
    assert verify_tree("traversal", [1], [-1], "iid", q, p, u).tokens.tolist() == want


def test_kseq_residual_gives_the_capped_tokens_no_mass():
    """K-SEQ's residual ``p − min(q, p/ρ) c`` is 0 on a capped token (``ρ q ≥ p``) at ``ρ* > 1``, where
    ``c = ρ``; the bisection leaves ``1 − c/ρ`` at an ulp there and ``tmc.kseq._residual`` rounds it to 0.
    Both children (tokens 0 and 1, capped) rejected, ``u = 0`` draws the first token with mass: token 2."""
    q_row = [0.623839827363522, 0.36949546489825147, 0.006664707738226569]
    p_root = [0.7329127043395601, 0.21552579530697635, 0.05156150035346345]  # p/q = 1.17, 0.58, 7.7
    tree = DraftTree((-1, -1), (0, 1), (Draw.IID,) * 2, {-1: np.array(q_row)}, 3)
    q = np.array([q_row, [1 / 3] * 3, [1 / 3] * 3])
    p = np.array([p_root, [1 / 3] * 3, [1 / 3] * 3])
    u = np.array([ONE_BELOW, ONE_BELOW, 0.0])
    want = kseq_sample_from_uniforms(tree, p, u)
    assert want == [2]
    assert verify_tree("kseq", [0, 1], [-1, -1], "iid", q, p, u).tokens.tolist() == want


def test_kseq_residual_treats_a_token_at_ratio_rho_as_capped():
    """``tmc.kseq._residual`` counts a token with ``ρ q(t) = p(t)`` exactly as capped (``ρ q ≥ p``): its residual
    is ``p (1 − c/ρ)``, rounded to 0 at ``ρ* > 1``.  Token 0 sits on that tie (``p(0) = ρ q(0)`` in floats at
    this row's ``ρ = 1.3190263800591229``); both children rejected, ``u = 0`` draws token 1, not token 0."""
    q_row = [0.00048828125, 0.013169037893552482, 0.7850592899552918, 0.2012833909011556]
    p_root = [0.0006440558496382436, 0.11914813955522167, 0.7170413887472753, 0.16316641584786482]
    assert q_row[0] * 1.3190263800591229 == p_root[0]
    tree = DraftTree((-1, -1), (2, 3), (Draw.IID,) * 2, {-1: np.array(q_row)}, 4)
    q = np.array([q_row, [0.25] * 4, [0.25] * 4])
    p = np.array([p_root, [0.25] * 4, [0.25] * 4])
    u = np.array([ONE_BELOW, ONE_BELOW, 0.0])
    want = kseq_sample_from_uniforms(tree, p, u)
    assert want == [1]
    assert verify_tree("kseq", [2, 3], [-1, -1], "iid", q, p, u).tokens.tolist() == want


def test_ordered_traversal_keeps_the_recorded_law_of_a_lone_child():
    """A node with one child has nothing to sort: ``tmc.ordered_traversal.ratio_ordered_children`` keeps the child's
    recorded law (the stored draft row, not an order-statistic law renormalised again); the first uniform sits
    an ulp above the child's value, so the child is rejected and the residual emits token 0."""
    q_row = [0.0, 0.8442012054976455, 0.05597338696405749, 0.09982540753829708]
    p_root = [0.44026400403340005, 0.5597359959665998, 0.0, 0.0]
    tree, q, p = one_child_tree(1, q_row, p_root)
    u = np.array([0.6630362433996322, 0.5])
    want = ordered_traversal_sample_from_uniforms(tree, p, u)
    assert want == [0]
    assert verify_tree("ordered_traversal", [1], [-1], "iid", q, p, u).tokens.tolist() == want


# ---------------------------------------------------------------- sampling


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_top_k_ranks_logits_closer_than_their_distance_to_the_maximum(temperature):
    """Top-k keeps the ``k`` largest logits as given, at any ``T > 0``: ``2e-20 > 1e-20`` keeps token 2, though
    ``x − max`` rounds both to ``−40`` (at ``T = 0.5`` the shift comes first: the two tied at ``−80`` kept token 1
    until 2026-11-28).  Hand value: softmax of ``[40, 2e-20] / T`` over tokens 0 and 2."""
    logits = torch.tensor([40.0, 1e-20, 2e-20], dtype=torch.float64)
    tail = math.exp(-40.0 / temperature) / (1.0 + math.exp(-40.0 / temperature))
    expected = torch.tensor([1.0 - tail, 0.0, tail], dtype=torch.float64)
    got = process_logits(logits, temperature=temperature, top_k=2)
    assert got[1] == 0.0 and got[2] > 0.0
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=0.0)
