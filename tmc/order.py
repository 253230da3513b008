"""The sub-distribution order and distances between tree distributions.

``P1 <= P2`` (P1 is a sub-distribution of P2) is the order in which every
lossless speculative sampler stands below the target ``p``; the draft ``q``
plays no role here.  Implements, from the TMC paper's Appendix A.1:

* Def A.11 sub-distribution, checked on child conditionals:
  :func:`check_sub_distribution`;
* Thm A.16 the equivalent product form, checked on path probabilities and
  point masses only, as an independent second implementation:
  :func:`check_product_form`;
* the pointwise distance ``dist_s(P1, P2) = P2(s) - P1(s)`` that follows
  Thm A.12: :func:`pointwise_distance`;
* total variation ``max_U |P1^(U) - P2^(U)|`` (used in Thm A.32):
  :func:`total_variation`.

Both checks return an :class:`OrderResult` with a :class:`Witness` (node,
children, ratios and a sentence) at the node where the relation fails worst.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from tmc.laws import total_variation as mass_tv
from tmc.tree import Path, TreeDistribution


@dataclass(frozen=True)
class Witness:
    """Where and why ``P1 <= P2`` fails."""

    node: Path  # the node s (in both supports) where the condition fails worst
    children: tuple[int, ...]  # the child tokens involved (empty: the termination clause)
    ratios: tuple[float, ...]  # ratio(s) P1(a|s)/P2(a|s) found (inf where P2's is 0)
    reason: str  # a sentence saying what is wrong at the node


@dataclass(frozen=True)
class OrderResult:
    """Outcome of a sub-distribution check."""

    holds: bool  # True when P1 <= P2 within the tolerance
    witness: Witness | None  # the worst failing node; None when the relation holds
    worst_violation: float  # largest per-node violation (0 when exact; see each checker)


def _require_same_space(p1: TreeDistribution, p2: TreeDistribution) -> None:
    if p1.space != p2.space:
        raise ValueError("P1 and P2 must live on the same TreeSpace (equal spaces)")


def _ratio(num: float, den: float) -> float:
    return num / den if den > 0.0 else math.inf


# -- Def A.11 ---------------------------------------------------------------


def _conditional_violation(r1: dict[int, float], r2: dict[int, float]) -> float:
    """Largest residual ``|r1(a) - c r2(a)|`` at the one candidate c, clipped to [0, 1].

    If ``r1 = c r2`` holds then ``sum r1 = c sum r2``, so ``c = sum r1 / sum r2``
    is the only candidate: the residual is 0 exactly when Def A.11 holds at
    the node, and otherwise measures the failure in units of probability.
    """
    s1, s2 = math.fsum(r1.values()), math.fsum(r2.values())
    c = min(s1 / s2, 1.0) if s2 > 0.0 else 0.0
    kids = set(r1) | set(r2)
    return max((abs(r1.get(a, 0.0) - c * r2.get(a, 0.0)) for a in kids), default=0.0)


def _conditional_witness(
    node: Path, r1: dict[int, float], r2: dict[int, float], tol: float
) -> Witness:
    """Explain why ``r1`` is not ``c r2`` with c in [0, 1] at ``node``."""
    strays = [a for a, p in r1.items() if r2.get(a, 0.0) == 0.0 and p > tol]
    if strays:
        a = max(strays, key=lambda b: r1[b])
        return Witness(
            node, (a,), (math.inf,),
            f"at node {node}: child {a} is possible under P1 (P1(a|s) = {r1[a]:.6g}) "
            "but not under P2",
        )
    ratios = {a: r1.get(a, 0.0) / p for a, p in r2.items()}
    c_total = math.fsum(r1.values()) / math.fsum(r2.values())
    spread = max(abs(r1.get(a, 0.0) - c_total * p) for a, p in r2.items())
    if spread > tol:
        lo, hi = min(ratios, key=ratios.__getitem__), max(ratios, key=ratios.__getitem__)
        return Witness(
            node, (lo, hi), (ratios[lo], ratios[hi]),
            f"at node {node}: P1(.|s) is not proportional to P2(.|s): "
            f"P1(a|s)/P2(a|s) is {ratios[lo]:.6g} for child {lo} "
            f"but {ratios[hi]:.6g} for child {hi}",
        )
    return Witness(
        node, tuple(sorted(r2)), (c_total,),
        f"at node {node}: P1(.|s) = c P2(.|s) with c = {c_total:.6g} > 1: "
        f"P1 terminates at s less often than P2 (P1(tau|s) = {1 - sum(r1.values()):.6g} "
        f"< P2(tau|s) = {1 - sum(r2.values()):.6g})",
    )


def check_sub_distribution(
    p1: TreeDistribution, p2: TreeDistribution, tol: float = 1e-12
) -> OrderResult:
    """Def A.11: is ``P1 <= P2``?

    For every s in supp(P1) and supp(P2) there must be c in [0, 1] with
    P1(a|s) = c P2(a|s) for all children a.  ``worst_violation`` is the
    largest per-node residual ``max_a |P1(a|s) - c P2(a|s)|`` at the natural
    c (see :func:`_conditional_violation`); the relation holds when it is
    at most ``tol``.
    """
    _require_same_space(p1, p2)
    worst, worst_node = 0.0, None
    for s in p1.support():
        if p2.path_prob(s) == 0.0:
            continue  # Def A.11 only constrains nodes in both supports
        v = _conditional_violation(p1.child_probs(s), p2.child_probs(s))
        if v > worst:
            worst, worst_node = v, s
    if worst <= tol or worst_node is None:
        return OrderResult(True, None, worst)
    r1, r2 = p1.child_probs(worst_node), p2.child_probs(worst_node)
    return OrderResult(False, _conditional_witness(worst_node, r1, r2, tol), worst)


# -- Thm A.16 ---------------------------------------------------------------


def _extension_probs(p: TreeDistribution, node: Path, kids: tuple[int, ...]) -> NDArray[np.float64]:
    """``[P(node + a) for a in kids]``, shape (len(kids),)."""
    return np.array([p.path_prob(node + (a,)) for a in kids], dtype=np.float64)


def _product_violation(
    p1: TreeDistribution, p2: TreeDistribution, node: Path
) -> tuple[float, float, NDArray[np.float64]]:
    """(cross-product violation, termination violation, |cross - cross^T|) at ``node``.

    Cross products are divided by P1(s) P2(s) so the tolerance is on the
    scale of conditional probabilities, as in :func:`check_sub_distribution`.
    """
    kids = p1.space.children(node)
    x = _extension_probs(p1, node, kids) / p1.path_prob(node)  # (k,)
    y = _extension_probs(p2, node, kids) / p2.path_prob(node)  # (k,)
    cross = np.outer(x, y)  # (k, k): P1(s+a) P2(s+b), normalised
    gap = np.abs(cross - cross.T)
    t1 = p1.point_mass(node) / p1.path_prob(node)
    t2 = p2.point_mass(node) / p2.path_prob(node)
    return (float(gap.max()) if gap.size else 0.0), max(0.0, t2 - t1), gap


def _product_witness(p1: TreeDistribution, p2: TreeDistribution, node: Path) -> Witness:
    cross_v, term_v, gap = _product_violation(p1, p2, node)
    kids = p1.space.children(node)
    if cross_v >= term_v:
        i, j = np.unravel_index(int(np.argmax(gap)), gap.shape)
        a, b = kids[int(i)], kids[int(j)]
        pa1, pb1 = p1.path_prob(node + (a,)), p1.path_prob(node + (b,))
        pa2, pb2 = p2.path_prob(node + (a,)), p2.path_prob(node + (b,))
        return Witness(
            node, (a, b), (_ratio(pa1, pa2), _ratio(pb1, pb2)),
            f"at node {node}: P1(s+{a}) P2(s+{b}) = {pa1 * pb2:.6g} differs from "
            f"P1(s+{b}) P2(s+{a}) = {pb1 * pa2:.6g}",
        )
    t1 = p1.point_mass(node) / p1.path_prob(node)
    t2 = p2.point_mass(node) / p2.path_prob(node)
    return Witness(
        node, (), (_ratio(1.0 - t1, 1.0 - t2),),
        f"at node {node}: P1(tau|s) = {t1:.6g} < P2(tau|s) = {t2:.6g}, so the child scale c > 1",
    )


def check_product_form(
    p1: TreeDistribution, p2: TreeDistribution, tol: float = 1e-12
) -> OrderResult:
    """Thm A.16: ``P1 <= P2`` iff, for all s and children a, b,
    P1(s+a) P2(s+b) = P1(s+b) P2(s+a), and P1(tau|s) >= P2(tau|s) on both supports.

    Uses path probabilities and point masses only.  Nodes outside either
    support satisfy the first clause trivially (all extension probabilities
    of that distribution are 0), so only common support nodes are visited.
    ``worst_violation`` is the largest of the normalised cross-product gap
    and ``P2(tau|s) - P1(tau|s)``; the witness names the clause with the
    larger violation at the worst node, the cross-product one on a tie.
    """
    _require_same_space(p1, p2)
    worst, worst_node = 0.0, None
    for s in p1.support():
        if p2.path_prob(s) == 0.0:
            continue
        cross_v, term_v, _ = _product_violation(p1, p2, s)
        v = max(cross_v, term_v)
        if v > worst:
            worst, worst_node = v, s
    if worst <= tol or worst_node is None:
        return OrderResult(True, None, worst)
    return OrderResult(False, _product_witness(p1, p2, worst_node), worst)


# -- distances ----------------------------------------------------------------


def pointwise_distance(p1: TreeDistribution, p2: TreeDistribution, path: Path) -> float:
    """dist_s(P1, P2) = P2(s) - P1(s); >= 0 for every s when P1 <= P2 (Thm A.12)."""
    _require_same_space(p1, p2)
    return p2.path_prob(path) - p1.path_prob(path)


def total_variation(p1: TreeDistribution, p2: TreeDistribution) -> float:
    """max over events U of |P1^(U) - P2^(U)| = half the L1 distance of point masses."""
    _require_same_space(p1, p2)
    return mass_tv(p1.masses, p2.masses)
