"""Audit cases: draft/target toy models of one cell, and the hypothesis strategy that draws them.

Notation (DESIGN.md §3): ``p`` is the target, ``q`` the draft.  A *case* is a
toy draft/target pair (:class:`tmc.toy.ToyModel`) for one cell of the search
space (:mod:`verification.audit.space`: vocabulary, draft shape, draw kind).

Rows: every case is one of three layouts, in shrinking order: one ``(q, p)``
row pair *shared* by every prefix; one pair *per depth*; one pair *per prefix*
(only while that is at most :data:`PER_PREFIX_MAX_ROWS` prefixes, so long
chains and deep trees never ask hypothesis for hundreds of rows).  Rows are
small integer weights, normalised (:func:`verification.strategies.prob_rows`);
the relation between ``p`` and ``q`` is one of
:data:`verification.strategies.RELATIONS`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cached_property
from itertools import product

import numpy as np
from hypothesis import strategies as st
from numpy.typing import NDArray

from tmc.multidraft import Draw
from tmc.toy import Path, ToyModel
from verification.audit.space import Cell, Kind
from verification.strategies import RELATIONS, prob_rows, target_row

FloatArray = NDArray[np.float64]

PER_PREFIX_MAX_ROWS = 15  # the per-prefix layout only when the prefixes up to the draft depth are this few
MAX_WEIGHT = 4  # rows are integer weights 0..MAX_WEIGHT, normalised
LAYOUTS: tuple[str, ...] = ("shared", "per_depth", "per_prefix")  # shrinking order

def layouts_for(cell: Cell) -> tuple[str, ...]:
    """Row layouts drawn for a cell: per-prefix rows only while they are few."""
    prefixes = sum(cell.vocab**d for d in range(cell.depth + 1))
    return LAYOUTS if prefixes <= PER_PREFIX_MAX_ROWS else LAYOUTS[:2]


def prefixes_up_to(vocab: int, depth: int) -> list[Path]:
    """Every prefix of length ``0..depth``, shortest first."""
    return [pre for d in range(depth + 1) for pre in product(range(vocab), repeat=d)]


@dataclass(frozen=True)
class AuditCase:
    """One draft/target pair and draft shape the verifier is run on."""

    cell: Cell  # vocabulary, shape and draw kind
    model: ToyModel  # the draft q and target p rows
    relation: str  # how p was drawn from q (one of RELATIONS)
    layout: str  # "shared", "per_depth" or "per_prefix" (one of LAYOUTS)

    @property
    def kind(self) -> Kind:
        return self.cell.kind

    @property
    def widths(self) -> tuple[int, ...]:
        return self.cell.widths

    @property
    def draw(self) -> Draw | None:
        return self.cell.draw

    @property
    def vocab(self) -> int:
        return self.cell.vocab

    @property
    def length(self) -> int:
        """``L``: output length the completion law is compared at (draft depth + 1)."""
        return self.cell.depth + 1

    def describe(self) -> str:
        if self.cell.draw is None:
            shape = f"chain of {self.cell.depth} draft token(s)"
        else:
            shape = f"tree widths {list(self.widths)} drawn {self.cell.draw.value}"
        rows = {"shared": "one row pair for every prefix", "per_depth": "one row pair per depth",
                "per_prefix": "rows per prefix"}[self.layout]
        return f"vocab {self.vocab}, {shape}, target relation '{self.relation}', {rows}"

    @cached_property
    def digest(self) -> str:
        """Identity of the case (the rows the verifier can see, not how they were drawn).

        Used to cache verdicts and to seed the case's sampling noise.
        """
        h = hashlib.sha256(repr((self.cell.vocab, self.cell.widths, self.cell.draw)).encode())
        for pre in prefixes_up_to(self.vocab, self.cell.depth):
            if len(pre) < self.cell.depth:  # draft rows at the last depth are never used
                h.update(self.model.q(pre).tobytes())
            h.update(self.model.p(pre).tobytes())
        return h.hexdigest()

    def key(self) -> str:
        return self.digest

    def on(self, cell: Cell) -> AuditCase | None:
        """The same rows on another cell of the same vocabulary and draw kind; None where they cannot be.

        Rows shared by every prefix fit any depth; rows per depth or per prefix
        only the prefixes they were drawn for.
        """
        if (cell.vocab, cell.draw) != (self.vocab, self.draw):
            return None
        if cell == self.cell:
            return self
        try:
            for pre in prefixes_up_to(cell.vocab, cell.depth):
                self.model.q(pre)
                self.model.p(pre)
        except ValueError:  # no row for a prefix deeper than the rows drawn
            return None
        return AuditCase(cell, self.model, self.relation, self.layout)


@st.composite
def audit_cases(draw: st.DrawFn, *, cell: Cell) -> AuditCase:
    """A draft/target toy model for one cell; shrinks to the simplest rows.

    Draw order sets shrinking priority: relation, layout (shared before per
    depth before per prefix), then the rows (small integer weights).
    """
    relation = draw(st.sampled_from(RELATIONS))
    layout = draw(st.sampled_from(layouts_for(cell)))
    vocab, depth = cell.vocab, cell.depth

    def row_pair() -> tuple[FloatArray, FloatArray]:
        q = draw(prob_rows(vocab, tiny=relation == "tiny", max_weight=MAX_WEIGHT))
        return q, draw(target_row(relation, q, max_weight=MAX_WEIGHT))

    if layout == "shared":
        q, p = row_pair()
        model = ToyModel(vocab, {}, {}, q, p, name="audit-case")
    elif layout == "per_depth":
        pairs = [row_pair() for _ in range(depth + 1)]
        prefixes = prefixes_up_to(vocab, depth)
        model = ToyModel(vocab, {s: pairs[len(s)][0] for s in prefixes}, {s: pairs[len(s)][1] for s in prefixes},
                         name="audit-case")
    else:
        rows = {s: row_pair() for s in prefixes_up_to(vocab, depth)}
        model = ToyModel(vocab, {s: r[0] for s, r in rows.items()}, {s: r[1] for s, r in rows.items()},
                         name="audit-case")
    return AuditCase(cell, model, relation, layout)
