"""Example verifiers: hand-computed laws of the BIASED ones, exactness of the references.

Every biased example is shown biased on a case small enough to work out by
hand (the arithmetic is in the comments); every lossless reference satisfies
the completion identity exactly; every example's sampler matches its kernel
(calibrated chi-square, false-fail rate 1e-9 split over the checks).
"""

from __future__ import annotations

import numpy as np
import pytest

from tmc import paper_toy_model
from tmc.enumeration import chain_output_law, tree_output_law
from tmc.multidraft import ROOT, Draw, DraftTree, multidraft_kernel, tree_kernel_outputs
from tmc.toy import ToyModel
from verification.calibrated import chi_square_check, chi_square_samples
from verification.examples import (
    BIASED_EXAMPLES,
    CORRECT_EXAMPLES,
    EXAMPLES,
    GREEDY_MATCH,
    IID_RULE_ON_IID,
    IID_RULE_ON_SWOR,
    IID_RULE_ON_TOPK,
    MULTIDRAFT,
    SPS,
    TUTORIAL_TREE_WALK,
    WETAP_BEAM,
    ChainVerifier,
    TreeVerifier,
    example,
    greedy_match_kernel,
    greedy_match_sample,
    iid_rule_kernel,
    iid_rule_sample,
    tutorial_tree_walk_from_uniforms,
    tutorial_tree_walk_kernel,
    tutorial_tree_walk_sample,
    wetap_beam_kernel,
    wetap_beam_verifier,
    wetap_select,
)

HALF = [0.5, 0.5]
# Stationary V = 2 model: q = (1/2, 1/2), p = (1/3, 2/3) after every prefix.
THIRDS = ToyModel(2, {}, {}, np.array(HALF), np.array([1 / 3, 2 / 3]), name="thirds")
SHAPES = [(1,), (2,), (1, 1), (3,), (2, 1)]
ALPHA_EACH = 1e-9 / 4  # four sampler-vs-kernel checks below


def first_token_law(law: dict[tuple[int, ...], float], vocab: int) -> np.ndarray:
    out = np.zeros(vocab)
    for s, m in law.items():
        out[s[0]] += m
    return out


def assert_law(got: dict[tuple[int, ...], float], want: dict[tuple[int, ...], float]) -> None:
    assert set(got) == set(want), (got, want)
    for s, m in want.items():
        assert got[s] == pytest.approx(m, abs=1e-12), s


# --------------------------------------------------------- tutorial walk


def test_tutorial_walk_single_topk_child_law_by_hand():
    # The top-1 draft token is 0 (tie to the lower id), accepted with
    # min(1, (1/3)/(1/2)) = 2/3; on rejection the token comes from
    # norm((p - q)_+) = (0, 1).  So K = [[0, 1/3], [2/9, 4/9]] and the first
    # token is 0 with probability 2/3 where the target says 1/3.
    law = tree_output_law(THIRDS, [1], Draw.TOPK, TUTORIAL_TREE_WALK.kernel).output_law
    assert_law(law, {(1,): 1 / 3, (0, 0): 2 / 9, (0, 1): 4 / 9})
    np.testing.assert_allclose(first_token_law(law, 2), [2 / 3, 1 / 3])


def test_tutorial_walk_is_biased_even_when_draft_equals_target():
    # p == q == (1/2, 1/2): the top-1 token 0 always passes (ratio 1), so the
    # first token is always 0 — TV 1/2 from a target that is uniform.  The law
    # is K(0, b) = 1/2; the completion of t = (0, b) is 1/2 against P(t) = 1/4
    # (and 0 against 1/4 for t = (1, b)): worst violation 1/4.
    model = ToyModel(2, {}, {}, np.array(HALF), np.array(HALF))
    law = tree_output_law(model, [1], Draw.TOPK, TUTORIAL_TREE_WALK.kernel)
    np.testing.assert_allclose(first_token_law(law.output_law, 2), [1.0, 0.0])
    assert law.completion_error == pytest.approx(0.25, abs=1e-12)


