"""``tmc suite``: verdicts, the ASpS cross-check, exit status, JSON and PNG outputs."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

import verification.suite as suite
from tmc.chain import asps_sample, sps_kernel
from tmc.cli import main
from tmc.drafts import chain_drafts
from tmc.laws import output_law
from tmc.toy import paper_toy_model
from tmc.multidraft import Draw
from verification.calibrated import chi_square_samples, kl_required_samples
from verification.examples import ASPS, BLOCK, MULTIDRAFT, ChainVerifier
from verification.suite import (
    EXACT_CHECK,
    KERNEL_VS_BLOCK_SAMPLER,
    POWER_MISS,
    SAMPLER_VS_KERNEL,
    Job,
    SuiteConfig,
    exact_law,
    failures,
    job_drafts,
    missed_biases,
    run_suite,
    statistical_check,
)


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
        exact = [r for r in quick_rows if r.verifier == name and r.check == EXACT_CHECK]
        assert any(not r.passed and r.worst_exact > 1e-3 for r in exact), name


def test_statistical_rows_state_their_budget(quick_rows):
    stat = [r for r in quick_rows if r.check != EXACT_CHECK]
    assert stat and all(r.samples > 0 and r.alpha is not None and r.detect_tv == 0.05 for r in stat)
    assert sum(r.alpha for r in stat) == pytest.approx(1e-9)
    assert {r.check for r in stat} == {SAMPLER_VS_KERNEL, KERNEL_VS_BLOCK_SAMPLER}


def test_asps_kernel_is_checked_against_the_block_sampler(quick_rows):
    # ASpS's sampler is the inverse CDF of its own kernel: testing one against
    # the other could not fail.  Its kernel is tested against block samples.
    asps = [r for r in quick_rows if r.verifier == "asps" and r.check != EXACT_CHECK]
    assert asps and all(r.check == KERNEL_VS_BLOCK_SAMPLER for r in asps)
    assert all(r.check == SAMPLER_VS_KERNEL for r in quick_rows if r.verifier != "asps" and r.check != EXACT_CHECK)
    assert suite.CHAIN_SAMPLER == {"sps": "sps", "asps": "block", "block": "block"}


def test_kernel_vs_block_sampler_check_can_fail():
    # Negative control: a kernel with a different law (SpS's) under the ASpS
    # name is compared with block samples, and the check must catch it.
    model = paper_toy_model()
    job = Job(ChainVerifier("asps", asps_sample, sps_kernel), model, 2)
    drafts = job_drafts(job)
    law = exact_law(job, drafts)
    block_law = output_law(model, drafts, BLOCK.kernel)
    tv = 0.5 * sum(abs(law.output_law.get(s, 0.0) - block_law.output_law.get(s, 0.0))
                   for s in set(law.output_law) | set(block_law.output_law))
    assert tv > 0.03  # the check below is sized to detect this with probability >= 0.999
    row = statistical_check(job, drafts, law, 1e-9, 0.03, 0)
    assert row.check == KERNEL_VS_BLOCK_SAMPLER and not row.passed


def test_a_check_failed_by_impossible_outputs_says_so():
    """A sampler that emits an output of target probability 0 fails whatever its p-value; the table showed
    "FAIL" beside a p-value of 1.  The row now counts those samples and the table names them."""
    from tmc.toy import ToyModel

    uniform = np.full(3, 1 / 3)
    model = ToyModel(3, {}, {}, uniform, np.array([0.5, 0.5, 0.0]), name="no-token-2")
    job = Job(ChainVerifier("emits_2", lambda ref, q_rows, p_rows, rng: [2], sps_kernel), model, 1)
    drafts = job_drafts(job)
    law = exact_law(job, drafts)
    row = statistical_check(job, drafts, law, 1e-9, 0.05, 0)
    assert not row.passed and row.impossible == row.samples > 0
    text = suite.render([row], SuiteConfig(seed=0))
    assert f"{row.samples} impossible" in text
    assert suite.to_json([row], SuiteConfig(seed=0))["rows"][0]["impossible"] == row.samples


def test_each_job_enumerates_its_drafts_once(monkeypatch):
    calls: list[int] = []
    real = suite.chain_drafts

    def counting(model, n, prefix=()):
        calls.append(n)
        return real(model, n, prefix)

    monkeypatch.setattr(suite, "chain_drafts", counting)
    model = paper_toy_model()
    monkeypatch.setattr(suite, "suite_jobs", lambda config: [Job(ASPS, model, 2)])
    rows = run_suite(SuiteConfig(seed=1))
    assert calls == [2] and [r.passed for r in rows] == [True, True]


def test_exact_law_matches_the_laws_module():
    model = paper_toy_model()
    job = Job(ASPS, model, 2)
    assert exact_law(job).output_law == output_law(model, chain_drafts(model, 2), ASPS.kernel).output_law


def test_statistical_check_takes_a_seed_or_a_generator():
    job = Job(BLOCK, paper_toy_model(), 1)
    drafts = job_drafts(job)
    law = exact_law(job, drafts)
    by_seed = statistical_check(job, drafts, law, 1e-9, 0.2, 5)
    by_rng = statistical_check(job, drafts, law, 1e-9, 0.2, np.random.default_rng(5))
    assert by_seed == by_rng and by_seed.passed
    with pytest.raises(ValueError, match="rng must be"):
        statistical_check(job, drafts, law, 1e-9, 0.2, 0.5)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"seed": 1.5}, "seed must be an integer"),
        ({"seed": -1}, "seed must be >= 0"),
        ({"false_fail": 0.0}, "false_fail must be in"),
        ({"detect_tv": 1.5}, "detect_tv must be in"),
        ({"test": "g"}, "test must be one of kl-bound, chi2"),
    ],
)
def test_suite_config_rejects_bad_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SuiteConfig(**kwargs)


def test_job_rejects_bad_shapes():
    model = paper_toy_model()
    with pytest.raises(ValueError, match="chain_n must be an integer"):
        Job(BLOCK, model, 1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="widths must be positive"):
        Job(MULTIDRAFT, model, None, (2, 0), Draw.IID)
    with pytest.raises(ValueError, match="needs a draw kind"):
        Job(MULTIDRAFT, model, None, (2,))
    assert Job(MULTIDRAFT, model, None, (2,), "swor").draw is Draw.SWOR  # type: ignore[arg-type]
    assert Job(BLOCK, model, 2.0).chain_n == 2  # type: ignore[arg-type]


# ------------------------------------------------------------------ CLI


@pytest.fixture
def canned(monkeypatch, quick_rows):
    """The CLI on the quick rows, without running the suite again."""
    lossless = [r for r in quick_rows if not r.expected_biased]
    monkeypatch.setattr(suite, "run_suite", lambda config, progress=None: lossless)
    return lossless


def test_cli_json_is_one_object_on_stdout(canned, capsys):
    assert main(["suite", "--quick", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["config"]["false_fail"] == 1e-9 and data["config"]["quick"] is True
    assert len(data["rows"]) == len(canned) > 10


def test_cli_passes_the_test_kind_and_says_which_rates_hold(canned, capsys):
    assert main(["suite", "--quick", "--json", "--test", "chi2"]) == 0
    assert json.loads(capsys.readouterr().out)["config"]["test"] == "chi2"
    assert main(["suite", "--quick"]) == 0
    assert "test kl-bound (rates are finite-sample bounds)" in capsys.readouterr().out


def test_cli_refuses_a_rate_that_rounds_to_zero_before_any_job(capsys):
    """5e-324 split over the checks is 0: refused in one line before the first job (it looped for ever
    under the chi-square's search, and the KL bound named only "alpha")."""
    assert main(["suite", "--quick", "--false-fail", "5e-324"]) == 2
    err = capsys.readouterr().err
    assert "rounds to 0: give a larger rate (--false-fail)" in err and "[1/" not in err


def test_statistical_check_sizes_each_test_for_its_own_guarantee():
    """The KL-bound test draws more samples than the chi-square for the same TV and rate (its guarantees
    are finite-sample bounds); both pass a lossless verifier, and an unknown test is refused.  False-fail
    rate of the two passes: at most 1e-9 for the KL bound's (a bound) and 1.3e-9 for the chi-square's (its
    asymptotic 1e-9 is 1.27e-9 in truth on this law, a statistics audit of 2026-11-28; on the tiny-rows law
    below, which is only sized here, 1.1e-8); the seed is fixed, so the outcome does not vary between runs."""
    job = Job(BLOCK, paper_toy_model(), 1)
    drafts = job_drafts(job)
    law = exact_law(job, drafts)
    kl = statistical_check(job, drafts, law, 1e-9, 0.1, 5)
    chi2 = statistical_check(job, drafts, law, 1e-9, 0.1, 5, "chi2")
    cells = sum(1 for v in law.output_law.values() if v > 0)
    assert kl.samples == kl_required_samples(cells, 0.1, 1e-9, POWER_MISS) > chi2.samples
    # the chi-square is sized on the bins it merges the cells into (the module doc), with the extra cell of "any
    # other output" (probability 0) beside the law's
    probs = [law.output_law[s] for s in sorted(law.output_law)] + [0.0]
    assert chi2.samples == chi_square_samples(probs, 0.1, 1e-9, POWER_MISS, cover="bins")
    # a law with cells of 1e-12, merged at every size within reach: there the two covers differ (2552 vs 3034)
    job = Job(BLOCK, suite._tiny_rows(3, 3, np.random.default_rng(0)), 1)
    drafts = job_drafts(job)
    law = exact_law(job, drafts)
    probs = [law.output_law[s] for s in sorted(law.output_law)] + [0.0]
    bins = chi_square_samples(probs, 0.1, 1e-9, POWER_MISS, cover="bins")
    assert statistical_check(job, drafts, law, 1e-9, 0.1, 5, "chi2").samples == bins
    assert bins < chi_square_samples(probs, 0.1, 1e-9, POWER_MISS, cover="cells")
    assert kl.passed and chi2.passed
    with pytest.raises(ValueError, match="test must be one of"):
        statistical_check(job, drafts, law, 1e-9, 0.1, 5, "pearson")


def test_cli_prints_the_table_and_writes_png(canned, tmp_path, capsys):
    png = tmp_path / "suite.png"
    assert main(["suite", "--quick", "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("tmc suite") and "0 failed" in out and KERNEL_VS_BLOCK_SAMPLER in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_refuses_a_plot_path_it_cannot_write_before_the_run(canned, tmp_path, capsys, monkeypatch):
    """A missing folder or a folder for ``--plot`` is refused before the suite runs (it failed at the end)."""
    import verification.suite

    monkeypatch.setattr(verification.suite, "run_suite", lambda *a, **k: pytest.fail("the suite ran"))
    for path, says in ((tmp_path / "missing" / "x.png", "no folder"), (tmp_path, "is a folder")):
        assert main(["suite", "--quick", "--plot", str(path)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and says in err


def test_cli_without_matplotlib_says_so_in_one_line(canned, monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` now fails
    assert main(["suite", "--quick", "--plot", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("tmc suite:") and "matplotlib" in err
    assert not (tmp_path / "x.png").exists()


def test_cli_end_to_end_exits_zero(capsys):
    assert main(["suite", "--quick", "--seed", "2"]) == 0
    assert "0 failed" in capsys.readouterr().out


def test_cli_help_is_plain_text(capsys):
    with pytest.raises(SystemExit) as err:
        main(["suite", "--help"])
    assert err.value.code == 0
    text = capsys.readouterr().out
    assert "--json" in text and "one JSON object on stdout" in text
    for markup in ("``", ":func:", ":mod:", ":data:", "**"):
        assert markup not in text


@pytest.mark.parametrize("argv", [["--false-fail", "2"], ["--tv", "0"], ["--seed", "-1"], ["--json", "out.json"]])
def test_cli_rejects_bad_arguments(argv, capsys):
    with pytest.raises(SystemExit) as err:
        main(["suite", *argv])
    assert err.value.code == 2
    assert capsys.readouterr().err.count("\n") == 1
