"""Bias audit: search toy models for a case where a verifier is not lossless (DESIGN.md §5).

Notation: ``p`` is the target model, ``q`` the draft.  A verifier is audited
by the law of what one step emits, averaged over the draft's own randomness.
The measure of bias is the **completion TV**: continue every output ``s``
with the target up to a length ``L`` no output exceeds (``L`` = draft depth
+ 1) and compare with the target,

    C(t) = Σ_{s ≤ t} K̄(s) · P(t | s),      bias = ½ Σ_t |C(t) − P(t)|,

over all ``t`` of length ``L``.  ``C = P`` is the completion identity of
DESIGN.md §4, which holds exactly for every lossless one-step verifier; an
output with target probability 0 puts its whole mass on cells where ``P = 0``
and so counts in full.

Two modes, chosen by what the verifier exposes (see
:mod:`verification.examples` for the record types):

* **exact** — a :class:`~verification.examples.ChainVerifier` or
  :class:`~verification.examples.TreeVerifier` with a ``kernel``: ``K̄`` by
  enumerating every draft chain (:func:`tmc.enumeration.chain_output_law`)
  or draft tree (:func:`tmc.enumeration.averaged_tree_law`).  A case is biased
  when its TV exceeds ``tol`` (float rounding, 1e-9).  The kernel is trusted
  to be the sampler's law; the suites test that separately.
* **sampling** — anything else callable with the sampler convention: each
  case draws drafts from ``q``, runs the verifier, completes its output with
  the target and runs a chi-square test of ``C`` against ``P``
  (:mod:`verification.calibrated`).  The sample size is computed *before*
  sampling so that a TV of ``tv`` is detected with probability ``1 − beta``
  at false-fail rate ``alpha``; any output with target probability 0 is a
  hard failure.  Each case's noise is seeded from the case itself, so the
  search sees a deterministic predicate; the verdict rests on one fresh
  confirmation run of the minimal case, so the audit's false-fail rate is at
  most ``alpha``.

The search space is cut into cells (:func:`search_cells`: vocabulary
1..``max_vocab``, chains of 1..3 draft tokens or the tree shapes
``TREE_SHAPES`` with each draw kind the verifier is paired with), visited
smallest vocabulary first, then smallest shape.  In each cell
:func:`hypothesis.find` draws cases from :func:`audit_cases` (relations
between ``p`` and ``q`` that break real verifiers: independent rows,
``p == q``, one-hot targets, 1e-12 entries) with an equal share of the
remaining ``budget`` and a seed derived from ``seed``; the first biased case
is shrunk by hypothesis to the simplest rows (one row pair shared by every
prefix before per-prefix rows, small integer weights).  So the reported case
has the smallest vocabulary and shape among the cells searched before it.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import sys
import time
import zlib
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from itertools import product
from random import Random
from typing import Any, Literal

import numpy as np
from hypothesis import HealthCheck, Phase, Verbosity, find, settings
from hypothesis import strategies as st
from hypothesis.errors import NoSuchExample
from numpy.typing import NDArray

from tmc.enumeration import averaged_tree_law, chain_output_law, enumerate_draft_trees, enumerate_drafts, tree_p_rows
from tmc.multidraft import Draw, DraftTree
from tmc.noise import categorical
from tmc.report import format_table
from tmc.toy import Path, ToyModel
from verification.calibrated import chi_square_check, required_samples
from verification.examples import ALL_DRAWS, ChainVerifier, TreeKernelFn, TreeVerifier, Verifier
from verification.strategies import prob_rows, target_row

FloatArray = NDArray[np.float64]
Kind = Literal["chain", "tree"]
Mode = Literal["exact", "sampling"]

#: Relations between target and draft rows, in shrinking order.
RELATIONS = ("independent", "identical", "greedy", "tiny")
CHAIN_LENGTHS: tuple[int, ...] = (1, 2, 3)
#: Tree shapes (children per node at each depth), smallest first.
TREE_SHAPES: tuple[tuple[int, ...], ...] = ((1,), (2,), (1, 1), (3,), (2, 1))
MAX_WEIGHT = 4  # rows are small integer weights 0..MAX_WEIGHT, normalised
DEFAULT_EXACT_BUDGET = 500  # cases generated when the kernel is enumerated
DEFAULT_SAMPLING_BUDGET = 100  # cases generated when each case is sampled


# ----------------------------------------------------------------- cases


@dataclass(frozen=True)
class AuditCase:
    """One draft/target pair and draft shape the verifier is run on."""

    kind: Kind  # "chain" or "tree"
    model: ToyModel  # the draft q and target p rows
    widths: tuple[int, ...]  # children per node at each depth; a chain of n is (1,) * n
    draw: Draw | None  # tree drafts: how children are drawn; chains are drawn from q
    relation: str  # how p was drawn from q (one of RELATIONS)
    per_prefix: bool  # False: one q row and one p row shared by every prefix

    @property
    def cell(self) -> Cell:
        return Cell(self.model.vocab, self.widths, self.draw)

    @property
    def length(self) -> int:
        """``L``: output length the completion law is compared at (depth + 1)."""
        return len(self.widths) + 1

    def describe(self) -> str:
        shape = (
            f"chain of {len(self.widths)} draft token(s)"
            if self.kind == "chain"
            else f"tree widths {list(self.widths)} drawn {self.draw.value if self.draw else '?'}"
        )
        return f"vocab {self.model.vocab}, {shape}, target relation '{self.relation}'"

    def key(self) -> str:
        """Identity of the case for caching and for seeding its noise."""
        draw = self.draw.value if self.draw else "-"
        return f"{self.kind}|{self.widths}|{draw}|{json.dumps(self.model.to_dict(), sort_keys=True)}"


@dataclass(frozen=True)
class Cell:
    """One part of the search space: vocabulary size, draft shape and draw kind."""

    vocab: int  # vocabulary size V
    widths: tuple[int, ...]  # children per node at each depth; a chain of n is (1,) * n
    draw: Draw | None  # tree drafts: how children are drawn; None for chains


def search_cells(
    kind: Kind,
    *,
    max_vocab: int = 3,
    chain_lengths: Sequence[int] = CHAIN_LENGTHS,
    tree_shapes: Sequence[tuple[int, ...]] = TREE_SHAPES,
    draws: Sequence[Draw] = ALL_DRAWS,
) -> list[Cell]:
    """The cells in the order they are searched: smallest vocabulary, then smallest shape."""
    if kind == "chain":
        return [Cell(v, (1,) * n, None) for v in range(1, max_vocab + 1) for n in chain_lengths]
    return [Cell(v, tuple(w), d) for v in range(1, max_vocab + 1) for w in tree_shapes for d in draws]


@st.composite
def audit_cases(draw: st.DrawFn, *, kind: Kind, cell: Cell) -> AuditCase:
    """A draft/target toy model for one cell; shrinks to the simplest rows.

    Draw order sets shrinking priority: relation, shared-vs-per-prefix rows,
    then the rows (small integer weights, shrinking towards 0 and 1).
    """
    vocab, widths = cell.vocab, cell.widths
    relation = draw(st.sampled_from(RELATIONS))
    per_prefix = draw(st.booleans())
    prefixes: list[Path] = [()]
    if per_prefix:  # rows for every prefix the draft and the completion can reach
        prefixes = [pre for d in range(len(widths) + 1) for pre in product(range(vocab), repeat=d)]
    q_rows: dict[Path, FloatArray] = {}
    p_rows: dict[Path, FloatArray] = {}
    for pre in prefixes:
        q_rows[pre] = draw(prob_rows(vocab, tiny=relation == "tiny", max_weight=MAX_WEIGHT))
        p_rows[pre] = draw(target_row(relation, q_rows[pre], max_weight=MAX_WEIGHT))
    if per_prefix:
        model = ToyModel(vocab, q_rows, p_rows, name="audit-case")
    else:
        model = ToyModel(vocab, {}, {}, q_rows[()], p_rows[()], name="audit-case")
    return AuditCase(kind, model, widths, cell.draw, relation, per_prefix)


# ------------------------------------------------------------ evaluation


@dataclass(frozen=True)
class Evaluation:
    """The verifier's law on one case next to the target's."""

    output_law: dict[Path, float]  # law of the emitted string (exact, or sample frequencies)
    completed: dict[Path, float]  # C(t) at length L (exact, or sample frequencies)
    target: dict[Path, float]  # P(t) at length L, cells with P(t) > 0
    tv: float  # ½ Σ |C − P| (plug-in estimate in sampling mode)
    biased: bool  # verdict on this case
    samples: int = 0  # sampling mode: steps run (fixed before sampling)
    p_value: float | None = None  # sampling mode: chi-square upper tail
    impossible: int = 0  # sampling mode: outputs with target probability 0
    error: str | None = None  # the verifier raised or returned an invalid output


def target_law(model: ToyModel, length: int) -> dict[Path, float]:
    """``P(t)`` for every ``t`` of ``length`` tokens with ``P(t) > 0``."""
    out: dict[Path, float] = {}

    def walk(node: Path, prob: float) -> None:
        if len(node) == length:
            out[node] = prob
            return
        row = model.p(node)
        for a in range(model.vocab):
            if row[a] > 0.0:
                walk(node + (a,), prob * float(row[a]))

    walk((), 1.0)
    return out


def completed_law(model: ToyModel, output_law: dict[Path, float], length: int) -> dict[Path, float]:
    """``C(t) = Σ_{s ≤ t} K̄(s) P(t | s)`` for every ``t`` of ``length`` with ``C(t) ≠ 0``."""
    out: dict[Path, float] = {}

    def walk(node: Path, mass: float) -> None:
        if len(node) == length:
            if mass != 0.0:
                out[node] = mass
            return
        row = model.p(node)
        for a in range(model.vocab):
            child = node + (a,)
            walk(child, mass * float(row[a]) + output_law.get(child, 0.0))

    walk((), output_law.get((), 0.0))
    return out


def total_variation(a: dict[Path, float], b: dict[Path, float]) -> float:
    """``½ Σ |a − b|`` over the union of the cells."""
    return 0.5 * sum(abs(a.get(t, 0.0) - b.get(t, 0.0)) for t in set(a) | set(b))


def exact_evaluation(verifier: Verifier, case: AuditCase, tol: float = 1e-9) -> Evaluation:
    """Exact completion TV of a verifier with a kernel on one case."""
    if verifier.kernel is None:
        raise ValueError(f"verifier {verifier.name!r} has no kernel; use sampling mode")
    try:
        if isinstance(verifier, ChainVerifier):
            law = chain_output_law(case.model, len(case.widths), verifier.kernel).output_law
        else:
            law = _tree_law(case, verifier.kernel)
    except Exception as err:  # the audited code failed on a valid input: that is a finding
        return Evaluation({}, {}, {}, math.nan, True, error=f"{type(err).__name__}: {err}")
    target = target_law(case.model, case.length)
    completed = completed_law(case.model, law, case.length)
    tv = total_variation(completed, target)
    return Evaluation(law, completed, target, tv, not tv <= tol)


def _drafted_trees(case: AuditCase) -> list[tuple[float, DraftTree]]:
    assert case.draw is not None
    return list(enumerate_draft_trees(case.model, case.widths, case.draw))


def _tree_law(case: AuditCase, kernel_fn: TreeKernelFn) -> dict[Path, float]:
    """Averaged output law ``K̄`` over every draft tree of the case."""
    assert case.draw is not None
    return averaged_tree_law(case.model, case.widths, case.draw, kernel_fn)[0]


Step = Callable[[np.random.Generator], object]


def _draft_pool(verifier: Verifier, case: AuditCase) -> tuple[list[Step], FloatArray]:
    """One step of the verifier on each draft of the case's shape, and each draft's probability."""
    model, n = case.model, len(case.widths)
    steps: list[Step] = []
    if isinstance(verifier, ChainVerifier):
        chains = list(enumerate_drafts(model, n))
        steps.extend(partial(verifier.sample, d.ref, d.q_rows, d.p_rows) for d in chains)
        return steps, np.array([d.weight for d in chains])
    trees = _drafted_trees(case)
    steps.extend(partial(verifier.sample, tree, tree_p_rows(model, tree)) for _, tree in trees)
    return steps, np.array([w for w, _ in trees])


class _InvalidOutput(Exception):
    pass


def _as_output(out: object, vocab: int, length: int) -> Path:
    if not isinstance(out, Iterable):
        raise _InvalidOutput(f"returned {out!r}, not a list of token ids")
    try:
        toks = tuple(int(t) for t in out)
    except (TypeError, ValueError):
        raise _InvalidOutput(f"returned {out!r}, not a list of token ids") from None
    if not 1 <= len(toks) <= length or any(not 0 <= t < vocab for t in toks):
        raise _InvalidOutput(f"returned {list(toks)}: need 1..{length} tokens in [0, {vocab})")
    return toks


def _complete(model: ToyModel, s: Path, length: int, rng: np.random.Generator) -> Path:
    while len(s) < length:
        s = s + (categorical(model.p(s), float(rng.random())),)
    return s


def sampled_evaluation(
    verifier: Verifier, case: AuditCase, *, tv: float, alpha: float, beta: float, rng: np.random.Generator
) -> Evaluation:
    """Calibrated chi-square test of the completed output law against the target on one case.

    The sample size is fixed by ``(bins, tv, alpha, beta)`` before sampling.
    """
    target = target_law(case.model, case.length)
    cells = sorted(target)
    samples = required_samples(max(len(cells), 2), tv, alpha, beta)
    steps, weights = _draft_pool(verifier, case)
    picks = rng.choice(len(steps), size=samples, p=weights / weights.sum())
    emitted: dict[Path, int] = defaultdict(int)
    completed: dict[Path, int] = defaultdict(int)
    for i in picks:
        try:
            out = steps[int(i)](rng)
            s = _as_output(out, case.model.vocab, case.length)
        except _InvalidOutput as err:
            return Evaluation({}, {}, target, math.nan, True, error=f"invalid output: {err}")
        except Exception as err:  # the audited code failed on a valid input: that is a finding
            return Evaluation({}, {}, target, math.nan, True, error=f"{type(err).__name__}: {err}")
        emitted[s] += 1
        completed[_complete(case.model, s, case.length, rng)] += 1
    impossible = sum(c for t, c in completed.items() if t not in target)
    counts = np.array([completed.get(t, 0) for t in cells] + [impossible], dtype=np.int64)
    probs = np.array([target[t] for t in cells] + [0.0])  # last cell: target probability 0
    check = chi_square_check(counts, probs, alpha)
    freq = {t: c / samples for t, c in completed.items()}
    law = {s: c / samples for s, c in emitted.items()}
    est_tv = total_variation(freq, target)
    return Evaluation(law, freq, target, est_tv, not check.passed, samples, check.p_value, impossible)


# ---------------------------------------------------------------- result


@dataclass(frozen=True)
class Counterexample:
    """The minimal biased case found and the verifier's law on it."""

    case: AuditCase  # the shrunk draft/target pair and shape
    evaluation: Evaluation  # exact or confirmed-by-sampling law next to the target


