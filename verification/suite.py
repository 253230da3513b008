"""The statistical correctness suite behind ``tmc suite`` (DESIGN.md §5).

``p`` is the target's law and ``q`` the draft's (DESIGN.md §3); ``p_rows`` / ``q_rows`` hold their rows.

For every verifier × a fixed table of toy models and draft shapes it runs

* an **exact** check: the completion identity of the verifier's averaged
  output law (exhaustive enumeration of the drafts), worst violation ≤ 1e-9;
* a **statistical** check: full speculative steps (a draft drawn from ``q``,
  then verified) are sampled and their output strings compared with the
  exact averaged law by a calibrated test: by default the finite-sample
  KL-bound test (:func:`verification.calibrated.kl_check`), whose false-fail
  rate holds for every sample size, or (``test="chi2"``) Pearson's chi-square,
  whose rate is the asymptotic approximation's, and whose power is on the bins
  it merges the cells of fewer than 5 expected samples into
  (:func:`verification.calibrated.chi_square_samples`, ``cover="bins"``).

Each job enumerates its drafts once (:mod:`tmc.drafts`); the same list gives
the exact law (:func:`tmc.laws.output_law`) and the rows of the sampled
steps.  A draft chain is drawn token by token from ``q``
(:func:`verification.batch.draft_chain_batch`, independent of the
enumeration) and looked up in the list; a draft tree is picked from the list
by its weight.  Steps are verified with the vectorised batch samplers
(:mod:`verification.batch`, trial for trial equal to the scalar ones); the
BIASED examples that are not :mod:`tmc.multidraft`'s verifier with another
proposal rule (tutorial walk, WETAP, greedy match) with their own samplers.

What the statistical check compares ("check" column of the table):

* SpS, block, multi-draft trees: ``sampler vs kernel`` — the verifier's
  sampler (an accept/reject walk) against its own exact kernel, two
  different computations of one law.
* ASpS: ``kernel vs block sampler``.  ASpS's sampler draws by inverse CDF
  from :func:`tmc.chain.asps_kernel` itself (TMC paper Algorithm 1 samples
  from ``P_N``), so comparing it with that kernel would only test the
  inverse-CDF draw.  Instead ASpS's kernel is compared with samples of an
  independent algorithm with the same output law: block verification's
  sampler (Sun et al. 2024, :func:`verification.batch.block_batch`).  There
  is no separate row for the ASpS sampler: against the block kernel it would
  test only that the two kernels agree, which
  ``tests/tmc/test_chain_exact.py`` (``asps_kernel == block_kernel`` per
  draft) establishes exactly.

One false-fail budget (default 1e-9) is split evenly (Bonferroni) over the
statistical checks; each check states the total variation it is guaranteed
(with probability ≥ 1 − 1e-3) to detect, and its sample size is computed
before sampling.  With the KL-bound test both figures are bounds that hold
exactly (no asymptotics), and the TV is over the output strings themselves.  A suite run is reproducible from its seed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from tmc.commands.table import format_table
from tmc.drafts import Draft, DraftChain, TreeDraft, chain_drafts, check_widths, tree_drafts
from tmc.laws import OutputLaw, output_law
from tmc.kseq import RhoRule
from tmc.multidraft import Draw, ProposalFn, proposal_laws
from tmc.ordered_traversal import ratio_ordered_children
from tmc.toy import Path, ToyModel, paper_toy_model
from tmc.traversal import ChildrenRule, recorded_children
from tmc.validate import as_rng, check_int
from verification.batch import (
    CHAIN_BATCH,
    categorical_batch,
    chain_noise_width,
    draft_chain_batch,
    kseq_batch,
    multidraft_batch,
    traversal_batch,
)
from verification.broken_kseq import rho_one
from verification.calibrated import chi_square_check, chi_square_samples, kl_check, kl_required_samples
from verification.examples import (
    ASPS,
    BIASED_EXAMPLES,
    BLOCK,
    BROKEN_KSEQ,
    BROKEN_TRAVERSAL,
    IID_RULE_ON_IID,
    IID_RULE_ON_SWOR,
    IID_RULE_ON_TOPK,
    KSEQ,
    MULTIDRAFT,
    ORDERED_TRAVERSAL,
    SPS,
    TRAVERSAL,
    ChainVerifier,
    TreeVerifier,
    Verifier,
    iid_proposals,
)

FloatArray = NDArray[np.float64]
EXACT_TOL = 1e-9  # completion-identity tolerance of the exact check
POWER_MISS = 1e-3  # probability of missing a discrepancy of the stated TV

#: The suite's statistical tests: ``kl-bound`` (false-fail rate a finite-sample
#: bound, about twice the samples) and ``chi2`` (the asymptotic chi-square).
TESTS: tuple[str, ...] = ("kl-bound", "chi2")


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


SUITE_CHAIN_LENGTHS: tuple[int, ...] = (1, 2)  # chain lengths n of the suite's chain jobs
SUITE_TREE_SHAPES: tuple[tuple[int, ...], ...] = ((2,), (2, 1), (3,))  # tree widths of its tree jobs

SAMPLER_VS_KERNEL = "sampler vs kernel"
KERNEL_VS_BLOCK_SAMPLER = "kernel vs block sampler"
EXACT_CHECK = "completion identity"

#: Batch sampler of each chain verifier's statistical check: its own, except
#: ASpS, whose kernel is checked against block verification's sampler.
CHAIN_SAMPLER: dict[str, str] = {SPS.name: "sps", ASPS.name: "block", BLOCK.name: "block"}

#: Proposal rule of each tree verifier that is :mod:`tmc.multidraft`'s
#: verifier (batch-sampled by :func:`verification.batch.multidraft_batch`).
TREE_PROPOSALS: dict[str, ProposalFn] = {
    MULTIDRAFT.name: proposal_laws,
    IID_RULE_ON_IID.name: iid_proposals,
    IID_RULE_ON_SWOR.name: iid_proposals,
    IID_RULE_ON_TOPK.name: iid_proposals,
}

#: Traversal Verification's verifiers (batch-sampled by
#: :func:`verification.batch.traversal_batch`): their ``update_value`` flag and children rule.
TRAVERSAL_RULES: dict[str, tuple[bool, ChildrenRule]] = {
    TRAVERSAL.name: (True, recorded_children),
    ORDERED_TRAVERSAL.name: (True, ratio_ordered_children),
    BROKEN_TRAVERSAL.name: (False, recorded_children),
}

#: K-SEQ's verifiers (batch-sampled by :func:`verification.batch.kseq_batch`)
#: and their division-factor rule (None: SpecTr's ρ*).
KSEQ_RULE: dict[str, RhoRule | None] = {KSEQ.name: None, BROKEN_KSEQ.name: rho_one}


@dataclass(frozen=True)
class SuiteConfig:
    """What a suite run covers and how strict it is."""

    false_fail: float = 1e-9  # family-wise false-fail rate, split over the statistical checks
    detect_tv: float = 0.05  # total variation each statistical check is sized to detect
    seed: int = 0  # seed of the models table and of all sampling
    include_biased: bool = False  # also run the shipped BIASED examples (they should fail)
    quick: bool = False  # fewer models and shapes (for tests)
    test: str = "kl-bound"  # the statistical test, one of TESTS

    def __post_init__(self) -> None:
        if self.test not in TESTS:
            raise ValueError(f"test must be one of {', '.join(TESTS)}, got {self.test!r}")
        if not 0.0 < self.false_fail < 1.0:
            raise ValueError(f"false_fail must be in (0, 1), got {self.false_fail!r}")
        if not 0.0 < self.detect_tv <= 1.0:
            raise ValueError(f"detect_tv must be in (0, 1], got {self.detect_tv!r}")
        object.__setattr__(self, "seed", check_int("seed", self.seed, minimum=0))


@dataclass(frozen=True)
class Job:
    """One (verifier, model, shape) cell of the suite."""

    verifier: Verifier
    model: ToyModel
    chain_n: int | None  # chain length, or None for a tree
    widths: tuple[int, ...] = ()  # tree shape
    draw: Draw | None = None  # tree draw kind

    def __post_init__(self) -> None:
        if self.chain_n is not None:
            object.__setattr__(self, "chain_n", check_int("chain_n", self.chain_n, minimum=0))
            return
        object.__setattr__(self, "widths", check_widths(self.widths))
        if self.draw is None:
            raise ValueError("a tree job needs a draw kind (draw=...)")
        object.__setattr__(self, "draw", Draw.parse(self.draw))

    @property
    def shape(self) -> str:
        if self.chain_n is not None:
            return f"chain n={self.chain_n}"
        assert self.draw is not None
        return f"tree {','.join(map(str, self.widths))} {self.draw.value}"

    @property
    def check(self) -> str:
        """Name of this job's statistical check (see the module doc)."""
        return KERNEL_VS_BLOCK_SAMPLER if self.verifier.name == ASPS.name else SAMPLER_VS_KERNEL


