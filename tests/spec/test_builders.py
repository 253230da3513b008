"""Tree builders: the interface, the laws they sample from, their rules, bad input."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from spec.acceptance import builder_drafts
from spec.builders import (
    BUILDERS,
    ChainBuilder,
    DynaTreeBuilder,
    DynaTreeState,
    DySpecBuilder,
    DySpecThresholdBuilder,
    FixedBuilder,
    WetapBuilder,
    make_builder,
)
from spec.builders.base import TreeBuilder
from spec.cli import BUILDER_NAMES
from spec.draft import HashedDraft, ToyDraft, draft_rows
from spec.randomness import ScriptedSampler, TooManyRuns, enumerate_runs
from tmc.drafts import chain_drafts, tree_drafts
from tmc.multidraft import ROOT, DraftTree, Draw, proposal_laws
from tmc.toy import ToyModel

from tests.spec.conftest import models

SMALL = {  # parameters that keep every builder small on V <= 4 toy models
    "chain": {},
    "fixed": {"width": 2},
    "dyspec": {},
    "dyspec-threshold": {"threshold": 0.05},
    "dynatree": {"base_depth": 2, "max_depth": 3},
    "wetap": {"length": 3, "w_min": 2, "w_max": 4},
}


def test_cli_names_are_the_registry() -> None:
    assert BUILDER_NAMES == tuple(BUILDERS)


@pytest.mark.parametrize("name", list(BUILDERS))
def test_every_builder_respects_budget_and_records_draws(name: str) -> None:
    expected = {"chain": {Draw.IID}, "fixed": {Draw.SWOR}, "dyspec": {Draw.SWOR}, "dyspec-threshold": {Draw.SWOR},
                "dynatree": {Draw.TOPK}, "wetap": {Draw.TOPK}}[name]
    for m in models(3, range(3)):
        for budget in (1, 3, 6):
            tree = make_builder(name, **SMALL[name]).build(ToyDraft(m), budget, np.random.default_rng(budget))
            assert isinstance(tree, DraftTree)
            assert 1 <= tree.size <= budget  # DynaTree too: its tree starts from the top-1 token u0 (App. D line 10)
            assert set(tree.draws) <= expected


def test_sampled_tokens_are_drawn_from_the_recorded_law() -> None:
    """Each draw's law (as the scripted sampler saw it) is the proposal law the tree records."""
    for name in ("chain", "fixed", "dyspec", "dyspec-threshold"):
        for m in models(3, range(2)):
            b = make_builder(name, **SMALL[name])
            for tree, _, sampler in enumerate_runs(lambda s: b.build(ToyDraft(m), 4, s)):
                assert len(sampler.draws) == tree.size  # one draw per node, in node order
                for node, (law, tok) in enumerate(sampler.draws):
                    par = tree.parents[node]
                    sib = tree.children(par).index(node)
                    assert tree.tokens[node] == tok
                    np.testing.assert_allclose(proposal_laws(tree, par)[sib], law, rtol=0, atol=1e-15)


def test_enumerated_probabilities_sum_to_one() -> None:
    for name in BUILDERS:
        for m in models(3, range(2)):
            drafts = builder_drafts(m, make_builder(name, **SMALL[name]), 4)
            assert math.isclose(sum(d.weight for d in drafts), 1.0, abs_tol=1e-12)


@pytest.mark.parametrize("draw", ["iid", "swor", "topk"])
def test_fixed_builder_law_is_tmc_fixed_shape_law(draw: str) -> None:
    """Independent enumeration: tmc.drafts enumerates the same fixed shapes on its own."""
    for m in models(3, range(3), concentration=2.0):
        if draw == "topk":  # tmc's topk may pick zero-probability tokens; builders never do
            m = ToyModel(3, {k: (v + 0.1) / 1.3 for k, v in m.draft_rows.items()}, m.target_rows,
                         (m.draft_default + 0.1) / 1.3, m.target_default)
        for width, depth in ((2, 2), (3, 1), (1, 3)):
            ours = builder_drafts(m, FixedBuilder(width=width, depth=depth, draw=draw), 100)
            theirs = tree_drafts(m, (width,) * depth, draw)
            key = lambda d: (d.tree.parents, d.tree.tokens)  # noqa: E731
            a = {key(d): d.weight for d in ours}
            b: dict[object, float] = {}
            for d in theirs:
                b[key(d)] = b.get(key(d), 0.0) + d.weight
            assert a.keys() == b.keys()
            for k in a:
                assert math.isclose(a[k], b[k], rel_tol=1e-12)


def test_chain_builder_law_is_tmc_chain_law() -> None:
    for m in models(3, range(3)):
        ours = {d.tree.tokens: d.weight for d in builder_drafts(m, ChainBuilder(), 3)}
        theirs = {d.ref: d.weight for d in chain_drafts(m, 3)}
        assert ours.keys() == theirs.keys()
        assert all(math.isclose(ours[k], theirs[k], rel_tol=1e-12) for k in ours)


def test_chain_topk_is_greedy() -> None:
    m = models(4, range(1))[0]
    tree = ChainBuilder(draw="topk").build(ToyDraft(m), 3)
    path: tuple[int, ...] = ()
    for tok in tree.tokens:
        assert tok == int(np.argmax(m.q(path)))
        path += (tok,)


def test_dyspec_hand_case(hand_model: ToyModel) -> None:
    """Alg. 1 on q root (0.6, 0.4), later rows (0.9, 0.1), budget 2 (derived by hand):

    y = 0 (0.6): child position value 0.6 beats sibling 0.4, so 0's first child is
    drawn (0 w.p. 0.9, 1 w.p. 0.1).  y = 1 (0.4): sibling value 0.6 beats child
    0.4, and the sibling is drawn from q without 1: token 0 surely.
    """
    law = {(d.tree.parents, d.tree.tokens): d.weight for d in builder_drafts(hand_model, DySpecBuilder(), 2)}
    expected = {((-1, 0), (0, 0)): 0.54, ((-1, 0), (0, 1)): 0.06, ((-1, -1), (1, 0)): 0.4}
    assert law.keys() == expected.keys()
    assert all(math.isclose(law[k], v, rel_tol=1e-12) for k, v in expected.items())


def test_dyspec_threshold_hand_case(hand_model: ToyModel) -> None:
    """Alg. 2, threshold 0.5: root position 1.0 draws y; its sibling position has value
    1 − R[y] (0.4 or 0.6) and its first child R[y] (0.6 or 0.4).  Layer 1: y = 0 leaves
    sibling 0.4 < 0.5 (stop); y = 1 leaves sibling 0.6, which draws 0.  Layer 2: children
    of value >= 0.5 draw one token (then their next-sibling value 0.6·0.1 or ... < 0.5)."""
    law = {(d.tree.parents, d.tree.tokens): d.weight for d in builder_drafts(hand_model, DySpecThresholdBuilder(threshold=0.5), 10)}
    # y = 0 (0.6): node 0 has value 0.6 -> one child (0: value .54 -> grandchild ...).
    total = sum(law.values())
    assert math.isclose(total, 1.0, abs_tol=1e-12)
    roots = {}
    for (parents, tokens), w in law.items():
        first = tuple(t for p, t in zip(parents, tokens) if p == ROOT)
        roots[first] = roots.get(first, 0.0) + w
    assert roots.keys() == {(0,), (1, 0)}
    assert math.isclose(roots[(0,)], 0.6) and math.isclose(roots[(1, 0)], 0.4)


