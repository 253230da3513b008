"""Tree builders on the edges of their rules: boundary values, leaf-removal order, parameter checks.

Every expected tree or value below is worked out by hand from the rule the module docstrings state
(seed papers 000 DySpec, 001 DynaTree, 004 WETAP), not read off the builders' output.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from spec.acceptance import random_stationary_model
from spec.builders import DynaTreeBuilder, DySpecBuilder, DySpecThresholdBuilder, FixedBuilder, WetapBuilder
from spec.builders.base import check_prob
from spec.draft import ToyDraft, top_tokens
from tmc.multidraft import ROOT, DraftTree
from tmc.toy import ToyModel


# --- DynaTree: the expansion gate p(u) >= τ, and an empty tree ------------------------------------------------------


def test_dynatree_expands_a_node_whose_path_probability_equals_the_prune_level() -> None:
    """App. D line 14 expands a node ``u`` when ``p(u) ≥ τ``: equality expands."""
    # root row (1/2, 1/2), then (1, 0): u0 = 0 (lowest id on the tie) has p = 1/2 = τ and expands; c = 1 >= τ_h
    # gives B_min = 1 child, p stays 1/2, so the path runs to D_max = 3 and no leaf is below τ
    model = ToyModel(2, {(): np.array([0.5, 0.5])}, {}, np.array([1.0, 0.0]), np.array([0.5, 0.5]))
    b = DynaTreeBuilder(max_depth=3, base_depth=2, prune=0.5, rho_stop=0.01, rho_deep=0.3)
    tree = b.build(ToyDraft(model), 10)
    assert sorted(tree.paths()[1:]) == [(0,), (0, 0), (0, 0, 0)]


def test_dynatree_next_state_after_an_empty_tree_keeps_the_state() -> None:
    """A step that drafted nothing has no acceptance statistic (accepted / drafted): ``next_state`` keeps the state.
    Without ``root_top1`` a flat draft below τ gives such an empty tree."""
    flat = ToyModel(4, {}, {}, np.full(4, 0.25), np.full(4, 0.25))
    b = DynaTreeBuilder(root_top1=False, prune=0.5)  # every root child has p = 1/4 < τ: all pruned
    tree = b.build(ToyDraft(flat), 8)
    assert tree.size == 0
    state = b.initial_state()
    assert b.next_state(state, tree, 0) == state
    assert b.next_state(state, DraftTree((), (), (), {}, 2), 0) == state


# --- WETAP: the width formula is rounded, and the leaf-removal order of §3.2.2 -------------------------------------


def test_wetap_width_is_rounded_not_truncated() -> None:
    """Eqs. 3-6: ``W_{t+1} = W_min + (W_max − W_min) · H_norm^γ``, rounded to the nearest integer."""
    # layer (1/2, 1/4, 1/4): H = 1.5 ln 2, H_norm = H / ln 3 = 0.9464; 1 + 2 * 0.9464 = 2.893 -> 3 (truncation: 2)
    h = 1.5 * math.log(2) / math.log(3)
    assert 2.5 < 1 + 2 * h < 3
    assert WetapBuilder(w_min=1, w_max=3, gamma=1.0).next_width([0.5, 0.25, 0.25]) == 3


def test_wetap_removes_the_lower_probability_leaf_of_a_shallow_layer_first() -> None:
    """§3.2.2 leaf removal: among leaves of one layer above the deepest, the one of lower ``f`` goes first."""
    # L = 2, α = 1/2; layer 1 f = (.4, .3, .2, .1), node 4 below 0 (f .3), node 5 below 3 (f .09).  p̂ = (f − .09)/.31,
    # scores 0 .75, 1 .589, 2 .427, 3 .266, 4 .839, 5 .5: the best 5 leave out 3, repair adds it (6 for 5).
    # Leaves above the deepest layer: 1 (f .3), 2 (f .2): 2 goes.
    b = WetapBuilder(length=2, alpha=0.5)
    parents, cum, depth = [ROOT, ROOT, ROOT, ROOT, 0, 3], [0.4, 0.3, 0.2, 0.1, 0.3, 0.09], [1, 1, 1, 1, 2, 2]
    assert b._prune(parents, cum, depth, 5) == [0, 1, 3, 4, 5]


def test_wetap_removes_shallow_leaves_shallowest_layer_first() -> None:
    """§3.2.2 leaf removal goes "from shallow to deep layers": a depth-1 leaf before a depth-2 one."""
    # L = 3, α = 0.9; f: layer 1 (.6, .35), layer 2 below node 0 (.3, .25), layer 3 below node 3 (.24).
    # p̂ = (f − .24)/.36, scores 0 .933, 1 .308, 2 .217, 3 .092, 4 .1: the best 4 leave out 3, repair adds it.
    # Leaves above the deepest layer: 1 (depth 1), 2 (depth 2): 1 goes, although its f is higher.
    b = WetapBuilder(length=3, alpha=0.9)
    parents, cum, depth = [ROOT, ROOT, 0, 0, 3], [0.6, 0.35, 0.3, 0.25, 0.24], [1, 1, 2, 2, 3]
    assert b._prune(parents, cum, depth, 4) == [0, 2, 3, 4]


def test_wetap_removes_the_lowest_probability_deepest_leaf_when_no_shallow_leaf_is_left() -> None:
    """§3.2.2 leaf removal: with no leaf above the deepest layer, the leaf of lowest ``f`` goes."""
    # L = 2, α = 0.2; layer 1 f = (.4, .35, .25), one child each (.2, .1, .05).  Depth dominates the score: the best 4
    # are the depth-2 nodes and 0; repair adds 1, 2 (6 for 4).  Node 5 (f .05) goes, leaving 2 a shallow leaf: it goes.
    b = WetapBuilder(length=2, alpha=0.2)
    parents, cum, depth = [ROOT, ROOT, ROOT, 0, 1, 2], [0.4, 0.35, 0.25, 0.2, 0.1, 0.05], [1, 1, 1, 2, 2, 2]
    assert b._prune(parents, cum, depth, 4) == [0, 1, 3, 4]


def test_wetap_keeps_the_node_made_first_among_equal_scores() -> None:
    """Equal scores go to the node made first (module doc): three depth-1 nodes of one ``f`` all score
    ``α · 0 + (1 − α) · 1 / L`` (``p̂ = 0 / ε``), and a budget of 2 keeps nodes 0 and 1."""
    b = WetapBuilder(length=2, alpha=0.5)
    assert b._prune([ROOT, ROOT, ROOT], [0.3, 0.3, 0.3], [1, 1, 1], 2) == [0, 1]


# --- DySpec: a sibling position whose share 1 − R[y] cancels ---------------------------------------------------------


def test_dyspec_keeps_the_sibling_position_of_a_token_beside_one_of_mass_one() -> None:
    """Alg. 1 pushes the next sibling with value ``v · (1 − R[y])``: for q = (1, 1e-20) that is 1e-20 > 0, not the
    ``1 − 1 = 0`` of floats, so with depth 1 and budget 2 both root tokens are drawn (token 0 first, whatever the
    uniform: its share is 1 in floats)."""
    model = ToyModel(2, {}, {}, np.array([1.0, 1e-20]), np.array([0.5, 0.5]))
    for seed in range(3):
        tree = DySpecBuilder(max_depth=1).build(ToyDraft(model), 2, np.random.default_rng(seed))
        assert (tree.parents, tree.tokens) == ((ROOT, ROOT), (0, 1))


# --- next_state: the accepted count is checked on every path ----------------------------------------------------------


@pytest.mark.parametrize("builder", [DynaTreeBuilder(), DynaTreeBuilder(adapt=False), FixedBuilder()],
                         ids=["dynatree", "dynatree-fixed", "fixed"])
def test_next_state_refuses_an_accepted_count_outside_the_tree(builder) -> None:  # type: ignore[no-untyped-def]
    """``accepted`` counts draft tokens of ``tree`` kept: an int in ``[0, tree.size]`` for every builder, adaptive or
    not, and for an empty tree (0 only); anything else is a ValueError naming it (DESIGN.md §3)."""
    tree = DraftTree((ROOT, 0), (0, 0), ("topk", "topk"), {}, 2)
    empty = DraftTree((), (), (), {}, 2)
    state = builder.initial_state()
    builder.next_state(state, tree, 2)
    builder.next_state(state, empty, 0)
    for t, bad, message in ((tree, 3, "exceeds the tree's 2 draft nodes"), (tree, -1, "accepted must be >= 0"),
                            (empty, 1, "exceeds the tree's 0 draft nodes"), (tree, 1.5, "accepted")):
        with pytest.raises(ValueError, match=message):
            builder.next_state(state, t, bad)


# --- top_tokens: only tokens with q > 0 -----------------------------------------------------------------------------


def test_top_tokens_of_a_row_without_positive_entries_is_empty() -> None:
    """``top_tokens`` lists the ``k`` most likely tokens *with q > 0*: none for a row of zeros, whatever ``k``."""
    for k in (1, 2, 5):
        assert top_tokens(np.zeros(3), k) == []


# --- bad parameters: ValueError naming the argument ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "message"),
    [
        pytest.param(lambda: FixedBuilder(depth=0), "depth must be >= 1", id="fixed-depth-0"),
        pytest.param(lambda: DySpecBuilder(max_depth=0), "max_depth must be >= 1", id="dyspec-max_depth-0"),
        pytest.param(lambda: DySpecThresholdBuilder(max_depth=0), "max_depth must be >= 1", id="threshold-max_depth-0"),
        pytest.param(lambda: DynaTreeBuilder(max_depth=1), "max_depth must be >= 2", id="dynatree-max_depth-1"),
        pytest.param(lambda: DynaTreeBuilder(rho_stop=0.3, rho_deep=0.3), "need rho_stop < rho_deep", id="rho-equal"),
        pytest.param(lambda: DynaTreeBuilder(tau_low=0.5, tau_high=0.5), "need tau_low < tau_high", id="tau-equal"),
        pytest.param(lambda: DynaTreeBuilder(target_acceptance=1.0), r"target_acceptance must be in \(0, 1\)",
                     id="target_acceptance-1"),
        pytest.param(lambda: DynaTreeBuilder(rho_deep=1.0), r"rho_deep must be in \(0, 1\)", id="rho_deep-1"),
        pytest.param(lambda: DynaTreeBuilder(eta_depth=math.inf), "eta_depth must be a finite number >= 0",
                     id="eta_depth-inf"),
        pytest.param(lambda: WetapBuilder(gamma=0.0), "gamma must be a finite number > 0", id="gamma-0"),
        pytest.param(lambda: WetapBuilder(gamma=math.inf), "gamma must be a finite number > 0", id="gamma-inf"),
        pytest.param(lambda: WetapBuilder(eps=0.0), "eps must be a finite number > 0", id="eps-0"),
        pytest.param(lambda: check_prob("x", 1.0, high_closed=False), r"x must be in \(0, 1\)", id="check_prob-1"),
        pytest.param(lambda: random_stationary_model(2, 0, agreement=1.5), r"agreement must be in \[0, 1\]",
                     id="agreement-1.5"),
    ],
)
def test_out_of_range_parameters_are_refused_by_name(make, message: str) -> None:  # type: ignore[no-untyped-def]
    """A parameter outside its documented range, boundary values included (0 for a positive number, 1 for a
    probability in (0, 1), equal bounds), raises ``ValueError`` naming it (DESIGN.md §3)."""
    with pytest.raises(ValueError, match=message):
        make()
