"""The package layering of DESIGN.md §2, checked on the source (issue 9).

* nothing under ``tmc/`` imports ``verification``, ``proofs_check`` or ``spec``,
  statically or through an ``importlib`` string (any string literal naming one
  of them as a module counts);
* inside ``tmc/`` the core modules do not import the command layer
  (``tmc.cli``, ``tmc.commands``);
* ``verification`` imports only ``tmc`` among our packages;
* ``proofs_check`` imports ``tmc`` and ``verification`` (its package docstring
  says why) and never ``spec``;
* ``tmc`` offers every subcommand through the registry, not through imports.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OURS = ("tmc", "verification", "proofs_check", "spec")
MODULE_STRING = re.compile(r"^(tmc|verification|proofs_check|spec)(\.[A-Za-z_]\w*)*(:[\w.]+)?$")


def _imports(path: Path) -> set[str]:
    """Top-level packages of ours that ``path`` imports, plus module-like string literals."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and MODULE_STRING.match(node.value):
            found.add(node.value.split(":")[0])
    return {name for name in found if name.split(".")[0] in OURS}


def _sources(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def _offending(package: str, allowed: set[str]) -> list[str]:
    bad = []
    for path in _sources(package):
        for name in _imports(path):
            if name.split(".")[0] not in allowed:
                bad.append(f"{path.relative_to(ROOT)} imports {name}")
    return bad


def test_the_scan_sees_static_and_string_imports(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import importlib\nfrom verification.audit import audit\nimportlib.import_module('proofs_check')\n"
        "X = 'spec.builders:fixed'\nY = 'special words, not a module'\n",
        encoding="utf-8",
    )
    assert _imports(probe) == {"verification.audit", "proofs_check", "spec.builders"}


def test_core_imports_nothing_above_it():
    assert _offending("tmc", {"tmc"}) == []


def test_core_modules_do_not_import_the_command_layer():
    bad = []
    for path in _sources("tmc"):
        rel = path.relative_to(ROOT).as_posix()
        if rel == "tmc/cli.py" or rel.startswith("tmc/commands/"):
            continue
        bad += [f"{rel} imports {n}" for n in _imports(path) if n == "tmc.cli" or n.startswith("tmc.commands")]
    assert bad == []


def test_verification_imports_only_the_core():
    assert _offending("verification", {"tmc", "verification"}) == []


def test_spec_imports_only_the_core():
    assert _offending("spec", {"tmc", "spec"}) == []


def test_proofs_check_imports_core_and_says_why_it_uses_verification():
    assert _offending("proofs_check", {"tmc", "verification", "proofs_check"}) == []
    uses_verification = any(n.startswith("verification") for p in _sources("proofs_check") for n in _imports(p))
    if uses_verification:
        doc = ast.get_docstring(ast.parse((ROOT / "proofs_check" / "__init__.py").read_text(encoding="utf-8"))) or ""
        assert "verification" in doc, "proofs_check/__init__.py must say why it imports verification"


@pytest.mark.parametrize("command", ["demo", "acceptance", "bench", "suite", "audit", "proofs"])
def test_every_subcommand_is_registered(command):
    from tmc.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert command in sub.choices  # type: ignore[attr-defined]


def test_other_packages_register_through_entry_points():
    from tmc.cli import COMMAND_GROUP, registered_commands

    names = {ep.name for ep in registered_commands()}
    assert {"verification", "proofs_check"} <= names, f"{COMMAND_GROUP} entry points: {names}"


def test_modules_with_probability_rows_say_which_is_the_target():
    """DESIGN.md §3: ``p`` is the target, ``q`` the draft; "say so in each module docstring".  Every module that
    handles ``p_rows`` or ``q_rows`` does (a DESIGN audit of 2026-11-28 found seven that did not)."""
    target = re.compile(r"``p``[^.]*\btarget|\btarget\b[^.]*``p[`(]")
    draft = re.compile(r"``q``[^.]*\bdraft|\bdraft\b[^.]*``q[`(]")
    silent = []
    for package in OURS:
        for path in _sources(package):
            source = path.read_text(encoding="utf-8")
            if re.search(r"\b[pq]_rows\b", source):
                doc = ast.get_docstring(ast.parse(source)) or ""
                if not (target.search(doc) and draft.search(doc)):
                    silent.append(str(path.relative_to(ROOT)))
    assert not silent, silent
