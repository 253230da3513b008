"""Every theorem check of proofs_check as a test (issue #5).

``python -m pytest`` runs each check and negative control at the quick
budget (about 1/15 of the cases, as ``python -m proofs_check --quick``).  The
full sweep, at the budget of ``python -m proofs_check``, is the
``test_check_full`` tests, marked ``slow``.  Like every ``slow`` test of
the project they are deselected by the default ``python -m pytest``
(``addopts = -m "not slow"`` in ``pyproject.toml``) and run by
``python -m pytest -m slow``, which ``.ci/run`` runs after the default run
(the README says the same).  The sweep takes over two minutes of one core
(measured: 141 s CPU under pytest, 133 s for ``python -m proofs_check``).
A check passes when its expectation is met: a statement holds on every case,
a negative control flags its violating input, a statement that is false as
printed yields its counterexample.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Callable
from fractions import Fraction

import pytest

from proofs_check import (
    Budget,
    Check,
    CheckResult,
    Expect,
    Outcome,
    all_checks,
    all_passed,
    cli_main,
    run_all,
)
from proofs_check.cli import build_parser, register
from proofs_check.registry import Tally
from proofs_check.report import render, to_json
from proofs_check.runner import run_one, select

CHECKS = all_checks()
IDS = [c.id for c in CHECKS]


def _explain(outcome: Outcome) -> str:
    r = outcome.result
    return f"{outcome.check.id}: {outcome.verdict} after {r.cases} cases; {r.error or r.example}"


@pytest.mark.parametrize("check", CHECKS, ids=IDS)
def test_check_quick(check: Check) -> None:
    outcome = run_one(check, Budget(full=False))
    assert outcome.passed, _explain(outcome)
    assert outcome.result.cases > 0


@pytest.mark.slow
@pytest.mark.parametrize("check", CHECKS, ids=IDS)
def test_check_full(check: Check) -> None:
    outcome = run_one(check, Budget(full=True))
    assert outcome.passed, _explain(outcome)


def test_every_theorem_has_a_control_or_is_a_counterexample() -> None:
    controlled = {c.control_of for c in CHECKS if c.is_control}
    for c in CHECKS:
        if not c.is_control and c.expect is Expect.HOLDS:
            assert c.id in controlled, f"{c.id} has no negative control"
    assert {c.control_of for c in CHECKS if c.is_control} <= {c.id for c in CHECKS}


def test_issue_5_theorem_list_is_covered() -> None:
    wanted = [
        "A.6",
        "A.8",
        "A.12",
        "A.13",
        "A.14",
        "A.16",
        "A.18",
        "A.19(a)",
        "A.19(b)",
        "A.19(c)",
        "A.21",
        "A.22",
        "A.27",
        "A.29",
        "A.30",
        "A.30 strong",
        "A.31",
        "A.32",
        "B.5",
        "B.6",
        "B.7",
        "B.8 (5.5)",
        "B.9 (5.6)",
        "B.10 (5.7)",
        "D.1",
        "ASpS=SpS n=1",
    ]
    assert not set(wanted) - set(IDS)


def test_a_control_detects_its_violation() -> None:
    (control,) = [c for c in CHECKS if c.id == "ctl B.10"]
    outcome = run_one(control, Budget(full=False))
    assert outcome.result.violations > 0 and outcome.passed
    assert outcome.verdict == "detected"


# -- the machinery can fail ---------------------------------------------------------


def _fixed(result: CheckResult) -> Callable[[Budget], CheckResult]:
    return lambda budget: result


def _result(cases: int, violations: int) -> CheckResult:
    return CheckResult(cases, violations, "-", None, None, True, "bad case" if violations else "")


def test_outcome_reads_expectations() -> None:
    holds = Check("x", "s", "m", _fixed(_result(5, 1)))
    assert not Outcome(holds, holds.run(Budget()), 0.0).passed
    control = Check("ctl x", "s", "m", _fixed(_result(5, 0)), Expect.FAILS, "detected", control_of="x")
    missed = Outcome(control, control.run(Budget()), 0.0)
    assert not missed.passed and missed.verdict == "NOT DETECTED"
    empty = Check("y", "s", "m", _fixed(_result(0, 0)))
    assert not Outcome(empty, empty.run(Budget()), 0.0).passed


def test_a_crashing_check_is_an_error_not_a_detection() -> None:
    def boom(budget: Budget) -> CheckResult:
        raise RuntimeError("broken generator")

    control = Check("ctl z", "s", "m", boom, Expect.FAILS, "detected", control_of="z")
    outcome = run_one(control, Budget())
    assert not outcome.passed and outcome.verdict == "ERROR"
    assert "broken generator" in render([outcome], Budget())


def test_run_all_reports_a_failure() -> None:
    bad = Check("bad", "a false statement", "m", _fixed(_result(3, 2)))
    good = [c for c in CHECKS if c.id == "A.21"]
    outcomes = run_all(Budget(), good + [bad])
    assert not all_passed(outcomes)
    data = to_json(outcomes, Budget())
    assert data["passed"] is False and [row["id"] for row in data["checks"]] == ["A.21", "bad"]
    assert "FAILED" in render(outcomes, Budget())


def test_tally_is_exact_for_fractions_and_tolerant_for_floats() -> None:
    tally = Tally(tol=1e-9)
    tally.case("exact")
    assert not tally.equal(Fraction(1, 3), Fraction(1, 3) + Fraction(1, 10**30))
    tally.case("float")
    assert tally.equal(1 / 3, 1 / 3 + 1e-12)
    assert not tally.at_least(0.0, 1e-6)
    result = tally.result()
    assert result.cases == 2 and result.violations == 2 and not result.exact


def test_tally_rejects_a_bad_tolerance() -> None:
    with pytest.raises(ValueError, match="tol"):
        Tally(tol=-1.0)


def test_budget_rejects_nonpositive_counts() -> None:
    with pytest.raises(ValueError, match="full_count"):
        Budget().n(0)


# -- command line -------------------------------------------------------------------


def test_cli_runs_one_check_and_prints_the_table(capsys) -> None:
    assert cli_main(["--quick", "--only", "A.12"]) == 0
    captured = capsys.readouterr()
    assert "A.12" in captured.out and "ctl A.12" in captured.out and "ALL PASSED" in captured.out
    assert "1/2] A.12" in captured.err  # progress on stderr


def test_cli_json_prints_one_object_instead_of_the_table(capsys) -> None:
    assert cli_main(["--quick", "--only", "A.12", "--json"]) == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)  # stdout is nothing but the JSON object
    assert "1/2] A.12" in captured.err
    assert data["passed"] is True
    assert [row["id"] for row in data["checks"]] == ["A.12"]
    assert [row["id"] for row in data["controls"]] == ["ctl A.12"]
    assert data["checks"][0]["cases"] > 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["--only", "Z.99"], "unknown check"), (["--seed", "-1"], "--seed"), (["--seed", "x"], "--seed")],
    ids=["unknown-id", "negative-seed", "non-integer-seed"],
)
def test_cli_rejects_bad_arguments_in_one_line(argv, message, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        cli_main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.startswith("python -m proofs_check: error:")
    assert err.count("\n") == 1 and "Traceback" not in err


def test_cli_lists_checks(capsys) -> None:
    assert cli_main(["--list"]) == 0
    assert "D.1" in capsys.readouterr().out
    assert cli_main(["--list", "--json"]) == 0
    assert [row["id"] for row in json.loads(capsys.readouterr().out)["checks"]] == IDS


def _tmc_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tmc")
    register(parser.add_subparsers(dest="command", required=True))
    return parser


def test_register_adds_tmc_proofs_with_the_same_options() -> None:
    args = _tmc_parser().parse_args(["proofs", "--quick", "--json", "--seed", "3", "--only", "A.12"])
    assert (args.quick, args.json, args.seed, args.only, args.list) == (True, True, 3, ["A.12"], False)
    own = build_parser().parse_args(["--quick", "--json", "--seed", "3", "--only", "A.12"])
    assert vars(args) == vars(own) | {"command": "proofs"}


def test_help_names_the_program_in_plain_text(capsys) -> None:
    for parser, argv, usage in (
        (_tmc_parser(), ["proofs", "--help"], "usage: tmc proofs"),
        (build_parser(), ["--help"], "usage: python -m proofs_check"),
    ):
        with pytest.raises(SystemExit):
            parser.parse_args(argv)
        text = capsys.readouterr().out
        assert text.startswith(usage) and "--json" in text and "--seed" in text
        assert "``" not in text and ":mod:" not in text and ":func:" not in text


def test_registering_imports_no_check_and_no_hypothesis() -> None:
    code = (
        "import argparse, sys\n"
        "from proofs_check.cli import register\n"
        "register(argparse.ArgumentParser(prog='tmc').add_subparsers())\n"
        "heavy = [m for m in ('hypothesis', 'proofs_check.runner') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_select_keeps_controls() -> None:
    picked = select(CHECKS, ["A.31"])
    assert [c.id for c in picked] == ["A.31", "ctl A.31", "ctl A.31b"]
