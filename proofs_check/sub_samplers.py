"""Checks of the TMC paper's Appendix A.3: prefix sub-samplers, composition and convergence.

Thm A.27 (a sampler implementing a leaf-only P is a fixed point of
composition), A.29 (prefix sub-samplers of a leaf-only P are closed under
composition, and ``P_sub^0`` is one), A.30 (monotone path probabilities;
its stronger sub-distribution form fails, as the paper says), A.31
(pointwise convergence of ``P_sub^n``, checked with the proof's matrix
recursion ``b_i = p - A c_i``, ``c_{i+1} = B c_i``) and A.32 (total variation
is non-increasing in n, equals the mass left on inner nodes, and goes to 0).

Exact cases: a leaf-only target ``P`` on a random finite tree and random
prefix sub-samplers of it, built as walks that at each node stop with a
random probability ``h`` and otherwise step by ``P(a|node)``; every such walk
is a prefix sub-sampler (Def A.28) and every sub-sampler of a leaf-only P has
this form.  The limit ``lim_n P_sub^n`` is computed exactly by absorption
(:func:`proofs_check.exact.limit_kernel`).  Float cases: one SpS / ASpS step of
:mod:`tmc.chain` as a prefix sampler of the target ``p`` of a toy model
(``tmc.enumeration.speculative_prefix_kernel``), composed with
:mod:`tmc.prefix`.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction

import numpy as np
from hypothesis import strategies as st

from proofs_check.cases import SEEDS, draw_cases, has_uneven_node, normalised, pick, rng_for, trees
from proofs_check.exact import (
    ONE,
    ZERO,
    ExactTree,
    Kernel,
    Path,
    Shape,
    compose,
    identity_kernel,
    induced,
    is_prefix,
    limit_kernel,
    memoised,
    power,
    sub_defect,
    tv,
    walk_kernel,
)
from proofs_check.registry import Budget, Check, CheckResult, Tally, control, counterexample, theorem
from proofs_check.tree_theorems import show
from tmc import asps_kernel, block_kernel, sps_kernel
from tmc.enumeration import speculative_prefix_kernel, target_tree_distribution
from tmc.order import total_variation
from tmc.prefix import (
    PrefixKernel,
    check_prefix_sub_sampler,
    compose_kernels,
    induced_distribution,
    is_degenerate,
    self_compose_kernel,
)
from tmc.toy import ToyModel
from verification.strategies import toy_models

STOPS = (ZERO, ZERO, ZERO, Fraction(1, 2), Fraction(1, 3), Fraction(2, 3), Fraction(1, 5), ONE)
N_STEPS = 5  # self-compositions examined explicitly (the limit is computed exactly)
TMC_TOL = 1e-12  # agreement asked of tmc.prefix on exact cases
SPEC_TOL = 1e-10  # tolerance for the float SpS/ASpS cases


# -- kernels -------------------------------------------------------------------------


def sub_sampler(p: ExactTree, stops: Mapping[tuple[Path, Path], Fraction]) -> Kernel:
    """From prefix s, at node t stop with probability h(s, t), else step by P(a|t).

    A prefix sub-sampler of P (Def A.28): the output's children at t are
    P's, scaled by ``1 - h``.  From a prefix outside supp(P), which Def A.28
    does not constrain, it appends the first child token, so that it is not
    degenerate there either (Def A.24 quantifies over every prefix).
    """
    conds = {s: p.cond(s) for s in p.support() if not p.shape.is_leaf(s)}

    def rule(prefix: Path, node: Path) -> dict[int, Fraction]:
        if p.prob(prefix) == 0:
            kids = p.shape.children(prefix)
            return {kids[0]: ONE} if node == prefix and kids else {}
        if node not in conds:
            return {}
        go = 1 - stops.get((prefix, node), ZERO)
        return {a: go * q for a, q in conds[node].items() if q}

    return walk_kernel(rule)


def random_stops(
    p: ExactTree, rng: np.random.Generator, *, degenerate_at: Path | None = None
) -> dict[tuple[Path, Path], Fraction]:
    """Random stop probabilities; h(s, s) < 1 at inner nodes (non-degenerate) unless ``degenerate_at``."""
    stops: dict[tuple[Path, Path], Fraction] = {}
    for s in p.support():
        for t in p.shape.subtree(s):
            if p.prob(t) and not p.shape.is_leaf(t):
                h = pick(rng, STOPS)
                stops[(s, t)] = h if (t != s or h < 1) else ZERO
    if degenerate_at is not None:
        stops[(degenerate_at, degenerate_at)] = ONE
    return stops


def random_sampler(shape: Shape, rng: np.random.Generator) -> Kernel:
    """An arbitrary prefix sampler (Def A.23) unrelated to any P: random walk rows."""
    table: dict[tuple[Path, Path], dict[int, Fraction]] = {}
    for s in shape.nodes():
        for t in shape.subtree(s):
            kids = shape.children(t)
            if kids:
                row = normalised([int(rng.integers(0, 4)) for _ in range(len(kids) + 1)])
                table[(s, t)] = dict(zip(kids, row[:-1]))
    return walk_kernel(lambda s, t: table.get((s, t), {}))


def skewed(p: ExactTree) -> Kernel:
    """Like P's own walk but children re-weighted by P(a|t)^2: not a sub-sampler."""
    conds = {s: p.cond(s) for s in p.support() if not p.shape.is_leaf(s)}

    def rule(prefix: Path, node: Path) -> dict[int, Fraction]:
        if node not in conds:
            return {}
        row = conds[node]
        go = sum(row.values(), ZERO)
        squares = {a: q * q for a, q in row.items() if q}
        total = sum(squares.values(), ZERO)
        return {a: go * w / total for a, w in squares.items()}

    return walk_kernel(rule)


