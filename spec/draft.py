"""The draft-model interface every tree builder uses (DESIGN.md §7).

A builder only ever asks the draft model one question: *the next-token rows
``q(· | context + path)`` for these node paths*, where a path is the tuple of
draft tokens from the tree's root (the current context) down to a node, ``()``
for the root itself.  Builders ask for a whole layer of the tree in one call,
so an LLM adapter can evaluate the layer in one batched forward pass; a toy
model answers from its explicit rows.  The builder never knows which it has.

Notation (DESIGN.md §3): ``q`` is the draft, ``p`` the target.  Rows returned
must be probability rows (the processed law the builder samples from: after
temperature / top-k / top-p in the LLM case); :func:`draft_rows` validates
them at the boundary so a broken model gives a ``ValueError``, not a wrong tree.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np
from numpy.typing import NDArray

from tmc.toy import Path, ToyModel
from tmc.validate import check_prob_rows

FloatArray = NDArray[np.float64]

__all__ = ["DraftModel", "HashedDraft", "ToyDraft", "draft_rows"]


@runtime_checkable
class DraftModel(Protocol):
    """What a builder needs: ``vocab`` and batched next-token rows for node paths."""

    @property
    def vocab(self) -> int:
        """Vocabulary size ``V``."""
        ...

    def rows(self, paths: Sequence[Path]) -> FloatArray:
        """``(len(paths), V)`` draft rows: row ``i`` is ``q(· | context + paths[i])``."""
        ...


def draft_rows(draft: DraftModel, paths: Sequence[Path]) -> FloatArray:
    """Ask ``draft`` for the rows of ``paths`` in one call; validate shape and values.

    Returns float64 rows renormalised to sum to exactly 1 (within rounding).
    ``ValueError`` names the path whose row is bad.
    """
    if not paths:
        return np.zeros((0, int(draft.vocab)))
    raw = draft.rows(list(paths))
    arr = np.asarray(raw, dtype=np.float64) if not isinstance(raw, np.ndarray) else raw.astype(np.float64, copy=False)
    if arr.shape != (len(paths), draft.vocab):
        raise ValueError(
            f"draft model returned rows of shape {arr.shape} for {len(paths)} paths; expected ({len(paths)}, {draft.vocab})"
        )
    try:
        return check_prob_rows("draft rows", arr)
    except ValueError:
        for path, row in zip(paths, arr):
            check_prob_rows(f"draft row for path {tuple(path)}", row[None, :])
        raise


@dataclass
class ToyDraft:
    """The draft side of a :class:`tmc.ToyModel` below a fixed ``prefix``, counting its calls.

    ``calls`` is the number of batched ``rows`` calls and ``evaluated`` the
    number of rows returned: tests use them to check that builders evaluate a
    whole layer per call.
    """

    model: ToyModel
    prefix: Path = ()
    calls: int = field(default=0, compare=False)
    evaluated: int = field(default=0, compare=False)

    @property
    def vocab(self) -> int:
        return self.model.vocab

    def rows(self, paths: Sequence[Path]) -> FloatArray:
        self.calls += 1
        self.evaluated += len(paths)
        base = tuple(self.prefix)
        return np.array([self.model.q(base + tuple(path)) for path in paths], dtype=np.float64).reshape(
            len(paths), self.model.vocab
        )


@dataclass
class HashedDraft:
    """A synthetic draft model: each path's row is a Dirichlet draw seeded by ``(seed, path)``.

    Rows differ from prefix to prefix and are reproducible without storing
    them, so builders can grow trees of thousands of nodes (benchmarks).
    Smaller ``concentration`` gives more peaked rows.
    """

    vocab_size: int
    seed: int = 0
    concentration: float = 0.3
    calls: int = field(default=0, compare=False)

    @property
    def vocab(self) -> int:
        return self.vocab_size

    def rows(self, paths: Sequence[Path]) -> FloatArray:
        self.calls += 1
        alpha = np.full(self.vocab_size, self.concentration)
        return np.array([np.random.default_rng((self.seed, *map(int, path))).dirichlet(alpha) for path in paths]).reshape(
            len(paths), self.vocab_size
        )