@dataclass(frozen=True)
class Row:
    """One line of the suite's table."""

    verifier: str  # verifier name
    model: str  # toy model name
    shape: str  # draft shape
    check: str  # EXACT_CHECK, SAMPLER_VS_KERNEL or KERNEL_VS_BLOCK_SAMPLER
    passed: bool  # verdict
    worst_exact: float | None  # worst completion-identity violation (exact check)
    p_value: float | None  # chi-square p-value (statistical check)
    samples: int  # steps sampled (0 for the exact check)
    alpha: float | None  # this check's share of the false-fail budget
    detect_tv: float | None  # TV the check detects with probability >= 1 - 1e-3 (chi2: on its merged bins)
    expected_biased: bool = False  # the verifier is a shipped BIASED example
    plot: dict[str, list[float]] = field(default_factory=dict, compare=False)  # exact vs empirical marginals
    impossible: int = 0  # statistical check: samples on outputs of exact probability 0 (each fails it alone)


def suite_jobs(config: SuiteConfig) -> list[Job]:
    models = suite_models(config.seed)
    if config.quick:
        models = models[:2]
    chains: list[ChainVerifier] = [SPS, ASPS, BLOCK]
    # K-SEQ differs from multidraft only at i.i.d. nodes: the suite runs it on i.i.d. trees.
    trees: list[TreeVerifier] = [
        MULTIDRAFT,
        IID_RULE_ON_IID,
        TRAVERSAL,
        ORDERED_TRAVERSAL,
        replace(KSEQ, draws=(Draw.IID,)),
    ]
    if config.include_biased:
        chains += [v for v in BIASED_EXAMPLES if isinstance(v, ChainVerifier)]
        trees += [v for v in BIASED_EXAMPLES if isinstance(v, TreeVerifier)]
    lengths = SUITE_CHAIN_LENGTHS[-1:] if config.quick else SUITE_CHAIN_LENGTHS
    shapes = SUITE_TREE_SHAPES[1:2] if config.quick else SUITE_TREE_SHAPES
    jobs: list[Job] = []
    for model in models:
        jobs += [Job(v, model, n) for v in chains for n in lengths]
        jobs += [Job(v, model, None, w, d) for v in trees for w in shapes for d in v.draws]
    return jobs