def backtracking(inner: Kernel) -> Kernel:
    """Not a prefix sampler: returns the prefix's parent with probability 1/2."""

    def kernel(prefix: Path) -> dict[Path, Fraction]:
        if not prefix:
            return dict(inner(prefix))
        law = {t: m / 2 for t, m in inner(prefix).items()}
        law[prefix[:-1]] = law.get(prefix[:-1], ZERO) + Fraction(1, 2)
        return law

    return memoised(kernel)


def to_float(kernel: Kernel) -> PrefixKernel:
    """An exact kernel as a float :data:`tmc.prefix.PrefixKernel`."""
    return lambda prefix: {t: float(m) for t, m in kernel(prefix).items()}


def path_prob(law: Mapping[Path, Fraction], s: Path) -> Fraction:
    """P_s(s; prefix) from a law's point masses: the mass at or below s."""
    return sum((m for t, m in law.items() if is_prefix(s, t)), ZERO)


# -- case families -------------------------------------------------------------------

LEAF_CASES = st.tuples(trees(kind="leaf_only"), SEEDS)
UNEVEN_CASES = st.tuples(
    trees(kind="leaf_only", min_vocab=2).filter(has_uneven_node), SEEDS
)  # skew changes them
ANY_CASES = st.tuples(trees(kind="any"), SEEDS)


def spec_models(budget: Budget, n: int, offset: int) -> list[ToyModel]:
    """Toy draft/target pairs (all relations of verification.strategies) with rows to depth 3."""
    return draw_cases(toy_models(max_vocab=3, depth=3), n, budget.seed + offset)


SPEC_DEPTH = 3  # tree depth of the float SpS/ASpS cases
SPEC_KERNELS = {"SpS": sps_kernel, "ASpS": asps_kernel, "block": block_kernel}


# -- Thm A.27 ------------------------------------------------------------------------


def _a27(tally: Tally, p: ExactTree, outer: Kernel, inner: Kernel) -> None:
    composed = compose(outer, inner)
    for s in p.support():
        tally.count("prefixes")
        law = induced(composed, p.shape, s)
        if not tally.truth(law.same_as(p.condition(s)), f"(P_s o Q_s)(.; {s}) = {show(law, 60)} != P|{s}"):
            return


def check_a27(budget: Budget) -> CheckResult:
    tally = Tally()
    for i, (p, case_seed) in enumerate(draw_cases(LEAF_CASES, budget.n(300), budget.seed + 31)):
        tally.case(f"case {i} P = {show(p)}, seed {case_seed}")
        _a27(tally, p, random_sampler(p.shape, rng_for(case_seed)), sub_sampler(p, {}))
    return tally.result()


