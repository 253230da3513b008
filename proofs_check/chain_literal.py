"""Literal exact references for the chain verifiers, and float rows made exact.

Notation (DESIGN.md §3): ``q`` is the draft (the paper's ``P_ref``), ``p``
the target (``P``); ``ref`` the drafted tokens, ``q[i] = q(. | ref[:i])``
(n rows), ``p[i] = p(. | ref[:i])`` (n + 1 rows).  Each function returns the
kernel ``K`` ((n + 1) rows of V): ``K[k][b]`` is the probability that the step
outputs ``ref[:k] + [b]``.

These follow the papers line by line in exact ``fractions.Fraction`` (or
60-digit ``decimal.Decimal``) arithmetic, with none of the log-space tricks
of :mod:`tmc.chain`, so the float kernels can be compared with them:

* :func:`sps_literal` - SpS as the chain of TMC paper eq. (1) couplings;
* :func:`asps_literal` - TMC paper Algorithm 1, rescaling the whole ``P_N``
  matrix at every step and asserting ``sum(P_N) == 1`` exactly each step;
* :func:`block_literal` - block verification by enumerating all ``2^n``
  outcomes of the stop tests and taking the backward scan's ``tau``.

They are the one home of the chain references: the ``tmc kernels`` check
compares them with the App. B.1 neighbour recursion of
:mod:`proofs_check.neighbour` (a tree-shaped statement of the same
verifiers), and the tests of :mod:`tmc.chain` import them from here.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from decimal import Decimal, localcontext
from fractions import Fraction
from itertools import product
from typing import TypeVar

Num = TypeVar("Num", Fraction, Decimal)  # exact, or high precision


def rational_rows(rows: Iterable[Iterable[float]]) -> list[list[Fraction]]:
    """Float rows as exact rationals (the floats' binary values), renormalised to sum to exactly 1."""
    out = []
    for row in rows:
        fr = [Fraction(float(x)) for x in row]
        total = sum(fr, Fraction(0))
        out.append([x / total for x in fr])
    return out


def decimal_rows(rows: Iterable[Iterable[float]], digits: int = 60) -> list[list[Decimal]]:
    """Float rows as Decimals, renormalised to sum to 1 within ``10**-digits``.

    Exact rationals become too slow on chains of 64; 60 significant digits
    are far beyond float64 and keep the reference independent of it.
    """
    with localcontext() as ctx:
        ctx.prec = digits
        out = []
        for row in rows:
            dec = [Decimal(float(x)) for x in row]
            total = sum(dec, Decimal(0))
            out.append([+(x / total) for x in dec])
    return out


def simplest_row(row: Iterable[float], max_denominator: int = 1000) -> tuple[Fraction, ...]:
    """The rationals a hand-written float row stands for, e.g. 0.3 -> 3/10 and 1/3 -> 1/3.

    Each entry is the simplest fraction with denominator ``<= max_denominator``
    that lies within ``2**-52`` of the float (its rounding error), and the
    row must sum to exactly 1; ValueError otherwise (the row is not a short
    decimal or simple fraction, and :func:`rational_rows` is the conversion).
    """
    floats = [float(x) for x in row]
    out = tuple(Fraction(x).limit_denominator(max_denominator) for x in floats)
    for x, fr in zip(floats, out):
        if abs(float(fr) - x) > 2.0**-52 * max(1.0, abs(x)):
            raise ValueError(f"row: {x!r} is not a fraction with denominator <= {max_denominator}")
    if sum(out, Fraction(0)) != 1:
        raise ValueError(f"row: {[str(f) for f in out]} does not sum to exactly 1")
    return out


def to_float(kernel: Sequence[Sequence[Num]]) -> list[list[float]]:
    """A kernel as float rows."""
    return [[float(x) for x in row] for row in kernel]


def positive_part(x: Num) -> Num:
    """``(x)_+`` in the type of ``x``."""
    return x if x > 0 else x * 0


def sps_literal(
    ref: Sequence[int], q: Sequence[Sequence[Num]], p: Sequence[Sequence[Num]]
) -> list[list[Num]]:
    """SpS: at each drafted token the eq. (1) coupling, accept w.p. min(1, p/q), else a residual token."""
    n, vocab = len(ref), len(p[0])
    zero = p[0][0] * 0
    kernel = [[zero] * vocab for _ in range(n + 1)]
    reach = zero + 1  # probability that ref[:k] was accepted
    for k, a in enumerate(ref):
        acc = min(zero + 1, p[k][a] / q[k][a])
        res = [positive_part(p[k][z] - q[k][z]) for z in range(vocab)]
        total = sum(res, zero)
        if acc < 1:
            kernel[k] = [reach * (1 - acc) * r / total for r in res]
        reach *= acc
    kernel[n] = [reach * x for x in p[n]]
    return kernel


def asps_literal(
    ref: Sequence[int], q: Sequence[Sequence[Num]], p: Sequence[Sequence[Num]]
) -> list[list[Num]]:
    """ASpS: TMC paper Algorithm 1, with the degenerate step's ``r = q`` of DESIGN.md §4."""
    n, vocab = len(ref), len(p[0])
    zero = p[0][0] * 0
    pn = [[zero] * vocab for _ in range(n)]  # Algorithm 1's P_N
    w = zero + 1  # P_N_s
    for i, a in enumerate(ref):
        if i:
            pn[i - 1][ref[i - 1]] = zero
        c1 = [positive_part(q[i][z] - w * p[i][z]) for z in range(vocab)]
        total = sum(c1, zero)
        scale = zero + 1 if total == 0 else (c1[a] / total) / q[i][a]
        pn = [[scale * x for x in row] for row in pn]
        pn[i] = [scale * positive_part(w * p[i][z] - q[i][z]) for z in range(vocab)]
        pn[i][a] = min(zero + 1, w * p[i][a] / q[i][a])
        w = pn[i][a]
        if isinstance(w, Fraction):
            assert sum((sum(row, zero) for row in pn), zero) == 1
    kernel = [row[:] for row in pn] + [[w * x for x in p[n]]]
    if n:
        kernel[n - 1][ref[n - 1]] = zero
    return kernel


def block_literal(
    ref: Sequence[int], q: Sequence[Sequence[Num]], p: Sequence[Sequence[Num]]
) -> list[list[Num]]:
    """Block verification: every outcome of the stop tests, ``tau`` the last one that fires."""
    n, vocab = len(ref), len(p[0])
    zero = p[0][0] * 0
    weights = [zero + 1]
    for i, y in enumerate(ref):
        weights.append(min(zero + 1, weights[-1] * p[i][y] / q[i][y]))
    residuals = [[positive_part(weights[i] * p[i][z] - q[i][z]) for z in range(vocab)] for i in range(n)]
    stop = [zero + 1]
    for i in range(1, n):
        h = sum(residuals[i], zero)
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
        total = sum(final, zero)
        for z in range(vocab):
            kernel[tau][z] += prob * final[z] / total
    return kernel
