"""Builders + lossless tree verifiers: exact losslessness by enumeration, reports, CLI."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats

from spec.acceptance import (
    CI_RATE,
    betting_interval,
    builder_drafts,
    builder_report,
    random_stationary_model,
    sample_builder_drafts,
    step_sequence_law,
    tree_rng,
    verifiers_for,
)
from spec.builders import BUILDERS, DynaTreeBuilder, DySpecBuilder, make_builder
from tmc.cli import main
from tmc.commands.acceptance import TREE_VERIFIERS
from tmc.laws import output_law
from tmc.multidraft import DraftTree, tree_kernel_outputs
from tmc.ordered_traversal import ordered_traversal_kernel
from tmc.toy import PAPER_TOY_FILE
from tmc.validate import as_rng

from tests.spec.conftest import models
from tests.spec.test_builders import SMALL

TOL = 1e-12


@pytest.mark.parametrize("name", list(BUILDERS))
def test_every_builder_is_lossless_with_every_applicable_verifier(name: str) -> None:
    """Completion identity over the builder's whole randomness (DESIGN.md §4), V <= 4."""
    checked = set()
    for vocab, seeds in ((2, range(3)), (3, range(4)), (4, range(2))):
        for m in models(vocab, seeds):
            for budget in (1, 2, 4):
                b = make_builder(name, **SMALL[name])
                drafts = builder_drafts(m, b, budget)
                kinds = {d for t in drafts for d in t.tree.draws}
                for vname, kernel in verifiers_for("all", kinds, b.adaptive_widths).items():
                    law = output_law(m, drafts, kernel)
                    assert law.completion_error <= TOL, (name, vname, vocab, budget)
                    checked.add(vname)
    assert {"multidraft", "traversal"} <= checked
    if name in ("chain",):
        assert "kseq" in checked and "ordered_traversal" in checked


def test_ratio_ordered_traversal_is_biased_on_dyspec_trees() -> None:
    """DySpec's sibling count depends on the tokens drawn; ratio ordering assumes a fixed-size
    sample, so it is not lossless there (and the reports never pair the two)."""
    worst = 0.0
    for m in models(3, range(3)):
        drafts = builder_drafts(m, DySpecBuilder(), 4)
        worst = max(worst, output_law(m, drafts, ordered_traversal_kernel).completion_error)
    assert worst > 1e-3
    with pytest.raises(ValueError, match="number of children"):
        verifiers_for("ordered_traversal", set(), adaptive_widths=True)
    assert "ordered_traversal" not in verifiers_for("all", set(), adaptive_widths=True)


def test_dynatree_history_adaptation_across_steps_is_lossless() -> None:
    """Three steps with the state carried along every branch: the law of all emitted tokens
    passes the completion identity, and the adaptation really changes the trees."""
    b = DynaTreeBuilder(base_depth=1, max_depth=3, rho_stop=0.01, rho_deep=0.2, window=2,
                        target_acceptance=0.2, eta_depth=3.0, eta_conf=1.0, root_top1=False)
    for m in models(3, range(3), concentration=0.5):
        adaptive = step_sequence_law(m, b, "multidraft", 4, 3)
        assert adaptive.completion_error <= TOL
        assert len(adaptive.states) > 1  # the state depends on what was accepted
        frozen = step_sequence_law(m, DynaTreeBuilder(**{**b.__dict__, "adapt": False}), "multidraft", 4, 3)
        assert frozen.completion_error <= TOL
        assert adaptive.law != frozen.law
        assert step_sequence_law(m, b, "traversal", 4, 3).completion_error <= TOL


def test_sampling_builders_over_steps() -> None:
    for name in ("dyspec", "fixed"):
        for m in models(2, range(2)):
            law = step_sequence_law(m, make_builder(name, **SMALL[name]), "traversal", 2, 2)
            assert law.completion_error <= TOL