def control_a27(budget: Budget) -> CheckResult:
    """Q_s implements a P that is not leaf-only: the composition moves its inner mass."""
    tally = Tally()
    for i, (p, case_seed) in enumerate(draw_cases(ANY_CASES, budget.n(60), budget.seed + 32)):
        if p.is_leaf_only():
            continue
        tally.case(f"case {i} P = {show(p)} (not leaf-only)")
        _a27(tally, p, random_sampler(p.shape, rng_for(case_seed)), sub_sampler(p, {}))
    return tally.result()


# -- Thm A.29 ------------------------------------------------------------------------


def _is_sub_sampler(tally: Tally, kernel: Kernel, p: ExactTree, what: str) -> bool:
    for s in p.support():
        law = induced(kernel, p.shape, s)
        if not tally.truth(
            sub_defect(law, p.condition(s)) == 0, f"{what}(.; {s}) = {show(law, 60)} is not <= P|{s}"
        ):
            return False
    return True


def check_a29(budget: Budget) -> CheckResult:
    tally = Tally()
    for i, (p, case_seed) in enumerate(draw_cases(LEAF_CASES, budget.n(300), budget.seed + 33)):
        tally.case(f"case {i} P = {show(p)}, seed {case_seed}")
        rng = rng_for(case_seed)
        outer, inner = sub_sampler(p, random_stops(p, rng)), sub_sampler(p, random_stops(p, rng))
        if not (_is_sub_sampler(tally, outer, p, "P_sub") and _is_sub_sampler(tally, inner, p, "Q_sub")):
            continue  # a generator error, already recorded
        _is_sub_sampler(tally, identity_kernel, p, "P_sub^0")
        composed = compose(outer, inner)
        _is_sub_sampler(tally, composed, p, "P_sub o Q_sub")
        check = check_prefix_sub_sampler(
            compose_kernels(to_float(outer), to_float(inner)), p.to_tmc(), tol=TMC_TOL
        )
        tally.cross(ONE, float(check.holds), "check_prefix_sub_sampler(compose_kernels(...))")
    for i, (p, _) in enumerate(draw_cases(ANY_CASES, budget.n(60), budget.seed + 45)):
        # the other answer too: P's own walk composed with itself is a sub-sampler exactly when P is leaf-only
        tally.case(f"cross case {i} P = {show(p)}: walk o walk")
        walk = sub_sampler(p, {})
        twice = compose(walk, walk)
        ours = all(sub_defect(induced(twice, p.shape, s), p.condition(s)) == 0 for s in p.support())
        tally.count(f"sub-sampler {ours}")
        theirs = check_prefix_sub_sampler(to_float(twice), p.to_tmc(), tol=TMC_TOL).holds
        tally.cross(float(ours), float(theirs), "check_prefix_sub_sampler(walk o walk)")
    for i, model in enumerate(spec_models(budget, budget.n(45), 34)):
        tally.case(f"float case {i}: SpS step o ASpS step on {model.name}")
        tally.count("SpS o ASpS")
        target = target_tree_distribution(model, SPEC_DEPTH)
        sps = speculative_prefix_kernel(model, 2, sps_kernel, SPEC_DEPTH)
        asps = speculative_prefix_kernel(model, 2, asps_kernel, SPEC_DEPTH)
        check = check_prefix_sub_sampler(compose_kernels(sps, asps), target, tol=SPEC_TOL)
        tally.truth(check.holds, f"SpS o ASpS is not a prefix sub-sampler at {check.prefix}: {check.reason}")
    return tally.result()


def control_a29_leaf(budget: Budget) -> CheckResult:
    """P not leaf-only, P_sub = Q_sub = P's own walk: P o P terminates less often than P."""
    tally = Tally()
    for i, (p, _) in enumerate(draw_cases(ANY_CASES, budget.n(60), budget.seed + 35)):
        if p.is_leaf_only():
            continue
        tally.case(f"case {i} P = {show(p)} (not leaf-only)")
        walk = sub_sampler(p, {})
        _is_sub_sampler(tally, compose(walk, walk), p, "P_sub o Q_sub")
    return tally.result()