# ------------------------------------------------------------- the checks


def job_drafts(job: Job) -> list[Draft]:
    """Every draft of the job with its weight (:mod:`tmc.drafts`), enumerated once per job."""
    if job.chain_n is not None:
        return list(chain_drafts(job.model, job.chain_n))
    assert job.draw is not None
    return list(tree_drafts(job.model, job.widths, job.draw))


def exact_law(job: Job, drafts: Sequence[Draft] | None = None) -> OutputLaw:
    """The verifier's averaged output law over the job's drafts (enumerated if not given)."""
    kernel = job.verifier.kernel
    assert kernel is not None, "suite verifiers expose an exact kernel"
    return output_law(job.model, job_drafts(job) if drafts is None else drafts, kernel)


def _pick_chains(model: ToyModel, drafts: Sequence[DraftChain], n: int, noise: FloatArray) -> NDArray[np.int64]:
    """Index into ``drafts`` of the chain each trial drafts from ``q`` with its ``(trials, n)`` noise.

    Drafting is :func:`verification.batch.draft_chain_batch` (token ``i`` by
    inverse CDF of ``q(· | ref[:i])``), a sampler independent of the
    enumeration; a drawn chain missing from ``drafts`` would be a bug in one
    of the two.
    """
    vocab = model.vocab
    code_of = vocab ** np.arange(n - 1, -1, -1, dtype=np.int64)  # (n,) base-V place values
    index = np.full(vocab**n, -1, dtype=np.int64)
    for i, d in enumerate(drafts):
        index[int(np.dot(d.ref, code_of)) if n else 0] = i
    picks: NDArray[np.int64] = index[draft_chain_batch(model, n, noise) @ code_of]
    assert bool(np.all(picks >= 0)), "a sampled draft chain is missing from the enumeration"
    return picks


