"""Prefix tree samplers, their composition and exact induced laws.

TMC paper Appendix A.3: Def A.23 (prefix tree sampler), Def A.24
(degenerate sampler), Def A.26 (composition and self-composition ``P_s^n``),
Def A.28 (prefix sub-sampler) and the theorems they serve: Thm A.29
(sub-samplers are closed under composition), Thm A.30 (monotone path
probabilities), Thm A.31/A.32 (a non-degenerate sub-sampler of a leaf-only
``P``, composed with itself, converges to ``P``).  In speculative decoding
``P`` is the target ``p``; one verification step against a draft ``q`` is a
prefix sub-sampler of ``p``.

A prefix sampler has two views:

* :data:`PrefixSampler` ``(rng, prefix) -> path``: draws one output path
  ``>= prefix``; all randomness comes from the ``numpy.random.Generator``.
* :data:`PrefixKernel` ``prefix -> {path: probability}``: the exact law of
  the output (point masses ``P_s^({t}; prefix)``).

The built-in examples are *walks*: from the prefix, at each node either stop
or step to a child, with probabilities given by a :data:`StepRule`.  One rule
gives both views (:func:`walk_kernel`, :func:`walk_sampler`), so a sampler and
its kernel cannot drift apart.  All of them stop at once from a prefix outside
supp(P), where P's conditionals are undefined.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from tmc.order import OrderResult, check_sub_distribution
from tmc.tree import PROB_TOL, Path, TreeDistribution, TreeSpace, is_prefix

#: Def A.23 sampling view: (rng, prefix) -> an output path >= prefix.
PrefixSampler = Callable[[np.random.Generator, Path], Path]
#: Exact view: prefix -> {output path: probability}, summing to 1.
PrefixKernel = Callable[[Path], dict[Path, float]]
#: Walk rule: (prefix, node) -> {child: probability of stepping to it};
#: the walk stops at the node with the remaining probability 1 - sum.
StepRule = Callable[[Path, Path], Mapping[int, float]]


@dataclass(frozen=True)
class PrefixCheck:
    """Outcome of checking a kernel over a set of prefixes."""

    holds: bool  # True when the property holds at every prefix checked
    prefix: Path | None  # first prefix where it fails; None when it holds
    reason: str  # why it fails ("" when it holds)
    order: OrderResult | None = None  # the failing Def A.11 check (sub-sampler checks only)


# -- composition (Def A.26) -------------------------------------------------


def compose_samplers(outer: PrefixSampler, inner: PrefixSampler) -> PrefixSampler:
    """``outer o inner``: run ``inner`` from the prefix, then ``outer`` from its output.

    Both draw from the same Generator one after the other; successive draws
    are independent, which is the paper's split of the randomness b.
    """

    def composed(rng: np.random.Generator, prefix: Path) -> Path:
        return outer(rng, inner(rng, prefix))

    return composed


def self_compose_sampler(sampler: PrefixSampler, n: int) -> PrefixSampler:
    """``P_s^n``: ``sampler`` applied ``n`` times; n = 0 returns the prefix unchanged."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")

    def composed(rng: np.random.Generator, prefix: Path) -> Path:
        path = prefix
        for _ in range(n):
            path = sampler(rng, path)
        return path

    return composed


def push_forward(kernel: PrefixKernel, law: Mapping[Path, float]) -> dict[Path, float]:
    """Law of ``kernel(t)`` when t is drawn from ``law``: sum_t law(t) kernel(t)(.)."""
    out: dict[Path, float] = {}
    for mid, weight in law.items():
        if weight == 0.0:
            continue
        for path, prob in kernel(mid).items():
            out[path] = out.get(path, 0.0) + weight * prob
    return out


def compose_kernels(outer: PrefixKernel, inner: PrefixKernel) -> PrefixKernel:
    """Exact law of ``outer o inner`` (Def A.26): sum over the intermediate path."""

    def composed(prefix: Path) -> dict[Path, float]:
        return push_forward(outer, inner(prefix))

    return composed


def _memoised(kernel: PrefixKernel) -> PrefixKernel:
    """``kernel`` with results cached per prefix (kernels are pure functions)."""
    cache: dict[Path, dict[Path, float]] = {}

    def cached(prefix: Path) -> dict[Path, float]:
        if prefix not in cache:
            cache[prefix] = kernel(prefix)
        return cache[prefix]

    return cached


def self_compose_kernel(kernel: PrefixKernel, n: int) -> PrefixKernel:
    """Exact law of ``P_s^n``; n = 0 is the point mass at the prefix."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    step = _memoised(kernel)

    def composed(prefix: Path) -> dict[Path, float]:
        law: dict[Path, float] = {prefix: 1.0}
        for _ in range(n):
            law = push_forward(step, law)
        return law

    return composed


# -- induced laws and checks (Defs A.23, A.24, A.28) -------------------------


def induced_distribution(kernel: PrefixKernel, space: TreeSpace, prefix: Path) -> TreeDistribution:
    """The tree distribution ``P_s(.; prefix)`` of the kernel's output (Def A.23)."""
    return TreeDistribution.from_point_masses(space, kernel(prefix))


