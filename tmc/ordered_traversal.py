"""Ratio-ordered Traversal Verification (research verifier, issue 10).

Notation (DESIGN.md §3): ``p`` is the target, ``q`` the draft.  This is
:mod:`tmc.traversal` (Weng et al. 2025) with one change: at a node whose
children were drawn ``iid`` or ``swor``, the children are visited not in
draw order but in **decreasing order of the ratio** ``p(y) / q(y)`` of
their tokens under the node's own rows (ties to the lower token id), and
each child's proposal law is the law of *that position of the sorted
tuple* given the earlier positions — an order statistic of the draw, not
``q``.  Children drawn ``topk`` keep their order, so trees drawn ``topk``
and chains get exactly :func:`tmc.traversal_kernel`'s output.

On every depth ≥ 2 tree measured here (V = 3, 20 random models per shape,
shapes [2,1], [1,2], [2,2], [2,1,1]) it is closer to the LP limit
(:func:`tmc.lp.lp_limit`) than Traversal, residual multi-draft and K-SEQ on
average — most of all for ``swor`` drafts.  It is lossless by the argument
below; ``tests/tmc/test_ordered_traversal.py`` checks the exact completion
identity (:func:`tmc.laws.output_law`) over every enumerated draft tree.

**Why it is lossless.**  The proof of :mod:`tmc.traversal` needs one thing
of the sibling order: the law used for child ``i`` is the law child ``i``'s
token has *given everything the verifier conditioned on before it* (the
earlier visited siblings and their subtrees), and the child's subtree is
drawn from the draft after that token.  Sorting the drawn tuple by a key
that depends only on the node's rows (known before the children were
drawn) turns the draw into another random tuple — the sorted one — whose
``i``-th element has the conditional law computed below given the first
``i − 1``; the subtrees stay attached to their tokens (for i.i.d. draws,
equal tokens have i.i.d. subtrees, so which copy goes where is immaterial).
The traversal recursion with these laws is therefore an instance of the
same induction: each child claims ``min(q_i, μ)`` and the state after a
deletion, ``(μ − q_i)_+ / R``, does not depend on the deleted token.  Why it
helps: the child most likely to be accepted is verified first with a law
concentrated on high-ratio tokens, so it claims more of the node's target
mass in one go.

**The sorted laws.**  Let ``B(y)`` be the draft mass of the tokens ranked
after ``y``.

* ``iid``, ``k`` children.  First: ``P(y) = (q(y) + B(y))^k − B(y)^k``.  After
  a prefix ending in ``w`` that contains ``w`` ``c`` times, the ``M = k −
  (#prefix ranked before w)`` draws not yet pinned are i.i.d. from ``q``
  restricted to ``{w} ∪ after(w)`` and conditioned on ``n_w ≥ c``, with
  ``π = q(w) / (q(w) + B(w))``: the next is ``w`` with probability
  ``P(Bin(M, π) ≥ c + 1) / P(Bin(M, π) ≥ c)``, and ``z`` after ``w`` with
  probability ``P(Bin(M, π) = c) / P(Bin(M, π) ≥ c)`` times the law of the
  best of ``M − c`` i.i.d. draws from ``q`` restricted to ``after(w)``.
  ``(a + b)^m − b^m`` is evaluated as ``a Σ_j (a + b)^j b^{m−1−j}`` (no
  cancellation).  ``O(V log V + k V)`` per node.
* ``swor``, 2 children.  ``P({y, z}) = q(y) q(z) (1/(1 − q(y)) + 1/(1 − q(z)))``;
  first ``y`` with ``Σ_{z after y} P({y, z})`` (suffix sums, ``O(V)``);
  second ``z`` given ``y`` proportional to ``P({y, z})`` over ``z`` after ``y``.
* ``swor``, ``k ≥ 3`` children: by enumerating the ordered ``k``-tuples of
  the support — exact, but ``O(|supp q|^k)``: a toy-scale rule only, refused
  (``ValueError``) beyond :data:`MAX_SWOR_TUPLES` tuples.

Arrays and kernel indexing follow :mod:`tmc.multidraft` exactly: ``p_rows``
is ``(N + 1, V)``; the kernel is ``(N + 1, V)`` with row 0 "nothing accepted"
and row ``i + 1`` "the path to node ``i`` accepted", column the one emitted
token.  It is :mod:`tmc.traversal` run with the children rule
:func:`ratio_ordered_children` (visiting order and sorted laws), so the exact
kernel, the samplers (noise layout of :mod:`tmc.traversal`) and the batch
sampler are Traversal's own code.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import permutations
from math import comb, frexp, fsum, ldexp, perm

import numpy as np
from numpy.typing import ArrayLike, NDArray

from tmc.multidraft import Draw, DraftTree
from tmc.traversal import recorded_children, traversal_kernel, traversal_sample, traversal_sample_from_uniforms

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]

#: Largest number of ordered ``k``-tuples :func:`swor_sorted_law` enumerates for one law (``k ≥ 3``
#: children drawn without replacement); more raises ``ValueError`` instead of running for hours.
MAX_SWOR_TUPLES = 1_000_000

#: Below this the mass left after some draws, ``1 − Σ drawn``, has lost too many bits to the subtraction
#: (or reached 0 while tokens with ``q > 0`` are left, as after a token with ``q = 1 − 1e-20``):
#: :func:`swor_sorted_law` then sums the tokens left instead (:func:`mass_left`).
CANCELLED_MASS = 2.0**-20


def mass_left(q: Sequence[float] | FloatArray, support: Sequence[int], drawn: Sequence[int], left: float) -> float:
    """The draft mass not yet drawn: ``left`` (``1 − Σ drawn``, as a loop subtracts it) when it is at least
    :data:`CANCELLED_MASS`, else the exactly rounded sum of the ``support`` tokens not in ``drawn``."""
    if left >= CANCELLED_MASS:
        return left
    return fsum(float(q[t]) for t in support if t not in drawn)


def ratio_order(p_row: FloatArray, q_row: FloatArray) -> list[int]:
    """Token ids by decreasing ``p / q`` (tokens with ``q = 0`` last), ties to the lower id.

    The key of token ``t`` is ``−p(t)/q(t)`` (``+inf`` when ``q(t) = 0``),
    sorted stably, so equal keys keep the lower id first.  A ratio past the
    float64 range (a subnormal ``q(t)``) is ``+inf`` as the division rounds
    it, so such tokens come first, among themselves by id.
    """
    order: list[int] = _ratio_order_array(p_row, q_row).tolist()
    return order


def _ratio_order_array(p_row: FloatArray, q_row: FloatArray) -> IntArray:
    p = np.asarray(p_row, dtype=np.float64)
    q = np.asarray(q_row, dtype=np.float64)
    drawn = q > 0.0
    keys = np.full(len(q), np.inf)
    with np.errstate(over="ignore"):  # p / q past the float range rounds to inf (ratio_order's doc)
        keys[drawn] = -(p[drawn] / q[drawn])
    return np.argsort(keys, kind="stable")


def _ranked_after(order: IntArray, token: int) -> IntArray:
    """The tokens ranked after ``token`` in ``order``, in rank order."""
    below: IntArray = order[int(np.flatnonzero(order == token)[0]) + 1 :]
    return below


def _mass_after(q_row: FloatArray, order: IntArray) -> FloatArray:
    """``B(y)``: draft mass of the tokens ranked after ``y``, summed from the last rank up.

    ``np.cumsum`` adds in sequence, so ``B`` of the token at rank ``i`` is
    ``(...((q_{V−1} + q_{V−2}) + ...) + q_{i+1})`` with ``q_j`` the mass at
    rank ``j``: the additions of a loop from the end, in its order.
    """
    tail = np.cumsum(np.asarray(q_row, dtype=np.float64)[order[::-1]])  # tail[j]: mass of the last j + 1 ranks
    after = np.zeros(len(q_row))
    after[order[-2::-1]] = tail[:-1]  # rank V − 2 gets the last rank's mass, ..., rank 0 all but its own
    return after


def _best_of(a: FloatArray, b: FloatArray, m: int) -> FloatArray:
    """``(a + b)^m − b^m`` elementwise as ``a Σ_j (a + b)^j b^{m−1−j}``."""
    total = np.zeros_like(a)
    for j in range(m):
        total += (a + b) ** j * b ** (m - 1 - j)
    out: FloatArray = a * total
    return out


def _binom_terms(m: int, pi: float, rest: float, c: int) -> list[float]:
    """``C(m, j) π^(j − c) (1 − π)^(m − j)`` for ``j = c .. m``: ``P(Bin(m, π) = j) / π^c``, with ``rest = 1 − π``
    given as computed by the caller (not by subtraction).

    Their sum is ``P(Bin(m, π) ≥ c) / π^c``; the laws need only ratios of such sums, and without the
    common ``π^c`` no sum underflows (``π = 1e-310`` and ``c = 2`` made ``P(≥ c)`` 0: a ZeroDivisionError).
    """
    return [comb(m, j) * pi ** (j - c) * rest ** (m - j) for j in range(c, m + 1)]


def _one_minus(q_row: FloatArray) -> FloatArray:
    """``1 − q(t)`` for every token, as the mass of the other tokens where ``q(t) > 1/2``.

    ``1.0 − q(t)`` loses all of a mass of 1e-17 beside ``q(t) = 1.0`` (and its digits well before that),
    where the sum of the other entries keeps it; below 1/2 the subtraction is accurate.  At most one
    token of a row lies above 1/2.
    """
    out: FloatArray = 1.0 - q_row
    big = int(np.argmax(q_row))
    if q_row[big] > 0.5:
        out[big] = float(q_row[:big].sum() + q_row[big + 1 :].sum())
    return out


def _normalised(row: FloatArray) -> FloatArray:
    out: FloatArray = row / row.sum()
    return out


def iid_sorted_law(q_row: FloatArray, order: Sequence[int] | IntArray, k: int, prefix: list[int]) -> FloatArray:
    """Law of the next element of ``k`` i.i.d. draws sorted by ``order``, given the sorted ``prefix``."""
    order = np.asarray(order, dtype=np.int64)
    after = _mass_after(q_row, order)
    if not prefix:
        out = _best_of(q_row, after, k)
        return _normalised(out)
    w = prefix[-1]
    c = prefix.count(w)
    m = k - (len(prefix) - c)
    # π and 1 − π as shares of q(w) + B(w): 1.0 − π cancels to 0 when B(w) is below q(w)'s rounding
    pi, rest_pi = float(q_row[w] / (q_row[w] + after[w])), float(after[w] / (q_row[w] + after[w]))
    terms = _binom_terms(m, pi, rest_pi, c)
    at_least = float(sum(terms))  # P(Bin(m, π) ≥ c) / π^c
    out = np.zeros(len(q_row))
    out[w] = float(sum(terms[1:])) / at_least
    rest = float(after[w])
    if rest > 0.0:
        below = _ranked_after(order, w)
        exact = terms[0] / at_least  # P(Bin(m, π) = c) / P(Bin(m, π) ≥ c)
        out[below] = exact * _best_of(q_row[below] / rest, after[below] / rest, m - c)
    return _normalised(out)


def swor_sorted_law(q_row: FloatArray, order: Sequence[int] | IntArray, k: int, prefix: list[int]) -> FloatArray:
    """Law of the next element of ``k`` draws without replacement sorted by ``order``, given the sorted ``prefix``."""
    order = np.asarray(order, dtype=np.int64)
    vocab = len(q_row)
    out = np.zeros(vocab)
    if k == 2:
        second = _one_minus(q_row)  # mass left for the second draw
        inv = np.where(second > 0.0, 1.0 / np.maximum(second, 1e-300), 0.0)
        if not prefix:
            after = _mass_after(q_row, order)
            after_inv = _mass_after(q_row * inv, order)
            out = q_row * (after * inv + after_inv)
        else:
            y = prefix[0]
            below = _ranked_after(order, y)
            out[below] = q_row[below] * (inv[y] + inv[below])
        return _normalised(out)
    support = [t for t in range(vocab) if q_row[t] > 0.0]
    if perm(len(support), k) > MAX_SWOR_TUPLES:
        raise ValueError(
            f"{k} children drawn 'swor' from a draft row with {len(support)} possible tokens: the law would "
            f"enumerate {perm(len(support), k)} ordered tuples (limit MAX_SWOR_TUPLES = {MAX_SWOR_TUPLES})"
        )
    out[:] = swor_next_weights(q_row.tolist(), support, order.tolist(), k, prefix)
    return _normalised(out)


def swor_next_weights(q: Sequence[float], support: Sequence[int], order: Sequence[int], k: int,
                      prefix: Sequence[int]) -> list[float]:
    """Unnormalised law (one common factor) of the next of ``k`` draws without replacement from ``q`` sorted by
    ``order``, given the sorted ``prefix``: every ordered tuple of ``support`` tokens enumerated.

    Each tuple's probability is a product of ``k`` factors ``q(t) / left``, kept as a mantissa and a power of
    two (``math.frexp``): with tiny ``q`` the product underflowed to 0 for every tuple left by a prefix
    (``q = [1, 1e-200, 1e-200, 1e-200]``, ``k = 3``, prefix ``[1]``), and the law was 0 / 0.  The weights are
    scaled by the largest tuple's power of two.
    """
    rank = {t: r for r, t in enumerate(order)}
    i = len(prefix)
    want = list(prefix)
    terms: list[tuple[int, float, int]] = []  # (next token, mantissa, exponent)
    for combo in permutations(support, k):
        ranked = sorted(combo, key=rank.__getitem__)
        if ranked[:i] != want:
            continue
        mant, expo, left = 1.0, 0, 1.0
        for j, t in enumerate(combo):
            left = mass_left(q, support, combo[:j], left)
            # q(t) / left as (m_t / m_left) 2^(e_t − e_left): a ratio of mantissas in (1/2, 2) neither underflows
            # (q(t) subnormal) nor overflows (left subnormal once the large tokens are drawn)
            m_t, e_t = frexp(q[t])
            m_left, e_left = frexp(left)
            mant, e = frexp(mant * (m_t / m_left))
            expo += e + e_t - e_left
            left -= q[t]
        terms.append((ranked[i], mant, expo))
    weights = [0.0] * len(q)
    if terms:
        top = max(e for _, _, e in terms)
        for tok, mant, expo in terms:
            weights[tok] += ldexp(mant, expo - top)
    return weights


def ratio_ordered_children(tree: DraftTree, node: int, p_row: FloatArray) -> tuple[Sequence[int], Sequence[FloatArray]]:
    """The :data:`tmc.traversal.ChildrenRule` of this module: sorted children and their sorted laws."""
    kids = list(tree.children(node))
    kinds = {tree.draws[k] for k in kids}
    if len(kids) < 2 or kinds == {Draw.TOPK}:
        return recorded_children(tree, node, p_row)
    q_row = tree.q_rows[node]
    order = _ratio_order_array(p_row, q_row)
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))  # rank[t]: position of token t in the order
    kids.sort(key=lambda c: int(rank[tree.tokens[c]]))
    toks = [tree.tokens[c] for c in kids]
    sorted_law = iid_sorted_law if kinds == {Draw.IID} else swor_sorted_law
    return kids, [sorted_law(q_row, order, len(kids), toks[:i]) for i in range(len(kids))]


def ordered_traversal_kernel(tree: DraftTree, p_rows: ArrayLike) -> FloatArray:
    """Exact output law ``(N + 1, V)`` of ratio-ordered Traversal Verification (indexing of :mod:`tmc`)."""
    return traversal_kernel(tree, p_rows, children=ratio_ordered_children)


def ordered_traversal_sample_from_uniforms(tree: DraftTree, p_rows: ArrayLike, u: ArrayLike) -> list[int]:
    """One step driven by ``N + 1`` uniforms (noise layout of :mod:`tmc.traversal`)."""
    return traversal_sample_from_uniforms(tree, p_rows, u, children=ratio_ordered_children)


def ordered_traversal_sample(tree: DraftTree, p_rows: ArrayLike, rng: np.random.Generator | int) -> list[int]:
    """One step: the accepted path plus one token.  ``rng`` is a ``Generator`` or an integer seed."""
    return traversal_sample(tree, p_rows, rng, children=ratio_ordered_children)
