"""Traversal Verification (tmc.traversal): chains, losslessness, expected length, samplers, bad input.

Exact before statistical (STYLE rule 7): the kernel is checked against block
verification on chains, against residual verification on one-level trees,
by hand on the paper's sequence-level example, and for losslessness by the
completion identity over every draft tree of small shapes.  The sampler is
checked against the kernel on chosen noise, then by a calibrated chi-square.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tmc import (
    ALL_DRAWS,
    DraftTree,
    Draw,
    ToyModel,
    asps_kernel,
    block_kernel,
    chain_drafts,
    multidraft_kernel,
    output_law,
    paper_toy_model,
    tree_drafts,
)
from tmc.lp import lp_limit
from tmc.multidraft import tree_kernel_outputs
from tmc.traversal import traversal_kernel, traversal_sample, traversal_sample_from_uniforms
from verification.broken_traversal import (
    broken_traversal_kernel,
    broken_traversal_sample_from_uniforms,
    smallest_biased_case,
)
from verification.calibrated import kl_check, kl_required_samples
from verification.strategies import prob_rows

UNIFORM = np.full(3, 1 / 3)

# ------------------------------------------------------------------ chains


@st.composite
def chains(draw: st.DrawFn) -> tuple[list[int], np.ndarray, np.ndarray]:
    """``(ref, q_rows, p_rows)``: a draft chain of 0..5 tokens, each with ``q > 0``."""
    vocab = draw(st.integers(1, 4))
    n = draw(st.integers(0, 5))
    tiny = draw(st.booleans())
    q_rows = [draw(prob_rows(vocab, tiny=tiny)) for _ in range(n)]
    ref = [draw(st.sampled_from([int(t) for t in np.flatnonzero(q > 0)])) for q in q_rows]
    p_rows = [draw(prob_rows(vocab, tiny=tiny)) for _ in range(n + 1)]
    return ref, np.array(q_rows).reshape(n, vocab), np.array(p_rows)


@settings(max_examples=150)
@given(chain=chains(), draw=st.sampled_from([Draw.IID, Draw.SWOR]))
def test_chain_kernel_equals_block_and_asps(chain, draw):
    # A width-1 tree drawn iid or swor is a chain drafted from q: Traversal is block verification.
    ref, q_rows, p_rows = chain
    kernel = traversal_kernel(DraftTree.chain(ref, q_rows, draw), p_rows)
    np.testing.assert_allclose(kernel, block_kernel(ref, q_rows, p_rows), rtol=0, atol=1e-12)
    np.testing.assert_allclose(kernel, asps_kernel(ref, q_rows, p_rows), rtol=0, atol=1e-12)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_paper_toy_chains_equal_block(n):
    for d in chain_drafts(paper_toy_model(), n):
        kernel = traversal_kernel(DraftTree.chain(d.ref, d.q_rows), d.p_rows)
        np.testing.assert_allclose(kernel, block_kernel(d.ref, d.q_rows, d.p_rows), rtol=0, atol=1e-12)


def test_sequence_level_acceptance_hand_computed():
    # The paper's motivating example: the first token alone has ratio 1/2, the second 4/3;
    # token-level verification accepts both with probability 1/2, the sequence with min(1, 1/2 · 4/3) = 2/3.
    q_rows = [[0.5, 0.5], [0.75, 0.25]]
    p_rows = [[0.25, 0.75], [1.0, 0.0], [0.5, 0.5]]
    kernel = traversal_kernel(DraftTree.chain([0, 0], q_rows), p_rows)
    # Leaf rejected (1/3): node 0 has (1/2 · p − q)_+ = 0, so its value drops to 0; the root
    # emits from norm((p − q)_+) = token 1.
    expected = np.array([[0.0, 1 / 3], [0.0, 0.0], [1 / 3, 1 / 3]])
    np.testing.assert_allclose(kernel, expected, rtol=0, atol=1e-15)


@pytest.mark.parametrize("width", [1, 2, 3])
@pytest.mark.parametrize("draw", ALL_DRAWS)
def test_one_level_tree_equals_residual_verification(width, draw):
    # The root's value is always 1, so on one level the leaf values are the residual rule's ratios.
    for seed in range(3):
        model = ToyModel.random(3, 1, seed)
        for d in tree_drafts(model, [width], draw):
            np.testing.assert_allclose(
                traversal_kernel(d.tree, d.p_rows), multidraft_kernel(d.tree, d.p_rows), rtol=0, atol=1e-14
            )


# ---------------------------------------------------- lossless by computation


def _with_targets(model: ToyModel, target, name: str) -> ToyModel:
    """``model``'s draft rows with the target row ``target(q, prefix)`` at every prefix."""
    rows = {k: target(np.asarray(q), k) for k, q in model.draft_rows.items()}
    return ToyModel(model.vocab, dict(model.draft_rows), rows, name=name)