def test_dyspec_threshold_defaults_to_one_over_the_budget() -> None:
    """§4.4: a threshold "typically around 1/n".  The default is 1 / budget: the same trees as that threshold
    given, draw for draw; App. B's fixed 0.001 at a budget of 16 put most nodes at depth 1 (a statistics-free
    count on a peaked draft: the share of depth-1 nodes over 20 trees)."""
    for budget in (4, 16, 40):
        for seed in range(5):
            by_default = DySpecThresholdBuilder().build(HashedDraft(64, seed=seed, concentration=0.05), budget, seed)
            given = DySpecThresholdBuilder(threshold=1 / budget).build(
                HashedDraft(64, seed=seed, concentration=0.05), budget, seed)
            assert by_default == given, (budget, seed)

    def depth_one_share(builder: DySpecThresholdBuilder | DySpecBuilder) -> float:
        trees = [builder.build(HashedDraft(256, seed=s, concentration=0.01), 16, s) for s in range(20)]
        return sum(t.parents.count(ROOT) for t in trees) / sum(t.size for t in trees)

    fixed, default, alg1 = (depth_one_share(b) for b in (DySpecThresholdBuilder(threshold=1e-3),
                                                          DySpecThresholdBuilder(), DySpecBuilder()))
    assert fixed > 0.8 and default < 0.6 and alg1 < 0.6, (fixed, default, alg1)


def test_dyspec_batches_layers() -> None:
    draft = HashedDraft(16, seed=3)
    tree = DySpecBuilder().build(draft, 64, 0)
    assert tree.size == 64
    assert draft.calls < tree.size / 2  # rows are fetched for pending positions together
    draft = HashedDraft(16, seed=3)
    tree = DySpecThresholdBuilder(threshold=1e-3).build(draft, 64, 0)
    assert draft.calls == tree.depth()  # one call per layer (the last layer's rows are not needed)


@pytest.mark.parametrize("name", ["fixed", "dynatree", "wetap"])
def test_layer_builders_make_one_draft_call_per_layer(name: str) -> None:
    params = {"fixed": {"width": 3, "draw": "topk"}, "dynatree": {}, "wetap": {"length": 5}}[name]
    draft = HashedDraft(8, seed=1, concentration=0.5)
    tree = make_builder(name, **params).build(draft, 40, 0)
    assert tree.size > 0
    limit = {"fixed": tree.depth(), "dynatree": tree.depth() + 1, "wetap": 5}[name]
    assert draft.calls <= limit


class _DepthDraft:
    """:class:`HashedDraft`'s rows, recording the longest path asked for: the deepest node fed to the draft."""

    def __init__(self) -> None:
        self.inner = HashedDraft(8, seed=1, concentration=0.5)
        self.deepest = 0
        self.fed: set[tuple[int, ...]] = set()  # the nodes asked for (the root's row is the context's)

    @property
    def vocab(self) -> int:
        return self.inner.vocab

    def rows(self, paths: list[tuple[int, ...]]) -> np.ndarray:
        self.deepest = max([self.deepest, *map(len, paths)])
        self.fed.update(tuple(p) for p in paths if p)
        return self.inner.rows(paths)


@pytest.mark.parametrize("name", list(BUILDERS))
def test_within_depth_feeds_the_draft_no_deeper(name: str) -> None:
    """``builder.within(d)`` built with a budget of at most ``d`` asks the draft for no node more than ``d`` deep
    (an LLM decode cuts its last steps so before a learned position table's end).  WETAP's ``L`` layers fed the
    draft nodes ``L - 1`` deep whatever the budget; a GPT-2 draft then failed with an ``IndexError`` (found
    2026-11-27), so it gives a variant of at most ``d + 1`` layers; every other builder is itself."""
    params = {"wetap": {"w_min": 2, "w_max": 4}, "dynatree": {"base_depth": 6, "max_depth": 8}}.get(name, {})
    builder = make_builder(name, **params)
    for depth in range(1, 7):
        for budget in range(1, depth + 1):
            draft = _DepthDraft()
            tree = builder.within(depth).build(draft, budget, np.random.default_rng(budget))
            assert draft.deepest <= depth and tree.depth() <= budget, (depth, budget)
        assert (builder.within(depth) is builder) == (name != "wetap" or depth >= 7)
    draft = _DepthDraft()
    builder.build(draft, 2, np.random.default_rng(0))
    assert draft.deepest == 7 if name == "wetap" else draft.deepest <= 1  # L = 8 layers: nodes of the first 7 fed
    with pytest.raises(ValueError, match="depth must be >= 1, got 0"):
        builder.within(0)


@pytest.mark.parametrize("name", list(BUILDERS))
def test_draft_nodes_bounds_the_nodes_a_tree_feeds_the_draft(name: str) -> None:
    """``draft_nodes(budget, vocab)``: no tree feeds the draft more nodes (an LLM decode sizes the draft's static
    cache by it); the budget for every builder but WETAP, whose unpruned layers are fed too, and which reaches
    its bound here (widths 2, 5, 5 on 8 tokens)."""
    params = {"wetap": {"w_min": 2, "w_max": 5, "length": 4}, "dynatree": {"base_depth": 6, "max_depth": 8}}.get(
        name, {})
    builder = make_builder(name, **params)
    for budget in (1, 3, 6):
        for seed in range(3):
            draft = _DepthDraft()
            builder.build(draft, budget, np.random.default_rng(seed))
            assert len(draft.fed) <= builder.draft_nodes(budget, 8), (budget, seed)
        if name != "wetap":
            assert builder.draft_nodes(budget, 8) == budget
    if name == "wetap":
        assert [builder.draft_nodes(3, v) for v in (1, 2, 3, 8)] == [1 + 1 + 1, 2 + 4 + 5, 2 + 5 + 5, 2 + 5 + 5]
        assert builder.draft_nodes(3, 8) == 12 and len(draft.fed) == 12  # layers 1-3 of widths 2, 5, 5
    for bad, match in (((0, 8), "budget must be >= 1"), ((3, 0), "vocab must be >= 1")):
        with pytest.raises(ValueError, match=match):
            builder.draft_nodes(*bad)


def test_wetap_within_depth_keeps_its_other_parameters() -> None:
    b = WetapBuilder(length=8, w_min=3, w_max=5, gamma=2.0, alpha=0.3)
    assert b.within(3) == WetapBuilder(length=4, w_min=3, w_max=5, gamma=2.0, alpha=0.3)
    assert b.within(7) is b


def test_dynatree_rules_by_hand() -> None:
    """Confidence bands and depth gating on a model with fixed rows (0.7, 0.2, 0.1).

    root_top1: node 0 = token 0 (p = 0.7).  c = 0.7 is in [τ_ℓ, τ_h) -> B_mid = 2
    children per expanded node.  Depth 1 (< D_0 = 2): node 0 expanded -> (0, 1)
    with p 0.49, 0.14.  Depth 2 >= D_0: expanded only if p >= ρ_deep = 0.3 -> only
    path (0, 0), children p 0.343, 0.098.  Depth 3 = D_max: stop.  Then leaves
    below τ = 0.1 are pruned: (0, 0, 1) with 0.098.
    """
    row = np.array([0.7, 0.2, 0.1])
    m = ToyModel(3, {}, {}, row, row)
    b = DynaTreeBuilder(base_depth=2, max_depth=3, rho_stop=0.05, rho_deep=0.3, prune=0.1)
    tree = b.build(ToyDraft(m), 50)
    paths = sorted(tree.paths()[1:])
    assert paths == [(0,), (0, 0), (0, 0, 0), (0, 1)]
    assert set(tree.draws) == {Draw.TOPK}


def test_dynatree_breadth_bands() -> None:
    b = DynaTreeBuilder()
    st = b.initial_state()
    assert [b._breadth(c, st) for c in (0.95, 0.9, 0.5, 0.4, 0.39)] == [1, 1, 2, 2, 3]


