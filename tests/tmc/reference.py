"""Exact references for the tmc.chain tests.

The literal chain references (SpS by eq. (1), ASpS by Algorithm 1, block
verification by enumerating every stop-test outcome) and the float-to-exact
row conversions live in :mod:`proofs_check.chain_literal`, their one home;
they are re-exported here, next to the test-only helpers below.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import product
from typing import Any

from proofs_check.chain_literal import (
    asps_literal,
    block_literal,
    decimal_rows,
    rational_rows,
    sps_literal,
    to_float,
)

__all__ = [
    "asps_literal",
    "block_literal",
    "decimal_rows",
    "literal_expected_length",
    "rational_model",
    "rational_rows",
    "sps_literal",
    "to_float",
]

Row = list[Any]  # Fraction (exact) or Decimal (high precision) entries


def rational_model(model: Any, prefix: Sequence[int] = ()) -> tuple[Any, Any]:
    """Exact-rational row functions ``(q_row, p_row)`` of a toy model (tests only).

    ``q_row(path)`` and ``p_row(path)`` return ``q(· | prefix + path)`` and
    ``p(· | prefix + path)`` as :func:`rational_rows` does: each float row
    read exactly and renormalised to sum to exactly 1.  Only the model's
    ``q`` and ``p`` accessors are used, never its verifiers.
    """
    cache: dict[tuple[str, tuple[int, ...]], Row] = {}

    def row(which: str, path: Sequence[int]) -> Row:
        key = (which, tuple(prefix) + tuple(int(t) for t in path))
        if key not in cache:
            getter = model.q if which == "q" else model.p
            cache[key] = rational_rows([getter(key[1])])[0]
        return cache[key]

    return (lambda path: row("q", path)), (lambda path: row("p", path))


def literal_expected_length(q_row: Any, p_row: Any, vocab: int, n: int, literal: Any) -> Any:
    """Exact ``E[len]`` of one step of ``literal`` over every draft chain of length ``n``.

    Enumerates all ``V^n`` draft chains ``ref`` with their draft probability
    ``Q(ref) = Π_i q(ref[i] | ref[:i])`` (zero-weight chains skipped), runs the
    literal verifier on each and sums ``Q(ref) · Σ_k (k + 1) · K[k].sum()``.
    ``q_row``/``p_row`` map a path to an exact row (see :func:`rational_model`).
    """
    zero = p_row(())[0] * 0
    total = zero
    for ref in product(range(vocab), repeat=n):
        weight = zero + 1
        for i, a in enumerate(ref):
            weight *= q_row(ref[:i])[a]
        if weight == 0:
            continue
        q = [q_row(ref[:i]) for i in range(n)]
        p = [p_row(ref[:i]) for i in range(n + 1)]
        kernel = literal(ref, q, p)
        total += weight * sum((k + 1) * sum(row) for k, row in enumerate(kernel))
    return total
