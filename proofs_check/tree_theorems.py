"""Checks of the TMC paper's Appendix A.1-A.2: tree distributions and the sub-distribution order.

Thm A.6 (path probabilities determine the distribution), A.8 (conditioning
support), A.12-A.14 (consequences of ``P1 <= P2``), A.16 (the product form,
both directions), A.18 (tail mass vanishes), A.19 (tree expectation theorem
under each of its conditions (a), (b), (c)), A.21 and A.22 (leaf-only
distributions), and facts the text states without a number: ``<=`` is a
partial order that is not total, and the converse of A.12 is false.

Every theorem check runs in exact rational arithmetic on
:class:`proofs_check.exact.ExactTree` cases drawn by hypothesis
(:mod:`proofs_check.cases`), and compares the float implementation in
:mod:`tmc.tree` / :mod:`tmc.order` with the exact values on the same cases
(reported as the "tmc" part of the margin).  Each has a negative control.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from fractions import Fraction

import numpy as np
from hypothesis import strategies as st

from proofs_check.cases import (
    SEEDS,
    WEIGHTS,
    draw_cases,
    has_branching,
    normalised,
    rng_for,
    shapes,
    thinned,
    trees,
)
from proofs_check.exact import (
    ONE,
    ZERO,
    ExactTree,
    Path,
    Shape,
    comparable,
    is_prefix,
    product_defect,
    sub_defect,
)
from proofs_check.registry import Budget, Check, CheckResult, Tally, control, counterexample, theorem
from tmc.order import check_product_form, check_sub_distribution, pointwise_distance
from tmc.tree import TreeSpace, tail_mass_beyond

TMC_TOL = 1e-12  # float agreement asked of tmc on these small cases


def show(p: ExactTree, limit: int = 160) -> str:
    """The point masses of ``p`` in a short string."""
    text = "{" + ", ".join(f"{s}: {m}" for s, m in sorted(p.masses.items())) + "}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


# -- case families ------------------------------------------------------------

PAIRS = st.builds(lambda p, seed: (p, seed), trees(kind="any"), SEEDS)


@st.composite
def related_pairs(draw: st.DrawFn) -> tuple[ExactTree, ExactTree]:
    """(P1, P2) with P1 <= P2 by construction (P1 keeps a fraction of P2's children)."""
    p2 = draw(trees(kind=draw(st.sampled_from(("any", "leaf_only", "pseudo_leaf_only")))))
    return draw(thinned(p2)), p2


@st.composite
def perturbed_pairs(draw: st.DrawFn) -> tuple[ExactTree, ExactTree]:
    """(P1, P2) on one shape: related, then (maybe) one node of P1 re-drawn at random."""
    p1, p2 = draw(related_pairs())
    inner = [s for s in p1.support() if not p1.shape.is_leaf(s)]
    if not inner or draw(st.booleans()):
        return p1, p2
    node = draw(st.sampled_from(inner))
    table = {
        s: tuple(list(p1.cond(s).values()) + [p1.term(s)]) for s in p1.support() if s in p1.shape.inner()
    }
    k = len(p1.shape.children(node))
    table[node] = normalised(draw(st.lists(WEIGHTS, min_size=k + 1, max_size=k + 1)))
    full = {s: table.get(s, (ZERO,) * len(p1.shape.children(s)) + (ONE,)) for s in p1.shape.inner()}
    return ExactTree.from_rows(p1.shape, full), p2


@st.composite
def independent_pairs(draw: st.DrawFn, *, min_vocab: int = 1) -> tuple[ExactTree, ExactTree]:
    """(P1, P2) drawn independently on one shape."""
    shape = draw(shapes(min_vocab=min_vocab))
    return draw(trees(shape, kind="any")), draw(trees(shape, kind="any"))


def mixed_pairs(budget: Budget, n: int) -> list[tuple[ExactTree, ExactTree]]:
    """Related, perturbed and independent pairs, a third each."""
    k = max(1, n // 3)
    return (
        draw_cases(related_pairs(), k, budget.seed + 11)
        + draw_cases(perturbed_pairs(), k, budget.seed + 12)
        + draw_cases(independent_pairs(), k, budget.seed + 13)
    )


# -- Thm A.6 -----------------------------------------------------------------------


def rebuild_from_path_probs(shape: Shape, probs: dict[Path, Fraction]) -> dict[Path, Fraction]:
    """Point masses from path probabilities alone: P^({s}) = P(s) - sum_a P(s+a)."""
    return {s: probs[s] - sum((probs[s + (a,)] for a in shape.children(s)), ZERO) for s in shape.nodes()}


def _a6_case(tally: Tally, p: ExactTree, probs: dict[Path, Fraction], case_seed: int) -> None:
    masses = rebuild_from_path_probs(p.shape, probs)
    if not tally.truth(all(m >= 0 for m in masses.values()), "path probabilities give a negative point mass"):
        return
    rng = rng_for(case_seed)
    nodes = p.shape.nodes()
    events: list[tuple[Path, ...]] = [(s,) for s in nodes] + [p.shape.subtree(s) for s in nodes]
    events += [tuple(s for s in nodes if rng.random() < 0.5) for _ in range(32)]
    for event in events:
        rebuilt = sum((masses[s] for s in set(event)), ZERO)
        if not tally.equal(rebuilt, p.event(event), f"P^(U) for U = {sorted(event)[:4]}..."):
            return


def check_a6(budget: Budget) -> CheckResult:
    tally = Tally()
    for i, (p, case_seed) in enumerate(draw_cases(PAIRS, budget.n(300), budget.seed + 1)):
        tally.case(f"case {i} P = {show(p)}")
        probs = {s: p.prob(s) for s in p.shape.nodes()}
        _a6_case(tally, p, probs, case_seed)
        tp = p.to_tmc()
        for s in p.shape.nodes():
            tally.cross(probs[s], tp.path_prob(s), f"P{s}")
    return tally.result()


def control_a6(budget: Budget) -> CheckResult:
    """Path probabilities of a different distribution (one point mass moved) must not rebuild P."""
    tally = Tally()
    for i, (p, case_seed) in enumerate(draw_cases(PAIRS, budget.n(60), budget.seed + 2)):
        moved = _move_one_mass(p)
        if moved is None:
            continue
        tally.case(f"case {i} P = {show(p)}")
        _a6_case(tally, p, {s: moved.prob(s) for s in p.shape.nodes()}, case_seed)
    return tally.result()


def _move_one_mass(p: ExactTree) -> ExactTree | None:
    """P with the point mass of one inner node moved to its first child (None if impossible)."""
    for s, m in p.masses.items():
        kids = p.shape.children(s)
        if kids:
            masses = dict(p.masses)
            del masses[s]
            child = s + (kids[0],)
            masses[child] = masses.get(child, ZERO) + m
            return ExactTree(p.shape, masses)
    return None


# -- Thm A.8 -----------------------------------------------------------------------


def _a8_case(tally: Tally, p: ExactTree, conditioned: Callable[[Path], ExactTree]) -> None:
    for s1 in p.support():
        cond = conditioned(s1)
        for s2 in p.shape.nodes():
            if cond.prob(s2) and not tally.truth(
                comparable(s1, s2), f"P|{s1}({s2}) = {cond.prob(s2)} but {s1}, {s2} are incomparable"
            ):
                return


def check_a8(budget: Budget) -> CheckResult:
    tally = Tally()
    for i, (p, _) in enumerate(draw_cases(PAIRS, budget.n(300), budget.seed + 3)):
        tally.case(f"case {i} P = {show(p)}")
        _a8_case(tally, p, p.condition)
        tp = p.to_tmc()
        for s1 in p.support()[:4]:
            tc, ec = tp.condition(s1), p.condition(s1)
            for s2 in p.shape.nodes():
                tally.cross(ec.prob(s2), tc.path_prob(s2), f"P|{s1}({s2})")
    return tally.result()


def control_a8(budget: Budget) -> CheckResult:
    """Using P itself in place of P|s1 must produce incomparable paths with mass."""
    tally = Tally()
    branching = st.tuples(trees(kind="any", min_vocab=2).filter(has_branching), SEEDS)
    for i, (p, _) in enumerate(draw_cases(branching, budget.n(60), budget.seed + 4)):
        tally.case(f"case {i} P = {show(p)}")
        _a8_case(tally, p, lambda s1: p)
    return tally.result()


# -- Thm A.12, A.13, A.14 ------------------------------------------------------------


def _premise(tally: Tally, p1: ExactTree, p2: ExactTree) -> bool:
    return tally.truth(sub_defect(p1, p2) == 0, "generator error: P1 <= P2 does not hold")


def _a12(tally: Tally, p1: ExactTree, p2: ExactTree) -> None:
    for s in p1.shape.nodes():
        tally.at_least(p2.prob(s), p1.prob(s), f"P2{s}")


def _a13(tally: Tally, p1: ExactTree, p2: ExactTree) -> None:
    stray = [s for s in p1.support() if p2.prob(s) == 0]
    tally.truth(not stray, f"{stray[:1]} in supp(P1) but not in supp(P2)")


def _a14(tally: Tally, p1: ExactTree, p2: ExactTree) -> None:
    for s in p1.support():
        if p2.prob(s):
            tally.at_least(p1.term(s), p2.term(s), f"P1(tau|{s})")


def _run_related(
    budget: Budget,
    seed_offset: int,
    conclusion: Callable[[Tally, ExactTree, ExactTree], None],
    *,
    cross: bool,
) -> CheckResult:
    tally = Tally()
    for i, (p1, p2) in enumerate(draw_cases(related_pairs(), budget.n(300), budget.seed + seed_offset)):
        tally.case(f"case {i} P1 = {show(p1, 80)}, P2 = {show(p2, 80)}")
        if not _premise(tally, p1, p2):
            continue
        conclusion(tally, p1, p2)
        if cross:
            t1, t2 = p1.to_tmc(), p2.to_tmc()
            for s in p1.shape.nodes():
                tally.cross(p2.prob(s) - p1.prob(s), pointwise_distance(t1, t2, s), f"dist_{s}")
    return tally.result()


def _run_swapped(
    budget: Budget, seed_offset: int, conclusion: Callable[[Tally, ExactTree, ExactTree], None]
) -> CheckResult:
    """The conclusion applied to (P2, P1) where P1 <= P2 strictly: the premise is false."""
    tally = Tally()
    for i, (p1, p2) in enumerate(draw_cases(related_pairs(), budget.n(60), budget.seed + seed_offset)):
        if p1.same_as(p2):
            continue
        tally.case(f"case {i} (swapped) P1 = {show(p2, 80)}, P2 = {show(p1, 80)}")
        conclusion(tally, p2, p1)
    return tally.result()


def check_a12(budget: Budget) -> CheckResult:
    return _run_related(budget, 5, _a12, cross=True)


def control_a12(budget: Budget) -> CheckResult:
    return _run_swapped(budget, 6, _a12)


def check_a13(budget: Budget) -> CheckResult:
    return _run_related(budget, 7, _a13, cross=False)


def control_a13(budget: Budget) -> CheckResult:
    """P2 with one branch cut off; P1 = half of P2, half a point mass on the cut branch."""
    tally = Tally()
    for i, p2 in enumerate(
        draw_cases(trees(kind="any").filter(has_branching), budget.n(60), budget.seed + 8)
    ):
        cut = _cut_branch(p2)
        if cut is None:
            continue
        p2_cut, lost = cut
        masses = {s: m / 2 for s, m in p2_cut.masses.items()}
        masses[lost] = masses.get(lost, ZERO) + Fraction(1, 2)
        bad = ExactTree(p2.shape, masses)
        tally.case(f"case {i} P1 = {show(bad, 80)}, P2 = {show(p2_cut, 80)}")
        _a13(tally, bad, p2_cut)
    return tally.result()


def _cut_branch(p: ExactTree) -> tuple[ExactTree, Path] | None:
    """(P with the subtree of one child of an inner support node folded into the node, that child)."""
    for s in p.support():
        for a in p.shape.children(s):
            child = s + (a,)
            if p.prob(child) and p.prob(child) < p.prob(s):
                masses = {t: m for t, m in p.masses.items() if not is_prefix(child, t)}
                masses[s] = masses.get(s, ZERO) + p.prob(child)
                return ExactTree(p.shape, masses), child
    return None


def check_a14(budget: Budget) -> CheckResult:
    return _run_related(budget, 9, _a14, cross=False)


def control_a14(budget: Budget) -> CheckResult:
    return _run_swapped(budget, 10, _a14)


# -- Thm A.16 ----------------------------------------------------------------------


def _a16(tally: Tally, pairs: list[tuple[ExactTree, ExactTree]], *, termination: bool) -> None:
    for i, (p1, p2) in enumerate(pairs):
        tally.case(f"case {i} P1 = {show(p1, 80)}, P2 = {show(p2, 80)}")
        d_def, d_prod = sub_defect(p1, p2), product_defect(p1, p2, termination=termination)
        tally.count("related" if d_def == 0 else "unrelated")
        tally.truth(
            (d_def == 0) == (d_prod == 0),
            f"Def A.11 says {d_def == 0} but the product form says {d_prod == 0}",
        )
        if termination and (d_def == 0 or d_def > 1e-9):
            t1, t2 = p1.to_tmc(), p2.to_tmc()
            holds = float(d_def == 0)
            tally.cross(holds, float(check_sub_distribution(t1, t2, TMC_TOL).holds), "check_sub_distribution")
            tally.cross(holds, float(check_product_form(t1, t2, TMC_TOL).holds), "check_product_form")


def check_a16(budget: Budget) -> CheckResult:
    tally = Tally()
    _a16(tally, mixed_pairs(budget, budget.n(450)), termination=True)
    return tally.result()


def control_a16(budget: Budget) -> CheckResult:
    """The product form without its termination clause must disagree with Def A.11."""
    tally = Tally()
    pairs = [(p2, p1) for p1, p2 in draw_cases(related_pairs(), budget.n(60), budget.seed + 14)]
    _a16(tally, pairs, termination=False)
    return tally.result()


# -- text: partial order, converse of A.12 ----------------------------------------


@st.composite
def chains3(draw: st.DrawFn) -> tuple[ExactTree, ExactTree, ExactTree]:
    """P1 <= P2 <= P3 by two thinnings."""
    p3 = draw(trees(kind="any"))
    p2 = draw(thinned(p3))
    return draw(thinned(p2)), p2, p3


def check_order(budget: Budget) -> CheckResult:
    tally = Tally()
    for i, (p1, p2, p3) in enumerate(draw_cases(chains3(), budget.n(300), budget.seed + 15)):
        tally.case(f"case {i} P1 = {show(p1, 60)}, P2 = {show(p2, 60)}, P3 = {show(p3, 60)}")
        tally.truth(sub_defect(p3, p3) == 0, "reflexivity: P3 <= P3 fails")
        tally.truth(sub_defect(p1, p3) == 0, "transitivity: P1 <= P2 <= P3 but not P1 <= P3")
        if sub_defect(p2, p1) == 0:
            tally.count("mutual")
            tally.truth(p1.same_as(p2), "antisymmetry: P1 <= P2 <= P1 but P1 != P2")
    return tally.result()


def control_order(budget: Budget) -> CheckResult:
    """Totality must fail: independent pairs with neither P1 <= P2 nor P2 <= P1."""
    tally = Tally()
    for i, (p1, p2) in enumerate(draw_cases(independent_pairs(min_vocab=2), budget.n(120), budget.seed + 16)):
        tally.case(f"case {i} P1 = {show(p1, 80)}, P2 = {show(p2, 80)}")
        tally.truth(sub_defect(p1, p2) == 0 or sub_defect(p2, p1) == 0, "P1 and P2 are incomparable")
    return tally.result()


@st.composite
def one_child_thinned(draw: st.DrawFn) -> tuple[ExactTree, ExactTree]:
    """(P1, P2): P1 = P2 except that at one node one child's mass is moved to termination."""
    p2 = draw(trees(kind="any"))
    nodes = (
        [s for s in p2.support() if sum(1 for a, v in p2.cond(s).items() if v) >= 2]
        if p2.shape.inner()
        else []
    )
    if not nodes:
        return p2, p2
    node = draw(st.sampled_from(nodes))
    kids = [a for a, v in p2.cond(node).items() if v]
    a = draw(st.sampled_from(kids))
    masses = dict(p2.masses)
    moved = ZERO
    for t in list(masses):
        if is_prefix(node + (a,), t):
            moved += masses.pop(t) / 2
            masses[t] = p2.masses[t] / 2
    masses[node] = masses.get(node, ZERO) + moved
    return ExactTree(p2.shape, masses), p2


def converse_a12(budget: Budget) -> CheckResult:
    """Is "P1(s) <= P2(s) for all s" sufficient for P1 <= P2?  It must not be."""
    tally = Tally()
    pairs = draw_cases(one_child_thinned(), budget.n(150), budget.seed + 17)
    pairs.append(_converse_table())
    for i, (p1, p2) in enumerate(pairs):
        if any(p1.prob(s) > p2.prob(s) for s in p1.shape.nodes()):
            continue
        tally.case(f"case {i} P1 = {show(p1, 80)}, P2 = {show(p2, 80)}")
        tally.truth(
            sub_defect(p1, p2) == 0, "P1(s) <= P2(s) everywhere, yet P1 is not a sub-distribution of P2"
        )
    return tally.result()


def _converse_table() -> tuple[ExactTree, ExactTree]:
    """Two tokens, depth 1: P2 = (1/2, 1/2) at the leaves; P1 stops at the root w.p. 1/5."""
    shape = Shape.full(2, 1)
    p2 = ExactTree(shape, {(0,): Fraction(1, 2), (1,): Fraction(1, 2)})
    p1 = ExactTree(shape, {(): Fraction(1, 5), (0,): Fraction(1, 2), (1,): Fraction(3, 10)})
    return p1, p2


# -- Thm A.18 ----------------------------------------------------------------------


def node_rng_row(case_seed: int, path: Path, vocab: int, *, floor_half: bool) -> tuple[Fraction, ...]:
    """A row ``(P(a|s)..., P(tau|s))`` that depends only on (seed, path), for infinite trees.

    With ``floor_half`` the termination weight is at least the children's
    total, so ``P(tau|s) >= 1/2`` everywhere.
    """
    rng = np.random.default_rng([case_seed, len(path), *path])
    kids = [int(w) if rng.random() > 0.25 else 0 for w in rng.integers(1, 5, size=vocab)]
    end = sum(kids) + int(rng.integers(0, 4)) if floor_half else int(rng.integers(0, 4))
    return normalised(kids + [max(end, 1) if floor_half else end])


def depth_probs(
    row: Callable[[Path], tuple[Fraction, ...]], vocab: int, depth: int
) -> Iterator[tuple[Path, Fraction, Fraction]]:
    """``(s, P(s), P(tau|s))`` for every node with len(s) <= depth and P(s) > 0, DFS."""
    stack: list[tuple[Path, Fraction]] = [((), ONE)]
    while stack:
        node, prob = stack.pop()
        r = row(node)
        yield node, prob, r[-1]
        if len(node) < depth:
            stack.extend((node + (a,), prob * r[a]) for a in range(vocab) if r[a])


def exact_tail(row: Callable[[Path], tuple[Fraction, ...]], vocab: int, depth: int) -> Fraction:
    """P^[len > depth] by brute force: the mass continuing past the depth-``depth`` nodes."""
    return sum(
        (prob * (1 - term) for s, prob, term in depth_probs(row, vocab, depth) if len(s) == depth), ZERO
    )


A18_DEPTH = {1: 12, 2: 8, 3: 5}  # deepest cut enumerated, by vocabulary size


def half_tail(d: int) -> Fraction:
    """Bound on P^[len > d] where P(tau|s) >= 1/2 at every node: d + 1 continuations of at most 1/2 each."""
    return Fraction(1, 2 ** (d + 1))


def heavy_tail(d: int) -> Fraction:
    """P^[len > d] of :func:`heavy_row` (stop w.p. 1/(k+2) at depth k): the product telescopes to 1/(d+2)."""
    return Fraction(1, d + 2)


def escaping_tail(d: int) -> Fraction:
    """P^[len > d] of :func:`escaping_row`: prod_(k=0..d) (1 - 1/(k+2)^2) = (d+3) / (2(d+2)), which tends to 1/2."""
    return Fraction(d + 3, 2 * (d + 2))


def a18_tails(row: Callable[[Path], tuple[Fraction, ...]], vocab: int) -> list[Fraction]:
    """The enumerated tails ``P^[len > d]``, ``d = 0 .. A18_DEPTH[vocab]``."""
    return [exact_tail(row, vocab, d) for d in range(A18_DEPTH[vocab] + 1)]


def _a18_case(tally: Tally, row: Callable[[Path], tuple[Fraction, ...]], vocab: int, tails: list[Fraction],
              closed: Callable[[int], Fraction], limit: Fraction, *, bound: bool, cross: bool) -> None:
    """The tails of ``row`` (:func:`a18_tails`): non-increasing, and equal to the family's closed form
    ``closed(d)`` (at most it, where ``bound``).  The closed forms' limits are known (0 for the
    distributions, 1/2 for the control's leak), so the vanishing is read from them, not from a threshold at
    some depth (a tail of 1/(d+2) vanishes, slowly, and a fixed 0.02 at depth 12 had flagged it)."""
    depth = len(tails) - 1
    for d in range(depth):
        tally.at_least(tails[d], tails[d + 1], f"tail({d})")
    for d, t in enumerate(tails):
        if bound:
            tally.at_least(closed(d), t, f"closed-form bound on tail({d})")
        else:
            tally.equal(t, closed(d), f"tail({d}) vs its closed form")
    tally.equal(limit, ZERO, "the closed form's limit")
    if cross:
        space = TreeSpace.full(vocab, None)

        def cond(s: Path) -> dict[int, float]:
            return {a: float(p) for a, p in enumerate(row(s)[:-1]) if p}

        for d in range(min(depth, 4) + 1):
            tally.cross(tails[d], tail_mass_beyond(space, cond, d), f"tail({d})")


def check_a18(budget: Budget) -> CheckResult:
    tally = Tally()
    cases = draw_cases(st.tuples(st.integers(1, 3), SEEDS), budget.n(60), budget.seed + 18)
    for i, (vocab, case_seed) in enumerate(cases):
        tally.case(f"case {i} V = {vocab}, seed {case_seed} (P(tau|s) >= 1/2 everywhere: tail <= 2^-(d+1) -> 0)")
        row = half_row(case_seed, vocab)
        _a18_case(tally, row, vocab, a18_tails(row, vocab), half_tail, ZERO, bound=True, cross=True)
    for i, (vocab, case_seed) in enumerate(draw_cases(st.tuples(st.integers(1, 3), SEEDS), budget.n(30),
                                                      budget.seed + 30)):
        tally.case(f"heavy case {i} V = {vocab}, seed {case_seed} (stop w.p. 1/(k+2): tail = 1/(d+2) -> 0)")
        row = heavy_row(case_seed, vocab)
        _a18_case(tally, row, vocab, a18_tails(row, vocab), heavy_tail, ZERO, bound=False, cross=True)
    for i, p in enumerate(draw_cases(trees(kind="any"), budget.n(60), budget.seed + 19)):
        tally.case(f"finite case {i} P = {show(p)}")
        tails = [
            sum((m for s, m in p.masses.items() if len(s) > d), ZERO) for d in range(p.shape.depth() + 1)
        ]
        for d in range(len(tails) - 1):
            tally.at_least(tails[d], tails[d + 1], f"tail({d})")
        tally.equal(tails[-1], ZERO, "tail(depth)")
        tp = p.to_tmc()
        for d, t in enumerate(tails):
            tally.cross(t, tp.tail_mass(d), f"tail_mass({d})")
    return tally.result()


def escaping_row(path: Path) -> tuple[Fraction, ...]:
    """One token; stop at depth k with probability 1/(k+2)^2: half the mass never stops."""
    stop = Fraction(1, (len(path) + 2) ** 2)
    return (1 - stop, stop)


def control_a18(budget: Budget) -> CheckResult:
    """Conditionals that leak mass to infinite paths are not a tree distribution: tail -> 1/2.

    The enumerated tails must equal their closed form (else the check itself is wrong: an error, not a
    detection); the violation is the closed form's limit, 1/2 where A.18 says 0."""
    tails = a18_tails(escaping_row, 1)
    if tails != [escaping_tail(d) for d in range(len(tails))]:
        raise AssertionError(f"the control's tails {tails[:4]}... are not its closed form (d+3)/(2(d+2))")
    tally = Tally()
    tally.case("one token, P(tau | depth k) = 1/(k+2)^2: tail = (d+3)/(2(d+2)) -> 1/2")
    _a18_case(tally, escaping_row, 1, tails, escaping_tail, Fraction(1, 2), bound=False, cross=False)
    return tally.result()


# -- Thm A.19 ----------------------------------------------------------------------

Value = dict[Path, Fraction]


@st.composite
def martingale_cases(draw: st.DrawFn) -> tuple[ExactTree, Value, int]:
    """(P, V, sign) on a finite tree: V is unbiased (sign 0), super- (sign -1) or sub- (sign +1)."""
    p = draw(trees(kind="any"))
    sign = draw(st.sampled_from((0, 0, 1, -1)))
    free = draw(st.lists(st.integers(-5, 5), min_size=len(p.shape.nodes()), max_size=len(p.shape.nodes())))
    slack = draw(st.lists(st.integers(0, 3), min_size=len(p.shape.nodes()), max_size=len(p.shape.nodes())))
    value: Value = {}
    for i, s in reversed(list(enumerate(p.shape.nodes()))):
        if p.prob(s) == 0 or p.shape.is_leaf(s) or p.term(s) == 1:
            value[s] = Fraction(free[i])
            continue
        cond = p.cond(s)
        mean = sum((cond[a] * value[s + (a,)] for a in cond), ZERO) / (1 - p.term(s))
        # sign +1: P(tau)V + sum P(a)V(s+a) >= V(s), i.e. V(s) <= mean, so E[V] >= V(root)
        value[s] = mean - sign * Fraction(slack[i]) / (1 - p.term(s))
    return p, value, sign


def _expectation(p: ExactTree, value: Value) -> Fraction:
    return sum((m * value[s] for s, m in p.masses.items()), ZERO)


def check_a19a(budget: Budget) -> CheckResult:
    tally = Tally()
    for i, (p, value, sign) in enumerate(draw_cases(martingale_cases(), budget.n(300), budget.seed + 20)):
        tally.case(f"case {i} ({['unbiased', 'sub', 'super'][sign]}) P = {show(p, 100)}")
        tally.count(["=", ">=", "<="][sign])
        mean = _expectation(p, value)
        if sign == 0:
            tally.equal(mean, value[()], "E[V]")
        elif sign > 0:
            tally.at_least(mean, value[()], "E[V]")
        else:
            tally.at_least(value[()], mean, "V(root)")
    return tally.result()


def control_a19(budget: Budget) -> CheckResult:
    """V made biased at one node (value raised by 1) must break E[V] = V(root)."""
    tally = Tally()
    for i, (p, value, sign) in enumerate(draw_cases(martingale_cases(), budget.n(60), budget.seed + 21)):
        reached = [s for s in p.support() if p.mass(s)]
        if sign != 0 or not reached:
            continue
        tally.case(f"case {i} P = {show(p, 100)}, V raised at {reached[-1]}")
        broken = dict(value)
        broken[reached[-1]] += 1  # only the terminating mass sees it; the parent keeps its old mean
        tally.equal(_expectation(p, broken), broken[()], "E[V]")
    return tally.result()


Increment = Callable[[Path, int], Fraction]  # (node, child) -> V(node + a) - V(node)


def _a19_infinite(
    tally: Tally, row: Callable[[Path], tuple[Fraction, ...]], vocab: int, depth: int, step: Increment,
    remainder: Callable[[int], Fraction] | None = None,
) -> Fraction:
    """Check E[V(s stopped at the cut)] = V(root) = 0 exactly; return P(len > depth).

    With ``remainder``: also, at every cut ``d <= depth``, ``|E[V 1(len <= d)] - V(root)| <= remainder(d)``,
    exactly.  ``E[V 1(len <= d)]`` (the finished paths' part of ``E[V]``) tends to ``E[V]``, and its gap to
    ``V(root)`` is ``E[V(s_d) 1(len > d)]``, which the hypothesis bounds by ``remainder(d)``, a closed form with
    limit 0: so ``E[V] = V(root)``.  On a case outside the hypothesis (the doubling martingale) the gap stays
    near 1 and the bound is violated.
    """
    values: dict[Path, Fraction] = {(): ZERO}
    stopped = ZERO
    tail = ZERO
    finished = [ZERO] * (depth + 1)  # E[V 1(len = d)]
    for s, prob, term in depth_probs(row, vocab, depth):
        v = values[s]
        finished[len(s)] += prob * term * v
        if len(s) == depth:
            stopped += prob * v  # the stopped process keeps all of P(s) at the cut
            tail += prob * (1 - term)
            continue
        stopped += prob * term * v
        for a in range(vocab):
            values[s + (a,)] = v + step(s, a)
    tally.equal(stopped, ZERO, "E[V stopped at the cut]")
    if remainder is not None:
        done = ZERO
        for d in range(depth + 1):
            done += finished[d]
            tally.at_least(remainder(d), abs(done), f"|E[V 1(len <= {d})] - V(root)|")
    return tail


def _mean_step(
    row: Callable[[Path], tuple[Fraction, ...]], f: tuple[int, ...], weight: Callable[[int], Fraction]
) -> Increment:
    """Increment ``weight(len) (f(a) - mu(s))`` with mu the mean of f given continuing."""

    def step(s: Path, a: int) -> Fraction:
        r = row(s)
        go = 1 - r[-1]
        mu = sum((r[b] * f[b] for b in range(len(r) - 1)), ZERO) / go if go else ZERO
        return weight(len(s) + 1) * (f[a] - mu)

    return step


A19_DEPTH = {1: 12, 2: 7, 3: 4}  # cut depth for (b), by vocabulary size
A19C_DEPTH = {1: 150, 2: 9, 3: 5}  # cut depth for (c): its tail only falls like 1/(d+2)


F_VALUES = st.lists(st.integers(-3, 3), min_size=3, max_size=3).filter(any)


def _a19b(budget: Budget, n: int, offset: int, *, centred: bool) -> CheckResult:
    tally = Tally()
    cases = draw_cases(st.tuples(st.integers(1, 3), SEEDS, F_VALUES), n, budget.seed + offset)
    for i, (vocab, case_seed, f) in enumerate(cases):
        tally.case(f"case {i} V = {vocab}, seed {case_seed}, f = {f}" + ("" if centred else " (not centred)"))
        row = half_row(case_seed, vocab)
        step = _mean_step(row, tuple(f), lambda k: ONE) if centred else _raw_step(tuple(f), lambda k: ONE)
        # increments |f(a) - mu| <= 2 max|f| = c, so |V(s_d)| <= c d; P(tau|s) >= 1/2 gives P(len > d) <= 2^-(d+1)
        _a19_infinite(tally, row, vocab, A19_DEPTH[vocab], step, b_remainder(2 * max(abs(x) for x in f)))
    return tally.result()


def b_remainder(c: int) -> Callable[[int], Fraction]:
    """(b)'s bound on ``|E[V(s_d) 1(len > d)]|``: increments at most ``c`` and ``P(len > d) <= 2^-(d+1)``."""
    return lambda d: c * d * half_tail(d)


def c_remainder(c: int) -> Callable[[int], Fraction]:
    """(c)'s bound on ``|E[V(s_d) 1(len > d)]|``: ``|V| <= c`` and ``P(len > d) = 1/(d+2)`` (:func:`heavy_row`)."""
    return lambda d: c * heavy_tail(d)


def _halving(k: int) -> Fraction:
    """Weight 2^-k of the k-th increment: keeps V bounded."""
    return Fraction(1, 2**k)


def _raw_step(f: tuple[int, ...], weight: Callable[[int], Fraction]) -> Increment:
    """Increment ``weight(len) f(a)``: not centred, so V is not unbiased (a control)."""
    return lambda s, a: weight(len(s) + 1) * f[a]


def check_a19b(budget: Budget) -> CheckResult:
    """(b): bounded increments, E[len] < inf (P(tau|s) >= 1/2), V unbounded."""
    return _a19b(budget, budget.n(60), 22, centred=True)


def control_a19b(budget: Budget) -> CheckResult:
    """Increments f(a) without subtracting their mean: V is not unbiased."""
    return _a19b(budget, budget.n(45), 28, centred=False)


def half_row(case_seed: int, vocab: int) -> Callable[[Path], tuple[Fraction, ...]]:
    """Per-node random rows with P(tau|s) >= 1/2 everywhere."""
    return lambda s: node_rng_row(case_seed, s, vocab, floor_half=True)


def heavy_row(case_seed: int, vocab: int) -> Callable[[Path], tuple[Fraction, ...]]:
    """Children from a per-node random row, stop w.p. 1/(k+2) at depth k: E[len] = infinity."""

    def row(path: Path) -> tuple[Fraction, ...]:
        kids = node_rng_row(case_seed, path, vocab, floor_half=False)[:-1]
        total = sum(kids, ZERO)
        share = tuple(k / total for k in kids) if total else (ONE,) + (ZERO,) * (vocab - 1)
        go = 1 - Fraction(1, len(path) + 2)
        return tuple(go * x for x in share) + (1 - go,)

    return row


def check_a19c(budget: Budget) -> CheckResult:
    """(c): V bounded (|V| <= 2 max|f|), E[len] infinite (P(len > k) = 1/(k+2))."""
    return _a19c(budget, budget.n(60), 23, centred=True)


def control_a19c(budget: Budget) -> CheckResult:
    """Bounded but not centred increments 2^-k f(a): V is not unbiased."""
    return _a19c(budget, budget.n(45), 29, centred=False)


def _a19c(budget: Budget, n: int, offset: int, *, centred: bool) -> CheckResult:
    tally = Tally()
    cases = draw_cases(st.tuples(st.integers(1, 3), SEEDS, F_VALUES), n, budget.seed + offset)
    for i, (vocab, case_seed, f) in enumerate(cases):
        tally.case(f"case {i} V = {vocab}, seed {case_seed}, f = {f}" + ("" if centred else " (not centred)"))
        row = heavy_row(case_seed, vocab)
        depth = A19C_DEPTH[vocab]
        step = _mean_step(row, tuple(f), _halving) if centred else _raw_step(tuple(f), _halving)
        # |V| <= sum_k 2^-k |f - mu| <= 2 max|f| = c
        tail = _a19_infinite(tally, row, vocab, depth, step, c_remainder(2 * max(abs(x) for x in f)))
        tally.equal(tail, heavy_tail(depth), "P(len > d) of the heavy-tailed family")
    return tally.result()


def doubling_outside(remainder: Callable[[int], Fraction]) -> CheckResult:
    """The doubling martingale (unbiased, first increment 1) run through a hypothesis' bound with ``c = 1``: it
    meets neither (b) (its increments grow) nor (c) (V is unbounded), and its finished mean 1 - 2^-d stays off
    V(root) = 0 by more than the bound."""
    tally = Tally()
    tally.case("doubling martingale (E[V] = 1, V(root) = 0) with c = 1")
    _a19_infinite(tally, doubling_row, 2, 12, doubling_step, remainder)
    return tally.result()


def control_a19b_doubling(budget: Budget) -> CheckResult:
    return doubling_outside(b_remainder(1))


def control_a19c_doubling(budget: Budget) -> CheckResult:
    return doubling_outside(c_remainder(1))


def doubling_row(path: Path) -> tuple[Fraction, ...]:
    """Token 0 = win (then stop), token 1 = lose; fair coin while losing."""
    if path and path[-1] == 0:
        return (ZERO, ZERO, ONE)
    return (Fraction(1, 2), Fraction(1, 2), ZERO)


def doubling_step(s: Path, a: int) -> Fraction:
    """Stake 2^k after k losses: win +2^k, lose -2^k."""
    return Fraction(2 ** len(s)) * (1 if a == 0 else -1)


def doubling_a19(budget: Budget) -> CheckResult:
    """Without (a)-(c): the doubling martingale has E[len] = 2 but E[V] = 1 != V(root) = 0."""
    tally = Tally()
    depth = 24
    tally.case("doubling martingale, cut at depth 24")
    _a19_infinite(tally, doubling_row, 2, depth, doubling_step)  # the stopped mean is still 0
    finished = ZERO
    mean = ZERO
    value: dict[Path, Fraction] = {(): ZERO}
    for s, prob, term in depth_probs(doubling_row, 2, depth):
        for a in (0, 1):
            value[s + (a,)] = value[s] + doubling_step(s, a)
        if term:
            finished += prob * term
            mean += prob * term * value[s]
    # V = 1 on every finished path and P(finished by d) -> 1, so E[V] = 1
    tally.equal(mean / finished, ONE, "E[V | finished by the cut]")
    tally.equal(mean / finished, ZERO, "E[V] vs V(root)")
    return tally.result()


# -- Thm A.21, A.22 ----------------------------------------------------------------


def _a21(tally: Tally, p: ExactTree) -> None:
    inner = [s for s in p.masses if not p.shape.is_leaf(s)]
    tally.truth(not inner, f"point mass {p.masses[inner[0]] if inner else 0} on inner node {inner[:1]}")


def check_a21(budget: Budget) -> CheckResult:
    tally = Tally()
    for i, p in enumerate(draw_cases(trees(kind="leaf_only"), budget.n(300), budget.seed + 24)):
        tally.case(f"case {i} P = {show(p)}")
        _a21(tally, p)
        tally.cross(ONE, float(p.to_tmc().is_leaf_only()), "is_leaf_only")
    # tmc's predicates (Def A.20, Def B.1) against the exact ones on trees of every kind, so that both answers
    # are asked of them (a constant True had passed every check)
    for kind in ("any", "pseudo_leaf_only"):
        for i, p in enumerate(draw_cases(trees(kind=kind), budget.n(60), budget.seed + 26)):
            tally.case(f"cross case {i} ({kind}) P = {show(p)}")
            tp = p.to_tmc()
            tally.count(f"leaf-only {p.is_leaf_only()}")
            tally.count(f"pseudo-leaf-only {p.is_pseudo_leaf_only()}")
            tally.cross(float(p.is_leaf_only()), float(tp.is_leaf_only()), "is_leaf_only")
            tally.cross(float(p.is_pseudo_leaf_only()), float(tp.is_pseudo_leaf_only()), "is_pseudo_leaf_only")
    return tally.result()


def control_a21(budget: Budget) -> CheckResult:
    tally = Tally()
    for i, p in enumerate(draw_cases(trees(kind="any"), budget.n(60), budget.seed + 25)):
        tally.case(f"case {i} (not leaf-only) P = {show(p)}")
        _a21(tally, p)
    return tally.result()


@st.composite
def a22_cases(draw: st.DrawFn) -> tuple[ExactTree, list[ExactTree]]:
    """A leaf-only P1 and candidate P2s: P1 itself, perturbations, independent draws."""
    p1 = draw(trees(kind="leaf_only"))
    candidates = [p1, draw(thinned(p1))]
    for _ in range(3):
        candidates.append(draw(trees(p1.shape, kind=draw(st.sampled_from(("any", "leaf_only"))))))
    return p1, candidates


def _a22(tally: Tally, p1: ExactTree, candidates: list[ExactTree]) -> None:
    for p2 in candidates:
        if sub_defect(p1, p2) == 0:
            tally.count("P1<=P2")
            tally.truth(p1.same_as(p2), f"P1 <= P2 but P2 = {show(p2, 60)} differs from P1")


def check_a22(budget: Budget) -> CheckResult:
    tally = Tally()
    for i, (p1, candidates) in enumerate(draw_cases(a22_cases(), budget.n(200), budget.seed + 26)):
        tally.case(f"case {i} P1 = {show(p1)}")
        _a22(tally, p1, candidates)
    return tally.result()


def control_a22(budget: Budget) -> CheckResult:
    """P1 thinned from a leaf-only P2 is not leaf-only; P1 <= P2 yet P1 != P2."""
    tally = Tally()
    for i, (p1, p2) in enumerate(draw_cases(related_pairs(), budget.n(60), budget.seed + 27)):
        if p1.is_leaf_only():
            continue
        tally.case(f"case {i} P1 = {show(p1, 80)} (not leaf-only)")
        _a22(tally, p1, [p2])
    return tally.result()


# -- the registry rows ------------------------------------------------------------------

EXACT = "exact rationals"

CHECKS: tuple[Check, ...] = (
    theorem(
        "A.6",
        "equal path probabilities P(s) give equal measures on every event",
        f"rebuild P^ from P(s) alone; compare singletons, cylinders, 32 random events ({EXACT})",
        check_a6,
    ),
    control("ctl A.6", "A.6", "path probabilities of P' (one mass moved) must not rebuild P", control_a6),
    theorem(
        "A.8",
        "P|s1(s2) != 0 implies s1 and s2 are comparable",
        f"all pairs (s1 in supp, s2 in S) ({EXACT})",
        check_a8,
    ),
    control("ctl A.8", "A.8", "P in place of P|s1 gives mass to incomparable paths", control_a8),
    theorem(
        "A.12",
        "P1 <= P2 implies P1(s) <= P2(s) for all s",
        f"pairs P1 <= P2 by thinning; every node ({EXACT})",
        check_a12,
    ),
    control("ctl A.12", "A.12", "the same inequality for swapped pairs (P2, P1)", control_a12),
    theorem(
        "A.13",
        "P1 <= P2 implies supp(P1) is a subset of supp(P2)",
        f"pairs P1 <= P2 by thinning ({EXACT})",
        check_a13,
    ),
    control("ctl A.13", "A.13", "P1 with half its mass outside supp(P2)", control_a13),
    theorem(
        "A.14",
        "P1 <= P2 implies P1(tau|s) >= P2(tau|s) on the common support",
        f"pairs P1 <= P2 by thinning ({EXACT})",
        check_a14,
    ),
    control("ctl A.14", "A.14", "the same inequality for swapped pairs (P2, P1)", control_a14),
    theorem(
        "A.16",
        "P1 <= P2 iff P1(s+a)P2(s+b) = P1(s+b)P2(s+a) and P1(tau|s) >= P2(tau|s)",
        f"Def A.11 vs product form on related/perturbed/independent pairs, both ways ({EXACT})",
        check_a16,
    ),
    control(
        "ctl A.16",
        "A.16",
        "the product form without the termination clause",
        control_a16,
        method="same equivalence",
    ),
    theorem(
        "order",
        "<= is reflexive, antisymmetric and transitive (text after Def A.11)",
        f"chains P1 <= P2 <= P3 by thinning ({EXACT})",
        check_order,
    ),
    control(
        "ctl order",
        "order",
        "<= is not total: independent pairs are incomparable",
        control_order,
        method="comparability of random pairs",
    ),
    counterexample(
        "A.12 conv",
        "P1(s) <= P2(s) for all s implies P1 <= P2 (the converse the text rejects)",
        f"one child thinned at one node, plus a hand table ({EXACT})",
        converse_a12,
        label="counterexample (as the paper says)",
    ),
    theorem(
        "A.18",
        "the tail mass P^[len>d] vanishes as d grows",
        "infinite trees: tails non-increasing and <= 2^-(d+1) (P(tau|s) >= 1/2) or = 1/(d+2) (heavy), closed forms "
        "with limit 0; finite trees: 0",
        check_a18,
    ),
    control("ctl A.18", "A.18", "conditionals leaking mass to infinity (not a distribution)", control_a18),
    theorem(
        "A.19(a)",
        "finite depth: unbiased V gives E[V] = V(root) (>=, <= for sub/super)",
        f"random finite trees, V built bottom-up with slack ({EXACT})",
        check_a19a,
    ),
    theorem(
        "A.19(b)",
        "bounded increments and E[len] < inf: E[V] = V(root)",
        "infinite trees, P(tau|s) >= 1/2, unbounded random-walk V: stopped mean exact; finished mean within "
        "c d 2^-(d+1) of V(root) at every cut",
        check_a19b,
    ),
    theorem(
        "A.19(c)",
        "V bounded: E[V] = V(root), even with E[len] = inf",
        "infinite trees, P(len > k) = 1/(k+2), bounded V: stopped mean exact; finished mean within c/(d+2) of "
        "V(root) at every cut",
        check_a19c,
    ),
    control("ctl A.19", "A.19(a)", "V biased at one node", control_a19, method="same check as (a)"),
    control(
        "ctl A.19(b)",
        "A.19(b)",
        "increments f(a) not centred (V not unbiased)",
        control_a19b,
        method="same check as (b)",
    ),
    control(
        "ctl A.19(c)",
        "A.19(c)",
        "increments 2^-k f(a) not centred (V not unbiased)",
        control_a19c,
        method="same check as (c)",
    ),
    control(
        "ctl A.19(b) hyp",
        "A.19(b)",
        "unbiased V outside (b): the doubling martingale, increments 2^k",
        control_a19b_doubling,
        method="same bound as (b), c = 1",
    ),
    control(
        "ctl A.19(c) hyp",
        "A.19(c)",
        "unbiased V outside (c): the doubling martingale, V unbounded",
        control_a19c_doubling,
        method="same bound as (c), c = 1",
    ),
    counterexample(
        "A.19 none",
        "without (a)-(c) the conclusion may fail",
        "doubling martingale: E[len] = 2, E[V] = 1, V(root) = 0",
        doubling_a19,
        label="counterexample (conditions needed)",
    ),
    theorem("A.21", "leaf-only P has point mass only on leaves", f"leaf-only trees ({EXACT})", check_a21),
    control("ctl A.21", "A.21", "trees with termination mass inside", control_a21),
    theorem(
        "A.22",
        "P1 <= P2 with P1 leaf-only implies P2 = P1",
        f"leaf-only P1 vs P1, a thinning and 3 random P2 ({EXACT})",
        check_a22,
    ),
    control("ctl A.22", "A.22", "P1 not leaf-only (thinned from P2): P1 <= P2 but P1 != P2", control_a22),
)
