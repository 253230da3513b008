"""SpecTr's K-SEQ verification for i.i.d. siblings, applied recursively down a draft tree.

Notation (DESIGN.md §3): ``p`` is the **target**, ``q`` the **draft**.  The
SpecTr paper writes the two the other way round (its ``p`` is the small
model and its ``q`` the large one); every formula below is in this
project's notation.

Reference: Sun, Suresh, Ro, Beirami, Jain, Yu, "SpecTr: Fast Speculative
Decoding via Optimal Transport" (NeurIPS 2023, arXiv:2310.15141), §4, the
draft-selection algorithm K-SEQ ("k-sequential selection").  The full text
of the paper could not be read here; the algorithm and the equation for
``ρ`` below were checked against a public restatement of the paper
(``mylittleriver/fairness-spec-decoding``, ``SpecTr.md``) and, above all, by
exact enumeration in ``tests/tmc/test_kseq.py``.  No equation or lemma
number is quoted because none could be confirmed.

**K-SEQ at one node.**  ``k`` drafts ``x_1..x_k`` drawn i.i.d. from ``q``;
a *division factor* ``ρ ∈ [1, k]``; ``β(ρ) = Σ_x min(q(x), p(x)/ρ)``.
For ``i = 1..k`` in order: accept ``x_i`` with probability
``min(1, p(x_i) / (ρ q(x_i)))`` and stop.  If no draft is accepted, emit
one token from the residual::

    p_res ∝ p − min(q, p/ρ) · c(ρ),     c(ρ) = (1 − (1 − β)^k) / β = Σ_{i<k} (1 − β)^i.

One draft is accepted *and equal to* ``x`` with probability
``min(q, p/ρ)(x)``, so the accepted token has law ``min(q, p/ρ) · c``
(total ``1 − (1 − β)^k``) and ``p_res`` is what ``p`` still needs.  It is
non-negative — the step is lossless — whenever ``c(ρ) ≤ ρ``, i.e. the
paper's validity condition ``1 − (1 − β(ρ))^k ≤ ρ β(ρ)``.

**The choice of ρ (the paper's prescription).**  SpecTr takes ``ρ*``, the
solution of ``1 − (1 − β(ρ))^k = ρ β(ρ)`` in ``[1, k]``.  The difference
``ρ β(ρ) − (1 − (1 − β(ρ))^k)`` is non-decreasing in ``ρ``
(``ρ β = Σ min(ρ q, p)`` grows, ``β`` shrinks), ``≤ 0`` at ``ρ = 1`` and
``≥ 0`` at ``ρ = k`` (Bernoulli), so the condition holds exactly on
``[ρ*, k]`` and ``ρ*`` is its smallest point; since the acceptance
``1 − (1 − β(ρ))^k`` falls as ``ρ`` grows, ``ρ*`` is also the best ``ρ``
meeting it.  (The condition is sufficient for ``p_res ≥ 0``, not
necessary: when the tokens with ``ρ q ≥ p`` all have ``p = 0``, ``p_res``
stays non-negative a little below ``ρ*`` — but there ``β`` is flat, so
the acceptance is the same; the tests check on a grid that no ``ρ < ρ*``
with ``p_res ≥ 0`` accepts more.)

:func:`kseq_rho` returns ``1`` when ``ρ = 1`` already meets the condition
(always for ``k = 1``, where K-SEQ *is* SpS, and for ``β ∈ {0, 1}``), and
otherwise bisects on ``[1, k]``, keeping the upper end feasible, until the
bracket is :data:`RHO_RTOL` relative wide: the returned ``ρ`` is feasible
(up to rounding, which the residual's clipping at 0 absorbs) and at most
``k · RHO_RTOL`` above ``ρ*``, which costs at most ``~k² · RHO_RTOL`` of
acceptance.  Each bisection step evaluates ``β`` in ``O(log V)`` from prefix
sums over the tokens sorted by ``p/q`` (``min(q, p/ρ) = p/ρ`` exactly where
``p/q < ρ``).  ``c`` is evaluated as ``−expm1(k log1p(−β)) / β``: no
cancellation for small ``β``, ``c = k`` at ``β = 0`` and exactly ``1`` for
``k = 1`` (so a width-1 tree gives SpS's ``norm((p − q)_+)`` bit for bit).
At ``ρ*`` the residual vanishes exactly on the tokens with ``ρ q ≥ p``
(there ``p_res = p (1 − c/ρ)`` and ``c = ρ``); the bisection leaves a
factor ``1 − c/ρ`` of order ``k² RHO_RTOL`` there, which is rounded to 0 so
that the residual never emits a token it excludes.

**Degenerate residual.**  ``p_res`` has mass ``(1 − β)^k``.  When the
computed residual has no mass left (``(1 − β)^k`` is 0 up to rounding,
e.g. ``p == q``), the no-acceptance event has probability 0 up to rounding
and any law keeps the step lossless; the rule here emits from ``p`` itself.

**In a tree.**  At an accepted node whose children were drawn i.i.d.
(``Draw.IID``) from ``q_rows[node]``, K-SEQ runs over the children in
order with ``p = p_rows[node]`` and ``k`` = the number of children; an
accepted child continues recursively into its own subtree (its subtree
was drawn from ``q`` after that child's token, independently of the
sibling test, so the argument repeats one level down), an accepted leaf
emits a bonus token from ``p`` there, and if no child is accepted one
token is drawn from ``p_res``.  **At a node whose children were drawn
``swor`` or ``topk`` K-SEQ does not apply** (its drafts are not i.i.d.):
that node is verified with the tree's recorded residual rule, exactly as
:func:`tmc.multidraft.multidraft_kernel` does there, through the same
shared functions (:func:`tmc.multidraft.proposal_laws`,
:func:`tmc.residual.acceptance_probability`, :func:`tmc.residual.residual`).
A tree drawn entirely ``swor`` or ``topk`` therefore gets the same kernel as
``multidraft_kernel``.  Each node's rule is a lossless one-node verifier for
how its children were drawn, so any mix of kinds stays lossless.

Arrays and noise: the same as :mod:`tmc.multidraft`.  ``p_rows`` is
``(N + 1, V)`` (row 0 the root, row ``i + 1`` after node ``i``'s path);
kernels are ``(N + 1, V)`` in the one indexing convention of the :mod:`tmc`
package docstring.  The sampler takes ``N + 1`` uniforms: ``u[i]`` is the
accept test of node ``i`` (each node is tested at most once) and ``u[N]``
draws the final residual or bonus token.

The division-factor rule is a keyword-only hook (``rho_rule``) of
:func:`kseq_kernel` and the samplers so that the audit's BIASED variant
(:mod:`verification.broken_kseq`, ``ρ = 1``) differs from this code in that
one place.

Cost per i.i.d. node: ``O(V log V)`` for one sort, ``O(B log V)`` for the
``B ≤ ~55`` bisection steps of ``ρ``, ``O(V)`` for the residual and ``O(1)``
per child; a swor / topk node costs what it costs in :mod:`tmc.multidraft`
(``O(k V)``).  The kernel visits each reachable node once (``O(N V log V)``
in all), the sampler only the nodes on its path (plus ``O(N V)`` input
validation).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from tmc.multidraft import ROOT, Draw, DraftTree, check_tree_p_rows, residual_node_rule, residual_walk_step
from tmc.noise import categorical, check_uniforms
from tmc.residual import acceptance_probability
from tmc.validate import as_rng, check_int, check_prob_row

FloatArray = NDArray[np.float64]

#: Relative width of the bisection bracket at which :func:`kseq_rho` stops.
RHO_RTOL = 2.0**-50

#: Relative slack of :func:`kseq_residual`'s check of a caller's ``rho`` (rounding only).
FEASIBLE_RTOL = 1e-12

#: Relative slack of the bisection's feasibility test (rounding only; :func:`_feasible`), which decides
#: SpecTr's condition as ``c(β) ≤ ρ (1 + slack)`` where ``ρβ ≤ 1/2`` and as ``(1 − β)^k ≥ 1 − ρβ − slack ·
#: scale`` elsewhere, both sides of the latter sums of positive parts (:func:`_condition_curve`).  Without
#: slack, where the condition holds with equality in the limit (large ``k``, p = (.5, .5), q = (.3, .7),
#: ρ* = 5/3), rounding failed it above ρ* and the bisection climbed towards ``k`` (1.98 at k = 1000, 1.6e7 at
#: k = 1e9).  With the first form alone, the slack on ``c ≈ 1`` was one on ``1 − ρβ``'s absolute value: for
#: a nearly one-hot ``p`` deciding on a target token of 1e-15 (q = (1, 0)) it accepted ρ = 1 where
#: ρ* = 1.0032, and the token came out at 1e-90.
SEARCH_RTOL = 8 * 2.0**-52

#: ``rho_rule(p_row, q_row, k)``: the division factor used at an i.i.d. node.
RhoRule = Callable[[FloatArray, FloatArray, int], float]


# ------------------------------------------------------------- one node


def _beta(p: FloatArray, q: FloatArray, rho: float) -> float:
    """``β(ρ) = Σ min(q, p/ρ)``: probability that one draft is accepted."""
    return float(np.minimum(q, p / rho).sum())


def _geometric(beta: float, k: int) -> float:
    """``c = (1 − (1 − β)^k) / β = Σ_{i<k} (1 − β)^i``: ``k`` at ``β = 0``, exactly 1 for ``k = 1``.

    ``expm1`` / ``log1p`` keep full relative accuracy for tiny ``β``.
    """
    if k == 1 or beta >= 1.0:
        return 1.0
    if beta <= 0.0:
        return float(k)
    return -math.expm1(k * math.log1p(-beta)) / beta


def _condition_curve(p: FloatArray, q: FloatArray) -> Callable[[float], tuple[float, float, float, float]]:
    """``ρ ↦ (β, 1 − β, 1 − ρβ, scale)`` in ``O(log V)`` per call after one sort, each a sum of positive parts.

    With the tokens of ``q > 0`` sorted by ``p/q`` and ``j`` of them below ``ρ``: ``β = Σ min(q, p/ρ) =
    Q_above + P_below/ρ``, ``1 − β = Σ (q − p/ρ)_+ = Q_below − P_below/ρ`` and ``1 − ρβ = Σ (p − ρq)_+ =
    P_above − ρ Q_above + P_zero`` (``P_zero``: the target mass where ``q = 0``).  ``scale = P_above +
    ρ Q_above + P_zero`` bounds the rounding of the latter.
    """
    on = q > 0.0
    with np.errstate(over="ignore"):  # p / q past the float range (a subnormal q) is +inf, as it rounds
        ratio = p[on] / q[on]
    order = np.argsort(ratio, kind="stable")
    ratios = ratio[order].tolist()
    p_on, q_on = p[on][order], q[on][order]
    p_below = np.concatenate([[0.0], np.cumsum(p_on)]).tolist()
    q_below = np.concatenate([[0.0], np.cumsum(q_on)]).tolist()
    p_above = np.concatenate([np.cumsum(p_on[::-1])[::-1], [0.0]]).tolist()
    q_above = np.concatenate([np.cumsum(q_on[::-1])[::-1], [0.0]]).tolist()
    p_zero = float(np.cumsum(np.where(on, 0.0, p))[-1])  # left to right, as the torch ports add it

    def curve(rho: float) -> tuple[float, float, float, float]:
        j = bisect.bisect_left(ratios, rho)
        miss = max(0.0, q_below[j] - p_below[j] / rho)
        gap = max(0.0, p_above[j] - rho * q_above[j] + p_zero)
        return q_above[j] + p_below[j] / rho, miss, gap, p_above[j] + rho * q_above[j] + p_zero

    return curve


def _feasible(beta: float, miss: float, gap: float, scale: float, k: int, rho: float) -> bool:
    """SpecTr's validity condition ``1 − (1 − β)^k ≤ ρβ`` (``miss = 1 − β``, ``gap = 1 − ρβ``), decided on
    whichever pair of its two equivalent forms holds the small numbers, up to :data:`SEARCH_RTOL`: where
    ``ρβ ≤ 1/2``, ``c(β) ≤ ρ`` (both sides of order ``ρβ``); else ``(1 − β)^k ≥ 1 − ρβ``, with the slack on
    ``gap``'s terms (``scale``).  The first alone misjudged a nearly one-hot ``p``, the second alone a
    small ``β`` (where ``gap ≈ 1`` holds the decision in its last digits)."""
    if rho * beta <= 0.5:
        return beta <= 0.0 or _geometric(beta, k) <= rho * (1.0 + SEARCH_RTOL)
    reach = math.exp(k * math.log(miss)) if miss > 0.0 else 0.0  # (1 − β)^k
    return reach >= gap - SEARCH_RTOL * scale


def _rho(p: FloatArray, q: FloatArray, k: int) -> float:
    """``ρ*`` of the module doc on validated rows (upper end of the bisection bracket)."""
    if k == 1:  # c = 1: ρ = 1 is feasible whatever β is (K-SEQ is SpS), so skip the sort
        return 1.0
    return _bisect_rho(_condition_curve(p, q), k)


def _bisect_rho(curve: Callable[[float], tuple[float, float, float, float]], k: int) -> float:
    """The bisection of :func:`_rho` on a :func:`_condition_curve` (also the torch host port's, on its own
    curve of the same sums), ``k >= 2``."""
    if _feasible(*curve(1.0), k, 1.0):
        return 1.0
    lo, hi = 1.0, float(k)  # invariant: lo infeasible, hi feasible
    while hi - lo > RHO_RTOL * hi:
        mid = 0.5 * (lo + hi)
        if not lo < mid < hi:
            break
        if _feasible(*curve(mid), k, mid):
            hi = mid
        else:
            lo = mid
    return hi


def _residual(p: FloatArray, q: FloatArray, k: int, rho: float) -> FloatArray:
    """Normalised ``p_res`` (module doc), clipped at 0, ``p`` in the degenerate case."""
    c = _geometric(_beta(p, q, rho), k)
    # On the capped tokens (min(q, p/ρ) = p/ρ) p_res is p (1 − c/ρ), exactly 0 at
    # ρ* > 1 where c = ρ.  The bisection's ρ lies up to RHO_RTOL above ρ*, which
    # leaves a factor of at most ~(1 + k²/2) RHO_RTOL there: it is rounded to 0,
    # so a token that K-SEQ's residual excludes is never emitted.
    factor = 1.0 - c / rho
    if factor <= (k * k + 8) * RHO_RTOL:
        factor = 0.0
    capped = q * rho >= p
    res = np.where(capped, p * factor, p - q * c)
    res = np.maximum(res, 0.0)
    total = float(res.sum())
    if total > 0.0:
        out: FloatArray = res / total
        return out
    return p.copy()


@dataclass(frozen=True)
class NodeRule:
    """How one accepted node is verified: a test per child, then a final law."""

    accept: tuple[float, ...]  # probability of accepting child i given children < i were rejected
    final: FloatArray  # (V,) law of the emitted token when no child is accepted (p at a leaf)


def kseq_node_rule(tree: DraftTree, node: int, p_row: FloatArray, *, rho_rule: RhoRule = _rho) -> NodeRule:
    """K-SEQ at an i.i.d. node, the recorded residual rule elsewhere (module doc).

    Deterministic given the tree and the validated target row ``p_row`` of
    ``node``: the batch sampler builds its plan from it.
    """
    kids = tree.children(node)
    if not kids:
        return NodeRule((), p_row)
    if tree.draws[kids[0]] != Draw.IID:
        return _residual_rule(tree, node, p_row)
    q_row = tree.q_rows[node]
    k = len(kids)
    rho = rho_rule(p_row, q_row, k)
    toks = [tree.tokens[kid] for kid in kids]
    accept = tuple(acceptance_probability(float(p_row[t]), rho * float(q_row[t])) for t in toks)
    return NodeRule(accept, _residual(p_row, q_row, k, rho))


def _residual_rule(tree: DraftTree, node: int, p_row: FloatArray) -> NodeRule:
    """The multi-draft residual walk of :mod:`tmc.multidraft` at one node (swor / topk children)."""
    return NodeRule(*residual_node_rule(tree, node, p_row))


# ------------------------------------------------------- public node API


#: The most i.i.d. drafts :func:`kseq_rho` takes: every int up to it is exact as a float.
MAX_DRAFTS = 2**53


def _check_pair(p_row: ArrayLike, q_row: ArrayLike, k: object) -> tuple[FloatArray, FloatArray, int]:
    p, q = check_prob_row("p_row", p_row), check_prob_row("q_row", q_row)
    if p.shape != q.shape:
        raise ValueError(f"p_row has {p.shape[0]} tokens but q_row has {q.shape[0]}")
    k = check_int("k", k, minimum=1)
    if k > MAX_DRAFTS:  # the bisection reads k as a float
        got = str(k) if k < 10**20 else f"an integer of {len(str(k))} digits"
        raise ValueError(f"k must be at most {MAX_DRAFTS} (2**53, exact as a float), got {got}")
    return p, q, k


def kseq_rho(p_row: ArrayLike, q_row: ArrayLike, k: int) -> float:
    """SpecTr's division factor ``ρ* ∈ [1, k]`` for ``k`` i.i.d. drafts from ``q_row`` (module doc).

    The smallest ``ρ`` with ``1 − (1 − β(ρ))^k ≤ ρ β(ρ)``, found by
    bisection to relative width :data:`RHO_RTOL`; the value returned
    satisfies the condition up to rounding.
    """
    p, q, kk = _check_pair(p_row, q_row, k)
    return _rho(p, q, kk)


def kseq_residual(p_row: ArrayLike, q_row: ArrayLike, k: int, rho: float | None = None) -> FloatArray:
    """Normalised residual ``p_res`` of K-SEQ with ``k`` drafts (``ρ*`` unless ``rho`` is given).

    A given ``rho`` must be finite, ``≥ 1`` and satisfy the validity
    condition, else ``ValueError`` (it would leave ``p − min(q, p/ρ) c``
    negative).  Degenerate case (no residual mass): ``p`` (module doc).
    """
    p, q, kk = _check_pair(p_row, q_row, k)
    if rho is None:
        return _residual(p, q, kk, _rho(p, q, kk))
    if isinstance(rho, bool) or not isinstance(rho, (int, float)) or not math.isfinite(rho) or rho < 1.0:
        raise ValueError(f"rho must be a finite number >= 1, got {rho!r}")
    if _geometric(_beta(p, q, float(rho)), kk) > float(rho) * (1.0 + FEASIBLE_RTOL):
        raise ValueError(f"rho = {rho!r} violates 1 - (1 - beta)^k <= rho * beta: p_res would be negative")
    return _residual(p, q, kk, float(rho))


def kseq_acceptance(p_row: ArrayLike, q_row: ArrayLike, k: int) -> float:
    """Probability ``1 − (1 − β(ρ*))^k`` that K-SEQ accepts one of ``k`` i.i.d. drafts."""
    p, q, kk = _check_pair(p_row, q_row, k)
    beta = _beta(p, q, _rho(p, q, kk))
    return beta * _geometric(beta, kk)


# --------------------------------------------------------- tree verifier


def _kernel(tree: DraftTree, p_rows: ArrayLike, *, rho_rule: RhoRule = _rho) -> FloatArray:
    """:func:`kseq_kernel` with the division-factor rule as a hook (see ``verification.broken_kseq``)."""
    p = check_tree_p_rows(tree, p_rows)
    kernel = np.zeros_like(p)
    stack: list[tuple[int, float]] = [(ROOT, 1.0)]  # (accepted node, probability of reaching it)
    while stack:
        node, reach = stack.pop()
        rule = kseq_node_rule(tree, node, p[node + 1], rho_rule=rho_rule)
        for kid, accept in zip(tree.children(node), rule.accept):
            if accept > 0.0:
                stack.append((kid, reach * accept))
            reach *= 1.0 - accept
            if reach == 0.0:
                break
        kernel[node + 1] += reach * rule.final
    return kernel


def _accepted_child(
    tree: DraftTree, node: int, p_row: FloatArray, uu: FloatArray, rho_rule: RhoRule
) -> int | FloatArray:
    """The walk at one accepted node: the child whose test passes, or the law to emit from.

    The same tests and the same final law as :func:`kseq_node_rule`, computed
    only as far as the walk goes: a residual is formed only when a later test
    or the emission reads it, so a step whose tests pass skips them.
    """
    kids = tree.children(node)
    if not kids or tree.draws[kids[0]] != Draw.IID:  # a leaf, or the residual walk of :func:`residual_node_rule`
        return residual_walk_step(tree, node, p_row, uu)
    q_row = tree.q_rows[node]
    rho = rho_rule(p_row, q_row, len(kids))
    for kid in kids:
        tok = tree.tokens[kid]
        if uu[kid] < acceptance_probability(float(p_row[tok]), rho * float(q_row[tok])):
            return kid
    return _residual(p_row, q_row, len(kids), rho)


def _sample(tree: DraftTree, p_rows: ArrayLike, u: ArrayLike, *, rho_rule: RhoRule = _rho) -> list[int]:
    """:func:`kseq_sample_from_uniforms` with the division-factor hook."""
    p = check_tree_p_rows(tree, p_rows)
    uu = check_uniforms("u", u, tree.size + 1)
    node = ROOT
    while True:
        got = _accepted_child(tree, node, p[node + 1], uu, rho_rule)
        if not isinstance(got, int):
            return list(tree.path(node)) + [categorical(got, float(uu[tree.size]))]
        node = got


def kseq_kernel(tree: DraftTree, p_rows: ArrayLike, *, rho_rule: RhoRule = _rho) -> FloatArray:
    """Exact output law ``(N + 1, V)`` of K-SEQ tree verification (module doc).

    Same shape and indexing as :func:`tmc.multidraft.multidraft_kernel`.
    ``rho_rule`` picks the division factor at each i.i.d. node; anything but
    the default is the audit's BIASED example (``verification.broken_kseq``).
    """
    return _kernel(tree, p_rows, rho_rule=rho_rule)


def kseq_sample_from_uniforms(
    tree: DraftTree, p_rows: ArrayLike, u: ArrayLike, *, rho_rule: RhoRule = _rho
) -> list[int]:
    """One K-SEQ step driven by ``N + 1`` uniforms: ``u[i]`` tests node ``i``, ``u[N]`` the last token."""
    return _sample(tree, p_rows, u, rho_rule=rho_rule)


def kseq_sample(
    tree: DraftTree, p_rows: ArrayLike, rng: np.random.Generator | int, *, rho_rule: RhoRule = _rho
) -> list[int]:
    """One K-SEQ step: the emitted tokens (accepted path plus one token).

    ``rng`` is a ``numpy.random.Generator`` or an integer seed.
    """
    if not isinstance(tree, DraftTree):
        raise ValueError(f"tree must be a DraftTree, got {type(tree).__name__}")
    return _sample(tree, p_rows, as_rng(rng).random(tree.size + 1), rho_rule=rho_rule)