def test_report_exact_matches_pipeline_and_lp_bounds_it() -> None:
    m = models(3, range(1))[0]
    report = builder_report(m, "dyspec", 4, "all")
    assert report["exact"] and report["lp"] is not None
    names = [e["verifier"] for e in report["entries"]]
    assert names == ["multidraft", "traversal"]
    for e in report["entries"]:
        assert e["completion_error"] <= TOL
        assert e["expected_length"] <= report["lp"]["expected_length"] + 1e-6  # solver tolerance


def test_monte_carlo_fallback_interval() -> None:
    """The MC mean is within 4 standard errors of the exact value (false-fail rate ~6.3e-5 for a
    fresh seed; the seed is fixed, so the run is reproducible).  With 2000 trees the standard
    error here is 0.0145, so a bias of 0.10 tokens/step is caught with probability 0.998
    (0.05 only with probability ~0.3).  The report's ``ci95`` is the 95% betting interval of its
    lengths; its coverage is checked at a rate a test can carry: the same interval at rate 1e-6
    misses the exact value with probability at most 1e-6 (Ville's inequality), so the test's
    false-fail rate is about 6.4e-5 in all.  Until 2026-11-28 the test
    asserted that the 95% interval held the exact value and was wider than the normal interval: over
    fresh seeds one of the two failed 94 times in 1500 (a statistics audit), a 6% false-fail rate stated
    nowhere."""
    m = models(3, range(1))[0]
    exact = builder_report(m, "dyspec", 5, "traversal")
    assert exact["exact"]
    mc = builder_report(m, "dyspec", 5, "traversal", max_runs=10, samples=2000, seed=3)
    assert not mc["exact"] and mc["lp"] is None
    (e,) = mc["entries"]
    kernel = TREE_VERIFIERS["traversal"].kernel
    lengths = [sum(len(s) * w for s, w in tree_kernel_outputs(d.tree, kernel(d.tree, d.p_rows)).items())
               for d in sample_builder_drafts(m, make_builder("dyspec"), 5, 2000, tree_rng(3))]  # the report's trees
    assert e["expected_length"] == pytest.approx(float(np.mean(lengths)), rel=1e-12)
    se = float(np.std(lengths, ddof=1)) / math.sqrt(len(lengths))
    assert abs(e["expected_length"] - exact["entries"][0]["expected_length"]) < 4 * se
    assert 0 < se < 0.05
    assert e["ci95"] == list(betting_interval(np.array(lengths), 1.0, 6.0, CI_RATE))  # budget 5: lengths in [1, 6]
    lo, hi = betting_interval(np.array(lengths), 1.0, 6.0, 1e-6)
    assert lo < exact["entries"][0]["expected_length"] < hi


def test_a_random_model_and_its_sampled_trees_share_no_random_words() -> None:
    """``tmc acceptance --random V --seed S --builder ...`` and ``tmc bench builders`` give a model and its trees
    one integer.  The report's trees come from ``tree_rng(S)``, whose words are none of those ``as_rng(S)`` set the
    model's rows from; until 2026-11-27 the trees were drawn from ``default_rng(S)`` itself (the report's mean then
    equalled the mean over ``sample_builder_drafts(..., S)``, checked to fail here)."""
    seed, budget, n = 1, 16, 40
    m = random_stationary_model(4, seed)  # as the CLI builds it
    report = builder_report(m, "dyspec", budget, "traversal", max_runs=1, samples=n, seed=seed)
    assert not report["exact"]
    kernel = TREE_VERIFIERS["traversal"].kernel

    def mean_length(rng: object) -> float:
        drafts = sample_builder_drafts(m, make_builder("dyspec"), budget, n, rng)  # type: ignore[arg-type]
        return float(np.mean([sum(len(s) * w for s, w in tree_kernel_outputs(d.tree, kernel(d.tree, d.p_rows)).items())
                              for d in drafts]))

    got = report["entries"][0]["expected_length"]
    assert got == pytest.approx(mean_length(tree_rng(seed)), rel=1e-12)
    assert got != pytest.approx(mean_length(seed), rel=1e-9)  # not the model's own stream
    words = 4096  # more than the rows of a V = 4 model take (2 (1 + 4 + 16 + 1) rows of 4 gamma draws)
    model_words = set(as_rng(seed).bit_generator.random_raw(words).tolist())
    assert not model_words & set(tree_rng(seed).bit_generator.random_raw(words).tolist())
    with pytest.raises(ValueError, match="seed"):
        tree_rng(-1)