def test_dynatree_history_update_by_hand() -> None:
    b = DynaTreeBuilder(window=2, target_acceptance=0.25, eta_depth=4.0, eta_conf=0.5)
    tree = DraftTree((-1, 0, 1, 2), (0, 0, 0, 0), ("topk",) * 4, {}, 2)  # type: ignore[arg-type]
    s1 = b.next_state(b.initial_state(), tree, 3)  # a = 0.75, mean 0.75, err 0.5
    assert s1 == DynaTreeState(7.0, 0.65, (0.75,))  # D_0 = 5 + 2 = 7 (max_depth - 1 = 7); τ_h = 0.9 - 0.25
    s2 = b.next_state(s1, tree, 0)  # window (0.75, 0): mean 0.375, err 0.125
    assert s2.history == (0.75, 0.0)
    assert math.isclose(s2.base_depth, 7.0) and math.isclose(s2.tau_high, 0.65 - 0.0625)
    s3 = b.next_state(s2, tree, 0)  # window (0, 0): err -0.25 -> D_0 6, τ_h 0.7125
    assert math.isclose(s3.base_depth, 6.0) and math.isclose(s3.tau_high, 0.5875 + 0.125)
    for _ in range(20):
        s3 = b.next_state(s3, tree, 0)
    assert s3.base_depth == 1.0 and s3.tau_high == 1.0  # clipped
    assert DynaTreeBuilder(adapt=False).next_state(b.initial_state(), tree, 4) == b.initial_state()


def test_wetap_width_formula() -> None:
    b = WetapBuilder(w_min=16, w_max=128, gamma=1.2)
    assert b.next_width([0.25] * 4) == 128  # uniform layer: H_norm = 1
    assert b.next_width([0.5]) == 16  # one token: H_norm = 0
    h = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25)) / math.log(2)
    assert b.next_width([0.3, 0.1]) == round(16 + 112 * h**1.2)


def test_wetap_prunes_to_budget_with_parent_repair() -> None:
    draft = HashedDraft(6, seed=4, concentration=0.4)
    for budget in (3, 8, 20):
        tree = WetapBuilder(length=4, w_min=3, w_max=6).build(draft, budget)
        assert tree.size == budget  # the scratch tree is larger than every budget here
        for node in range(tree.size):  # siblings by decreasing draft probability
            kids = tree.children(node)
            probs = [tree.q_rows[node][tree.tokens[k]] for k in kids]
            assert probs == sorted(probs, reverse=True)


def test_wetap_keeps_deep_tokens_when_alpha_is_small() -> None:
    draft = HashedDraft(6, seed=4, concentration=0.4)
    deep = WetapBuilder(length=4, w_min=3, w_max=6, alpha=0.0).build(draft, 8)
    shallow = WetapBuilder(length=4, w_min=3, w_max=6, alpha=1.0).build(draft, 8)
    assert deep.depth() == 4  # score = depth only: the deepest layer is kept, with its parents
    assert shallow.depth() <= deep.depth()


def test_temperature_zero_draft_gives_a_greedy_chain() -> None:
    """A one-hot draft (temperature 0): sampling builders can only draw the argmax."""
    onehot = np.array([0.0, 1.0, 0.0])
    m = ToyModel(3, {}, {}, onehot, np.array([0.2, 0.5, 0.3]))
    for name in ("chain", "dyspec", "dyspec-threshold", "fixed"):
        drafts = builder_drafts(m, make_builder(name, **SMALL[name]), 3)
        assert len(drafts) == 1
        assert set(drafts[0].tree.tokens) == {1}


def test_vocabulary_of_one() -> None:
    m = ToyModel(1, {}, {}, np.array([1.0]), np.array([1.0]))
    for name in BUILDERS:
        tree = make_builder(name, **SMALL[name]).build(ToyDraft(m), 3)
        assert set(tree.tokens) <= {0} and tree.size >= 1


def test_builders_never_propose_zero_probability_tokens() -> None:
    for name in BUILDERS:
        for m in models(4, range(3)):  # rows with exact zeros
            for d in builder_drafts(m, make_builder(name, **SMALL[name]), 4):
                for node in range(d.tree.size):
                    par = d.tree.parents[node]
                    path = d.tree.path(par)
                    assert m.q(path)[d.tree.tokens[node]] > 0.0


class _BadDraft:
    def __init__(self, row: object, vocab: int = 3) -> None:
        self.row, self.vocab = row, vocab

    def rows(self, paths: object) -> object:
        return np.array([self.row] * len(paths))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ([0.5, float("nan"), 0.5], "NaN|finite"),
        ([0.5, -0.1, 0.6], "negative"),
        ([0.5, 0.2, 0.2], "sum"),
        ([0.5, 0.5], "shape"),
        ([True, False, False], "draft rows must hold real numbers, got dtype bool"),  # was read as [1, 0, 0]
        (["0.5", "0.5", "0"], "draft rows must hold real numbers"),  # text was parsed as numbers
        ([0.5, 0.5j, 0.0], "draft rows has complex entries"),  # imaginary parts were dropped, with a warning
    ],
)
def test_bad_draft_rows_are_refused(row: list[float], message: str) -> None:
    for name in BUILDERS:
        with pytest.raises(ValueError, match=message):
            make_builder(name).build(_BadDraft(row), 4)  # type: ignore[arg-type]


def test_draft_rows_checks_the_vocabulary_and_the_paths() -> None:
    """``draft_rows`` on its own: a vocabulary of -1 had failed in numpy ("negative dimensions"), 2.5 had been
    taken, and ``paths=None`` had returned an empty array."""
    from spec.draft import draft_rows

    for vocab, message in ((-1, "draft.vocab must be >= 1"), (2.5, "draft.vocab must be an integer"),
                           ("x", "draft.vocab must be an integer"), (True, "draft.vocab must be an integer")):
        for paths in ([], [()]):
            with pytest.raises(ValueError, match=message):
                draft_rows(_BadDraft([1.0], vocab), paths)  # type: ignore[arg-type]
    for paths in (None, "ab"):
        with pytest.raises(ValueError, match="paths must be a sequence of token paths"):
            draft_rows(_BadDraft([0.5, 0.5, 0.0]), paths)  # type: ignore[arg-type]
    assert draft_rows(_BadDraft([0.5, 0.5, 0.0]), []).shape == (0, 3)


def test_draft_rows_reads_the_paths_before_calling_the_draft() -> None:
    """A generator of paths had failed with ``TypeError`` after the draft was called, a 2-D array of paths with
    numpy's "truth value is ambiguous", an int among the paths with ``TypeError``: now a ``ValueError`` naming
    ``paths`` or ``paths[i]`` before any draft call, and an array of paths is read as its rows."""
    from spec.draft import draft_rows

    class Counting(HashedDraft):
        calls = 0

        def rows(self, paths):  # type: ignore[no-untyped-def]
            Counting.calls += 1
            assert all(isinstance(p, tuple) and all(type(t) is int for t in p) for p in paths)
            return super().rows(paths)

    draft = Counting(5, seed=2)
    for paths, message in (((p for p in [(0,), (1,)]), "paths must be a sequence of token paths, got generator"),
                           ([(0,), 5], r"paths\[1\] must be a sequence of token ids, got int"),
                           ([(0,), "ab"], r"paths\[1\] must be a sequence of token ids, got str"),
                           ([(0, 1.5)], r"paths\[0\] must hold integer token ids"),
                           ([(True,)], r"paths\[0\] must hold integer token ids")):
        with pytest.raises(ValueError, match=message):
            draft_rows(draft, paths)  # type: ignore[arg-type]
    assert Counting.calls == 0
    as_array = draft_rows(draft, np.array([[0, 1], [2, 3]]))  # type: ignore[arg-type]
    np.testing.assert_array_equal(as_array, draft_rows(draft, [(0, 1), (2, 3)]))


def test_wetap_refuses_a_scratch_tree_past_its_limit() -> None:
    """An unbounded ``w_max`` (``10**9``) on a vocabulary of 8 built layers of up to 8^t nodes, 19 M in all,
    and ended in a ``MemoryError``; now a ``ValueError`` before the first draft call.  The paper's widest
    setting (912 nodes at most) and a vocabulary that keeps the layers small still build."""
    from spec.builders.wetap import MAX_SCRATCH_NODES, WetapBuilder

    with pytest.raises(ValueError, match=r"could hold 19,173,960 nodes on a vocabulary of 8 .* lower w_max or length"):
        WetapBuilder(w_max=10**9).build(HashedDraft(8, seed=1), 6)
    assert WetapBuilder().build(HashedDraft(4096, seed=1), 6).size == 6
    assert WetapBuilder(length=3, w_max=10**9).build(HashedDraft(3, seed=1), 6).size == 6  # 3 + 9 + 27 nodes
    assert WetapBuilder(w_max=128)._layer_bound(10**6, 8) == 16 + 7 * 128 < MAX_SCRATCH_NODES


