"""``tmc bench verify``: both chain verifier backends on the same rows, the auto column, the command, bad input."""

from __future__ import annotations

import json
from importlib.metadata import entry_points

import pytest

torch = pytest.importorskip("torch")

from spec.bench_verify import main, render, run_tree_verify_bench, run_verify_bench  # noqa: E402
from spec.llm.generate import HOST_VERIFY_MAX_ENTRIES  # noqa: E402

pytestmark = pytest.mark.llm


def test_every_cell_is_timed_on_both_backends_with_the_same_result() -> None:
    report = run_verify_bench("cpu", vocabs=(16, 50), rows=(2, 5), methods=("sps", "asps", "block"), calls=3)
    assert [(r["vocab"], r["rows"], r["method"]) for r in report["rows"]] == [
        (v, n, m) for v in (16, 50) for n in (2, 5) for m in ("sps", "asps", "block")]
    for r in report["rows"]:
        assert r["torch_ms"] > 0 and r["numpy_ms"] > 0
        assert 0 <= r["accepted"] <= r["rows"] - 1
        assert r["auto"] == "numpy"  # the CPU: numpy at every size
    text = render(report)
    assert "numpy / torch" in text and "median of 3 calls" in text
    json.dumps(report)


def test_every_tree_cell_is_timed_three_ways_with_the_same_result() -> None:
    trees = run_tree_verify_bench("cpu", vocabs=(16, 50), budgets=(1, 3, 7), calls=2)
    assert [(r["vocab"], r["budget"], r["method"]) for r in trees] == [
        (v, b, m) for v in (16, 50) for b in (1, 3, 7) for m in ("multidraft", "traversal", "ordered_traversal", "kseq")]
    for r in trees:
        assert r["device_ms"] > 0 and r["host_ms"] > 0 and r["numpy_ms"] > 0
        assert 0 <= r["accepted"] <= r["budget"] and r["ops"] > 0
    report = run_verify_bench("cpu", vocabs=(16,), rows=(2,), calls=1)
    assert "fixed-tree" not in render(report)
    text = render({**report, "trees": trees})
    assert "fixed-tree verification on cpu" in text and "numpy / device" in text
    json.dumps(trees)


def test_tree_cells_time_the_compiled_walk_on_request() -> None:
    """With a compile backend (here dynamo's ``eager``: a whole-graph trace, no code generation) the walk is
    compiled, checked against the eager one and timed in its own column."""
    trees = run_tree_verify_bench("cpu", vocabs=(16,), budgets=(3,), calls=2, compile_backend="eager")
    assert [r["method"] for r in trees] == ["multidraft", "traversal", "ordered_traversal", "kseq"]
    assert all(r["compiled_ms"] > 0 for r in trees)
    report = {**run_verify_bench("cpu", vocabs=(16,), rows=(2,), calls=1), "trees": trees}
    assert "compiled ms" in render(report)
    torch._dynamo.reset()


@pytest.mark.parametrize("kwargs, match", [
    ({"vocabs": ()}, "vocabs"), ({"budgets": (0,)}, "budgets"), ({"compile_backend": 3}, "compile_backend"), ({"budgets": ()}, "budgets"),
    ({"methods": ("sps",)}, "methods"), ({"calls": 0}, "calls"), ({"device": "gpu"}, "not a torch device")])