def control_a29_skew(budget: Budget) -> CheckResult:
    """Q_sub replaced by a walk with squared child weights (not a sub-sampler)."""
    tally = Tally()
    for i, (p, case_seed) in enumerate(draw_cases(UNEVEN_CASES, budget.n(60), budget.seed + 36)):
        tally.case(f"case {i} P = {show(p)}")
        _is_sub_sampler(
            tally, compose(sub_sampler(p, random_stops(p, rng_for(case_seed))), skewed(p)), p, "P_sub o skew"
        )
    return tally.result()


# -- Thm A.30 ------------------------------------------------------------------------


def _a30(tally: Tally, shape: Shape, outer: Kernel, inner: Kernel) -> None:
    composed = compose(outer, inner)
    for prefix in shape.nodes():
        law_c, law_q = composed(prefix), inner(prefix)
        for s in shape.nodes():
            if not tally.at_least(path_prob(law_c, s), path_prob(law_q, s), f"(P o Q)({s}; {prefix})"):
                return


def check_a30(budget: Budget) -> CheckResult:
    tally = Tally()
    for i, (p, case_seed) in enumerate(draw_cases(LEAF_CASES, budget.n(250), budget.seed + 37)):
        rng = rng_for(case_seed)
        tally.case(f"case {i} P = {show(p)}, sub-samplers, seed {case_seed}")
        _a30(tally, p.shape, sub_sampler(p, random_stops(p, rng)), sub_sampler(p, random_stops(p, rng)))
        tally.case(f"case {i} shape of P, arbitrary prefix samplers, seed {case_seed}")
        tally.count("arbitrary samplers")
        _a30(tally, p.shape, random_sampler(p.shape, rng), random_sampler(p.shape, rng))
    return tally.result()


def control_a30(budget: Budget) -> CheckResult:
    """The outer sampler may return the prefix's parent (violates Def A.23)."""
    tally = Tally()
    for i, (p, case_seed) in enumerate(draw_cases(LEAF_CASES, budget.n(60), budget.seed + 38)):
        rng = rng_for(case_seed)
        tally.case(f"case {i} P = {show(p)}")
        _a30(tally, p.shape, backtracking(random_sampler(p.shape, rng)), random_sampler(p.shape, rng))
    return tally.result()


def strong_a30_table() -> tuple[ExactTree, Kernel, Kernel]:
    """Hand counterexample: binary tree of depth 2, P uniform on the 4 leaves.

    Q_sub from the root stops there w.p. 1/2, else walks to a leaf.  P_sub
    from the root steps one token and stops.  Then Q(tau | (0,)) = 0 but
    (P_sub o Q_sub)(tau | (0,)) = 1/2: Q_sub's children at (0,) would need
    c = 2 > 1.
    """
    shape = Shape.full(2, 2)
    p = ExactTree(shape, {leaf: Fraction(1, 4) for leaf in shape.nodes() if len(leaf) == 2})
    q_sub = sub_sampler(p, {((), ()): Fraction(1, 2)})
    p_sub = sub_sampler(p, {((), (0,)): ONE, ((), (1,)): ONE})
    return p, p_sub, q_sub


def strong_a30(budget: Budget) -> CheckResult:
    """Is Q_sub(.; s) <= (P_sub o Q_sub)(.; s)?  The paper says not in general."""
    tally = Tally()
    p, outer, inner = strong_a30_table()
    cases: list[tuple[ExactTree, Kernel, Kernel]] = [(p, outer, inner)]
    for p, case_seed in draw_cases(LEAF_CASES, budget.n(300), budget.seed + 39):
        rng = rng_for(case_seed)
        cases.append((p, sub_sampler(p, random_stops(p, rng)), sub_sampler(p, random_stops(p, rng))))
    for i, (p, outer, inner) in enumerate(cases):
        tally.case(f"case {i} P = {show(p)}" + (" (hand table)" if i == 0 else ""))
        composed = compose(outer, inner)
        for s in p.support():
            q_law, c_law = induced(inner, p.shape, s), induced(composed, p.shape, s)
            if not tally.truth(
                sub_defect(q_law, c_law) == 0,
                f"Q(.; {s}) = {show(q_law, 50)} is not <= (P o Q)(.; {s}) = {show(c_law, 50)}",
            ):
                break
    return tally.result()