def test_a_sampled_tree_whose_length_rounds_past_the_budget_keeps_the_interval() -> None:
    """A tree's exact length is a float sum, so a chain of 8 that Traversal accepts whole with probability one
    came out at 9.000000000000002 > budget + 1, and the report failed ("a betting interval's values must lie in
    [1.0, 9.0]": ``tmc bench builders``, peaked family, budget 8, with the 2026-11-27 tree seeds).  Such values
    are put back on the bound; one far outside still raises."""
    from spec.acceptance import _length_given_tree, _within_bounds

    m = random_stationary_model(4, 0, concentration=0.3, agreement=0.6, zero_prob=0.0)
    kernel = TREE_VERIFIERS["traversal"].kernel
    lengths = [_length_given_tree(d, kernel) for d in sample_builder_drafts(m, make_builder("chain"), 8, 70, tree_rng(0))]
    assert max(lengths) > 9.0  # the case is exercised (tree 68 of this stream)
    (e,) = builder_report(m, "chain", 8, "traversal", max_runs=1, samples=70, seed=0)["entries"]
    assert e["expected_length"] == pytest.approx(float(np.mean(lengths)), rel=1e-15)
    assert 1.0 <= e["ci95"][0] <= e["expected_length"] <= e["ci95"][1] <= 9.0
    assert _within_bounds(np.array([1 - 1e-14, 9 + 1e-14, 5.0]), 8).tolist() == [1.0, 9.0, 5.0]
    assert _within_bounds(np.array([9.001]), 8).tolist() == [9.001]


def test_monte_carlo_interval_covers_a_skewed_law() -> None:
    """The sampled interval is a betting interval (``betting_interval``), which holds for any law of lengths
    in [1, budget + 1].  The normal interval it replaced missed the exact value on 43% of 300 seeds here
    (a chain of 6 on a draft that almost always repeats the target's likely token: 39% of the 30-tree
    samples had no spread, so the interval had width 0; audit of 2026-11-27).  Misses over 200 seeds must
    stay within the binomial 1e-6 quantile at the stated 5% (false-fail rate < 1e-6 if the interval holds;
    the normal interval's 43% fails it with probability ≈ 1)."""
    from tmc.toy import ToyModel

    model = ToyModel.from_dict({"vocab": 2, "draft": {"*": [0.995, 0.005]}, "target": {"*": [0.999, 0.001]}})
    exact = builder_report(model, "chain", 6, "multidraft")
    assert exact["exact"]
    truth = exact["entries"][0]["expected_length"]
    misses = 0
    for seed in range(200):
        (e,) = builder_report(model, "chain", 6, "multidraft", max_runs=1, samples=30, seed=seed)["entries"]
        lo, hi = e["ci95"]
        misses += not lo <= truth <= hi
        assert 1.0 <= lo <= hi <= 7.0
    assert misses <= stats.binom.isf(1e-6, 200, 0.05), misses


def test_report_samples_at_once_when_the_enumeration_is_estimated_far_too_large() -> None:
    """Knuth's estimate of the runs decides: above SKIP_FACTOR x max_runs the report samples without trying
    (a budget-16 DySpec tree on V = 4: 37 s on 20,000 runs before); below, it enumerates, and falls back to
    sampling when the runs pass max_runs after all."""
    from spec.acceptance import SKIP_FACTOR

    m = models(3, range(1))[0]
    said: list[str] = []
    report = builder_report(m, "dyspec", 5, "traversal", max_runs=2, samples=50, progress=said.append)
    assert not report["exact"] and report["estimated_runs"] > SKIP_FACTOR * 2
    assert len(said) == 1 and "sampling 50 trees" in said[0] and "enumerating" not in said[0]
    runs = report["estimated_runs"]
    said.clear()
    limit = int(runs / 2)  # the estimate is within SKIP_FACTOR of it: enumeration tried, then too many runs
    report = builder_report(m, "dyspec", 5, "traversal", max_runs=limit, samples=50, progress=said.append)
    assert not report["exact"] and len(said) == 2
    assert "enumerating" in said[0] and f"more than {limit} runs: sampling 50 trees" in said[1]
    said.clear()
    report = builder_report(m, "dyspec", 5, "traversal", progress=said.append)
    assert report["exact"] and len(said) == 1 and "enumerating" in said[0]


