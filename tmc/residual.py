"""The residual rule: what is left of the target after a draft token is rejected.

Notation (DESIGN.md §3): ``r`` is the current residual target (``p`` at the
start of a step), ``law`` the proposal the rejected draft token was drawn from
(the draft ``q``, ``q`` renormalised without earlier siblings, or a point mass).
Speculative sampling (Leviathan et al. 2023; TMC paper eq. (1)) accepts a token
``x ~ law`` with probability ``min(1, r(x) / law(x))``; after a rejection the
output must come from

    r' = norm((r − law)_+).

At a token both rows hold above 1/2 the difference ``r − law`` is that of
the rests (:func:`row_difference`), and the accept test reads ``r(x) ≥
law(x)`` from it too (:func:`acceptance_at`), so a token the residual would
re-emit is never the one rejected.

**Degenerate case.**  When ``(r − law)_+`` has no mass left (``r ≤ law``
everywhere after rounding) the rejection itself had probability zero up to
rounding, so any law keeps the step lossless; the rule here returns ``r`` with
the rejected token removed (renormalised), or ``r`` itself if that token held
all of ``r``'s mass.  Either way the output stays a valid draw and never
re-emits a token that was just rejected when another one is possible.

This module is the single statement of the rule: SpS (:mod:`tmc.chain`), tree
residual verification (:mod:`tmc.multidraft`), the vectorised batch samplers
and the biased examples of the audit all call :func:`residual`.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]


def row_difference(r: FloatArray, law: FloatArray) -> FloatArray:
    """``r − law`` for two probability rows, exact at a token where both exceed 1/2.

    There the two entries stand for ``1 − (the rest of their row)``, and the difference of the rests is the
    difference: ``Σ_{t ≠ m} (law_t − r_t)``.  ``1.0 − 1.0`` is 0 where ``q = [1e-17, 0, 1.0]`` and
    ``p = [1e-30, 1e-30, 1.0]`` hold ``1 − 1e-17`` and ``1 − 2e-30`` at token 2, and the residual then went
    to token 1 (total variation about 1 from the exact law of that draft).  At most one token of a row
    exceeds 1/2; elsewhere the plain difference is as accurate.
    """
    diff: FloatArray = r - law
    m = int(np.argmax(r))
    if r[m] > 0.5 and law[m] > 0.5:
        diff[m] = 0.0
        diff[m] = -float(diff.sum())
    return diff


def difference_at(r: FloatArray, law: FloatArray, tok: int) -> float:
    """``r(tok) − law(tok)``: :func:`row_difference`'s entry at ``tok``, without forming the row unless needed."""
    r_tok, law_tok = float(r[tok]), float(law[tok])
    if r_tok > 0.5 and law_tok > 0.5:
        return float(row_difference(r, law)[tok])
    return r_tok - law_tok


def acceptance_probability(r_x: float, law_x: float) -> float:
    """``min(1, r(x) / law(x))`` for a draft token ``x``.

    A token with ``law(x) = 0`` cannot have been drawn from ``law``; valid
    inputs never reach that case, but a verifier paired with the wrong proposal
    law (an audited BIASED example) can: it then counts as ``1`` when
    ``r(x) > 0`` and ``0`` otherwise (IEEE ``x / 0 = inf`` clamped, ``0 / 0``
    failing every ``u < ratio`` test), without a division warning.
    """
    if r_x <= 0.0:
        return 0.0
    if law_x <= 0.0:
        return 1.0
    return min(1.0, r_x / law_x)


def acceptance_at(r: FloatArray, law: FloatArray, tok: int) -> float:
    """:func:`acceptance_probability` of the draft token ``tok`` of ``law`` against ``r``, and ``1`` wherever
    :func:`difference_at` finds ``r(tok) ≥ law(tok)``.

    The accept test then agrees with :func:`residual`: the residual keeps mass at ``tok`` only where that
    difference is positive, and there the token is never rejected.  The two can disagree where both rows hold
    ``tok`` above 1/2, the entries rounded apart from their rests: ``r = [9.999999999989997e-13,
    0.9999999999989999]`` beside ``law = [9.999999999990001e-13, 0.999999999999]`` has ``r(1) < law(1)`` as
    floats but ``r(1) > law(1)`` by the rests; the ratio accepted token 1 with ``1 - 1.1e-16`` and the residual
    then emitted token 1, the token just rejected."""
    r_x, law_x = float(r[tok]), float(law[tok])
    if r_x > 0.5 and law_x > 0.5 and difference_at(r, law, tok) >= 0.0:
        return 1.0
    return acceptance_probability(r_x, law_x)


def residual(r: FloatArray, law: FloatArray, rejected: int) -> FloatArray:
    """``norm((r − law)_+)``, with the degenerate case of the module doc.

    ``r`` and ``law`` are ``(V,)`` probability rows; ``rejected`` is the token
    that was just rejected.  Returns a new ``(V,)`` row summing to 1.
    """
    res = np.maximum(row_difference(r, law), 0.0)
    total = float(res.sum())
    if total > 0.0:
        out: FloatArray = res / total
        return out
    rest = r.copy()
    rest[rejected] = 0.0
    left = float(rest.sum())
    if left > 0.0:
        kept: FloatArray = rest / left
        return kept
    return r.copy()