# -- Thm A.31 ------------------------------------------------------------------------


def _a31_matrices(tally: Tally, p: ExactTree, kernel: Kernel, prefix: Path, leaf: Path) -> None:
    """The proof's recursion along prefix -> leaf: b_i = p - A c_i, c_{i+1} = B c_i, B_jj < 1."""
    n = len(leaf) - len(prefix)
    nodes = [leaf[: len(prefix) + j] for j in range(n + 1)]  # prefix + a_{1:j}, j = 0..n
    cond = p.condition(prefix)
    target = [cond.prob(nodes[j]) for j in range(1, n + 1)]
    a_mat = [
        [p.condition(nodes[k]).prob(nodes[j + 1]) if j >= k else ZERO for k in range(n)] for j in range(n)
    ]
    b_mat = [[kernel(nodes[k]).get(nodes[j], ZERO) if j >= k else ZERO for k in range(n)] for j in range(n)]
    for j in range(n):
        if not tally.truth(b_mat[j][j] < 1, f"B[{j}][{j}] = 1: the sampler is degenerate at {nodes[j]}"):
            return
    c_prev: list[Fraction] | None = None
    for i in range(N_STEPS + 1):
        law = power(kernel, i)(prefix)
        b = [path_prob(law, nodes[j]) for j in range(1, n + 1)]
        c = [law.get(nodes[j], ZERO) for j in range(n)]
        for j in range(n):
            tally.equal(b[j], target[j] - sum((a_mat[j][k] * c[k] for k in range(n)), ZERO), f"b_{i}[{j}]")
            tally.at_least(target[j], b[j], f"P|prefix vs P_sub^{i}")
        if c_prev is not None:
            for j in range(n):
                tally.equal(c[j], sum((b_mat[j][k] * c_prev[k] for k in range(n)), ZERO), f"c_{i}[{j}]")
        c_prev = c


def _a31(tally: Tally, p: ExactTree, kernel: Kernel, *, matrices: bool) -> None:
    limit = limit_kernel(kernel)
    for s in p.support():
        tally.count("prefixes")
        law = induced(limit, p.shape, s)
        if not tally.truth(law.same_as(p.condition(s)), f"lim P_sub^n(.; {s}) = {show(law, 60)} != P|{s}"):
            return
        if matrices:
            for leaf in p.condition(s).masses:
                _a31_matrices(tally, p, kernel, s, leaf)


def check_a31(budget: Budget) -> CheckResult:
    tally = Tally()
    for i, (p, case_seed) in enumerate(draw_cases(LEAF_CASES, budget.n(250), budget.seed + 40)):
        tally.case(f"case {i} P = {show(p)}, seed {case_seed}")
        kernel = sub_sampler(p, random_stops(p, rng_for(case_seed)))
        _a31(tally, p, kernel, matrices=True)
        tally.cross(
            float(_degenerate(p, kernel)),
            float(is_degenerate(to_float(kernel), p.shape.space(), p.shape.nodes())),
            "tmc is_degenerate",
        )
        floats = self_compose_kernel(to_float(kernel), N_STEPS)(())
        for t, m in power(kernel, N_STEPS)(()).items():
            tally.cross(m, floats.get(t, 0.0), f"P_sub^{N_STEPS}({t})", tol=TMC_TOL)
        stuck = _degenerate_case(p, case_seed)  # the other answer of Def A.24, on the same tree
        if stuck is not None:
            tally.count("degenerate cross-checks")
            tally.cross(float(_degenerate(p, stuck)), float(is_degenerate(to_float(stuck), p.shape.space(),
                                                                          p.shape.nodes())), "tmc is_degenerate")
    return tally.result()


def _degenerate(p: ExactTree, kernel: Kernel) -> bool:
    """Def A.24 in exact arithmetic: some node with children is returned unchanged with probability 1."""
    return any(not p.shape.is_leaf(s) and kernel(s).get(s, ZERO) == ONE for s in p.shape.nodes())


