"""The core's own ``tmc`` subcommands: ``demo``, ``acceptance`` and ``bench``.

Application code on top of the numpy core: nothing under ``tmc/`` outside this
subpackage (and the front door :mod:`tmc.cli`) imports it.  Each handler
imports its module when it runs, so ``tmc --help`` stays fast.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Sequence
from importlib.metadata import entry_points
from typing import Any

from tmc.cli import add_json, add_seed, fail, nonnegative_int, positive_int

#: Entry-point group through which packages add ``tmc bench`` benchmarks: each
#: entry is a function ``bench(args) -> (report dict, rendered table)``.
BENCH_GROUP = "tmc.benchmarks"
#: Entry-point group through which packages add draft kinds to ``tmc acceptance``:
#: each entry is a function ``extend(parser, shape_group) -> hook`` that adds its
#: options (its shape option to the mutually exclusive ``shape_group``) and
#: returns ``hook(args) -> int | None``: an exit status when its options were
#: given, ``None`` to leave the command to the core.
ACCEPTANCE_GROUP = "tmc.acceptance"
#: Entry-point group through which a registered benchmark adds its own options
#: to ``tmc bench``: each entry is a function ``add(parser)`` (keep it light: it
#: runs whenever the parser is built).  An option's help names the benchmarks
#: that read it ("decode: ...", "decode, verify: ..."); given a value other than
#: its default with another benchmark, it is refused (it would be ignored), and
#: an option whose help names none belongs to every benchmark.
BENCH_OPTIONS_GROUP = "tmc.bench_options"
CORE_BENCHMARKS = ("kernels", "exact", "gap")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``demo``, ``acceptance`` and ``bench`` to the ``tmc`` subparsers."""
    demo = sub.add_parser("demo", help="print the paper's toy example and a random toy model",
                          description="The TMC paper's Tables 2 and 3 and exact expected lengths on a random V = 4 model.")
    add_seed(demo, "random V = 4 model")
    add_json(demo)
    demo.set_defaults(func=_cmd_demo)
    _register_acceptance(sub)
    _register_bench(sub)


def _cmd_demo(args: argparse.Namespace) -> int:
    from tmc.commands.demo import demo_report, render_demo

    report = demo_report(seed=args.seed)
    print(json.dumps(report, indent=2) if args.json else render_demo(report))
    return 0


def _parse_widths(text: str) -> list[int]:
    try:
        widths = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--tree takes comma-separated widths, got {text!r}") from None
    if not widths or any(w < 1 for w in widths):
        raise argparse.ArgumentTypeError(f"--tree widths must be positive integers, got {text!r}")
    return widths


