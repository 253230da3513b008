"""Checks of the TMC paper's Appendix B and §2-§6: SpS and ASpS as neighbour distributions.

``p`` is the target's law and ``q`` the draft's (DESIGN.md §3); ``p_rows`` / ``q_rows`` hold their rows.

Lemma B.5, B.6, B.7 (the neighbour distributions average correctly over the
next reference token and over the whole reference subtree), Thm B.8 / 5.5
(ASpS accepts the reference path at least as often as SpS), Thm B.9 / 5.6
(ASpS emits at least as many tokens on average), Thm B.10 / 5.7 (both steps
are sub-distributions of the target, hence prefix sub-samplers), and facts
the text states: the neighbour distributions are probability laws on
``S_<~sigma`` (Algorithm 1's assert), ASpS equals SpS for one reference
token (§6), the explicit SpS formula of App. B.1, the paper's Tables 2 and 3,
and eq. (1), the single-token coupling of §2, which is misprinted.

All of it runs on the exact recursion of :mod:`proofs_check.neighbour`;
``P`` (target ``p``) is leaf-only and ``P_ref`` (draft ``q``) pseudo
leaf-only.  Cases: random shapes with variable-length references, chain
references of length n = 1..3 drawn with ``verification.strategies.toy_models``
(every relation: identical, near ties, greedy, tiny, disjoint), and the
paper's toy example (:func:`tmc.paper_toy_model`, read as exact rationals).
On chain cases the composed law is compared exactly with the literal chain
references of :mod:`proofs_check.chain_literal` (eq. (1) chained, Algorithm 1)
and in floats with :func:`tmc.chain.sps_kernel` / :func:`tmc.chain.asps_kernel`,
per draft and averaged (``tmc.enumeration.chain_output_law``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
from hypothesis import strategies as st
from numpy.typing import ArrayLike, NDArray

from proofs_check.cases import draw_cases, normalised, shapes, trees
from proofs_check.chain_literal import asps_literal, rational_rows, simplest_row, sps_literal
from proofs_check.exact import ONE, ZERO, ExactTree, Path, Shape, common_prefix_len, sub_defect
from proofs_check.neighbour import (
    ASPS,
    SPS,
    Coupling,
    Law,
    SpecCase,
    closed_law,
    degenerate_steps,
    neighbour_laws,
    neighbour_set,
    output_law,
    path_mass,
)
from proofs_check.registry import Budget, Check, CheckResult, Tally, control, counterexample, theorem
from tmc import asps_kernel, chain_output_law, paper_toy_model, sps_kernel
from tmc.order import check_sub_distribution
from tmc.toy import ToyModel
from verification.strategies import toy_models

KERNEL_TOL = 1e-12  # agreement asked of tmc's float kernels
ChainKernel = Callable[[ArrayLike, ArrayLike, ArrayLike], NDArray[np.float64]]

# -- cases -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Spec:
    """A case plus, for chain references, the float toy model and the length n."""

    case: SpecCase  # exact target / reference pair
    model: ToyModel | None = None  # the float model (chain cases only)
    n: int | None = None  # reference length (chain cases only)


@st.composite
def general_specs(draw: st.DrawFn) -> Spec:
    """Random shape, leaf-only target, pseudo leaf-only reference of variable length."""
    shape = draw(shapes())
    target = draw(trees(shape, kind="leaf_only"))
    ref = draw(trees(shape, kind="pseudo_leaf_only"))
    return Spec(SpecCase(target, ref, "general"))


def exact_row(row: NDArray[np.float64]) -> tuple[Fraction, ...]:
    """A float probability row as exact rationals summing to exactly 1 (its binary values)."""
    return tuple(rational_rows([row])[0])


def model_case(
    model: ToyModel,
    depth: int,
    continues: Callable[[Path], bool],
    exact: Callable[[NDArray[np.float64]], tuple[Fraction, ...]] = exact_row,
    name: str = "",
) -> SpecCase:
    """A toy model's target p to ``depth`` (leaf-only) and its draft q run while ``continues(s)``."""
    shape = Shape.full(model.vocab, depth)
    stop = (ZERO,) * model.vocab + (ONE,)
    target = ExactTree.from_rows(shape, {s: exact(model.p(s)) + (ZERO,) for s in shape.inner()})
    ref = ExactTree.from_rows(
        shape, {s: exact(model.q(s)) + (ZERO,) if continues(s) else stop for s in shape.inner()}
    )
    return SpecCase(target, ref, name or model.name)


def chain_spec(model: ToyModel, n: int) -> Spec:
    """The draft run for exactly n tokens as a pseudo leaf-only P_ref; p to depth n + 1."""
    case = model_case(model, n + 1, lambda s: len(s) < n, name=f"{model.name}, n={n}")
    return Spec(case, model, n)


@st.composite
def chain_specs(
    draw: st.DrawFn, *, ns: tuple[int, ...] = (1, 2, 3), relation: str | None = None, min_vocab: int = 1
) -> Spec:
    """A toy model (any relation of verification.strategies, or the one given) with a chain reference."""
    n = draw(st.sampled_from(ns))
    return chain_spec(draw(toy_models(min_vocab=min_vocab, max_vocab=3, depth=n, relation=relation)), n)