def test_tree_bench_refuses_bad_arguments(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        run_tree_verify_bench(**{"device": "cpu", **kwargs})  # type: ignore[arg-type]


def test_auto_column_follows_the_bound_on_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The column is resolve_verify_backend's answer for the cell's rows: on a (pretended) GPU, torch past
    HOST_VERIFY_MAX_ENTRIES target-row entries."""
    import spec.llm.generate as gen

    real = gen.resolve_verify_backend

    def as_if_on_a_gpu(model: object, backend: str, device_chain: bool, entries: int = 0) -> str:
        return "torch" if backend == "auto" and device_chain and entries > HOST_VERIFY_MAX_ENTRIES else real(
            model, backend, device_chain, entries)

    monkeypatch.setattr(gen, "resolve_verify_backend", as_if_on_a_gpu)
    small, large = HOST_VERIFY_MAX_ENTRIES // 2, HOST_VERIFY_MAX_ENTRIES // 2 + 1
    report = run_verify_bench("cpu", vocabs=(small, large), rows=(2,), methods=("sps",), calls=1)
    assert [r["auto"] for r in report["rows"]] == ["numpy", "torch"]


@pytest.mark.parametrize("kwargs, match", [
    ({"vocabs": ()}, "vocabs"), ({"vocabs": (0,)}, "vocabs"), ({"rows": (1,)}, "rows"), ({"rows": ()}, "rows"),
    ({"methods": ("traversal",)}, "methods"), ({"calls": 0}, "calls"), ({"device": "gpu"}, "not a torch device")])
def test_bad_arguments_are_refused(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        run_verify_bench(**{"device": "cpu", **kwargs})  # type: ignore[arg-type]


def test_module_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--device", "cpu", "--vocabs", "8,40", "--rows", "3", "--calls", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [(r["vocab"], r["method"]) for r in report["rows"]] == [(8, "sps"), (8, "block"), (40, "sps"), (40, "block")]
    assert [(r["vocab"], r["budget"]) for r in report["trees"]] == [(v, b) for v in (8, 40) for b in (7, 15, 31)
                                                                    for _ in range(4)]
    assert main(["--device", "cpu", "--vocabs", "8", "--rows", "3", "--budgets", "0", "--calls", "1", "--json"]) == 0
    assert "trees" not in json.loads(capsys.readouterr().out)
    for argv, match in ((["--vocabs", "x"], "--vocabs takes"), (["--rows", "1"], "--rows must"),
                        (["--budgets", "0,3"], "--budgets must"),
                        (["--calls", "0"], "--calls must"), (["--device", "gpu"], "'gpu' is not a torch device"),
                        (["--vocabs", "100000000000"], "at most 268,435,456"),  # was a torch allocation traceback
                        (["--vocabs", "4096", "--rows", "3", "--budgets", "70000"], "largest cell holds")):
        assert main(["--device", "cpu", *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and match in err[0], err


@pytest.mark.skipif(not any(ep.name == "verify" for ep in entry_points(group="tmc.benchmarks")),
                    reason="package not installed: no tmc.benchmarks entry")
def test_tmc_bench_verify(capsys: pytest.CaptureFixture[str]) -> None:
    from tmc.cli import main as tmc_main

    assert tmc_main(["bench", "verify", "--device", "cpu", "--vocabs", "8", "--rows", "2", "--calls", "1"]) == 0
    assert "chain verification on cpu" in capsys.readouterr().out


def test_without_transformers_it_is_one_line(capsys, monkeypatch):
    """torch without transformers (what the old message told the user to install): spec.llm's modules import
    transformers, and the command raised ModuleNotFoundError with a traceback (exit 1)."""
    from tmc.cli import main as tmc_main

    monkeypatch.setitem(__import__("sys").modules, "transformers", None)
    assert tmc_main(["bench", "verify", "--vocabs", "8", "--rows", "2", "--budgets", "0", "--calls", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs torch and transformers" in err[0]


@pytest.mark.parametrize("module", ["spec.bench_verify", "spec.bench_decode"])
def test_module_entry_points_check_the_seed_as_tmc_bench_does(module: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``python -m spec.bench_*`` read ``--seed`` as a plain int (audit D6 of 2026-11-27): ``-1`` reached numpy
    ("expected non-negative integer", not naming the flag) or failed only after the models had loaded.  Now
    both take ``tmc bench``'s flag and refuse it in one line before anything runs."""
    import importlib

    entry = importlib.import_module(module).main
    with pytest.raises(SystemExit) as exc:
        entry(["--seed", "-1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1 and "argument --seed: must be >= 0, got -1" in err[0], err