def test_tutorial_walk_independent_tests_are_biased_even_on_iid_drafts():
    # q = (0, 1): both i.i.d. children are token 1, each tested on its own
    # with 0.5/1.  At least one passes w.p. 3/4, so token 1 comes first w.p.
    # 3/4 (target 1/2); the fallback norm((p - q)_+) = (1, 0) gives 0 w.p. 1/4.
    model = ToyModel(2, {}, {}, np.array([0.0, 1.0]), np.array(HALF))
    law = tree_output_law(model, [2], Draw.IID, TUTORIAL_TREE_WALK.kernel).output_law
    assert_law(law, {(0,): 0.25, (1, 0): 0.375, (1, 1): 0.375})
    # SpecInfer's rule on the same draft: the second test uses the residual.
    assert tree_output_law(model, [2], Draw.IID, multidraft_kernel).completion_error < 1e-12


def deep_tree() -> tuple[DraftTree, np.ndarray]:
    """Two top-k first-level children (0, 1), each with one top-1 child (token 0).

    Accept probabilities: node 0: 0.3/0.6 = 1/2; node 1: min(1, 0.7/0.4) = 1;
    node 2 (path 0,0): 0.25/0.5 = 1/2; node 3 (path 1,0): min(1, 0.5/0.5) = 1.
    """
    tree = DraftTree.build(
        parents=[-1, -1, 0, 1],
        tokens=[0, 1, 0, 0],
        draws="topk",
        q_rows={-1: [0.6, 0.4], 0: HALF, 1: HALF},
        vocab=2,
    )
    p_rows = np.array([[0.3, 0.7], [0.25, 0.75], HALF, [1.0, 0.0], [0.0, 1.0]])
    return tree, p_rows


def test_tutorial_walk_longest_path_law_by_hand():
    # Node 3 always passes under node 1, which always passes, so depth 2 is
    # always reached.  The first depth-2 node in DFS order wins: node 2 (path
    # 0,0) when nodes 0 and 2 both pass (1/2 * 1/2), else node 3 (path 1,0).
    # Bonus rows: after (0,0) p = (1, 0); after (1,0) p = (0, 1).
    tree, p_rows = deep_tree()
    kernel = tutorial_tree_walk_kernel(tree, p_rows)
    want = np.zeros((5, 2))
    want[3, 0] = 0.25
    want[4, 1] = 0.75
    np.testing.assert_allclose(kernel, want, atol=1e-15)
    assert tree_kernel_outputs(tree, kernel) == pytest.approx({(0, 0, 0): 0.25, (1, 0, 1): 0.75})
    # First token 0 w.p. 1/4 where the target gives 0.3.


@pytest.mark.parametrize(
    "u, out",
    [
        ([0.4, 0.9, 0.6, 0.1, 0.5], [1, 0, 1]),  # node 2 fails: the deeper path under node 1 wins
        ([0.4, 0.9, 0.2, 0.1, 0.5], [0, 0, 0]),  # both depth-2 nodes pass: DFS order picks node 2
    ],
)
def test_tutorial_walk_with_chosen_noise(u, out):
    tree, p_rows = deep_tree()
    assert tutorial_tree_walk_from_uniforms(tree, p_rows, u) == out


def test_tutorial_walk_falls_back_to_root_residual_when_every_first_child_fails():
    tree = DraftTree.build([-1], [0], "topk", {-1: HALF}, 2)
    p_rows = np.array([[1 / 3, 2 / 3], [1 / 3, 2 / 3]])
    # u[0] = 0.9 >= 2/3 rejects node 0; norm((p - q)_+) = (0, 1) gives token 1.
    assert tutorial_tree_walk_from_uniforms(tree, p_rows, [0.9, 0.0]) == [1]