@pytest.mark.parametrize(
    ("name", "params", "message"),
    [
        ("nope", {}, "unknown builder"),
        ("chain", {"draw": "swor"}, "draw must be one of"),
        ("fixed", {"width": 0}, "width"),
        ("fixed", {"colour": 1}, "unexpected keyword"),
        ("dyspec-threshold", {"threshold": 0}, "threshold"),
        ("dynatree", {"tau_low": 0.9, "tau_high": 0.4}, "tau_low < tau_high"),
        ("dynatree", {"rho_stop": 0.5, "rho_deep": 0.1}, "rho_stop < rho_deep"),
        ("dynatree", {"b_min": 3, "b_max": 1}, "b_min <= b_mid <= b_max"),
        ("dynatree", {"base_depth": 9}, "base_depth"),
        ("dynatree", {"adapt": "maybe"}, "adapt must be true or false, got 'maybe'"),
        ("dynatree", {"root_top1": 1}, "root_top1 must be true or false"),
        ("wetap", {"w_min": 9, "w_max": 4}, "w_min <= w_max"),
        ("wetap", {"alpha": 1.5}, "alpha"),
        ("wetap", {"gamma": -1}, "gamma"),
        ("wetap", {"gamma": None}, "gamma must be a number, got None"),
        ("wetap", {"eps": "tiny"}, "eps must be a number, got 'tiny'"),
        ("dynatree", {"eta_depth": None}, "eta_depth must be a number, got None"),
        ("dynatree", {"eta_conf": -0.5}, "eta_conf must be a finite number >= 0"),
        ("dynatree", {"rho_stop": [0.01]}, "rho_stop must be a number"),
        ("dyspec-threshold", {"threshold": True}, "threshold must be a number, got True"),
        ("chain", {"confidence": True}, "confidence must be a number, got True"),
    ],
)
def test_bad_parameters(name: str, params: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_builder(name, **params)


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("wetap", {"length": 3, "w_min": 2, "w_max": 4}),
        ("dynatree", {"b_max": 2, "b_mid": 2, "window": 2, "max_depth": 4, "base_depth": 2}),
        ("fixed", {"width": 2}),
        ("dyspec", {"max_depth": 2}),
    ],
)
def test_integral_float_parameters_build_the_same_trees(name: str, params: dict[str, int]) -> None:
    """``--param length=3.0`` reaches a builder as a float: it is taken as the integer (check_int's rule) and
    kept as one, so the builder grows the trees of the integer value (WETAP and DynaTree kept the raw float
    and failed with a TypeError in the first build)."""
    m = models(5, range(3, 4), concentration=0.5)[0]
    as_int, as_float = make_builder(name, **params), make_builder(name, **{k: float(v) for k, v in params.items()})
    assert as_int == as_float
    state_i, state_f = as_int.initial_state(), as_float.initial_state()
    for seed in range(3):
        a, b = as_int.build(ToyDraft(m), 6, seed, state_i), as_float.build(ToyDraft(m), 6, seed, state_f)
        assert (a.parents, a.tokens) == (b.parents, b.tokens)
        state_i, state_f = as_int.next_state(state_i, a, 1), as_float.next_state(state_f, b, 1)
    assert state_i == state_f


def test_number_parameters_given_as_text_are_kept_as_numbers() -> None:
    """Text a command line gives (``"0.01"``) is parsed and kept as the number: DynaTree kept the text and
    failed comparing it in its first build."""
    b = make_builder("dynatree", rho_stop="0.01", eta_depth="2")
    assert (b.rho_stop, b.eta_depth) == (0.01, 2.0)
    m = models(3, range(1))[0]
    assert b.build(ToyDraft(m), 4, 0).size >= 1


def test_dynatree_refuses_more_accepted_tokens_than_nodes() -> None:
    """The acceptance statistic is accepted / nodes, in [0, 1] (DynaTree §3.3)."""
    m, b = models(3, range(1))[0], make_builder("dynatree")
    tree = b.build(ToyDraft(m), 2, 0)
    assert b.next_state(b.initial_state(), tree, tree.size).history == (1.0,)
    with pytest.raises(ValueError, match="exceeds the tree's"):
        b.next_state(b.initial_state(), tree, tree.size + 1)


def _flat_model(vocab: int = 300) -> ToyModel:
    """A flat draft (every row the same): top-1 token 0 with q = 0.0043, below DynaTree's τ = 0.005."""
    q = np.full(vocab, 1.0 / vocab)
    q[0] += 0.001
    q /= q.sum()
    return ToyModel(vocab, {}, {}, q, q)


def test_dynatree_keeps_the_root_token_u0_under_a_flat_draft() -> None:
    """Regression (audit D1): App. D Alg. 1 line 10 starts the tree from the top-1 token u0 and never removes it
    (lines 14-15 only skip expanding a node with p < τ); the §3.3 leaf pruning then dropped u0 itself, and a
    budget of 16 gave an empty tree that next_state could not learn from."""
    m = _flat_model()
    for b in (DynaTreeBuilder(), DynaTreeBuilder(rho_stop=0.001, prune=0.005)):  # u0: p < τ, so not expanded
        tree = b.build(ToyDraft(m), 16, 0)
        assert (tree.parents, tree.tokens, tree.draws) == ((ROOT,), (0,), (Draw.TOPK,))
        st = b.next_state(b.initial_state(), tree, 0)  # the step is seen: a = 0 enters the window
        assert st.history == (0.0,) and st.base_depth < b.base_depth and st.tau_high > b.tau_high
    # τ below p(u0) and its children's p = 0.0043 · 0.0033: u0 gets B_max = 3 children (c(u0) < τ_ℓ), kept
    expanded = DynaTreeBuilder(rho_stop=1e-4, prune=1e-5).build(ToyDraft(m), 16, 0)
    assert (expanded.parents, expanded.tokens) == ((ROOT, 0, 0, 0), (0, 0, 1, 2))
    # §3.3's own tree is rooted at the prefix: there every drafted node is a leaf the rule may prune
    assert DynaTreeBuilder(root_top1=False).build(ToyDraft(m), 16, 0).size == 0


@pytest.mark.parametrize("concentration", [0.05, 1.0, 5.0])
def test_dynatree_prunes_every_low_leaf_but_u0(concentration: float) -> None:
    """On drafts from peaked to flat (V = 1000; at concentration 5 the top-1 q is below τ), node 0 is the root's
    top-1 token and every other leaf has p(u) >= τ, the product of q along its path (§3.3, App. D)."""
    b = DynaTreeBuilder()
    for seed in range(4):
        draft = HashedDraft(1000, seed=seed, concentration=concentration)
        tree = b.build(draft, 16, 0)
        assert tree.size >= 1 and tree.parents[0] == ROOT
        root_row = draft.rows([()])[0]
        assert tree.tokens[0] == int(np.argmax(root_row))
        paths = tree.paths()[1:]
        rows = draft.rows([path[:-1] for path in paths])
        prob = [math.prod(float(draft.rows([path[:k]])[0][path[k]]) for k in range(len(path))) for path in paths]
        assert all(float(rows[i][path[-1]]) > 0.0 for i, path in enumerate(paths))
        has_kids = set(tree.parents)
        assert all(i == 0 or i in has_kids or prob[i] >= b.prune for i in range(tree.size))


