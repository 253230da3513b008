"""``tmc audit``: the bias audit on the command line.

``p`` is the target's law and ``q`` the draft's (DESIGN.md §3); ``p_rows`` / ``q_rows`` hold their rows.

:func:`register` adds the subcommand to the ``tmc`` front door
(:mod:`tmc.cli`; called by :mod:`verification.cli`); :func:`cli_main` runs the
same parser standalone (``python -m verification.audit``, tests).  Options are
defined once, in :func:`add_arguments`.  Registration is cheap: this module
imports neither hypothesis nor the search; :func:`handler` does, when it runs.

Exit status: 0 no bias found within the budget, 1 biased (or the sampler does
not match its kernel), 2 usage error, reported as one line on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from tmc.cli import Parser, add_json, add_seed, positive_int, probability, tv_distance
from tmc.multidraft import ALL_DRAWS
from verification.audit.config import MAX_VOCAB_LIMIT

DESCRIPTION = (
    "Search toy draft/target models for a case on which a speculative-sampling verifier does not reproduce "
    "the target law, and print a minimal counterexample with the verifier's law next to the target's. "
    "MODULE:FUNCTION names a ChainVerifier or TreeVerifier record (audited exactly through its kernel; its "
    "sampler is then tested against the kernel) or a plain function with the chain convention "
    "f(ref, q_rows, p_rows, rng) or the tree convention f(tree, p_rows, rng), audited by calibrated "
    "sampling (give --kind). Reach: chains of 1 to 4 draft tokens on vocabularies 1 to --max-vocab "
    "(default 3) and of 5 or 6 tokens on vocabularies 1 to 2; trees of widths (1), (2), (1,1), (3), (1,2), "
    "(1,1,1), (2,1) on vocabularies 1 to --max-vocab and (2,2), (2,1,1) on vocabularies 1 to 2. "
    "Exit status 0: no bias found within the budget; 1: biased, or the sampler does not match its kernel; "
    "2: usage error."
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``audit`` to the ``tmc`` subparsers."""
    parser = sub.add_parser(
        "audit",
        help="search toy models for a draft/target pair on which a verifier is biased",
        description=DESCRIPTION,
    )
    add_arguments(parser)
    parser.set_defaults(func=handler)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``tmc audit`` (the one definition, shared by both front doors)."""
    parser.add_argument("target", metavar="MODULE:FUNCTION", help="the verifier, e.g. verification.examples:SPS")
    parser.add_argument("--kind", choices=["chain", "tree"], help="calling convention (required for plain functions)")
    parser.add_argument("--budget", type=positive_int, default=None,
                        help="cases tried in all, a hard cap (default 500 exact, 40 sampling, raised to one per cell)")
    add_seed(parser, "search and of all sampling")
    add_json(parser)
    parser.add_argument("--draw", action="append", choices=[d.value for d in ALL_DRAWS],
                        help="tree draw kind to search (repeatable; default: those the verifier is paired with)")
    parser.add_argument("--sampling", action="store_true", help="sample even when the verifier exposes a kernel")
    parser.add_argument("--max-vocab", type=vocab_size, default=3,
                        help=f"largest vocabulary searched, 1..{MAX_VOCAB_LIMIT} (default 3)")
    parser.add_argument("--tv", type=tv_distance, default=0.1,
                        help="sampling: total variation each case's test detects, in (0, 1] (default 0.1)")
    parser.add_argument("--sampler-tv", type=tv_distance, default=0.2, metavar="TV",
                        help="exact mode: total variation between a verifier's sampler and its kernel that each "
                             "sampler check detects, in (0, 1] (default 0.2; 0.1 takes about 2-3x as long, 0.05 "
                             "about 4-10x)")
    parser.add_argument("--alpha", type=probability, default=1e-6,
                        help="false-fail rate of the verdict, in (0, 1) (default 1e-6)")
    parser.add_argument("--beta", type=probability, default=1e-3,
                        help="miss probability of each calibrated test at the TV it is sized for (default 1e-3)")


def vocab_size(text: str) -> int:
    """``argparse`` type: a vocabulary size in ``1..MAX_VOCAB_LIMIT``."""
    value = positive_int(text)
    if value > MAX_VOCAB_LIMIT:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_VOCAB_LIMIT} (exhaustive enumeration), got {value}")
    return value


def handler(args: argparse.Namespace) -> int:
    """Run one audit from parsed arguments; print the report; return the exit status."""
    from verification.audit.config import AuditConfig
    from verification.audit.pipeline import audit
    from verification.audit.subject import load_target

    try:
        config = AuditConfig(
            mode="sampling" if args.sampling else "auto",
            budget=args.budget,
            seed=args.seed,
            draws=tuple(args.draw) if args.draw else None,
            max_vocab=args.max_vocab,
            tv=args.tv,
            sampler_tv=args.sampler_tv,
            alpha=args.alpha,
            beta=args.beta,
        )
        result = audit(load_target(args.target), args.kind, config)
    except ValueError as err:
        print(f"tmc audit: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    print(json.dumps(result.to_dict(), indent=2) if args.json else result.render())
    return result.exit_code


def cli_main(argv: Sequence[str] | None = None) -> int:
    """``tmc audit MODULE:FUNCTION [--kind chain|tree] [...]`` standalone; returns the exit status."""
    parser = Parser(prog="tmc audit", description=DESCRIPTION)
    add_arguments(parser)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2), already printed
        return exc.code if isinstance(exc.code, int) else 2
    return handler(args)