def test_tutorial_walk_treats_a_zero_draft_probability_as_ratio_one():
    # Top-2 of q = (1, 0) includes token 1 with q = 0; p/q = inf clamps to 1.
    tree = DraftTree.build([-1, -1], [0, 1], "topk", {-1: [1.0, 0.0]}, 2)
    p_rows = np.array([[0.5, 0.5], HALF, HALF])
    kernel = tutorial_tree_walk_kernel(tree, p_rows)
    # Node 0 passes w.p. 1/2 (0.5/1); else node 1 passes surely.
    np.testing.assert_allclose(kernel, [[0, 0], [0.25, 0.25], [0.25, 0.25]])


# -------------------------------------------------------------- WETAP


def test_wetap_single_child_law_by_hand():
    # Top-1 token 0 with P/Q = 0.5/0.6 = 5/6 > 0.5: always accepted, then one
    # token from p.  First token is 0 surely; the target says 1/2.
    model = ToyModel(2, {}, {}, np.array([0.6, 0.4]), np.array(HALF))
    law = tree_output_law(model, [1], Draw.TOPK, WETAP_BEAM.kernel).output_law
    assert_law(law, {(0, 0): 0.5, (0, 1): 0.5})


def beam_chain() -> tuple[DraftTree, np.ndarray]:
    """Tokens 0 then 0; per-token ratios 0.9/0.6 = 1.5 and 0.32/0.8 = 0.4."""
    tree = DraftTree.build([-1, 0], [0, 0], "topk", {-1: [0.6, 0.4], 0: [0.8, 0.2]}, 2)
    return tree, np.array([[0.9, 0.1], [0.32, 0.68], HALF])


@pytest.mark.parametrize(
    "tau, node",
    [
        (0.5, 1),  # cumulative 0.288/0.48 = 0.6 > 0.5 passes although 0.4 alone would not (eq. 9 vs 10)
        (0.7, 0),  # depth 2 fails (0.6); depth 1 passes with min(1, 1.5) = 1
        (1.0, ROOT),  # nothing is > 1: plain sampling from p at the root
    ],
)
def test_wetap_beam_rule_and_deep_to_shallow_scan(tau, node):
    # The beam verifier is deterministic given the draft: it accepts the path
    # to the selected node surely and draws one token from p there, so its
    # kernel is p's row at that node and zero elsewhere.
    tree, p_rows = beam_chain()
    assert wetap_select(tree, p_rows, tau) == node
    want = np.zeros_like(p_rows)
    want[node + 1] = p_rows[node + 1]
    np.testing.assert_allclose(wetap_beam_kernel(tree, p_rows, tau), want, rtol=0, atol=1e-15)


def test_wetap_picks_largest_cumulative_target_probability_in_a_layer():
    # Both first-level nodes pass (0.3/0.5 = 0.6 and min(1, 0.4/0.3) = 1);
    # node 1 has the larger target probability 0.4.
    tree = DraftTree.build([-1, -1], [0, 1], "topk", {-1: [0.5, 0.3, 0.2]}, 3)
    p_rows = np.array([[0.3, 0.4, 0.3], [1 / 3] * 3, [1 / 3] * 3])
    assert wetap_select(tree, p_rows, 0.5) == 1


def test_wetap_with_threshold_one_is_plain_sampling_and_lossless():
    lossless = wetap_beam_verifier(1.0)
    assert not lossless.biased
    for shape in SHAPES:
        assert tree_output_law(paper_toy_model(), shape, Draw.TOPK, lossless.kernel).completion_error < 1e-12


# --------------------------------------------------------- greedy match

GREEDY_MODEL = ToyModel(
    2,
    {},
    {(): np.array([0.6, 0.4])},
    draft_default=np.array(HALF),
    target_default=np.array([0.3, 0.7]),
)


def test_greedy_match_law_by_hand():
    # Draft [0] (w 1/2) equals argmax p = 0: accepted, bonus argmax (0.3, 0.7) = 1.
    # Draft [1] (w 1/2) mismatches: emit argmax p = 0.  So the first token is
    # always 0 (target 0.6); completing: C(0,0) = 0.15, C(0,1) = 0.85 against
    # P = 0.18, 0.42, 0.12, 0.28 — worst violation 0.43 at (0, 1).
    law = chain_output_law(GREEDY_MODEL, 1, GREEDY_MATCH.kernel)
    assert_law(law.output_law, {(0, 1): 0.5, (0,): 0.5})
    assert law.completion_error == pytest.approx(0.43, abs=1e-12)


