"""The report: one table row per theorem or fact, then the negative controls, then notes.

Columns: id, one-line statement, how it was checked, number of cases, worst
margin ("err": largest |lhs - rhs| of an equality, "slack": smallest
lhs - rhs of an inequality, "(exact)" when computed in rationals, "tmc":
largest disagreement of the float implementation under test), verdict.
:func:`to_json` gives the same rows as data (``--json`` prints it).
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from typing import Any

from proofs_check.registry import Budget, Outcome

COLUMNS = (
    ("id", 15),
    ("statement", 46),
    ("checked by", 42),
    ("cases", 16),
    ("worst margin", 24),
    ("verdict", 24),
)


def _cells(o: Outcome) -> tuple[str, ...]:
    r = o.result
    extra = [f"{r.violations} flagged"] if r.violations else []
    extra += [f"{r.cross_failures} tmc disagreements"] if r.cross_failures else []
    extra += [r.detail] if r.detail else []
    cases = f"{r.cases}" + (f" ({'; '.join(extra)})" if extra else "")
    return (o.check.id, o.check.statement, o.check.method, cases, r.margin, o.verdict)


def _row(cells: Sequence[str]) -> list[str]:
    wrapped = [textwrap.wrap(c, w) or [""] for c, (_, w) in zip(cells, COLUMNS)]
    height = max(len(w) for w in wrapped)
    lines = []
    for i in range(height):
        parts = [(w[i] if i < len(w) else "").ljust(width) for w, (_, width) in zip(wrapped, COLUMNS)]
        lines.append(" | ".join(parts).rstrip())
    return lines


def _table(title: str, outcomes: Sequence[Outcome]) -> list[str]:
    header = " | ".join(name.ljust(width) for name, width in COLUMNS).rstrip()
    rule = "-+-".join("-" * width for _, width in COLUMNS)
    lines = [title, header, rule]
    for o in outcomes:
        lines.extend(_row(_cells(o)))
    return lines


def render(outcomes: Sequence[Outcome], budget: Budget) -> str:
    """The report as text."""
    theorems = [o for o in outcomes if not o.check.is_control]
    controls = [o for o in outcomes if o.check.is_control]
    lines = _table("Theorems, lemmas and stated facts", theorems)
    lines += [""] + _table("Negative controls (each must detect its violation)", controls)
    notes = [o for o in outcomes if o.check.note]
    if notes:
        lines += ["", "Statements that are false as printed or need an assumption:"]
        for o in notes:
            lines += textwrap.wrap(
                f"{o.check.id}: {o.check.note}", 110, initial_indent="  ", subsequent_indent="    "
            )
    failed = [o for o in outcomes if not o.passed]
    if failed:
        lines += ["", "FAILED:"]
        for o in failed:
            why = o.result.error or o.result.cross_example or o.result.example or "no case violated the statement"
            lines += textwrap.wrap(
                f"{o.check.id} ({o.verdict}): {why}", 110, initial_indent="  ", subsequent_indent="    "
            )
    lines += ["", summary(outcomes, budget)]
    return "\n".join(lines)


def summary(outcomes: Sequence[Outcome], budget: Budget) -> str:
    """One line: how many checks and controls passed, and the time taken."""
    theorems = [o for o in outcomes if not o.check.is_control]
    controls = [o for o in outcomes if o.check.is_control]
    ok_t = sum(o.passed for o in theorems)
    ok_c = sum(o.passed for o in controls)
    seconds = sum(o.seconds for o in outcomes)
    cases = sum(o.result.cases for o in outcomes)
    mode = "full" if budget.full else "quick"
    verdict = "ALL PASSED" if ok_t == len(theorems) and ok_c == len(controls) else "FAILURES"
    return (
        f"{verdict}: {ok_t}/{len(theorems)} checks as expected, {ok_c}/{len(controls)} controls detected; "
        f"{cases} cases, {seconds:.1f}s ({mode} run, seed {budget.seed})"
    )


def to_json(outcomes: Sequence[Outcome], budget: Budget) -> dict[str, Any]:
    """The report as JSON-ready data."""

    def row(o: Outcome) -> dict[str, Any]:
        r, c = o.result, o.check
        return {
            "id": c.id,
            "statement": c.statement,
            "method": c.method,
            "expect": c.expect.value,
            "control_of": c.control_of,
            "cases": r.cases,
            "violations": r.violations,
            "margin": r.margin,
            "worst_error": r.worst_error,
            "min_slack": r.min_slack,
            "exact": r.exact,
            "tmc_error": r.cross_error,
            "tmc_disagreements": r.cross_failures,
            "tmc_example": r.cross_example,
            "detail": r.detail,
            "verdict": o.verdict,
            "passed": o.passed,
            "note": c.note,
            "example": r.example,
            "error": r.error,
            "seconds": round(o.seconds, 4),
        }

    return {
        "budget": {"full": budget.full, "seed": budget.seed},
        "passed": all(o.passed for o in outcomes),
        "summary": summary(outcomes, budget),
        "checks": [row(o) for o in outcomes if not o.check.is_control],
        "controls": [row(o) for o in outcomes if o.check.is_control],
    }
