"""The bias audit (issue 9): minimal counterexamples, reach, sampler vs kernel, confirmation, CLI.

Every expected number below is derived by hand in a comment, never read back
from the function that produced it.  Minimal vocabularies and shapes asserted
here are the true minima, not artefacts of a seed: a one-token vocabulary
cannot be biased, the wrong-proposal rule on a width-1 tree is the right rule,
and the i.i.d. rule on two children drawn without replacement is exact for
V = 2 (the second child is then the other token, accepted surely after a
rejection).  Budgets are small so the file stays fast; the shipped defaults
search more.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tmc
from tmc.chain import sps_kernel, sps_sample
from tmc.drafts import tree_drafts
from tmc.laws import completed_law, target_law, total_variation
from tmc.multidraft import ALL_DRAWS, ROOT, Draw, multidraft_kernel, multidraft_sample, proposal_laws
from tmc.noise import categorical
from tmc.residual import acceptance_probability, residual
from tmc.toy import ToyModel
from tmc.validate import check_chain
from verification.audit import (
    AUDIT_CHAIN_LENGTHS,
    AUDIT_TREE_SHAPES,
    AuditCase,
    AuditConfig,
    Cell,
    audit,
    audit_cases,
    cli_main,
    confirm_tv,
    exact_evaluation,
    search_cells,
)
from verification.audit.space import draft_nodes, vocab_limit
from verification.audit.evaluate import Evaluation, sample_size
from verification.audit.search import CaseSearch, CellLog, confirm, run_search, settle
from verification.examples import (
    ASPS,
    BIASED_EXAMPLES,
    BLOCK,
    IID_RULE_ON_IID,
    IID_RULE_ON_SWOR,
    KSEQ,
    MULTIDRAFT,
    ORDERED_TRAVERSAL,
    SPS,
    TRAVERSAL,
    TUTORIAL_TREE_WALK,
    WETAP_BEAM,
    ChainVerifier,
    TreeVerifier,
    greedy_match_sample,
    wetap_beam_verifier,
)
from verification.calibrated import kl_required_samples
from verification.strategies import RELATIONS

THIRD = 1.0 / 3.0

# name -> (vocab, widths, draw, q, p, completion TV) of the minimal case the audit reports (seed 0).
# Hand derivations of the TVs (L = depth + 1 = 2, so target cells are the 4 or 9 pairs t):
# * greedy_match, q = (0, 1), p = (1/2, 1/2): the draft is always 1, argmax p breaks the tie to 0,
#   so the step always emits (0,).  C(0, b) = p(b) = 1/2, C(1, b) = 0; P(t) = 1/4 everywhere:
#   TV = 1/2 (4 · 1/4).
# * tutorial walk, WETAP (tau 0.5) and the i.i.d. rule on top-k, q = p = (1/2, 1/2): the top-1
#   child is token 0 (ties to the lower id); each accepts it surely (p/q = 1 > tau), then emits
#   b ~ p: C(0, b) = 1/2, C(1, b) = 0 against P = 1/4: TV = 1/2.  (The correct rule for a
#   point-mass proposal accepts with probability r(0) = 1/2 only.)
# * i.i.d. rule on swor, q = (2/3, 0, 1/3), p = (0, 1/2, 1/2): children (0, 2) with probability
#   2/3 (then 2 surely), (2, 0) with 1/3.  (0, 2): 0 is rejected (p(0) = 0), r = norm((p - q)+) =
#   norm((0, 1/2, 1/6)) = (0, 3/4, 1/4); 2 is accepted with min(1, r(2)/q(2)) = 3/4 (the rule
#   divides by q(2) = 1/3, not by the law 2 was drawn from, 1), else r = norm((r - q)+) = (0, 1, 0)
#   emits 1.  (2, 0): 2 is accepted (p(2)/q(2) > 1).  So K(1) = 2/3 * 1/4 = 1/6 and
#   K(2, b) = 5/6 p(b): C(1, b) = 1/12, C(2, b) = 5/12 against P = 1/4 on {1, 2}^2:
#   TV = 1/2 (2 * 1/6 + 2 * 1/6) = 1/3.
MINIMAL = {
    "greedy_match": (2, (1,), None, [0.0, 1.0], [0.5, 0.5], 0.5),
    "tutorial_tree_walk": (2, (1,), Draw.TOPK, [0.5, 0.5], [0.5, 0.5], 0.5),
    "wetap_beam(tau=0.5)": (2, (1,), Draw.TOPK, [0.5, 0.5], [0.5, 0.5], 0.5),
    "iid_rule_on_topk": (2, (1,), Draw.TOPK, [0.5, 0.5], [0.5, 0.5], 0.5),
    "iid_rule_on_swor": (3, (2,), Draw.SWOR, [2 * THIRD, 0.0, THIRD], [0.0, 0.5, 0.5], THIRD),
    "broken_traversal": (2, (1, 1), Draw.IID, [0.0, 1.0], [0.5, 0.5], 0.125),
    "kseq_rho_one": (2, (2,), Draw.IID, [0.0, 1.0], [0.5, 0.5], 0.25),
}
# kseq_rho_one, q = (0, 1), p = (1/2, 1/2): both drafts are token 1, each accepted with
#   min(1, p(1) / (1 * q(1))) = 1/2, so "1 b" has 3/4; beta = Σ min(q, p) = 1/2,
#   c = (1 - (1/2)^2) / (1/2) = 3/2 and p_res ∝ (p - min(q, p) c)+ = (1/2, 0): "0" has 1/4.
#   Completed: (1, b) 3/8 and (0, b) 1/8 against 1/4: TV = 1/2 (4 * 1/8) = 1/4.
# broken_traversal, q = (0, 1), p = (1/2, 1/2) after every prefix, the draft is always "1 1".
#   Correct Traversal: the leaf's value is min(1, 1/2 * 1/2) = 1/4, so "1 1 b" has 1/8 each.
#   Deleting the leaf leaves node "1" with h = Σ(a p - q)+ = 1/4, R = (1 - a) + h = 3/4, value
#   1/3 and row (1, 0): "1 0" has 3/4 * 1/3 = 1/4; the root then emits 0 with 1/2.  Lossless.
#   BIASED (value left at 1/2): "1 0" has 3/4 * 1/2 = 3/8 and "0" has 3/8.  Completed to
#   length 3 against P = 1/8 per path: 4 cells of 3/32 (-1/32) and 2 of 3/16 (+1/16):
#   TV = 1/2 (4/32 + 2/16) = 1/8.
# The case of issue 9's report, V = 3, q = (0, 1/2, 1/2), p = (1/3, 0, 2/3), (2,) swor: children
# (1, 2) or (2, 1), each 1/2.  (1, 2): 1 is rejected (p(1) = 0), r = norm((p - q)+) = (2/3, 0, 1/3);
# 2 is accepted with min(1, r(2)/q(2)) = 2/3, else r = norm((r - q)+) = (1, 0, 0) emits 0.
# (2, 1): 2 is accepted (p(2)/q(2) > 1).  So K(0) = 1/6 and K(2, b) = 5/6 p(b):
# C = (1/18, 1/9, 5/18, 5/9) on (0,0), (0,2), (2,0), (2,2) against P = (1/9, 2/9, 2/9, 4/9):
# TV = 1/2 (1/18 + 1/9 + 1/18 + 1/9) = 1/6.
ISSUE_9_CASE = (3, (2,), Draw.SWOR, [0.0, 0.5, 0.5], [THIRD, 0.0, 2 * THIRD])
FAST = {"check_sampler": False}  # the sampler check has its own tests


def shared_case(vocab, widths, draw, q, p) -> AuditCase:
    """A case with one row pair for every prefix, built by hand."""
    model = ToyModel(vocab, {}, {}, np.array(q), np.array(p))
    return AuditCase(Cell(vocab, tuple(widths), draw), model, "independent", "shared")


# ------------------------------------------------ deliberately biased test verifiers

SKEW_FROM = 3  # 0-based index of the 4th draft token


def _skewed_accept(k: int, p_row, q_row, tok: int) -> float:
    """SpS acceptance, halved from the 4th draft token on (the bug)."""
    a = acceptance_probability(float(p_row[tok]), float(q_row[tok]))
    return a / 2.0 if k >= SKEW_FROM else a


def skewed_sps_kernel(ref, q_rows, p_rows):
    toks, q, p = check_chain(ref, q_rows, p_rows)
    kernel, reach = np.zeros_like(p), 1.0
    for k, tok in enumerate(toks):
        a = _skewed_accept(k, p[k], q[k], int(tok))
        kernel[k] += reach * (1.0 - a) * residual(p[k], q[k], int(tok))
        reach *= a
    kernel[len(toks)] += reach * p[-1]
    return kernel


def skewed_sps_sample(ref, q_rows, p_rows, rng):
    toks, q, p = check_chain(ref, q_rows, p_rows)
    for k, tok in enumerate(toks):
        if rng.random() >= _skewed_accept(k, p[k], q[k], int(tok)):
            return [int(t) for t in toks[:k]] + [categorical(residual(p[k], q[k], int(tok)), float(rng.random()))]
    return [int(t) for t in toks] + [categorical(p[-1], float(rng.random()))]


# Exactly SpS on chains of at most 3 tokens, so only the reach to n >= 4 can flag it.
SKEWED_FROM_4TH = ChainVerifier("sps_skewed_from_4th", skewed_sps_sample, skewed_sps_kernel, True)


def removal_ignored_below_root(tree, node):
    """Proposal laws with one bug: below the root, swor children are verified against q itself."""
    laws = proposal_laws(tree, node)
    if node == ROOT:
        return laws
    return [tree.q_rows[node] if tree.draws[k] == Draw.SWOR else law for k, law in zip(tree.children(node), laws)]


# Exact on every tree whose nodes below the root have at most one child: only (1,2)-like shapes flag it.
SWOR_WRONG_BELOW_ROOT = TreeVerifier(
    "swor_residual_wrong_below_root",
    lambda tree, p_rows, rng: multidraft_sample(tree, p_rows, rng, proposals=removal_ignored_below_root),
    lambda tree, p_rows: multidraft_kernel(tree, p_rows, proposals=removal_ignored_below_root),
    biased=True,
)


def target_after_rejection_sample(tree, p_rows, rng):
    """Residual verification with a sampler-only bug: the final token always comes from p, never the residual."""
    p = np.asarray(p_rows, dtype=np.float64)
    u = rng.random(tree.size + 1)
    node = ROOT
    while True:
        r = p[node + 1]
        for kid, law in zip(tree.children(node), proposal_laws(tree, node)):
            tok = tree.tokens[kid]
            if u[kid] < acceptance_probability(float(r[tok]), float(law[tok])):
                node = kid
                break
            r = residual(r, law, tok)
        else:
            return list(tree.path(node)) + [categorical(p[node + 1], float(u[tree.size]))]


# A correct kernel shipped with a biased sampler: the exact search passes, the sampler check must not.
KERNEL_OK_SAMPLER_BIASED = TreeVerifier(
    "kernel_ok_sampler_biased", target_after_rejection_sample, multidraft_kernel, draws=(Draw.IID,)
)


# ------------------------------------------------------- the shipped examples


@pytest.mark.parametrize("verifier", BIASED_EXAMPLES, ids=lambda v: v.name)
def test_audit_flags_each_biased_example_with_its_minimal_counterexample(verifier):
    vocab, widths, draw, q, p, tv = MINIMAL[verifier.name]
    result = audit(verifier)  # the default search: AuditConfig()
    assert result.biased and result.exit_code == 1 and result.mode == "exact"
    case, ev = result.counterexample.case, result.counterexample.evaluation
    assert (case.vocab, case.widths, case.draw, case.layout) == (vocab, widths, draw, "shared")
    assert case.model.q(()) == pytest.approx(q) and case.model.p(()) == pytest.approx(p)
    assert ev.tv == pytest.approx(tv, abs=1e-12)
    # the same case built by hand gives the hand-derived TV
    assert exact_evaluation(verifier, shared_case(vocab, widths, draw, q, p)).tv == pytest.approx(tv, abs=1e-12)
    text = result.render()
    assert f"BIASED: TV {tv:.6g} on a minimal case" in text and "minimal counterexample: vocab" in text
    assert result.sampler.skipped == "the kernel is already biased"


def test_iid_rule_on_swor_laws_are_the_hand_derived_ones():
    # derivations in the comments on MINIMAL and ISSUE_9_CASE above
    ev = exact_evaluation(IID_RULE_ON_SWOR, shared_case(*ISSUE_9_CASE))
    assert ev.tv == pytest.approx(1 / 6, abs=1e-12)
    assert ev.output_law == pytest.approx({(0,): 1 / 6, (2, 0): 5 / 18, (2, 2): 5 / 9})
    assert ev.completed == pytest.approx({(0, 0): 1 / 18, (0, 2): 1 / 9, (2, 0): 5 / 18, (2, 2): 5 / 9})
    assert ev.target == pytest.approx({(0, 0): 1 / 9, (0, 2): 2 / 9, (2, 0): 2 / 9, (2, 2): 4 / 9})
    found = exact_evaluation(IID_RULE_ON_SWOR, shared_case(*MINIMAL["iid_rule_on_swor"][:5]))
    assert found.output_law == pytest.approx({(1,): 1 / 6, (2, 1): 5 / 12, (2, 2): 5 / 12})
    assert found.completed == pytest.approx({(1, 1): 1 / 12, (1, 2): 1 / 12, (2, 1): 5 / 12, (2, 2): 5 / 12})
    # the lossless rule on the same cases: the completed law is the target's
    for case in (ISSUE_9_CASE, MINIMAL["iid_rule_on_swor"][:5]):
        assert exact_evaluation(MULTIDRAFT, shared_case(*case)).tv < 1e-15


@pytest.mark.parametrize(
    "verifier",
    [SPS, ASPS, BLOCK, MULTIDRAFT, IID_RULE_ON_IID, TRAVERSAL, ORDERED_TRAVERSAL, KSEQ, wetap_beam_verifier(1.0)],
    ids=lambda v: v.name,
)
def test_audit_passes_each_lossless_verifier_and_its_sampler(verifier):
    result = audit(verifier, config=AuditConfig(budget=100, sampler_tv=0.3))
    assert not result.biased and result.exit_code == 0, result.render()
    assert result.counterexample is None and result.missable_tv == 1e-9
    assert all(rep.cases_tried >= 1 for rep in result.cells)  # every cell of the reach was reached
    groups = {(rep.cell.widths, rep.cell.draw) for rep in result.cells}
    assert len(result.sampler.checks) == len(groups) and result.sampler.failed is None
    assert all(c.alpha == pytest.approx(1e-6 / len(groups)) for c in result.sampler.checks)


def test_audit_is_reproducible_from_its_seed():
    a = audit(IID_RULE_ON_SWOR, config=AuditConfig(budget=80, seed=3))
    b = audit(IID_RULE_ON_SWOR, config=AuditConfig(budget=80, seed=3))
    assert a.counterexample.case.digest == b.counterexample.case.digest
    assert [c.cases_tried for c in a.cells] == [c.cases_tried for c in b.cells]


def test_tutorial_and_wetap_stay_biased_on_iid_drafts_where_q_is_the_right_proposal():
    # One i.i.d. child under the tutorial walk is SpS, so its minimal case needs two children;
    # WETAP's threshold is biased already on one i.i.d. child.
    tutorial = audit(TUTORIAL_TREE_WALK, config=AuditConfig(draws=("iid",), budget=150))
    wetap = audit(WETAP_BEAM, config=AuditConfig(draws=("iid",), budget=150))
    assert tutorial.draws == (Draw.IID,) and tutorial.counterexample.case.widths == (2,)
    assert wetap.counterexample.case.widths == (1,)
    assert tutorial.counterexample.case.vocab == wetap.counterexample.case.vocab == 2


# ------------------------------------------------- minimal among earlier cells


def test_rows_found_on_a_later_cell_are_moved_to_an_earlier_cell_where_they_are_biased():
    # Audit D1: at seed 3 the search first finds the bias on [3] swor, V = 3, with rows
    # q = (2/3, 0, 1/3), p = (0, 1/2, 1/2) (the README's case): q has support 2, so a width-3 draw without
    # replacement draws the same two children as a width-2 one and the rows are biased (TV 1/3, the
    # derivation on MINIMAL) on [2], an earlier cell that the search had tried and passed.  The case must
    # move to [2]; there the rows must be exact on [1] swor (one swor child is drawn from q: the i.i.d. rule
    # is SpS), the only earlier cell of V = 3 and swor.
    result = audit(IID_RULE_ON_SWOR, config=AuditConfig(seed=3, **FAST))
    case = result.counterexample.case
    assert (case.vocab, case.widths, case.draw) == (3, (2,), Draw.SWOR)
    assert result.moves == ((Cell(3, (3,), Draw.SWOR), Cell(3, (2,), Draw.SWOR)),)
    assert result.counterexample.evaluation.tv > 0.1
    assert exact_evaluation(IID_RULE_ON_SWOR, case.on(Cell(3, (1,), Draw.SWOR))).tv < 1e-12
    assert "found on V=3 [3] swor, biased already on V=3 [2] swor" in result.render()
    assert result.to_dict()["moves"] == [{"from": {"vocab": 3, "widths": [3], "draw": "swor"},
                                          "to": {"vocab": 3, "widths": [2], "draw": "swor"}}]


def _verdicts(biased) -> CaseSearch:
    """A search whose verdict on a case is ``biased(case)``."""
    return CaseSearch(lambda case: Evaluation({}, {}, {}, 0.5 * biased(case), biased(case)), shrink_cap=20)


def _cell_verdicts(biased_on) -> CaseSearch:
    """A search whose verdict depends on the cell only: biased exactly on the cells in ``biased_on``."""
    return _verdicts(lambda case: case.cell in biased_on)


def test_settle_moves_to_the_first_earlier_cell_of_the_same_vocabulary_and_repeats():
    cells = search_cells("chain", max_vocab=2, chain_lengths=(1, 2, 3))  # V = 1 (n = 1, 2, 3), then V = 2
    v2n1, v2n2, v2n3 = cells[3:]
    case = shared_case(2, (1, 1, 1), None, [0.5, 0.5], [0.25, 0.75])
    # biased on every V = 1 cell too, which cannot hold V = 2 rows: only V = 2 cells are re-checked
    search = _cell_verdicts({*cells[:3], v2n2, v2n3})
    assert settle(search, cells, 5, case, seed=0).cell == v2n2  # no share recorded: the moved case stands
    assert search.moves == [(v2n3, v2n2)] and search.rechecks == 2  # v2n1 (exact), v2n2 (biased)
    # With a share, the moved-to cell is searched again and what hypothesis finds there is re-checked on
    # the cells before it: here the found rows (relation 'identical') are exact on n = 1 and biased on n = 2;
    # the search on n = 2 finds its simplest case (relation 'independent'), which is biased on n = 1.
    identical = AuditCase(v2n3, ToyModel(2, {}, {}, np.array([0.5, 0.5]), np.array([0.5, 0.5])), "identical",
                          "shared")
    search = _verdicts(lambda c: c.cell in (v2n2, v2n3) or (c.cell == v2n1 and c.relation != "identical"))
    search.cells[v2n2] = CellLog(share=3)
    settled = settle(search, cells, 5, identical, seed=0)
    assert settled.cell == v2n1 and settled.relation == "independent"
    assert search.moves == [(v2n3, v2n2), (v2n2, v2n1)]
    # exact everywhere before: the case stays
    search = _cell_verdicts({v2n3})
    assert settle(search, cells, 5, case, seed=0) is case and search.moves == [] and search.rechecks == 2


def test_a_case_moves_only_to_cells_its_rows_cover():
    shared = shared_case(2, (1, 1), Draw.IID, [0.5, 0.5], [0.25, 0.75])
    assert shared.on(Cell(2, (1, 1, 1), Draw.IID)).cell == Cell(2, (1, 1, 1), Draw.IID)  # one pair fits any depth
    assert shared.on(Cell(3, (1,), Draw.IID)) is None and shared.on(Cell(2, (1,), Draw.SWOR)) is None
    rows = {pre: np.array([0.5, 0.5]) for pre in [(), (0,), (1,), (0, 0), (0, 1), (1, 0), (1, 1)]}
    per_depth = AuditCase(Cell(2, (1, 1), Draw.IID), ToyModel(2, rows, rows), "identical", "per_depth")
    assert per_depth.on(Cell(2, (2,), Draw.IID)).model is per_depth.model
    assert per_depth.on(Cell(2, (1, 1, 1), Draw.IID)) is None  # no rows after three tokens


# ------------------------------------------------------------------- budget


@pytest.mark.parametrize("verifier, budget", [(MULTIDRAFT, 1), (MULTIDRAFT, 30), (SPS, 5)],
                         ids=["multidraft-1", "multidraft-30", "sps-5"])
def test_the_budget_is_a_hard_cap_and_cells_left_unsearched_are_reported(verifier, budget):
    # Audit D2: every cell got at least one case, so --budget 1 tried 75 cases on MULTIDRAFT's 75 cells.
    result = audit(verifier, config=AuditConfig(budget=budget, **FAST))
    tried = [rep.cases_tried for rep in result.cells]
    # fewer cases than cells: each searched cell takes one (V = 1 has one model; V = 2 gets a share of 1)
    assert result.cases_tried == sum(tried) == budget and result.exit_code == 0
    assert result.unsearched == len(result.cells) - budget and tried[budget:] == [0] * result.unsearched
    text = result.render()
    assert f"the budget was spent after {budget} of {len(result.cells)} cells" in text
    assert f"the other {result.unsearched} were not searched (cases tried 0)" in text
    assert result.to_dict()["cells_unsearched"] == result.unsearched


def test_a_budget_of_one_case_per_cell_reaches_every_cell_and_the_default_is_raised_to_it():
    cells = search_cells("tree")  # 75 cells: V = 1, 2 (9 shapes) and V = 3 (7 shapes), 3 draw kinds each
    assert AuditConfig().budget_for("sampling", len(cells)) == 75  # not 40: the default reaches every cell
    assert AuditConfig().budget_for("sampling", 16) == 40 and AuditConfig().budget_for("exact", 75) == 500
    assert AuditConfig(budget=7).budget_for("sampling", 75) == 7
    # shares are rounded down, at least one case, and vocabularies ascend: each cell leaves one case per cell left
    search = _cell_verdicts(set())
    assert run_search(search, cells, len(cells), seed=0) is None
    tried = [search.cells[c].tried for c in cells]
    assert min(tried) >= 1 and search.tried == sum(tried) <= len(cells) and search.unsearched == 0


# ---------------------------------------------------------------- reach


def test_search_cells_reach_long_chains_and_deep_trees_with_stated_vocabularies():
    chain = search_cells("chain")
    assert {c.depth for c in chain} == set(AUDIT_CHAIN_LENGTHS) == {1, 2, 3, 4, 5, 6}
    for n in range(1, 7):
        assert max(c.vocab for c in chain if c.depth == n) == (3 if n <= 4 else 2)
    tree = search_cells("tree")
    shapes = {c.widths for c in tree}
    assert {(1,), (2,), (1, 1), (3,), (2, 1), (1, 2), (2, 2), (1, 1, 1), (2, 1, 1)} <= shapes
    assert max(len(s) for s in shapes) == 3
    assert max(c.vocab for c in tree if c.widths == (1, 2)) == 3  # a node below the root with two children, V = 3
    assert max(c.vocab for c in tree if c.widths in ((2, 2), (2, 1, 1))) == 2
    assert {c.draw for c in tree} == set(ALL_DRAWS)
    # order: vocabulary, then draft nodes, then depth
    keys = [(c.vocab, draft_nodes(c.widths), c.depth) for c in tree]
    assert keys == sorted(keys)
    assert len(AUDIT_TREE_SHAPES) == 9 and vocab_limit((2, 1, 1), 4) == 2 and vocab_limit((2, 1), 4) == 4


def test_chain_bias_only_from_the_4th_token_is_flagged_exactly_at_n_4():
    result = audit(SKEWED_FROM_4TH, config=AuditConfig(budget=150, **FAST))
    assert result.biased
    case = result.counterexample.case
    assert (case.vocab, case.widths) == (2, (1, 1, 1, 1))
    assert result.counterexample.evaluation.tv > 0.01
    # every cell before it (V = 1; V = 2 with n <= 3) was tried and found exact
    before = [rep for rep in result.cells][: [rep.cell for rep in result.cells].index(case.cell)]
    assert len(before) == 6 + 3 and all(rep.cases_tried >= 1 for rep in before)


def test_chain_bias_only_from_the_4th_token_is_flagged_by_sampling():
    # Sampling needs ~10^3 steps per case: this fast version searches chains of 3 (exact there)
    # and 4 tokens; the slow test below searches the full reach.
    config = AuditConfig(mode="sampling", chain_lengths=(3, 4), max_vocab=2, budget=30, tv=0.15, shrink_cap=8)
    result = audit(SKEWED_FROM_4TH, config=config)
    assert result.mode == "sampling" and result.biased and result.exit_code == 1
    case = result.counterexample.case
    assert (case.vocab, case.widths) == (2, (1, 1, 1, 1))
    assert result.confirmation.confirmed is not None
    assert [rep.cases_tried >= 1 for rep in result.cells if rep.cell.depth == 3] == [True, True]


@pytest.mark.slow
def test_chain_bias_only_from_the_4th_token_is_flagged_by_sampling_over_the_full_reach():
    result = audit(SKEWED_FROM_4TH, config=AuditConfig(mode="sampling", budget=80, tv=0.15, shrink_cap=10))
    assert result.biased and result.counterexample.case.cell.depth >= 4


def test_swor_residual_wrong_below_the_root_is_flagged_exactly_on_1_2_with_three_tokens():
    result = audit(SWOR_WRONG_BELOW_ROOT, config=AuditConfig(budget=400, draws=("swor",), **FAST))
    assert result.biased
    case = result.counterexample.case
    # V = 2 cannot show it (see module doc) and (2,), (3,) have no node below the root with two children
    assert (case.vocab, case.widths, case.draw) == (3, (1, 2), Draw.SWOR)


def test_swor_residual_wrong_below_the_root_is_flagged_by_sampling():
    # The bias is small (TV > 0.1 on ~5% of the cases of its cell), so this searches only (2,), where
    # the verifier is exact, and (1, 2); the exact test above shows the default reach finds it.
    config = AuditConfig(mode="sampling", draws=("swor",), tree_shapes=((2,), (1, 2)), budget=24, shrink_cap=8)
    result = audit(SWOR_WRONG_BELOW_ROOT, config=config)
    assert result.mode == "sampling" and result.biased and result.exit_code == 1
    case = result.counterexample.case
    assert (case.vocab, case.widths, case.draw) == (3, (1, 2), Draw.SWOR)
    assert [rep.cases_tried >= 1 for rep in result.cells if rep.cell.widths == (2,)] == [True] * 3


# ------------------------------------------------------ sampler vs kernel


def test_a_biased_sampler_shipped_with_a_correct_kernel_fails_the_audit():
    result = audit(KERNEL_OK_SAMPLER_BIASED, config=AuditConfig(budget=60))
    assert not result.biased and result.exit_code == 1  # the kernel is lossless, the sampler is not
    bad = result.sampler_mismatch
    assert bad is not None and not bad.passed and (bad.impossible > 0 or bad.p_value < bad.alpha)
    m = len(result.sampler.checks)
    # the level is the family's alpha split over the cases chosen before sampling; no more than one per group
    n_groups = len({(rep.cell.widths, rep.cell.draw) for rep in result.cells})
    assert bad.alpha == pytest.approx(1e-6 / n_groups) and m <= n_groups
    bins = sum(1 for mass in bad.kernel_law.values() if mass > 0)
    assert bad.samples == sample_size(bins, 0.2, 1e-6 / n_groups, 1e-3)
    text = result.render()
    assert "SAMPLER DOES NOT MATCH ITS KERNEL" in text and "sampler and kernel disagree on" in text
    assert "false-fail rate 1e-06 over all (Bonferroni)" in text
    assert result.to_dict()["sampler_check"]["passed"] is False


def sps_shared_noise_sample(ref, q_rows, p_rows, rng):
    """SpS with a sampler-only bug DESIGN §5 names: the correction is drawn with the uniform the accept test
    just used (it lies above the acceptance probability, so it favours the residual's later tokens)."""
    toks, q, p = check_chain(ref, q_rows, p_rows)
    u = rng.random(len(toks) + 1)
    for i, tok in enumerate(toks.tolist()):
        if u[i] >= acceptance_probability(float(p[i, tok]), float(q[i, tok])):
            return toks[:i].tolist() + [categorical(residual(p[i], q[i], tok), float(u[i]))]
    return toks.tolist() + [categorical(p[len(toks)], float(u[-1]))]


def test_a_sampler_that_reuses_the_accept_uniform_fails_the_audit():
    """Found by a statistics audit: the sampler checks ran on the case with the most spread output law, which
    in 4 of 6 chain groups had ``p = q`` (every draft accepted), where this sampler equals its kernel exactly,
    so the audit passed it.  Cases are now chosen to reject into a spread residual.  Statistical: the sampler
    checks fail a correct sampler with probability at most the audit's alpha, 1e-6 (Bonferroni over the
    cases), and each detects a TV of 0.2 with probability >= 0.999; on the default seed this sampler is
    caught on the first case (the run is reproducible)."""
    verifier = ChainVerifier("sps_shared_noise", sps_shared_noise_sample, sps_kernel)
    result = audit(verifier)  # the default search
    assert not result.biased and result.exit_code == 1
    bad = result.sampler_mismatch
    assert bad is not None and not bad.passed
    for check in result.sampler.checks:  # every case chosen rejects its first draft with positive chance
        assert not np.array_equal(check.case.model.p(()), check.case.model.q(()))


def test_sample_size_is_computed_before_sampling_for_the_stated_tv():
    # One positive cell: any bias is mass on impossible outcomes, seen with probability
    # 1 - (1 - tv)^N >= 1 - beta: N = ceil(log(1e-3) / log(0.9)) = ceil(65.56) = 66.
    assert sample_size(1, 0.1, 1e-6, 1e-3) == 66
    assert sample_size(4, 0.1, 1e-6, 1e-3) == kl_required_samples(4, 0.1, 1e-6, 1e-3)


# ------------------------------------------------------------ confirmation


def test_confirmation_sample_is_sized_for_the_tv_the_search_found():
    assert confirm_tv(0.5, 0.1) == 0.1  # a large finding: at least the search's own power
    assert confirm_tv(0.12, 0.1) == pytest.approx(0.06)  # half what was measured
    assert confirm_tv(0.01, 0.1) == pytest.approx(0.025)  # floor tv / 4: at most 16 times the search's sample


def sps_accept_scaled(ref, q_rows, p_rows, rng):
    """SpS accepting with 0.8 of the SpS probability at the first token: a small bias."""
    toks, q, p = check_chain(ref, q_rows, p_rows)
    tok = int(toks[0])
    if rng.random() < 0.8 * acceptance_probability(float(p[0, tok]), float(q[0, tok])):
        return [tok, categorical(p[1], float(rng.random()))]
    return [categorical(residual(p[0], q[0], tok), float(rng.random()))]


def _planted_search(subject_case: AuditCase, found_tv: float, biased: bool = True) -> CaseSearch:
    """A search that flagged ``subject_case`` with a given plug-in TV (as a lucky shrink would)."""
    search = CaseSearch(lambda case: pytest.fail("no search in this test"), shrink_cap=0)
    search.cache[subject_case.digest] = Evaluation({}, {}, {}, found_tv, biased, samples=100, p_value=7e-7)
    search.first_flagged = subject_case
    return search


def test_confirmation_detects_a_small_real_bias_with_a_sample_sized_for_it():
    # q = (3/4, 1/4), p = (1/4, 3/4): every rejection leaves the residual (0, 1), so the first token
    # is 0 only when a drafted 0 is accepted: 3/4 * 0.8 * min(1, (1/4)/(3/4)) = 1/5 instead of
    # p(0) = 1/4, and the second token comes from p either way: TV = 1/20, half the search's tv.
    # Issue 9: the search flagged such a case (measured TV 0.1) and one fresh run at the search's
    # size (power about 1/4 at TV 0.05) dropped it.  Sized for found_tv / 2 = 0.05 it is confirmed
    # with probability >= 1 - beta.
    subject = ChainVerifier("scaled", sps_accept_scaled)
    case = shared_case(2, (1,), None, [0.75, 0.25], [0.25, 0.75])
    exact = ChainVerifier("scaled-exact", sps_accept_scaled, _scaled_kernel)
    assert exact_evaluation(exact, case).tv == pytest.approx(0.05)
    config = AuditConfig(mode="sampling", tv=0.1)
    conf = confirm(subject, _planted_search(case, found_tv=0.1), case, config)
    assert conf.confirmed == 0
    run = conf.runs[0]
    assert run.detect_tv == pytest.approx(0.05) and run.alpha == config.alpha  # one flagged case: all of alpha
    assert run.samples == sample_size(4, 0.05, config.alpha, config.beta)
    assert run.samples > 3 * sample_size(4, 0.1, config.alpha, config.beta)  # not the search's size


def _scaled_kernel(ref, q_rows, p_rows):
    # exact law of sps_accept_scaled (n = 1)
    toks, q, p = check_chain(ref, q_rows, p_rows)
    tok = int(toks[0])
    a = 0.8 * acceptance_probability(float(p[0, tok]), float(q[0, tok]))
    kernel = np.zeros_like(p)
    kernel[0] = (1 - a) * residual(p[0], q[0], tok)
    kernel[1] = a * p[1]
    return kernel


def test_confirmation_alone_decides_a_false_flag_of_a_lossless_sampler():
    # The search "flagged" a case on which SpS is exact; fresh samples at level alpha decide: no bias.
    case = shared_case(3, (1,), None, [0.5, 0.25, 0.25], [0.25, 0.5, 0.25])
    conf = confirm(ChainVerifier("sps", sps_sample), _planted_search(case, found_tv=0.3), case,
                   AuditConfig(mode="sampling"))
    assert conf.confirmed is None and conf.runs[0].p_value >= 1e-6
    assert conf.runs[0].detect_tv == pytest.approx(0.1)  # min(tv, 0.3 / 2)


def test_sampling_mode_flags_greedy_match_and_confirms_on_fresh_samples():
    result = audit(greedy_match_sample, "chain", config=AuditConfig(budget=10, tv=0.2))
    assert result.mode == "sampling" and result.biased and result.exit_code == 1
    conf = result.confirmation
    assert conf is not None and conf.confirmed is not None
    case, found = conf.flagged[conf.confirmed]
    ev = result.counterexample.evaluation
    assert ev is conf.runs[conf.confirmed] and ev is not found  # the verdict rests on the fresh sample
    level = result.alpha / len(conf.flagged)
    assert ev.samples == sample_size(len(ev.target), confirm_tv(found.tv, 0.2), level, result.beta)
    assert ev.p_value < level and not conf.conclusive
    text = result.render()
    assert f"estimated from {ev.samples} fresh steps" in text and "rests only on fresh samples" in text
    assert "confirmed" in text


def accept_every_draft(ref, q_rows, p_rows, rng):
    """Accepts every draft token: emits drafted tokens of target probability 0 (a hard failure)."""
    p = np.asarray(p_rows, dtype=np.float64)
    return [int(t) for t in ref] + [categorical(p[-1], float(rng.random()))]


def test_a_conclusive_sampled_finding_is_labelled_as_the_search_sample_not_a_fresh_one():
    # Audit D3: the report said "estimated from 66 fresh steps" and "the verdict rests only on fresh
    # samples" for the search's own 66 steps (an impossible output needs no fresh sample).
    result = audit(accept_every_draft, "chain", config=AuditConfig(budget=20))
    conf = result.confirmation
    case, found = conf.flagged[conf.confirmed]
    assert found.impossible > 0 and result.counterexample.evaluation is found  # the search's own sample
    text = result.render()
    assert "fresh steps" not in text and "rests only on fresh samples" not in text
    assert f"estimated from the search's own {found.samples} steps, conclusive without a fresh sample" in text
    assert "the verdict rests on the search's own sample, which is conclusive" in text
    assert result.biased and conf.conclusive and result.to_dict()["confirmation"]["conclusive"] is True


# ------------------------------------------------------ the exit-0 message


def test_exact_exit_zero_message_states_reach_and_what_could_be_missed_per_cell():
    result = audit(SPS, config=AuditConfig(budget=40, **FAST))
    text = result.render()
    assert "no bias found within the budget" in text
    assert "a search over cases, not a proof" in text
    assert "chains n=1, n=2, n=3, n=4 on V 1..3; chains n=5, n=6 on V 1..2" in text
    for n in range(1, 7):
        assert any(line.strip().startswith(f"n={n} ") and line.rstrip().endswith("1e-09") for line in text.splitlines())
    out = result.to_dict()
    assert out["exit_code"] == 0 and out["tol"] == 1e-9
    assert len(out["cells"]) == len(result.cells) == 4 * 3 + 2 * 2
    assert all(c["missable_tv"] == 1e-9 and c["cases_tried"] >= 1 for c in out["cells"])
    assert sum(c["cases_tried"] for c in out["cells"]) == result.cases_tried


def test_sampling_exit_zero_message_states_the_detectable_tv_and_sample_sizes():
    config = AuditConfig(budget=8, max_vocab=2, tv=0.3)
    result = audit(multidraft_sample, "tree", config=replace(config, draws=("topk",)))
    assert result.mode == "sampling" and result.exit_code == 0, result.render()
    text = result.render()
    assert "sized to detect TV 0.3 with probability >= 0.999 at level 1e-06" in text
    assert "samples per case (largest)" in text
    for rep in result.to_dict()["cells"]:
        if rep["cases_tried"] and rep["vocab"] == 1:
            # one target cell: N = ceil(log(1e-3) / log(0.7)) = ceil(19.37) = 20
            assert rep["samples_per_case"] == 20 and rep["missable_tv"] == 0.3


# --------------------------------------------- other findings in sampling mode


def bonus_from_root_row(ref, q_rows, p_rows, rng):
    """SpS with an off-by-one bug: the bonus token uses the first target row."""
    p = np.array(p_rows, dtype=np.float64)
    p[-1] = p[0]
    return sps_sample(ref, q_rows, p, rng)


def test_sampling_mode_fails_hard_on_an_output_with_target_probability_zero():
    result = audit(bonus_from_root_row, "chain", config=AuditConfig(budget=12, max_vocab=2, tv=0.3))
    assert result.biased
    ev, case = result.counterexample.evaluation, result.counterexample.case
    assert ev.impossible > 0 and "hard failure" in result.render()
    assert case.layout != "shared"  # invisible when every prefix shares one row
    exact = ChainVerifier("exact", bonus_from_root_row, lambda r, q, p: sps_kernel(r, q, np.vstack([p[:-1], p[:1]])))
    assert exact_evaluation(exact, case).tv > 0.0


def crashes_on_three_tokens(tree, p_rows, rng):
    if tree.vocab == 3:
        raise RuntimeError("boom")
    return multidraft_sample(tree, p_rows, rng)


def test_a_verifier_that_raises_on_valid_input_is_flagged_with_the_smallest_such_input():
    result = audit(crashes_on_three_tokens, "tree", config=AuditConfig(budget=40, tv=0.4, draws=("iid",)))
    assert result.biased and "crashed (RuntimeError: boom)" in result.render()
    assert (result.counterexample.case.vocab, result.counterexample.case.widths) == (3, (1,))


def empty_on_three_tokens(ref, q_rows, p_rows, rng):
    return [] if np.asarray(p_rows).shape[1] == 3 else sps_sample(ref, q_rows, p_rows, rng)


def test_an_invalid_output_is_a_finding():
    result = audit(empty_on_three_tokens, "chain", config=AuditConfig(budget=30, tv=0.4))
    assert result.biased and result.counterexample.evaluation.error.startswith("invalid output: returned []")


# ----------------------------------------------------------- usage errors


@pytest.mark.parametrize(
    "args, kwargs, match",
    [
        ((sps_sample,), {}, "kind"),
        ((SPS, "tree"), {}, "chain verifier"),
        ((sps_sample, "tree"), {}, "convention"),
        ((sps_sample, "chain"), {"mode": "exact"}, "needs a kernel"),
        ((42, "chain"), {}, "callable"),
        ((SPS, "forest"), {}, "kind"),
        ((SPS,), {"colour": 1}, "unknown audit option"),
        ((tmc.ToyModel.random, "chain"), {}, "convention"),
        ((SPS, "chain"), {"alpha": 5e-324}, "alpha must be at least 1e-300"),  # looped for ever
        ((SPS, "chain"), {"draws": ("swor",)}, "go with a tree verifier"),  # accepted, no effect
    ],
)
def test_audit_usage_errors_raise_value_error(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        audit(*args, **kwargs)


@pytest.mark.parametrize(
    "field, value",
    [("budget", 0), ("seed", -1), ("max_vocab", 5), ("max_vocab", 0), ("tol", -1.0), ("tv", 0.0), ("tv", 1.5),
     ("alpha", 0.0), ("alpha", 1.0), ("beta", 2.0), ("mode", "fast"), ("draws", ("dfs",)), ("draws", ()),
     ("shrink_cap", -1), ("sampler_tv", 0.0), ("check_sampler", "yes"), ("alpha", float("nan")),
     ("tv", 1e-6), ("sampler_tv", 1e-5)],  # tiny: a case drew for hours
)
def test_audit_config_names_the_bad_field(field, value):
    with pytest.raises(ValueError, match=field if field != "draws" or value == () else "draws\\[0\\]"):
        AuditConfig(**{field: value})


def test_audit_config_converts_draw_strings_once():
    assert AuditConfig(draws=("swor", Draw.IID, "swor")).draws == (Draw.SWOR, Draw.IID)
    assert AuditConfig().draws is None


# ------------------------------------------------------------------- CLI


def test_cli_exit_one_for_a_biased_verifier(capsys):
    assert cli_main(["verification.examples:GREEDY_MATCH", "--budget", "50"]) == 1
    assert "BIASED: TV 0.5" in capsys.readouterr().out


def test_cli_exit_zero_for_a_lossless_verifier(capsys):
    assert cli_main(["tmc:sps_sample", "--kind", "chain", "--budget", "3", "--max-vocab", "1"]) == 0
    assert "no bias found within the budget" in capsys.readouterr().out


def test_cli_json_and_draw_options(capsys):
    assert cli_main(["verification.examples:IID_RULE_ON_SWOR", "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["biased"] and out["exit_code"] == 1 and out["draws"] == ["swor"]
    assert out["counterexample"]["vocab"] == 3 and out["counterexample"]["tv"] == pytest.approx(1 / 3)
    assert out["counterexample"]["output_law"] == pytest.approx({"1": 1 / 6, "2,1": 5 / 12, "2,2": 5 / 12})
    assert sum(out["counterexample"]["target_law"].values()) == pytest.approx(1.0)
    # topk alone has 25 cells (9 shapes on V 1..2, 7 on V = 3); the budget is a hard cap, so one case per
    # cell is what reaches V = 2, where the rule is biased (a budget of 6 searched V = 1 only)
    code = cli_main(["verification.examples:iid_rule_sample", "--kind", "tree", "--draw", "topk", "--budget", "25",
                     "--tv", "0.4"])
    assert code == 1


def test_cli_sampler_tv_sizes_the_sampler_checks(capsys):
    """``--sampler-tv`` reaches the sampler checks: a finer tv draws more samples and is what the report states."""
    steps = {}
    for tv in ("0.2", "0.1"):
        assert cli_main(["verification.examples:SPS", "--budget", "5", "--max-vocab", "2", "--sampler-tv", tv,
                         "--json"]) == 0
        report = json.loads(capsys.readouterr().out)["sampler_check"]
        assert report["tv"] == float(tv) and report["passed"]
        steps[tv] = sum(c["samples"] for c in report["checks"])
    assert steps["0.1"] > 2 * steps["0.2"], steps


def test_register_adds_audit_to_the_tmc_subparsers_without_importing_hypothesis():
    code = textwrap.dedent("""
        import argparse, sys
        from verification.audit.cli import register
        parser = argparse.ArgumentParser(prog="tmc")
        register(parser.add_subparsers(dest="command"))
        args = parser.parse_args(["audit", "m:f", "--kind", "tree", "--draw", "iid", "--draw", "swor"])
        assert args.func.__name__ == "handler" and args.draw == ["iid", "swor"] and args.budget is None
        print("hypothesis" in sys.modules)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_the_tmc_front_door_runs_the_same_subcommand(capsys):
    from tmc.cli import main

    assert main(["audit", "verification.examples:GREEDY_MATCH", "--budget", "20", "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["counterexample"]["tv"] == pytest.approx(0.5)
    assert main(["audit", "verification.examples:SPS", "--kind", "tree"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("tmc audit: ") and "chain verifier" in err and "\n" not in err


@pytest.fixture
def broken_modules(tmp_path, monkeypatch):
    (tmp_path / "audit_raises_at_import.py").write_text("raise RuntimeError('boom at import')\n")
    (tmp_path / "audit_syntax_error.py").write_text("def f(:\n")
    (tmp_path / "audit_exits_at_import.py").write_text("import sys\nsys.exit(3)\n")
    monkeypatch.syspath_prepend(str(tmp_path))


@pytest.mark.parametrize(
    "argv, words",
    [
        (["no_such_module_xyz:f", "--kind", "chain"], "cannot import module 'no_such_module_xyz'"),
        (["audit_raises_at_import:f", "--kind", "chain"], "RuntimeError: boom at import"),
        (["audit_syntax_error:f", "--kind", "chain"], "SyntaxError"),
        (["audit_exits_at_import:f", "--kind", "chain"], "SystemExit"),
        (["tmc:no_such_function", "--kind", "chain"], "has no attribute"),
        (["tmc", "--kind", "chain"], "expected MODULE:FUNCTION"),
        (["tmc:", "--kind", "chain"], "expected MODULE:FUNCTION"),
        ([":sps_sample", "--kind", "chain"], "expected MODULE:FUNCTION"),
        (["tmc:chain..sps_sample", "--kind", "chain"], "expected MODULE:FUNCTION"),
        (["verification.audit.space:AUDIT_TREE_SHAPES", "--kind", "tree"], "not a callable"),
        (["tmc:sps_sample"], "kind"),
        (["tmc:sps_sample", "--kind", "tree"], "convention"),
        (["tmc:ToyModel.random", "--kind", "chain"], "convention"),
        (["verification.examples:SPS", "--kind", "tree"], "chain verifier"),
        (["verification.examples:SPS", "--budget", "0"], "--budget"),
        (["verification.examples:SPS", "--budget", "many"], "--budget"),
        (["verification.examples:SPS", "--seed", "-1"], "--seed"),
        (["verification.examples:SPS", "--tv", "0"], "--tv"),
        (["verification.examples:SPS", "--tv", "1.5"], "--tv"),
        (["verification.examples:SPS", "--sampler-tv", "0"], "--sampler-tv"),
        (["verification.examples:SPS", "--sampler-tv", "2"], "--sampler-tv"),
        (["verification.examples:SPS", "--sampler-tv", "1e-5"], "sampler_tv"),
        (["verification.examples:SPS", "--alpha", "1"], "--alpha"),
        (["verification.examples:SPS", "--max-vocab", "5"], "--max-vocab"),
        (["verification.examples:MULTIDRAFT", "--draw", "dfs"], "--draw"),
        (["tmc:sps_sample", "--kind", "forest"], "--kind"),
        (["--kind", "chain"], "MODULE:FUNCTION"),
    ],
)
def test_cli_usage_errors_are_one_line_with_exit_two(argv, words, capsys, broken_modules):
    assert cli_main(argv) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert words in err and "\n" not in err and "Traceback" not in err and not captured.out


def test_cli_description_is_plain_text(capsys):
    assert cli_main(["--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "Reach: chains of 1 to 4 draft tokens" in out
    assert "``" not in out and ":func:" not in out and ":class:" not in out


# -------------------------------------------------------- the measures


def test_completed_law_and_tv_by_hand():
    # Output law {(0,): 1/2, (0, 1): 1/2} with p = (0.6, 0.4) at the root and
    # (0.3, 0.7) after it: C = (0.15, 0.85, 0, 0) against P = (0.18, 0.42, 0.12, 0.28).
    model = ToyModel(2, {}, {(): np.array([0.6, 0.4])}, np.array([0.5, 0.5]), np.array([0.3, 0.7]))
    completed = completed_law(model, {(0,): 0.5, (0, 1): 0.5}, 2)
    assert completed == pytest.approx({(0, 0): 0.15, (0, 1): 0.85})
    target = target_law(model, 2)
    assert target == pytest.approx({(0, 0): 0.18, (0, 1): 0.42, (1, 0): 0.12, (1, 1): 0.28})
    assert total_variation(completed, target) == pytest.approx(0.43)


def test_draft_tree_weights_stay_exact_when_drawn_tokens_hold_almost_all_mass():
    # Without replacement from q = (1e-12, 1 - 1e-12): the weight of (1, 0) is
    # q(1) * q(0) / q(0) = q(1); dividing by 1 - q(1) instead loses ~1e-4.
    q = np.array([1e-12, 1.0]) / (1 + 1e-12)
    drafts = tree_drafts(ToyModel(2, {}, {}, q, q), [2], Draw.SWOR)
    weights = {d.tree.tokens: d.weight for d in drafts}
    assert weights[(1, 0)] == pytest.approx(q[1], rel=1e-15) and weights[(0, 1)] == pytest.approx(q[0], rel=1e-12)
    assert sum(weights.values()) == pytest.approx(1.0, abs=1e-15)


def test_search_cells_go_from_small_to_large():
    cells = search_cells("tree", max_vocab=2, draws=[Draw.SWOR])
    assert cells[0] == Cell(1, (1,), Draw.SWOR) and cells[-1] == Cell(2, (2, 1, 1), Draw.SWOR)
    assert [c.vocab for c in search_cells("chain", max_vocab=2)] == [1] * 6 + [2] * 6


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(search_cells("tree")).flatmap(lambda cell: audit_cases(cell=cell)))
def test_audit_cases_are_valid_models_of_their_cell(case: AuditCase):
    model = case.model
    assert case.relation in RELATIONS and case.length == case.cell.depth + 1
    assert model.vocab == case.vocab <= vocab_limit(case.widths, 3)
    assert sum(target_law(model, case.length).values()) == pytest.approx(1.0)
    for pre in [(), (0,) * case.cell.depth]:
        for row in (model.q(pre), model.p(pre)):
            assert row.shape == (case.vocab,) and row.sum() == pytest.approx(1.0) and (row >= 0).all()


def test_tmc_sps_sample_is_the_chain_convention():
    result = audit(tmc.sps_sample, "chain", config=AuditConfig(budget=2, max_vocab=1))
    assert result.verifier == "tmc.chain:sps_sample" and result.exit_code == 0


def test_power_text_never_rounds_to_certainty():
    """``--beta 1e-300`` printed "with probability >= 1"; the text now keeps the miss rate."""
    from verification.audit.report import _power

    assert _power(1e-3) == "0.999" and _power(1e-300) == "1 - 1e-300" and _power(1e-7) == "1 - 1e-07"