def test_greedy_match_sampler_is_its_deterministic_kernel():
    rng = np.random.default_rng(0)
    q, p = np.array([HALF, HALF]), np.array([[0.6, 0.4], [0.3, 0.7], [0.8, 0.2]])
    assert greedy_match_sample([0, 1], q, p, rng) == [0, 1, 0]
    assert greedy_match_sample([1, 1], q, p, rng) == [0]
    assert greedy_match_sample([0, 0], q, p, rng) == [0, 1]
    np.testing.assert_array_equal(greedy_match_kernel([0, 0], q, p), [[0, 0], [0, 1], [0, 0]])


def test_greedy_match_sampler_and_kernel_agree_on_every_draft():
    """The sampler walks the rule itself (it was the kernel's argmax, so the suite's sampler-vs-kernel row could
    not fail): on every draft of length 0-3 over V = 3, with tied target rows (ties: the lowest id), the
    sampler's output is the one cell of the kernel's law."""
    import itertools

    rows = np.array([[0.2, 0.4, 0.4], [0.5, 0.1, 0.4], [1 / 3, 1 / 3, 1 / 3], [0.1, 0.2, 0.7]])
    for n in range(4):
        for ref in itertools.product(range(3), repeat=n):
            q, p = np.full((n, 3), 1 / 3), rows[: n + 1]
            kernel = greedy_match_kernel(list(ref), q, p)
            (cell,) = zip(*np.nonzero(kernel))
            k, tok = int(cell[0]), int(cell[1])
            assert greedy_match_sample(list(ref), q, p, 0) == [*ref[:k], tok], ref


@pytest.mark.parametrize("n", [1, 2, 3])
def test_greedy_match_is_lossless_for_one_hot_targets(n):
    model = ToyModel.random(3, 3, np.random.default_rng(n))
    one_hot = {k: np.eye(3)[int(np.argmax(v))] for k, v in model.target_rows.items()}
    greedy = ToyModel(3, model.draft_rows, one_hot)
    assert chain_output_law(greedy, n, GREEDY_MATCH.kernel).completion_error < 1e-12


# ------------------------------------------------ i.i.d. rule, mispaired

SWOR_MODEL = ToyModel(3, {}, {}, np.array([0.0, 0.5, 0.5]), np.array([1 / 3, 0.0, 2 / 3]))


def test_iid_rule_on_trees_drawn_without_replacement_by_hand():
    # Trees (1, 2) and (2, 1), each w.p. 1/2.  (2, 1): 2 passes (ratio >= 1).
    # (1, 2): 1 fails (p = 0), r = norm((p - q)_+) = (2/3, 0, 1/3); the i.i.d.
    # rule tests 2 against q(2) = 1/2: accept 2/3 -> [2, .]; else r = (1, 0, 0)
    # -> [0].  First token: 2 w.p. 5/6, 0 w.p. 1/6 (target 2/3, 1/3).
    law = tree_output_law(SWOR_MODEL, [2], Draw.SWOR, IID_RULE_ON_SWOR.kernel).output_law
    assert_law(law, {(0,): 1 / 6, (2, 0): 5 / 18, (2, 2): 10 / 18})
    # The second child was really drawn from (0, 0, 1): the correct rule
    # accepts it w.p. r(2) = 1/3, and the law is the target's.
    assert tree_output_law(SWOR_MODEL, [2], Draw.SWOR, multidraft_kernel).completion_error < 1e-12
    assert tree_output_law(SWOR_MODEL, [2], Draw.IID, IID_RULE_ON_IID.kernel).completion_error < 1e-12


