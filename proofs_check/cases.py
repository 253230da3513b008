"""Case generators for the theorem checks: hypothesis strategies, drawn reproducibly.

Checks do not run under ``@given`` as tests; they ask :func:`draw_cases` for
``n`` examples of a strategy, which runs a ``@given`` function
programmatically with a fixed ``@seed`` (generate phase only, no database),
so a run is reproducible from its seed and the report can say how many cases
each check saw.  Hypothesis tries its simplest examples first (one token,
depth 1, exact zeros), which are the usual edge cases.  Reproducible means
for one version of the code run the same way: Hypothesis also draws literal
constants it finds in the project's loaded modules, so an edit anywhere in
the project, or a run under pytest (which loads the tests too), can change
the cases a seed gives.

Distributions are drawn as small integer weights normalised to exact
``Fraction`` rows; the weight 1000 appears too, giving probabilities near
1e-3 (and products of them) next to ones near 1.  Exact zeros prune children.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Literal, TypeVar

import numpy as np
from hypothesis import HealthCheck, Phase, Verbosity, given, seed, settings
from hypothesis import strategies as st

from proofs_check.exact import ZERO, ExactTree, Path, Shape

T = TypeVar("T")
Kind = Literal["any", "leaf_only", "pseudo_leaf_only"]

#: Unnormalised weight of one child (or of termination).
WEIGHTS = st.one_of(st.integers(0, 4), st.just(1000))


#: Draws made per distinct case asked for: hypothesis replays its simplest examples (the one-token tree came
#: 30 times in 300), so a third of the draws were repeats; repeats are dropped, from this many draws.
DRAWS_PER_CASE = 3


def draw_cases(strategy: st.SearchStrategy[T], n: int, case_seed: int) -> list[T]:
    """Up to ``n`` distinct examples of ``strategy`` (by ``repr``), the same ones for the same ``case_seed``;
    fewer only where ``DRAWS_PER_CASE * n`` draws hold fewer distinct ones (a small space)."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    out: list[T] = []
    seen: set[str] = set()

    @seed(case_seed)
    @settings(
        max_examples=DRAWS_PER_CASE * n,
        database=None,
        deadline=None,
        derandomize=False,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
        verbosity=Verbosity.quiet,
        report_multiple_bugs=False,
    )
    @given(strategy)
    def collect(case: T) -> None:
        key = repr(case)
        if key not in seen:
            seen.add(key)
            out.append(case)
        if len(out) >= n:  # enough: stop drawing (the draws cost more than many checks' cases)
            raise _Enough

    try:
        collect()
    except _Enough:
        pass
    return out[:n]


class _Enough(Exception):
    """Raised inside :func:`draw_cases`'s collector once it holds ``n`` distinct cases."""


def normalised(weights: Sequence[int]) -> tuple[Fraction, ...]:
    """Integer weights as an exact probability row (all-zero weights: first entry 1)."""
    total = sum(weights)
    if total == 0:
        return (Fraction(1),) + (ZERO,) * (len(weights) - 1)
    return tuple(Fraction(w, total) for w in weights)


# -- shapes and distributions ---------------------------------------------------


@st.composite
def shapes(
    draw: st.DrawFn, *, min_vocab: int = 1, max_vocab: int = 3, max_depth: int = 3, ragged: bool = True
) -> Shape:
    """A finite tree space: full, or ragged (each node keeps a random subset of tokens)."""
    vocab = draw(st.integers(min_vocab, max_vocab))
    depth = draw(st.integers(1, max_depth))
    if not ragged:
        return Shape.full(vocab, depth)
    kids: dict[Path, list[int]] = {}
    frontier: list[Path] = [()]
    for level in range(depth):
        nxt: list[Path] = []
        for node in frontier:
            tokens = draw(st.sets(st.integers(0, vocab - 1), min_size=1 if level == 0 else 0, max_size=vocab))
            if tokens:
                kids[node] = sorted(tokens)
                nxt.extend(node + (a,) for a in kids[node])
        frontier = nxt
    return Shape.from_children(kids)


