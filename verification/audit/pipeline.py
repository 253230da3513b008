"""One audit from start to verdict: :func:`audit`.

Notation (DESIGN.md §3): ``p`` is the target, ``q`` the draft.  The stages:
wrap and preflight the verifier (:mod:`~verification.audit.subject`), list
the cells (:mod:`~verification.audit.space`), search and shrink
(:mod:`~verification.audit.search`), then decide: in exact mode the kernel's
verdict stands and the sampler is tested against the kernel; in sampling mode
a finding must be confirmed on fresh samples.

**Sampler against kernel** (exact mode).  The exact search trusts the kernel,
so the audit also checks that the shipped sampler draws from it: for each
(shape, draw kind), the unbiased case tried at the largest vocabulary reached
that most exercises the rejection branch (the chance of rejecting the first
draft times the entropy of the residual it draws from; then the most spread
output law).  The ``m`` tests are chosen
before any sampling and run at level ``alpha / m`` each (Bonferroni), so the
audit's false-fail rate stays at most ``alpha``; each sample size is computed
before sampling to detect a TV of ``sampler_tv`` between the sampler's and the
kernel's laws of the emitted string with probability ``≥ 1 − beta``.  A
mismatch makes the audit exit 1.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import fields, replace
from typing import Any

from tmc.multidraft import ALL_DRAWS
from verification.audit.cases import AuditCase
from verification.audit.config import AuditConfig, Mode
from verification.audit.evaluate import Evaluation, exact_evaluation, sampled_evaluation, sampler_check
from verification.audit.report import AuditResult, CellReport, Confirmation, Counterexample, SamplerReport
from verification.audit.search import CaseSearch, case_rng, confirm, run_search
from verification.audit.space import Cell, search_cells
from verification.audit.subject import as_verifier, preflight, verifier_kind
from verification.examples import TreeVerifier, Verifier

_OPTIONS = frozenset(f.name for f in fields(AuditConfig))


def audit(verifier: object, kind: str | None = None, config: AuditConfig | None = None, **options: Any) -> AuditResult:
    """Search toy models for a case where ``verifier`` does not reproduce the target law.

    ``verifier`` is a :class:`~verification.examples.ChainVerifier` /
    :class:`~verification.examples.TreeVerifier` or a plain function with the
    chain (``f(ref, q_rows, p_rows, rng)``) or tree (``f(tree, p_rows, rng)``)
    convention; ``kind`` is required for a plain function.  ``config`` holds
    every option (:class:`AuditConfig`); keyword ``options`` are a
    convenience that replaces fields of it (``audit(v, budget=50)``).
    Usage errors raise ``ValueError``.
    """
    cfg = _configure(config, options)
    start = time.perf_counter()
    subject = as_verifier(verifier, kind, cfg.draws)
    if cfg.draws is not None and not isinstance(subject, TreeVerifier):  # it had no effect on a chain
        raise ValueError("draws (--draw) go with a tree verifier; a chain's tokens are drawn one per position")
    mode = _choose_mode(subject, cfg)
    preflight(subject)
    draws = subject.draws if isinstance(subject, TreeVerifier) else ()
    cells = search_cells(verifier_kind(subject), max_vocab=cfg.max_vocab, chain_lengths=cfg.chain_lengths,
                         tree_shapes=cfg.tree_shapes, draws=draws or ALL_DRAWS)
    budget = cfg.budget_for(mode, len(cells))
    search = CaseSearch(_evaluator(subject, mode, cfg), cfg.shrink_cap_for(mode, len(cells)))
    found = run_search(search, cells, budget, cfg.seed)
    counterexample, confirmation = _verdict(subject, mode, search, found, cfg)
    sampler = _check_sampler(subject, search, cells, cfg, counterexample) if mode == "exact" else None
    return AuditResult(
        verifier=subject.name,
        kind=verifier_kind(subject),
        mode=mode,
        biased=counterexample is not None,
        config=cfg,
        budget=budget,
        draws=draws,
        cells=tuple(_cell_report(c, search, mode, cfg) for c in cells),
        cases_tried=search.tried,
        shrink_evaluations=search.shrunk,
        counterexample=counterexample,
        elapsed_s=time.perf_counter() - start,
        sampler=sampler,
        confirmation=confirmation,
        note=_note(confirmation),
        unsearched=search.unsearched,
        rechecks=search.rechecks,
        moves=tuple(search.moves),
    )


def _configure(config: AuditConfig | None, options: dict[str, Any]) -> AuditConfig:
    base = AuditConfig() if config is None else config
    if not isinstance(base, AuditConfig):
        raise ValueError(f"config must be an AuditConfig, got {type(base).__name__}")
    unknown = sorted(set(options) - _OPTIONS)
    if unknown:
        raise ValueError(f"unknown audit option(s) {', '.join(unknown)}; options: {', '.join(sorted(_OPTIONS))}")
    return replace(base, **options) if options else base


def _choose_mode(subject: Verifier, cfg: AuditConfig) -> Mode:
    if cfg.mode == "exact" and subject.kernel is None:
        raise ValueError(f"mode 'exact' needs a kernel; {subject.name} exposes none")
    if cfg.mode == "sampling" or subject.kernel is None:
        return "sampling"
    return "exact"


def _evaluator(subject: Verifier, mode: Mode, cfg: AuditConfig) -> Callable[[AuditCase], Evaluation]:
    if mode == "exact":
        return lambda case: exact_evaluation(subject, case, cfg.tol)
    return lambda case: sampled_evaluation(
        subject, case, tv=cfg.tv, alpha=cfg.alpha, beta=cfg.beta, rng=case_rng(cfg.seed, case, "search")
    )


def _verdict(
    subject: Verifier, mode: Mode, search: CaseSearch, found: AuditCase | None, cfg: AuditConfig
) -> tuple[Counterexample | None, Confirmation | None]:
    """Exact findings stand; a sampled finding stands only if fresh samples confirm it."""
    if found is None:
        return None, None
    if mode == "exact":
        return Counterexample(found, search.cache[found.digest]), None
    conf = confirm(subject, search, found, cfg)
    if conf.confirmed is None:
        return None, conf
    case, _ = conf.flagged[conf.confirmed]
    evaluation: Evaluation = conf.runs[conf.confirmed]
    return Counterexample(case, evaluation), conf


def _note(conf: Confirmation | None) -> str:
    if conf is None or conf.confirmed == 0:
        return ""
    if conf.confirmed is None:
        return "the search flagged a case that fresh samples did not confirm: no bias at the stated false-fail rate"
    return "the shrunk case did not confirm on fresh samples; the counterexample is the case first flagged"


def _cell_report(cell: Cell, search: CaseSearch, mode: Mode, cfg: AuditConfig) -> CellReport:
    log = search.cells.get(cell)
    tried = 0 if log is None else log.tried
    samples = 0 if log is None else log.samples
    return CellReport(cell, tried, samples, cfg.tol if mode == "exact" else cfg.tv)


def sampler_cases(search: CaseSearch, cells: list[Cell]) -> list[AuditCase]:
    """Per (shape, draw kind): the unbiased case tried at the largest vocabulary reached that most exercises the
    rejection branch (:func:`verification.audit.search.sampler_score`)."""
    chosen: dict[tuple[tuple[int, ...], object], AuditCase] = {}
    for cell in cells:  # vocabularies ascend, so a later cell of the same shape replaces an earlier one
        log = search.cells.get(cell)
        if log is not None and log.spread_case is not None:
            chosen[(cell.widths, cell.draw)] = log.spread_case
    return list(chosen.values())


def _check_sampler(
    subject: Verifier, search: CaseSearch, cells: list[Cell], cfg: AuditConfig, cx: Counterexample | None
) -> SamplerReport:
    report = SamplerReport(cfg.sampler_tv, cfg.alpha, cfg.beta, ())
    if not cfg.check_sampler:
        return replace(report, skipped="turned off (check_sampler=False)")
    if cx is not None:
        return replace(report, skipped="the kernel is already biased")
    cases = sampler_cases(search, cells)
    if not cases:
        return replace(report, skipped="no unbiased case was tried")
    level = cfg.alpha / len(cases)  # Bonferroni over the cases, fixed before sampling
    checks = []
    for case in cases:
        check = sampler_check(subject, case, tv=cfg.sampler_tv, alpha=level, beta=cfg.beta,
                              rng=case_rng(cfg.seed, case, "sampler"))
        checks.append(check)
        if not check.passed:
            break
    return replace(report, checks=tuple(checks))
