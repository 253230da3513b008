"""The audit's result: what was searched, what could have been missed, and the minimal case.

Notation (DESIGN.md §3): ``p`` is the target, ``q`` the draft.
:class:`AuditResult` is plain data; :meth:`AuditResult.render` prints the
human report and :meth:`AuditResult.to_dict` its JSON form (the only place
draw kinds become strings).  Both state, per cell, the smallest bias the
search could have missed on the cases it tried: the rounding tolerance in
exact mode (a search over cases, not a proof), the TV each case's sample was
sized to detect in sampling mode.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from tmc.commands.table import format_table
from tmc.multidraft import Draw
from tmc.toy import Path
from verification.audit.cases import LAYOUTS, PER_PREFIX_MAX_ROWS, AuditCase
from verification.audit.config import AuditConfig, Kind, Mode
from verification.audit.evaluate import Evaluation, SamplerCheck
from verification.audit.space import Cell, reach_lines
from verification.strategies import RELATIONS

FloatArray = NDArray[np.float64]


@dataclass(frozen=True)
class Counterexample:
    """The minimal biased case found and the verifier's law on it."""

    case: AuditCase  # the shrunk draft/target pair and shape
    evaluation: Evaluation  # exact, the fresh confirming sample, or the search's own conclusive sample


@dataclass(frozen=True)
class CellReport:
    """What the search did in one cell and the largest bias it could have missed there."""

    cell: Cell  # vocabulary, shape and draw kind
    cases_tried: int  # distinct cases evaluated in the cell (0: not reached)
    samples: int  # sampling mode: largest sample of one case in the cell (0 in exact mode)
    missable_tv: float  # exact: rounding tolerance; sampling: TV each case's sample was sized to detect


@dataclass(frozen=True)
class SamplerReport:
    """Exact mode: the calibrated tests of the sampler against its kernel."""

    tv: float  # TV between sampler and kernel each test detects with probability >= 1 - beta
    alpha: float  # false-fail rate of all the tests together (Bonferroni)
    beta: float  # miss probability of each test at tv
    checks: tuple[SamplerCheck, ...]  # one per case tested, in cell order
    skipped: str = ""  # why no test ran (empty when they ran)

    @property
    def failed(self) -> SamplerCheck | None:
        return next((c for c in self.checks if not c.passed), None)


@dataclass(frozen=True)
class Confirmation:
    """Sampling mode: the fresh samples that decide the verdict on the search's findings."""

    flagged: tuple[tuple[AuditCase, Evaluation], ...]  # (case, search evaluation) sent for confirmation
    runs: tuple[Evaluation, ...]  # fresh evaluation of each flagged case (same order; may stop early)
    alpha: float  # false-fail rate of the verdict, split evenly over the flagged cases
    confirmed: int | None  # index of the confirmed case, None when none was
    conclusive: bool = False  # the confirmed case stands on the search's own sample (crash, invalid or
    #                           impossible output: no lossless verifier produces one); no fresh sample ran for it


