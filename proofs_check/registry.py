"""What a theorem check is, what it returns, and how its verdict is read.

Every theorem, lemma or in-text fact of the source papers (TMC paper,
Appendices A and B; DySpec Appendix D) becomes one :class:`Check`: an id
(``"A.12"``), a one-line statement, a sentence on how it is checked, and a
``run`` function that examines many cases and returns a
:class:`CheckResult` (cases examined, cases violating the statement, the
worst margin, the first violating case).

A check *expects* either that the statement holds on every case
(:attr:`Expect.HOLDS`) or that a violation is found (:attr:`Expect.FAILS`):
the latter is used for negative controls (the same check applied to an input
that breaks a hypothesis, which must be flagged) and for statements that are
false as printed, where the check exhibits the counterexample.  An
:class:`Outcome` passes when what was observed is what was expected.

:class:`Tally` accumulates the per-case observations of one run.  Exact
``fractions.Fraction`` values are compared exactly (tolerance 0); floats are
compared with the tolerance the tally was created with.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from fractions import Fraction

Number = Fraction | float | int


class Expect(Enum):
    """What a check must observe to pass."""

    HOLDS = "holds"  # no case may violate the statement
    FAILS = "fails"  # at least one case must violate it (control / counterexample)


@dataclass(frozen=True)
class Budget:
    """How much work a run may do."""

    full: bool = False  # True: the full sweep; False: the quick run (about 1/15 of the cases)
    seed: int = 0  # base seed of every case generator (hypothesis @seed and numpy)

    def n(self, full_count: int) -> int:
        """Number of cases for a family that has ``full_count`` cases in the full sweep."""
        if full_count < 1:
            raise ValueError(f"full_count must be >= 1, got {full_count}")
        return full_count if self.full else max(3, full_count // 15)


@dataclass(frozen=True)
class CheckResult:
    """Outcome of running one check over its cases."""

    cases: int  # number of cases examined
    violations: int  # number of cases on which the statement failed
    margin: str  # worst margin in words, e.g. "err 0 (exact)" or "slack 0.0417"
    worst_error: float | None  # largest |lhs - rhs| over equality observations (None: none made)
    min_slack: float | None  # smallest lhs - rhs over inequality observations (None: none made)
    exact: bool  # True when every theorem observation was made in exact rational arithmetic
    example: str  # the first violating case, in words ("" when there was none)
    cross_error: float | None = None  # largest disagreement with the tmc implementation (None: not compared)
    detail: str = ""  # extra counts, e.g. how many cases fell on each side of an equivalence
    error: str = ""  # the exception that stopped the run ("" when it ran to the end)
    cross_failures: int = 0  # cases where the tmc implementation disagreed (fails any check, a control too)
    cross_example: str = ""  # the first of them, in words


def crashed(exc: BaseException) -> CheckResult:
    """The result of a run that raised ``exc``: it fails whatever was expected."""
    return CheckResult(0, 0, "-", None, None, False, "", error=f"{type(exc).__name__}: {exc}")


@dataclass(frozen=True)
class Check:
    """One executable statement of a paper."""

    id: str  # "A.12", "B.5", "D.1", "A.30 strong", "ctl A.12", ...
    statement: str  # the statement in one line
    method: str  # how it is checked, in one line
    run: Callable[[Budget], CheckResult]  # examines the cases
    expect: Expect = Expect.HOLDS  # what the run must observe to pass
    label: str = "holds"  # the verdict shown when the expectation is met
    control_of: str | None = None  # for a negative control: the id of the check it controls
    note: str = ""  # why a statement fails or needs an assumption (shown under the table)

    @property
    def is_control(self) -> bool:
        """True for a negative control."""
        return self.control_of is not None


Runner = Callable[[Budget], CheckResult]


def theorem(id: str, statement: str, method: str, run: Runner, *, note: str = "") -> Check:
    """A statement that must hold on every case."""
    return Check(id, statement, method, run, note=note)


def counterexample(id: str, statement: str, method: str, run: Runner, *, label: str, note: str = "") -> Check:
    """A statement the run must refute (false as printed, or a form the paper itself rejects)."""
    return Check(id, statement, method, run, Expect.FAILS, label, note=note)


def control(
    id: str, of: str, statement: str, run: Runner, *, method: str = "same check", label: str = "detected"
) -> Check:
    """A negative control of check ``of``: its run must flag the violating input ``statement`` describes."""
    return Check(id, statement, method, run, Expect.FAILS, label, control_of=of)


@dataclass(frozen=True)
class Outcome:
    """A check together with what its run observed."""

    check: Check  # the check that ran
    result: CheckResult  # what it observed
    seconds: float  # wall time of the run

    @property
    def passed(self) -> bool:
        """True when the observation matches the expectation, and the tmc implementation agreed throughout.

        A disagreement of tmc is a bug on one side, whatever the check expects: it used to count as one more
        violation, so a negative control "detected" it (a control's row showed tmc entirely wrong and passed).
        """
        if self.result.error or self.result.cross_failures:
            return False
        if self.check.expect is Expect.HOLDS:
            return self.result.violations == 0 and self.result.cases > 0
        return self.result.violations > 0

    @property
    def verdict(self) -> str:
        """The verdict in words."""
        if self.passed:
            return self.check.label
        if self.result.error:
            return "ERROR"
        if self.result.cross_failures:
            return "TMC DISAGREES"
        if self.check.is_control:
            return "NOT DETECTED"
        if self.check.expect is Expect.HOLDS:
            return "FAILS" if self.result.cases else "NO CASES"
        return "NO COUNTEREXAMPLE FOUND"


class Tally:
    """Accumulates the observations of one check run, case by case."""

    def __init__(self, tol: float = 0.0) -> None:
        if not (tol >= 0.0 and math.isfinite(tol)):
            raise ValueError(f"tol must be a finite number >= 0, got {tol!r}")
        self.tol = tol  # tolerance for float observations; exact ones use 0
        self.cases = 0
        self.violations = 0
        self.worst_error: float | None = None
        self.min_slack: float | None = None
        self.exact = True
        self.example = ""
        self.cross_error: float | None = None
        self.cross_failures = 0
        self.cross_example = ""
        self.counts: dict[str, int] = {}
        self._where = ""
        self._bad = False
        self._cross_bad = False

    # -- cases --------------------------------------------------------------

    def case(self, where: str) -> None:
        """Start a new case, described by ``where`` (used if it fails)."""
        self._close()
        self.cases += 1
        self._where = where
        self._bad = False

    def _close(self) -> None:
        if self._bad:
            self.violations += 1
        if self._cross_bad:
            self.cross_failures += 1
        self._bad = False
        self._cross_bad = False

    def _fail(self, detail: str) -> None:
        if not self._bad and not self.example:
            self.example = f"{self._where}: {detail}" if self._where else detail
        self._bad = True

    # -- observations -------------------------------------------------------

    def _is_exact(self, *values: Number) -> bool:
        return all(isinstance(v, (Fraction, int)) for v in values)

    def equal(self, lhs: Number, rhs: Number, what: str = "") -> bool:
        """Observe ``lhs == rhs`` (exact for Fractions, within ``tol`` otherwise)."""
        exact = self._is_exact(lhs, rhs)
        self.exact &= exact
        err = abs(Fraction(lhs) - Fraction(rhs)) if exact else abs(float(lhs) - float(rhs))
        ok = err == 0 if exact else err <= self.tol
        fe = float(err) if math.isfinite(float(err)) else math.inf
        self.worst_error = fe if self.worst_error is None else max(self.worst_error, fe)
        if not ok:
            self._fail(f"{what or 'lhs'} = {float(lhs):.6g} but should equal {float(rhs):.6g}")
        return ok

    def at_least(self, lhs: Number, rhs: Number, what: str = "") -> bool:
        """Observe ``lhs >= rhs`` (exact for Fractions, within ``tol`` otherwise)."""
        exact = self._is_exact(lhs, rhs)
        self.exact &= exact
        slack = Fraction(lhs) - Fraction(rhs) if exact else float(lhs) - float(rhs)
        ok = slack >= 0 if exact else slack >= -self.tol
        fs = float(slack)
        self.min_slack = fs if self.min_slack is None else min(self.min_slack, fs)
        if not ok:
            self._fail(f"{what or 'lhs'} = {float(lhs):.6g} < {float(rhs):.6g}")
        return ok

    def cross(self, ours: Number, theirs: float, what: str = "", tol: float = 1e-12) -> bool:
        """Observe that the tmc implementation agrees with ours within ``tol``.

        Kept apart from the theorem's observations: a disagreement is counted in
        ``cross_failures`` (a bug on one side), which fails the check whatever it
        expects, and is not a violation of the statement (so it cannot make a
        negative control look detected), nor does it make the observation inexact.
        """
        err = abs(float(ours) - float(theirs))
        self.cross_error = err if self.cross_error is None else max(self.cross_error, err)
        ok = err <= tol
        if not ok:
            if not self.cross_example:
                detail = f"tmc disagrees on {what or 'a value'}: ours {float(ours):.6g}, tmc {float(theirs):.6g}"
                self.cross_example = f"{self._where}: {detail}" if self._where else detail
            self._cross_bad = True
        return ok

    def count(self, key: str) -> None:
        """Count one occurrence of ``key`` (reported in the result's detail)."""
        self.counts[key] = self.counts.get(key, 0) + 1

    def truth(self, ok: bool, what: str) -> bool:
        """Observe a predicate; ``what`` says what failed when ``ok`` is False."""
        if not ok:
            self._fail(what)
        return ok

    # -- result -------------------------------------------------------------

    def result(self) -> CheckResult:
        """The :class:`CheckResult` of everything observed so far."""
        self._close()
        return CheckResult(
            cases=self.cases,
            violations=self.violations,
            margin=self._margin(),
            worst_error=self.worst_error,
            min_slack=self.min_slack,
            exact=self.exact,
            example=self.example,
            cross_error=self.cross_error,
            cross_failures=self.cross_failures,
            cross_example=self.cross_example,
            detail=", ".join(f"{k} {v}" for k, v in self.counts.items()),
        )

    def _margin(self) -> str:
        parts = []
        if self.worst_error is not None:
            if self.exact and self.worst_error == 0.0:
                parts.append("err 0 (exact)")
            else:
                parts.append(f"err {self.worst_error:.2g}")
        if self.min_slack is not None:
            parts.append(f"slack {self.min_slack:.3g}" + (" (exact)" if self.exact else ""))
        if self.cross_error is not None:
            parts.append(f"tmc {self.cross_error:.1g}")
        return "; ".join(parts) if parts else "-"
