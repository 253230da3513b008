"""The statistical correctness suite behind ``tmc suite`` (DESIGN.md §5).

For every verifier × a fixed table of toy models and draft shapes it runs

* an **exact** check: the completion identity of the verifier's averaged
  output law (exhaustive enumeration of the drafts), worst violation ≤ 1e-9;
* a **statistical** check: full speculative steps (draft drawn from ``q``,
  then verified) are sampled — with the vectorised batch samplers where the
  verifier has one — and their output strings compared with the exact
  averaged law by a calibrated chi-square test.

One false-fail budget (default 1e-9) is split evenly (Bonferroni) over the
statistical checks; each check states the total variation it is guaranteed
(with probability ≥ 1 − 1e-3) to detect, and its sample size is computed
before sampling.  A suite run is reproducible from its seed.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from tmc.enumeration import OutputLaw, chain_output_law, enumerate_draft_trees, tree_output_law, tree_p_rows
from tmc.multidraft import Draw, DraftTree
from tmc.noise import categorical
from tmc.report import format_table
from tmc.toy import Path, ToyModel, paper_toy_model
from verification.batch import CHAIN_BATCH, chain_noise_width, multidraft_batch, speculative_step_batch
from verification.calibrated import chi_square_check, required_samples
from verification.examples import (
    ASPS,
    BIASED_EXAMPLES,
    BLOCK,
    IID_RULE_ON_IID,
    MULTIDRAFT,
    SPS,
    ChainVerifier,
    TreeVerifier,
    Verifier,
)

FloatArray = NDArray[np.float64]
EXACT_TOL = 1e-9  # completion-identity tolerance of the exact check
POWER_MISS = 1e-3  # probability of missing a discrepancy of the stated TV


# ------------------------------------------------------------ the tables


def _one_hot_rows(vocab: int, depth: int, rng: np.random.Generator) -> ToyModel:
    """Greedy (temperature 0) target: one-hot rows; random draft rows."""
    base = ToyModel.random(vocab, depth, rng, zero_prob=0.2)
    hot = {k: np.eye(vocab)[int(np.argmax(v))] for k, v in base.target_rows.items()}
    return ToyModel(vocab, base.draft_rows, hot, name="greedy-target")


def _tiny_rows(vocab: int, depth: int, rng: np.random.Generator) -> ToyModel:
    base = ToyModel.random(vocab, depth, rng, zero_prob=0.0)

    def tiny(row: FloatArray) -> FloatArray:
        out = row.copy()
        out[0] = 1e-12
        normalised: FloatArray = out / out.sum()
        return normalised

    return ToyModel(vocab, {k: tiny(v) for k, v in base.draft_rows.items()}, base.target_rows, name="tiny-1e-12")


def suite_models(seed: int = 0) -> list[ToyModel]:
    """The fixed table of toy models (depth 3, so chains up to n = 2 and trees up to depth 2)."""
    rng = np.random.default_rng(seed)
    same = ToyModel.random(3, 3, rng, zero_prob=0.2)
    disjoint = ToyModel(
        3, {}, {}, np.array([0.6, 0.4, 0.0]), np.array([0.0, 0.3, 0.7]), name="nearly-disjoint"
    )
    return [
        paper_toy_model(),
        ToyModel.random(3, 3, rng, zero_prob=0.2, name="random-V3"),
        ToyModel.random(4, 3, rng, zero_prob=0.3, name="random-V4"),
        _one_hot_rows(3, 3, rng),
        ToyModel(3, same.draft_rows, same.draft_rows, name="p-equals-q"),
        _tiny_rows(3, 3, rng),
        disjoint,
    ]


CHAIN_LENGTHS = (1, 2)
TREE_SHAPES = ((2,), (2, 1), (3,))


@dataclass(frozen=True)
class SuiteConfig:
    """What a suite run covers and how strict it is."""

    false_fail: float = 1e-9  # family-wise false-fail rate, split over the statistical checks
    detect_tv: float = 0.05  # total variation each statistical check is sized to detect
    seed: int = 0  # seed of the models table and of all sampling
    include_biased: bool = False  # also run the shipped BIASED examples (they should fail)
    quick: bool = False  # fewer models and shapes (for tests)


@dataclass(frozen=True)
class Job:
    """One (verifier, model, shape) cell of the suite."""

    verifier: Verifier
    model: ToyModel
    chain_n: int | None  # chain length, or None for a tree
    widths: tuple[int, ...] = ()  # tree shape
    draw: Draw | None = None  # tree draw kind

    @property
    def shape(self) -> str:
        if self.chain_n is not None:
            return f"chain n={self.chain_n}"
        assert self.draw is not None
        return f"tree {','.join(map(str, self.widths))} {self.draw.value}"


@dataclass(frozen=True)
class Row:
    """One line of the suite's table."""

    verifier: str  # verifier name
    model: str  # toy model name
    shape: str  # draft shape
    check: str  # "completion identity" or "sampler vs kernel"
    passed: bool  # verdict
    worst_exact: float | None  # worst completion-identity violation (exact check)
    p_value: float | None  # chi-square p-value (statistical check)
    samples: int  # steps sampled (0 for the exact check)
    alpha: float | None  # this check's share of the false-fail budget
    detect_tv: float | None  # TV the check detects with probability >= 1 - 1e-3
    expected_biased: bool = False  # the verifier is a shipped BIASED example
    plot: dict[str, list[float]] = field(default_factory=dict, compare=False)  # exact vs empirical marginals


