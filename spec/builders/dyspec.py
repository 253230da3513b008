"""DySpec's dynamic token trees (seed paper 000: Alg. 1, greedy heap; Alg. 2, threshold).

A *position* is "the next child of node ``u``": drawing there samples a token
``y`` from ``u``'s residual draft row ``R`` (``q(· | u)`` with the children
already drawn removed, renormalised — sampling without replacement, recorded
``swor``).  Each position carries an estimated value ``v``: the draft's guess
of the probability that verification ever tests it.  Drawing ``y`` at a
position of value ``v`` creates two positions (Alg. 1 lines 8–15):

* the first child of ``y``, value ``v · R[y]`` (tested if ``y`` is accepted);
* the next sibling of ``y``, value ``v · (1 − R[y])`` (tested if ``y`` is rejected).

The paper leaves equal values unordered; here the position made first goes first (the next sibling is made
before the first child drawn with it).

The value of a position is fixed before its token is drawn, so which tokens
are kept never depends on the token drawn (the paper's App. A.1 remark): the
tree's random structure is draft randomness only, and residual verification
stays lossless (checked by enumeration in the tests).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from spec.builders.base import Growing, TreeBuilder, check_prob, draw_without, without
from spec.randomness import Sampler
from tmc.multidraft import ROOT, Draw
from tmc.ordered_traversal import CANCELLED_MASS
from tmc.validate import check_int


Position = tuple[float, int, int]  # (−value, tie-break counter, node whose next child it is)
FloatArray = NDArray[np.float64]


def _expand(
    grow: Growing,
    position: Position,
    removed: dict[int, list[int]],
    cdfs: dict[int, FloatArray],
    sampler: Sampler,
    heap: list[Position],
    counter: Iterator[int],
) -> tuple[int, float] | None:
    """Draw at ``position`` without replacement (Alg. 1 lines 5–12).

    Pushes the next-sibling position, value ``v · (1 − R[y])``, onto ``heap``
    (``1 − R[y]`` summed over the tokens left where the difference cancels, so
    a token of ``q = 1e-20`` beside one of ``q = 1`` still gets its position)
    and returns the new child with its first-child value ``v · R[y]``;
    ``None`` when no token with ``q > 0`` is left at the position.  A node's
    cumulative row (``cdfs``) is computed at its first draw and serves all of
    its children (:func:`~spec.builders.base.draw_without`).
    """
    neg_v, _, node = position
    row = grow.row(node)
    if node not in cdfs:
        cdfs[node] = np.cumsum(row)
    drawn = draw_without(sampler, row, removed.setdefault(node, []), cdfs[node])
    if drawn is None:
        return None
    tok, mass = drawn
    removed[node].append(tok)
    r_y, v = float(row[tok]) / mass, -neg_v
    rest = 1.0 - r_y  # the next sibling's share 1 − R[y]
    if rest < CANCELLED_MASS:  # cancelled (q = (1, 1e-20) leaves 1 − 1 = 0): the tokens left, summed
        rest = float(without(row, removed[node]).sum()) / mass
    if v * rest > 0.0:
        heapq.heappush(heap, (-v * rest, next(counter), node))
    return grow.add(node, tok, Draw.SWOR), v * r_y


def _check_max_depth(builder: DySpecBuilder | DySpecThresholdBuilder) -> None:
    if builder.max_depth is not None:
        object.__setattr__(builder, "max_depth", check_int("max_depth", builder.max_depth, minimum=1))


@dataclass(frozen=True)
class DySpecBuilder(TreeBuilder):
    """DySpec Alg. 1: expand the position of largest estimated value until the budget is spent.

    ``max_depth`` (``None``: unbounded, as in the paper) caps the depth of the
    tree.  Draft rows are fetched lazily and in batches: when the popped
    position's row is unknown, the rows of *every* pending first-child
    position are evaluated in one draft call (they are needed by the time the
    heap reaches them, and a row is a fixed function of its path, so the tree
    is exactly Alg. 1's; a leaf's row may be evaluated without being used).
    """

    max_depth: int | None = None

    name: ClassVar[str] = "dyspec"
    adaptive_widths: ClassVar[bool] = True

    def __post_init__(self) -> None:
        _check_max_depth(self)

    def _grow(self, grow: Growing, budget: int, sampler: Sampler, state: Any) -> None:
        counter = itertools.count()
        heap: list[Position] = [(-1.0, next(counter), ROOT)]
        removed: dict[int, list[int]] = {}
        cdfs: dict[int, FloatArray] = {}
        while heap and grow.size < budget:
            position = heapq.heappop(heap)
            if not grow.has_row(position[2]):
                grow.fetch([position[2]] + [n for _, _, n in heap if not grow.has_row(n)])
            drawn = _expand(grow, position, removed, cdfs, sampler, heap, counter)
            if drawn is None:
                continue
            child, value = drawn
            if self.max_depth is None or grow.depth(child) < self.max_depth:
                heapq.heappush(heap, (-value, next(counter), child))


@dataclass(frozen=True)
class DySpecThresholdBuilder(TreeBuilder):
    """DySpec Alg. 2: layer by layer, draw at every position whose value is at least ``threshold``.

    One draft call per layer.  Alg. 2 has no node budget; with one, the
    positions of a layer are served in decreasing value until the budget is
    spent, so a layer that does not fit is cut by value (within a layer the
    order Alg. 1 would take; across layers not: a shallower layer is filled
    first).  ``threshold`` defaults to ``1 / budget``, §4.4's "typically around
    1/n" (App. B's 0.001 goes with its 768-node budget); a fixed 0.001 at a
    budget of 16 left almost every layer over the threshold, so the budget
    filled depth 1 and 2 breadth first (96% of the nodes at depth 1 over 20
    trees on a peaked V = 256 ``HashedDraft``, against 43% for Alg. 1 and 51%
    at 1/16).  Alg. 2's
    loop condition ``v_i < t`` is read as ``v_i ≥ t`` (the text: "extend all
    nodes with estimated acceptance rate above the threshold").
    """

    threshold: float | None = None  # None: 1 / budget
    max_depth: int | None = None

    name: ClassVar[str] = "dyspec-threshold"
    adaptive_widths: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if self.threshold is not None:
            object.__setattr__(self, "threshold", check_prob("threshold", self.threshold))
        _check_max_depth(self)

    def _grow(self, grow: Growing, budget: int, sampler: Sampler, state: Any) -> None:
        threshold = 1.0 / budget if self.threshold is None else self.threshold
        counter = itertools.count()
        layer: list[Position] = [(-1.0, next(counter), ROOT)]
        removed: dict[int, list[int]] = {}
        cdfs: dict[int, FloatArray] = {}
        depth = 0
        while layer and grow.size < budget and (self.max_depth is None or depth < self.max_depth):
            grow.fetch([n for _, _, n in layer])  # one draft call for the layer
            heapq.heapify(layer)
            nxt: list[Position] = []
            while layer and grow.size < budget and -layer[0][0] >= threshold:
                drawn = _expand(grow, heapq.heappop(layer), removed, cdfs, sampler, layer, counter)
                if drawn is not None:
                    child, value = drawn
                    nxt.append((-value, next(counter), child))
            layer = nxt
            depth += 1