def _near_tie(q: np.ndarray, prefix: tuple[int, ...]) -> np.ndarray:
    bump = 1e-12 * np.random.default_rng(len(prefix) * 31 + sum(prefix)).integers(-3, 4, q.shape)
    row = np.maximum(q + bump * (q > 0), 0.0)
    return row / row.sum()


def _one_hot(q: np.ndarray, prefix: tuple[int, ...]) -> np.ndarray:
    row = np.zeros_like(q)
    row[(sum(prefix) + 1) % q.shape[0]] = 1.0  # often a token the draft finds unlikely
    return row


def _tiny(model: ToyModel) -> ToyModel:
    def fill(row: np.ndarray) -> np.ndarray:
        out = np.where(row == 0, 1e-12, row)
        return out / out.sum()

    return ToyModel(
        model.vocab,
        {k: fill(v) for k, v in model.draft_rows.items()},
        {k: fill(v) for k, v in model.target_rows.items()},
        name="tiny",
    )


MODEL_KINDS = ("zeros", "dense", "identical", "near_tie", "one_hot", "tiny")


@functools.lru_cache(maxsize=None)
def _model(vocab: int, depth: int, kind: str) -> ToyModel:
    """Models with exact zeros, near-ties (1e-12), p == q, one-hot targets and 1e-12 entries."""
    base = ToyModel.random(vocab, depth, 1000 + 10 * vocab + depth, zero_prob=0.3)
    if kind == "zeros":
        return base
    if kind == "dense":
        return ToyModel.random(vocab, depth, 2000 + 10 * vocab + depth, zero_prob=0.0)
    if kind == "identical":
        return _with_targets(base, lambda q, _: q.copy(), kind)
    if kind == "near_tie":
        return _with_targets(base, _near_tie, kind)
    if kind == "one_hot":
        return _with_targets(base, _one_hot, kind)
    return _tiny(base)


SHAPES = ([2], [3], [2, 1], [1, 2], [2, 2], [2, 1, 1])
SMALL_SHAPES = ([2], [3], [2, 1], [1, 2])
LOSSLESS_CASES = [(v, shape) for v in (2, 3) for shape in SHAPES] + [(4, shape) for shape in SMALL_SHAPES]


@pytest.mark.parametrize("draw", ALL_DRAWS)
@pytest.mark.parametrize(("vocab", "shape"), LOSSLESS_CASES)
def test_completion_identity_on_every_draft_tree(vocab, shape, draw):
    for kind in MODEL_KINDS:
        model = _model(vocab, len(shape), kind)
        law = output_law(model, tree_drafts(model, shape, draw), traversal_kernel)
        assert law.completion_error <= 1e-12, (kind, law.completion_error)
        assert sum(law.output_law.values()) == pytest.approx(1.0, abs=1e-12), kind


@settings(max_examples=40)
@given(chain=chains())
def test_kernel_is_a_law_with_no_mass_on_accepted_siblings(chain):
    ref, q_rows, p_rows = chain
    kernel = traversal_kernel(DraftTree.chain(ref, q_rows), p_rows)
    assert (kernel >= 0).all()
    assert kernel.sum() == pytest.approx(1.0, abs=1e-12)


# ------------------------------------------------------------ expected length


@pytest.mark.parametrize("draw", ALL_DRAWS)
@pytest.mark.parametrize("shape", SHAPES)
def test_expected_length_between_residual_verification_and_lp_limit(shape, draw):
    # Measured (V = 3, 10 random models per shape): never below residual verification for
    # any draw kind; LP tolerance 1e-6 (DESIGN.md §6).
    for seed in range(3):
        model = ToyModel.random(3, len(shape), seed)
        drafts = tree_drafts(model, shape, draw)
        traversal = output_law(model, drafts, traversal_kernel).expected_length
        residual = output_law(model, drafts, multidraft_kernel).expected_length
        assert traversal >= residual - 1e-12, seed
        assert traversal <= lp_limit(model, drafts).expected_length + 1e-6, seed


# ---------------------------------------------------------------- samplers


