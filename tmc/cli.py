"""The ``tmc`` command: one front door, subcommands registered by each package.

The core registers its own subcommands (:mod:`tmc.commands`: ``demo``,
``acceptance``, ``bench``); every other package registers its own through the
``tmc.commands`` entry-point group of its distribution (see
``pyproject.toml``), so this module never imports a package above the core
(DESIGN.md §2).  A registration is a function ``register(sub)`` that adds its
subcommands to the ``argparse`` subparsers object, each with
``set_defaults(func=handler)`` where ``handler(args) -> int`` is the exit
status.  Registration must be cheap: heavy imports belong in the handler.
``tmc bench`` takes extra benchmarks from the ``tmc.benchmarks`` group the
same way (:mod:`tmc.commands.bench`).

Conventions every subcommand follows (the helpers below define them once):

* ``--json`` prints one JSON object on stdout instead of the table (every subcommand that reports figures);
* ``--seed`` is a non-negative integer;
* progress goes to stderr, results to stdout;
* exit status 0 success, 1 a failed check (a bias found, a failed suite),
  2 a usage or input error, reported as one line on stderr with no traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import EntryPoint, entry_points
from typing import NoReturn

#: Entry-point group through which packages add ``tmc`` subcommands.
COMMAND_GROUP = "tmc.commands"

Handler = Callable[[argparse.Namespace], int]


class UsageError(Exception):
    """A bad command line or input file: reported as one line, exit status 2."""


class Parser(argparse.ArgumentParser):
    """``ArgumentParser`` whose errors are one line on stderr (exit status 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def nonnegative_int(text: str) -> int:
    """``argparse`` type: an integer ``>= 0``."""
    return _bounded_int(text, 0)


def positive_int(text: str) -> int:
    """``argparse`` type: an integer ``>= 1``."""
    return _bounded_int(text, 1)


def _bounded_int(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
    return value


#: Seeds are below this: numpy's and torch's generators take no larger one (``2**64`` reached torch as
#: "Overflow when unpacking long long", after the models had loaded).
SEED_LIMIT = 2**64


def seed_int(text: str) -> int:
    """``argparse`` type: a seed, an integer in ``[0, 2**64)``."""
    value = _bounded_int(text, 0)
    if value >= SEED_LIMIT:
        raise argparse.ArgumentTypeError(f"must be < 2**64, got {value}")
    return value


def probability(text: str) -> float:
    """``argparse`` type: a number in the open interval (0, 1)."""
    return _number_in(text, upper_closed=False)


def tv_distance(text: str) -> float:
    """``argparse`` type: a total variation distance in ``(0, 1]``."""
    return _number_in(text, upper_closed=True)


def _number_in(text: str, *, upper_closed: bool) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (0.0 < value < 1.0 or (upper_closed and value == 1.0)):
        interval = "(0, 1]" if upper_closed else "(0, 1)"
        raise argparse.ArgumentTypeError(f"must be in {interval}, got {text}")
    return value


def add_seed(parser: argparse.ArgumentParser, what: str = "random choices") -> None:
    """``--seed S``: the same flag, type and default in every subcommand."""
    parser.add_argument("--seed", type=seed_int, default=0, help=f"seed of the {what} (an integer from 0 to 2^64 - 1, default 0)")


def add_json(parser: argparse.ArgumentParser) -> None:
    """``--json``: the same meaning in every subcommand."""
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout instead of the table")


def build_parser() -> Parser:
    """The ``tmc`` parser with the core's subcommands and every registered package's."""
    from tmc.commands import register as register_core

    parser = Parser(prog="tmc", description="Exact kernels and checks for lossless speculative sampling.")
    sub: argparse._SubParsersAction[argparse.ArgumentParser] = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=Parser
    )
    register_core(sub)
    for ep in registered_commands():
        try:
            register: Callable[[object], None] = ep.load()
            register(sub)
        except Exception as err:  # a broken package must not take the other commands down
            print(f"tmc: the {ep.name!r} subcommands are unavailable: {_one_line(err)}", file=sys.stderr)
    return parser


def registered_commands() -> list[EntryPoint]:
    """The packages' registrations in the ``tmc.commands`` group, by name."""
    return sorted(entry_points(group=COMMAND_GROUP), key=lambda ep: ep.name)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``tmc``; returns the exit status."""
    try:
        return _dispatch(argv)
    except BrokenPipeError:  # output piped into `head` and closed early
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # what a shell reports for a process ended by SIGPIPE
    except KeyboardInterrupt:
        print("tmc: interrupted", file=sys.stderr)
        return 130


def _dispatch(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    handler: Handler = args.func
    try:
        return handler(args)
    except BrokenPipeError:
        raise
    except (UsageError, ValueError, OSError) as err:
        print(f"tmc {args.command}: {_one_line(err)}", file=sys.stderr)
        return 2
    except MemoryError:  # e.g. `bench kernels --vocab 10**12`: one line, not numpy's traceback
        print(f"tmc {args.command}: out of memory: the options ask for more than this machine holds", file=sys.stderr)
        return 2


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split()) or type(err).__name__


def fail(message: str) -> NoReturn:
    """Stop a handler with a usage error (one line on stderr, exit status 2)."""
    raise UsageError(message)


if __name__ == "__main__":
    raise SystemExit(main())