def suite_jobs(config: SuiteConfig) -> list[Job]:
    models = suite_models(config.seed)
    if config.quick:
        models = models[:2]
    chains: list[ChainVerifier] = [SPS, ASPS, BLOCK]
    trees: list[TreeVerifier] = [MULTIDRAFT, IID_RULE_ON_IID]
    if config.include_biased:
        chains += [v for v in BIASED_EXAMPLES if isinstance(v, ChainVerifier)]
        trees += [v for v in BIASED_EXAMPLES if isinstance(v, TreeVerifier)]
    lengths = CHAIN_LENGTHS[-1:] if config.quick else CHAIN_LENGTHS
    shapes = TREE_SHAPES[1:2] if config.quick else TREE_SHAPES
    jobs: list[Job] = []
    for model in models:
        jobs += [Job(v, model, n) for v in chains for n in lengths]
        jobs += [Job(v, model, None, w, d) for v in trees for w in shapes for d in v.draws]
    return jobs


# ------------------------------------------------------------- the checks


def exact_law(job: Job) -> OutputLaw:
    """The verifier's averaged output law by enumerating every draft."""
    v = job.verifier
    assert v.kernel is not None, "suite verifiers expose an exact kernel"
    if isinstance(v, ChainVerifier):
        assert job.chain_n is not None
        return chain_output_law(job.model, job.chain_n, v.kernel)
    assert job.draw is not None
    return tree_output_law(job.model, job.widths, job.draw, v.kernel)


def _chain_steps(job: Job, trials: int, rng: np.random.Generator) -> list[Path]:
    v, n = job.verifier, job.chain_n
    assert n is not None
    if v.name in CHAIN_BATCH:
        noise_v = rng.random((trials, chain_noise_width(v.name, n)))
        return speculative_step_batch(job.model, n, v.name, rng.random((trials, n)), noise_v).outputs()
    out: list[Path] = []
    for _ in range(trials):
        ref: list[int] = []
        for _ in range(n):
            ref.append(categorical(job.model.q(tuple(ref)), float(rng.random())))
        q_rows, p_rows = job.model.chain_rows(tuple(ref))
        assert isinstance(v, ChainVerifier)
        out.append(tuple(v.sample(ref, q_rows, p_rows, rng)))
    return out


def _tree_steps(job: Job, trials: int, rng: np.random.Generator) -> list[Path]:
    assert job.draw is not None
    trees = list(enumerate_draft_trees(job.model, job.widths, job.draw))
    weights = np.array([w for w, _ in trees])
    picks = np.array([categorical(weights, float(x)) for x in rng.random(trials)])
    out: list[Path] = []
    for idx in np.unique(picks):
        tree: DraftTree = trees[int(idx)][1]
        count = int((picks == idx).sum())
        p_rows = tree_p_rows(job.model, tree)
        if job.verifier is MULTIDRAFT:
            batch = multidraft_batch(tree, p_rows, rng.random((count, tree.size + 1)))
            out += [tuple(t) for t in batch.tokens(tree)]
        else:
            assert isinstance(job.verifier, TreeVerifier)
            out += [tuple(job.verifier.sample(tree, p_rows, rng)) for _ in range(count)]
    return out


def statistical_check(job: Job, law: OutputLaw, alpha: float, tv: float, rng: np.random.Generator) -> Row:
    cells = sorted(law.output_law)
    index = {s: i for i, s in enumerate(cells)}
    probs = np.array([law.output_law[s] for s in cells] + [0.0])  # last cell: any other output
    trials = required_samples(len(cells), tv, alpha, POWER_MISS)
    steps = _chain_steps(job, trials, rng) if job.chain_n is not None else _tree_steps(job, trials, rng)
    counts = np.bincount([index.get(s, len(cells)) for s in steps], minlength=len(probs))
    result = chi_square_check(counts, probs, alpha)
    top = np.argsort(-probs[:-1])[:12]
    plot = {
        "exact": [float(probs[i]) for i in top],
        "empirical": [float(counts[i] / trials) for i in top],
    }
    return Row(
        job.verifier.name, job.model.name, job.shape, "sampler vs kernel", bool(result.passed), None,
        float(result.p_value), int(trials), alpha, tv, job.verifier.biased, plot,
    )


