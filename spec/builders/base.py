"""The one builder interface, and the pieces every builder shares.

A builder is a frozen dataclass of its parameters (paper defaults, each
documented) with one entry point::

    tree = builder.build(draft, budget, rng, state=None)

``draft`` is any :class:`spec.draft.DraftModel` (a toy model or an LLM), asked
for the rows of a whole tree layer per call; ``budget`` the largest number of
draft nodes; ``rng`` a ``numpy.random.Generator``, an integer seed or a
:class:`spec.randomness.Sampler` (the exact tests pass a scripted one and
enumerate every draw).  Out comes a :class:`tmc.DraftTree` whose every node
records how it was drawn, which is what makes the step lossless under a tree
verifier (DESIGN.md §4, §7):

* a token **sampled** from a row is recorded ``iid`` (drawn from the parent's
  full draft row) or ``swor`` (from the row with the earlier siblings removed)
  — exactly the law the builder passed to ``sampler.draw``;
* a token **chosen** deterministically (top-k, argmax) is recorded ``topk``
  and verified with the point-mass rule.

Builders that adapt across steps (DynaTree's history) keep their state in an
immutable value: ``initial_state()`` and ``next_state(state, tree, accepted)``
(accepted = draft tokens the verifier kept).  The state of a step depends
only on earlier steps, so it never biases the step it shapes.

Notation: ``q`` draft, ``p`` target (DESIGN.md §3).
"""

from __future__ import annotations

import math
import numbers
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
from numpy.typing import ArrayLike, NDArray

from spec.draft import DraftModel, beam_candidates, rows_for_paths, select_beam, select_top, top_candidates
from spec.draft import top_tokens as top_tokens  # re-exported: the builders' ranking rule
from spec.randomness import RngSampler, Sampler, as_sampler
from tmc.multidraft import ROOT, DraftTree, Draw
from tmc.noise import categorical
from tmc.ordered_traversal import CANCELLED_MASS
from tmc.toy import Path
from tmc.validate import check_int

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]


class TreeBuilder(ABC):
    """Base of every tree builder (subclasses are frozen dataclasses of parameters)."""

    #: Name on the command line (``--builder NAME``) and in reports.
    name: ClassVar[str]
    #: True when how many children a node gets depends on the tokens drawn for
    #: them (DySpec's next-sibling value ``v · (1 − R[y])``).  Residual and
    #: Traversal verification stay lossless; verifiers that reason about a
    #: sibling sample of fixed size (ratio-ordered Traversal, K-SEQ) do not.
    adaptive_widths: ClassVar[bool] = False

    def build(
        self,
        draft: DraftModel,
        budget: int,
        rng: np.random.Generator | int | Sampler = 0,
        state: Any = None,
    ) -> DraftTree:
        """A draft tree of at most ``budget`` nodes below the draft's context."""
        budget = check_int("budget", budget, minimum=1)
        if not hasattr(draft, "vocab") or not callable(getattr(draft, "rows", None)):
            raise ValueError(f"draft must be a draft model (a vocab and rows(paths)), got {type(draft).__name__}"
                             + ("; wrap a tmc.ToyModel as spec.draft.ToyDraft(model)" if hasattr(draft, "q") else ""))
        vocab = check_int("draft.vocab", draft.vocab, minimum=1)
        grow = Growing(draft, vocab)
        self._grow(grow, budget, as_sampler(rng), self.initial_state() if state is None else state)
        return grow.tree()

    @abstractmethod
    def _grow(self, grow: Growing, budget: int, sampler: Sampler, state: Any) -> None:
        """Add nodes to ``grow`` (parents before children, siblings in verification order)."""

    def within(self, depth: int) -> TreeBuilder:
        """This builder, or a variant of it, whose trees built with a budget of at most ``depth`` nodes feed the
        draft no node more than ``depth`` levels below the root (an LLM decode cuts its steps so near the end of
        a learned position table: :func:`spec.llm.generate.generate`).

        A builder that asks the draft only for the rows of nodes of the tree it returns is such a builder
        itself: those nodes lie at most ``budget`` deep.  One that grows a larger tree and prunes it (WETAP)
        overrides this with a shallower variant."""
        check_int("depth", depth, minimum=1)
        return self

    def draft_nodes(self, budget: int, vocab: int) -> int:
        """At most how many nodes one tree of ``budget`` nodes on a ``vocab``-token draft feeds the draft: the
        cache slots a step adds past the draft's context (an LLM decode sizes its static caches so).  A
        builder that asks only for the rows of its tree's nodes feeds at most ``budget``; WETAP, which feeds
        the layers it prunes away too, says more."""
        check_int("vocab", vocab, minimum=1)
        return check_int("budget", budget, minimum=1)

    def initial_state(self) -> Any:
        """State before the first step (``None``: the builder keeps none)."""
        return None

    def next_state(self, state: Any, tree: DraftTree, accepted: int) -> Any:
        """State for the next step after ``accepted`` draft tokens of ``tree`` were kept."""
        check_accepted(tree, accepted)
        return state