def test_monte_carlo_needs_two_trees() -> None:
    m = models(3, range(1))[0]
    with pytest.raises(ValueError, match="samples must be >= 2"):
        builder_report(m, "dyspec", 5, "traversal", max_runs=10, samples=1)


def test_sampled_drafts_are_builder_trees() -> None:
    m = models(3, range(1))[0]
    law = {(d.tree.parents, d.tree.tokens) for d in builder_drafts(m, "dyspec", 3)}
    for d in sample_builder_drafts(m, "dyspec", 3, 50, 1):
        assert (d.tree.parents, d.tree.tokens) in law
        assert math.isclose(d.weight, 1 / 50)


def test_verifier_names_and_draw_kinds() -> None:
    assert set(verifiers_for("all", {TREE_VERIFIERS["kseq"].draws[0]})) == set(TREE_VERIFIERS)
    with pytest.raises(ValueError, match="unknown tree verifier"):
        verifiers_for("nope", set())
    from tmc.multidraft import Draw

    with pytest.raises(ValueError, match="i.i.d.|iid"):
        verifiers_for("kseq", {Draw.SWOR})


# ------------------------------------------------------------------- command line


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_builder_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "acceptance", str(PAPER_TOY_FILE), "--builder", "dyspec", "--budget", "3", "--json")
    assert code == 0
    obj = json.loads(out)
    assert set(obj["dyspec"]) == {"verifier", "expected_length", "completion_error"}
    assert obj["dyspec"]["verifier"] == "multidraft" and obj["dyspec"]["completion_error"] <= TOL
    assert obj["lp"]["expected_length"] >= obj["dyspec"]["expected_length"] - 1e-6
    code, out, _ = _run(capsys, "acceptance", "--random", "3", "--builder", "fixed", "--budget", "4",
                        "--verifier", "all", "--json", "--param", "width=2", "--param", "draw=iid")
    obj = json.loads(out)
    assert [e["verifier"] for e in obj["fixed"]] == list(TREE_VERIFIERS)


def test_cli_builder_monte_carlo_and_table(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "acceptance", "--random", "4", "--builder", "dyspec", "--budget", "12",
                        "--max-runs", "100", "--samples", "200", "--json")
    obj = json.loads(out)
    assert code == 0 and not obj["exact"] and obj["lp"] is None and len(obj["dyspec"]["ci95"]) == 2
    assert obj["estimated_runs"] > 10 * 100  # sampled at once: Knuth's estimate is past 10 x --max-runs
    code, out, _ = _run(capsys, "acceptance", "--random", "3", "--builder", "wetap", "--budget", "5")
    assert code == 0 and "LP limit" in out and "wetap" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--random", "3", "--builder", "dyspec"], "--budget"),
        (["--random", "3", "--chain", "2", "--verifier", "all"], "go with --builder"),
        (["--random", "3", "--builder", "dyspec", "--budget", "3", "--verifier", "ordered_traversal"], "number of children"),
        (["--random", "3", "--builder", "fixed", "--budget", "3", "--param", "width"], "KEY=VALUE"),
        (["--random", "3", "--builder", "fixed", "--budget", "3", "--param", "width=0"], "width"),
        (["--random", "3", "--builder", "nope", "--budget", "3"], "invalid choice"),
        (["--builder", "dyspec", "--budget", "3"], "MODEL.json or --random"),
        (["--random", "3", "--builder", "dyspec", "--budget", "0"], ">= 1"),
        # silently ignored before: --draw with a builder, the Monte Carlo options without one
        (["--random", "3", "--builder", "fixed", "--budget", "3", "--draw", "topk"], "--param draw="),
        (["--random", "3", "--chain", "2", "--samples", "100"], "go with --builder"),
        (["--random", "3", "--tree", "2", "--max-runs", "100"], "go with --builder"),
        (["--random", "3", "--chain", "2", "--draw", "swor"], "--draw goes with --tree"),
        # an interval from 1 tree was [-inf, inf] (JSON that strict parsers refuse), from 3 of width 0
        (["--random", "3", "--builder", "dyspec", "--budget", "3", "--samples", "1"], "at least 30"),
        (["--random", "1000", "--builder", "dyspec", "--budget", "3"], "at most V = 256"),
    ],
)
def test_cli_builder_misuse(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    try:
        code = main(["acceptance", *argv])
    except SystemExit as exc:
        code = int(exc.code or 0)
    _, err = capsys.readouterr()
    assert code == 2
    assert message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) <= 2  # the progress line at most, then one error line


