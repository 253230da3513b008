"""The bias audit: it flags every biased example with a minimal case and passes the lossless ones.

Budgets are modest so the whole file runs in well under a minute; the
shipped defaults search more.  Minimal vocabularies and shapes asserted here
are the true minima, not artefacts of a seed: a one-token vocabulary cannot
be biased, the wrong-proposal rule on a width-1 tree is the right rule, and
the i.i.d. rule on two children drawn without replacement is exact for V = 2
(the second child is then the other token, accepted surely after a rejection).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tmc
from tmc.chain import sps_kernel, sps_sample
from tmc.enumeration import enumerate_draft_trees
from tmc.multidraft import Draw, multidraft_sample, proposal_laws
from tmc.toy import ToyModel
from verification.audit import (
    AuditCase,
    Cell,
    audit,
    audit_cases,
    cli_main,
    completed_law,
    exact_evaluation,
    search_cells,
    target_law,
    total_variation,
)
from verification.calibrated import required_samples
from verification.examples import (
    BIASED_EXAMPLES,
    CORRECT_EXAMPLES,
    IID_RULE_ON_SWOR,
    SPS,
    TUTORIAL_TREE_WALK,
    WETAP_BEAM,
    ChainVerifier,
    greedy_match_sample,
    wetap_beam_verifier,
)

# name -> (vocab, shape, draw) of the smallest biased case
MINIMAL = {
    "tutorial_tree_walk": (2, (1,), Draw.TOPK),
    "wetap_beam(tau=0.5)": (2, (1,), Draw.TOPK),
    "greedy_match": (2, (1,), None),
    "iid_rule_on_swor": (3, (2,), Draw.SWOR),
    "iid_rule_on_topk": (2, (1,), Draw.TOPK),
}


@pytest.mark.parametrize("verifier", BIASED_EXAMPLES, ids=lambda v: v.name)
def test_audit_flags_each_biased_example_with_a_minimal_counterexample(verifier):
    result = audit(verifier, budget=300)
    assert result.biased and result.exit_code == 1 and result.mode == "exact"
    case = result.counterexample.case
    assert (case.model.vocab, case.widths, case.draw) == MINIMAL[verifier.name]
    assert not case.per_prefix  # one row pair serves every prefix
    assert result.counterexample.evaluation.tv > 0.1
    assert exact_evaluation(verifier, case).tv == pytest.approx(result.counterexample.evaluation.tv)
    text = result.render()
    assert "BIASED" in text and "minimal counterexample" in text and "total variation distance" in text


@pytest.mark.parametrize(
    "verifier, widths",
    [(TUTORIAL_TREE_WALK, (2,)), (WETAP_BEAM, (1,))],
    ids=["tutorial: independent tests", "wetap: threshold"],
)
def test_tutorial_and_wetap_stay_biased_on_iid_drafts_where_q_is_the_right_proposal(verifier, widths):
    # Top-k drafts already expose the wrong proposal law; i.i.d. drafts
    # isolate each rule's own flaw.  One i.i.d. child under the tutorial walk
    # is SpS, so its minimal case needs two children.
    result = audit(verifier, draws=["iid"], budget=200)
    assert result.biased and result.counterexample.case.widths == widths
    assert result.counterexample.case.model.vocab == 2


@pytest.mark.parametrize(
    "verifier", [*CORRECT_EXAMPLES, wetap_beam_verifier(1.0)], ids=lambda v: v.name
)
def test_audit_passes_each_lossless_verifier(verifier):
    result = audit(verifier, budget=150)
    assert not result.biased and result.exit_code == 0, result.render()
    assert result.counterexample is None and result.missable_tv == 1e-9
    assert result.cases_tried > 50
    assert "no bias found within the budget" in result.render()


def test_audit_searches_every_draw_kind_of_a_tree_verifier():
    result = audit(CORRECT_EXAMPLES[3], budget=20)  # multidraft
    assert result.draws == ("iid", "swor", "topk")
    only = audit(CORRECT_EXAMPLES[3], budget=20, draws=["swor"])
    assert only.draws == ("swor",)


def test_audit_is_reproducible_from_its_seed():
    a, b = audit(IID_RULE_ON_SWOR, budget=300, seed=3), audit(IID_RULE_ON_SWOR, budget=300, seed=3)
    assert a.counterexample.case.key() == b.counterexample.case.key()


# ------------------------------------------------------------- sampling


def test_sampling_mode_flags_a_biased_function_without_kernel():
    result = audit(greedy_match_sample, "chain", budget=20)
    assert result.mode == "sampling" and result.biased and result.exit_code == 1
    ev = result.counterexample.evaluation
    assert result.counterexample.case.model.vocab == 2
    bins = len(ev.target)
    assert ev.samples == required_samples(bins, result.missable_tv, result.alpha, result.beta)
    assert ev.p_value < result.alpha
    assert "estimated from" in result.render()


def test_sampling_mode_passes_a_correct_function_without_kernel():
    result = audit(sps_sample, "chain", budget=8)
    assert result.mode == "sampling" and not result.biased and result.exit_code == 0
    assert result.missable_tv == 0.1 and result.alpha == 1e-6
    tree_result = audit(multidraft_sample, "tree", budget=6)
    assert not tree_result.biased


def bonus_from_root_row(ref, q_rows, p_rows, rng):
    """SpS with an off-by-one bug: the bonus token uses the first target row."""
    p = np.array(p_rows, dtype=np.float64)
    p[-1] = p[0]
    return sps_sample(ref, q_rows, p, rng)


def test_sampling_mode_fails_hard_on_an_output_with_target_probability_zero():
    result = audit(bonus_from_root_row, "chain", budget=30)
    assert result.biased
    ev, case = result.counterexample.evaluation, result.counterexample.case
    assert ev.impossible > 0 and "hard failure" in result.render()
    assert case.per_prefix  # invisible when every prefix shares one row
    exact = ChainVerifier("exact", bonus_from_root_row, lambda r, q, p: sps_kernel(r, q, np.vstack([p[:-1], p[:1]])))
    assert exact_evaluation(exact, case).tv > 0.5


def crashes_on_three_tokens(tree, p_rows, rng):
    if tree.vocab == 3:
        raise RuntimeError("boom")
    return multidraft_sample(tree, p_rows, rng)


def test_a_verifier_that_raises_on_valid_input_is_flagged_with_the_smallest_such_input():
    result = audit(crashes_on_three_tokens, "tree", budget=40)
    assert result.biased and "crashed" in result.render() and "boom" in result.render()
    assert result.counterexample.case.model.vocab == 3
    assert result.counterexample.case.widths == (1,)


def empty_on_three_tokens(ref, q_rows, p_rows, rng):
    return [] if np.asarray(p_rows).shape[1] == 3 else sps_sample(ref, q_rows, p_rows, rng)


def test_an_invalid_output_is_a_finding():
    result = audit(empty_on_three_tokens, "chain", budget=40)
    assert result.biased and "invalid output" in result.counterexample.evaluation.error


# ---------------------------------------------------------- usage errors


@pytest.mark.parametrize(
    "args, kwargs, match",
    [
        ((sps_sample,), {}, "kind"),
        ((SPS, "tree"), {}, "chain verifier"),
        ((sps_sample, "tree"), {}, "calling convention"),
        ((SPS,), {"budget": 0}, "budget"),
        ((sps_sample, "chain"), {"mode": "exact"}, "needs a kernel"),
        ((42, "chain"), {}, "callable"),
        ((SPS, "forest"), {}, "kind"),
        ((SPS,), {"alpha": 0.0}, "alpha"),
        ((IID_RULE_ON_SWOR,), {"draws": ["dfs"]}, "dfs"),
    ],
)
def test_audit_usage_errors_raise_value_error(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        audit(*args, **kwargs)


# ------------------------------------------------------------------ CLI


def test_cli_exit_one_for_a_biased_verifier(capsys):
    assert cli_main(["verification.examples:GREEDY_MATCH", "--budget", "50"]) == 1
    assert "BIASED" in capsys.readouterr().out


def test_cli_exit_zero_for_a_lossless_verifier(capsys):
    assert cli_main(["verification.examples:SPS", "--budget", "30"]) == 0
    assert cli_main(["tmc:sps_sample", "--kind", "chain", "--budget", "4"]) == 0
    assert "no bias found" in capsys.readouterr().out


def test_cli_json_and_draw_options(capsys):
    assert cli_main(["verification.examples:IID_RULE_ON_SWOR", "--json", "--budget", "300"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["biased"] and out["exit_code"] == 1
    assert out["counterexample"]["model"]["vocab"] == 3 and out["counterexample"]["draw"] == "swor"
    assert sum(out["counterexample"]["target_law"].values()) == pytest.approx(1.0)
    code = cli_main(["verification.examples:iid_rule_sample", "--kind", "tree", "--draw", "topk", "--budget", "20"])
    assert code == 1


@pytest.mark.parametrize(
    "argv",
    [
        ["no_such_module_xyz:f", "--kind", "chain"],
        ["tmc:no_such_function", "--kind", "chain"],
        ["tmc", "--kind", "chain"],
        ["tmc:sps_sample"],
        ["tmc:sps_sample", "--kind", "tree"],
        ["verification.examples:SPS", "--kind", "tree"],
        ["verification.examples:SPS", "--budget", "0"],
        ["tmc:ToyModel.random", "--kind", "chain"],
        ["--kind", "chain"],
        ["tmc:sps_sample", "--kind", "forest"],
    ],
)
def test_cli_exit_two_for_usage_errors(argv, capsys):
    assert cli_main(argv) == 2
    assert capsys.readouterr().err


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
    # Second computation: the product of each child's recorded proposal law.
    q = np.array([1e-12, 1.0]) / (1 + 1e-12)
    model = ToyModel(2, {}, {}, q, q)
    trees = list(enumerate_draft_trees(model, [2], Draw.SWOR))
    for weight, tree in trees:
        laws = proposal_laws(tree, -1)
        assert weight == pytest.approx(laws[0][tree.tokens[0]] * laws[1][tree.tokens[1]], rel=1e-15)
    assert sum(w for w, _ in trees) == pytest.approx(1.0, abs=1e-15)


def test_search_cells_go_from_small_to_large():
    cells = search_cells("tree", max_vocab=2, draws=[Draw.SWOR])
    assert cells[0] == Cell(1, (1,), Draw.SWOR) and cells[-1] == Cell(2, (2, 1), Draw.SWOR)
    assert [c.vocab for c in search_cells("chain")] == [1, 1, 1, 2, 2, 2, 3, 3, 3]


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(search_cells("tree")).flatmap(lambda cell: audit_cases(kind="tree", cell=cell)))
def test_audit_cases_are_valid_models(case: AuditCase):
    model = case.model
    assert 1 <= model.vocab <= 3 and case.draw is not None and case.length == len(case.widths) + 1
    law = target_law(model, case.length)
    assert sum(law.values()) == pytest.approx(1.0)
    for row in [model.q(()), model.p(())]:
        assert row.shape == (model.vocab,) and row.sum() == pytest.approx(1.0) and (row >= 0).all()


def test_tmc_sps_sample_is_the_chain_convention():
    # The audit accepts the library's own sampler unchanged.
    assert audit(tmc.sps_sample, "chain", budget=3).verifier == "tmc.chain:sps_sample"
