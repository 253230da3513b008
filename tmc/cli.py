"""The ``tmc`` command line.

Subcommands:

* ``tmc demo`` — the TMC paper's toy example and a random toy model (exact).
* ``tmc bench`` — kernel time per step of SpS, ASpS and block verification.
* ``tmc acceptance`` — exact tokens per step of each verifier vs the LP limit.
* ``tmc suite`` — exact and calibrated statistical checks of every shipped verifier.
* ``tmc audit MODULE:FUNCTION`` — search for a draft/target pair that shows bias.
* ``tmc proofs`` — one executable check per theorem of the papers.
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
    from tmc.bench import render, render_exact, run_exact_bench, run_kernel_bench, write_json

    if args.what == "batch":
        from verification.bench_batch import render as render_batch
        from verification.bench_batch import run_batch_bench

        print("timing batch vs scalar samplers ...", file=sys.stderr)
        batch = run_batch_bench()
        print(render_batch(batch))
        if args.json:
            write_json(batch, args.json)
        return 0
    if args.what == "exact":
        print("timing exact enumerations and LP solves ...", file=sys.stderr)
        exact = run_exact_bench(seed=args.seed)
        print(render_exact(exact))
        if args.json:
            write_json(exact, args.json)
        return 0
    ns = [int(x) for x in args.n.split(",")]
    print(f"timing SpS / ASpS / block kernels for n in {ns}, V = {args.vocab} ...", file=sys.stderr)
    report = run_kernel_bench(ns, vocab=args.vocab, repeat=args.repeat, seed=args.seed)
    print(render(report))
    if args.json:
        write_json(report, args.json)
    return 0


def _parse_widths(text: str) -> list[int]:
    try:
        widths = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--tree takes comma-separated widths, got {text!r}") from None
    if not widths or any(w < 1 for w in widths):
        raise argparse.ArgumentTypeError(f"--tree widths must be positive integers, got {text!r}")
    return widths


def _cmd_acceptance(args: argparse.Namespace) -> int:
    import json

    from tmc.acceptance import chain_report, load_model, random_model, render, tree_report

    if (args.model is None) == (args.random is None):
        print("tmc acceptance: give either MODEL.json or --random V", file=sys.stderr)
        return 2
    depth = args.chain if args.chain is not None else len(args.tree)
    try:
        model = load_model(args.model) if args.model else random_model(args.random, depth, args.seed)
        if args.chain is not None:
            report = chain_report(model, args.chain)
            shape = f"chain of {args.chain}"
        else:
            report = tree_report(model, args.tree, args.draws)
            shape = f"tree widths {','.join(map(str, args.tree))}, draws {args.draws}"
    except ValueError as err:
        print(f"tmc acceptance: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"model": model.name, "shape": shape, **report}, indent=2))
    else:
        print(render(report, title=f"{model.name}, V = {model.vocab}, {shape} (exact enumeration)"))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tmc", description="Exact kernels and checks for lossless speculative sampling."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="print the paper's toy example and a random toy model")
    demo.add_argument("--seed", type=int, default=0, help="seed of the random V=4 model")
    demo.set_defaults(func=_cmd_demo)

    bench = sub.add_parser("bench", help="time the kernels per step, or the exact enumerations and LPs")
    bench.add_argument("what", nargs="?", choices=["kernels", "exact", "batch"], default="kernels")
    bench.add_argument("--n", default="1,4,16,64", help="comma-separated chain lengths")
    bench.add_argument("--vocab", type=int, default=32000, help="vocabulary size V")
    bench.add_argument("--repeat", type=int, default=5, help="best of this many repeats")
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument("--json", default="", help="also write the figures to this JSON file")
    bench.set_defaults(func=_cmd_bench)

    acc = sub.add_parser(
        "acceptance",
        help="exact tokens per step of each verifier and the LP limit on a toy model",
        description="Exact E[tokens per step] of SpS / ASpS / block / multi-draft verification "
        "on a toy model, as a percentage of the LP limit (the best any lossless verifier can do).",
    )
    acc.add_argument("model", nargs="?", help="toy model JSON file (see README); or use --random")
    shape = acc.add_mutually_exclusive_group(required=True)
    shape.add_argument("--chain", type=int, metavar="N", help="a chain of N draft tokens")
    shape.add_argument("--tree", type=_parse_widths, metavar="W1,W2,..", help="fixed tree: children per node at each depth")
    acc.add_argument("--draws", choices=["iid", "swor", "topk"], default="iid", help="how tree children are drawn")
    acc.add_argument("--random", type=int, metavar="V", help="use a built-in random model with vocabulary V")
    acc.add_argument("--seed", type=int, default=0, help="seed of --random")
    acc.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    acc.set_defaults(func=_cmd_acceptance)

    for name, (_, text) in DELEGATED.items():
        sub.add_parser(name, help=text, add_help=False)
    return parser


#: Subcommands with their own argument parsers, handed the rest of the command line.
DELEGATED = {
    "suite": ("verification.suite", "run the statistical correctness suite"),
    "audit": ("verification.audit", "audit a verifier for bias: tmc audit MODULE:FUNCTION --kind chain|tree"),
    "proofs": ("proofs_check", "check every theorem of the papers by computation"),
}


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _dispatch(argv)
    except BrokenPipeError:  # output piped into `head` and closed early
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # what a shell reports for a process ended by SIGPIPE


def _dispatch(argv: Sequence[str] | None) -> int:
    import importlib

    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list and args_list[0] in DELEGATED:
        try:
            module = importlib.import_module(DELEGATED[args_list[0]][0])
        except ModuleNotFoundError as err:
            print(
                f"tmc {args_list[0]}: needs the test extra ({err.name} is missing): pip install -e '.[test]'",
                file=sys.stderr,
            )
            return 2
        delegated: int = module.cli_main(args_list[1:])
        return delegated
    args = build_parser().parse_args(args_list)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