def test_builder_state_must_not_be_needed_by_stateless_builders() -> None:
    b = DySpecBuilder()
    assert b.initial_state() is None
    chain = DraftTree((-1, 0, 1), (0, 0, 0), ("topk",) * 3, {}, 2)
    assert b.next_state(None, chain, 3) is None
    assert np.isfinite(builder_report(models(2, range(1))[0], b, 2)["entries"][0]["expected_length"])


def test_an_exact_report_too_deep_for_the_completion_check_sums_tree_lengths() -> None:
    """An exact report checks the completion identity and solves the LP over every target string up to one past
    its deepest path, ``V^(depth + 1)`` of them; a single greedy chain of 20 on V = 2 had taken 58 s and 3.6 GB
    (audit of 2026-11-27).  Past ``MAX_COMPLETION_CELLS`` the lengths are summed tree by tree, still exact:
    a ranked chain drafts token 0 every time, accepted with probability p(0) = 0.999, so
    E = Σ_{k ≤ 20} 0.999^k."""
    from spec.acceptance import MAX_COMPLETION_CELLS, render_builder_report
    from tmc.laws import completion_cells
    from tmc.toy import ToyModel

    model = ToyModel.from_dict({"vocab": 2, "draft": {"*": [0.995, 0.005]}, "target": {"*": [0.999, 0.001]}})
    assert completion_cells(2, 20) > MAX_COMPLETION_CELLS >= completion_cells(2, 16)
    report = builder_report(model, make_builder("chain", draw="topk"), 20, "multidraft")
    (e,) = report["entries"]
    assert report["exact"] and report["trees"] == 1 and report["lp"] is None and e["completion_error"] is None
    assert e["expected_length"] == pytest.approx(math.fsum(0.999**k for k in range(21)), rel=1e-12)
    assert "too deep for the completion check and the LP" in render_builder_report(report, model)
    assert "not checked" in render_builder_report(report, model)
    checked = builder_report(model, make_builder("chain", draw="topk"), 16, "multidraft")  # within: as before
    assert checked["lp"] is not None and checked["entries"][0]["completion_error"] < 1e-12


def test_verifier_names_are_checked_before_any_building(monkeypatch: pytest.MonkeyPatch) -> None:
    """An unknown verifier, or one a builder's adaptive widths rule out, failed only after the enumeration or
    the sampling had run (audit of 2026-11-27); now before the first builder run."""
    import spec.acceptance as acceptance

    def no_building(*args: object, **kwargs: object) -> float:
        raise AssertionError("the builder ran before the verifier was checked")

    monkeypatch.setattr(acceptance, "estimate_runs", no_building)
    m = models(3, range(1))[0]
    with pytest.raises(ValueError, match="unknown tree verifier 'nope'"):
        builder_report(m, "dyspec", 8, "nope")
    with pytest.raises(ValueError, match="verifier 'ordered_traversal' is lossless only when"):
        builder_report(m, "dyspec", 8, "ordered_traversal")