def _degenerate_case(p: ExactTree, case_seed: int) -> Kernel | None:
    inner = [s for s in p.support() if not p.shape.is_leaf(s)]
    if not inner:
        return None
    return sub_sampler(p, random_stops(p, rng_for(case_seed), degenerate_at=inner[-1]))


def control_a31_degenerate(budget: Budget) -> CheckResult:
    """A sampler that never leaves one inner node of supp(P) (degenerate, Def A.24)."""
    tally = Tally()
    for i, (p, case_seed) in enumerate(draw_cases(LEAF_CASES, budget.n(60), budget.seed + 41)):
        kernel = _degenerate_case(p, case_seed)
        if kernel is None:
            continue
        tally.case(f"case {i} P = {show(p)}")
        _a31(tally, p, kernel, matrices=False)
        tally.cross(
            ONE, float(is_degenerate(to_float(kernel), p.shape.space(), p.shape.nodes())), "tmc is_degenerate"
        )
    return tally.result()


def control_a31_leaf(budget: Budget) -> CheckResult:
    """P not leaf-only, P_sub = P's own walk: the iterates push its inner mass to leaves."""
    tally = Tally()
    for i, (p, _) in enumerate(draw_cases(ANY_CASES, budget.n(60), budget.seed + 42)):
        if p.is_leaf_only():
            continue
        tally.case(f"case {i} P = {show(p)} (not leaf-only)")
        _a31(tally, p, sub_sampler(p, {}), matrices=False)
    return tally.result()


# -- Thm A.32 ------------------------------------------------------------------------


def _a32(tally: Tally, p: ExactTree, kernel: Kernel) -> None:
    for s in p.support():
        cond = p.condition(s)
        prev: Fraction | None = None
        for n in range(N_STEPS + 1):
            law = induced(power(kernel, n), p.shape, s)
            dist = tv(law, cond)
            inner_mass = sum((m for t, m in law.masses.items() if not p.shape.is_leaf(t)), ZERO)
            tally.equal(dist, inner_mass, f"TV(P_sub^{n}) vs its mass on inner nodes")
            if prev is not None:
                tally.at_least(prev, dist, f"TV(P_sub^{n - 1}) - TV(P_sub^{n})")
            prev = dist
            for d in range(p.shape.depth() + 1):
                cut = sum((m for t, m in law.masses.items() if not p.shape.is_leaf(t) and len(t) <= d), ZERO)
                tail = sum((m for t, m in cond.masses.items() if len(t) > d), ZERO)
                tally.at_least(dist, cut, f"TV >= TV_{d}")
                tally.at_least(cut + tail, dist, f"TV <= TV_{d} + tail_{d}")
        tally.equal(tv(induced(limit_kernel(kernel), p.shape, s), cond), ZERO, f"lim TV at {s}")


def check_a32(budget: Budget) -> CheckResult:
    tally = Tally(tol=SPEC_TOL)  # exact observations stay exact; the tmc float ones get SPEC_TOL
    for i, (p, case_seed) in enumerate(draw_cases(LEAF_CASES, budget.n(250), budget.seed + 43)):
        tally.case(f"case {i} P = {show(p)}, seed {case_seed}")
        kernel = sub_sampler(p, random_stops(p, rng_for(case_seed)))
        _a32(tally, p, kernel)
        space, target = p.shape.space(), p.to_tmc()
        for n in range(N_STEPS + 1):  # the float TV the speculative cases below rely on, against the exact one
            exact = tv(induced(power(kernel, n), p.shape, ()), p)
            floats = total_variation(induced_distribution(self_compose_kernel(to_float(kernel), n), space, ()), target)
            tally.cross(exact, floats, f"total_variation(P_sub^{n})", tol=TMC_TOL)
    for i, model in enumerate(spec_models(budget, budget.n(30), 44)):
        target = target_tree_distribution(model, SPEC_DEPTH)
        for name, fn in SPEC_KERNELS.items():
            tally.case(f"float case {i}: {name} steps on {model.name}")
            tally.count(f"{name} float")
            step = speculative_prefix_kernel(model, 2, fn, SPEC_DEPTH)
            tvs = [
                total_variation(induced_distribution(self_compose_kernel(step, n), target.space, ()), target)
                for n in range(SPEC_DEPTH + 2)
            ]
            for n in range(1, len(tvs)):
                tally.at_least(tvs[n - 1], tvs[n], f"TV({name}^{n - 1}) - TV({name}^{n})")
            tally.at_least(SPEC_TOL, tvs[SPEC_DEPTH], f"TV after {SPEC_DEPTH} steps")
    return tally.result()