def paper_example() -> SpecCase:
    """The toy example of Tables 1-3 (:func:`tmc.paper_toy_model`, Sigma = {a, b, c} as 0, 1, 2).

    Its rows are short decimals and thirds, read as the rationals they stand
    for (0.3 as 3/10).  The reference continues at the root and after a, and
    stops after b, after c and after two tokens (the drafts aa, ab, ac, b, c
    of Tables 2-3); the target is leaf-only at depth 3.
    """
    return model_case(paper_toy_model(), 3, lambda s: s in ((), (0,)), simplest_row, "paper toy")


def specs(budget: Budget, n_general: int, n_chain: int, offset: int) -> list[Spec]:
    """The paper's example, random general cases and random chain cases."""
    out = [Spec(paper_example())]
    out += draw_cases(general_specs(), budget.n(n_general), budget.seed + offset)
    out += draw_cases(chain_specs(), budget.n(n_chain), budget.seed + offset + 1)
    return out


def _describe(spec: Spec, i: int) -> str:
    return f"case {i} ({spec.case.name}) P_ref = {dict(spec.case.ref.masses)}"[:200]


def inner_refs(case: SpecCase) -> Iterator[Path]:
    """Reference nodes that continue (not pseudo leaves)."""
    return (s for s in case.ref.support() if case.continues(s))


# -- Lemma B.5, B.6, B.7 ----------------------------------------------------------------


def _b5(tally: Tally, case: SpecCase, laws: Mapping[Path, Law], sigma: Path) -> None:
    """sum_a P_ref(a|sigma) P_N(s; sigma + a) = P_N(s; sigma) for s in S_<~sigma."""
    row = case.ref.cond(sigma)
    for s in neighbour_set(case.shape, sigma):
        lhs = sum((q * path_mass(laws[sigma + (a,)], s) for a, q in row.items() if q), ZERO)
        if not tally.equal(lhs, path_mass(laws[sigma], s), f"sum_a P_ref(a|{sigma}) P_N({s}; {sigma}+a)"):
            return


def _b6(tally: Tally, case: SpecCase, laws: Mapping[Path, Law], sigma: Path) -> None:
    """sum_a P_ref(a|sigma) P_N(sigma + b; sigma + a) = P_N(sigma; sigma) P(b|sigma)."""
    row = case.ref.cond(sigma)
    w = laws[sigma].get(sigma, ZERO)
    p_row = case.target.cond(sigma) if w else {b: ZERO for b in row}
    for b in row:
        lhs = sum((q * path_mass(laws[sigma + (a,)], sigma + (b,)) for a, q in row.items() if q), ZERO)
        if not tally.equal(lhs, w * p_row[b], f"sum_a P_ref(a|{sigma}) P_N({sigma + (b,)}; {sigma}+a)"):
            return


def _b7(tally: Tally, case: SpecCase, laws: Mapping[Path, Law], sigma: Path) -> None:
    """E over pseudo leaves sigma' >= sigma (P_ref|sigma) of P_N(s; sigma') = P_N(s; sigma)."""
    below = case.ref.condition(sigma).masses
    for s in neighbour_set(case.shape, sigma):
        lhs = sum((m * path_mass(laws[leaf], s) for leaf, m in below.items()), ZERO)
        if not tally.equal(lhs, path_mass(laws[sigma], s), f"E_(P_ref|{sigma}) P_N({s}; .)"):
            return


Lemma = Callable[[Tally, SpecCase, Mapping[Path, Law], Path], None]


def _lemma(
    budget: Budget,
    lemma: Lemma,
    couplings: tuple[Coupling, ...],
    offset: int,
    *,
    at: str = "inner",
    size: int = 150,
) -> CheckResult:
    tally = Tally()
    for i, spec in enumerate(specs(budget, size, size, offset)):
        case = spec.case
        tally.case(_describe(spec, i))
        for coupling in couplings:
            laws = neighbour_laws(case, coupling)
            nodes = list(inner_refs(case)) if at == "inner" else list(case.ref.support())
            for sigma in nodes:
                tally.count(f"{coupling.name} nodes")
                lemma(tally, case, laws, sigma)
            if coupling.correction == "residual":
                for _ in range(degenerate_steps(case, coupling, laws)):
                    tally.count(f"{coupling.name} 0/0 steps")
    return tally.result()


def check_b5(budget: Budget) -> CheckResult:
    return _lemma(budget, _b5, (SPS, ASPS), 50)


def check_b6(budget: Budget) -> CheckResult:
    return _lemma(budget, _b6, (SPS, ASPS), 52)


def check_b7(budget: Budget) -> CheckResult:
    return _lemma(budget, _b7, (SPS, ASPS), 54, at="all")


UNWEIGHTED = Coupling("ASpS, corrections without r(a)", True, True, correction="unweighted")
FROM_TARGET = Coupling("SpS, correction drawn from p", False, False, correction="target")
NO_RESCALE = Coupling("ASpS without rescaling", True, False)


