"""Every theorem check of proofs_check as a test (issue #5).

``python -m pytest`` runs each check and negative control at the quick
budget (about 1/15 of the cases, as ``python -m proofs_check --quick``).  The
full sweep, at the budget of ``python -m proofs_check``, is the
``test_check_full`` tests, marked ``slow``.  Like every ``slow`` test of
the project they are deselected by the default ``python -m pytest``
(``addopts = -m "not slow"`` in ``pyproject.toml``) and run by
``python -m pytest -m slow``, which ``.ci/run`` runs after the default run
(the README says the same).  The sweep takes about a minute of one core
(measured 2026-11-26: 61 s for ``python -m proofs_check``).
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


# -- audit of 2026-11-26: what could not fail ---------------------------------------------


def test_a_tmc_disagreement_fails_a_control_instead_of_detecting_for_it() -> None:
    """A control's cross-check failure used to count as its detection: a control whose row showed tmc entirely
    wrong still said "detected".  Now it fails every check, with its own verdict and example."""
    tally = Tally()
    tally.case("one case")
    tally.cross(1.0, 0.0, "a tmc value")
    result = tally.result()
    assert result.violations == 0 and result.cross_failures == 1 and "tmc disagrees" in result.cross_example
    for check in (Check("ctl w", "s", "m", _fixed(result), Expect.FAILS, "detected", control_of="w"),
                  Check("w", "s", "m", _fixed(result))):
        outcome = Outcome(check, check.run(Budget()), 0.0)
        assert not outcome.passed and outcome.verdict == "TMC DISAGREES"
        assert "tmc disagrees on a tmc value" in render([outcome], Budget())


def _mutated(monkeypatch: pytest.MonkeyPatch, target: object, name: str, value: object, check_id: str) -> Outcome:
    monkeypatch.setattr(target, name, value)
    (check,) = [c for c in CHECKS if c.id == check_id]
    return run_one(check, Budget(full=False))


@pytest.mark.parametrize("mutation", ["is_leaf_only", "is_pseudo_leaf_only", "is_degenerate", "prefix_sub", "tv"])
def test_tmc_predicates_replaced_by_constants_are_caught(mutation: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each of these five tmc functions was asked only questions whose answer was one constant, so a constant
    passed every check (the audit replaced all five and the full run printed ALL PASSED).  Each theorem check
    now asks both answers, against its exact re-implementation."""
    import proofs_check.sub_samplers as ss
    import tmc.tree
    from tmc.prefix import PrefixCheck

    cases = {
        "is_leaf_only": (tmc.tree.TreeDistribution, "is_leaf_only", lambda self, tol=1e-12: True, "A.21"),
        "is_pseudo_leaf_only": (tmc.tree.TreeDistribution, "is_pseudo_leaf_only", lambda self, tol=1e-12: True,
                                "A.21"),
        "is_degenerate": (ss, "is_degenerate", lambda *a, **k: False, "A.31"),
        "prefix_sub": (ss, "check_prefix_sub_sampler", lambda *a, **k: PrefixCheck(True, None, ""), "A.29"),
        "tv": (ss, "total_variation", lambda p1, p2: 0.0, "A.32"),
    }
    outcome = _mutated(monkeypatch, *cases[mutation])
    assert not outcome.passed and outcome.result.cross_failures > 0, _explain(outcome)


def test_a18_accepts_a_slowly_vanishing_tail_and_its_control_reads_the_limit() -> None:
    """A.18 had asked for a tail below 0.02 at a fixed depth, which flags the valid heavy tail 1/(d+2); the tails
    are now compared with closed forms (enumerated exactly here), and the control's leak is its limit 1/2."""
    from proofs_check.tree_theorems import (A18_DEPTH, escaping_row, escaping_tail, exact_tail, heavy_row,
                                            heavy_tail)

    for vocab in (1, 2, 3):
        for d in range(A18_DEPTH[vocab] + 1):
            assert exact_tail(heavy_row(7, vocab), vocab, d) == heavy_tail(d) == Fraction(1, d + 2)
    prod = Fraction(1)
    for d in range(13):
        prod *= 1 - Fraction(1, (d + 2) ** 2)
        assert exact_tail(escaping_row, 1, d) == escaping_tail(d) == prod
    (a18,) = [c for c in CHECKS if c.id == "A.18"]
    result = a18.run(Budget(full=False))
    assert result.violations == 0 and "heavy" not in result.example


def test_a19_b_and_c_bound_the_finished_mean_so_the_doubling_martingale_fails_them() -> None:
    """A.19(b)/(c) asserted only the stopped mean at the cut, which any unbiased V meets (the doubling martingale,
    whose E[V] = 1 != V(root) = 0, passed).  The finished mean must now stay within the hypothesis' bound at every
    cut: valid cases meet it; the doubling martingale through either bound does not."""
    from proofs_check.tree_theorems import b_remainder, c_remainder, doubling_outside

    for remainder in (b_remainder(1), c_remainder(1)):
        result = doubling_outside(remainder)
        assert result.violations == 1 and "|E[V 1(len <=" in result.example


def test_draw_cases_gives_distinct_cases_the_same_for_a_seed() -> None:
    """A third of the reported cases had been exact repeats (the one-token tree 30 times in 300)."""
    from hypothesis import strategies as st

    from proofs_check.cases import draw_cases, trees

    cases = draw_cases(trees(kind="any"), 200, 3)
    assert len(cases) == 200 == len({repr(c) for c in cases})
    assert [repr(c) for c in draw_cases(trees(kind="any"), 200, 3)] == [repr(c) for c in cases]
    assert sorted(draw_cases(st.integers(0, 3), 10, 1)) == [0, 1, 2, 3]  # a small space: all of it, once each


def test_list_takes_only_and_refuses_an_unknown_id(capsys: pytest.CaptureFixture[str]) -> None:
    """``--list --only XYZ`` listed all rows and exited 0."""
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["--list", "--only", "XYZ"])
    assert exit_info.value.code == 2 and "unknown check id" in capsys.readouterr().err
    assert cli_main(["--list", "--only", "A.19(b)"]) == 0
    assert [line.split()[0] + (" " + line.split()[1] if line.startswith("ctl") else "")
            for line in capsys.readouterr().out.splitlines()] == ["A.19(b)", "ctl A.19(b)", "ctl A.19(b)"]