def test_builder_budget_is_capped_on_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    """``--budget 1000`` with a chain builder on V = 1 ran 36 s (its builder re-run once a draw); the cap is
    ``--chain``'s deepest, 100."""
    assert main(["acceptance", "--random", "2", "--builder", "chain", "--budget", "101"]) == 2
    assert "--budget 101: at most 100 with --builder" in capsys.readouterr().err


def _wealth_set(x: np.ndarray, rate: float, grid: np.ndarray) -> np.ndarray:
    """The candidate means of ``grid`` that ``betting_interval``'s definition keeps, by a direct loop (values in
    [0, 1]): neither bettor's wealth ever reaches ``2 / rate``."""
    n = len(x)
    keep = []
    for m in grid:
        up = down = 1.0
        top = 1.0
        mean, ss = 0.5, 0.25
        for i, xi in enumerate(x):
            var = ss / (i + 1)  # the plug-in variance of the values before x_i
            lam = math.sqrt(2 * math.log(2 / rate) / (n * var))
            up *= 1 + min(lam, 0.5 / m) * (xi - m)
            down *= 1 - min(lam, 0.5 / (1 - m)) * (xi - m)
            top = max(top, up, down)
            mean = (mean * (i + 1) + xi) / (i + 2)
            ss += (xi - mean) ** 2
        keep.append(top < 2 / rate)
    return np.array(keep)


@pytest.mark.parametrize("seed", range(4))
def test_betting_interval_holds_its_defining_set(seed: int) -> None:
    """The coarse-then-fine grid search contains every candidate mean the definition keeps (checked on a grid of
    400 by a direct loop), and is no more than a few steps of that grid wider."""
    from spec.acceptance import betting_interval

    rng = np.random.default_rng(seed)
    x = rng.beta(0.3 + seed, 2.0, size=25 + 20 * seed)
    lo, hi = betting_interval(x, 0.0, 1.0, 0.05)
    grid = (np.arange(400) + 0.5) / 400
    kept = grid[_wealth_set(x, 0.05, grid)]
    assert kept.size and lo <= kept[0] and kept[-1] <= hi, (lo, hi, kept[0], kept[-1])
    assert kept[0] - lo < 4 / 400 and hi - kept[-1] < 4 / 400
    scaled = betting_interval(3.0 + 5.0 * x, 3.0, 8.0, 0.05)  # an affine map of the values moves the interval
    assert scaled == pytest.approx((3.0 + 5.0 * lo, 3.0 + 5.0 * hi), abs=1e-12)


@pytest.mark.parametrize(("p", "n"), [(0.01, 30), (0.3, 30), (0.5, 400), (0.02, 400)])
def test_betting_interval_covers_bernoulli_means(p: float, n: int) -> None:
    """Coverage over 400 fresh samples of a Bernoulli(p): misses at most the binomial 1e-6 quantile at the stated
    5% (false-fail rate < 1e-6 where the interval holds; measured 0–4.3%).  A normal interval at n = 30 and
    p = 0.01 misses 74% (no 1 among 30 draws, probability 0.99^30, gives [0, 0]) and fails this."""
    from spec.acceptance import betting_interval

    rng = np.random.default_rng(7)
    misses = 0
    for _ in range(400):
        lo, hi = betting_interval((rng.random(n) < p).astype(float), 0.0, 1.0, 0.05)
        misses += not lo <= p <= hi
    assert misses <= stats.binom.isf(1e-6, 400, 0.05), misses


def test_betting_interval_refuses_what_it_cannot_bound() -> None:
    from spec.acceptance import betting_interval

    for args, said in (((np.array([0.5]), 0.0, 1.0, 0.0), "0 < rate < 1"), ((np.array([0.5]), 1.0, 1.0, 0.05), "low < high"),
                       ((np.array([]), 0.0, 1.0, 0.05), "at least one value"),
                       ((np.array([0.5, 1.5]), 0.0, 1.0, 0.05), r"must lie in \[0.0, 1.0\]"),
                       ((np.array([0.5, np.nan]), 0.0, 1.0, 0.05), "must lie in")):
        with pytest.raises(ValueError, match=said):
            betting_interval(*args)
