"""The fixed-shape builders: a chain of ``n`` tokens and a depth × width tree.

Both fill their shape breadth first and stop at the node budget, asking the
draft for one tree layer per call.  Notation: ``q`` draft, ``p`` target.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from spec.builders.base import Growing, TreeBuilder, check_draw, check_prob, top_tokens, without
from spec.randomness import Sampler
from tmc.multidraft import ROOT, Draw
from tmc.validate import check_int


@dataclass(frozen=True)
class ChainBuilder(TreeBuilder):
    """A chain of ``budget`` draft tokens (classic speculative sampling's draft).

    ``draw``: ``iid`` samples each token from ``q`` (verified with the draft
    law, as SpS does), ``topk`` takes the draft's argmax (greedy drafting,
    verified with the point-mass rule).

    ``confidence``: when set, the chain ends after the first token whose
    draft probability ``q(x)`` is below it, so ``budget`` is a maximum
    (transformers' assisted generation stops its assistant by the same rule,
    ``assistant_confidence_threshold``, 0.4 by default, with up to 20
    tokens).  The stop depends only on the draft's own draws, and every
    chain verifier stays lossless under such a stopping rule (exact
    enumeration: ``tests/spec/test_confidence_chain.py``).  The probability
    is the processed row's, the law the token was drawn from: a one-hot row
    (temperature 0) never stops, so pair it with a draft temperature above 0
    there.  ``None`` (the default): always ``budget`` tokens.
    """

    draw: Draw | str = Draw.IID
    confidence: float | None = None

    name: ClassVar[str] = "chain"

    def __post_init__(self) -> None:
        object.__setattr__(self, "draw", check_draw("draw", self.draw, (Draw.IID, Draw.TOPK)))
        if self.confidence is not None:
            object.__setattr__(self, "confidence", check_prob("confidence", self.confidence))

    def _grow(self, grow: Growing, budget: int, sampler: Sampler, state: Any) -> None:
        node = ROOT
        for _ in range(budget):
            row = grow.row(node)
            tok = sampler.draw(row) if self.draw == Draw.IID else top_tokens(row, 1)[0]
            node = grow.add(node, tok, Draw(self.draw))
            if self.confidence is not None and row[tok] < self.confidence:
                break


@dataclass(frozen=True)
class FixedBuilder(TreeBuilder):
    """Every node gets ``width`` children down to ``depth``, filled breadth first up to the budget.

    ``draw``: ``iid`` (SpecInfer: ``width`` independent draws from ``q``),
    ``swor`` (Sequoia / DySpec Alg. 3: each draw from ``q`` without the earlier
    siblings; a node gets ``min(width, |supp q|)`` children) or ``topk`` (the
    ``width`` most likely tokens with ``q > 0``).  ``depth=None`` grows until
    the budget is spent.  With a budget of at least the full shape the trees
    and their probabilities are those of :func:`tmc.drafts.tree_drafts` with
    widths ``(width,) * depth`` (tested).
    """

    width: int = 2
    depth: int | None = None
    draw: Draw | str = Draw.SWOR

    name: ClassVar[str] = "fixed"

    def __post_init__(self) -> None:
        object.__setattr__(self, "width", check_int("width", self.width, minimum=1))
        if self.depth is not None:
            object.__setattr__(self, "depth", check_int("depth", self.depth, minimum=1))
        object.__setattr__(self, "draw", check_draw("draw", self.draw, (Draw.IID, Draw.SWOR, Draw.TOPK)))

    def full_shape(self, budget: int) -> tuple[int, ...]:
        """The parents of the tree :meth:`build` grows with this ``budget`` when every node gets
        ``width`` children (node indices breadth first, as :meth:`build` numbers them).

        That is every tree with ``draw="iid"`` (an i.i.d. draw from a valid row
        always succeeds), and every tree with ``topk`` or ``swor`` whose rows
        each have ``width`` tokens with ``q > 0``.  The device path of
        :func:`spec.llm.generate.generate` drafts such a tree without asking
        the host how it grows (tested equal to :meth:`build`'s trees).
        """
        budget = check_int("budget", budget, minimum=1)
        parents: list[int] = []
        frontier = [ROOT]
        level = 0
        while frontier and len(parents) < budget and (self.depth is None or level < self.depth):
            nxt: list[int] = []
            for node in frontier:
                for _ in range(min(self.width, budget - len(parents))):
                    parents.append(node)
                    nxt.append(len(parents) - 1)
            frontier = nxt
            level += 1
        return tuple(parents)

    def _grow(self, grow: Growing, budget: int, sampler: Sampler, state: Any) -> None:
        kind = Draw(self.draw)
        frontier = [ROOT]
        level = 0
        while frontier and grow.size < budget and (self.depth is None or level < self.depth):
            grow.fetch(frontier)  # one draft call for the whole layer
            nxt: list[int] = []
            for node in frontier:
                row = grow.row(node)
                if kind == Draw.TOPK:
                    toks = top_tokens(row, self.width)
                    for tok in toks[: budget - grow.size]:
                        nxt.append(grow.add(node, tok, kind))
                    continue
                drawn: list[int] = []
                for _ in range(self.width):
                    if grow.size >= budget:
                        break
                    law = row if kind == Draw.IID else without(row, drawn)
                    if not law.any():
                        break
                    tok = sampler.draw(law)
                    drawn.append(tok)
                    nxt.append(grow.add(node, tok, kind))
            frontier = nxt
            level += 1
