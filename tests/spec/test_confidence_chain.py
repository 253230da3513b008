"""Chains that stop at the first unconfident draft token (``ChainBuilder(confidence=c)``).

Exact before statistical: the builder's law is compared with an independent
enumeration of the stopping rule, and every chain and tree verifier is shown
lossless on the stopped chains by the completion identity (worst error
≤ 1e-12, exact arithmetic up to rounding); argmax chains go to the chain
verifiers as point masses, as the LLM loop hands them over.  The same check
rejects a rule that looks ahead (a chain cut back to its last confident
token), so it can fail: that rule moves the completed law by up to 0.08 on
V = 3 models (and verifying those argmax chains as if they were sampled
from ``q`` would move it by 0.22).
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import pytest

from spec.acceptance import builder_drafts, random_stationary_model
from spec.builders import ChainBuilder, make_builder
from spec.draft import ToyDraft
from tmc.chain import asps_kernel, block_kernel, sps_kernel
from tmc.commands.acceptance import TREE_VERIFIERS
from tmc.drafts import DraftChain
from tmc.laws import output_law
from tmc.multidraft import Draw
from tmc.toy import Path, ToyModel

CHAIN_KERNELS = {"sps": sps_kernel, "asps": asps_kernel, "block": block_kernel}
MODELS = [random_stationary_model(v, s, depth=3, concentration=0.5, agreement=0.4)
          for v in (2, 3, 4) for s in range(6)]


def _stopped_law(model: ToyModel, budget: int, confidence: float, greedy: bool) -> dict[Path, float]:
    """The chain law written from the rule itself: draw (or take the argmax) until ``budget``
    tokens or just after the first token with ``q(x) < confidence``."""
    law: dict[Path, float] = defaultdict(float)

    def walk(ref: Path, weight: float) -> None:
        if len(ref) == budget or (ref and model.q(ref[:-1])[ref[-1]] < confidence):
            law[ref] += weight
            return
        row = model.q(ref)
        if greedy:
            walk(ref + (int(np.argmax(row)),), weight)  # lowest id on ties, as top_tokens
        else:
            for a in np.flatnonzero(row > 0.0):
                walk(ref + (int(a),), weight * float(row[a]))

    walk((), 1.0)
    return dict(law)


def _as_chains(model: ToyModel, law: dict[Path, float], point_masses: bool = False) -> list[DraftChain]:
    """The chains of ``law`` for the chain kernels; ``point_masses``: each token drawn with probability 1
    (an argmax chain, as the LLM loop hands it to SpS / ASpS / block: ``draft_probs=None``)."""
    out = []
    for ref, w in law.items():
        q_rows, p_rows = model.chain_rows(ref)
        if point_masses:
            q_rows = np.eye(model.vocab)[list(ref)].reshape(len(ref), model.vocab)
        out.append(DraftChain(ref, w, q_rows, p_rows))
    return out


@pytest.mark.parametrize("draw", ["iid", "topk"])
@pytest.mark.parametrize("confidence", [0.35, 0.6, 0.9, 1.0])
def test_builder_law_is_the_stopping_rule(draw: str, confidence: float) -> None:
    for m in MODELS:
        ours = {d.tree.tokens: d.weight for d in builder_drafts(m, ChainBuilder(draw=draw, confidence=confidence), 4)}
        theirs = _stopped_law(m, 4, confidence, draw == "topk")
        assert ours.keys() == theirs.keys()
        assert all(math.isclose(ours[k], theirs[k], rel_tol=1e-12) for k in ours)
        assert math.isclose(math.fsum(ours.values()), 1.0, rel_tol=1e-12)


def test_confidence_shortens_chains_and_none_keeps_the_budget() -> None:
    m = random_stationary_model(3, 1, depth=3, concentration=0.5, zero_prob=0.0)  # no one-hot rows
    lengths = {c: sorted({len(d.tree.tokens) for d in builder_drafts(m, ChainBuilder(confidence=c), 4)})
               for c in (None, 0.3, 1.0)}
    assert lengths == {None: [4], 0.3: [1, 2, 3, 4], 1.0: [1]}  # 0.3 < 1/3: every row can go on


def test_a_one_hot_row_never_stops() -> None:
    point = np.array([0.0, 1.0, 0.0])
    m = ToyModel(3, {}, {}, point, np.full(3, 1 / 3))
    tree = ChainBuilder(draw="iid", confidence=1.0).build(ToyDraft(m), 5)
    assert tree.tokens == (1,) * 5


@pytest.mark.parametrize("draw", ["iid", "topk"])
def test_every_verifier_is_lossless_on_stopped_chains(draw: str) -> None:
    for m in MODELS:
        for c in (0.35, 0.6, 0.9):
            drafts = builder_drafts(m, ChainBuilder(draw=draw, confidence=c), 4)
            for name, rule in TREE_VERIFIERS.items():
                if Draw(draw) in rule.draws:
                    assert output_law(m, drafts, rule.kernel).completion_error < 1e-12, (name, c)
            chains = _as_chains(m, {d.tree.tokens: d.weight for d in drafts}, point_masses=draw == "topk")
            for name, kernel in CHAIN_KERNELS.items():  # the chain verifiers read the drafts as chains
                assert output_law(m, chains, kernel).completion_error < 1e-12, (name, c)


def _trimmed_law(model: ToyModel, budget: int, confidence: float) -> dict[Path, float]:
    """A rule that looks ahead: draw ``budget`` tokens, then cut the chain back to its last
    token with ``q(x) >= confidence``.  Whether a token stays depends on later draws."""
    law: dict[Path, float] = defaultdict(float)

    def walk(ref: Path, weight: float) -> None:
        if len(ref) == budget:
            keep = max((i + 1 for i in range(budget) if model.q(ref[:i])[ref[i]] >= confidence), default=0)
            law[ref[:keep]] += weight
            return
        row = model.q(ref)
        for a in np.flatnonzero(row > 0.0):
            walk(ref + (int(a),), weight * float(row[a]))

    walk((), 1.0)
    return dict(law)


def test_the_check_rejects_a_look_ahead_stop() -> None:
    """The completion identity is not blind to how a chain ends: cutting back to the last confident
    token biases every chain verifier on these models."""
    for name, kernel in CHAIN_KERNELS.items():
        worst = max(output_law(m, _as_chains(m, _trimmed_law(m, 3, 0.5)), kernel).completion_error
                    for m in MODELS[6:12])
        assert worst > 0.01, name


@pytest.mark.parametrize("bad", [0, 0.0, -0.2, 1.5, float("nan"), float("inf"), "high", [0.4]])
def test_bad_confidence_is_named(bad: object) -> None:
    with pytest.raises(ValueError, match="confidence"):
        ChainBuilder(confidence=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="confidence"):
        make_builder("chain", confidence=bad)


def test_confidence_from_a_command_line_string() -> None:
    assert make_builder("chain", confidence="0.4") == ChainBuilder(confidence=0.4)
