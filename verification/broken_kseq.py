"""A deliberately BIASED K-SEQ: the division factor fixed to ``ρ = 1``.

Notation (DESIGN.md §3): ``p`` is the target, ``q`` the draft.  This is
:mod:`tmc.kseq` with one thing changed, through its ``rho_rule`` hook: every
i.i.d. node uses ``ρ = 1`` instead of SpecTr's ``ρ*`` — plain SpecInfer-style
acceptance ``min(1, p(x_i) / q(x_i))`` for each of the ``k`` drafts, followed
by K-SEQ's residual ``p − min(q, p) · c`` with
``c = (1 − (1 − β)^k) / β`` (clipped at 0, renormalised).  It is the natural
mistake of skipping the ``ρ`` search: with ``k ≥ 2`` drafts the accepted
token then has law ``min(q, p) · c``, and ``c > 1`` pushes that above ``p``
wherever ``q ≥ p`` (unless ``β = 1``).  The residual cannot take that
surplus back, so the output over-represents tokens the draft over-proposes.

For ``k = 1`` (``c = 1``) the rule is SpS and lossless, so every chain is
unaffected; the smallest biased case is one node with two i.i.d. drafts over
two tokens (``tests/tmc/test_kseq.py`` pins it).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from tmc.kseq import kseq_kernel, kseq_sample
from tmc.multidraft import DraftTree

FloatArray = NDArray[np.float64]


def rho_one(p_row: FloatArray, q_row: FloatArray, k: int) -> float:
    """The BIASED rule: no division factor at all."""
    return 1.0


def broken_kseq_kernel(tree: DraftTree, p_rows: ArrayLike) -> FloatArray:
    """Exact ``(N + 1, V)`` output law of K-SEQ with ``ρ = 1`` (BIASED for ``k ≥ 2``)."""
    return kseq_kernel(tree, p_rows, rho_rule=rho_one)


def broken_kseq_sample(tree: DraftTree, p_rows: ArrayLike, rng: np.random.Generator | int) -> list[int]:
    """One step of K-SEQ with ``ρ = 1``; noise layout as :func:`tmc.kseq.kseq_sample`."""
    return kseq_sample(tree, p_rows, rng, rho_rule=rho_one)