def _register_acceptance(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    acc = sub.add_parser(
        "acceptance",
        help="exact tokens per step of each verifier and the LP limit on a toy model",
        description="Exact E[tokens per step] of SpS / ASpS / block verification (chains) and of "
        "multi-draft residual, Traversal and K-SEQ verification (trees; K-SEQ on i.i.d. trees) on a toy "
        "model, as a percentage of the LP limit (the best any lossless verifier can do).",
    )
    acc.add_argument("model", nargs="?", help="toy model JSON file (see README); or use --random")
    shape = acc.add_mutually_exclusive_group(required=True)
    shape.add_argument("--chain", type=nonnegative_int, metavar="N", help="a chain of N draft tokens")
    shape.add_argument("--tree", type=_parse_widths, metavar="W1,W2,..", help="fixed tree: children per node at each depth")
    acc.add_argument("--draw", "--draws", dest="draw", choices=["iid", "swor", "topk"], default=None,
                     help="--tree: how tree children are drawn (default iid)")
    acc.add_argument("--random", type=positive_int, metavar="V", help="use a built-in random model with vocabulary V")
    add_seed(acc, "--random model")
    add_json(acc)
    hooks = []
    for ep in sorted(entry_points(group=ACCEPTANCE_GROUP), key=lambda ep: ep.name):
        try:
            hooks.append(ep.load()(acc, shape))
        except Exception as err:  # a broken package must not take the command down
            print(f"tmc: the {ep.name!r} acceptance options are unavailable: {' '.join(str(err).split())}", file=sys.stderr)
    acc.set_defaults(func=_cmd_acceptance, acceptance_hooks=hooks)


#: The most draft chains ``tmc acceptance --chain N`` enumerates: all ``V ** N`` token sequences are visited
#: (and ``--random V`` builds rows for as many prefixes), so beyond this the command would run for hours or
#: exhaust the memory instead of answering.
MAX_CHAIN_SEQUENCES = 10**6


#: The longest ``--chain`` and the deepest ``--tree`` (a V = 1 chain of 10**5 tokens ran out of memory,
#: a tree enumeration recurses once per level).
MAX_DEPTH = 100
#: The most probabilities a ``--random V`` model may hold: two rows of ``V`` for every prefix up to the
#: shape's depth, ``~2 V^(depth + 1)`` numbers (``--random 100000 --chain 1`` asked for 2e10).
MAX_RANDOM_ENTRIES = 10**8
#: The most (prefix, token) cells up to the shape's depth, ``Σ_{d ≤ depth} V^(d + 1)``: the LP limit has about
#: that many variables and each draft's rows that many entries.  Measured on this 2-core machine: 2.6e5 cells
#: (``--random 3 --chain 10``) 68 s and 0.4 GB, 9e4 (``--random 300 --chain 1``) 34 s; ``--random 7000
#: --chain 1`` (4.9e7) filled 8 GB in a minute, and a 1e5-token model file took all 23 GB until killed.
MAX_LP_CELLS = 300_000


def _check_chain_count(vocab: int, n: int) -> None:
    if n > MAX_DEPTH:
        fail(f"--chain {n}: at most {MAX_DEPTH} tokens")
    if vocab > 1 and n * math.log10(vocab) > math.log10(MAX_CHAIN_SEQUENCES):
        fail(f"--chain {n} with V = {vocab} enumerates V ** N = {vocab}**{n} token sequences; exact enumeration "
             f"takes at most {MAX_CHAIN_SEQUENCES:,} (shorten the chain)")


def _check_tree_count(vocab: int, widths: Sequence[int], draw: str, flag: str = "--tree") -> None:
    """``fail`` when the tree shape has more draft trees than :data:`MAX_CHAIN_SEQUENCES` (``--tree 4,4``: 3.5e9)."""
    if len(widths) > MAX_DEPTH:
        fail(f"--tree has {len(widths)} levels: at most {MAX_DEPTH}")
    log_trees, parents = 0.0, 1
    for w in widths:  # log10 of the children's draws at one node, times the nodes of the level above
        if draw == "iid":
            per_node = w * math.log10(vocab)
        elif draw == "swor":
            per_node = math.log10(math.perm(vocab, min(w, vocab)))  # a node draws at most V children
        else:  # topk: one way
            per_node = 0.0
        log_trees += parents * per_node
        parents *= w
    if log_trees > math.log10(MAX_CHAIN_SEQUENCES):
        fail(f"{flag} {','.join(map(str, widths))} drawn {draw} with V = {vocab} has about 10^{log_trees:.1f} draft "
             f"trees; exact enumeration takes at most {MAX_CHAIN_SEQUENCES:,} (a smaller tree or V)")


def _check_lp_size(vocab: int, depth: int, what: str) -> None:
    """``fail`` when the LP limit and the drafts' rows would hold more than :data:`MAX_LP_CELLS` cells."""
    from tmc.laws import completion_cells

    cells = completion_cells(vocab, depth)
    if cells > MAX_LP_CELLS:
        fail(f"{what} with V = {vocab} has about {cells:.3g} (prefix, token) cells up to depth {depth}, the size of "
             f"the LP limit; at most {MAX_LP_CELLS:,} (about a minute on 2 cores; a smaller V or shape)")


def _shape_flag(args: argparse.Namespace) -> str:
    return f"--chain {args.chain}" if args.chain is not None else f"--tree {','.join(map(str, args.tree))}"


def _check_random_size(vocab: int, depth: int) -> None:
    if math.log10(2 * vocab) + depth * math.log10(vocab) > math.log10(MAX_RANDOM_ENTRIES):
        fail(f"--random {vocab} at depth {depth} holds about 2 V^(depth + 1) probabilities; at most "
             f"{MAX_RANDOM_ENTRIES:,} (a smaller V or shape)")


def _cmd_acceptance(args: argparse.Namespace) -> int:
    from tmc.commands.acceptance import chain_report, random_model, render, tree_report
    from tmc.toy import load_model

    for hook in args.acceptance_hooks:
        status = hook(args)
        if status is not None:
            return int(status)
    if (args.model is None) == (args.random is None):
        fail("give either MODEL.json or --random V")
    if args.chain is not None and args.draw is not None:
        fail("--draw goes with --tree: a chain's tokens are drawn one per position")
    depth = args.chain if args.chain is not None else len(args.tree)
    draw = args.draw or "iid"
    if args.random is not None:  # a model file's vocabulary is checked once it is read
        if args.chain is not None:
            _check_chain_count(args.random, args.chain)
        else:
            _check_tree_count(args.random, args.tree, draw)
        _check_random_size(args.random, depth)
        _check_lp_size(args.random, depth, _shape_flag(args))
    model = load_model(args.model) if args.model else random_model(args.random, depth, args.seed)
    _check_lp_size(model.vocab, depth, _shape_flag(args))
    if args.chain is not None:
        _check_chain_count(model.vocab, args.chain)
        report = chain_report(model, args.chain)
        shape = f"chain of {args.chain}"
    else:
        _check_tree_count(model.vocab, args.tree, draw)
        report = tree_report(model, args.tree, draw)
        shape = f"tree widths {','.join(map(str, args.tree))}, draws {draw}"
    if args.json:
        print(json.dumps({"model": model.name, "shape": shape, **report}, indent=2))
    else:
        print(render(report, title=f"{model.name}, V = {model.vocab}, {shape} (exact enumeration)"))
    return 0


def _register_bench(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    extra = sorted(ep.name for ep in entry_points(group=BENCH_GROUP))
    bench = sub.add_parser(
        "bench",
        help="time the kernels per step, the exact enumerations and LPs, or a registered benchmark",
        description="Benchmarks print figures, never assert them: kernels (SpS/ASpS/block time per step), "
        "exact (enumeration and LP wall times), gap (each tree verifier's % below the LP limit on a fixed "
        "set of random toy models)" + "".join(f", {name}" for name in extra) + ".",
    )
    bench.add_argument("what", nargs="?", choices=[*CORE_BENCHMARKS, *extra], default="kernels")
    bench.add_argument("--n", default="1,4,16,64", help="kernels: comma-separated chain lengths (default 1,4,16,64)")
    bench.add_argument("--vocab", type=positive_int, default=32000, help="kernels: vocabulary size V (default 32000)")
    bench.add_argument("--repeat", type=positive_int, default=5, help="kernels: best of this many repeats (default 5)")
    bench.add_argument("--models", type=positive_int, default=20, help="gap: random toy models per row (default 20)")
    bench.add_argument("--gap-vocab", default="3,4", help="gap: comma-separated vocabulary sizes (default 3,4)")
    add_seed(bench, "benchmark inputs")
    add_json(bench)
    for ep in sorted(entry_points(group=BENCH_OPTIONS_GROUP), key=lambda ep: ep.name):
        try:
            ep.load()(bench)
        except Exception as err:  # a broken package must not take the command down
            print(f"tmc: the {ep.name!r} bench options are unavailable: {' '.join(str(err).split())}", file=sys.stderr)
    owners = _option_owners(bench)
    bench.set_defaults(func=lambda args: _cmd_bench(args, owners))


def _option_owners(parser: argparse.ArgumentParser) -> list[tuple[argparse.Action, frozenset[str]]]:
    """The options of ``tmc bench`` that only some benchmarks read, each with those benchmarks' names, read off
    the start of its help (``"kernels: ..."``, ``"decode, verify: ..."``; :data:`BENCH_OPTIONS_GROUP`)."""
    out = []
    for action in parser._actions:
        found = re.match(r"([a-z][a-z-]*(?:, [a-z][a-z-]*)*): ", action.help or "")
        if action.option_strings and found:
            out.append((action, frozenset(found.group(1).split(", "))))
    return out


def _refuse_foreign_options(args: argparse.Namespace, owners: list[tuple[argparse.Action, frozenset[str]]]) -> None:
    """``fail`` naming each option given a value that ``args.what`` would not read (it was silently ignored)."""
    foreign = [
        f"{action.option_strings[0]} (read by {', '.join(sorted(names))})"
        for action, names in owners
        if args.what not in names and getattr(args, action.dest, action.default) != action.default
    ]
    if foreign:
        fail(f"{args.what} would ignore {'; '.join(foreign)}")


def _chain_lengths(text: str, flag: str = "--n", minimum: int = 0) -> list[int]:
    try:
        ns = [int(x) for x in text.split(",")]
    except ValueError:
        fail(f"{flag} takes comma-separated integers, got {text!r}")
    if not ns or any(n < minimum for n in ns):
        fail(f"{flag} values must be integers >= {minimum}, got {text!r}")
    return ns


def _cmd_bench(args: argparse.Namespace, owners: list[tuple[argparse.Action, frozenset[str]]] | None = None) -> int:
    from tmc.commands import bench

    _refuse_foreign_options(args, owners or [])
    report: dict[str, Any]
    if args.what == "kernels":
        ns = _chain_lengths(args.n)
        print(f"timing SpS / ASpS / block kernels for n in {ns}, V = {args.vocab} ...", file=sys.stderr)
        report = bench.run_kernel_bench(ns, vocab=args.vocab, repeat=args.repeat, seed=args.seed)
        text = bench.render(report)
    elif args.what == "gap":
        vocabs = _chain_lengths(args.gap_vocab, "--gap-vocab", minimum=1)
        for vocab in vocabs:  # each row enumerates as `tmc acceptance --tree` does: the same limits, per model
            for shape in bench.GAP_SHAPES:
                for draw in ("iid", "swor", "topk"):
                    _check_tree_count(vocab, shape, draw, flag=f"--gap-vocab {vocab}: its tree")
                _check_lp_size(vocab, len(shape), f"--gap-vocab {vocab}: its tree {','.join(map(str, shape))}")
        print(f"exact E[len] of every tree verifier and the LP limit, V in {vocabs}, {args.models} models per row ...", file=sys.stderr)
        report = bench.run_gap_bench(vocabs, args.models, progress=lambda m: print(m, file=sys.stderr), seed=args.seed)
        text = bench.render_gap(report)
    elif args.what == "exact":
        print("timing exact enumerations and LP solves ...", file=sys.stderr)
        report = bench.run_exact_bench(seed=args.seed)
        text = bench.render_exact(report)
    else:
        (ep,) = [ep for ep in entry_points(group=BENCH_GROUP) if ep.name == args.what]
        report, text = ep.load()(args)
    print(json.dumps(report, indent=2) if args.json else text)
    return 1 if report.get("save_error") else 0  # a benchmark whose --save failed (its table is printed)