@pytest.mark.parametrize("bad", [{"base_depth": 1.0, "tau_high": 0.45}, "garbage", (1.0, 0.45), 0, []])
def test_dynatree_refuses_a_state_of_another_type(bad: object) -> None:
    """Regression (audit D2): a state that is not a DynaTreeState (a dict read back from JSON) was replaced by the
    initial state without a word: build grew the step-0 tree and next_state restarted the history."""
    m, b = models(3, range(1))[0], DynaTreeBuilder()
    tree = b.build(ToyDraft(m), 4, 0)
    with pytest.raises(ValueError, match="state must be a DynaTreeState"):
        b.build(ToyDraft(m), 4, 0, state=bad)
    with pytest.raises(ValueError, match="state must be a DynaTreeState"):
        b.next_state(bad, tree, 1)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ((-5.0, 7.0), "base_depth must be a finite number > 0"),
        ((0.5, 0.9), "base_depth must be >= 1"),
        ((math.nan, 0.9), "base_depth must be a finite number"),
        (("deep", 0.9), "base_depth must be a number"),
        ((5.0, 7.0), "tau_high must be in \\[0, 1\\]"),
        ((5.0, True), "tau_high must be a number, got True"),
        ((5.0, 0.9, (0.5, 1.5)), "history\\[1\\] must be in \\[0, 1\\]"),
        ((5.0, 0.9, "ab"), "history must be a tuple"),
    ],
)
def test_dynatree_state_refuses_bad_fields(fields: tuple[object, ...], message: str) -> None:
    """Regression (audit D2): DynaTreeState(base_depth=-5, tau_high=7) was taken and used as given."""
    with pytest.raises(ValueError, match=message):
        DynaTreeState(*fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("state", "message"),
    [
        (DynaTreeState(7.5, 0.9), "state.base_depth must be in \\[1, max_depth - 1\\] = \\[1, 7\\]"),
        (DynaTreeState(5.0, 0.3), "state.tau_high must be in \\[tau_low, 1\\] = \\[0.4, 1\\]"),
        (DynaTreeState(5.0, 0.9, (0.5,) * 6), "state.history holds 6 statistics, more than window = 5"),
    ],
)
def test_dynatree_refuses_a_state_outside_its_ranges(state: DynaTreeState, message: str) -> None:
    """A state no step of this builder can reach (D_0 in [1, D_max - 1], τ_h in [τ_ℓ, 1], at most W statistics)
    is refused by build and next_state, not used as given."""
    m, b = models(3, range(1))[0], DynaTreeBuilder()
    tree = b.build(ToyDraft(m), 4, 0)
    with pytest.raises(ValueError, match=message):
        b.build(ToyDraft(m), 4, 0, state=state)
    with pytest.raises(ValueError, match=message):
        b.next_state(state, tree, 1)


