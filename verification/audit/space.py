"""The audit's search space: draft shapes, the reach rule and the cells (no hypothesis here).

Notation (DESIGN.md §3): ``p`` is the target, ``q`` the draft.  A *cell* is
one vocabulary size, one draft shape (children per node at each depth; a chain
of ``n`` tokens is ``(1,) * n``) and, for trees, one draw kind.

**Reach** (what :func:`search_cells` covers with the defaults):

* chains of 1, 2, 3, 4 draft tokens on vocabularies 1..``max_vocab``
  (default 3), and of 5, 6 tokens on vocabularies 1..2;
* trees (1,), (2,), (1,1), (3,), (1,2), (1,1,1), (2,1) on vocabularies
  1..``max_vocab``, and (2,2), (2,1,1) on vocabularies 1..2, each with every
  draw kind the verifier is paired with (iid, swor, topk).

The rule behind the two vocabulary limits (:func:`vocab_limit`): a draft of at
most ``LARGE_DRAFT_NODES − 1 = 4`` nodes is searched up to ``max_vocab``, a
larger one up to ``LARGE_DRAFT_VOCAB = 2``, which keeps every exact evaluation
under ~100 drafts.  Depth-3 shapes and nodes with several children below
depth 1 ((1,2), (2,2), (2,1,1)) are in reach, so a rule that is wrong only
below the root is reachable.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from tmc.drafts import check_widths
from tmc.multidraft import ALL_DRAWS, Draw
from tmc.validate import check_int

Kind = Literal["chain", "tree"]

#: Draft chain lengths the audit searches (the suite's own table is ``suite.SUITE_CHAIN_LENGTHS``).
AUDIT_CHAIN_LENGTHS: tuple[int, ...] = (1, 2, 3, 4, 5, 6)
#: Tree shapes the audit searches, in visiting order: fewest draft nodes, then shallowest.
AUDIT_TREE_SHAPES: tuple[tuple[int, ...], ...] = (
    (1,), (2,), (1, 1), (3,), (1, 2), (1, 1, 1), (2, 1), (2, 2), (2, 1, 1),
)
LARGE_DRAFT_NODES = 5  # drafts with at least this many nodes ...
LARGE_DRAFT_VOCAB = 2  # ... are searched on vocabularies up to this size only
MAX_DRAFT_NODES = 8  # largest draft a configuration may ask for (exhaustive enumeration)


def draft_nodes(widths: Sequence[int]) -> int:
    """Number of nodes of a full tree with ``widths[d]`` children per node at depth ``d``."""
    return sum(math.prod(widths[: d + 1]) for d in range(len(widths)))


def shape_order(widths: Sequence[int]) -> tuple[int, int, tuple[int, ...]]:
    """Sort key of shapes: fewest draft nodes, then shallowest."""
    return draft_nodes(widths), len(widths), tuple(widths)


def vocab_limit(widths: Sequence[int], max_vocab: int) -> int:
    """Largest vocabulary searched for a shape (the reach rule of the module doc)."""
    return min(max_vocab, LARGE_DRAFT_VOCAB) if draft_nodes(widths) >= LARGE_DRAFT_NODES else max_vocab


def check_chain_lengths(name: str, lengths: object) -> tuple[int, ...]:
    """Chain lengths ``1..MAX_DRAFT_NODES``, at least one; ``ValueError`` naming ``name``."""
    if not isinstance(lengths, (tuple, list)) or not lengths:
        raise ValueError(f"{name} must be a non-empty sequence of chain lengths, got {lengths!r}")
    out = tuple(check_int(f"{name}[{i}]", n, minimum=1) for i, n in enumerate(lengths))
    if max(out) > MAX_DRAFT_NODES:
        raise ValueError(f"{name} must be at most {MAX_DRAFT_NODES} (exhaustive enumeration), got {max(out)}")
    return tuple(dict.fromkeys(out))


def check_tree_shapes(name: str, shapes: object) -> tuple[tuple[int, ...], ...]:
    """Tree shapes of at most ``MAX_DRAFT_NODES`` nodes, at least one; ``ValueError`` naming ``name``."""
    if not isinstance(shapes, (tuple, list)) or not shapes:
        raise ValueError(f"{name} must be a non-empty sequence of tree shapes, got {shapes!r}")
    out: list[tuple[int, ...]] = []
    for i, widths in enumerate(shapes):
        try:
            shape = check_widths(widths)
        except ValueError as err:
            raise ValueError(f"{name}[{i}]: {err}") from None
        if not shape or draft_nodes(shape) > MAX_DRAFT_NODES:
            raise ValueError(f"{name}[{i}] must have 1..{MAX_DRAFT_NODES} draft nodes, got {list(shape)}")
        out.append(shape)
    return tuple(dict.fromkeys(out))


@dataclass(frozen=True)
class Cell:
    """One part of the search space: vocabulary size, draft shape and draw kind."""

    vocab: int  # vocabulary size V
    widths: tuple[int, ...]  # children per node at each depth; a chain of n is (1,) * n
    draw: Draw | None  # tree drafts: how children are drawn; None for chains

    @property
    def kind(self) -> Kind:
        return "chain" if self.draw is None else "tree"

    @property
    def depth(self) -> int:
        return len(self.widths)

    def shape_label(self) -> str:
        """``n=3`` for a chain, ``[2, 1]`` for a tree."""
        return f"n={self.depth}" if self.draw is None else str(list(self.widths))


def search_cells(
    kind: Kind,
    *,
    max_vocab: int = 3,
    chain_lengths: Sequence[int] = AUDIT_CHAIN_LENGTHS,
    tree_shapes: Sequence[tuple[int, ...]] = AUDIT_TREE_SHAPES,
    draws: Sequence[Draw] = ALL_DRAWS,
) -> list[Cell]:
    """The cells in search order: smallest vocabulary, then fewest draft nodes, then shallowest.

    A shape appears only up to its :func:`vocab_limit`.
    """
    if kind == "chain":
        shapes = [(1,) * n for n in chain_lengths]
        kinds: Sequence[Draw | None] = (None,)
    else:
        shapes = [tuple(w) for w in tree_shapes]
        kinds = tuple(draws)
    shapes.sort(key=shape_order)
    return [
        Cell(v, shape, d)
        for v in range(1, max_vocab + 1)
        for shape in shapes
        if v <= vocab_limit(shape, max_vocab)
        for d in kinds
    ]


def reach_lines(kind: Kind, cells: Sequence[Cell]) -> list[str]:
    """The reach of a list of cells in words: the shapes grouped by the vocabularies searched."""
    vocabs: dict[tuple[int, ...], list[int]] = {}
    draws: list[str] = []
    for cell in cells:
        seen = vocabs.setdefault(cell.widths, [])
        if cell.vocab not in seen:
            seen.append(cell.vocab)
        if cell.draw is not None and cell.draw.value not in draws:
            draws.append(cell.draw.value)
    by_range: dict[str, list[str]] = {}
    for widths, vs in vocabs.items():
        label = f"n={len(widths)}" if kind == "chain" else str(list(widths))
        by_range.setdefault(f"V {min(vs)}..{max(vs)}", []).append(label)
    what = "chains" if kind == "chain" else f"trees drawn {'/'.join(draws)}"
    return [f"{what} {', '.join(shapes)} on {span}" for span, shapes in by_range.items()]