@dataclass(frozen=True)
class AuditResult:
    """Verdict of one audit, with what was searched and what it could have missed."""

    verifier: str  # name of the audited verifier
    kind: Kind  # "chain" or "tree"
    mode: Mode  # "exact" (kernel enumerated) or "sampling" (calibrated tests)
    biased: bool  # a biased case was found (confirmed, in sampling mode) or the verifier failed on one
    config: AuditConfig  # the options the audit ran with
    budget: int  # cases the search could try in all (a hard cap on cases_tried)
    draws: tuple[Draw, ...]  # tree draw kinds searched (empty for chains)
    cells: tuple[CellReport, ...]  # every cell of the search space, in search order
    cases_tried: int  # distinct cases evaluated before the first biased one (or in all); at most budget
    shrink_evaluations: int  # distinct cases evaluated while shrinking (and searching a cell moved to)
    counterexample: Counterexample | None  # minimal biased case, None if none found
    elapsed_s: float  # wall-clock time of the audit
    sampler: SamplerReport | None = None  # exact mode: sampler against kernel
    confirmation: Confirmation | None = None  # sampling mode: the fresh samples behind the verdict
    note: str = ""  # anything the verdict needs qualified
    unsearched: int = 0  # cells left unsearched (cases tried 0) because the budget was spent
    rechecks: int = 0  # (rows, cell) checks of found rows on earlier cells of their vocabulary and draw kind
    moves: tuple[tuple[Cell, Cell], ...] = ()  # (from, to): a found case's rows were biased on an earlier cell

    @property
    def sampler_mismatch(self) -> SamplerCheck | None:
        return self.sampler.failed if self.sampler is not None else None

    @property
    def exit_code(self) -> int:
        """CLI status: 0 no bias found within the budget, 1 biased (or sampler and kernel disagree)."""
        return 1 if self.biased or self.sampler_mismatch is not None else 0

    @property
    def seed(self) -> int:
        return self.config.seed

    @property
    def alpha(self) -> float:
        return self.config.alpha

    @property
    def beta(self) -> float:
        return self.config.beta

    @property
    def max_vocab(self) -> int:
        return self.config.max_vocab

    @property
    def missable_tv(self) -> float:
        """Largest bias per tried case that could go unflagged: the tolerance, or the detectable TV."""
        return self.config.tol if self.mode == "exact" else self.config.tv

    @property
    def shapes(self) -> tuple[tuple[int, ...], ...]:
        return tuple(dict.fromkeys(c.cell.widths for c in self.cells))

    # ------------------------------------------------------------- render

    def render(self) -> str:
        """Human-readable report: verdict, reach, what could be missed, and the minimal case."""
        lines = [self._headline(), f"  mode: {_MODE_TEXT[self.mode]}", *self._search_lines()]
        if self.exit_code == 0:
            lines.extend(self._missable_lines())
        lines.extend(self._sampler_lines())
        lines.extend(self._confirmation_lines())
        if self.note:
            lines.append(f"  note: {self.note}")
        lines.append(f"  time: {self.elapsed_s:.2f} s")
        if self.counterexample is not None:
            lines.extend(["", *_render_counterexample(self.counterexample, self.mode, self._law_source())])
        mismatch = self.sampler_mismatch
        if mismatch is not None and not self.biased:
            lines.extend(["", *_render_mismatch(mismatch)])
        return "\n".join(lines)

    def _headline(self) -> str:
        draws = f", drafts drawn {'/'.join(d.value for d in self.draws)}" if self.kind == "tree" else ""
        head = f"audit of {self.verifier} ({self.kind}{draws}): "
        mismatch = self.sampler_mismatch
        if self.biased:
            assert self.counterexample is not None
            ev = self.counterexample.evaluation
            return head + (f"crashed ({ev.error})" if ev.error else f"BIASED: TV {ev.tv:.6g} on a minimal case")
        if mismatch is not None:
            return head + f"SAMPLER DOES NOT MATCH ITS KERNEL ({_mismatch_reason(mismatch)}); the kernel shows no bias"
        return head + "no bias found within the budget"

    def _search_lines(self) -> list[str]:
        cells = [c.cell for c in self.cells]
        reach = "; ".join(reach_lines(self.kind, cells))
        layouts = f"rows {'/'.join(LAYOUTS)} (per prefix only up to {PER_PREFIX_MAX_ROWS} prefixes)"
        ended = "the first biased one" if self.counterexample is not None else "stopping"
        lines = [
            f"  reach: {reach}",
            f"  cases: target relations {'/'.join(RELATIONS)}; {layouts}; cells searched smallest first",
            f"  search: budget {self.budget} cases (seed {self.seed}); {self.cases_tried} distinct cases"
            f" tried before {ended}, {self.shrink_evaluations} more while shrinking",
        ]
        if self.unsearched:
            searched = len(self.cells) - self.unsearched
            lines.append(f"  unsearched: the budget was spent after {searched} of {len(self.cells)} cells; the other"
                         f" {self.unsearched} were not searched (cases tried 0): any bias there could be missed")
        if self.rechecks or self.moves:
            lines.append(f"  earlier cells: the found rows were re-evaluated on {self.rechecks} earlier cell(s) of"
                         f" their vocabulary and draw kind{_moves_text(self.moves)}")
        return lines

    def _missable_lines(self) -> list[str]:
        if self.mode == "exact":
            what = (f"exact: a completion TV above {self.config.tol:.0e} on a tried case is flagged."
                    " This is a search over cases, not a proof: untried cases are not covered")
        else:
            what = (f"sampling: each tried case's sample was sized to detect TV {self.config.tv:g} with"
                    f" probability >= {_power(self.beta)} at level {self.alpha:g}; smaller biases and untried"
                    " cases are not covered")
        table = format_table(self._missable_header(), self._missable_rows())
        return ["  smallest bias the search could have missed, per cell (" + what + "):", *_indent(table)]

    def _missable_header(self) -> list[str]:
        vocabs = sorted({c.cell.vocab for c in self.cells})
        draw = ["draw"] if self.kind == "tree" else []
        header = ["shape", *draw, f"cases tried at V={'/'.join(str(v) for v in vocabs)}"]
        if self.mode == "sampling":
            header.append("samples per case (largest)")
        return [*header, "missable TV on a tried case"]

    def _missable_rows(self) -> list[tuple[str, ...]]:
        vocabs = sorted({c.cell.vocab for c in self.cells})
        groups: dict[tuple[tuple[int, ...], Draw | None], dict[int, CellReport]] = {}
        for rep in self.cells:
            groups.setdefault((rep.cell.widths, rep.cell.draw), {})[rep.cell.vocab] = rep
        rows: list[tuple[str, ...]] = []
        for (widths, draw), by_vocab in groups.items():
            first = next(iter(by_vocab.values()))
            tried = "/".join(str(by_vocab[v].cases_tried) if v in by_vocab else "-" for v in vocabs)
            row = [first.cell.shape_label(), *([draw.value] if draw else []), tried]
            if self.mode == "sampling":
                row.append(str(max(r.samples for r in by_vocab.values())))
            tried_reps = [r for r in by_vocab.values() if r.cases_tried]
            row.append(f"{max(r.missable_tv for r in tried_reps):.3g}" if tried_reps else "not searched")
            rows.append(tuple(row))
        return rows

    def _sampler_lines(self) -> list[str]:
        rep = self.sampler
        if rep is None:
            return []
        if rep.skipped:
            return [f"  sampler vs kernel: not tested ({rep.skipped})"]
        failed = rep.failed
        verdict = "passed" if failed is None else f"FAILED ({_mismatch_reason(failed)}; stopped there)"
        samples = sum(c.samples for c in rep.checks)
        return [
            f"  sampler vs kernel: {len(rep.checks)} case(s) tested (per shape and draw kind, the tried case at"
            f" the largest vocabulary most likely to reject into a spread residual), {samples} steps; each test detects TV"
            f" {rep.tv:g} between sampler and kernel with probability >= {_power(rep.beta)}; false-fail rate"
            f" {rep.alpha:g} over all (Bonferroni): {verdict}"
        ]

    def _confirmation_lines(self) -> list[str]:
        conf = self.confirmation
        if conf is None:
            return []
        if conf.conclusive:
            head = ("  confirmation: the verdict rests on the search's own sample, which is conclusive (a crash,"
                    " an invalid output or an output of target probability 0: no lossless verifier produces one),"
                    " so no fresh sample was drawn for it")
        else:
            head = "  confirmation: the verdict rests only on fresh samples"
        lines = [f"{head} (false-fail rate {conf.alpha:g}, split over {len(conf.flagged)} flagged case(s)):"]
        for i, ((case, found), run) in enumerate(zip(conf.flagged, conf.runs)):
            outcome = "confirmed" if conf.confirmed == i else "not confirmed"
            if found.conclusive:
                lines.append(f"    {case.describe()}: conclusive on the search's own sample"
                             f" ({found.error or f'{found.impossible} outputs of target probability 0'})")
                continue
            lines.append(
                f"    {case.describe()}: search p = {_p(found.p_value)}, TV ~ {found.tv:.3g}; fresh {run.samples}"
                f" steps sized to detect TV {run.detect_tv:.3g} w.p. >= {_power(self.beta)}:"
                f" p = {_p(run.p_value)} -> {outcome}"
            )
        return lines

    def _law_source(self) -> str:
        """Where the counterexample's law comes from, in words."""
        assert self.counterexample is not None
        if self.mode == "exact":
            return "exact"
        samples = self.counterexample.evaluation.samples
        if self.confirmation is not None and self.confirmation.conclusive:
            return f"estimated from the search's own {samples} steps, conclusive without a fresh sample"
        return f"estimated from {samples} fresh steps"

    # -------------------------------------------------------------- JSON

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (paths as comma-joined token ids; draw kinds as strings)."""
        cfg = self.config
        out: dict[str, Any] = {
            "verifier": self.verifier,
            "kind": self.kind,
            "mode": self.mode,
            "biased": self.biased,
            "exit_code": self.exit_code,
            "budget": self.budget,
            "seed": cfg.seed,
            "draws": [d.value for d in self.draws],
            "max_vocab": cfg.max_vocab,
            "shapes": [list(s) for s in self.shapes],
            "reach": reach_lines(self.kind, [c.cell for c in self.cells]),
            "relations": list(RELATIONS),
            "cases_tried": self.cases_tried,
            "shrink_evaluations": self.shrink_evaluations,
            "cells_unsearched": self.unsearched,
            "rechecks": self.rechecks,
            "moves": [{"from": _cell_dict_short(a), "to": _cell_dict_short(b)} for a, b in self.moves],
            "missable_tv": self.missable_tv,
            "tol": cfg.tol if self.mode == "exact" else None,
            "tv": cfg.tv,
            "alpha": cfg.alpha,
            "beta": cfg.beta,
            "cells": [_cell_dict(c) for c in self.cells],
            "elapsed_s": self.elapsed_s,
            "note": self.note,
            "counterexample": None,
            "sampler_check": _sampler_dict(self.sampler),
            "confirmation": _confirmation_dict(self.confirmation),
        }
        if self.counterexample is not None:
            case, ev = self.counterexample.case, self.counterexample.evaluation
            out["counterexample"] = {**_case_dict(case), **_evaluation_dict(ev)}
        return out


_MODE_TEXT = {
    "exact": "exact enumeration of the verifier's kernel over every draft",
    "sampling": "calibrated sampling (KL-bound test of the completed output law against the target)",
}


def _mismatch_reason(check: SamplerCheck) -> str:
    if check.error:
        return check.error
    if check.impossible:
        return f"{check.impossible} emitted strings the kernel gives probability 0"
    return f"p = {check.p_value:.3g} < {check.alpha:.3g}"


def _power(beta: float) -> str:
    """``1 − beta`` for the text: ``1 - 1e-300`` where ``1 − beta`` would print as ``1``."""
    text = f"{1 - beta:g}"
    return f"1 - {beta:g}" if text == "1" else text


def _p(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def _cell_dict_short(cell: Cell) -> dict[str, Any]:
    return {"vocab": cell.vocab, "widths": list(cell.widths), "draw": cell.draw.value if cell.draw else None}


def _cell_text(cell: Cell) -> str:
    """``V=3 [2] swor`` or ``V=2 n=3``."""
    draw = f" {cell.draw.value}" if cell.draw else ""
    return f"V={cell.vocab} {cell.shape_label()}{draw}"


def _moves_text(moves: tuple[tuple[Cell, Cell], ...]) -> str:
    if not moves:
        return ": unbiased on each"
    steps = "; ".join(f"found on {_cell_text(a)}, biased already on {_cell_text(b)}" for a, b in moves)
    return f" ({steps}): the case moved there, and hypothesis searched that cell again to shrink it there"


def _cell_dict(rep: CellReport) -> dict[str, Any]:
    cell = rep.cell
    return {
        **_cell_dict_short(cell),
        "cases_tried": rep.cases_tried,
        "samples_per_case": rep.samples or None,
        "missable_tv": rep.missable_tv,
    }


def _case_dict(case: AuditCase) -> dict[str, Any]:
    return {
        "model": case.model.to_dict(),
        "vocab": case.vocab,
        "widths": list(case.widths),
        "draw": case.draw.value if case.draw else None,
        "relation": case.relation,
        "layout": case.layout,
        "length": case.length,
    }


def _evaluation_dict(ev: Evaluation) -> dict[str, Any]:
    return {
        "tv": ev.tv,
        "error": ev.error,
        "samples": ev.samples,
        "p_value": ev.p_value,
        "impossible": ev.impossible,
        "detect_tv": ev.detect_tv,
        "output_law": _json_law(ev.output_law),
        "completed_law": _json_law(ev.completed),
        "target_law": _json_law(ev.target),
    }


def _sampler_dict(rep: SamplerReport | None) -> dict[str, Any] | None:
    if rep is None:
        return None
    checks = [
        {**_case_dict(c.case), "samples": c.samples, "alpha": c.alpha, "p_value": c.p_value,
         "impossible": c.impossible, "passed": c.passed, "error": c.error}
        for c in rep.checks
    ]
    failed = rep.failed
    return {
        "tv": rep.tv,
        "alpha": rep.alpha,
        "beta": rep.beta,
        "skipped": rep.skipped or None,
        "passed": failed is None,
        "checks": checks,
        "mismatch": None if failed is None else {
            **_case_dict(failed.case), "kernel_law": _json_law(failed.kernel_law),
            "sampled_law": _json_law(failed.sampled_law), "p_value": failed.p_value, "error": failed.error,
        },
    }


def _confirmation_dict(conf: Confirmation | None) -> dict[str, Any] | None:
    if conf is None:
        return None
    runs = []
    for i, (case, found) in enumerate(conf.flagged):
        run = conf.runs[i] if i < len(conf.runs) else None
        runs.append({
            **_case_dict(case),
            "search_p_value": found.p_value,
            "search_tv": found.tv,
            "fresh_samples": None if run is None else run.samples,
            "fresh_detect_tv": None if run is None else run.detect_tv,
            "fresh_p_value": None if run is None else run.p_value,
            "confirmed": conf.confirmed == i,
        })
    return {"alpha": conf.alpha, "confirmed": conf.confirmed is not None, "conclusive": conf.conclusive,
            "cases": runs}


def _json_law(law: dict[Path, float]) -> dict[str, float]:
    return {_fmt_path(s): v for s, v in sorted(law.items())}


def _fmt_path(s: Path) -> str:
    return ",".join(str(t) for t in s) if s else "()"


def _fmt_row(row: FloatArray) -> str:
    return "[" + ", ".join(f"{x:.6g}" for x in row) + "]"


def _indent(table: str) -> list[str]:
    return ["    " + line for line in table.splitlines()]


def _render_model(case: AuditCase) -> list[str]:
    model = case.model
    if case.layout == "shared":
        return [
            "  rows (the same after every prefix):",
            f"    draft  q = {_fmt_row(model.q(()))}",
            f"    target p = {_fmt_row(model.p(()))}",
        ]
    if case.layout == "per_depth":
        rows = [(str(d), _fmt_row(model.q((0,) * d)), _fmt_row(model.p((0,) * d))) for d in range(case.length)]
        return ["  rows per depth (the same for every prefix of that length):",
                *_indent(format_table(["depth", "draft q", "target p"], rows))]
    prefixes = sorted(model.target_rows, key=lambda s: (len(s), s))
    rows = [(_fmt_path(pre), _fmt_row(model.q(pre)), _fmt_row(model.p(pre))) for pre in prefixes]
    return ["  rows per prefix:", *_indent(format_table(["prefix", "draft q", "target p"], rows))]


def _render_counterexample(cx: Counterexample, mode: Mode, how: str) -> list[str]:
    """The case and its law; ``how``: where the law comes from ("exact", "estimated from N fresh steps", ...)."""
    case, ev = cx.case, cx.evaluation
    lines = [f"minimal counterexample: {case.describe()}", *_render_model(case)]
    if ev.error:
        lines.append(f"  the verifier failed on this valid input: {ev.error}")
        return lines
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
        lines.append(f"  p-value (KL bound) {_p(ev.p_value)} at level {_p(ev.alpha)}; outputs with target"
                     f" probability 0: {ev.impossible}{hard}")
    return lines


def _render_mismatch(check: SamplerCheck) -> list[str]:
    lines = [f"sampler and kernel disagree on: {check.case.describe()}", *_render_model(check.case)]
    if check.error:
        lines.append(f"  the sampler failed on this valid input: {check.error}")
        return lines
    cells = sorted(set(check.kernel_law) | set(check.sampled_law))
    rows = [(_fmt_path(s), f"{check.kernel_law.get(s, 0.0):.6g}", f"{check.sampled_law.get(s, 0.0):.6g}")
            for s in cells]
    lines.append(f"  law of the emitted tokens: kernel (exact) vs sampler ({check.samples} steps):")
    lines.extend(_indent(format_table(["emitted", "kernel", "sampler"], rows)))
    lines.append(f"  p-value (KL bound) {check.p_value:.3g} at level {check.alpha:.3g};"
                 f" emitted strings the kernel rules out: {check.impossible}")
    return lines