def control_b5(budget: Budget) -> CheckResult:
    return _lemma(budget, _b5, (UNWEIGHTED,), 56, size=45)


def control_b6(budget: Budget) -> CheckResult:
    return _lemma(budget, _b6, (FROM_TARGET,), 58, size=45)


def control_b7(budget: Budget) -> CheckResult:
    return _lemma(budget, _b7, (UNWEIGHTED,), 60, at="all", size=45)


def stops_early(spec: Spec) -> bool:
    """True when the reference stops at some node that has children."""
    case = spec.case
    return any(not case.shape.is_leaf(s) and case.ref.term(s) == 1 for s in case.ref.support())


early_stop_specs = general_specs().filter(stops_early)


def pseudo_leaf_b5(budget: Budget) -> CheckResult:
    """B.5 and B.6 at a pseudo leaf sigma with children: their left sides are empty sums."""
    tally = Tally()
    for i, spec in enumerate(draw_cases(early_stop_specs, budget.n(90), budget.seed + 62)):
        case = spec.case
        laws = neighbour_laws(case, SPS)
        for sigma in case.ref.support():
            if case.shape.is_leaf(sigma) or case.ref.term(sigma) != 1:
                continue
            tally.case(
                f"case {i}: reference stops at {sigma}, which has children {case.shape.children(sigma)}"
            )
            # P_ref(a|sigma) = 0 for every child, so sum_a P_ref(a|sigma) P_N(.; sigma + a) = 0
            tally.equal(ZERO, path_mass(laws[sigma], ()), "B.5 at s = () (left side 0)")
            w = laws[sigma].get(sigma, ZERO)
            for b, p_b in (case.target.cond(sigma).items() if w else ()):
                tally.equal(ZERO, w * p_b, f"B.6 at b = {b} (left side 0)")
            break
    return tally.result()


# -- Thm B.8, B.9, B.10 -----------------------------------------------------------------


def _b8(tally: Tally, case: SpecCase, better: Coupling, worse: Coupling) -> None:
    hi, lo = neighbour_laws(case, better), neighbour_laws(case, worse)
    for sigma in case.ref.support():
        tally.at_least(
            hi[sigma].get(sigma, ZERO), lo[sigma].get(sigma, ZERO), f"P_N^{better.name}({sigma}; {sigma})"
        )


def _b9(tally: Tally, case: SpecCase, better: Coupling, worse: Coupling) -> None:
    length = {
        c.name: sum((len(s) * m for s, m in output_law(case, c).items()), ZERO) for c in (better, worse)
    }
    tally.at_least(length[better.name], length[worse.name], f"E_len {better.name} - E_len {worse.name}")
    # the proof's first identity: E_N~ len = E_N<~ len + w 1(Sigma(sigma) != {}) at pseudo leaves
    laws = neighbour_laws(case, better)
    for sigma in case.ref.masses:
        before = sum((len(s) * v for s, v in laws[sigma].items()), ZERO)
        after = sum((len(s) * v for s, v in closed_law(case, sigma, laws[sigma]).items()), ZERO)
        bonus = laws[sigma].get(sigma, ZERO) if not case.shape.is_leaf(sigma) else ZERO
        tally.equal(after, before + bonus, f"E_len of P_N~(.; {sigma})")


def _compare(
    budget: Budget,
    fn: Callable[[Tally, SpecCase, Coupling, Coupling], None],
    better: Coupling,
    worse: Coupling,
    offset: int,
    size: int = 150,
) -> CheckResult:
    tally = Tally()
    for i, spec in enumerate(specs(budget, size, size, offset)):
        tally.case(_describe(spec, i))
        fn(tally, spec.case, better, worse)
    return tally.result()


def check_b8(budget: Budget) -> CheckResult:
    return _compare(budget, _b8, ASPS, SPS, 64)


def control_b8(budget: Budget) -> CheckResult:
    """Swapped: SpS >= ASpS must fail where ASpS is strictly better."""
    return _compare(budget, _b8, SPS, ASPS, 66, size=45)


def check_b9(budget: Budget) -> CheckResult:
    return _compare(budget, _b9, ASPS, SPS, 68)


def control_b9(budget: Budget) -> CheckResult:
    return _compare(budget, _b9, SPS, ASPS, 70, size=45)


def _b10(tally: Tally, case: SpecCase, coupling: Coupling) -> None:
    law = output_law(case, coupling)
    if not tally.truth(
        sum(law.values(), ZERO) == 1 and min(law.values()) >= 0, f"{coupling.name}: P_s is not a distribution"
    ):
        return
    p_s = ExactTree(case.shape, law)
    defect = sub_defect(p_s, case.target)
    tally.truth(defect == 0, f"{coupling.name}: P_s is not <= P (Def A.11 defect {float(defect):.3g})")
    if defect == 0 or defect > 1e-9:
        tmc_holds = check_sub_distribution(p_s.to_tmc(), case.target.to_tmc(), 1e-12).holds
        tally.cross(float(defect == 0), float(tmc_holds), "tmc check_sub_distribution")


def check_b10(budget: Budget) -> CheckResult:
    tally = Tally()
    for i, spec in enumerate(specs(budget, 150, 150, 72)):
        tally.case(_describe(spec, i))
        for coupling in (SPS, ASPS):
            _b10(tally, spec.case, coupling)
    return tally.result()


