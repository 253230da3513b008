"""Bias audit: search toy models for a case where a verifier is not lossless (DESIGN.md §5).

Notation (DESIGN.md §3): ``p`` is the target model, ``q`` the draft.  A
verifier is audited by the law of what one step emits, averaged over the
draft's own randomness (:mod:`tmc.drafts`, :mod:`tmc.laws`).  The measure of
bias is the **completion TV**: continue every output ``s`` with the target up
to a length ``L`` no output exceeds (draft depth + 1) and compare with the
target,

    C(t) = Σ_{s ≤ t} K̄(s) · P(t | s),      bias = ½ Σ_t |C(t) − P(t)|,

over all ``t`` of length ``L``.  ``C = P`` is the completion identity of
DESIGN.md §4, which holds exactly for every lossless one-step verifier.

Modes (chosen by what the verifier exposes, :class:`AuditConfig`):

* **exact** — a record with a ``kernel``: ``K̄`` over every draft; a case is
  biased when its TV exceeds ``tol`` (1e-9, float rounding).  The sampler is
  then tested against the kernel by calibrated (KL-bound) tests
  (:mod:`.pipeline`), so a kernel that is not the sampler's law cannot hide a
  biased sampler.
* **sampling** — any verifier: calibrated (KL-bound) tests of the completed
  output law against ``P`` (:mod:`.evaluate`); a finding stands only when a
  fresh sample, sized for the TV the search measured, confirms it at level
  ``alpha`` (:mod:`.search`).

**Reach** (the default search space, :mod:`.space`): chains of 1–4 draft
tokens on vocabularies 1..3 (``max_vocab``) and of 5–6 tokens on vocabularies
1..2; trees of widths (1,), (2,), (1,1), (3,), (1,2), (1,1,1), (2,1) on
vocabularies 1..3 and (2,2), (2,1,1) on vocabularies 1..2, each with the draw
kinds (iid, swor, topk) the verifier is paired with.  A search over cases, not
a proof: the report states, per cell, how many cases were tried and the
largest bias that could have gone unflagged on them.

Modules: :mod:`.config` (the options), :mod:`.space` (shapes, the reach
rule, cells), :mod:`.cases` (cases and the hypothesis strategy), :mod:`.evaluate` (one case: exact, sampled, sampler vs
kernel), :mod:`.search` (hypothesis search, shrinking, confirmation),
:mod:`.pipeline` (:func:`audit`), :mod:`.report` (the result, rendered and as
JSON), :mod:`.subject` (loading and wrapping the verifier), :mod:`.cli`
(``tmc audit``).  Names are re-exported here on first use, so importing
:mod:`verification.audit.cli` to register the subcommand stays cheap (no
hypothesis).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from verification.audit.cases import AuditCase, audit_cases
    from verification.audit.cli import cli_main, handler, register
    from verification.audit.config import AuditConfig
    from verification.audit.evaluate import (
        Evaluation,
        SamplerCheck,
        exact_evaluation,
        sampled_evaluation,
        sampler_check,
    )
    from verification.audit.pipeline import audit
    from verification.audit.report import AuditResult, CellReport, Confirmation, Counterexample, SamplerReport
    from verification.audit.search import confirm_tv
    from verification.audit.space import AUDIT_CHAIN_LENGTHS, AUDIT_TREE_SHAPES, Cell, search_cells, vocab_limit
    from verification.audit.subject import load_target

_EXPORTS = {
    "AUDIT_CHAIN_LENGTHS": "space",
    "AUDIT_TREE_SHAPES": "space",
    "AuditCase": "cases",
    "Cell": "space",
    "audit_cases": "cases",
    "search_cells": "space",
    "vocab_limit": "space",
    "cli_main": "cli",
    "handler": "cli",
    "register": "cli",
    "AuditConfig": "config",
    "Evaluation": "evaluate",
    "SamplerCheck": "evaluate",
    "exact_evaluation": "evaluate",
    "sampled_evaluation": "evaluate",
    "sampler_check": "evaluate",
    "audit": "pipeline",
    "AuditResult": "report",
    "CellReport": "report",
    "Confirmation": "report",
    "Counterexample": "report",
    "SamplerReport": "report",
    "confirm_tv": "search",
    "load_target": "subject",
}

__all__ = [
    "AUDIT_CHAIN_LENGTHS",
    "AUDIT_TREE_SHAPES",
    "AuditCase",
    "AuditConfig",
    "AuditResult",
    "Cell",
    "CellReport",
    "Confirmation",
    "Counterexample",
    "Evaluation",
    "SamplerCheck",
    "SamplerReport",
    "audit",
    "audit_cases",
    "cli_main",
    "confirm_tv",
    "exact_evaluation",
    "handler",
    "load_target",
    "register",
    "sampled_evaluation",
    "sampler_check",
    "search_cells",
    "vocab_limit",
]


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
