"""``python -m proofs_check`` (and ``tmc proofs``): run the theorem checks and print the report.

Exit status 0 when every check met its expectation and every negative
control detected its violation, 1 otherwise, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from proofs_check.registry import Budget
from proofs_check.report import render, write_json
from proofs_check.runner import all_checks, all_passed, run_all, select


def build_parser(prog: str = "python -m proofs_check") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Check every theorem of the TMC paper (App. A, B) and DySpec (App. D) on exact cases.",
    )
    parser.add_argument("--quick", action="store_true", help="about 1/15 of the cases (a few seconds)")
    parser.add_argument("--json", metavar="FILE", help="also write the report as JSON to FILE")
    parser.add_argument("--seed", type=int, default=0, help="base seed of the case generators (default 0)")
    parser.add_argument(
        "--only",
        metavar="ID",
        action="append",
        default=[],
        help="run only this check (and its controls); repeatable",
    )
    parser.add_argument("--list", action="store_true", help="list the check ids and exit")
    return parser


def cli_main(argv: Sequence[str] | None = None) -> int:
    """Entry point; ``argv`` excludes the program name (None: ``sys.argv[1:]``)."""
    parser = build_parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    checks = all_checks()
    if args.list:
        for c in checks:
            print(f"{c.id:<14} {c.statement}")
        return 0
    if args.seed < 0:
        parser.error(f"--seed must be >= 0, got {args.seed}")
    try:
        todo = select(checks, args.only) if args.only else checks
    except ValueError as exc:
        parser.error(str(exc))
    budget = Budget(full=not args.quick, seed=args.seed)
    outcomes = run_all(budget, todo, progress=lambda line: print(line, file=sys.stderr, flush=True))
    print(render(outcomes, budget))
    if args.json:
        write_json(outcomes, budget, args.json)
    return 0 if all_passed(outcomes) else 1
