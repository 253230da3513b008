"""A deliberately BIASED Traversal Verification: the parent's acceptance value is not updated.

Notation (DESIGN.md §3): ``p`` is the target, ``q`` the draft.  Traversal
Verification (Weng et al., NeurIPS 2025; :mod:`tmc.traversal`) deletes a
rejected leaf and updates its parent in two places: the residual row
``r ← norm((a r − q)_+)`` and the acceptance value ``a ← h / (h + 1 − a)``.
This variant does the first and forgets the second — the parent keeps the
value ``a`` it had before its child was deleted.  It is the correct code with
one argument changed (``update_value=False`` of :func:`tmc.traversal_kernel`
and its samplers), not a copy of the algorithm, so the
bias found by the audit is the missing update and nothing else.

At the root ``a = 1`` both before and after a deletion, so one-level trees
are unaffected; the bias needs a deleted child below depth 1.  The smallest
case, found by exhaustive search over ``V = 2`` rows with weights in
quarters, is a two-token chain (:func:`smallest_biased_case`): completion
error 0.125; ``tests/tmc/test_traversal.py`` checks it.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from tmc.multidraft import Draw, DraftTree
from tmc.toy import ToyModel
from tmc.traversal import traversal_kernel, traversal_sample, traversal_sample_from_uniforms

FloatArray = NDArray[np.float64]


def broken_traversal_kernel(tree: DraftTree, p_rows: ArrayLike) -> FloatArray:
    """Exact ``(N + 1, V)`` output law of the BIASED variant (parent value not updated)."""
    return traversal_kernel(tree, p_rows, update_value=False)


def broken_traversal_sample_from_uniforms(tree: DraftTree, p_rows: ArrayLike, u: ArrayLike) -> list[int]:
    """One step of the BIASED variant driven by ``N + 1`` uniforms (layout of :mod:`tmc.traversal`)."""
    return traversal_sample_from_uniforms(tree, p_rows, u, update_value=False)


def broken_traversal_sample(tree: DraftTree, p_rows: ArrayLike, rng: np.random.Generator | int) -> list[int]:
    """One step of the BIASED variant.  ``rng`` is a ``numpy.random.Generator`` or an integer seed."""
    return traversal_sample(tree, p_rows, rng, update_value=False)


def smallest_biased_case() -> tuple[ToyModel, tuple[int, ...], Draw]:
    """``(model, shape, draw)`` of the smallest draft on which this variant is biased.

    ``V = 2``, shape ``[1, 1]`` (a chain of two draft tokens) drawn ``iid``:
    the draft is one-hot on token 1 at every prefix, so the draft is always
    ``1 1``; the target is ``(1/2, 1/2)`` at the root and one-hot on token 1
    after ``1`` (uniform elsewhere).  The correct traversal accepts ``1 1``
    with probability 1/2 (the leaf's value ``min(1, 1/2 · 1/1)``); after the
    leaf is rejected node ``1`` has ``(a r − q)_+ = 0``, so its value drops to
    0 and the root emits token 0: ``P(1 1 …) = P(0) = 1/2``, the target's law.
    With the value left at 1/2 the node accepts ``1`` half the time and emits
    token 1 after it, so the step outputs ``1 1 …`` with probability 3/4.
    Completion error (worst path of length 3): 0.125.
    """
    one = np.array([0.0, 1.0])
    half = np.array([0.5, 0.5])
    model = ToyModel(
        2, {(): one, (1,): one}, {(): half, (1,): one}, draft_default=half, target_default=half, name="broken-traversal-minimal"
    )
    return model, (1, 1), Draw.IID
