"""``tmc proofs`` and ``python -m proofs_check``: run the theorem checks and print the report.

:func:`register` adds the ``proofs`` subcommand to the ``tmc`` command (the
``tmc.commands`` entry point); :func:`cli_main` is ``python -m proofs_check``.
Both parsers get their options from :func:`add_arguments`, and the flags
shared by every ``tmc`` subcommand (``--json``, ``--seed``) from
:mod:`tmc.cli`.  Registering imports nothing heavy: the checks, and
hypothesis with them, are imported when the command runs.

Exit status 0 when every check met its expectation and every negative
control detected its violation, 1 otherwise, 2 for a bad command line.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from tmc.cli import Parser, UsageError, add_json, add_seed, fail

PROG = "python -m proofs_check"
HELP = "check every theorem of the papers by computation"
DESCRIPTION = (
    "Check every theorem of the TMC paper (App. A, B) and DySpec (App. D) on exact cases, "
    "each with a negative control that must detect a deliberate violation. "
    "Progress goes to stderr, the report to stdout."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of the command, and its handler as ``func``."""
    parser.add_argument("--quick", action="store_true", help="about 1/15 of the cases (a few seconds)")
    add_json(parser)
    add_seed(parser, "case generators")
    parser.add_argument(
        "--only",
        metavar="ID",
        action="append",
        default=[],
        help="run only this check (and its controls); repeatable",
    )
    parser.add_argument("--list", action="store_true", help="list the check ids and exit")
    parser.set_defaults(func=run)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``tmc proofs`` to the ``tmc`` subcommands."""
    add_arguments(sub.add_parser("proofs", help=HELP, description=DESCRIPTION))


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    """The stand-alone parser of ``python -m proofs_check``."""
    parser = Parser(prog=prog, description=DESCRIPTION)
    add_arguments(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    """The command: run the selected checks, print the report (or JSON); the exit status."""
    try:
        from proofs_check.registry import Budget
        from proofs_check.report import render, to_json
        from proofs_check.runner import all_checks, all_passed, run_all, select
    except ModuleNotFoundError as err:
        fail(f"needs the test extra ({err.name} is missing): pip install -e '.[test]'")
    checks = all_checks()
    try:  # before --list too: `--list --only XYZ` listed everything and exited 0
        todo = select(checks, args.only) if args.only else checks
    except ValueError as exc:
        fail(f"{exc} (--list shows the ids)")
    if args.list:
        if args.json:
            print(json.dumps({"checks": [{"id": c.id, "statement": c.statement} for c in todo]}, indent=2))
        else:
            print("\n".join(f"{c.id:<16} {c.statement}" for c in todo))
        return 0
    budget = Budget(full=not args.quick, seed=args.seed)
    outcomes = run_all(budget, todo, progress=lambda line: print(line, file=sys.stderr, flush=True))
    print(json.dumps(to_json(outcomes, budget), indent=2) if args.json else render(outcomes, budget))
    return 0 if all_passed(outcomes) else 1


def cli_main(argv: Sequence[str] | None = None) -> int:
    """``python -m proofs_check``; ``argv`` excludes the program name (None: ``sys.argv[1:]``)."""
    parser = build_parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        return run(args)
    except UsageError as err:
        parser.error(str(err))
