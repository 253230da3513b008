"""``tmc suite`` and ``tmc audit``: the verification package's subcommands.

Registered with the ``tmc`` command through the ``tmc.commands`` entry-point
group (``pyproject.toml``), so the core never imports this package.  Options
are defined here once; handlers import the heavy modules (scipy, hypothesis)
only when they run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tmc.cli import add_json, add_seed, fail, probability, tv_distance


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``suite`` and ``audit`` to the ``tmc`` subparsers."""
    from verification.audit.cli import register as register_audit

    _register_suite(sub)
    register_audit(sub)


def _register_suite(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    suite = sub.add_parser(
        "suite",
        help="run the statistical correctness suite of every shipped verifier",
        description="For every shipped verifier over a fixed table of toy models and draft shapes: "
        "an exact completion-identity check, and a calibrated test of sampled steps "
        "against the exact output law. Exit 0: every lossless verifier passes; 1: a failure.",
    )
    suite.add_argument("--false-fail", type=probability, default=1e-9, metavar="RATE",
                       help="family-wise false-fail rate, split over the statistical checks (default 1e-9)")
    suite.add_argument("--tv", type=tv_distance, default=0.05, metavar="TV",
                       help="total variation each statistical check must detect (default 0.05)")
    suite.add_argument("--test", choices=("kl-bound", "chi2"), default="kl-bound",
                       help="kl-bound (default): false-fail rate and power are finite-sample bounds (Agrawal's "
                       "KL concentration; 2-6 times the samples); chi2: Pearson's chi-square, rates asymptotic, power on the bins "
                       "of cells merged to >= 5 expected samples")
    add_seed(suite, "models table and of all sampling")
    suite.add_argument("--include-biased", action="store_true", help="also run the shipped BIASED examples (they must fail)")
    suite.add_argument("--quick", action="store_true", help="two models, one shape each (for tests)")
    add_json(suite)
    suite.add_argument("--plot", metavar="FILE.png", default="", help="write a PNG of exact vs empirical marginals (needs matplotlib)")
    suite.set_defaults(func=_cmd_suite)


def _cmd_suite(args: argparse.Namespace) -> int:
    from verification.suite import SuiteConfig, failures, missed_biases, render, run_suite, to_json, write_plot

    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            fail("--plot needs matplotlib: pip install 'tmc-spec[plot]'")
        folder = Path(args.plot).parent  # checked before the run, not after it
        if not folder.is_dir() or Path(args.plot).is_dir():
            fail(f"--plot {args.plot}: {'is a folder' if Path(args.plot).is_dir() else f'no folder {str(folder)!r}'}")
    config = SuiteConfig(args.false_fail, args.tv, args.seed, args.include_biased, args.quick, args.test)
    rows = run_suite(config, progress=lambda m: print(m, file=sys.stderr))
    print(json.dumps(to_json(rows, config), indent=2) if args.json else render(rows, config))
    if args.plot:
        write_plot(rows, args.plot)
    return 1 if failures(rows) or missed_biases(rows) else 0
