"""``spec``'s part of the ``tmc`` command (registered through entry points, DESIGN.md §2).

* ``tmc acceptance MODEL.json --builder NAME --budget B [--verifier NAME|all] [--json]``:
  expected tokens per step of a tree builder with the lossless tree verifiers,
  exact where the builder's randomness enumerates, else Monte Carlo with a 95%
  interval, next to the LP limit of the same draft law (added to the core's
  ``acceptance`` command through the ``tmc.acceptance`` group);
* ``tmc bench masks``: DySpec App. C's block count of the tree attention mask
  in DFS vs BFS order (the ``tmc.benchmarks`` group, :mod:`spec.bench_masks`).

Registration only adds options; the work is imported when a handler runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Callable

from tmc.cli import fail, positive_int

#: Builder names on the command line (equal to ``spec.builders.BUILDERS``; a test checks).
BUILDER_NAMES = ("chain", "fixed", "dyspec", "dyspec-threshold", "dynatree", "wetap")


def _param(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"--param takes KEY=VALUE, got {text!r}")
    try:
        parsed: Any = json.loads(value)
    except json.JSONDecodeError:
        parsed = value  # a bare word such as swor
    return key.replace("-", "_"), parsed


def extend_acceptance(
    parser: argparse.ArgumentParser, shape: argparse._MutuallyExclusiveGroup
) -> Callable[[argparse.Namespace], int | None]:
    """Add ``--builder`` (a shape), ``--budget``, ``--verifier``, ``--param`` and the Monte Carlo options."""
    shape.add_argument("--builder", choices=BUILDER_NAMES, metavar="NAME",
                       help=f"a tree builder of spec: {', '.join(BUILDER_NAMES)} (needs --budget)")
    parser.add_argument("--budget", type=positive_int, metavar="B", help="--builder: node budget of the draft tree")
    parser.add_argument("--verifier", default=None, metavar="NAME",
                        help="--builder: tree verifier (multidraft = residual, the default; traversal, "
                        "ordered_traversal, kseq) or 'all' for every lossless one")
    parser.add_argument("--param", type=_param, action="append", default=[], metavar="KEY=VALUE",
                        help="--builder: a builder parameter (repeatable), e.g. --param width=3 --param draw=iid")
    parser.add_argument("--samples", type=positive_int, default=2000,
                        help="--builder: sampled trees when the exact enumeration is too large (default 2000)")
    parser.add_argument("--max-runs", type=positive_int, default=20_000,
                        help="--builder: largest exact enumeration, in builder runs (default 20000)")
    if parser.description:
        parser.description += (" With --builder, the same for the trees a tree builder of spec draws "
                               "(DySpec, DynaTree, WETAP, fixed, chain).")
    return _acceptance_hook


def _acceptance_hook(args: argparse.Namespace) -> int | None:
    if args.builder is None:
        if args.budget is not None or args.verifier is not None or args.param:
            fail("--budget, --verifier and --param go with --builder")
        return None
    if args.budget is None:
        fail("--builder needs --budget B")
    if (args.model is None) == (args.random is None):
        fail("give either MODEL.json or --random V")
    from spec.acceptance import builder_report, random_stationary_model, render_builder_report
    from spec.builders import make_builder
    from tmc.toy import load_model

    model = load_model(args.model) if args.model else random_stationary_model(args.random, args.seed)
    builder = make_builder(args.builder, **dict(args.param))
    verifier = args.verifier or "multidraft"
    print(f"{builder.name}, budget {args.budget}: enumerating the builder's trees ...", file=sys.stderr)
    report = builder_report(model, builder, args.budget, verifier, max_runs=args.max_runs, samples=args.samples, seed=args.seed)
    entries = report["entries"]
    if args.json:
        out = {"model": model.name, "vocab": model.vocab, "budget": args.budget, "exact": report["exact"],
               "trees": report["trees"], builder.name: entries if verifier == "all" else entries[0], "lp": report["lp"]}
        print(json.dumps(out, indent=2))
    else:
        print(render_builder_report(report, model))
    return 0
