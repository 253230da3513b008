"""Neighbour distributions of SpS and ASpS, from the TMC paper's recursion (§5.1, App. B.1).

Notation: ``P`` is the leaf-only target (``p``), ``P_ref`` the pseudo
leaf-only reference (the draft ``q``).  For every reference path ``sigma`` in
supp(P_ref) the *neighbour distribution* ``P^_N<~(.; sigma)`` is a law over
``S_<~sigma`` (paths of length <= len(sigma) that agree with sigma up to
their last token): the point mass at ``sigma`` itself is the probability
``w(sigma)`` that every reference token has been accepted so far, and the mass
at ``sigma[:k] + (b,)`` (b != sigma[k]) is the probability that the step
ends with the correction ``b`` after ``k`` accepted tokens.  From sigma to
``sigma + a`` (App. B.1):

* ``m_ref(z) = w P_ref(z|sigma)`` (SpS) or ``P_ref(z|sigma)`` (ASpS);
  ``m(z) = w P(z|sigma)``;
* ``w(sigma + a) = min(m_ref(a), m(a)) / P_ref(a|sigma)``;
* ``r(z) = (m_ref(z) - m(z))_+ / sum_z' (m_ref(z') - m(z'))_+``;
* new corrections ``sigma + b`` (b != a): ``r(a) (m(b) - m_ref(b))_+ / P_ref(a|sigma)``;
* earlier masses: kept (SpS), or times ``r(a) / P_ref(a|sigma)`` (ASpS).

At a pseudo leaf sigma (the reference stops) the step closes with
``P^_N~(.; sigma)``: the mass ``w`` at sigma is split as ``w P(a|sigma)`` on
the bonus tokens ``sigma + a`` and ``w P(tau|sigma)`` on sigma.  The step's
output law is ``P_s = sum_sigma P^_ref({sigma}) P^_N~(.; sigma)``.

The recursion divides 0 by 0 when ``sum (m_ref - m)_+ = 0`` (e.g. ``p = q``
at sigma): ``r`` is then undefined.  Any choice gives the same laws, because
the factors it feeds multiply masses that are 0 in that case; DESIGN.md §4
picks ``r = P_ref``, and ``convention="uniform"`` exists so a check can
confirm the choice does not matter.

This is an independent implementation in exact rationals: it shares no code
with :mod:`tmc.chain`, which the checks compare it against.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

from proofs_check.exact import ONE, ZERO, ExactTree, Path, Shape, common_prefix_len, is_prefix

Law = dict[Path, Fraction]  # point masses of a neighbour distribution


@dataclass(frozen=True)
class Coupling:
    """One member of the SpS / ASpS family of neighbour recursions."""

    name: str  # label in reports
    full_reference_mass: bool  # m_ref = P_ref(a|sigma) (ASpS) instead of w P_ref(a|sigma) (SpS)
    rescale_earlier: bool  # earlier masses times r(a)/P_ref(a|sigma) (ASpS) instead of kept (SpS)
    # how corrections sigma + b are weighted: "residual" is the paper's r(a) (m(b) - m_ref(b))_+;
    # "target" (corrected token drawn from P) and "unweighted" (r(a) left out) are biased controls
    correction: Literal["residual", "target", "unweighted"] = "residual"
    convention: Literal["reference", "uniform"] = "reference"  # r when sum (m_ref - m)_+ = 0


SPS = Coupling("SpS", full_reference_mass=False, rescale_earlier=False)
ASPS = Coupling("ASpS", full_reference_mass=True, rescale_earlier=True)


@dataclass(frozen=True)
class SpecCase:
    """A target / reference pair on one shape."""

    target: ExactTree  # P: leaf-only
    ref: ExactTree  # P_ref: pseudo leaf-only, same shape
    name: str = "case"  # label in reports

    def __post_init__(self) -> None:
        if self.target.shape != self.ref.shape:
            raise ValueError("target and ref must live on the same shape")
        if not self.target.is_leaf_only():
            raise ValueError("target must be leaf-only (Def A.20)")
        if not self.ref.is_pseudo_leaf_only():
            raise ValueError("ref must be pseudo leaf-only (Def B.1)")

    @property
    def shape(self) -> Shape:
        """The common tree space."""
        return self.target.shape

    def continues(self, sigma: Path) -> bool:
        """True when the reference goes on past sigma (not a pseudo leaf)."""
        return not self.shape.is_leaf(sigma) and self.ref.term(sigma) == 0


@dataclass(frozen=True)
class StepMasses:
    """The coupling quantities at one reference node sigma."""

    m_ref: Mapping[int, Fraction]  # m_ref(z; sigma)
    m: Mapping[int, Fraction]  # m(z; sigma)
    r: Mapping[int, Fraction]  # r(z; sigma), a distribution over the children
    degenerate: bool  # True when sum (m_ref - m)_+ = 0 and r came from the convention


def step_masses(case: SpecCase, coupling: Coupling, sigma: Path, w: Fraction) -> StepMasses:
    """m_ref, m and r at sigma, where the neighbour mass at sigma is ``w``."""
    ref_row = case.ref.cond(sigma)
    # w > 0 implies P(sigma) > 0 (w(sigma) <= P(sigma)/P_ref(sigma)); else m = 0
    tgt_row = case.target.cond(sigma) if w else {a: ZERO for a in ref_row}
    m_ref = {a: (ONE if coupling.full_reference_mass else w) * q for a, q in ref_row.items()}
    m = {a: w * tgt_row[a] for a in ref_row}
    excess = {a: max(m_ref[a] - m[a], ZERO) for a in ref_row}
    total = sum(excess.values(), ZERO)
    if total:
        return StepMasses(m_ref, m, {a: e / total for a, e in excess.items()}, False)
    if coupling.convention == "reference":
        return StepMasses(m_ref, m, dict(ref_row), True)
    return StepMasses(m_ref, m, {a: Fraction(1, len(ref_row)) for a in ref_row}, True)


def next_law(case: SpecCase, coupling: Coupling, sigma: Path, law: Law, masses: StepMasses, a: int) -> Law:
    """P^_N<~(.; sigma + a) from P^_N<~(.; sigma) (App. B.1)."""
    q_a = case.ref.cond(sigma)[a]
    if q_a == 0:
        raise ValueError(f"P_ref({a}|{sigma}) = 0: sigma + a is outside supp(P_ref)")
    scale = masses.r[a] / q_a
    out: Law = {}
    for s, v in law.items():
        if s != sigma:
            out[s] = scale * v if coupling.rescale_earlier else v
    out[sigma + (a,)] = min(masses.m_ref[a], masses.m[a]) / q_a
    rejected = sum((max(masses.m[z] - masses.m_ref[z], ZERO) for z in masses.m), ZERO)
    others = sum((masses.m[z] for z in masses.m if z != a), ZERO)
    for b in masses.m:
        if b == a:
            continue
        if coupling.correction == "residual":
            out[sigma + (b,)] = scale * max(masses.m[b] - masses.m_ref[b], ZERO)
        elif coupling.correction == "unweighted":
            out[sigma + (b,)] = max(masses.m[b] - masses.m_ref[b], ZERO) / q_a
        elif others:  # the corrected token drawn from P instead of the residual
            out[sigma + (b,)] = scale * rejected * masses.m[b] / others
    return {s: v for s, v in out.items() if v}


def neighbour_laws(case: SpecCase, coupling: Coupling) -> dict[Path, Law]:
    """``P^_N<~(.; sigma)`` for every sigma in supp(P_ref), root first."""
    laws: dict[Path, Law] = {(): {(): ONE}}
    for sigma in case.ref.support():
        if not case.continues(sigma):
            continue
        law = laws[sigma]
        masses = step_masses(case, coupling, sigma, law.get(sigma, ZERO))
        for a, q_a in case.ref.cond(sigma).items():
            if q_a:
                laws[sigma + (a,)] = next_law(case, coupling, sigma, law, masses, a)
    return laws


def degenerate_steps(case: SpecCase, coupling: Coupling, laws: Mapping[Path, Law]) -> int:
    """Number of reference nodes where r fell back on the convention."""
    return sum(
        step_masses(case, coupling, s, laws[s].get(s, ZERO)).degenerate
        for s in case.ref.support()
        if case.continues(s)
    )


def closed_law(case: SpecCase, sigma: Path, law: Law) -> Law:
    """``P^_N~(.; sigma)`` at a pseudo leaf: the accepted mass gets a bonus token from P."""
    w = law.get(sigma, ZERO)
    out = {s: v for s, v in law.items() if s != sigma}
    if not w:
        return out
    if case.shape.is_leaf(sigma):
        out[sigma] = w
        return out
    for a, p_a in case.target.cond(sigma).items():
        if p_a:
            out[sigma + (a,)] = w * p_a
    if case.target.term(sigma):
        out[sigma] = w * case.target.term(sigma)
    return out


def output_law(case: SpecCase, coupling: Coupling, laws: Mapping[Path, Law] | None = None) -> Law:
    """``P_s = sum_sigma P^_ref({sigma}) P^_N~(.; sigma)``: the step's output point masses."""
    laws = neighbour_laws(case, coupling) if laws is None else laws
    out: Law = {}
    for sigma, weight in case.ref.masses.items():
        for s, v in closed_law(case, sigma, laws[sigma]).items():
            out[s] = out.get(s, ZERO) + weight * v
    return {s: v for s, v in out.items() if v}


def neighbour_set(shape: Shape, sigma: Path) -> tuple[Path, ...]:
    """``S_<~sigma``: nodes s with len(s) <= len(sigma) agreeing with sigma up to their last token."""
    return tuple(
        s for s in shape.nodes() if len(s) <= len(sigma) and common_prefix_len(s, sigma) >= len(s) - 1
    )


def path_mass(law: Mapping[Path, Fraction], s: Path) -> Fraction:
    """``P_N(s; sigma)``: the law's mass at or below s (a path probability)."""
    return sum((v for t, v in law.items() if is_prefix(s, t)), ZERO)