def control_b10(budget: Budget) -> CheckResult:
    tally = Tally()
    for i, spec in enumerate(specs(budget, 45, 45, 74)):
        tally.case(_describe(spec, i))
        _b10(tally, spec.case, FROM_TARGET)
    return tally.result()


# -- in-text facts ----------------------------------------------------------------------


def _laws_are_distributions(tally: Tally, case: SpecCase, coupling: Coupling) -> None:
    laws = neighbour_laws(case, coupling)
    for sigma, law in laws.items():
        near = set(neighbour_set(case.shape, sigma))
        tally.equal(sum(law.values(), ZERO), ONE, f"{coupling.name}: total of P_N(.; {sigma})")
        tally.truth(min(law.values()) >= 0, f"negative mass in P_N(.; {sigma})")
        tally.truth(set(law) <= near, f"P_N(.; {sigma}) leaves S_<~sigma: {sorted(set(law) - near)[:2]}")
        if sigma in case.ref.masses:
            closed = closed_law(case, sigma, law)
            tally.equal(sum(closed.values(), ZERO), ONE, f"total of P_N~(.; {sigma})")
            tally.truth(
                all(common_prefix_len(s, sigma) >= len(s) - 1 for s in closed),
                f"P_N~(.; {sigma}) leaves S_~sigma",
            )
    if coupling.correction == "residual":
        other = Coupling(
            coupling.name, coupling.full_reference_mass, coupling.rescale_earlier, convention="uniform"
        )
        tally.truth(
            neighbour_laws(case, other) == laws, f"{coupling.name}: the 0/0 convention for r changes the laws"
        )
        for _ in range(degenerate_steps(case, coupling, laws)):
            tally.count("0/0 steps")


def check_laws(budget: Budget) -> CheckResult:
    tally = Tally()
    for i, spec in enumerate(specs(budget, 150, 150, 76)):
        tally.case(_describe(spec, i))
        for coupling in (SPS, ASPS):
            _laws_are_distributions(tally, spec.case, coupling)
        tally.cross(ONE, float(spec.case.ref.to_tmc().is_pseudo_leaf_only()), "tmc is_pseudo_leaf_only")
        tally.cross(ONE, float(spec.case.target.to_tmc().is_leaf_only()), "tmc is_leaf_only")
    return tally.result()


def control_laws(budget: Budget) -> CheckResult:
    tally = Tally()
    for i, spec in enumerate(specs(budget, 45, 45, 78)):
        tally.case(_describe(spec, i))
        _laws_are_distributions(tally, spec.case, NO_RESCALE)
    return tally.result()


def _same_laws(tally: Tally, case: SpecCase, max_len: int) -> None:
    sps, asps = neighbour_laws(case, SPS), neighbour_laws(case, ASPS)
    for sigma in sps:
        if len(sigma) <= max_len:
            tally.truth(sps[sigma] == asps[sigma], f"ASpS and SpS differ at reference {sigma}")


def check_one_token(budget: Budget) -> CheckResult:
    """§6: with one reference token ASpS is SpS (neighbour laws of every sigma with len <= 1)."""
    tally = Tally()
    for i, spec in enumerate(specs(budget, 150, 150, 80)):
        tally.case(_describe(spec, i))
        _same_laws(tally, spec.case, 1)
        if spec.n == 1 and spec.model is not None:
            a = chain_output_law(spec.model, 1, asps_kernel).output_law
            s = chain_output_law(spec.model, 1, sps_kernel).output_law
            for key in set(a) | set(s):
                tally.cross(a.get(key, 0.0), s.get(key, 0.0), f"tmc ASpS vs SpS law at {key}")
    return tally.result()


def control_one_token(budget: Budget) -> CheckResult:
    """With two reference tokens the laws must differ somewhere."""
    tally = Tally()
    for i, spec in enumerate(specs(budget, 45, 45, 82)):
        tally.case(_describe(spec, i))
        _same_laws(tally, spec.case, 2)
    return tally.result()


def sps_formula(
    case: SpecCase, sigma: Path, a: int, b: int, w: Fraction, *, misprint: bool = False
) -> Fraction:
    """App. B.1's explicit SpS step: P_N^SpS({sigma + b}; sigma + a).

    ``misprint`` adds the two factors, as eq. (1) of §2 is printed (a control).
    """
    if not w:
        return ZERO
    p, q = case.target.cond(sigma), case.ref.cond(sigma)
    if a == b:
        return w * min(ONE, p[a] / q[a])
    excess = sum((max(q[z] - p[z], ZERO) for z in q), ZERO)
    reject = max(1 - p[a] / q[a], ZERO)
    if misprint:
        return w * ((1 - p[a] / q[a]) + max(p[b] - q[b], ZERO)) / excess if excess else ZERO
    return w * reject * max(p[b] - q[b], ZERO) / excess if reject else ZERO


def check_sps_formula(budget: Budget) -> CheckResult:
    return _sps_formula(budget, budget.n(150), 84, misprint=False)