def test_iid_rule_on_topk_trees_by_hand():
    # Same arithmetic as the tutorial's single child: q is not the law the
    # deterministic top-1 token was drawn from.
    law = tree_output_law(THIRDS, [1], Draw.TOPK, IID_RULE_ON_TOPK.kernel).output_law
    assert_law(law, {(1,): 1 / 3, (0, 0): 2 / 9, (0, 1): 4 / 9})


# ---------------------------------------------------- lossless references


@pytest.mark.parametrize("verifier", CORRECT_EXAMPLES, ids=lambda v: v.name)
@pytest.mark.parametrize("seed", [0, 1])
def test_correct_examples_satisfy_the_completion_identity_exactly(verifier, seed):
    models = [paper_toy_model(), ToyModel.random(3, 3, np.random.default_rng(seed))]
    for model in models:
        if isinstance(verifier, ChainVerifier):
            for n in (1, 2, 3):
                assert chain_output_law(model, n, verifier.kernel).completion_error < 1e-12
            continue
        for draw in verifier.draws:
            for shape in SHAPES:
                assert tree_output_law(model, shape, draw, verifier.kernel).completion_error < 1e-12


@pytest.mark.parametrize("verifier", [v for v in BIASED_EXAMPLES if isinstance(v, TreeVerifier)], ids=lambda v: v.name)
def test_biased_tree_examples_are_exact_on_a_one_token_vocabulary(verifier):
    model = ToyModel(1, {}, {}, np.ones(1), np.ones(1))
    for shape in SHAPES:
        law = tree_output_law(model, shape, verifier.draws[0], verifier.kernel)
        assert law.completion_error < 1e-15


# ------------------------------------------------ samplers match kernels


def sample_cells(tree: DraftTree, p_rows: np.ndarray, sample, kernel: np.ndarray, seed: int) -> None:
    outputs = tree_kernel_outputs(tree, kernel)
    cells = sorted(outputs)
    index = {s: i for i, s in enumerate(cells)}
    probs = np.array([outputs[s] for s in cells] + [0.0])  # last cell: outputs the kernel rules out
    n = chi_square_samples(probs, 0.05, ALPHA_EACH)  # fixed before sampling
    rng = np.random.default_rng(seed)
    counts = np.zeros(len(cells) + 1, dtype=np.int64)
    for _ in range(n):
        counts[index.get(tuple(sample(tree, p_rows, rng)), len(cells))] += 1
    result = chi_square_check(counts, probs, ALPHA_EACH)
    assert result.passed, result


def test_tutorial_sampler_matches_kernel_on_a_random_tree():
    tree = DraftTree.build(
        parents=[-1, -1, 0, 0, 1],
        tokens=[0, 2, 1, 0, 2],
        draws="topk",
        q_rows={-1: [0.5, 0.2, 0.3], 0: [0.3, 0.4, 0.3], 1: [0.2, 0.3, 0.5]},
        vocab=3,
    )
    p_rows = np.array([[0.2, 0.3, 0.5], [0.5, 0.3, 0.2], [0.3, 0.3, 0.4], [0.6, 0.2, 0.2], [0.1, 0.8, 0.1], [0.4, 0.4, 0.2]])
    sample_cells(tree, p_rows, tutorial_tree_walk_sample, tutorial_tree_walk_kernel(tree, p_rows), 1)


def test_wetap_sampler_matches_kernel():
    tree, p_rows = beam_chain()
    sample_cells(tree, p_rows, WETAP_BEAM.sample, WETAP_BEAM.kernel(tree, p_rows), 2)


@pytest.mark.parametrize("draw", ["swor", "topk"])
def test_iid_rule_sampler_matches_kernel(draw):
    tree = DraftTree.build([-1, -1, 0], [1, 2, 0], draw, {-1: [0.2, 0.5, 0.3], 0: [0.3, 0.4, 0.3]}, 3)
    p_rows = np.array([[0.3, 0.3, 0.4], [0.5, 0.1, 0.4], [0.2, 0.2, 0.6], [0.3, 0.3, 0.4]])
    sample_cells(tree, p_rows, iid_rule_sample, iid_rule_kernel(tree, p_rows), 3)