def _chain_steps(job: Job, drafts: Sequence[DraftChain], trials: int, rng: np.random.Generator) -> list[Path]:
    v, n = job.verifier, job.chain_n
    assert n is not None and isinstance(v, ChainVerifier)
    method = CHAIN_SAMPLER.get(v.name)
    out: list[Path] = []
    if method is None:  # no batch sampler: the verifier's own, one step at a time
        picks = _pick_chains(job.model, drafts, n, rng.random((trials, n)))
        for i in picks.tolist():
            d = drafts[i]
            out.append(tuple(v.sample(d.ref, d.q_rows, d.p_rows, rng)))
        return out
    noise_v = rng.random((trials, chain_noise_width(method, n)))
    picks = _pick_chains(job.model, drafts, n, rng.random((trials, n)))
    for i in np.unique(picks).tolist():
        d = drafts[i]
        out += [tuple(t) for t in CHAIN_BATCH[method](d.ref, d.q_rows, d.p_rows, noise_v[picks == i]).tokens(d.ref)]
    return out


def _tree_steps(job: Job, drafts: Sequence[TreeDraft], trials: int, rng: np.random.Generator) -> list[Path]:
    picks = categorical_batch([d.weight for d in drafts], rng.random(trials))
    proposals = TREE_PROPOSALS.get(job.verifier.name)
    out: list[Path] = []
    for i in np.unique(picks).tolist():
        tree, p_rows = drafts[i].tree, drafts[i].p_rows
        count = int((picks == i).sum())
        if proposals is not None:
            batch = multidraft_batch(tree, p_rows, rng.random((count, tree.size + 1)), proposals)
            out += [tuple(t) for t in batch.tokens(tree)]
        elif job.verifier.name in KSEQ_RULE:
            batch = kseq_batch(tree, p_rows, rng.random((count, tree.size + 1)), rho_rule=KSEQ_RULE[job.verifier.name])
            out += [tuple(t) for t in batch.tokens(tree)]
        elif job.verifier.name in TRAVERSAL_RULES:
            update, children = TRAVERSAL_RULES[job.verifier.name]
            noise = rng.random((count, tree.size + 1))
            batch = traversal_batch(tree, p_rows, noise, update_value=update, children=children)
            out += [tuple(t) for t in batch.tokens(tree)]
        else:
            assert isinstance(job.verifier, TreeVerifier)
            out += [tuple(job.verifier.sample(tree, p_rows, rng)) for _ in range(count)]
    return out