def control_sps_formula(budget: Budget) -> CheckResult:
    return _sps_formula(budget, budget.n(45), 85, misprint=True)


def _sps_formula(budget: Budget, n: int, offset: int, *, misprint: bool) -> CheckResult:
    tally = Tally()
    cases = [Spec(paper_example())] + draw_cases(general_specs(), n, budget.seed + offset)
    cases += draw_cases(chain_specs(), n, budget.seed + offset + 100)
    for i, spec in enumerate(cases):
        case = spec.case
        tally.case(_describe(spec, i))
        laws = neighbour_laws(case, SPS)
        for sigma in inner_refs(case):
            w = laws[sigma].get(sigma, ZERO)
            for a, q_a in case.ref.cond(sigma).items():
                if q_a:
                    for b in case.shape.children(sigma):
                        formula = sps_formula(case, sigma, a, b, w, misprint=misprint)
                        tally.equal(
                            laws[sigma + (a,)].get(sigma + (b,), ZERO),
                            formula,
                            f"P_N^SpS({sigma + (b,)}; {sigma + (a,)})",
                        )
    return tally.result()


def eq1_coupling(
    p_ref: tuple[Fraction, ...], p: tuple[Fraction, ...], *, as_printed: bool = False
) -> list[list[Fraction]]:
    """C(x, y) = P_ref(x) P_s(y; x) of eq. (1); ``as_printed`` uses the misprint (+ for x, no (.)_+)."""
    excess = sum((max(q - t, ZERO) for q, t in zip(p_ref, p)), ZERO)
    out = []
    for x, qx in enumerate(p_ref):
        row = []
        for y in range(len(p)):
            if not qx:
                row.append(ZERO)
            elif y == x:
                row.append(qx * min(ONE, p[x] / qx))
            elif not excess:
                row.append(ZERO)
            elif as_printed:
                row.append(qx * ((1 - p[x] / qx) + max(p[y] - p_ref[y], ZERO)) / excess)
            else:
                row.append(qx * max(1 - p[x] / qx, ZERO) * max(p[y] - p_ref[y], ZERO) / excess)
        out.append(row)
    return out


def table1_rows() -> tuple[tuple[Fraction, ...], tuple[Fraction, ...]]:
    """``(P_ref, P)`` of Table 1: the paper toy's root rows."""
    case = paper_example()
    return tuple(case.ref.cond(()).values()), tuple(case.target.cond(()).values())


TABLE1_C = {  # the coupling C(x, y) = P_ref(x) P_s(y; x) printed in Table 1
    (0, 0): Fraction(3, 10),
    (0, 1): Fraction(1, 10),
    (0, 2): Fraction(1, 10),
    (1, 1): Fraction(3, 10),
    (2, 2): Fraction(1, 5),
}


def _eq1(tally: Tally, p_ref: tuple[Fraction, ...], p: tuple[Fraction, ...], *, as_printed: bool) -> None:
    c = eq1_coupling(p_ref, p, as_printed=as_printed)
    k = len(p)
    tally.truth(all(v >= 0 for row in c for v in row), "a negative 'probability'")
    for x in range(k):
        tally.equal(sum(c[x], ZERO), p_ref[x], f"row {x} of C (should be P_ref({x}))")
    for y in range(k):
        tally.equal(sum((c[x][y] for x in range(k)), ZERO), p[y], f"column {y} of C (should be P({y}))")
    tally.equal(
        sum((c[x][x] for x in range(k)), ZERO),
        sum((min(a, b) for a, b in zip(p_ref, p)), ZERO),
        "sum_x C(x, x)",
    )


ROW_PAIRS = st.integers(1, 4).flatmap(
    lambda k: st.tuples(
        *[st.lists(st.integers(0, 5), min_size=k, max_size=k).filter(any).map(normalised)] * 2
    )
)


def check_eq1(budget: Budget) -> CheckResult:
    """Corrected eq. (1): a coupling of P_ref and P with the maximal diagonal sum_x min(P_ref, P)."""
    tally = Tally()
    tally.case("Table 1")
    c = eq1_coupling(*table1_rows())
    for x in range(3):
        for y in range(3):
            tally.equal(c[x][y], TABLE1_C.get((x, y), ZERO), f"C({x}, {y}) vs Table 1")
    _eq1(tally, *table1_rows(), as_printed=False)
    for i, (p_ref, p) in enumerate(draw_cases(ROW_PAIRS, budget.n(300), budget.seed + 86)):
        tally.case(f"case {i}: P_ref = {p_ref}, P = {p}")
        _eq1(tally, p_ref, p, as_printed=False)
    return tally.result()


def control_eq1(budget: Budget) -> CheckResult:
    """The independent coupling P_ref(x) P(y): right marginals, diagonal too small."""
    tally = Tally()
    # both rows spread over >= 2 tokens and overlapping: only then is the product coupling not maximal
    spread = ROW_PAIRS.filter(
        lambda pair: all(sum(1 for x in r if x) >= 2 for r in pair) and any(a and b for a, b in zip(*pair))
    )
    for i, (p_ref, p) in enumerate(draw_cases(spread, budget.n(60), budget.seed + 87)):
        tally.case(f"case {i}: P_ref = {p_ref}, P = {p}, independent coupling")
        diag = sum((x * y for x, y in zip(p_ref, p)), ZERO)
        tally.equal(diag, sum((min(a, b) for a, b in zip(p_ref, p)), ZERO), "sum_x C(x, x)")
    return tally.result()