@st.composite
def rows(draw: st.DrawFn, shape: Shape, *, kind: Kind = "any") -> dict[Path, tuple[Fraction, ...]]:
    """Child conditionals plus termination, ``rows[s] = (P(a_1|s), ..., P(tau|s))``.

    ``leaf_only``: no termination at inner nodes (Def A.20);
    ``pseudo_leaf_only``: each inner node either always stops or never (Def B.1).
    """
    out: dict[Path, tuple[Fraction, ...]] = {}
    for node in shape.inner():
        k = len(shape.children(node))
        stop = kind == "pseudo_leaf_only" and node != () and draw(st.booleans())
        if stop:
            out[node] = (ZERO,) * k + (Fraction(1),)
            continue
        weights = draw(st.lists(WEIGHTS, min_size=k, max_size=k))
        end = 0 if kind != "any" else draw(WEIGHTS)
        out[node] = normalised(weights + [end])
    return out


@st.composite
def trees(
    draw: st.DrawFn,
    shape: Shape | None = None,
    *,
    kind: Kind = "any",
    ragged: bool = True,
    min_vocab: int = 1,
) -> ExactTree:
    """An exact tree distribution of the given kind (on ``shape``, or a drawn one)."""
    space = shape if shape is not None else draw(shapes(ragged=ragged, min_vocab=min_vocab))
    return ExactTree.from_rows(space, draw(rows(space, kind=kind)))


def thinned_rows(p: ExactTree, c: Callable[[Path], Fraction]) -> dict[Path, tuple[Fraction, ...]]:
    """Rows of a P1 with ``P1(a|s) = c(s) P(a|s)``, so ``P1 <= P`` (Def A.11).

    Nodes outside supp(P) get an all-termination row (P1 never reaches them).
    """
    out: dict[Path, tuple[Fraction, ...]] = {}
    for node in p.shape.inner():
        kids = p.shape.children(node)
        if p.prob(node) == 0:
            out[node] = (ZERO,) * len(kids) + (Fraction(1),)
            continue
        scale = c(node)
        cond = p.cond(node)
        go = [scale * cond[a] for a in kids]
        out[node] = tuple(go) + (1 - sum(go, ZERO),)
    return out


SCALES = (Fraction(0), Fraction(1), Fraction(1), Fraction(1, 2), Fraction(1, 3), Fraction(5, 6))


@st.composite
def thinned(draw: st.DrawFn, p: ExactTree) -> ExactTree:
    """A random P1 <= P: each inner node keeps a fraction c in SCALES of P's children."""
    scales = {node: draw(st.sampled_from(SCALES)) for node in p.shape.inner()}
    return ExactTree.from_rows(p.shape, thinned_rows(p, lambda s: scales[s]))


def rng_for(case_seed: int) -> np.random.Generator:
    """The numpy generator a case uses for its bulk randomness (e.g. kernel tables)."""
    return np.random.default_rng(case_seed)


def pick(rng: np.random.Generator, options: Sequence[T]) -> T:
    """One of ``options``, uniformly."""
    return options[int(rng.integers(len(options)))]


def random_row(rng: np.random.Generator, k: int, *, zero_prob: float = 0.3) -> tuple[Fraction, ...]:
    """A random exact probability row over ``k`` entries, with exact zeros."""
    weights = [0 if rng.random() < zero_prob else int(rng.integers(1, 6)) for _ in range(k)]
    return normalised(weights)


SEEDS = st.integers(0, 2**32 - 1)


def has_branching(p: ExactTree) -> bool:
    """True when some support node has two children of positive probability."""
    return any(sum(1 for q in p.cond(s).values() if q) >= 2 for s in p.support() if not p.shape.is_leaf(s))


def has_uneven_node(p: ExactTree) -> bool:
    """True when some support node has two children of different positive probability."""
    for s in p.support():
        if not p.shape.is_leaf(s):
            positive = {q for q in p.cond(s).values() if q}
            if len(positive) >= 2:
                return True
    return False