@dataclass
class Growing:
    """A tree under construction, with the draft rows fetched for it (batched per call)."""

    draft: DraftModel
    vocab: int
    parents: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    draws: list[Draw] = field(default_factory=list)
    kept_rows: dict[int, FloatArray] = field(default_factory=dict)  # rows recorded in the tree
    _rows: dict[int, FloatArray] = field(default_factory=dict)  # every row fetched, by node
    _paths: list[Path] = field(default_factory=list)

    @property
    def size(self) -> int:
        return len(self.tokens)

    def path(self, node: int) -> Path:
        return () if node == ROOT else self._paths[node]

    def depth(self, node: int) -> int:
        return len(self.path(node))

    def add(self, parent: int, token: int, draw: Draw) -> int:
        """Append a child of ``parent``; records the parent's row in the tree when it was fetched.

        Sampled children need that row (the tree refuses them without it); a
        ``topk`` child chosen through :meth:`beam` has none, and its point-mass
        rule needs none.
        """
        self.parents.append(parent)
        self.tokens.append(int(token))
        self.draws.append(draw)
        self._paths.append(self.path(parent) + (int(token),))
        if parent in self._rows:
            self.kept_rows[parent] = self._rows[parent]
        return self.size - 1

    def fetch(self, nodes: Sequence[int]) -> None:
        """Evaluate the draft rows of every node in ``nodes`` not fetched yet, in one call."""
        missing = list(dict.fromkeys(n for n in nodes if n not in self._rows))
        if missing:
            rows = rows_for_paths(self.draft, [self.path(n) for n in missing])  # its own paths: tuples of ints
            self._rows.update(zip(missing, rows))

    def beam(self, nodes: Sequence[int], weights: ArrayLike, k: int) -> tuple[IntArray, FloatArray]:
        """:func:`spec.draft.select_beam` over the rows of ``nodes``, in one draft call.

        A :class:`spec.draft.BeamDraft` selects on its side and no row is
        fetched; other drafts' rows are fetched (and kept) as by :meth:`fetch`.
        """
        got = beam_candidates(self.draft, [self.path(n) for n in nodes], weights, k)  # checks weights and k
        if got is not None:
            return got
        return select_beam(self._fetched(nodes), np.asarray(weights, dtype=np.float64), k)

    def top(self, nodes: Sequence[int], k: int) -> tuple[IntArray, FloatArray]:
        """:func:`spec.draft.select_top` of the rows of ``nodes``: each node's ``k`` most likely tokens.

        A :class:`spec.draft.TopDraft` ranks them on its side and no row is
        fetched; other drafts' rows are fetched (and kept) as by :meth:`fetch`.
        A ``k`` above the vocabulary asks for ``V`` (no row has more tokens): the
        answer is ``(len(nodes), min(k, V))``, and a ``b_max = 10**9`` costs no
        ``10**9``-wide arrays.
        """
        k = min(check_int("k", k, minimum=1), self.vocab)
        got = top_candidates(self.draft, [self.path(n) for n in nodes], k)
        if got is not None:
            return got
        return select_top(self._fetched(nodes), k)

    def _fetched(self, nodes: Sequence[int]) -> FloatArray:
        """The rows of ``nodes`` stacked ``(len(nodes), V)``, fetched first where missing (one draft call)."""
        self.fetch(nodes)
        return np.zeros((0, self.vocab)) if not nodes else np.stack([self._rows[n] for n in nodes])

    def set_row(self, node: int, row: FloatArray) -> None:
        """Record a row obtained elsewhere (a builder's scratch tree) for ``node``."""
        self._rows[node] = row

    def has_row(self, node: int) -> bool:
        return node in self._rows

    def row(self, node: int) -> FloatArray:
        """The draft row of ``node`` (fetched alone if no batch fetched it)."""
        if node not in self._rows:
            self.fetch([node])
        return self._rows[node]

    def tree(self) -> DraftTree:
        return DraftTree(tuple(self.parents), tuple(self.tokens), tuple(self.draws), dict(self.kept_rows), self.vocab)