@dataclass(frozen=True)
class AuditResult:
    """Verdict of one audit, with the search budget and what it could have missed."""

    verifier: str  # name of the audited verifier
    kind: Kind  # "chain" or "tree"
    mode: Mode  # "exact" (kernel enumerated) or "sampling" (calibrated tests)
    biased: bool  # a biased case was found (confirmed, in sampling mode) or the verifier failed on one
    budget: int  # cases hypothesis was allowed to generate
    seed: int  # seed of the search (and of the sampling noise)
    cases_tried: int  # distinct cases evaluated before the first biased one (or in all)
    shrink_evaluations: int  # distinct cases evaluated while shrinking
    missable_tv: float  # largest bias per tried case that could go unflagged (tol or detectable TV)
    draws: tuple[str, ...]  # tree draw kinds searched (empty for chains)
    max_vocab: int  # largest vocabulary searched
    shapes: tuple[tuple[int, ...], ...]  # draft shapes searched (chain of n = (1,) * n)
    counterexample: Counterexample | None  # minimal biased case, None if none found
    elapsed_s: float  # wall-clock time of the audit
    alpha: float | None = None  # sampling mode: false-fail rate of the verdict
    beta: float | None = None  # sampling mode: miss probability at missable_tv per case
    note: str = ""  # anything the verdict needs qualified

    @property
    def exit_code(self) -> int:
        """CLI status: 0 no bias found within the budget, 1 biased."""
        return 1 if self.biased else 0

    def render(self) -> str:
        """Human-readable report: verdict, budget, and the minimal case with both laws."""
        lines = [self._headline(), *self._budget_lines()]
        if self.note:
            lines.append(f"  note: {self.note}")
        if self.counterexample is not None:
            lines.append("")
            lines.extend(_render_counterexample(self.counterexample, self.mode))
        return "\n".join(lines)

    def _headline(self) -> str:
        draws = f", drafts drawn {'/'.join(self.draws)}" if self.kind == "tree" else ""
        if self.biased:
            assert self.counterexample is not None
            ev = self.counterexample.evaluation
            what = f"crashed ({ev.error})" if ev.error else f"BIASED: TV {ev.tv:.6g} on a minimal case"
            return f"audit of {self.verifier} ({self.kind}{draws}): {what}"
        return f"audit of {self.verifier} ({self.kind}{draws}): no bias found within the budget"

    def _budget_lines(self) -> list[str]:
        shapes = ", ".join(
            f"n={len(s)}" if self.kind == "chain" else str(list(s)) for s in self.shapes
        )
        lines = [
            f"  mode: {_MODE_TEXT[self.mode]}",
            f"  search: budget {self.budget} cases (seed {self.seed}); tried {self.cases_tried}"
            f" before {'the first biased one' if self.biased else 'stopping'},"
            f" {self.shrink_evaluations} more while shrinking",
            f"  space: vocab 1..{self.max_vocab}, shapes {shapes}, relations {'/'.join(RELATIONS)};"
            " searched cell by cell, smallest first",
        ]
        if self.mode == "exact":
            lines.append(
                f"  smallest bias that could be missed on a tried case: TV {self.missable_tv:.1e} (float tolerance)"
            )
        else:
            lines.append(
                f"  smallest bias detected on a tried case: TV {self.missable_tv:g} with probability"
                f" >= {1 - (self.beta or 0):g}; verdict false-fail rate {self.alpha:g}"
            )
        lines.append("  cases outside the search space are not covered")
        lines.append(f"  time: {self.elapsed_s:.2f} s")
        return lines

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (paths as comma-joined token ids)."""
        out: dict[str, Any] = {
            "verifier": self.verifier,
            "kind": self.kind,
            "mode": self.mode,
            "biased": self.biased,
            "exit_code": self.exit_code,
            "budget": self.budget,
            "seed": self.seed,
            "cases_tried": self.cases_tried,
            "shrink_evaluations": self.shrink_evaluations,
            "missable_tv": self.missable_tv,
            "draws": list(self.draws),
            "max_vocab": self.max_vocab,
            "shapes": [list(s) for s in self.shapes],
            "elapsed_s": self.elapsed_s,
            "alpha": self.alpha,
            "beta": self.beta,
            "note": self.note,
            "counterexample": None,
        }
        if self.counterexample is not None:
            case, ev = self.counterexample.case, self.counterexample.evaluation
            out["counterexample"] = {
                "model": case.model.to_dict(),
                "widths": list(case.widths),
                "draw": case.draw.value if case.draw else None,
                "relation": case.relation,
                "length": case.length,
                "tv": ev.tv,
                "error": ev.error,
                "samples": ev.samples,
                "p_value": ev.p_value,
                "impossible": ev.impossible,
                "output_law": _json_law(ev.output_law),
                "completed_law": _json_law(ev.completed),
                "target_law": _json_law(ev.target),
            }
        return out


_MODE_TEXT = {
    "exact": "exact enumeration of the verifier's kernel over every draft",
    "sampling": "calibrated sampling (chi-square of the completed output law against the target)",
}


def _json_law(law: dict[Path, float]) -> dict[str, float]:
    return {_fmt_path(s): v for s, v in sorted(law.items())}


def _fmt_path(s: Path) -> str:
    return ",".join(str(t) for t in s) if s else "()"


def _fmt_row(row: FloatArray) -> str:
    return "[" + ", ".join(f"{x:.6g}" for x in row) + "]"


def _render_model(case: AuditCase) -> list[str]:
    model = case.model
    if not case.per_prefix:
        assert model.draft_default is not None and model.target_default is not None
        return [
            "  rows (the same after every prefix):",
            f"    draft  q = {_fmt_row(model.draft_default)}",
            f"    target p = {_fmt_row(model.target_default)}",
        ]
    prefixes = sorted(model.target_rows, key=lambda s: (len(s), s))
    rows = [(_fmt_path(pre), _fmt_row(model.q(pre)), _fmt_row(model.p(pre))) for pre in prefixes]
    table = format_table(["prefix", "draft q", "target p"], rows)
    return ["  rows per prefix:"] + ["    " + line for line in table.splitlines()]


def _render_counterexample(cx: Counterexample, mode: Mode) -> list[str]:
    case, ev = cx.case, cx.evaluation
    lines = [f"minimal counterexample: {case.describe()}", *_render_model(case)]
    if ev.error:
        lines.append(f"  the verifier failed on this valid input: {ev.error}")
        return lines
    how = "exact" if mode == "exact" else f"estimated from {ev.samples} steps"
    law_rows = [(_fmt_path(s), f"{m:.6g}") for s, m in sorted(ev.output_law.items())]
    lines.append(f"  law of the emitted tokens ({how}):")
    lines.extend(_indent(format_table(["emitted", "probability"], law_rows)))
    cells = sorted(set(ev.completed) | set(ev.target))
    comp_rows = [
        (_fmt_path(t), f"{ev.completed.get(t, 0.0):.6g}", f"{ev.target.get(t, 0.0):.6g}",
         f"{ev.completed.get(t, 0.0) - ev.target.get(t, 0.0):+.6g}")
        for t in cells
    ]
    lines.append(f"  output continued with the target to length {case.length} (verifier) vs the target law:")
    lines.extend(_indent(format_table(["t", "verifier", "target", "difference"], comp_rows)))
    estimate = " (plug-in estimate)" if mode == "sampling" else ""
    lines.append(f"  total variation distance: {ev.tv:.6g}{estimate}")
    if mode == "sampling":
        hard = " (a hard failure)" if ev.impossible else ""
        lines.append(f"  chi-square p-value {ev.p_value:.3g}; outputs with target probability 0: {ev.impossible}{hard}")
    return lines


def _indent(table: str) -> list[str]:
    return ["    " + line for line in table.splitlines()]


# ---------------------------------------------------------------- search


@dataclass
class _Search:
    """The search predicate: evaluates cases, caches verdicts, caps shrinking work.

    Mutable bookkeeping of one audit call; never shared between audits.
    """

    evaluate: Callable[[AuditCase], Evaluation]
    shrink_cap: int  # distinct cases evaluated after the first biased one
    cache: dict[str, Evaluation] = field(default_factory=dict)
    tried: int = 0
    shrunk: int = 0
    found: bool = False

    def __call__(self, case: AuditCase) -> bool:
        key = case.key()
        hit = self.cache.get(key)
        if hit is None:
            if self.found and self.shrunk >= self.shrink_cap:
                return False  # shrink budget spent: treat untried candidates as not biased
            hit = self.evaluate(case)
            self.cache[key] = hit
            if self.found:
                self.shrunk += 1
            else:
                self.tried += 1
        self.found = self.found or hit.biased
        return hit.biased


def _case_rng(seed: int, case: AuditCase, salt: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32((salt + case.key()).encode())])


def _as_verifier(verifier: object, kind: str | None, draws: Sequence[Draw] | None) -> Verifier:
    if kind is not None and kind not in ("chain", "tree"):
        raise ValueError(f"kind must be 'chain' or 'tree', got {kind!r}")
    if isinstance(verifier, (ChainVerifier, TreeVerifier)):
        if kind is not None and kind != verifier.kind:
            raise ValueError(f"verifier {verifier.name!r} is a {verifier.kind} verifier, not {kind}")
        if draws and isinstance(verifier, TreeVerifier):
            return replace(verifier, draws=tuple(draws))
        return verifier
    if not callable(verifier):
        raise ValueError(f"verifier must be callable, got {type(verifier).__name__}")
    if kind is None:
        raise ValueError("kind ('chain' or 'tree') is required for a plain function")
    name = getattr(verifier, "__qualname__", None) or repr(verifier)
    module = getattr(verifier, "__module__", None)
    label = f"{module}:{name}" if module else str(name)
    if kind == "chain":
        return ChainVerifier(label, verifier)
    return TreeVerifier(label, verifier, draws=tuple(draws) if draws else ALL_DRAWS)


def _preflight(verifier: Verifier) -> None:
    """Run the verifier once on a trivial valid input so a wrong convention is a usage error."""
    rng = np.random.default_rng(0)
    uniform = np.full((2, 2), 0.5)
    model = ToyModel(2, {}, {}, uniform[0], uniform[0])
    try:
        if isinstance(verifier, ChainVerifier):
            out = verifier([0], uniform[:1], uniform, rng)
        else:
            tree = next(enumerate_draft_trees(model, (1,), verifier.draws[0]))[1]
            out = verifier(tree, tree_p_rows(model, tree), rng)
        _as_output(out, 2, 2)
    except Exception as err:
        if not isinstance(err, (TypeError, _InvalidOutput)):
            return  # a failure on valid input is a finding, reported by the search itself
        raise ValueError(
            f"{verifier.name} does not follow the {verifier.kind} verifier calling convention: {err}"
        ) from None


def _search_settings(budget: int) -> settings:
    return settings(
        max_examples=budget,
        derandomize=False,  # the seed comes from find(random=...)
        database=None,
        deadline=None,
        phases=(Phase.generate, Phase.shrink),
        print_blob=False,
        verbosity=Verbosity.quiet,
        suppress_health_check=list(HealthCheck),
    )


def _search_cells(search: _Search, kind: Kind, cells: Sequence[Cell], budget: int, seed: int) -> AuditCase | None:
    """Search the cells in order with hypothesis; shrink and return the first biased case.

    Searching cell by cell makes the reported case minimal in vocabulary and
    shape (every smaller cell was searched first) and spreads the budget
    evenly: each cell gets an equal share of what is left, so budget left
    over by tiny cells (V = 1 has one model) goes to the larger ones.
    """
    for i, cell in enumerate(cells):
        share = max(1, math.ceil((budget - search.tried) / (len(cells) - i)))
        try:
            return find(
                audit_cases(kind=kind, cell=cell),
                search,
                settings=_search_settings(share),
                random=Random(f"{seed}:{i}"),
            )
        except NoSuchExample:
            continue
    return None


def audit(
    verifier: object,
    kind: str | None = None,
    *,
    budget: int | None = None,
    seed: int = 0,
    mode: str = "auto",
    draws: Sequence[Draw | str] | None = None,
    max_vocab: int = 3,
    tol: float = 1e-9,
    tv: float = 0.1,
    alpha: float = 1e-6,
    beta: float = 1e-3,
    shrink_cap: int | None = None,
) -> AuditResult:
    """Search toy models for a case where ``verifier`` does not reproduce the target law.

    ``verifier`` is a :class:`~verification.examples.ChainVerifier` /
    :class:`~verification.examples.TreeVerifier` or a plain function with the
    chain (``f(ref, q_rows, p_rows, rng)``) or tree (``f(tree, p_rows, rng)``)
    convention; ``kind`` is required for a plain function.  ``mode`` is
    ``"auto"`` (exact when a kernel is exposed), ``"exact"`` or ``"sampling"``.
    ``budget`` is the number of cases hypothesis generates (default 500 exact,
    100 sampling); ``shrink_cap`` bounds the distinct cases evaluated while
    shrinking (default ``5 * budget`` exact, ``budget`` sampling).  ``tol`` is
    the exact-mode rounding tolerance on the TV; ``tv``, ``alpha``, ``beta``
    calibrate sampling mode.  ``draws`` restricts tree drafts to those kinds.
    """
    start = time.perf_counter()
    kinds = None if draws is None else [Draw(d) for d in draws]
    subject = _as_verifier(verifier, kind, kinds)
    chosen = _choose_mode(subject, mode)
    if budget is None:
        budget = DEFAULT_EXACT_BUDGET if chosen == "exact" else DEFAULT_SAMPLING_BUDGET
    _check_numbers(budget, max_vocab, tol, tv, alpha, beta)
    cap = (5 * budget if chosen == "exact" else budget) if shrink_cap is None else shrink_cap
    _preflight(subject)
    evaluate = _evaluator(subject, chosen, seed=seed, tol=tol, tv=tv, alpha=alpha, beta=beta)
    search = _Search(evaluate, cap)
    shapes = _shapes(subject)
    cells = search_cells(
        subject.kind,
        max_vocab=max_vocab,
        chain_lengths=[len(s) for s in shapes],
        tree_shapes=shapes,
        draws=subject.draws if isinstance(subject, TreeVerifier) else ALL_DRAWS,
    )
    case = _search_cells(search, subject.kind, cells, budget, seed)
    counterexample, note = _confirm(case, search, chosen, subject, seed, tv, alpha, beta)
    return AuditResult(
        verifier=subject.name,
        kind=subject.kind,
        mode=chosen,
        biased=counterexample is not None,
        budget=budget,
        seed=seed,
        cases_tried=search.tried,
        shrink_evaluations=search.shrunk,
        missable_tv=tol if chosen == "exact" else tv,
        draws=tuple(d.value for d in subject.draws) if isinstance(subject, TreeVerifier) else (),
        max_vocab=max_vocab,
        shapes=shapes,
        counterexample=counterexample,
        elapsed_s=time.perf_counter() - start,
        alpha=alpha if chosen == "sampling" else None,
        beta=beta if chosen == "sampling" else None,
        note=note,
    )


def _choose_mode(subject: Verifier, mode: str) -> Mode:
    if mode == "auto":
        return "exact" if subject.kernel is not None else "sampling"
    if mode == "exact":
        if subject.kernel is None:
            raise ValueError(f"mode 'exact' needs a kernel; {subject.name} exposes none")
        return "exact"
    if mode == "sampling":
        return "sampling"
    raise ValueError(f"mode must be 'auto', 'exact' or 'sampling', got {mode!r}")


def _check_numbers(budget: int, max_vocab: int, tol: float, tv: float, alpha: float, beta: float) -> None:
    if budget < 1:
        raise ValueError(f"budget must be >= 1, got {budget}")
    if not 1 <= max_vocab <= 4:
        raise ValueError(f"max_vocab must be in 1..4 (exhaustive enumeration), got {max_vocab}")
    if not tol >= 0.0:
        raise ValueError(f"tol must be >= 0, got {tol}")
    if not 0.0 < tv <= 1.0:
        raise ValueError(f"tv must be in (0, 1], got {tv}")
    for name, value in (("alpha", alpha), ("beta", beta)):
        if not 0.0 < value < 1.0:
            raise ValueError(f"{name} must be in (0, 1), got {value}")


def _shapes(subject: Verifier) -> tuple[tuple[int, ...], ...]:
    if isinstance(subject, ChainVerifier):
        return tuple((1,) * n for n in CHAIN_LENGTHS)
    return TREE_SHAPES


def _evaluator(
    subject: Verifier, mode: Mode, *, seed: int, tol: float, tv: float, alpha: float, beta: float
) -> Callable[[AuditCase], Evaluation]:
    if mode == "exact":
        return lambda case: exact_evaluation(subject, case, tol)
    return lambda case: sampled_evaluation(
        subject, case, tv=tv, alpha=alpha, beta=beta, rng=_case_rng(seed, case, "search")
    )


def _confirm(
    case: AuditCase | None,
    search: _Search,
    mode: Mode,
    subject: Verifier,
    seed: int,
    tv: float,
    alpha: float,
    beta: float,
) -> tuple[Counterexample | None, str]:
    """The verdict: exact findings stand; a sampled finding must reproduce on fresh noise."""
    if case is None:
        return None, ""
    found = search.cache[case.key()]
    if mode == "exact" or found.error:
        return Counterexample(case, found), ""
    fresh = sampled_evaluation(subject, case, tv=tv, alpha=alpha, beta=beta, rng=_case_rng(seed, case, "confirm"))
    if fresh.biased:
        return Counterexample(case, fresh), ""
    return None, (
        f"the search flagged {case.describe()} (p = {found.p_value:.2g}) but a fresh confirmation run"
        f" did not reproduce it (p = {fresh.p_value:.2g})"
    )


# ------------------------------------------------------------------- CLI


def load_target(spec: str) -> object:
    """Import ``MODULE:NAME`` (``NAME`` may be dotted); ``ValueError`` if it cannot be found."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"expected MODULE:FUNCTION, got {spec!r}")
    try:
        obj: object = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"cannot import module {module_name!r}: {err}") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"{module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"{spec} is not callable")
    return obj


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tmc audit",
        description="Search toy models for a draft/target pair on which a verifier is biased. "
        "Exit 0: no bias found within the budget; 1: biased; 2: usage error.",
    )
    parser.add_argument("target", metavar="MODULE:FUNCTION", help="the verifier, e.g. tmc:sps_sample")
    parser.add_argument("--kind", choices=["chain", "tree"], help="calling convention (required for plain functions)")
    parser.add_argument("--budget", type=int, default=None, help="cases to generate (default 500 exact, 100 sampling)")
    parser.add_argument("--seed", type=int, default=0, help="search and sampling seed (default 0)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument(
        "--draw", action="append", choices=[d.value for d in Draw], help="tree draw kind to search (repeatable)"
    )
    parser.add_argument("--sampling", action="store_true", help="sample even when a kernel is exposed")
    parser.add_argument("--max-vocab", type=int, default=3, help="largest vocabulary searched (1..4, default 3)")
    parser.add_argument("--tv", type=float, default=0.1, help="sampling: TV detected per case (default 0.1)")
    parser.add_argument("--alpha", type=float, default=1e-6, help="sampling: false-fail rate (default 1e-6)")
    return parser


def cli_main(argv: Sequence[str] | None = None) -> int:
    """``tmc audit MODULE:FUNCTION --kind chain|tree [...]``; returns the exit status."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2)
        return exc.code if isinstance(exc.code, int) else 2
    try:
        result = audit(
            load_target(args.target),
            args.kind,
            budget=args.budget,
            seed=args.seed,
            mode="sampling" if args.sampling else "auto",
            draws=args.draw,
            max_vocab=args.max_vocab,
            tv=args.tv,
            alpha=args.alpha,
        )
    except ValueError as err:
        print(f"tmc audit: {err}", file=sys.stderr)
        return 2
    print(json.dumps(result.to_dict(), indent=2) if args.json else result.render())
    return result.exit_code