def _prefix_sampler_failure(kernel: PrefixKernel, space: TreeSpace, prefix: Path) -> str:
    """Why ``kernel(prefix)`` is not a valid Def A.23 output law ("" if it is)."""
    law = kernel(prefix)
    for path, prob in law.items():
        if not (0.0 <= prob <= 1.0 + PROB_TOL):
            return f"output {path} has probability {prob!r}, not in [0, 1]"
        if prob > 0.0 and not is_prefix(prefix, path):
            return f"output {path} (probability {prob:.6g}) does not extend the prefix"
        if prob > 0.0 and not space.contains(path):
            return f"output {path} is not in the tree space"
    total = math.fsum(law.values())
    if abs(total - 1.0) > PROB_TOL:
        return f"output probabilities sum to {total!r}, not 1"
    return ""


def check_prefix_sampler(
    kernel: PrefixKernel, space: TreeSpace, prefixes: Iterable[Path]
) -> PrefixCheck:
    """Def A.23: from each prefix the output is a path of S extending it, with probability 1."""
    for prefix in prefixes:
        reason = _prefix_sampler_failure(kernel, space, prefix)
        if reason:
            return PrefixCheck(False, prefix, reason)
    return PrefixCheck(True, None, "")


def is_degenerate(
    kernel: PrefixKernel, space: TreeSpace, prefixes: Iterable[Path], tol: float = 1e-12
) -> bool:
    """Def A.24: some prefix with children is returned unchanged with probability 1."""
    return any(
        not space.is_leaf(prefix) and kernel(prefix).get(prefix, 0.0) >= 1.0 - tol
        for prefix in prefixes
    )


def check_prefix_sub_sampler(
    kernel: PrefixKernel,
    p: TreeDistribution,
    prefixes: Iterable[Path] | None = None,
    tol: float = 1e-12,
) -> PrefixCheck:
    """Def A.28: ``P_s(.; s) <= P|s`` for every prefix s in supp(P).

    ``prefixes`` defaults to all of supp(P); prefixes outside supp(P) are
    skipped, since Def A.28 does not constrain them.  Each prefix is first
    checked to be a valid prefix sampler output (Def A.23), because an output
    shorter than the prefix would slip through Def A.11 alone.
    """
    todo = p.support() if prefixes is None else tuple(prefixes)
    for prefix in todo:
        if p.path_prob(prefix) == 0.0:
            continue
        reason = _prefix_sampler_failure(kernel, p.space, prefix)
        if reason:
            return PrefixCheck(False, prefix, reason)
        induced = induced_distribution(kernel, p.space, prefix)
        result = check_sub_distribution(induced, p.condition(prefix), tol)
        if not result.holds:
            assert result.witness is not None
            return PrefixCheck(False, prefix, result.witness.reason, result)
    return PrefixCheck(True, None, "")


def empirical_law(
    sampler: PrefixSampler, prefix: Path, n_samples: int, rng: np.random.Generator
) -> dict[Path, float]:
    """Frequencies of ``n_samples`` independent outputs of ``sampler`` from ``prefix``."""
    if n_samples < 1:
        raise ValueError(f"n_samples must be >= 1, got {n_samples}")
    counts: dict[Path, int] = {}
    for _ in range(n_samples):
        path = sampler(rng, prefix)
        counts[path] = counts.get(path, 0) + 1
    return {path: c / n_samples for path, c in counts.items()}


# -- walks: one rule, two views ----------------------------------------------


def _checked_step(rule: StepRule, prefix: Path, node: Path) -> dict[int, float]:
    """Nonzero step probabilities of ``rule`` at ``node``; ValueError if not a sub-probability."""
    row = {int(a): float(p) for a, p in rule(prefix, node).items()}
    bad = [a for a, p in row.items() if not (0.0 <= p <= 1.0 + PROB_TOL)]
    if bad:
        raise ValueError(f"rule({prefix}, {node})[{bad[0]}] = {row[bad[0]]!r} is not in [0, 1]")
    if math.fsum(row.values()) > 1.0 + PROB_TOL:
        raise ValueError(f"rule({prefix}, {node}) sums to more than 1")
    return {a: p for a, p in row.items() if p > 0.0}