def check_accepted(tree: DraftTree, accepted: object) -> int:
    """``accepted`` as an int in ``[0, tree.size]`` (draft tokens of ``tree`` kept), or ValueError naming it."""
    count = check_int("accepted", accepted, minimum=0)
    if count > tree.size:
        raise ValueError(f"accepted = {count} exceeds the tree's {tree.size} draft nodes")
    return count


def without(row: FloatArray, removed: Sequence[int]) -> FloatArray:
    """``row`` with the ``removed`` tokens set to 0 (the unnormalised law of the next
    draw without replacement; its sum is taken over the tokens left, not ``1 − Σ``)."""
    law = row.copy()
    law[list(removed)] = 0.0
    return law


def draw_without(sampler: Sampler, row: FloatArray, removed: Sequence[int], cdf: FloatArray) -> tuple[int, float] | None:
    """One token drawn from ``row`` without the ``removed`` tokens, and the mass of the tokens left (the
    law's normaliser); ``None`` when no token with ``q > 0`` is left.

    The law is ``without(row, removed)``.  ``cdf`` is ``np.cumsum(row)``, computed once for all of a
    node's draws.  A sampler other than an :class:`~spec.randomness.RngSampler` is handed the law itself,
    so exact enumeration sees it.  An ``RngSampler`` draws its one uniform and inverts the law's CDF
    segment by segment between the removed tokens (``cdf[t]`` minus the mass removed before ``t``): a
    search in ``cdf`` instead of three ``O(V)`` passes over a copy of the row (copy, sum, cumulative
    sum).  Its token is ``tmc.noise.categorical(without(row, removed), u)``'s up to the rounding of the
    two cumulative sums (tested); where rounding leaves the segment search in doubt, that call decides.
    The mass is ``cdf[-1]`` minus the removed tokens' ``q``, or the sum of the tokens left where that
    difference falls below 2^-20 of the row (cancellation: :data:`tmc.ordered_traversal.CANCELLED_MASS`).
    """
    total = float(cdf[-1])
    gone = sorted(set(removed))
    left = total - float(row[gone].sum()) if gone else total
    if left < CANCELLED_MASS * total:  # little or nothing left: the law itself, summed exactly
        law = without(row, gone)
        left = float(law.sum())
        return None if left <= 0.0 else (sampler.draw(law), left)
    if type(sampler) is not RngSampler:
        return sampler.draw(without(row, gone)), left
    u = float(sampler.rng.random())
    x = u * left
    lo, before = 0, 0.0  # the segment [lo, r) between removed tokens, and the mass removed before it
    for r in (*gone, row.shape[0]):
        if r > lo and float(cdf[r - 1]) - before > x:
            t = lo + int(np.searchsorted(cdf[lo:r], x + before, side="right"))
            if t < r and row[t] > 0.0:
                return t, left
            break
        if r < row.shape[0]:
            before += float(row[r])
            lo = r + 1
    return categorical(without(row, gone), u), left


def check_draw(name: str, value: object, allowed: Sequence[Draw]) -> Draw:
    """``value`` parsed as a :class:`Draw` that is one of ``allowed``."""
    kind = Draw.parse(value, name)
    if kind not in allowed:
        raise ValueError(f"{name} must be one of {[d.value for d in allowed]}, got {kind.value!r}")
    return kind


def _number(name: str, value: object) -> float:
    """``value`` as a ``float``: a real number or its text (``"0.4"``, as a command line gives it), not
    ``True`` / ``False`` or ``None`` (``ValueError`` naming it)."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            raise ValueError(f"{name} must be a number, got {value!r}") from None
    if isinstance(value, bool | np.bool_) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a number, got {value!r}")
    return float(value)


def check_positive(name: str, value: object, *, zero: bool = False) -> float:
    """A finite number ``> 0`` (``>= 0`` with ``zero``), as a ``float``; ``ValueError`` naming the parameter."""
    x = _number(name, value)
    if not (math.isfinite(x) and (x >= 0.0 if zero else x > 0.0)):
        raise ValueError(f"{name} must be a finite number {'>=' if zero else '>'} 0, got {value!r}")
    return x


def check_prob(name: str, value: object, *, low_open: bool = True, high_closed: bool = True) -> float:
    """A number in ``(0, 1]`` (or as the flags say), as a ``float``; ``ValueError`` naming the parameter."""
    x = _number(name, value)
    ok_low = x > 0.0 if low_open else x >= 0.0
    ok_high = x <= 1.0 if high_closed else x < 1.0
    if not (np.isfinite(x) and ok_low and ok_high):
        lo = "(0" if low_open else "[0"
        hi = "1]" if high_closed else "1)"
        raise ValueError(f"{name} must be in {lo}, {hi}, got {value!r}")
    return x