def printed_eq1(budget: Budget) -> CheckResult:
    """Eq. (1) exactly as printed: (1 - P(x)/P_ref(x)) + (P(y) - P_ref(y))_+ over the excess."""
    tally = Tally()
    tally.case("Table 1, as printed")
    _eq1(tally, *table1_rows(), as_printed=True)
    for i, (p_ref, p) in enumerate(draw_cases(ROW_PAIRS, budget.n(60), budget.seed + 88)):
        tally.case(f"case {i}: P_ref = {p_ref}, P = {p}, as printed")
        _eq1(tally, p_ref, p, as_printed=True)
    return tally.result()


# Tables 2 and 3: joint probabilities P_ref({sigma}) P_N<~({s}; sigma) as (output s, reference sigma)
_A, _B, _C = 0, 1, 2
TABLE2 = {
    ((_A, _A), (_A, _A)): "0.1",
    ((_A, _B), (_A, _B)): "0.1",
    ((_A, _C), (_A, _A)): "0.02",
    ((_A, _C), (_A, _B)): "0.02",
    ((_A, _C), (_A, _C)): "0.06",
    ((_B,), (_A, _A)): "0.04",
    ((_B,), (_A, _B)): "0.04",
    ((_B,), (_A, _C)): "0.02",
    ((_B,), (_B,)): "0.3",
    ((_C,), (_A, _A)): "0.04",
    ((_C,), (_A, _B)): "0.04",
    ((_C,), (_A, _C)): "0.02",
    ((_C,), (_C,)): "0.2",
}
TABLE3 = {
    ((_A, _A), (_A, _A)): "0.1",
    ((_A, _B), (_A, _B)): "0.1",
    ((_A, _C), (_A, _C)): "0.1",
    ((_B,), (_A, _A)): "0.05",
    ((_B,), (_A, _B)): "0.05",
    ((_B,), (_B,)): "0.3",
    ((_C,), (_A, _A)): "0.05",
    ((_C,), (_A, _B)): "0.05",
    ((_C,), (_C,)): "0.2",
}


def _joint(case: SpecCase, coupling: Coupling) -> dict[tuple[Path, Path], Fraction]:
    laws = neighbour_laws(case, coupling)
    return {
        (s, sigma): weight * v
        for sigma, weight in case.ref.masses.items()
        for s, v in laws[sigma].items()
        if v
    }


def _tables(tally: Tally, pairs: tuple[tuple[str, Coupling, Mapping[tuple[Path, Path], str]], ...]) -> None:
    case = paper_example()
    for label, coupling, table in pairs:
        tally.case(label)
        joint = _joint(case, coupling)
        for key in set(joint) | set(table):
            tally.equal(
                joint.get(key, ZERO),
                Fraction(table.get(key, "0")),
                f"{coupling.name} cell (output {key[0]}, reference {key[1]})",
            )


def accepted_reference_tokens(joint: Mapping[tuple[Path, Path], Fraction]) -> Fraction:
    """E[number of reference tokens accepted] under a joint law of (output, reference)."""
    total = ZERO
    for (s, sigma), v in joint.items():
        k = len(s) if s == sigma[: len(s)] else len(s) - 1
        total += k * v
    return total


def check_tables(budget: Budget) -> CheckResult:
    tally = Tally()
    _tables(tally, (("Table 2 (SpS)", SPS, TABLE2), ("Table 3 (ASpS)", ASPS, TABLE3)))
    tally.case("§3: Table 3 accepts more reference tokens than Table 2")
    case = paper_example()
    gain = accepted_reference_tokens(_joint(case, ASPS)) - accepted_reference_tokens(_joint(case, SPS))
    tally.equal(gain, Fraction(1, 25), "E[accepted] ASpS - SpS (1.10 - 1.06)")
    return tally.result()


def control_tables(budget: Budget) -> CheckResult:
    """Table 2 (SpS) compared with the ASpS recursion and vice versa."""
    tally = Tally()
    _tables(
        tally,
        (("Table 3 vs the SpS recursion", SPS, TABLE3), ("Table 2 vs the ASpS recursion", ASPS, TABLE2)),
    )
    return tally.result()


# -- the literal references and the tmc kernels against the recursion ---------------------

ExactRows = Sequence[Sequence[Fraction]]
ChainLiteral = Callable[[Sequence[int], ExactRows, ExactRows], list[list[Fraction]]]