# ------------------------------------------------- records and validation


def test_registry_labels_and_calling_convention():
    names = [v.name for v in EXAMPLES]
    assert len(set(names)) == len(names)
    assert all(v.biased for v in BIASED_EXAMPLES) and not any(v.biased for v in CORRECT_EXAMPLES)
    assert all(v.kernel is not None for v in EXAMPLES)
    assert example("greedy_match") is GREEDY_MATCH
    assert all("BIASED" in (v.kernel.__doc__ or "") for v in (TUTORIAL_TREE_WALK, GREEDY_MATCH))
    assert TUTORIAL_TREE_WALK.kind == "tree" and GREEDY_MATCH.kind == "chain"


def _one_draft_step_by_hand(u: np.ndarray) -> list[int]:
    """One draft token 0 from q = (1/2, 1/2) against p = (1/4, 3/4), then p = (2/5, 3/5).

    Worked by hand from the documented noise layout (u[0] the accept test,
    u[1] the final draw by inverse CDF): accept 0 iff u[0] < (1/4)/(1/2) = 1/2;
    then the bonus from (2/5, 3/5) is 0 iff u[1] < 2/5.  On rejection the
    residual norm((p − q)_+) = norm(0, 1/4) = (0, 1) gives token 1.
    """
    if u[0] < 0.5:
        return [0, 0 if u[1] < 0.4 else 1]
    return [1]


P_ONE_DRAFT = [[0.25, 0.75], [0.4, 0.6]]
SEEDS = range(10)


@pytest.mark.parametrize("seed", SEEDS)
def test_registry_sps_follows_the_calling_convention_and_its_noise_layout(seed):
    # SPS(ref, q_rows, p_rows, rng) is one SpS step that draws n + 1 = 2 uniforms.
    u = np.random.default_rng(seed).random(2)
    assert SPS([0], [HALF], P_ONE_DRAFT, np.random.default_rng(seed)) == _one_draft_step_by_hand(u)


@pytest.mark.parametrize("seed", SEEDS)
def test_registry_multidraft_on_one_child_is_the_same_sps_step(seed):
    # A width-1 tree is a chain: residual verification of one i.i.d. child
    # from q is SpS, driven by N + 1 = 2 uniforms (node 0's test, final draw).
    tree = DraftTree.build([-1], [0], "iid", {-1: HALF}, 2)
    u = np.random.default_rng(seed).random(2)
    assert MULTIDRAFT(tree, P_ONE_DRAFT, np.random.default_rng(seed)) == _one_draft_step_by_hand(u)


def test_registry_seeds_cover_every_branch_of_the_hand_rule():
    # The seeds above reach all three outcomes [0, 0], [0, 1] and [1].
    outs = {tuple(_one_draft_step_by_hand(np.random.default_rng(s).random(2))) for s in SEEDS}
    assert outs == {(0, 0), (0, 1), (1,)}


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: example("nope"), "unknown example"),
        (lambda: ChainVerifier("", greedy_match_sample), "name"),
        (lambda: TreeVerifier("x", iid_rule_sample, draws=()), "draws"),
        (lambda: wetap_beam_verifier(1.5), "tau"),
        (lambda: wetap_beam_verifier(float("nan")), "tau"),
        (lambda: greedy_match_sample([1], [[1.0, 0.0]], [HALF, HALF], np.random.default_rng(0)), r"q_rows\[0, 1\] = 0"),
        (lambda: tutorial_tree_walk_kernel(DraftTree.build([-1], [0], "topk", {}, 2), [HALF, HALF]), r"no q_rows\[-1\]"),
        (lambda: iid_rule_kernel(DraftTree.build([-1], [0], "iid", {-1: HALF}, 2), [HALF]), "p_rows has shape"),
        (lambda: wetap_beam_kernel(DraftTree.build([-1], [0], "topk", {-1: HALF}, 2), [HALF, [0.7, 0.7]]), "sums to"),
    ],
)
def test_bad_input_raises_value_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()
