"""``tmc suite``: verdicts, exit status, JSON and PNG outputs."""

from __future__ import annotations

import json

import pytest

from tmc.cli import main
from verification.suite import SuiteConfig, failures, missed_biases, run_suite


@pytest.fixture(scope="module")
def quick_rows():
    return run_suite(SuiteConfig(quick=True, include_biased=True, seed=3))


def test_lossless_verifiers_pass_every_check(quick_rows):
    assert failures(quick_rows) == []
    lossless = [r for r in quick_rows if not r.expected_biased]
    assert {r.verifier for r in lossless} >= {"sps", "asps", "block", "multidraft"}
    assert all(r.passed for r in lossless)


def test_biased_examples_fail_the_exact_check(quick_rows):
    assert missed_biases(quick_rows) == []
    for name in {r.verifier for r in quick_rows if r.expected_biased}:
        exact = [r for r in quick_rows if r.verifier == name and r.check == "completion identity"]
        assert any(not r.passed and r.worst_exact > 1e-3 for r in exact), name


def test_statistical_rows_state_their_budget(quick_rows):
    stat = [r for r in quick_rows if r.check == "sampler vs kernel"]
    assert stat and all(r.samples > 0 and r.alpha is not None and r.detect_tv == 0.05 for r in stat)
    assert sum(r.alpha for r in stat) == pytest.approx(1e-9)


def test_cli_writes_json_and_png_and_exits_zero(tmp_path, capsys):
    js, png = tmp_path / "suite.json", tmp_path / "suite.png"
    assert main(["suite", "--quick", "--json", str(js), "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "tmc suite" in out and "0 failed" in out
    data = json.loads(js.read_text())
    assert data["config"]["false_fail"] == 1e-9 and len(data["rows"]) > 10
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_rejects_bad_budget():
    with pytest.raises(SystemExit) as err:
        main(["suite", "--false-fail", "2"])
    assert err.value.code == 2