def walk_kernel(rule: StepRule, *, max_nodes: int = 1_000_000) -> PrefixKernel:
    """Exact output law of the walk driven by ``rule`` (see module docstring)."""

    def kernel(prefix: Path) -> dict[Path, float]:
        law: dict[Path, float] = {}
        stack: list[tuple[Path, float]] = [(prefix, 1.0)]
        for _ in range(max_nodes):
            if not stack:
                return law
            node, weight = stack.pop()
            row = _checked_step(rule, prefix, node)
            stop = max(0.0, 1.0 - math.fsum(row.values()))
            if stop > 0.0:
                law[node] = law.get(node, 0.0) + weight * stop
            stack.extend((node + (a,), weight * p) for a, p in row.items())
        if not stack:  # the walk ended at its max_nodes-th node
            return law
        raise ValueError(f"rule: walk from {prefix} visits more than max_nodes={max_nodes} nodes")

    return kernel


def walk_sampler(rule: StepRule) -> PrefixSampler:
    """Sampler of the walk driven by ``rule``: one uniform draw per step."""

    def sampler(rng: np.random.Generator, prefix: Path) -> Path:
        node = prefix
        while True:
            u = float(rng.random())
            child = _pick(_checked_step(rule, prefix, node), u)
            if child is None:
                return node
            node = node + (child,)

    return sampler


def _pick(row: Mapping[int, float], u: float) -> int | None:
    """Child whose cumulative interval holds ``u`` in [0, 1); None means stop."""
    cum = 0.0
    for a, p in row.items():
        cum += p
        if u < cum:
            return a
    return None


def _ancestral_rule(p: TreeDistribution, steps: int) -> StepRule:
    def rule(prefix: Path, node: Path) -> Mapping[int, float]:
        if len(node) - len(prefix) >= steps or p.path_prob(node) == 0.0:
            return {}
        return p.child_probs(node)

    return rule


def _truncating_rule(p: TreeDistribution, stop_prob: float) -> StepRule:
    def rule(prefix: Path, node: Path) -> Mapping[int, float]:
        if p.path_prob(node) == 0.0:
            return {}
        return {a: (1.0 - stop_prob) * pa for a, pa in p.child_probs(node).items()}

    return rule


def _tempered_rule(p: TreeDistribution, temperature: float, steps: int) -> StepRule:
    def rule(prefix: Path, node: Path) -> Mapping[int, float]:
        if len(node) - len(prefix) >= steps or p.path_prob(node) == 0.0:
            return {}
        row = p.child_probs(node)
        go = math.fsum(row.values())  # keep P's chance of continuing, re-weight who
        weights = {a: pa ** (1.0 / temperature) for a, pa in row.items()}
        total = math.fsum(weights.values())
        return {a: go * w / total for a, w in weights.items()}

    return rule


def _check_steps(steps: int) -> None:
    if steps < 0:
        raise ValueError(f"steps must be >= 0, got {steps}")


def _check_stop_prob(stop_prob: float) -> None:
    if not (0.0 <= stop_prob <= 1.0):  # also rejects NaN
        raise ValueError(f"stop_prob must be in [0, 1], got {stop_prob!r}")


def ancestral_step_kernel(p: TreeDistribution, steps: int) -> PrefixKernel:
    """Extend the prefix by up to ``steps`` tokens drawn from P's conditionals, then stop.

    A prefix sub-sampler of any P (each node's children keep P's proportions,
    with c = 1 inside the window and c = 0 at its edge); non-degenerate on
    supp(P) when ``steps >= 1`` and P is leaf-only.
    """
    _check_steps(steps)
    return walk_kernel(_ancestral_rule(p, steps))


def ancestral_step_sampler(p: TreeDistribution, steps: int) -> PrefixSampler:
    """Sampling view of :func:`ancestral_step_kernel`."""
    _check_steps(steps)
    return walk_sampler(_ancestral_rule(p, steps))


def truncating_kernel(p: TreeDistribution, stop_prob: float) -> PrefixKernel:
    """At every node stop with probability ``stop_prob``, else step by P(a|s).

    A lossy prefix sub-sampler (c = 1 - stop_prob at every node);
    ``stop_prob = 0`` implements P and ``stop_prob = 1`` is degenerate.
    """
    _check_stop_prob(stop_prob)
    return walk_kernel(_truncating_rule(p, stop_prob))


def truncating_sampler(p: TreeDistribution, stop_prob: float) -> PrefixSampler:
    """Sampling view of :func:`truncating_kernel`."""
    _check_stop_prob(stop_prob)
    return walk_sampler(_truncating_rule(p, stop_prob))


def tempered_step_kernel(p: TreeDistribution, temperature: float, steps: int = 1) -> PrefixKernel:
    """Like :func:`ancestral_step_kernel` but children re-weighted by P(a|s)^(1/T).

    A negative example: for ``temperature != 1`` and a node with two children
    of unequal probability the child proportions change, so it is *not* a
    prefix sub-sampler of P (Def A.28); ``temperature = 1`` gives back the
    ancestral kernel.
    """
    _check_steps(steps)
    if not temperature > 0.0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}")
    return walk_kernel(_tempered_rule(p, temperature, steps))
