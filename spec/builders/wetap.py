"""WETAP's entropy-driven tree construction and pruning (seed paper 004: §3.2, App. A, App. D).

Construction (App. A lines 3–16): layer ``i`` keeps the ``W_i`` candidates of
largest cumulative draft probability ``f(v) = Π q`` along the path, among all
children of layer ``i − 1`` (a beam); ``W_1 = W_min`` and (eqs. 3–6)::

    H_t      = entropy of layer t's cumulative probabilities, normalised to sum 1
    H_t^norm = clip(H_t / log |layer t|, 0, 1)    (0 when the layer has one node)
    W_{t+1}  = W_min + (W_max − W_min) · (H_t^norm)^γ      (rounded)

Eq. 6 divides by ``log W_t``; here the divisor is the log of the number of
nodes layer ``t`` really holds, which is ``W_t`` unless fewer candidates
exist (a small vocabulary, or App. B.4's top-10 drafts under ``W_1 = 16``).
Then a uniform layer still maps to ``W_max`` (its entropy is the largest it
can be), where eq. 6 read literally would give less: a uniform 10-node
layer 1 gives ``W_2 = 128`` here and ``106`` with ``log 16`` (γ = 1.2).

Pruning to the budget ``B`` (§3.2.2, App. D) when the tree has more nodes:
keep the ``B`` nodes of largest ``score = α · p̂ + (1 − α) · d / L`` (equal
scores: the node made first; the paper leaves ties open) with
``p̂ = (f − f_min) / (f_max − f_min + ε)`` over the tree; repair by adding back
every ancestor of a kept node; while still over budget remove leaves from
shallow to deep layers (the deepest layer excluded; ties: lower ``f`` first),
then the leaves of lowest ``f``.  The leaves are found afresh after each
removal, so a parent left childless in a shallower layer is removed before
any leaf of the deepest layer, even one of lower ``f`` (§3.2.2 does not say
which of the two readings it means; this one keeps the deep paths).

Only the construction is used: WETAP's own beam-threshold verifier is *not*
lossless (``verification.examples.WETAP_BEAM``).  Tokens are chosen, not
sampled, so every node is recorded ``topk`` and any lossless tree verifier
applies with the point-mass rule.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from spec.builders.base import Growing, TreeBuilder, check_positive, check_prob
from spec.randomness import Sampler
from tmc.multidraft import ROOT, Draw
from tmc.validate import check_int


#: The most nodes WETAP's scratch tree may be built with (its ``L`` layers before pruning): the paper's widest
#: setting (``L = 8``, ``W_max = 128``) holds at most 912; an unbounded ``w_max`` (``10**9``) on a vocabulary of
#: 8 asked for 19 M nodes and ended in a ``MemoryError``.
MAX_SCRATCH_NODES = 2**20


@dataclass(frozen=True)
class WetapBuilder(TreeBuilder):
    """WETAP construction + pruning.  Defaults from the paper: ``L = 8`` (App. B.4),
    ``W ∈ [16, 128]`` (§4.2), ``γ = 1.2`` (Table 3), ``α = 0.6`` (§4.4.3)."""

    length: int = 8  # L: layers built before pruning
    w_min: int = 16  # W_min: width of layer 1 and the low end of the range
    w_max: int = 128  # W_max
    gamma: float = 1.2  # γ: entropy-to-width exponent
    alpha: float = 0.6  # α: weight of probability against depth in the score
    eps: float = 1e-8  # ε of eq. (7)

    name: ClassVar[str] = "wetap"

    def __post_init__(self) -> None:
        # the checked values are kept: an integral float (`--param length=3.0`) becomes an int
        set_ = functools.partial(object.__setattr__, self)
        set_("length", check_int("length", self.length, minimum=1))
        set_("w_min", check_int("w_min", self.w_min, minimum=1))
        set_("w_max", check_int("w_max", self.w_max, minimum=1))
        if self.w_min > self.w_max:
            raise ValueError(f"need w_min <= w_max, got {self.w_min} and {self.w_max}")
        set_("gamma", check_positive("gamma", self.gamma))
        set_("alpha", check_prob("alpha", self.alpha, low_open=False))
        set_("eps", check_positive("eps", self.eps))

    def next_width(self, layer_probs: list[float]) -> int:
        """``W_{t+1}`` from the cumulative probabilities of layer ``t`` (eqs. 3–6)."""
        width = len(layer_probs)
        if width <= 1:
            h_norm = 0.0
        else:
            p = np.asarray(layer_probs, dtype=np.float64)
            p = p / p.sum()
            nz = p[p > 0.0]
            h_norm = min(1.0, max(0.0, float(-(nz * np.log(nz)).sum()) / math.log(width)))
        return int(round(self.w_min + (self.w_max - self.w_min) * h_norm**self.gamma))

    def within(self, depth: int) -> WetapBuilder:
        """``L`` layers feed the draft the nodes of the first ``L - 1``, whatever the budget: at most ``depth + 1``
        layers (the pruning's depth term ``d / L`` then reads the shorter ``L``)."""
        depth = check_int("depth", depth, minimum=1)
        return self if self.length <= depth + 1 else dataclasses.replace(self, length=depth + 1)

    def draft_nodes(self, budget: int, vocab: int) -> int:
        """The nodes of layers ``1 .. L - 1`` (the last layer is not fed), whatever the budget: layer 1 holds at
        most ``W_min`` of them, each later one ``W_max``, and no layer more than ``vocab`` children a node of
        the one before."""
        check_int("budget", budget, minimum=1)
        return self._layer_bound(check_int("vocab", vocab, minimum=1), self.length - 1)

    def _layer_bound(self, vocab: int, layers: int) -> int:
        """The most nodes layers ``1 .. layers`` can hold (widths ``W_min``, then ``W_max``; ``vocab`` children
        a node)."""
        total, width = 0, 1
        for level in range(1, layers + 1):
            width = min(self.w_min if level == 1 else self.w_max, width * vocab)
            total += width
        return total

    def _grow(self, grow: Growing, budget: int, sampler: Sampler, state: Any) -> None:
        # Build L layers in a scratch tree, then prune and copy the kept nodes into `grow`.
        most = self._layer_bound(grow.vocab, self.length)
        if most > MAX_SCRATCH_NODES:
            raise ValueError(f"WETAP's {self.length} layers of up to w_max = {self.w_max} nodes could hold {most:,} nodes "
                             f"on a vocabulary of {grow.vocab} before pruning, more than {MAX_SCRATCH_NODES:,}: "
                             f"lower w_max or length")
        scratch = Growing(grow.draft, grow.vocab)
        cum: list[float] = []
        depth: list[int] = []
        layer = [ROOT]
        width = self.w_min
        for level in range(1, self.length + 1):
            # f of every (parent, token) candidate: the width best and their ties, one draft call per layer
            # (an LLM draft selects them on its device and ships no rows)
            base = np.array([1.0 if node == ROOT else cum[node] for node in layer])
            pos, val = scratch.beam(layer, base, width)
            order = np.lexsort((pos, -val))[:width]  # by decreasing f, ties by parent then token
            pos, val = pos[order], val[order]
            parents_of = [layer[i] for i in (pos // grow.vocab).tolist()]
            layer = []
            for par, tok, f in zip(parents_of, (pos % grow.vocab).tolist(), val.tolist()):
                layer.append(scratch.add(par, tok, Draw.TOPK))
                cum.append(f)
                depth.append(level)
            if not layer:
                break
            width = self.next_width([cum[n] for n in layer])
        keep = self._prune(scratch.parents, cum, depth, budget)
        _copy(grow, scratch, keep, cum)

    def _prune(self, parents: list[int], cum: list[float], depth: list[int], budget: int) -> list[int]:
        n = len(parents)
        if n <= budget:
            return list(range(n))
        f = np.asarray(cum)
        p_hat = (f - f.min()) / (f.max() - f.min() + self.eps)
        score = self.alpha * p_hat + (1.0 - self.alpha) * np.asarray(depth) / self.length
        ranked = sorted(range(n), key=lambda i: (-score[i], i))
        kept = set(ranked[:budget])
        for i in list(kept):  # parent repair
            while parents[i] != ROOT and parents[i] not in kept:
                i = parents[i]
                kept.add(i)
        deepest = max(depth[i] for i in kept)

        def leaves() -> list[int]:
            inner = {parents[i] for i in kept}
            return [i for i in kept if i not in inner]

        while len(kept) > budget:
            shallow = [i for i in leaves() if depth[i] < deepest]
            pool = shallow if shallow else leaves()
            victim = min(pool, key=lambda i: (depth[i], cum[i], -i) if shallow else (cum[i], -i))
            kept.discard(victim)
        return sorted(kept)


def _copy(grow: Growing, scratch: Growing, keep: list[int], cum: list[float]) -> None:
    """Add the kept scratch nodes to ``grow`` breadth first, siblings by decreasing probability."""
    kids: dict[int, list[int]] = {}
    for i in keep:
        kids.setdefault(scratch.parents[i], []).append(i)
    queue = [(ROOT, ROOT)]  # (scratch node, node in grow)
    while queue:
        nxt = []
        for old, new in queue:
            if old in kids and scratch.has_row(old):  # rows travel with the tree when they were fetched
                grow.set_row(new, scratch.row(old))
            for i in sorted(kids.get(old, []), key=lambda i: (-cum[i], scratch.tokens[i])):
                nxt.append((i, grow.add(new, scratch.tokens[i], Draw.TOPK)))
        queue = nxt