def statistical_check(
    job: Job, drafts: Sequence[Draft], law: OutputLaw, alpha: float, tv: float, rng: np.random.Generator | int,
    test: str = "kl-bound",
) -> Row:
    """``test`` (one of :data:`TESTS`) of sampled steps on the job's drafts against the exact law ``law``.

    ``rng`` is a ``numpy.random.Generator`` or an integer seed.
    """
    if test not in TESTS:
        raise ValueError(f"test must be one of {', '.join(TESTS)}, got {test!r}")
    gen = as_rng(rng)
    cells = sorted(law.output_law)
    index = {s: i for i, s in enumerate(cells)}
    probs = np.array([law.output_law[s] for s in cells] + [0.0])  # last cell: any other output
    if test == "kl-bound":
        trials = kl_required_samples(int((probs > 0.0).sum()), tv, alpha, POWER_MISS)
    else:
        # sized for the bins the check merges the cells into (module doc: cells of 1e-12 beside larger ones are
        # folded into their bins at any reachable size), and never so few that it has one bin
        trials = chi_square_samples(probs, tv, alpha, POWER_MISS, cover="bins")
    if job.chain_n is not None:
        steps = _chain_steps(job, [d for d in drafts if isinstance(d, DraftChain)], trials, gen)
    else:
        steps = _tree_steps(job, [d for d in drafts if isinstance(d, TreeDraft)], trials, gen)
    counts = np.bincount([index.get(s, len(cells)) for s in steps], minlength=len(probs))
    result = kl_check(counts, probs, alpha) if test == "kl-bound" else chi_square_check(counts, probs, alpha)
    top = np.argsort(-probs[:-1])[:12]
    plot = {
        "exact": [float(probs[i]) for i in top],
        "empirical": [float(counts[i] / trials) for i in top],
    }
    return Row(
        job.verifier.name, job.model.name, job.shape, job.check, bool(result.passed), None,
        float(result.p_value), int(trials), alpha, tv, job.verifier.biased, plot, int(result.impossible),
    )


def run_suite(config: SuiteConfig, progress: Callable[[str], None] | None = None) -> list[Row]:
    """Run every job; returns the table rows (exact check, then statistical check, per job)."""
    jobs = suite_jobs(config)
    alpha = config.false_fail / len(jobs)
    if alpha <= 0.0:  # before any job runs, in the user's terms
        raise ValueError(f"the false-fail rate {config.false_fail!r} split over {len(jobs)} checks rounds to 0: "
                         f"give a larger rate (--false-fail)")
    rng = np.random.default_rng(config.seed)
    rows: list[Row] = []
    for i, job in enumerate(jobs):
        if progress is not None:
            progress(f"[{i + 1}/{len(jobs)}] {job.verifier.name} on {job.model.name}, {job.shape}")
        drafts = job_drafts(job)  # once: the exact law and the sampled steps use the same list
        law = exact_law(job, drafts)
        rows.append(
            Row(
                job.verifier.name, job.model.name, job.shape, EXACT_CHECK,
                bool(law.completion_error <= EXACT_TOL), float(law.completion_error), None, 0, None, None,
                job.verifier.biased,
            )
        )
        rows.append(statistical_check(job, drafts, law, alpha, config.detect_tv, rng, config.test))
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
            ("PASS" if r.passed else "FAIL"), _fmt(r.worst_exact, ".1e"),
            f"{r.impossible} impossible" if r.impossible else _fmt(r.p_value, ".3g"),
            r.samples or "-", _fmt(r.alpha, ".1e"),
        ]
        for r in rows
    ]
    head = ["verifier", "model", "shape", "check", "verdict", "worst exact", "p-value", "samples", "false-fail"]
    stat = [r for r in rows if r.check != EXACT_CHECK]
    summary = (
        f"{len(rows)} checks, {len(failures(rows))} failed (lossless verifiers); "
        f"false-fail budget {config.false_fail:g} split over {len(stat)} statistical checks; "
        f"each detects TV >= {config.detect_tv:g}{'' if config.test == 'kl-bound' else ' on its merged bins'} "
        f"w.p. >= {1 - POWER_MISS:g}; test {config.test}"
        f"{' (rates are finite-sample bounds)' if config.test == 'kl-bound' else ' (rates are asymptotic)'}; seed {config.seed}"
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
