"""``tmc bench builders`` in a small form: the run, its table and its failure modes."""

from __future__ import annotations

import pytest

from spec.bench_builders import FAMILIES, render, run_builder_bench
from spec.builders import BUILDERS


def test_a_small_builder_bench_runs_through_a_length_that_rounds_past_the_budget() -> None:
    """Budget 8, one model per family, 70 trees: the peaked family's chain holds a tree whose exact Traversal
    length is 9.000000000000002 (tree 68 of its stream), on which the full bench failed with "a betting
    interval's values must lie in [1.0, 9.0]" once the trees had seeds apart from the models'.  Every
    (family, builder) row is there; an exact row has its LP limit, at or above its Traversal length and at or
    above its residual length (the LP bounds every lossless verifier); a Monte Carlo row has an interval."""
    report = run_builder_bench(budgets=(8,), n_models=1, samples=70)
    rows = {(r["family"], r["builder"]): r for r in report["rows"]}
    assert set(rows) == {(f, b) for f in FAMILIES for b in BUILDERS}
    assert not rows["peaked", "chain"]["exact"]
    for r in rows.values():
        if r["exact"]:
            assert r["lp"] is not None
            assert max(r["traversal"], r["multidraft"]) <= r["lp"] * (1 + 1e-12)
        else:
            assert r["lp"] is None and 0 < r["traversal_ci95_half"] < 9 and 0 < r["multidraft_ci95_half"] < 9
        assert 1.0 <= r["multidraft"] <= 9.0 and 1.0 <= r["traversal"] <= 9.0
    text = render(report)
    assert "mean of 1 model)" in text and "-0.0%" not in text


def _row(traversal: float, lp: float) -> dict[str, object]:
    return {"family": "peaked", "budget": 4, "builder": "chain", "exact": True, "mean_trees": 1.0,
            "multidraft": traversal, "traversal": traversal, "multidraft_ci95_half": 0.0,
            "traversal_ci95_half": 0.0, "lp": lp}


@pytest.mark.parametrize(("traversal", "lp", "gap"), [(2.0000000000000004, 2.0, "0.0%"), (1.9, 2.0, "5.0%")])
def test_the_gap_to_the_lp_prints_no_negative_zero(traversal: float, lp: float, gap: str) -> None:
    """A Traversal length equal to its LP limit up to rounding printed "-0.0%" below the LP."""
    text = render({"budgets": [4], "models_per_family": 3, "rows": [_row(traversal, lp)]})
    assert f" {gap} " in text and "-0.0%" not in text and "mean of 3 models)" in text
