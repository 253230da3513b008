"""Builder randomness as categorical draws, so it can be sampled *or enumerated*.

A tree builder draws every random token through one call,
``sampler.draw(law) -> token``, with ``law`` the exact probability row the
token is drawn from.  In use the sampler wraps a ``numpy.random.Generator``
(:class:`RngSampler`: one uniform per draw, inverse CDF).  For the exact tests
:func:`enumerate_runs` re-runs the builder once per sequence of choices with a
:class:`ScriptedSampler`, branching at every draw over the tokens with positive
probability, and returns every outcome with its exact probability — the
builder's whole randomness, enumerated, with no change to its code.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar, runtime_checkable

import numpy as np
from numpy.typing import NDArray

from tmc.noise import categorical
from tmc.validate import as_rng, check_int

T = TypeVar("T")
FloatArray = NDArray[np.float64]

__all__ = ["RngSampler", "Sampler", "ScriptedSampler", "TooManyRuns", "as_sampler", "enumerate_runs", "estimate_runs"]


@runtime_checkable
class Sampler(Protocol):
    """Source of a builder's random tokens."""

    def draw(self, law: FloatArray) -> int:
        """One token drawn from ``law`` (a non-negative row with positive sum)."""
        ...


def _check_law_shape(law: FloatArray) -> None:
    """``ValueError`` unless ``law`` is a non-empty 1-D numpy array (O(1): builders draw from rows they
    validated, so the entries are not looked at here)."""
    if not isinstance(law, np.ndarray) or law.ndim != 1 or law.size == 0:
        raise ValueError(f"law must be a non-empty 1-D numpy array, got {type(law).__name__} of shape "
                         f"{np.shape(law)}")


def _checked_total(law: FloatArray) -> float:
    """``law``'s sum, or ``ValueError`` unless it is a non-empty 1-D array with a finite positive sum."""
    _check_law_shape(law)
    total = float(law.sum())
    if not (np.isfinite(total) and total > 0.0):
        raise ValueError(f"law must have a finite positive sum, got {total!r}")
    return total


@dataclass
class RngSampler:
    """Draws with one ``rng.random()`` uniform each (inverse CDF, :func:`tmc.noise.categorical`).

    ``ValueError`` for a law that is not a non-empty 1-D array with a finite positive sum (an ``assert`` in
    :func:`~tmc.noise.categorical` had caught some of these, and not under ``python -O``); its entries are
    not checked one by one (builders draw from rows they validated)."""

    rng: np.random.Generator

    def draw(self, law: FloatArray) -> int:
        _check_law_shape(law)
        return categorical(law, float(self.rng.random()))  # ValueError for a total not finite and positive


def as_sampler(rng: np.random.Generator | int | Sampler) -> Sampler:
    """A :class:`Sampler` from a generator, an integer seed or a sampler (an object with a callable ``draw``)."""
    if callable(getattr(rng, "draw", None)):
        return rng  # type: ignore[return-value]
    return RngSampler(as_rng(rng))


class _Branch(Exception):
    """Raised by :class:`ScriptedSampler` at the first draw past its script."""

    def __init__(self, law: FloatArray) -> None:
        super().__init__("unscripted draw")
        self.law = law


@dataclass
class ScriptedSampler:
    """Replays a fixed sequence of tokens and accumulates their probability.

    ``draws`` records every ``(law, token)`` it served, so a test can compare
    the law a builder says it sampled from with the law it really used.
    """

    script: tuple[int, ...]
    weight: float = 1.0
    draws: list[tuple[FloatArray, int]] = field(default_factory=list)

    def draw(self, law: FloatArray) -> int:
        k = len(self.draws)
        row = np.array(law, dtype=np.float64)  # a copy: what it records stays as it was served
        total = _checked_total(row)
        if k == len(self.script):
            raise _Branch(row)
        tok = self.script[k]
        if not 0 <= tok < len(row):
            raise ValueError(f"script[{k}] = {tok} is outside a law of {len(row)} tokens")
        self.weight *= float(row[tok]) / total
        self.draws.append((row / total, tok))
        return tok


class TooManyRuns(ValueError):
    """The enumeration would need more builder runs than allowed."""


def enumerate_runs(run: Callable[[ScriptedSampler], T], max_runs: int = 100_000) -> list[tuple[T, float, ScriptedSampler]]:
    """Every outcome of ``run`` over all its random draws: ``(result, probability, sampler)``.

    ``run`` is called once per complete sequence of choices (plus once per
    branching point); the probabilities sum to 1.  ``TooManyRuns`` once more
    than ``max_runs`` calls would be needed; ``ValueError`` for a law that is
    not a non-empty 1-D row with a finite positive sum or has a negative entry.
    """
    max_runs = check_int("max_runs", max_runs, minimum=1)
    out: list[tuple[T, float, ScriptedSampler]] = []
    stack: list[tuple[int, ...]] = [()]
    calls = 0
    while stack:
        script = stack.pop()
        calls += 1
        if calls > max_runs:
            raise TooManyRuns(f"enumerating the builder's randomness needs more than {max_runs} runs")
        sampler = ScriptedSampler(script)
        try:
            result = run(sampler)
        except _Branch as branch:
            if (branch.law < 0.0).any():  # a branch of such a law would be lost, or weighed wrongly
                raise ValueError(f"law has a negative entry: {branch.law.tolist()}") from None
            support = np.flatnonzero(branch.law > 0.0)
            stack.extend(script + (int(t),) for t in reversed(support))
            continue
        out.append((result, sampler.weight, sampler))
    return out


@dataclass
class _ProbeSampler:
    """One probe of :func:`estimate_runs`: a token drawn uniformly from each law's support, the support sizes
    multiplied along the way."""

    rng: np.random.Generator
    width: float = 1.0  # d_1 d_2 ... d_j: the choice tree's nodes at this depth, as this path sees them
    nodes: float = 1.0  # 1 + d_1 + d_1 d_2 + ...

    def draw(self, law: FloatArray) -> int:
        support = np.flatnonzero(np.asarray(law, dtype=np.float64) > 0.0)
        if not support.size:
            raise ValueError("law has no token of positive probability")
        self.width *= len(support)
        self.nodes += self.width
        return int(support[self.rng.integers(len(support))])


def estimate_runs(run: Callable[[Sampler], object], probes: int = 64, rng: np.random.Generator | int = 0) -> float:
    """Estimate of the number of runs :func:`enumerate_runs` would make for ``run``, from ``probes`` runs.

    Knuth's estimator of a search tree's size ("Estimating the efficiency of backtrack programs", 1975): follow
    one random path through the choices, each branch with equal chance, and count ``1 + d_1 + d_1 d_2 + ...``
    (``d_j`` the number of tokens with positive probability at the ``j``-th draw).  Its mean over paths is the
    number of nodes of the tree of choices, which is the number of runs :func:`enumerate_runs` makes (one per
    branching point and one per complete sequence); a few probes give its order of magnitude cheaply.
    """
    gen = as_rng(rng)
    probes = check_int("probes", probes, minimum=1)
    total = 0.0
    for _ in range(probes):
        probe = _ProbeSampler(gen)
        run(probe)
        total += probe.nodes
    return total / probes
