"""Package-level checks: import hygiene, type checking, the command line."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tmc.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_tmc_imports_fast_without_torch_or_scipy():
    code = (
        "import sys, time; t = time.perf_counter(); import tmc; dt = time.perf_counter() - t; "
        "assert 'torch' not in sys.modules and 'scipy' not in sys.modules, sorted(sys.modules); "
        "print(dt)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert float(out.stdout) < 1.0


def test_spec_imports_without_torch():
    """``spec.generate`` (the issue's API) is resolved on first use, so importing ``spec``, its builders and
    its trees loads neither torch nor transformers; a name ``spec`` lacks is an ``AttributeError``."""
    code = (
        "import sys, spec, spec.builders, spec.tree; "
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, sorted(sys.modules); "
        "print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "ok"
    import spec

    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        spec.nope  # noqa: B018


def test_no_torch_import_anywhere_under_tmc():
    for path in (ROOT / "tmc").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        assert "import torch" not in text and "from torch" not in text, path


def test_mypy_strict_on_the_packages():
    from mypy import api

    targets = [str(ROOT / pkg) for pkg in ("tmc", "verification", "proofs_check", "spec/builders")]
    # spec/llm is left out (pyproject: follow_imports = silent): strict mode rejects
    # transformers' untyped calls (no-untyped-call) all through it
    targets += [str(p) for p in (ROOT / "spec").glob("*.py")]
    stdout, stderr, status = api.run(["--config-file", str(ROOT / "pyproject.toml"), *targets])
    assert status == 0, stdout + stderr


def test_demo_prints_paper_tables_and_lengths(capsys):
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "SpS joint law (paper Table 2)" in out and "ASpS joint law (paper Table 3)" in out
    lines = {line.split()[0]: line.split() for line in out.splitlines() if line.strip()}
    assert "2.560000" in out and "2.600000" in out
    assert lines["b"][1:] == ["0.050", "0.050", "0.000", "0.300", "0.000"]  # Table 3's row b (last table)


def test_demo_json_gives_the_paper_tables_and_lengths(capsys):
    """``tmc demo --json``: ASpS's joint law is the paper's Table 3 (copied from the paper, rows aa ab ac aτ b c,
    columns aa ab ac b c), and the lengths its 2.56 (SpS) and 2.60 (ASpS); the text is rendered from the same."""
    assert main(["demo", "--json", "--seed", "3"]) == 0
    report = json.loads(capsys.readouterr().out)
    table3 = {
        "aa": [0.1, 0, 0, 0, 0], "ab": [0, 0.1, 0, 0, 0], "ac": [0, 0, 0.1, 0, 0], "aτ": [0, 0, 0, 0, 0],
        "b": [0.05, 0.05, 0, 0.3, 0], "c": [0.05, 0.05, 0, 0, 0.2],
    }
    asps = report["paper"]["joint_tables"]["asps"]
    assert list(asps) == list(table3)
    for row, want in table3.items():
        assert list(asps[row]) == ["aa", "ab", "ac", "b", "c"]
        assert list(asps[row].values()) == pytest.approx(want, abs=1e-12), row
    assert report["paper"]["joint_tables"]["sps"]["b"]["ac"] == pytest.approx(0.02, abs=1e-12)  # draft ac, output b: 0.02
    lengths = report["paper"]["lengths"]
    assert lengths["SpS"]["expected_length"] == pytest.approx(2.56, abs=1e-12)
    assert lengths["ASpS"]["expected_length"] == pytest.approx(2.60, abs=1e-12)
    assert report["random"]["seed"] == 3 and set(report["random"]["lengths"]) == {"SpS", "ASpS", "block"}
    assert main(["demo", "--seed", "3"]) == 0
    text = capsys.readouterr().out
    assert f"{report['random']['lengths']['block']['expected_length']:.6f}" in text


def test_bench_prints_ratio_table(capsys):
    assert main(["bench", "--n", "1,2", "--vocab", "50", "--repeat", "1"]) == 0
    assert "ASpS/SpS" in capsys.readouterr().out


def test_bench_json_flag_prints_the_figures(capsys):
    assert main(["bench", "--n", "1,2", "--vocab", "50", "--repeat", "1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [r["n"] for r in report["results"]] == [1, 2]
    assert all(r["sps_us"] > 0 and r["asps_us"] > 0 and r["block_us"] > 0 for r in report["results"])


@pytest.mark.parametrize(
    ("argv", "ignored"),
    [
        (["bench", "exact", "--models", "3"], "--models (read by gap)"),
        (["bench", "gap", "--vocab", "10", "--n", "2"], "--n (read by kernels); --vocab (read by kernels)"),
        (["bench", "kernels", "--pair", "x"], "--pair (read by decode)"),
        (["bench", "masks", "--device", "cpu"], "--device (read by decode, verify)"),
        (["bench", "verify", "--prompts", "3"], "--prompts (read by decode)"),
    ],
)
def test_bench_refuses_an_option_its_benchmark_would_ignore(argv, ignored, capsys):
    """``tmc bench kernels --pair x`` timed the kernels and dropped ``--pair`` without a word."""
    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == f"tmc bench: {argv[1]} would ignore {ignored}"


def test_bench_accepts_another_benchmarks_option_at_its_default(capsys):
    assert main(["bench", "--n", "1", "--vocab", "50", "--repeat", "1", "--models", "20", "--prompts", "8"]) == 0
    assert "ASpS/SpS" in capsys.readouterr().out


def test_every_bench_option_names_registered_benchmarks():
    """The refusal above reads an option's owners off its help ("kernels: ...", "decode, verify: ..."): each option
    of ``tmc bench`` but the shared ones names benchmarks that exist."""
    from tmc.cli import build_parser
    from tmc.commands import _option_owners

    parser = build_parser()
    (bench,) = [p for a in parser._subparsers._group_actions for n, p in a.choices.items() if n == "bench"]
    what = next(a for a in bench._actions if a.dest == "what")
    owned = {action.dest: names for action, names in _option_owners(bench)}
    shared = {a.dest for a in bench._actions if a.option_strings and a.dest not in owned}
    assert shared == {"help", "seed", "json"}
    assert {"n", "gap_vocab", "pair", "device", "vocabs"} <= owned.keys()
    assert all(names <= set(what.choices) for names in owned.values()), owned


def test_console_script_runs_demo():
    exe = Path(sys.executable).with_name("tmc")
    if not exe.exists():
        pytest.fail(f"console script {exe} not installed: run pip install -e '.[test]'")
    out = subprocess.run([str(exe), "demo"], capture_output=True, text=True, check=True, env=os.environ)
    assert "Exact expected output length" in out.stdout


COMMANDS = ["demo", "acceptance", "bench", "suite", "audit", "proofs"]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_help_is_clean_plain_text(command, capsys):
    with pytest.raises(SystemExit) as err:
        main([command, "--help"])
    assert err.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: tmc {command}"), out.splitlines()[0]
    assert not re.search(r"``|:(func|mod|class|data):|\*\*", out), out  # no reStructuredText markup


def _run_cli(capsys, argv):
    try:
        code = main(argv)
    except SystemExit as err:  # argparse's own exit for usage errors
        code = err.code
    captured = capsys.readouterr()
    return code, captured.err


# Every bad call a new user tried (issue 9): one line on stderr, non-zero exit, no traceback.
BAD_CALLS = [
    ["acceptance", "missing-file.json", "--chain", "2"],
    ["acceptance", ".", "--chain", "2"],
    ["acceptance", "--random", "0", "--chain", "2"],
    ["acceptance", "--random", "3", "--seed", "-1", "--chain", "2"],
    ["acceptance", "--random", "3", "--tree", "2", "--draw", "bogus"],
    ["bench", "--vocab", "0"],
    ["bench", "--n", "-1"],
    ["bench", "--n", "x"],
    ["bench", "--repeat", "0"],
    ["bench", "--seed", "-3"],
    ["demo", "--seed", "-1"],
    ["demo", "--seed", "x"],
    ["suite", "--false-fail", "2"],
    ["suite", "--seed", "-2"],
    ["audit", "no_such_module_xyz:f", "--kind", "chain"],
    ["audit", "tmc:sps_sample"],
    ["audit", "tmc", "--kind", "chain"],
    ["audit", "tmc:not_there", "--kind", "chain"],
    ["audit", "tmc:sps_sample", "--kind", "chain", "--budget", "0"],
    ["audit", "tmc:sps_sample", "--kind", "chain", "--seed", "-1"],
    ["proofs", "--seed", "-1"],
    ["proofs", "--only", "Z.99"],
    # 2**64: no generator takes it (torch's "Overflow when unpacking long long", after the models loaded)
    ["bench", "decode", "--seed", "18446744073709551616"],
    ["suite", "--seed", "18446744073709551616"],
]


@pytest.mark.parametrize("argv", BAD_CALLS, ids=[" ".join(a) for a in BAD_CALLS])
def test_cli_errors_are_one_line_without_traceback(capsys, argv):
    code, err = _run_cli(capsys, argv)
    assert code not in (0, None), err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err and lines[0].startswith("tmc"), err
    if "18446744073709551616" in argv:
        assert "--seed: must be < 2**64, got 18446744073709551616" in err, err


def test_the_largest_seed_reaches_every_generator():
    """2**64 - 1 is taken: numpy's generators accept it, and ``bench masks`` derives its drafts' seeds below 2**64
    (``seed * 1000 + k`` had passed it: 2**60 was refused after the first family had run)."""
    from spec.bench_masks import run_mask_bench
    from tmc.cli import SEED_LIMIT, seed_int

    for seed in (2**60, SEED_LIMIT - 1):
        assert seed_int(str(seed)) == seed
        report = run_mask_bench(sizes=(8,), trees=2, seed=seed)
        assert [r["family"] for r in report["rows"]] == ["random", "dyspec"]


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ('{"vocab": 2, "draft": {"": null}, "target": {"*": [1, 0]}}', "draft"),
        ('{"vocab": 2, "draft": {"": {"a": 1}}, "target": {"*": [1, 0]}}', "draft"),
        ('{"vocab": true, "draft": {"*": [1, 0]}, "target": {"*": [1, 0]}}', "vocab"),
        ('{"vocab": "2", "draft": {"*": [1, 0]}, "target": {"*": [1, 0]}}', "vocab"),
        ('{"vocab": 2, "draft": {"*": [1, "x"]}, "target": {"*": [1, 0]}}', "draft"),
        ("null", "expected a JSON object"),
    ],
)
def test_bad_model_files_are_one_line_errors(tmp_path, capsys, content, match):
    path = tmp_path / "model.json"
    path.write_text(content, encoding="utf-8")
    code, err = _run_cli(capsys, ["acceptance", str(path), "--chain", "1"])
    assert code == 2 and len(err.strip().splitlines()) == 1 and match in err, err


def test_audit_reports_a_module_that_fails_to_import(tmp_path, capsys, monkeypatch):
    (tmp_path / "broken_verifier_mod.py").write_text("raise RuntimeError('boom at import')\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    code, err = _run_cli(capsys, ["audit", "broken_verifier_mod:f", "--kind", "chain"])
    assert code == 2 and len(err.strip().splitlines()) == 1 and "boom at import" in err, err


def test_base_install_needs_no_test_extra():
    """Every documented command works after a plain ``pip install .``: no run-time import of a test-only package."""
    import tomllib

    meta = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    base = " ".join(meta["project"]["dependencies"])
    assert "hypothesis" in base  # tmc audit / tmc proofs search and draw cases with it
    for pkg in ("tmc", "verification", "proofs_check"):
        for path in (ROOT / pkg).rglob("*.py"):
            text = path.read_text(encoding="utf-8")
            for test_only in ("pytest", "mypy"):
                assert not re.search(rf"^\s*(import|from) {test_only}\b", text, re.M), f"{path} imports {test_only}"


def test_unknown_command_exits_with_usage():
    with pytest.raises(SystemExit) as err:
        main(["nope"])
    assert err.value.code == 2
