"""Package-level checks: import hygiene, type checking, the command line."""

from __future__ import annotations

import os
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


def test_no_torch_import_anywhere_under_tmc():
    for path in (ROOT / "tmc").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        assert "import torch" not in text and "from torch" not in text, path


def test_mypy_strict_on_the_packages():
    from mypy import api

    targets = [str(ROOT / pkg) for pkg in ("tmc", "verification", "proofs_check")]
    stdout, stderr, status = api.run(["--config-file", str(ROOT / "pyproject.toml"), *targets])
    assert status == 0, stdout + stderr


def test_demo_prints_paper_tables_and_lengths(capsys):
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "SpS joint law (paper Table 2)" in out and "ASpS joint law (paper Table 3)" in out
    lines = {line.split()[0]: line.split() for line in out.splitlines() if line.strip()}
    assert "2.560000" in out and "2.600000" in out
    assert lines["b"][1:] == ["0.050", "0.050", "0.000", "0.300", "0.000"]  # Table 3's row b (last table)


def test_bench_prints_ratio_table(capsys, tmp_path):
    target = tmp_path / "bench.json"
    assert main(["bench", "--n", "1,2", "--vocab", "50", "--repeat", "1", "--json", str(target)]) == 0
    out = capsys.readouterr().out
    assert "ASpS/SpS" in out and target.exists()


def test_console_script_runs_demo():
    exe = Path(sys.executable).with_name("tmc")
    if not exe.exists():
        pytest.fail(f"console script {exe} not installed: run pip install -e '.[test]'")
    out = subprocess.run([str(exe), "demo"], capture_output=True, text=True, check=True, env=os.environ)
    assert "Exact expected output length" in out.stdout


@pytest.mark.parametrize("command", ["suite", "audit", "proofs"])
def test_delegated_commands_print_their_help(command, capsys):
    try:
        code = main([command, "--help"])
    except SystemExit as err:  # argparse's own exit
        code = err.code
    assert code == 0
    assert "usage" in capsys.readouterr().out.lower()


def test_unknown_command_exits_with_usage():
    with pytest.raises(SystemExit) as err:
        main(["nope"])
    assert err.value.code == 2