@pytest.mark.parametrize(
    "params",
    [
        {},
        {"eta_depth": 40.0, "eta_conf": 5.0, "window": 1},  # big steps: every clip bound is reached
        {"max_depth": 2, "base_depth": 1, "tau_low": 0.1, "tau_high": 0.2, "window": 3, "target_acceptance": 0.9},
        {"adapt": False},
    ],
)
def test_dynatree_accepts_every_state_its_adaptation_reaches(params: dict[str, object]) -> None:
    """200 steps of next_state with accepted counts from none to all: every state is taken by build and by
    next_state (the checks of audit D2 refuse none), and the clip bounds themselves are reached."""
    b = DynaTreeBuilder(**params)  # type: ignore[arg-type]
    m = models(4, range(1), concentration=0.5)[0]
    rng = np.random.default_rng(7)
    state, seen = b.initial_state(), set()
    assert b.next_state(None, b.build(ToyDraft(m), 6, 0), 0) == b.next_state(state, b.build(ToyDraft(m), 6, 0), 0)
    for step in range(200):
        tree = b.build(ToyDraft(m), 6, 0, state=state)
        assert tree.size >= 1
        high = step % 40 < 20  # runs of all-accepted, then of none, so both ends of each clip are hit
        accepted = tree.size if high else int(rng.integers(0, 1 + tree.size // 4))
        state = b.next_state(state, tree, accepted)
        assert isinstance(state, DynaTreeState) and len(state.history) <= b.window
        seen.add((state.base_depth, state.tau_high))
    if b.adapt and b.eta_depth >= 40:
        depths, taus = {d for d, _ in seen}, {t for _, t in seen}
        assert {1.0, float(b.max_depth - 1)} <= depths and {b.tau_low, 1.0} <= taus


def test_dynatree_state_fields_are_kept_as_floats_and_a_tuple() -> None:
    """A state is compared and hashed (spec.acceptance keys its branches by it): ints and a list are normalised."""
    assert DynaTreeState(5, 1, [0, 1]) == DynaTreeState(5.0, 1.0, (0.0, 1.0))
    assert hash(DynaTreeState(5, 1, [0, 1])) == hash(DynaTreeState(5.0, 1.0, (0.0, 1.0)))
    assert type(DynaTreeState(5, 1).base_depth) is float


def test_bad_budget_and_rng() -> None:
    m = models(3, range(1))[0]
    for bad in (0, -1, 1.5, "4"):
        with pytest.raises(ValueError, match="budget"):
            ChainBuilder().build(ToyDraft(m), bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        ChainBuilder().build(ToyDraft(m), 2, -3)


def test_enumeration_cap() -> None:
    m = models(4, range(1))[0]
    with pytest.raises(TooManyRuns):
        builder_drafts(m, DySpecBuilder(), 8, max_runs=50)


def test_estimate_runs_is_exact_on_a_tree_of_fixed_widths() -> None:
    """Two draws of three possible tokens each: every probe sees 1 + 3 + 9 = 13 nodes, the runs
    :func:`enumerate_runs` makes (one per branching point, one per complete sequence)."""
    from spec.randomness import estimate_runs

    def run(s):
        return (s.draw(np.array([0.2, 0.0, 0.3, 0.5])), s.draw(np.array([0.1, 0.1, 0.8])))

    calls = []
    enumerate_runs(lambda s: (calls.append(1), run(s))[1])
    assert len(calls) == 13 and estimate_runs(run, probes=5) == 13.0
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="probes"):
            estimate_runs(run, probes=bad)


def test_estimate_runs_mean_is_the_number_of_runs() -> None:
    """A draw of two tokens, then three more draws' worth only after token 0: the enumeration makes
    1 + 2 + 3 = 6 runs; a probe counts 1 + 2 + 6 = 9 or 1 + 2 = 3 with equal chance (mean 6, standard
    deviation 3).  Over 4000 probes the mean's standard error is 0.047: the 0.3 tolerance is 6.3 of
    them (false-fail rate ~3e-10 for a fresh seed; the seed is fixed) and a bias of 0.5 is caught."""
    from spec.randomness import estimate_runs

    def run(s):
        first = s.draw(np.array([0.5, 0.5]))
        return (first, s.draw(np.ones(3) / 3)) if first == 0 else (first,)

    calls = []
    enumerate_runs(lambda s: (calls.append(1), run(s))[1])
    assert len(calls) == 6
    assert abs(estimate_runs(run, probes=4000, rng=1) - 6.0) < 0.3


def test_scripted_sampler_weight() -> None:
    s = ScriptedSampler((1, 0))
    assert s.draw(np.array([0.2, 0.6])) == 1  # unnormalised laws are normalised
    assert s.draw(np.array([0.5, 0.5])) == 0
    assert math.isclose(s.weight, 0.75 * 0.5)


def test_samplers_and_the_enumeration_refuse_laws_they_cannot_draw_from() -> None:
    """Laws a builder should never pass, each a named ``ValueError``: an all-zero or NaN law had been an
    ``AssertionError`` (gone under ``python -O``), an empty one an ``IndexError``, a script token past the law
    an ``IndexError``; ``enumerate_runs`` had silently dropped the branch of an all-zero law (probabilities
    summing to 0.5) and weighed a negative entry's; ``estimate_runs`` failed inside numpy."""
    from spec.randomness import RngSampler, TooManyRuns, estimate_runs

    rng = RngSampler(np.random.default_rng(0))
    for law, message in ((np.zeros(3), "finite positive total weight, got 0.0"),
                         (np.array([0.5, np.nan]), "finite positive total weight, got nan"),
                         (np.array([1.0, np.inf]), "got inf"), (np.zeros(0), "non-empty 1-D"),
                         (np.ones((2, 2)), "non-empty 1-D"), ([0.2, 0.8], "numpy array, got list")):
        with pytest.raises(ValueError, match=message):
            rng.draw(law)  # type: ignore[arg-type]
    for tok in (5, 2, -1):  # 2: one past the last token (not an IndexError); -1: not a wrap to the last one
        scripted = ScriptedSampler((tok,))
        with pytest.raises(ValueError, match=f"script.0. = {tok} is outside a law of 2 tokens"):
            scripted.draw(np.array([0.5, 0.5]))
        assert scripted.draws == [] and scripted.weight == 1.0
    for bad in (np.zeros(2), np.array([np.nan, 1.0])):
        with pytest.raises(ValueError, match="finite positive sum"):
            ScriptedSampler((0,)).draw(bad)

    def run(bad: np.ndarray):
        def go(s):
            first = s.draw(np.array([0.5, 0.5]))
            return (first, s.draw(bad)) if first == 1 else (first,)
        return go

    for bad, message in ((np.zeros(2), "finite positive sum"), (np.array([0.5, -0.2, 0.7]), "negative entry")):
        with pytest.raises(ValueError, match=message):
            enumerate_runs(run(bad))
    with pytest.raises(ValueError, match="no token of positive probability"):
        estimate_runs(run(np.zeros(2)), probes=50, rng=0)
    good = enumerate_runs(run(np.array([0.25, 0.75])))
    assert math.isclose(sum(w for _, w, _ in good), 1.0) and len(good) == 3
    with pytest.raises(ValueError, match="max_runs must be >= 1"):
        enumerate_runs(run(np.array([0.25, 0.75])), max_runs=0)
    with pytest.raises(TooManyRuns):
        enumerate_runs(run(np.array([0.25, 0.75])), max_runs=2)


def test_as_sampler_takes_only_a_callable_draw() -> None:
    """An object whose ``draw`` is not callable is no sampler: refused at once (it had failed at the first
    draw with a ``TypeError``)."""
    from spec.randomness import RngSampler, as_sampler

    class NotASampler:
        draw = 5

    with pytest.raises(ValueError, match="rng must be a numpy.random.Generator or an integer seed, got NotASampler"):
        as_sampler(NotASampler())  # type: ignore[arg-type]
    scripted = ScriptedSampler((0,))
    assert as_sampler(scripted) is scripted and isinstance(as_sampler(3), RngSampler)


def _top_tokens_by_full_sort(row: np.ndarray, k: int) -> list[int]:
    """The definition: sort the whole support by decreasing q, ties by id, and take ``k``."""
    positive = np.flatnonzero(row > 0.0)
    return [int(t) for t in positive[np.lexsort((positive, -row[positive]))][:k]]


def test_top_tokens_equals_the_full_sort() -> None:
    """:func:`spec.builders.base.top_tokens` partitions before it sorts; the tokens are the full sort's,
    ties at the k-th value and exact zeros included."""
    from spec.builders.base import top_tokens

    rng = np.random.default_rng(11)
    cases = 0
    for vocab in (1, 2, 3, 7, 40, 4096):
        for _ in range(60 if vocab < 4096 else 20):
            kind = int(rng.integers(4))
            if kind == 0:  # continuous: no ties
                row = rng.dirichlet(np.ones(vocab))
            elif kind == 1:  # coarse: many ties, some at the k-th value
                row = rng.integers(0, 4, size=vocab).astype(float)
            elif kind == 2:  # a few equal values and zeros
                row = np.where(rng.random(vocab) < 0.5, 0.0, 1.0 / vocab)
            else:  # a top-k-filtered row: exact zeros outside a small support
                row = np.zeros(vocab)
                row[rng.choice(vocab, size=min(vocab, 3), replace=False)] = rng.random(min(vocab, 3))
            if not row.any():
                row[int(rng.integers(vocab))] = 1.0
            for k in sorted({1, 2, 3, vocab - 1, vocab, vocab + 2, int(rng.integers(1, vocab + 1))} - {0}):
                assert top_tokens(row, k) == _top_tokens_by_full_sort(row, k), (vocab, kind, k)
                cases += 1
    assert cases > 1500


@pytest.mark.parametrize("width", [1, 2, 3])
@pytest.mark.parametrize("depth", [None, 1, 2, 4])
def test_fixed_full_shape_is_the_shape_build_grows(width: int, depth: int | None) -> None:
    """``FixedBuilder.full_shape`` (the device path's shape, known before any draw) equals the parents of
    the trees ``build`` grows with ``draw="iid"``, whatever the rows and the draws, and with ``topk`` and
    ``swor`` on rows with full support; on a row with fewer than ``width`` tokens with ``q > 0`` the
    ``topk`` tree differs (the device path's ``short`` case)."""
    for draw in ("iid", "topk", "swor"):
        b = FixedBuilder(width=width, depth=depth, draw=draw)
        for budget in range(1, 22):
            for seed in range(3):
                tree = b.build(HashedDraft(5, seed=seed, concentration=0.2), budget, np.random.default_rng(seed))
                assert b.full_shape(budget) == tree.parents, (draw, budget, seed)
        with pytest.raises(ValueError, match="budget"):
            b.full_shape(0)
    if width > 1:
        onehot = np.array([1.0, 0.0, 0.0, 0.0, 0.0])
        short = ToyDraft(ToyModel(5, {}, {}, onehot, onehot))  # one token with q > 0 everywhere
        tree = FixedBuilder(width=width, depth=depth, draw="topk").build(short, 6, 0)
        assert tree.parents != FixedBuilder(width=width, depth=depth).full_shape(6)


@pytest.mark.parametrize(("k", "match"), [(0, "k must be >= 1"), (-1, "k must be >= 1"), (1.5, "k must be an integer"),
                                          (True, "k must be an integer")])
def test_top_tokens_refuses_a_k_below_one(k, match) -> None:
    """``order[:k]`` with ``k = -1`` gave all tokens but the last ([0, 1] of three), not an error."""
    from spec.builders.base import top_tokens

    with pytest.raises(ValueError, match=match):
        top_tokens(np.array([0.5, 0.3, 0.2]), k)


def test_hashed_draft_rows_differ_from_prefix_to_prefix() -> None:
    """numpy pads a short seed with zero words, so ``(seed, *path)`` gave a path and the path followed by
    token 0 one row (108 distinct rows of 121 paths), and seed 2**32 at () the row of seed 0 at (1,)."""
    import itertools

    paths = [()] + [p for n in range(1, 5) for p in itertools.product(range(3), repeat=n)]
    rows = HashedDraft(7, seed=0).rows(paths)
    assert len({r.tobytes() for r in rows}) == len(paths) == 121
    assert not np.array_equal(HashedDraft(7, seed=2**32).rows([()]), HashedDraft(7, seed=0).rows([(1,)]))
    assert np.array_equal(HashedDraft(7, seed=5).rows([(2, 0)]), HashedDraft(7, seed=5).rows([(2, 0)]))
    assert np.array_equal(HashedDraft(7).rows([(np.int64(2), 1.0)]), HashedDraft(7).rows([(2, 1)]))
    for path, message in (((1.7,), r"paths\[0\]\[0\] must be an integer"), ((-1,), r"paths\[0\]\[0\] must be >= 0"),
                          ((2, 7), r"paths\[0\] = \(2, 7\) holds a token outside \[0, 7\)")):
        with pytest.raises(ValueError, match=message):  # 1.7 had been read as 1
            HashedDraft(7).rows([path])


@pytest.mark.parametrize(("kwargs", "match"), [({"seed": -1}, "seed must be >= 0"), ({"seed": 2**64}, "seed must be < 2"),
                                               ({"vocab_size": 0}, "vocab_size must be >= 1"),
                                               ({"concentration": 0.0}, "concentration must be"),
                                               ({"concentration": math.nan}, "concentration must be")])
def test_hashed_draft_refuses_bad_settings(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        HashedDraft(**{"vocab_size": 5, **kwargs})


@pytest.mark.parametrize("name", BUILDER_NAMES)
def test_a_draft_that_is_no_draft_model_is_refused_by_every_builder(name: str) -> None:
    """A ToyModel passed where its ToyDraft belongs, or None, was a bare AttributeError from deep inside."""
    model = ToyModel(3, {}, {}, np.full(3, 1 / 3), np.full(3, 1 / 3))
    builder = make_builder(name)
    with pytest.raises(ValueError, match=r"^draft must be a draft model .*got ToyModel; wrap a tmc.ToyModel as "
                                         r"spec.draft.ToyDraft\(model\)"):
        builder.build(model, 4, 0)
    with pytest.raises(ValueError, match=r"^draft must be a draft model .*got NoneType$"):
        builder.build(None, 4, 0)
    assert builder.build(ToyDraft(model), 4, 0).size >= 1


def test_a_toy_draft_refuses_paths_off_the_vocabulary() -> None:
    """``ToyDraft`` answered a path holding token 5 on V = 3 with the default row."""
    draft = ToyDraft(ToyModel(3, {}, {}, np.full(3, 1 / 3), np.full(3, 1 / 3)))
    for path in [(5,), (-1,), (0, 3)]:
        with pytest.raises(ValueError, match=r"outside the vocabulary \[0, 3\)"):
            draft_rows(draft, [path])


# --- exact trees the builders must give (a mutation audit: each rule below could change unnoticed before) ------


def _dyspec_reference(model: ToyModel, budget: int, *, threshold: float | None = None,
                      max_depth: int | None = None) -> dict[tuple[tuple[int, ...], tuple[int, ...]], float]:
    """DySpec's tree law by enumeration over every draw, written from seed 000's algorithms (not from the
    builder): Alg. 1 (``threshold=None``) expands the position of largest value; Alg. 2 serves a layer's
    positions of value ``>= threshold`` in decreasing value, then the next layer.  Drawing ``y`` at a position
    of value ``v`` (from ``R``, the node's row without its children drawn so far, renormalised) makes the
    next-sibling position, value ``v (1 - R[y])``, and ``y``'s first-child position, value ``v R[y]``, in that
    order; equal values go to the position made first.  ``max_depth`` caps the depth of the tree."""
    law: dict[tuple[tuple[int, ...], tuple[int, ...]], float] = {}

    def record(nodes: list[tuple[int, int]], prob: float) -> None:
        key = (tuple(p for p, _ in nodes), tuple(t for _, t in nodes))
        law[key] = law.get(key, 0.0) + prob

    def path(nodes: list[tuple[int, int]], node: int) -> tuple[int, ...]:
        out: list[int] = []
        while node != ROOT:
            out.append(nodes[node][1])
            node = nodes[node][0]
        return tuple(reversed(out))

    def options(nodes: list[tuple[int, int]], removed: dict[int, tuple[int, ...]], node: int) -> list[tuple[int, float]]:
        row = model.q(path(nodes, node))
        left = [t for t in range(model.vocab) if row[t] > 0.0 and t not in removed.get(node, ())]
        mass = sum(float(row[t]) for t in left)
        return [(t, float(row[t]) / mass) for t in left]

    def draw(nodes, removed, made, position, t, r):  # type: ignore[no-untyped-def]
        v, _, node = position
        kids = nodes + [(node, t)]
        gone = {**removed, node: removed.get(node, ()) + (t,)}
        sibling = [(v * (1.0 - r), made, node)] if v * (1.0 - r) > 0.0 else []
        made += len(sibling)
        child = (v * r, made, len(nodes))
        return kids, gone, made + 1, sibling, child

    def best(positions):  # type: ignore[no-untyped-def]
        return max(positions, key=lambda p: (p[0], -p[1]))

    def alg1(nodes, positions, removed, made, prob):  # type: ignore[no-untyped-def]
        if len(nodes) == budget or not positions:
            return record(nodes, prob)
        pos = best(positions)
        rest = [p for p in positions if p is not pos]
        opts = options(nodes, removed, pos[2])
        if not opts:
            return alg1(nodes, rest, removed, made, prob)
        for t, r in opts:
            kids, gone, m, sibling, child = draw(nodes, removed, made, pos, t, r)
            deep_ok = max_depth is None or len(path(kids, child[2])) < max_depth
            alg1(kids, rest + sibling + ([child] if deep_ok else []), gone, m, prob * r)

    def alg2(nodes, layer, nxt, removed, made, prob, depth):  # type: ignore[no-untyped-def]
        assert threshold is not None
        if len(nodes) == budget:
            return record(nodes, prob)
        if layer and best(layer)[0] >= threshold:
            pos = best(layer)
            rest = [p for p in layer if p is not pos]
            opts = options(nodes, removed, pos[2])
            if not opts:
                return alg2(nodes, rest, nxt, removed, made, prob, depth)
            for t, r in opts:
                kids, gone, m, sibling, child = draw(nodes, removed, made, pos, t, r)
                alg2(kids, rest + sibling, nxt + [child], gone, m, prob * r, depth)
            return None
        if not nxt or (max_depth is not None and depth + 1 >= max_depth):
            return record(nodes, prob)
        return alg2(nodes, nxt, [], removed, made, prob, depth + 1)

    if threshold is None:
        alg1([], [(1.0, 0, ROOT)], {}, 1, 1.0)
    else:
        alg2([], [(1.0, 0, ROOT)], [], {}, 1, 1.0, 0)
    return {k: v for k, v in law.items() if v > 0.0}


def _law_of(model: ToyModel, builder: TreeBuilder, budget: int) -> dict[tuple[tuple[int, ...], tuple[int, ...]], float]:
    return {(d.tree.parents, d.tree.tokens): d.weight for d in builder_drafts(model, builder, budget)}


def _same_law(got: dict[Any, float], want: dict[Any, float]) -> None:
    assert got.keys() == want.keys()
    assert all(math.isclose(got[k], want[k], rel_tol=1e-9, abs_tol=1e-15) for k in want)


@pytest.mark.parametrize("seed", range(3))
def test_dyspec_tree_laws_are_the_algorithms_of_the_paper(seed: int) -> None:
    """Alg. 1 and Alg. 2 against :func:`_dyspec_reference` on random V = 3 drafts (exact zeros included), budgets
    1-5, with and without ``max_depth``: the whole law of trees.  Budget 2 at V = 2 (the hand case) never gives
    a second sibling a child; these do, so the first child's value ``v R[y]`` (not ``v q(y)``) is pinned, and
    the depth cap of both algorithms (not one level more)."""
    model = ToyModel.random(3, 5, seed, zero_prob=0.2)
    for budget in range(1, 6):
        for max_depth in (None, 1, 2):
            _same_law(_law_of(model, DySpecBuilder(max_depth=max_depth), budget),
                      _dyspec_reference(model, budget, max_depth=max_depth))
            for threshold in (None, 0.3):
                want = _dyspec_reference(model, budget, threshold=1.0 / budget if threshold is None else threshold,
                                         max_depth=max_depth)
                _same_law(_law_of(model, DySpecThresholdBuilder(threshold=threshold, max_depth=max_depth), budget),
                          want)
        assert max(len(tree.paths()[-1]) for tree in (d.tree for d in builder_drafts(
            model, DySpecBuilder(max_depth=2), budget))) <= 2


def test_dyspec_values_on_the_threshold_and_ties() -> None:
    """A uniform V = 2 draft gives values exactly 1/2, 1/4 ...: Alg. 2 expands a position whose value equals the
    threshold (``v >= t``), and Alg. 1's equal values go to the position made first (a sibling before the
    child made with it).  By hand, threshold 1/2: the root position (value 1) draws y; its sibling (1/2) draws
    the other token; the next layer's two first-child positions (1/2 each) draw one child each: 4 nodes; at
    threshold 1 only the root position qualifies: one node."""
    half = np.array([0.5, 0.5])
    model = ToyModel(2, {}, {}, half, half)
    for threshold, size in ((0.5, 4), (1.0, 1)):
        law = _law_of(model, DySpecThresholdBuilder(threshold=threshold), 10)
        assert {len(parents) for parents, _ in law} == {size}
        _same_law(law, _dyspec_reference(model, 10, threshold=threshold))
    for budget in range(1, 5):
        _same_law(_law_of(model, DySpecBuilder(), budget), _dyspec_reference(model, budget))
    # Alg. 1, budget 3, by hand: the root position draws y (1/2 each); its sibling (value 1/2, made first) beats
    # y's first child (1/2) and draws the other token; then the first children of the two (1/2 each: 1 x 1/2 and
    # 1/2 x 1): y's, made before, draws the third node
    assert set(_law_of(model, DySpecBuilder(), 3)) == {((-1, -1, 0), (0, 1, 0)), ((-1, -1, 0), (1, 0, 0)),
                                                       ((-1, -1, 0), (0, 1, 1)), ((-1, -1, 0), (1, 0, 1))}
    # uniform V = 4, budget 4: the root's siblings (3/4, 1/2) draw two more tokens; then four positions of 1/4:
    # the first child of the first token is the one made first (the root's fourth sibling is made last)
    quarter = ToyModel(4, {}, {}, np.full(4, 0.25), np.full(4, 0.25))
    law = _law_of(quarter, DySpecBuilder(), 4)
    assert {parents for parents, _ in law} == {(-1, -1, -1, 0)}
    _same_law(law, _dyspec_reference(quarter, 4))


def test_dynatree_rules_on_their_boundaries() -> None:
    """§3.3's rules read on exact dyadic probabilities, rows (1/2, 1/4, 1/4) everywhere, B_mid = 2 children
    (c = 1/2), D_max = 3:

    * no pruning, the depth gate alone (D_0 = 2, ρ_deep = 0.3): node (0) at depth 1 < D_0 expands to (0, 0)
      p = 1/4 and (0, 1) p = 1/8; at depth 2 = D_0 only p >= ρ_deep expands, and neither does: 3 nodes.
      With ρ_deep = 1/4, (0, 0) (p = 1/4 >= 1/4) expands: + (0, 0, 0) 1/8, (0, 0, 1) 1/16.
    * ρ_stop = 1/4 with D_max = 4 and D_0 = 3 (no depth-2 node is gated by ρ_deep): (0, 0) has p = 1/4 >=
      ρ_stop and expands; (0, 1) (1/8) does not, nor the depth-3 nodes (1/8, 1/16).
    * prune τ = 1/8 there: the leaves of p = 1/8 stay ("p < τ" is pruned), (0, 0, 1) at 1/16 goes.
    """
    row = np.array([0.5, 0.25, 0.25])
    draft = ToyDraft(ToyModel(3, {}, {}, row, row))

    def paths(**kw: float) -> list[tuple[int, ...]]:
        tree = DynaTreeBuilder(**kw).build(draft, 50)  # type: ignore[arg-type]
        return sorted(tree.paths()[1:])

    gate = {"max_depth": 3, "base_depth": 2, "rho_stop": 0.01, "prune": 0.0}
    assert paths(**gate, rho_deep=0.3) == [(0,), (0, 0), (0, 1)]
    assert paths(**gate, rho_deep=0.25) == [(0,), (0, 0), (0, 0, 0), (0, 0, 1), (0, 1)]
    stop = {"max_depth": 4, "base_depth": 3, "rho_deep": 0.5, "rho_stop": 0.25}
    assert paths(**stop, prune=0.0) == [(0,), (0, 0), (0, 0, 0), (0, 0, 1), (0, 1)]
    assert paths(**stop, prune=0.125) == [(0,), (0, 0), (0, 0, 0), (0, 1)]
    # the gate d(u) < D_0 with nothing pruned: the hand model of test_dynatree_rules_by_hand at τ = 0 keeps
    # (0, 1) a leaf (depth 2 = D_0, p = 0.14 < ρ_deep)
    flat = ToyDraft(ToyModel(3, {}, {}, np.array([0.7, 0.2, 0.1]), np.array([0.7, 0.2, 0.1])))
    tree = DynaTreeBuilder(base_depth=2, max_depth=3, rho_stop=0.05, rho_deep=0.3, prune=0.0).build(flat, 50)
    assert sorted(tree.paths()[1:]) == [(0,), (0, 0), (0, 0, 0), (0, 0, 1), (0, 1)]


def test_wetap_prunes_by_the_papers_score_and_leaf_rule() -> None:
    """Two hand cases of seed 004 §3.2.2 / eq. 7, α = 0.6, L = 2 (``score = α p̂ + (1 − α) d / L``):

    1. Every row (0.5, 0.3, 0.2), W = 2, budget 3.  Layer 1: 0 (f 0.5), 1 (0.3); layer 2: (0, 0) 0.25, then
       0.15 twice, (0, 1) before (1, 0) (ties by parent, then token).  p̂ = (f − 0.15) / 0.35: 1, 3/7, 2/7, 0;
       scores 0.8, 0.457, 0.571, 0.4: kept (0), (0, 0), (1).  (Without f_min, p̂ = f / 0.5 gives (0, 1)
       0.58 > (1) 0.56.)
    2. Root (0.5, 0.3, 0.2), after 0 (0.7, 0.2, 0.1), after 1 (0.4, 0.35, 0.25), after 2 (0.7, 0.2, 0.1), W = 3,
       budget 4.  Layer 1: 0, 1, 2; layer 2: (0, 0) 0.35, (2, 0) 0.14, (1, 0) 0.12.  p̂ = (f − 0.12) / 0.38;
       scores (0) 0.8, (1) 0.484, (2) 0.326, (0, 0) 0.763, (2, 0) 0.432, (1, 0) 0.4.  The best 4 are (0), (0, 0),
       (1), (2, 0); repair adds (2): 5 nodes.  The leaves are (1), (0, 0), (2, 0); a leaf of a shallower layer than
       the deepest goes first: (1), although (2, 0) has the lower f.  Kept (0), (2), (0, 0), (2, 0).
    """
    first = ToyModel(3, {}, {}, np.array([0.5, 0.3, 0.2]), np.full(3, 1 / 3))
    tree = WetapBuilder(length=2, w_min=2, w_max=2, alpha=0.6).build(ToyDraft(first), 3)
    assert sorted(tree.paths()[1:]) == [(0,), (0, 0), (1,)]
    second = ToyModel(3, {(): np.array([0.5, 0.3, 0.2]), (1,): np.array([0.4, 0.35, 0.25])}, {},
                      np.array([0.7, 0.2, 0.1]), np.full(3, 1 / 3))
    tree = WetapBuilder(length=2, w_min=3, w_max=3, alpha=0.6).build(ToyDraft(second), 4)
    assert sorted(tree.paths()[1:]) == [(0,), (0, 0), (2,), (2, 0)]


def test_wetap_breaks_ties_by_parent_then_token() -> None:
    """A uniform V = 4 draft, W = 2, no pruning (budget = the 4 scratch nodes): layer 1 keeps tokens 0, 1 of
    four equal ones; layer 2's eight candidates all have f = 1/16: (0, 0), (0, 1) (lowest parent, then token)."""
    uniform = ToyModel(4, {}, {}, np.full(4, 0.25), np.full(4, 0.25))
    tree = WetapBuilder(length=2, w_min=2, w_max=2).build(ToyDraft(uniform), 4)
    assert sorted(tree.paths()[1:]) == [(0,), (0, 0), (0, 1), (1,)]


def test_draw_without_counts_a_removed_token_once() -> None:
    """The mass left is the row's minus each removed token's once: (0.5, 0.3, 0.2) without [1, 1] leaves 0.7,
    and 0 and 2 are drawn with 5/7 and 2/7."""
    from spec.builders.base import draw_without

    row = np.array([0.5, 0.3, 0.2])
    runs = enumerate_runs(lambda s: draw_without(s, row, [1, 1], np.cumsum(row)))
    got = {out[0]: (out[1], weight) for out, weight, _ in runs}
    assert got.keys() == {0, 2}
    assert got[0] == (pytest.approx(0.7), pytest.approx(5 / 7)) and got[2] == (pytest.approx(0.7), pytest.approx(2 / 7))
