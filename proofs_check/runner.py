"""Runs the registered checks in the papers' order and collects their outcomes.

The registry is the concatenation of each module's ``CHECKS``:
:mod:`proofs_check.tree_theorems` (TMC App. A.1-A.2),
:mod:`proofs_check.sub_samplers` (App. A.3), :mod:`proofs_check.speculative`
(App. B and §2-§6) and :mod:`proofs_check.dyspec` (DySpec App. D).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from proofs_check import dyspec, speculative, sub_samplers, tree_theorems
from proofs_check.registry import Budget, Check, Outcome, crashed


def all_checks() -> tuple[Check, ...]:
    """Every check and negative control, in the order of the papers."""
    return tree_theorems.CHECKS + sub_samplers.CHECKS + speculative.CHECKS + dyspec.CHECKS


def select(checks: Sequence[Check], ids: Sequence[str]) -> tuple[Check, ...]:
    """The checks whose id is in ``ids``, with the controls of those checks (ValueError if unknown)."""
    known = {c.id for c in checks}
    unknown = [i for i in ids if i not in known]
    if unknown:
        raise ValueError(f"unknown check id(s) {unknown}")
    wanted = set(ids)
    return tuple(c for c in checks if c.id in wanted or c.control_of in wanted)


def run_one(check: Check, budget: Budget) -> Outcome:
    """Run one check; an exception becomes a failed outcome, not a crash of the whole run."""
    start = time.perf_counter()
    try:
        result = check.run(budget)
    except Exception as exc:  # noqa: BLE001 - reported as an ERROR row
        result = crashed(exc)
    return Outcome(check, result, time.perf_counter() - start)


def run_all(
    budget: Budget | None = None,
    checks: Sequence[Check] | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[Outcome]:
    """Run ``checks`` (default: all) under ``budget`` (default: quick), reporting progress."""
    todo = all_checks() if checks is None else tuple(checks)
    plan = Budget() if budget is None else budget
    outcomes = []
    for k, check in enumerate(todo, 1):
        outcome = run_one(check, plan)
        outcomes.append(outcome)
        if progress is not None:
            progress(f"[{k:2d}/{len(todo)}] {check.id:<14} {outcome.verdict:<34} {outcome.seconds:6.2f}s")
    return outcomes


def all_passed(outcomes: Sequence[Outcome]) -> bool:
    """True when every check met its expectation (controls detected their violations)."""
    return all(o.passed for o in outcomes)
