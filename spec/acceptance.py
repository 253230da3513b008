"""What a tree builder buys: exact (or Monte Carlo) tokens per step next to the LP limit.

Notation (DESIGN.md §3): ``p`` target, ``q`` draft.  A builder's *draft law*
is the distribution of the trees it builds on a toy model; every tree carries
its probability.  :func:`builder_drafts` enumerates that law exactly by
re-running the builder over every sequence of its random draws
(:func:`spec.randomness.enumerate_runs`) and merging equal trees, and hands
the list to the same pipeline the fixed shapes use (:mod:`tmc.laws`,
:func:`tmc.lp_limit`): each verifier's expected length and completion error,
and the LP limit for the same draft law.  When the enumeration would need too
many runs, :func:`builder_report` falls back to Monte Carlo over sampled trees,
each scored exactly by its kernel (``E[len | tree]``), with a 95% interval.

:func:`step_sequence_law` chains several steps — the builder's state (DynaTree's
history) carried from step to step along every branch — and returns the
exact law of everything emitted, whose completion identity must hold too.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from spec.builders import TreeBuilder, make_builder
from spec.draft import ToyDraft
from spec.randomness import TooManyRuns, enumerate_runs, estimate_runs
from tmc.commands.acceptance import TREE_VERIFIERS, TreeRule
from tmc.commands.table import format_table
from tmc.drafts import TreeDraft
from tmc.laws import TreeKernel, completion_cells, completion_error, draft_depth, output_law
from tmc.multidraft import DraftTree, Draw, tree_kernel_outputs
from tmc.toy import Path, ToyModel
from tmc.validate import as_rng, check_int

__all__ = [
    "DEFAULT_MAX_RUNS",
    "random_stationary_model",
    "render_builder_report",
    "StepSequenceLaw",
    "builder_drafts",
    "builder_report",
    "sample_builder_drafts",
    "step_sequence_law",
    "verifiers_for",
]

#: Builder runs an exact enumeration may take before the report switches to Monte Carlo.
DEFAULT_MAX_RUNS = 20_000
#: :func:`builder_report` samples at once, without trying the enumeration, when Knuth's estimate of its runs
#: (:func:`spec.randomness.estimate_runs`, over :data:`RUN_PROBES` probes) is above this many times
#: ``max_runs``: a budget-16 DySpec tree on V = 4 spent 37 s on 20,000 runs before sampling (estimate 1.2e7).
SKIP_FACTOR = 10
RUN_PROBES = 64
#: Largest LP (Σ over trees of accepted paths × V) the report solves.
MAX_LP_CELLS = 60_000
#: Largest ``Σ_{d ≤ depth} V^(d + 1)`` (every target string up to one past the deepest accepted path) over which
#: an exact report checks the completion identity and solves the LP, which both grow as ``V^(depth + 1)``.  Past
#: it the expected lengths are still exact, summed tree by tree, and neither is given.  Measured on 2 cores:
#: WETAP's depth-8 trees on V = 4 (3.5e5 cells) 5 s, the `tmc bench builders` rows that reach deepest; a greedy
#: chain of 10 on V = 4 (5.6e6) had taken 45 s and 3.4 GB, one of 20 on V = 2 58 s and 3.6 GB (audit of
#: 2026-11-27).
MAX_COMPLETION_CELLS = 1_000_000
#: Miss rate of the sampled mean's interval (:func:`betting_interval`), which holds for any law of lengths in
#: [1, budget + 1].  The normal interval it replaced (mean ± 1.96 standard errors) covered the exact value 57%
#: of the time on a skewed model, where 39% of 30-tree samples had no spread at all (audit of 2026-11-27).
CI_RATE = 0.05


def _key(tree: DraftTree) -> tuple[tuple[int, ...], tuple[int, ...], tuple[Draw, ...]]:
    return tree.parents, tree.tokens, tree.draws


def _tree_draft(model: ToyModel, tree: DraftTree, weight: float, prefix: Path) -> TreeDraft:
    base = tuple(prefix)
    return TreeDraft(tree, weight, np.array([model.p(base + path) for path in tree.paths()]))


def builder_drafts(
    model: ToyModel,
    builder: str | TreeBuilder,
    budget: int,
    *,
    prefix: Path = (),
    state: Any = None,
    max_runs: int = DEFAULT_MAX_RUNS,
) -> list[TreeDraft]:
    """Every tree ``builder`` can build below ``prefix``, with its exact probability.

    Equal trees (same parents, tokens and draw kinds) are merged.
    ``spec.randomness.TooManyRuns`` if more than ``max_runs`` runs are needed.
    """
    b = make_builder(builder)
    budget = check_int("budget", budget, minimum=1)
    outcomes = enumerate_runs(lambda s: b.build(ToyDraft(model, tuple(prefix)), budget, s, state), max_runs)
    merged: dict[Any, tuple[DraftTree, float]] = {}
    for tree, weight, _ in outcomes:
        key = _key(tree)
        old = merged.get(key)
        merged[key] = (tree, weight + (old[1] if old else 0.0))
    return [_tree_draft(model, tree, w, prefix) for tree, w in merged.values() if w > 0.0]


def sample_builder_drafts(
    model: ToyModel, builder: str | TreeBuilder, budget: int, n: int, rng: np.random.Generator | int, prefix: Path = ()
) -> list[TreeDraft]:
    """``n`` trees sampled from the builder, each with weight ``1 / n`` (Monte Carlo)."""
    b = make_builder(builder)
    gen = as_rng(rng)
    n = check_int("n", n, minimum=1)
    return [_tree_draft(model, b.build(ToyDraft(model, tuple(prefix)), budget, gen), 1.0 / n, prefix) for _ in range(n)]


TREE_STREAM = 1  # spawn key of the stream builder_report draws its trees and probes from


def tree_rng(seed: int) -> np.random.Generator:
    """The generator :func:`builder_report` samples trees and Knuth's probes from, for the integer ``seed``.

    It is ``seed`` with the spawn key ``(TREE_STREAM,)``: a stream apart from ``as_rng(seed)``, which
    :func:`random_stationary_model` draws a model's rows from.  ``tmc acceptance --random V --seed S`` and
    ``tmc bench builders`` give a model and its trees one integer; until 2026-11-27 both came from
    ``default_rng(seed)``, so the first trees re-read the very words that had set the model's rows (with
    Dirichlet(alpha < 1) rows, a row's first entry and the first draw from it are monotone in one uniform).
    """
    seed = check_int("seed", seed, minimum=0)
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(TREE_STREAM,)))


def draws_of(drafts: Sequence[TreeDraft]) -> set[Draw]:
    return {d for t in drafts for d in t.tree.draws}


def verifiers_for(names: Sequence[str] | str, draws: set[Draw], adaptive_widths: bool = False) -> dict[str, TreeKernel]:
    """Kernels of the named tree verifiers (``"all"``: every one lossless for these trees).

    ``draws`` are the draw kinds of the trees; ``adaptive_widths`` says whether
    a node's number of children depends on the tokens drawn (DySpec), which
    rules out the verifiers marked ``fixed_widths``.  ``ValueError`` for an
    unknown name or a verifier that is not lossless on such trees.
    """
    def why_not(rule: TreeRule) -> str | None:
        bad = draws - set(rule.draws)
        if bad:
            return (f"verifies {'/'.join(d.value for d in rule.draws)} trees only; "
                    f"these trees are drawn {'/'.join(sorted(d.value for d in bad))}")
        if adaptive_widths and rule.fixed_widths:
            return ("is lossless only when a node's number of children is fixed before they are drawn; "
                    "this builder's depends on the tokens drawn")
        return None

    if names == "all" or list(names) == ["all"]:
        return {n: r.kernel for n, r in TREE_VERIFIERS.items() if why_not(r) is None}
    out: dict[str, TreeKernel] = {}
    for name in [names] if isinstance(names, str) else names:
        rule = TREE_VERIFIERS.get(name)
        if rule is None:
            raise ValueError(f"unknown tree verifier {name!r}; choose one of {', '.join(TREE_VERIFIERS)} or 'all'")
        reason = why_not(rule)
        if reason is not None:
            raise ValueError(f"verifier {name!r} {reason}")
        out[name] = rule.kernel
    return out


def betting_interval(values: NDArray[np.float64], low: float, high: float, rate: float) -> tuple[float, float]:
    """A ``1 − rate`` confidence interval for the mean of i.i.d. ``values`` that lie in ``[low, high]``, valid for
    every such law and every sample size: Waudby-Smith & Ramdas's hedged betting interval ("Estimating means of
    bounded random variables by betting", JRSS B 2024, §4, with their predictable plug-in bets for a fixed ``n``).

    For each candidate mean ``m`` two bettors stake ``λ_i (x_i − m)`` and ``−λ_i (x_i − m)`` on the values scaled to
    ``[0, 1]``, each ``λ_i`` fixed by the values before ``x_i`` (and kept below ``1/2`` of what would lose
    everything).  Under mean ``m`` the average of their two wealths is a nonnegative martingale from 1, so by
    Ville's inequality it ever reaches ``1 / rate`` with probability at most ``rate``; the interval is every ``m``
    where neither wealth did (the larger of the two halves stayed below ``1 / rate``).  That set is an
    interval (one wealth falls in ``m``, the other rises); it is found on a grid, coarse then fine, and widened
    by one grid step at each end, so it contains the exact set.  Widths measured: mostly 1.2–1.3 times the
    normal interval's at 2000 values, but not always wider (narrower in 56 of 1500 sets of 2000 tree lengths
    drawn from one pool, a statistics audit of 2026-11-28).
    """
    if not (0.0 < rate < 1.0 and math.isfinite(low) and math.isfinite(high) and low < high):
        raise ValueError(f"a betting interval needs 0 < rate < 1 and finite low < high, got {rate}, {low}, {high}")
    x = (np.asarray(values, dtype=np.float64) - low) / (high - low)
    n = len(x)
    if n < 1:
        raise ValueError("a betting interval needs at least one value")
    if not bool(np.all((x >= 0.0) & (x <= 1.0))):  # NaN too
        raise ValueError(f"a betting interval's values must lie in [{low}, {high}]")
    t = np.arange(1, n + 1)
    mean = (0.5 + np.cumsum(x)) / (t + 1)
    spread = (0.25 + np.cumsum((x - mean) ** 2)) / (t + 1)
    bet = np.sqrt(2.0 * math.log(2.0 / rate) / (n * np.concatenate([[0.25], spread[:-1]])))[:, None]
    bar = math.log(2.0 / rate)  # the larger half-wealth reaches 1 / rate: log wealth reaches log(2 / rate)

    def wealth(m: NDArray[np.float64]) -> NDArray[np.float64]:
        """The larger log wealth of the two bettors at each candidate ``m``, at its highest over the values."""
        out = np.empty(len(m))
        for s in range(0, len(m), 128):
            mm = m[None, s: s + 128]
            up = np.log1p(np.minimum(bet, 0.5 / mm) * (x[:, None] - mm))
            down = np.log1p(-np.minimum(bet, 0.5 / (1.0 - mm)) * (x[:, None] - mm))
            out[s: s + 128] = np.maximum(np.cumsum(up, axis=0).max(axis=0), np.cumsum(down, axis=0).max(axis=0))
        return out

    lo, hi = 0.0, 1.0
    for _ in range(2):  # a grid over [0, 1], then one over the first's interval
        step = (hi - lo) / 256
        grid = lo + (np.arange(256, dtype=np.float64) + 0.5) * step
        level = wealth(grid)
        inside = np.flatnonzero(level < bar)
        k0, k1 = (int(inside[0]), int(inside[-1])) if inside.size else (int(np.argmin(level)),) * 2
        lo, hi = max(0.0, float(grid[k0]) - step), min(1.0, float(grid[k1]) + step)
    return low + lo * (high - low), low + hi * (high - low)


def _within_bounds(lengths: NDArray[np.float64], budget: int) -> NDArray[np.float64]:
    """Trees' exact lengths put back inside ``[1, budget + 1]`` where rounding left them just outside.

    A tree's length is a float sum of length × probability, so a tree that emits its whole path with
    probability one can come out at ``budget + 1 + 2e-15`` (9.000000000000002 for a chain of 8 under Traversal),
    which the betting interval refuses as outside its bounds.  Values further out than ``1e-9 (budget + 1)``
    are left as they are, for the interval to refuse: no rounding explains them.
    """
    top = budget + 1.0
    clipped = np.clip(lengths, 1.0, top)
    return np.where(np.abs(lengths - clipped) <= 1e-9 * top, clipped, lengths)


def _length_given_tree(draft: TreeDraft, kernel: TreeKernel) -> float:
    return math.fsum(len(s) * m for s, m in tree_kernel_outputs(draft.tree, kernel(draft.tree, draft.p_rows)).items())


def builder_report(
    model: ToyModel,
    builder: str | TreeBuilder,
    budget: int,
    verifiers: Sequence[str] | str = "multidraft",
    *,
    max_runs: int = DEFAULT_MAX_RUNS,
    samples: int = 2000,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """E[tokens per step] of the builder with each verifier, and the LP limit of its draft law.

    Exact when the builder's randomness enumerates in ``max_runs`` runs (each
    entry then has ``completion_error``), else Monte Carlo over ``samples``
    trees drawn from ``tree_rng(seed)`` (each entry has ``ci95``, a betting
    interval of level 95% for lengths in ``[1, budget + 1]``; ``lp`` is
    ``None``).  An exact report past :data:`MAX_COMPLETION_CELLS` sums each
    tree's exact length (``completion_error`` ``None``, no ``lp``).  The
    enumeration is not tried when Knuth's estimate of its runs (probes from
    ``tree_rng(seed)`` too) is above :data:`SKIP_FACTOR` × ``max_runs``.  The
    result is ``{"builder", "budget", "exact", "estimated_runs", "trees",
    "entries": [...], "lp": {...} | None}``.
    """
    b = make_builder(builder)
    budget = check_int("budget", budget, minimum=1)
    max_runs = check_int("max_runs", max_runs, minimum=1)
    samples = check_int("samples", samples, minimum=2)
    say = progress or (lambda message: None)
    verifiers_for(verifiers, set(), b.adaptive_widths)  # names and widths before any building; draws below
    estimate = estimate_runs(lambda s: b.build(ToyDraft(model, ()), budget, s), RUN_PROBES, tree_rng(seed))
    exact = estimate <= SKIP_FACTOR * max_runs
    if exact:
        say(f"about {estimate:.3g} builder runs (Knuth's estimate over {RUN_PROBES} probes): enumerating, "
            f"at most {max_runs} ...")
        try:
            drafts = builder_drafts(model, b, budget, max_runs=max_runs)
        except TooManyRuns:
            exact = False
            say(f"more than {max_runs} runs: sampling {samples} trees instead ...")
    else:
        say(f"about {estimate:.3g} builder runs (Knuth's estimate over {RUN_PROBES} probes), above "
            f"{SKIP_FACTOR} x {max_runs}: sampling {samples} trees ...")
    if not exact:
        drafts = sample_builder_drafts(model, b, budget, samples, tree_rng(seed))
    kernels = verifiers_for(verifiers, draws_of(drafts), b.adaptive_widths)
    strings = completion_cells(model.vocab, draft_depth(drafts))
    checked = exact and strings <= MAX_COMPLETION_CELLS
    if exact and not checked:
        say(f"{strings:.3g} (prefix, token) cells up to length {draft_depth(drafts) + 1}: exact lengths tree by "
            f"tree, without the completion check or the LP (at most {MAX_COMPLETION_CELLS:,})")
    entries: list[dict[str, Any]] = []
    for name, kernel in kernels.items():
        if checked:
            law = output_law(model, drafts, kernel)
            entries.append({"verifier": name, "expected_length": law.expected_length, "completion_error": law.completion_error})
        elif exact:
            mean = math.fsum(d.weight * _length_given_tree(d, kernel) for d in drafts)
            entries.append({"verifier": name, "expected_length": mean, "completion_error": None})
        else:
            lengths = np.array([_length_given_tree(d, kernel) for d in drafts])
            mean = float(lengths.mean())
            entries.append({"verifier": name, "expected_length": mean,
                            "ci95": list(betting_interval(_within_bounds(lengths, budget), 1.0, budget + 1.0,
                                                          CI_RATE))})
    lp: dict[str, Any] | None = None
    cells = sum(len(d.accepted_paths) for d in drafts) * model.vocab
    if checked and cells <= MAX_LP_CELLS:
        from tmc.lp import lp_limit

        lp = {"expected_length": lp_limit(model, drafts).expected_length}
    return {"builder": b.name, "budget": budget, "exact": exact, "estimated_runs": estimate, "trees": len(drafts),
            "entries": entries, "lp": lp}


@dataclass(frozen=True)
class StepSequenceLaw:
    """Exact law of what ``steps`` consecutive steps emit, with the states reached."""

    law: dict[Path, float]  # emitted string (all steps) -> probability
    completion_error: float  # completion identity at the longest emitted length
    expected_length: float  # E[tokens emitted over all steps]
    states: tuple[Any, ...]  # distinct builder states reached after the last step
    trees: int  # distinct trees built over all steps and branches


def step_sequence_law(
    model: ToyModel,
    builder: str | TreeBuilder,
    verifier: str,
    budget: int,
    steps: int,
    *,
    max_runs: int = DEFAULT_MAX_RUNS,
) -> StepSequenceLaw:
    """Run ``steps`` decode steps on every branch, carrying the builder's state.

    Each step builds every tree the builder can (given the state) below the
    text emitted so far, verifies it with ``verifier`` and moves the state on
    with ``next_state(state, tree, accepted)``.
    """
    b = make_builder(builder)
    steps = check_int("steps", steps, minimum=1)
    frontier: dict[tuple[Path, Any], float] = {((), b.initial_state()): 1.0}
    seen_trees: set[Any] = set()
    for _ in range(steps):
        nxt: dict[tuple[Path, Any], float] = {}
        for (emitted, state), weight in frontier.items():
            drafts = builder_drafts(model, b, budget, prefix=emitted, state=state, max_runs=max_runs)
            kernel = verifiers_for(verifier, draws_of(drafts), b.adaptive_widths)[verifier]
            for d in drafts:
                seen_trees.add((emitted, _key(d.tree)))
                for out, prob in tree_kernel_outputs(d.tree, kernel(d.tree, d.p_rows)).items():
                    key = (emitted + out, b.next_state(state, d.tree, len(out) - 1))
                    nxt[key] = nxt.get(key, 0.0) + weight * d.weight * prob
        frontier = nxt
    law: dict[Path, float] = {}
    for (emitted, _), w in frontier.items():
        law[emitted] = law.get(emitted, 0.0) + w
    longest = max(len(s) for s in law)
    return StepSequenceLaw(
        law,
        completion_error(model, law, longest),
        math.fsum(len(s) * m for s, m in law.items()),
        tuple({state for (_, state) in frontier}),
        len(seen_trees),
    )


def random_stationary_model(
    vocab: int,
    seed: int,
    depth: int = 2,
    concentration: float = 1.0,
    zero_prob: float = 0.2,
    name: str | None = None,
    agreement: float = 0.0,
) -> ToyModel:
    """A random toy model with its own rows for prefixes up to ``depth`` and default rows beyond.

    The default rows let builders grow trees of any depth (``--random V`` with
    ``--builder``).  Smaller ``concentration`` gives more peaked rows.  Each
    target row is ``agreement · q + (1 − agreement) · (an independent row)``:
    0 makes draft and target independent, values near 1 make the draft good.
    """
    from itertools import product

    from tmc.toy import random_row

    vocab = check_int("vocab", vocab, minimum=1)
    rng = as_rng(seed)
    d_rows, t_rows = {}, {}
    if not 0.0 <= agreement <= 1.0:
        raise ValueError(f"agreement must be in [0, 1], got {agreement!r}")

    def pair(zeros: float) -> tuple[Any, Any]:
        q = random_row(vocab, rng, zeros, concentration)
        return q, agreement * q + (1.0 - agreement) * random_row(vocab, rng, zeros, concentration)

    for length in range(check_int("depth", depth, minimum=0) + 1):
        for pre in product(range(vocab), repeat=length):
            d_rows[pre], t_rows[pre] = pair(zero_prob)
    q_def, p_def = pair(0.0)
    return ToyModel(vocab, d_rows, t_rows, q_def, p_def, name=name or f"random(V={vocab}, seed={seed})")


def render_builder_report(report: dict[str, Any], model: ToyModel) -> str:
    """The builder table: verifier, E[tokens/step], % of the LP limit, completion error or 95% CI."""
    lp = report["lp"]["expected_length"] if report["lp"] else None
    rows = []
    for e in report["entries"]:
        length = float(e["expected_length"])
        share = f"{100 * length / lp:.2f}%" if lp else "-"
        if "ci95" in e:
            err = f"[{e['ci95'][0]:.4f}, {e['ci95'][1]:.4f}]"
        else:
            err = "not checked" if e["completion_error"] is None else f"{e['completion_error']:.1e}"
        rows.append([e["verifier"], f"{length:.6f}", share, err])
    if lp:
        rows.append(["LP limit", f"{lp:.6f}", "100.00%", "-"])
    unchecked = any(e.get("completion_error", 0.0) is None for e in report["entries"])
    how = (f"exact over {report['trees']} trees" + (", too deep for the completion check and the LP" if unchecked else "")
           if report["exact"] else f"Monte Carlo over {report['trees']} sampled trees, 95% CI (betting)")
    title = f"{model.name}, V = {model.vocab}, builder {report['builder']}, budget {report['budget']} ({how})"
    return format_table(["verifier", "E[tokens/step]", "% of LP", "completion err / CI95"], rows, title=title)