def run_suite(config: SuiteConfig, progress: Callable[[str], None] | None = None) -> list[Row]:
    """Run every job; returns the table rows (exact check, then statistical check, per job)."""
    jobs = suite_jobs(config)
    alpha = config.false_fail / len(jobs)
    rng = np.random.default_rng(config.seed)
    rows: list[Row] = []
    for i, job in enumerate(jobs):
        if progress is not None:
            progress(f"[{i + 1}/{len(jobs)}] {job.verifier.name} on {job.model.name}, {job.shape}")
        law = exact_law(job)
        rows.append(
            Row(
                job.verifier.name, job.model.name, job.shape, "completion identity",
                bool(law.completion_error <= EXACT_TOL), float(law.completion_error), None, 0, None, None,
                job.verifier.biased,
            )
        )
        rows.append(statistical_check(job, law, alpha, config.detect_tv, rng))
    return rows


# ------------------------------------------------------------- reporting


def failures(rows: Sequence[Row]) -> list[Row]:
    """Rows whose verdict is a failure of a verifier that is meant to be lossless."""
    return [r for r in rows if not r.passed and not r.expected_biased]


def missed_biases(rows: Sequence[Row]) -> list[str]:
    """Shipped BIASED examples that passed every check (the suite missed them)."""
    names = {r.verifier for r in rows if r.expected_biased}
    caught = {r.verifier for r in rows if r.expected_biased and not r.passed}
    return sorted(names - caught)


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def render(rows: Sequence[Row], config: SuiteConfig) -> str:
    table = [
        [
            r.verifier + (" (BIASED)" if r.expected_biased else ""), r.model, r.shape, r.check,
            ("PASS" if r.passed else "FAIL"), _fmt(r.worst_exact, ".1e"), _fmt(r.p_value, ".3g"),
            r.samples or "-", _fmt(r.alpha, ".1e"),
        ]
        for r in rows
    ]
    head = ["verifier", "model", "shape", "check", "verdict", "worst exact", "p-value", "samples", "false-fail"]
    stat = [r for r in rows if r.check != "completion identity"]
    summary = (
        f"{len(rows)} checks, {len(failures(rows))} failed (lossless verifiers); "
        f"false-fail budget {config.false_fail:g} split over {len(stat)} statistical checks; "
        f"each detects TV >= {config.detect_tv:g} w.p. >= {1 - POWER_MISS:g}; seed {config.seed}"
    )
    missed = missed_biases(rows)
    if config.include_biased:
        summary += f"\nBIASED examples caught: {len({r.verifier for r in rows if r.expected_biased}) - len(missed)}"
        summary += f", missed: {', '.join(missed) or 'none'}"
    return format_table(head, table, title="tmc suite") + "\n" + summary


def to_json(rows: Sequence[Row], config: SuiteConfig) -> dict[str, Any]:
    return {"config": asdict(config), "rows": [{k: v for k, v in asdict(r).items() if k != "plot"} for r in rows]}


def write_plot(rows: Sequence[Row], path: str) -> None:
    """PNG of exact vs empirical output probabilities, one panel per statistical check (first 12)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stat = [r for r in rows if r.plot][:12]
    cols = min(4, max(len(stat), 1))
    nrows = max(1, -(-len(stat) // cols))
    fig, axes = plt.subplots(nrows, cols, figsize=(4 * cols, 3 * nrows), squeeze=False)
    for ax, r in zip(axes.flat, stat):
        x = np.arange(len(r.plot["exact"]))
        ax.bar(x, r.plot["exact"], color="0.8", label="exact")
        ax.plot(x, r.plot["empirical"], "o", color="C3", markersize=4, label="empirical")
        ax.set_title(f"{r.verifier} · {r.model}\n{r.shape} · p={r.p_value:.2g}", fontsize=8)
        ax.set_xticks([])
    for ax in list(axes.flat)[len(stat):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.suptitle("exact vs empirical output-string probabilities (most likely outputs)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def cli_main(argv: Sequence[str] | None = None) -> int:
    """``tmc suite``: exit 0 when every lossless verifier passes every check, 1 otherwise."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="tmc suite", description=__doc__.split("\n\n")[0])
    parser.add_argument("--false-fail", type=float, default=1e-9, help="family-wise false-fail rate")
    parser.add_argument("--tv", type=float, default=0.05, help="total variation each check must detect")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--include-biased", action="store_true", help="also run the shipped BIASED examples")
    parser.add_argument("--quick", action="store_true", help="two models, one shape each")
    parser.add_argument("--json", default="", help="write the rows to this JSON file")
    parser.add_argument("--plot", default="", help="write a PNG of exact vs empirical marginals")
    args = parser.parse_args(argv)
    if not 0.0 < args.false_fail < 1.0 or not 0.0 < args.tv <= 1.0:
        parser.error("--false-fail must be in (0, 1) and --tv in (0, 1]")
    config = SuiteConfig(args.false_fail, args.tv, args.seed, args.include_biased, args.quick)
    rows = run_suite(config, progress=lambda m: print(m, file=sys.stderr))
    print(render(rows, config))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(to_json(rows, config), fh, indent=2)
    if args.plot:
        try:
            write_plot(rows, args.plot)
        except ModuleNotFoundError:
            print("tmc suite: --plot needs matplotlib: pip install -e '.[plot]'", file=sys.stderr)
            return 2
    return 1 if failures(rows) or missed_biases(rows) else 0