def _against_literal(tally: Tally, spec: Spec, coupling: Coupling, literal: ChainLiteral) -> None:
    """Eq. (1) chained (SpS) or Algorithm 1 (ASpS), run literally, equal the recursion exactly."""
    assert spec.model is not None and spec.n is not None
    case, model, n = spec.case, spec.model, spec.n
    laws = neighbour_laws(case, coupling)
    for sigma in case.ref.masses:
        q_rows, p_rows = model.chain_rows(sigma)
        k = literal(sigma, rational_rows(q_rows), rational_rows(p_rows))
        closed = closed_law(case, sigma, laws[sigma])
        for j in range(n + 1):
            for b in range(model.vocab):
                what = f"{coupling.name} literal K[{j}, {b}] for draft {sigma}"
                tally.equal(closed.get(sigma[:j] + (b,), ZERO), k[j][b], what)


def _against_tmc(tally: Tally, spec: Spec, coupling: Coupling, kernel: ChainKernel) -> None:
    """tmc's kernel (or a stand-in) against the closed law: the statement of "tmc kernels" itself, so observed
    as equalities within the tally's tolerance (``KERNEL_TOL``), not as a side cross-check, which fails a
    control instead of detecting for it."""
    assert spec.model is not None and spec.n is not None
    case, model, n = spec.case, spec.model, spec.n
    laws = neighbour_laws(case, coupling)
    for sigma in case.ref.masses:
        q_rows, p_rows = model.chain_rows(sigma)
        k = kernel(list(sigma), q_rows, p_rows)
        closed = closed_law(case, sigma, laws[sigma])
        for j in range(n + 1):
            for b in range(model.vocab):
                tally.equal(
                    closed.get(sigma[:j] + (b,), ZERO),
                    float(k[j, b]),
                    f"K[{j}, {b}] for draft {sigma}",
                )
    ours = output_law(case, coupling, laws)
    summary = chain_output_law(model, n, kernel)
    theirs = summary.output_law
    for s in set(ours) | set(theirs):
        tally.equal(ours.get(s, ZERO), theirs.get(s, 0.0), f"averaged law at {s}")
    length = sum((len(s) * v for s, v in ours.items()), ZERO)
    tally.equal(length, summary.expected_length, "expected length")
    tally.equal(ZERO, summary.completion_error, "completion identity")


def check_kernels(budget: Budget) -> CheckResult:
    tally = Tally(tol=KERNEL_TOL)
    for i, spec in enumerate(draw_cases(chain_specs(), budget.n(200), budget.seed + 90)):
        tally.case(_describe(spec, i))
        _against_literal(tally, spec, SPS, sps_literal)
        _against_literal(tally, spec, ASPS, asps_literal)
        _against_tmc(tally, spec, SPS, sps_kernel)
        _against_tmc(tally, spec, ASPS, asps_kernel)
    return tally.result()


def biased_sps_kernel(ref: ArrayLike, q_rows: ArrayLike, p_rows: ArrayLike) -> NDArray[np.float64]:
    """SpS that resamples a rejected token from p instead of the residual (biased)."""
    k = sps_kernel(ref, q_rows, p_rows)
    p = np.asarray(p_rows, dtype=np.float64)
    for j in range(k.shape[0] - 1):
        k[j] = k[j].sum() * p[j]
    return k


def control_kernels(budget: Budget) -> CheckResult:
    tally = Tally(tol=KERNEL_TOL)
    biased_cases = chain_specs(ns=(2,), relation="independent", min_vocab=2)
    for i, spec in enumerate(draw_cases(biased_cases, budget.n(90), budget.seed + 92)):
        tally.case(_describe(spec, i))
        _against_tmc(tally, spec, SPS, biased_sps_kernel)
    return tally.result()


# -- registry rows ------------------------------------------------------------------------

EX = "exact rationals"
CASES = "paper toy + random variable-length references + toy_models chains n = 1..3"