def control_a32(budget: Budget) -> CheckResult:
    """A walk with squared child weights (not a sub-sampler) converges elsewhere."""
    tally = Tally()
    for i, (p, _) in enumerate(draw_cases(UNEVEN_CASES, budget.n(60), budget.seed + 45)):
        tally.case(f"case {i} P = {show(p)}")
        _a32(tally, p, skewed(p))
    return tally.result()


# -- registry rows ---------------------------------------------------------------------

EX = "exact rationals"

CHECKS: tuple[Check, ...] = (
    theorem(
        "A.27",
        "Q_s implementing a leaf-only P: (P_s o Q_s)(.; s) = P|s for any prefix sampler P_s",
        f"random prefix samplers P_s on random trees; every s in supp(P) ({EX})",
        check_a27,
    ),
    control(
        "ctl A.27",
        "A.27",
        "Q_s implementing a P that is not leaf-only",
        control_a27,
        label="detected (leaf-only needed)",
    ),
    theorem(
        "A.29",
        "P_sub^0 and P_sub o Q_sub are prefix sub-samplers of a leaf-only P",
        f"random sub-sampler walks, every prefix ({EX}); tmc SpS o ASpS steps (tol {SPEC_TOL:g})",
        check_a29,
    ),
    control(
        "ctl A.29",
        "A.29",
        "P not leaf-only, P_sub = Q_sub = P's own walk",
        control_a29_leaf,
        label="detected (leaf-only needed)",
    ),
    control("ctl A.29b", "A.29", "Q_sub with squared child weights (not a sub-sampler)", control_a29_skew),
    theorem(
        "A.30",
        "(P o Q)(s; prefix) >= Q(s; prefix) for all s, prefix",
        f"sub-samplers and arbitrary prefix samplers, all (s, prefix) ({EX})",
        check_a30,
    ),
    control(
        "ctl A.30", "A.30", "outer sampler returning the prefix's parent (not a prefix sampler)", control_a30
    ),
    counterexample(
        "A.30 strong",
        "Q_sub(.; s) <= (P_sub o Q_sub)(.; s) (the stronger form)",
        f"hand table + random sub-samplers ({EX})",
        strong_a30,
        label="counterexample (as the paper admits)",
        note="Strong form of Thm 4.18/A.30 fails, as the paper says. Hand table: binary tree of depth 2, "
        "P uniform on the 4 leaves; Q_sub stops at the root w.p. 1/2, else walks to a leaf; P_sub from "
        "the root steps one token and stops. Then Q(tau|(0,)) = 0 < (P o Q)(tau|(0,)) = 1/2, so "
        "Q's children at (0,) would need c = 2.",
    ),
    theorem(
        "A.31",
        "non-degenerate sub-sampler of leaf-only P: P_sub^n(s; prefix) -> P|prefix(s)",
        f"exact limit by absorption; proof's b_i = p - A c_i, c_(i+1) = B c_i, B_jj < 1 for i <= {N_STEPS} ({EX})",
        check_a31,
    ),
    control(
        "ctl A.31",
        "A.31",
        "a degenerate sub-sampler (stays put at one inner node)",
        control_a31_degenerate,
        label="detected (non-degeneracy needed)",
    ),
    control(
        "ctl A.31b",
        "A.31",
        "P not leaf-only, P_sub = P's own walk",
        control_a31_leaf,
        label="detected (leaf-only needed)",
    ),
    theorem(
        "A.32",
        "TV(P_sub^n(.; s), P|s) is non-increasing in n and tends to 0",
        f"n <= {N_STEPS}, TV = inner mass, TV_d <= TV <= TV_d + tail_d, exact limit 0 ({EX}); "
        f"tmc SpS/ASpS/block steps: TV = 0 after {SPEC_DEPTH} steps",
        check_a32,
    ),
    control("ctl A.32", "A.32", "a walk with squared child weights (not a sub-sampler)", control_a32),
)
