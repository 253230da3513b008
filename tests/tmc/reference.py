"""Independent exact-rational reference implementations (tests only).

These follow the papers literally, in exact ``fractions.Fraction`` (or
60-digit ``decimal.Decimal``) arithmetic, with no numerical tricks, so the float64 kernels in :mod:`tmc.chain` can be checked
against them:

* :func:`sps_literal` — SpS as the chain of TMC paper eq. (1) couplings.
* :func:`asps_literal` — TMC paper Algorithm 1, rescaling the whole ``P_N``
  matrix at every step and asserting ``sum(P_N) == 1`` exactly each step.
* :func:`block_literal` — block verification by enumerating all ``2^n``
  outcomes of the stop tests and taking the backward scan's ``τ``.
"""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal, localcontext
from fractions import Fraction
from itertools import product
from typing import Any

Row = list[Any]  # Fraction (exact) or Decimal (high precision) entries


def rational_rows(rows: Sequence[Sequence[float]]) -> list[Row]:
    """Float rows as exact rationals, renormalised to sum to exactly 1."""
    out = []
    for row in rows:
        fr = [Fraction(float(x)) for x in row]
        total = sum(fr)
        out.append([x / total for x in fr])
    return out


def decimal_rows(rows: Sequence[Sequence[float]], digits: int = 60) -> list[Row]:
    """Float rows as Decimals, renormalised to sum to 1 within ``10**-digits``.

    Exact rationals become too slow on chains of 64; 60 significant digits
    are far beyond float64 and keep the reference independent of it.
    """
    with localcontext() as ctx:
        ctx.prec = digits
        out = []
        for row in rows:
            dec = [Decimal(float(x)) for x in row]
            total = sum(dec)
            out.append([+(x / total) for x in dec])
    return out


def to_float(kernel: list[Row]) -> list[list[float]]:
    return [[float(x) for x in row] for row in kernel]


def _pos(x: Any) -> Any:
    return x if x > 0 else x * 0


def _zero(rows: list[Row]) -> Any:
    return rows[0][0] * 0


def sps_literal(ref: Sequence[int], q: list[Row], p: list[Row]) -> list[Row]:
    n, vocab = len(ref), len(p[0])
    zero = _zero(p)
    kernel = [[zero] * vocab for _ in range(n + 1)]
    reach = zero + 1
    for k, a in enumerate(ref):
        acc = min(zero + 1, p[k][a] / q[k][a])
        res = [_pos(p[k][z] - q[k][z]) for z in range(vocab)]
        total = sum(res)
        if acc < 1:
            kernel[k] = [reach * (1 - acc) * r / total for r in res]
        reach *= acc
    kernel[n] = [reach * x for x in p[n]]
    return kernel


def asps_literal(ref: Sequence[int], q: list[Row], p: list[Row]) -> list[Row]:
    n, vocab = len(ref), len(p[0])
    zero = _zero(p)
    pn = [[zero] * vocab for _ in range(n)]  # Algorithm 1's P_N
    w = zero + 1  # P_N_s
    for i, a in enumerate(ref):
        if i:
            pn[i - 1][ref[i - 1]] = zero
        c1 = [_pos(q[i][z] - w * p[i][z]) for z in range(vocab)]
        if sum(c1) == 0:
            scale = zero + 1  # degenerate step: r = q (DESIGN.md §4)
        else:
            scale = (c1[a] / sum(c1)) / q[i][a]
        pn = [[scale * x for x in row] for row in pn]
        pn[i] = [scale * _pos(w * p[i][z] - q[i][z]) for z in range(vocab)]
        pn[i][a] = min(zero + 1, w * p[i][a] / q[i][a])
        w = pn[i][a]
        if isinstance(w, Fraction):
            assert sum(sum(row) for row in pn) == 1
    kernel = [row[:] for row in pn] + [[w * x for x in p[n]]]
    if n:
        kernel[n - 1][ref[n - 1]] = zero
    return kernel


def block_literal(ref: Sequence[int], q: list[Row], p: list[Row]) -> list[Row]:
    n, vocab = len(ref), len(p[0])
    zero = _zero(p)
    weights = [zero + 1]
    for i, y in enumerate(ref):
        weights.append(min(zero + 1, weights[-1] * p[i][y] / q[i][y]))
    residuals = [[_pos(weights[i] * p[i][z] - q[i][z]) for z in range(vocab)] for i in range(n)]
    stop = [zero + 1]
    for i in range(1, n):
        h = sum(residuals[i])
        denom = h + 1 - weights[i]
        stop.append(h / denom if denom else zero)
    stop.append(weights[n])
    kernel = [[zero] * vocab for _ in range(n + 1)]
    for outcome in product((False, True), repeat=n):  # outcome[i - 1]: stop test at i fires
        prob = zero + 1
        for i, fired in enumerate(outcome, start=1):
            prob *= stop[i] if fired else 1 - stop[i]
        tau = max((i for i, fired in enumerate(outcome, start=1) if fired), default=0)
        if prob == 0:
            continue
        final = p[n] if tau == n else residuals[tau]
        total = sum(final)
        for z in range(vocab):
            kernel[tau][z] += prob * final[z] / total
    return kernel