CHECKS: tuple[Check, ...] = (
    theorem(
        "B.1 laws",
        "P_N<~(.; sigma) is a probability law on S_<~sigma (Alg. 1's assert); the 0/0 choice of r is immaterial",
        f"every sigma, SpS and ASpS, r = P_ref vs uniform at 0/0 steps; {CASES} ({EX})",
        check_laws,
    ),
    control("ctl B.1 laws", "B.1 laws", "ASpS without rescaling earlier masses", control_laws),
    theorem(
        "B.5",
        "sum_a P_ref(a|sigma) P_N(s; sigma+a) = P_N(s; sigma) for s in S_<~sigma",
        f"every continuing sigma, every s, SpS and ASpS; {CASES} ({EX})",
        check_b5,
    ),
    control("ctl B.5", "B.5", "ASpS with corrections not weighted by r(a)", control_b5),
    theorem(
        "B.6",
        "sum_a P_ref(a|sigma) P_N(sigma+b; sigma+a) = P_N(sigma; sigma) P(b|sigma)",
        f"every continuing sigma and child b, SpS and ASpS; {CASES} ({EX})",
        check_b6,
    ),
    control("ctl B.6", "B.6", "SpS with the corrected token drawn from p", control_b6),
    counterexample(
        "B.5/6 leaf",
        "B.5 and B.6 at a pseudo leaf sigma that has children (allowed by the statement)",
        f"random references that stop early; s = root ({EX})",
        pseudo_leaf_b5,
        label="needs P_ref(tau|sigma) = 0",
        note="Lemmas B.5 and B.6 ask only that sigma is in supp(P_ref) and has children, but a pseudo leaf "
        "(P_ref(tau|sigma) = 1) can have children: then P_ref(a|sigma) = 0 for every a, the left side "
        "is an empty sum (0) and the right side is P_N(s; sigma), e.g. 1 at s = root. The proofs use "
        "sum_a P_ref(a|sigma) = 1, so both lemmas need P_ref(tau|sigma) = 0. Nothing downstream "
        "breaks: B.7 and B.10 only apply them at continuing nodes.",
    ),
    theorem(
        "B.7",
        "E_{sigma' ~ P_ref|sigma} P_N(s; sigma') = P_N(s; sigma) for s in S_<~sigma",
        f"every sigma in supp(P_ref), every s, SpS and ASpS; {CASES} ({EX})",
        check_b7,
    ),
    control("ctl B.7", "B.7", "ASpS with corrections not weighted by r(a)", control_b7),
    theorem(
        "B.8 (5.5)",
        "P_N^ASpS({sigma}; sigma) >= P_N^SpS({sigma}; sigma) for sigma in supp(P_ref)",
        f"every sigma; {CASES} ({EX})",
        check_b8,
    ),
    control(
        "ctl B.8",
        "B.8 (5.5)",
        "the same inequality with SpS and ASpS swapped",
        control_b8,
        label="detected (ASpS strictly better)",
    ),
    theorem(
        "B.9 (5.6)",
        "E_len(P_s^ASpS) >= E_len(P_s^SpS)",
        f"exact expected lengths, and the proof's E_N~ = E_N<~ + w identity; {CASES} ({EX})",
        check_b9,
    ),
    control(
        "ctl B.9",
        "B.9 (5.6)",
        "the same inequality with SpS and ASpS swapped",
        control_b9,
        label="detected (ASpS strictly longer)",
    ),
    theorem(
        "B.10 (5.7)",
        "P_s^SpS <= P and P_s^ASpS <= P (both are sub-samplers)",
        f"Def A.11 on the composed law; {CASES} ({EX}); tmc check_sub_distribution agrees",
        check_b10,
    ),
    control("ctl B.10", "B.10 (5.7)", "SpS with the corrected token drawn from p", control_b10),
    theorem(
        "ASpS=SpS n=1",
        "with one reference token ASpS equals SpS (§6, Table 5)",
        f"neighbour laws for len(sigma) <= 1; tmc laws for n = 1; {CASES} ({EX})",
        check_one_token,
    ),
    control(
        "ctl n=1",
        "ASpS=SpS n=1",
        "the same equality for two reference tokens",
        control_one_token,
        label="detected (they differ for n = 2)",
    ),
    theorem(
        "SpS formula",
        "App. B.1's explicit SpS step equals the recursion",
        f"every continuing sigma, a, b; {CASES} ({EX})",
        check_sps_formula,
    ),
    control(
        "ctl formula", "SpS formula", "the SpS formula with eq. (1)'s + in place of x", control_sps_formula
    ),
    theorem(
        "eq. (1)",
        "eq. (1) with x for + and (.)_+ is a coupling of P_ref and P with diagonal sum min(P_ref, P)",
        f"Table 1 cell by cell + random rows, V <= 4 ({EX})",
        check_eq1,
    ),
    control(
        "ctl eq. (1)",
        "eq. (1)",
        "the independent coupling P_ref(x) P(y)",
        control_eq1,
        method="same diagonal check",
    ),
    counterexample(
        "eq. (1) print",
        "eq. (1) exactly as printed gives a coupling",
        f"Table 1 + random rows ({EX})",
        printed_eq1,
        label="FALSE as printed (typo)",
        note="Eq. (1) of §2 prints P_s(y; x) = [(1 - P(x)/P_ref(x)) + (P(y) - P_ref(y))_+] / "
        "sum_z (P_ref(z) - P(z))_+ for y != x. On the paper's own Table 1 (x = a, y = b) this is "
        "(0.4 + 0.1)/0.2 = 2.5, not a probability. The intended form, used in App. B.1, multiplies "
        "and clips: (1 - P(x)/P_ref(x))_+ (P(y) - P_ref(y))_+ / sum_z (P_ref(z) - P(z))_+; "
        "without the clip the product is negative when P(x) > P_ref(x) (x = b: -1/6 at y = c).",
    ),
    theorem(
        "Tables 2-3",
        "the paper's Tables 2 (SpS) and 3 (ASpS) follow from the recursion",
        f"every cell of both tables; accepted tokens 1.10 vs 1.06 ({EX})",
        check_tables,
    ),
    control("ctl Tables", "Tables 2-3", "Table 2 against the ASpS recursion and vice versa", control_tables),
    theorem(
        "tmc kernels",
        "eq. (1) chained and Alg. 1 run literally, and tmc's sps_kernel / asps_kernel, equal the "
        "recursion's P_N~ per draft; tmc's also averaged",
        f"toy_models chains n = 1..3, every draft; literal ({EX}); tmc chain_output_law (tol {KERNEL_TOL:g})",
        check_kernels,
    ),
    control("ctl kernels", "tmc kernels", "an SpS kernel resampling rejections from p", control_kernels),
)
