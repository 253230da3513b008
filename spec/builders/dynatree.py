"""DynaTree's confidence-aware adaptive trees (seed paper 001: §3.3 and App. D, Alg. 1).

Breadth first from the context: a node ``u`` is expandable iff (§3.3)::

    d(u) < D_max  and  p(u) ≥ ρ_stop  and  (d(u) < D_0  or  p(u) ≥ ρ_deep)

(and ``p(u) ≥ τ``, App. D line 14), with ``p(u)`` the product of the draft
probabilities along its path.  An expanded node gets its ``B(u)`` most likely
tokens, ``B(u) = B_min`` if its confidence ``c(u) = max q(· | u) ≥ τ_h``,
``B_max`` if ``c(u) < τ_ℓ``, else ``B_mid``; children are added until the
node budget ``N_max`` is reached.  Afterwards every leaf with ``p(u) < τ`` is
pruned (§3.3).  The rule prunes leaves, never the tree's root: §3.3's tree is
rooted at the prefix, App. D's at the draft's top-1 token ``u_0`` (Alg. 1
line 10), which Alg. 1 keeps whatever its ``p`` (lines 14–15 only skip
expanding it).  So with ``root_top1`` (App. D) every tree holds ``u_0``: a
flat draft over a large vocabulary (top-1 ``q < τ``) gives the one-node tree,
not an empty one that ``next_state`` cannot learn from.  Tokens are chosen,
not sampled, so every node is recorded ``topk`` and verified with the
point-mass rule: lossless at any temperature (DynaTree itself targets greedy
decoding, §3.6).

**History adaptation** (§3.3): after each step the acceptance statistic
``a = accepted draft tokens / drafted tokens`` enters a window of the last
``W`` steps, and with its mean ``ā``::

    D_0 ← clip(D_0 + η_D (ā − a*), 1, D_max − 1)
    τ_h ← clip(τ_h − η_h (ā − a*), τ_ℓ, 1)

``D_0`` stays real-valued (the gate compares ``d(u) < D_0``); ``τ_h`` is kept
at least ``τ_ℓ`` so the three confidence bands stay ordered (the paper clips
to ``[0, 1]``).  Two readings of the paper's adaptation, both affecting only
later steps' trees: App. D line 7 passes ``τ_ℓ`` to ``ADJUST`` too, but
§3.3's rules (and this code) adapt only ``D_0`` and ``τ_h``, ``τ_ℓ`` staying
fixed; and before ``W`` steps have been seen ``ā`` is the mean of the
statistics seen so far (§3.3's ``(1/W) Σ`` over a full window would count
the missing steps as 0, so one fully accepted first step would give
``ā = 0.2``, not 1).  Depth: a path of ``k`` drafted tokens has ``d = k``
(the context is depth 0, as in §3.3's tree rooted at the prefix), also with
``root_top1``, where App. D's root ``u_0`` is at depth 1; App. D could be
read as ``d(u_0) = 0``, which would allow one more level.  The state depends only on earlier steps' outcomes, so it
cannot bias the step it shapes — the tests check whole step sequences.
``state=None`` means the initial state; any other state must be a
:class:`DynaTreeState` inside the ranges this adaptation keeps (``D_0`` in
``[1, D_max − 1]``, ``τ_h`` in ``[τ_ℓ, 1]``, at most ``W`` statistics in
``[0, 1]``), else ``ValueError`` naming it (a mistyped state, such as a dict
read back from JSON, used to be replaced by the initial one without a word).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from spec.builders.base import Growing, TreeBuilder, check_accepted, check_positive, check_prob
from spec.randomness import Sampler
from tmc.multidraft import ROOT, DraftTree, Draw
from tmc.validate import check_int


@dataclass(frozen=True)
class DynaTreeState:
    """What DynaTree carries from step to step (``initial_state()``, then ``next_state(...)``).

    Checked here: numbers, ``D_0 ≥ 1`` (§3.3 assumes ``1 ≤ D_0``), ``τ_h`` and each statistic in
    ``[0, 1]``.  The ranges set by a builder's parameters are checked by the builder that uses the state.
    """

    base_depth: float  # D_0
    tau_high: float  # τ_h
    history: tuple[float, ...] = ()  # acceptance statistics of the last W steps, oldest first

    def __post_init__(self) -> None:
        # kept as floats and a tuple: the state is compared and hashed (spec.acceptance keys branches by it)
        set_ = functools.partial(object.__setattr__, self)
        set_("base_depth", check_positive("base_depth", self.base_depth))  # a finite number, then >= 1
        if self.base_depth < 1.0:
            raise ValueError(f"base_depth must be >= 1, got {self.base_depth!r}")
        set_("tau_high", check_prob("tau_high", self.tau_high, low_open=False))
        if not isinstance(self.history, tuple | list):
            raise ValueError(f"history must be a tuple of acceptance statistics in [0, 1], got {self.history!r}")
        set_("history", tuple(check_prob(f"history[{i}]", a, low_open=False) for i, a in enumerate(self.history)))


@dataclass(frozen=True)
class DynaTreeBuilder(TreeBuilder):
    """DynaTree drafting.  Defaults: App. A (``D_0 = 5``, ``D_max = 8``, ``B = 1..3``,
    ``(τ_h, τ_ℓ) = (0.9, 0.4)``); the paper leaves ``B_mid``, ``ρ_stop``, ``ρ_deep``,
    ``τ`` and the history constants open — ours are marked below."""

    base_depth: float = 5.0  # D_0 (App. A)
    max_depth: int = 8  # D_max (App. A)
    b_min: int = 1  # B_min (App. A)
    b_mid: int = 2  # B_mid (ours: the integer between App. A's 1 and 3)
    b_max: int = 3  # B_max (App. A)
    tau_high: float = 0.9  # τ_h (App. A)
    tau_low: float = 0.4  # τ_ℓ (App. A)
    rho_stop: float = 0.01  # ρ_stop: early stop below this path probability (ours)
    rho_deep: float = 0.3  # ρ_deep: expand beyond D_0 only above this (ours)
    prune: float = 0.005  # τ: leaves below this path probability are pruned (ours)
    root_top1: bool = True  # App. D line 10: the tree starts from the draft's top-1 token alone
    window: int = 5  # W: steps in the acceptance window (ours)
    target_acceptance: float = 0.3  # a*: acceptance level the control steers to (ours)
    eta_depth: float = 4.0  # η_D (ours)
    eta_conf: float = 0.5  # η_h (ours)
    adapt: bool = True  # history adaptation on/off

    name: ClassVar[str] = "dynatree"

    def __post_init__(self) -> None:
        # the checked values are kept: an integral float (`--param b_max=3.0`) becomes an int
        set_ = functools.partial(object.__setattr__, self)
        for name, minimum in (("max_depth", 2), ("b_min", 1), ("b_mid", 1), ("b_max", 1), ("window", 1)):
            set_(name, check_int(name, getattr(self, name), minimum=minimum))
        if not self.b_min <= self.b_mid <= self.b_max:
            raise ValueError(f"need b_min <= b_mid <= b_max, got {self.b_min}, {self.b_mid}, {self.b_max}")
        set_("base_depth", check_positive("base_depth", self.base_depth))
        if not 1.0 <= self.base_depth <= self.max_depth - 1:
            raise ValueError(f"base_depth must be in [1, max_depth - 1] = [1, {self.max_depth - 1}], got {self.base_depth}")
        for name in ("tau_low", "tau_high", "rho_stop", "rho_deep", "target_acceptance"):
            set_(name, check_prob(name, getattr(self, name), high_closed=False))
        set_("prune", check_prob("prune", self.prune, low_open=False, high_closed=False))
        if self.tau_low >= self.tau_high:
            raise ValueError(f"need tau_low < tau_high, got {self.tau_low} and {self.tau_high}")
        if self.rho_stop >= self.rho_deep:
            raise ValueError(f"need rho_stop < rho_deep, got {self.rho_stop} and {self.rho_deep}")
        for name in ("root_top1", "adapt"):  # `--param adapt=maybe` was taken as true
            if not isinstance(getattr(self, name), bool | np.bool_):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
            set_(name, bool(getattr(self, name)))
        for name in ("eta_depth", "eta_conf"):
            set_(name, check_positive(name, getattr(self, name), zero=True))

    def initial_state(self) -> DynaTreeState:
        return DynaTreeState(float(self.base_depth), float(self.tau_high))

    def _checked_state(self, state: object) -> DynaTreeState:
        """``state`` if it is a :class:`DynaTreeState` this builder's adaptation can reach (``None``: the
        initial state); else ``ValueError`` naming it.

        ``next_state`` clips ``D_0`` to ``[1, D_max − 1]`` and ``τ_h`` to ``[τ_ℓ, 1]`` and keeps at most ``W``
        statistics, each in ``[0, 1]``; the initial state lies inside (the builder's ``__post_init__`` checks its
        ``D_0`` and ``τ_h``), so no state the builder makes is refused (tested over long runs of steps).
        """
        if state is None:
            return self.initial_state()
        if not isinstance(state, DynaTreeState):
            raise ValueError("state must be a DynaTreeState (from initial_state() or next_state()) or None, "
                             f"got {type(state).__name__} {state!r}")
        if not 1.0 <= state.base_depth <= self.max_depth - 1:
            raise ValueError(f"state.base_depth must be in [1, max_depth - 1] = [1, {self.max_depth - 1}], "
                             f"got {state.base_depth}")
        if not self.tau_low <= state.tau_high <= 1.0:
            raise ValueError(f"state.tau_high must be in [tau_low, 1] = [{self.tau_low}, 1], got {state.tau_high}")
        if len(state.history) > self.window:
            raise ValueError(f"state.history holds {len(state.history)} statistics, more than window = {self.window}")
        return state

    def next_state(self, state: Any, tree: DraftTree, accepted: int) -> DynaTreeState:
        st = self._checked_state(state)
        accepted = check_accepted(tree, accepted)
        if not self.adapt or tree.size == 0:
            return st
        history = (st.history + (accepted / tree.size,))[-self.window :]
        err = sum(history) / len(history) - self.target_acceptance
        depth = min(max(st.base_depth + self.eta_depth * err, 1.0), float(self.max_depth - 1))
        tau = min(max(st.tau_high - self.eta_conf * err, self.tau_low), 1.0)
        return DynaTreeState(depth, tau, history)

    def _expandable(self, depth: int, prob: float, state: DynaTreeState) -> bool:
        return (
            prob >= self.prune
            and depth < self.max_depth
            and prob >= self.rho_stop
            and (depth < state.base_depth or prob >= self.rho_deep)
        )

    def _breadth(self, confidence: float, state: DynaTreeState) -> int:
        if confidence >= state.tau_high:
            return self.b_min
        if confidence < self.tau_low:
            return self.b_max
        return self.b_mid

    def _grow(self, grow: Growing, budget: int, sampler: Sampler, state: Any) -> None:
        # Only each node's b_max best tokens and their q are read: an LLM draft ranks them on its device
        # (spec.draft.TopDraft) and ships no row; other drafts' rows are fetched and ranked here.
        st = self._checked_state(state)
        prob: dict[int, float] = {ROOT: 1.0}
        frontier = [ROOT]
        if self.root_top1:
            tok, q = grow.top([ROOT], 1)
            first = grow.add(ROOT, int(tok[0, 0]), Draw.TOPK)
            prob[first] = float(q[0, 0])
            frontier = [first]
        while frontier and grow.size < budget:
            ready = [u for u in frontier if self._expandable(grow.depth(u), prob[u], st)]
            tokens, values = grow.top(ready, self.b_max)  # one draft call per layer
            nxt: list[int] = []
            for u, toks, qs in zip(ready, tokens.tolist(), values.tolist()):
                breadth = self._breadth(qs[0], st)  # qs[0]: the row's largest q, its confidence c(u)
                for tok, q in zip(toks[:breadth], qs):
                    if tok < 0 or grow.size >= budget:  # -1: the row has no more tokens with q > 0
                        break
                    kid = grow.add(u, tok, Draw.TOPK)
                    prob[kid] = prob[u] * q
                    nxt.append(kid)
            frontier = nxt
        _prune_leaves(grow, prob, self.prune, keep_first=self.root_top1)


def _prune_leaves(grow: Growing, prob: dict[int, float], tau: float, *, keep_first: bool) -> None:
    """Drop every leaf with path probability below ``tau`` (renumbering the rest); with ``keep_first``
    node 0 stays whatever its ``p``: it is App. D's root ``u_0``, not a leaf of the tree rooted there."""
    has_kids = set(grow.parents)
    keep = [i for i in range(grow.size) if i in has_kids or prob[i] >= tau or (keep_first and i == 0)]
    if len(keep) == grow.size:
        return
    new = {ROOT: ROOT, **{old: k for k, old in enumerate(keep)}}
    grow.parents[:] = [new[grow.parents[i]] for i in keep]
    grow.tokens[:] = [grow.tokens[i] for i in keep]
    grow.draws[:] = [grow.draws[i] for i in keep]
    grow.kept_rows = {new[k]: v for k, v in grow.kept_rows.items() if k in new and (k == ROOT or k in has_kids)}