def _tree(shape, draw, seed=4, vocab=3):
    model = ToyModel.random(vocab, len(shape), seed, zero_prob=0.0)
    drafts = tree_drafts(model, shape, draw)
    d = drafts[len(drafts) // 2]
    return d.tree, d.p_rows


def test_sampler_replays_its_uniforms():
    tree, p_rows = _tree([2, 1], "iid")
    for seed in range(20):
        got = traversal_sample(tree, p_rows, np.random.default_rng(seed))
        want = traversal_sample_from_uniforms(tree, p_rows, np.random.default_rng(seed).random(tree.size + 1))
        assert got == want
    assert traversal_sample(tree, p_rows, 7) == traversal_sample(tree, p_rows, np.random.default_rng(7))


FAIL = float(np.nextafter(1.0, 0.0))  # fails every test whose value is below 1


@pytest.mark.parametrize(("shape", "draw"), [([2, 1], "iid"), ([2, 2], "swor"), ([2, 1, 1], "topk"), ([3, 1], "iid")])
def test_sampler_on_chosen_noise_hits_every_kernel_cell(shape, draw):
    # Fail every test but node j's (u = 0 passes any positive value) and put u[N] in the middle of
    # token b's interval of row j: the step must output path(j) + [b] for every cell of mass > 0.
    tree, p_rows = _tree(shape, draw)
    kernel = traversal_kernel(tree, p_rows)
    paths = tree.paths()
    hit = 0
    for j in np.flatnonzero(kernel.sum(axis=1) > 0):
        row = kernel[j] / kernel[j].sum()
        cdf = np.cumsum(row)
        for b in np.flatnonzero(row > 1e-9):
            u = np.full(tree.size + 1, FAIL)
            if j > 0:
                u[j - 1] = 0.0
            u[tree.size] = cdf[b] - row[b] / 2
            assert traversal_sample_from_uniforms(tree, p_rows, u) == list(paths[j]) + [int(b)]
            hit += 1
    assert hit >= 3


# Calibrated: false-fail budget 1e-9 split over these checks (Bonferroni); each detects a
# sampler at total variation >= 0.05 from the exact kernel with probability >= 1 - 1e-3.  The
# KL-bound test holds its rate for any sample size; the chi-square's tail at 3.3e-10 was an
# approximation, about 7e-9 on the 15-cell top-k case (statistics audit), above the whole budget.
SAMPLER_CASES = [([2, 1], "iid"), ([2, 2], "swor"), ([2, 1, 1], "topk")]
ALPHA = 1e-9 / len(SAMPLER_CASES)
DETECTABLE_TV = 0.05


@pytest.mark.parametrize(("shape", "draw"), SAMPLER_CASES)
def test_sampler_matches_kernel(shape, draw):
    tree, p_rows = _tree(shape, draw)
    exact = tree_kernel_outputs(tree, traversal_kernel(tree, p_rows))
    cells = sorted(exact)
    index = {s: i for i, s in enumerate(cells)}
    probs = np.array([exact[s] for s in cells] + [0.0])  # last cell: anything impossible
    n = kl_required_samples(len(cells), DETECTABLE_TV, ALPHA)
    assert n <= 40_000, n  # computed before sampling
    rng = np.random.default_rng(2024)
    counts = np.zeros(len(probs), dtype=np.int64)
    for _ in range(n):
        counts[index.get(tuple(traversal_sample(tree, p_rows, rng)), len(cells))] += 1
    result = kl_check(counts, probs, ALPHA)
    assert result.passed, result


# --------------------------------------------------------------- bad input


def _small_tree() -> DraftTree:
    return DraftTree.build([-1, 0], [0, 1], "iid", {-1: UNIFORM, 0: UNIFORM}, 3)


def test_p_rows_shape_must_match_tree():
    tree = _small_tree()
    with pytest.raises(ValueError, match=r"p_rows has shape \(2, 3\); expected \(N \+ 1, V\) = \(3, 3\)"):
        traversal_kernel(tree, np.tile(UNIFORM, (2, 1)))
    with pytest.raises(ValueError, match=r"p_rows"):
        traversal_sample(tree, np.full((3, 2), 0.5), 0)
    with pytest.raises(ValueError, match=r"p_rows row 1 has a negative entry"):
        traversal_kernel(tree, [UNIFORM, [-0.1, 0.6, 0.5], UNIFORM])


@pytest.mark.parametrize(
    "call",
    [
        lambda t, p: traversal_kernel(t, p),
        lambda t, p: traversal_sample(t, p, 0),
        lambda t, p: traversal_sample_from_uniforms(t, p, [0.5] * 3),
    ],
    ids=["kernel", "sample", "from_uniforms"],
)
def test_tree_must_be_a_draft_tree(call):
    with pytest.raises(ValueError, match="tree must be a DraftTree"):
        call({"parents": [-1], "tokens": [0]}, np.tile(UNIFORM, (2, 1)))


@pytest.mark.parametrize(
    ("u", "match"),
    [
        ([0.5, 0.5], r"u must have shape \(3,\)"),
        ([0.5, 0.5, 1.0], r"u\[2\] = .*1\.0.* is not a uniform draw"),
        ([-0.1, 0.5, 0.5], r"u\[0\] = .*-0\.1.* is not a uniform draw"),
        ([np.nan, 0.5, 0.5], r"u\[0\] = .*nan.* is not a uniform draw"),
    ],
)
def test_bad_uniforms_rejected(u, match):
    with pytest.raises(ValueError, match=match):
        traversal_sample_from_uniforms(_small_tree(), np.tile(UNIFORM, (3, 1)), u)


def test_bad_rng_rejected():
    with pytest.raises(ValueError, match="rng"):
        traversal_sample(_small_tree(), np.tile(UNIFORM, (3, 1)), "seed")


# --------------------------------------------------------- the BIASED variant


def test_broken_variant_is_biased_on_its_smallest_case():
    model, shape, draw = smallest_biased_case()
    drafts = tree_drafts(model, shape, draw)
    assert output_law(model, drafts, traversal_kernel).completion_error <= 1e-12
    assert output_law(model, drafts, broken_traversal_kernel).completion_error == pytest.approx(0.125, abs=1e-12)


@pytest.mark.parametrize("draw", ALL_DRAWS)
def test_broken_variant_differs_only_below_the_root(draw):
    # The hook changes the update after a deletion below depth 1 only: one-level trees agree.
    model = ToyModel.random(3, 2, 5)
    for d in tree_drafts(model, [2], draw):
        np.testing.assert_array_equal(broken_traversal_kernel(d.tree, d.p_rows), traversal_kernel(d.tree, d.p_rows))
    law = output_law(model, tree_drafts(model, [2, 1], draw), broken_traversal_kernel)
    assert law.completion_error > 1e-3


def test_broken_sampler_uses_the_same_noise_layout():
    model, shape, draw = smallest_biased_case()
    d = tree_drafts(model, shape, draw)[0]
    # Leaf fails (u = 0.9 >= 1/2), node 0 passes (u = 0.1 < 1/2 kept): the BIASED step emits 1 1.
    assert broken_traversal_sample_from_uniforms(d.tree, d.p_rows, [0.1, 0.9, 0.7]) == [1, 1]
    assert traversal_sample_from_uniforms(d.tree, d.p_rows, [0.1, 0.9, 0.7]) == [0]


def test_tree_kernels_beside_a_shared_entry_near_one_equal_the_exact_chain_laws():
    """Trees whose rows stand for ``1 − tiny`` where floats hold 1.0 (found by an audit against exact rationals):
    a one-node tree is SpS and a chain is block verification for Traversal (multi-draft: SpS), so the literal
    exact-rational chain implementations give the exact law.  ``p = [1.0, 1e-20]`` beside ``q = [1, 0]`` has
    ``a = 1 − 1e-20``: the child state kept ``1 − a = 0`` and the walk accepted node 0 (total variation 1)."""
    from proofs_check.chain_literal import block_literal, rational_rows, sps_literal, to_float
    from tmc import DraftTree, multidraft_kernel, traversal_kernel
    from tmc.ordered_traversal import ordered_traversal_kernel

    ref, q, p = [0], [[1e-17, 0.0, 1.0]], [[1e-30, 1e-30, 1.0], [1 / 3, 1 / 3, 1 / 3]]
    one = DraftTree.chain(ref, np.array(q))
    exact = np.array(to_float(sps_literal(ref, rational_rows(q), rational_rows(p))))
    for kernel in (multidraft_kernel, traversal_kernel, ordered_traversal_kernel):
        np.testing.assert_allclose(kernel(one, p), exact, rtol=1e-9, atol=1e-300, err_msg=kernel.__name__)
    ref, q, p = [0, 1], [[1.0, 0.0], [1.0, 1e-30]], [[1.0, 1e-20], [1.0, 0.0], [0.5, 0.5]]
    chain = DraftTree.chain(ref, np.array(q))
    exact = np.array(to_float(block_literal(ref, rational_rows(q), rational_rows(p))))
    assert exact[0].tolist() == [0.0, 1.0]
    for kernel in (traversal_kernel, ordered_traversal_kernel):
        np.testing.assert_allclose(kernel(chain, p), exact, rtol=1e-9, atol=1e-300, err_msg=kernel.__name__)
