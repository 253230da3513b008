"""The ``tmc`` command line.

Subcommands:

* ``tmc demo`` — the TMC paper's toy example and a random toy model (exact).
* ``tmc bench`` — kernel time per step of SpS, ASpS and block verification.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _cmd_demo(args: argparse.Namespace) -> int:
    from tmc.demo import run_demo

    print(run_demo(seed=args.seed))
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from tmc.bench import render, run_kernel_bench, write_json

    ns = [int(x) for x in args.n.split(",")]
    print(f"timing SpS / ASpS / block kernels for n in {ns}, V = {args.vocab} ...", file=sys.stderr)
    report = run_kernel_bench(ns, vocab=args.vocab, repeat=args.repeat, seed=args.seed)
    print(render(report))
    if args.json:
        write_json(report, args.json)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tmc", description="Exact kernels and checks for lossless speculative sampling."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="print the paper's toy example and a random toy model")
    demo.add_argument("--seed", type=int, default=0, help="seed of the random V=4 model")
    demo.set_defaults(func=_cmd_demo)

    bench = sub.add_parser("bench", help="time SpS / ASpS / block kernels per step")
    bench.add_argument("--n", default="1,4,16,64", help="comma-separated chain lengths")
    bench.add_argument("--vocab", type=int, default=32000, help="vocabulary size V")
    bench.add_argument("--repeat", type=int, default=5, help="best of this many repeats")
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument("--json", default="", help="also write the figures to this JSON file")
    bench.set_defaults(func=_cmd_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
