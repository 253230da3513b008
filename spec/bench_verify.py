"""``tmc bench verify``: a chain verifier on the device (torch port) against the numpy reference on host copies.

A chain drafted on the model's device can be verified where its rows are
(:func:`spec.llm.verify.verify_chain_on_device`: a few hundred small torch
operations and one transfer of the result) or on host copies of the rows
(:func:`spec.llm.host_verify.verify_chain_numpy`: one copy of the draft and
target rows, then numpy).  The first costs about the same for any vocabulary;
the second grows with the rows it copies and reads.  This benchmark times both
the way the decode loop calls them (rows already on the device, ``trusted``
verifiers), for each vocabulary size ``V`` and row count ``k + 1`` (a chain of
``k`` draft tokens), on random rows, and checks that both accept the same
number of tokens.  ``generate``'s ``verify_backend="auto"`` picks between them
by the size of the target rows (:func:`spec.llm.generate.resolve_verify_backend`);
the ``auto`` column says what it picks for that shape on that device.

A second table does the same for the fixed-shape trees the decode loop
drafts on the device (:class:`spec.builders.FixedBuilder`'s full trees of
``--budgets`` nodes, two children a node, drawn i.i.d.) and the tree verifiers
with a device walk (:mod:`spec.llm.tree_device`): ``device`` is
:func:`~spec.llm.tree_device.tree_head` and one transfer of its result, ``host``
the torch port's host walk after one copy of the rows
(:func:`spec.llm.verify.verify_tree`), ``numpy`` the reference on host copies
as ``generate``'s numpy backend calls it.  All three must give the same
tokens.  ``ops`` counts the torch operations the device walk dispatches
(:func:`spec.llm.opcount.count_ops`): on a GPU each launches a kernel, unless
the step is captured in a graph.  ``--compile`` adds a column for the device
walk through ``torch.compile`` (inductor, whole graph, fixed shapes), which
fuses those operations into a few kernels; its compile time is not counted.

Run as ``tmc bench verify`` (``--device cuda``, ``--vocabs``, ``--rows``,
``--budgets``, ``--calls``), or ``python -m spec.bench_verify`` without an
installed package.  Figures are medians of ``--calls`` timed calls after one
untimed call, with the device synchronised before each.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = ["add_options", "bench", "main", "render", "run_tree_verify_bench", "run_verify_bench"]

METHODS = ("sps", "asps", "block")
DEFAULT_VOCABS = (4096, 32000, 128256)
DEFAULT_ROWS = (5, 21)
DEFAULT_BUDGETS = (7, 15, 31)
TREE_METHODS = ("multidraft", "traversal", "ordered_traversal", "kseq")  # the device-walked ones (spec.llm.tree_device)


def _positive_list(name: str, text: str, minimum: int = 1) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",")]
    except ValueError:
        raise ValueError(f"{name} takes comma-separated integers, got {text!r}") from None
    if not vals or any(v < minimum for v in vals):
        raise ValueError(f"{name} must hold integers >= {minimum}, got {text!r}")
    return vals


#: The most probabilities (rows × V) one cell of the command's tables may hold: 2 GiB of float64.
MAX_CELL_ENTRIES = 1 << 28


def _check_cells(vocabs: Sequence[int], methods: Sequence[str], known: tuple[str, ...], calls: int) -> None:
    """``ValueError`` for the arguments both tables share."""
    if not vocabs or any(not isinstance(v, int) or v < 1 for v in vocabs):
        raise ValueError(f"vocabs must be positive integers, got {list(vocabs)!r}")
    if not methods or any(m not in known for m in methods):
        raise ValueError(f"methods must be among {known}, got {list(methods)!r}")
    if not isinstance(calls, int) or calls < 1:
        raise ValueError(f"calls must be a positive integer, got {calls!r}")


def run_verify_bench(
    device: str | None = "cpu",
    vocabs: Sequence[int] = DEFAULT_VOCABS,
    rows: Sequence[int] = DEFAULT_ROWS,
    methods: Sequence[str] = ("sps", "block"),
    calls: int = 200,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Median milliseconds per verification, torch on the device and numpy on host copies (module doc).

    ``device``: a torch device name (``None``: cuda when torch sees one, else cpu).
    One report row per ``(V, rows, method)``: ``torch_ms``, ``numpy_ms``,
    ``accepted`` (the same for both, checked) and ``auto`` (the backend
    ``generate`` picks for a chain of ``rows - 1`` tokens drafted on
    ``device`` with vocabulary ``V``).
    """
    import torch

    from spec.llm.generate import resolve_verify_backend
    from spec.llm.host_verify import verify_chain_numpy
    from spec.llm.models import parse_device
    from spec.llm.verify import noise_size, verify_chain_on_device

    if not rows or any(not isinstance(n, int) or n < 2 for n in rows):
        raise ValueError(f"rows must be integers >= 2 (a chain of rows - 1 tokens), got {list(rows)!r}")
    _check_cells(vocabs, methods, METHODS, calls)
    dev = parse_device(device)
    sync = _syncer(dev)
    class _OnDevice:  # resolve_verify_backend reads the device of a model's first parameter
        def parameters(self) -> Any:
            yield torch.empty(0, device=dev)

    model = _OnDevice()
    gen = torch.Generator(device="cpu").manual_seed(seed)
    rng = np.random.default_rng(seed)
    out: list[dict[str, Any]] = []
    for vocab in vocabs:
        for n_rows in rows:
            k = n_rows - 1
            q = torch.softmax(3 * torch.randn(k, vocab, generator=gen, dtype=torch.float64), -1)
            p = torch.softmax(3 * torch.randn(n_rows, vocab, generator=gen, dtype=torch.float64), -1)
            tokens = torch.multinomial(q, 1, generator=gen)[:, 0]
            q, p, tokens = q.to(dev), p.to(dev), tokens.to(dev)
            fault = torch.zeros((), dtype=torch.bool, device=dev)
            for method in methods:
                u = rng.random(noise_size(method, k))

                def on_device(method: str = method, u: Any = u) -> int:
                    res, _ = verify_chain_on_device(method, tokens, q, p, torch.from_numpy(u).to(dev), fault,
                                                    trusted=True)
                    assert res is not None
                    return res.n_accepted

                def on_host(method: str = method, u: Any = u) -> int:  # as _chain_step's numpy branch
                    got = torch.cat([fault.to(torch.int64).reshape(1), tokens]).tolist()
                    return verify_chain_numpy(method, got[1:], q.cpu().numpy(), p.cpu().numpy(), u,
                                              trusted=True).n_accepted

                accepted = on_device()
                if on_host() != accepted:
                    raise RuntimeError(f"torch and numpy disagree on {method} at V = {vocab}, {n_rows} rows")
                times = {name: _median_ms(fn, calls, sync) for name, fn in (("torch", on_device), ("numpy", on_host))}
                row = {"vocab": vocab, "rows": n_rows, "method": method, "torch_ms": times["torch"],
                       "numpy_ms": times["numpy"], "accepted": accepted,
                       "auto": resolve_verify_backend(model, "auto", True, n_rows * vocab)}
                out.append(row)
                if progress:
                    progress(f"  V={vocab} rows={n_rows} {method}: torch {times['torch']:.3f} ms, "
                             f"numpy {times['numpy']:.3f} ms")
    return {"device": str(dev), "torch": torch.__version__, "calls": calls, "seed": seed, "rows": out}


def _syncer(dev: Any) -> Callable[[], None]:
    import torch

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    return sync


def _median_ms(fn: Callable[[], object], calls: int, sync: Callable[[], None]) -> float:
    """Median milliseconds of ``calls`` timed calls of ``fn``, the device synchronised before each."""
    ts = []
    for _ in range(calls):
        sync()
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(ts)


def run_tree_verify_bench(
    device: str | None = "cpu",
    vocabs: Sequence[int] = DEFAULT_VOCABS,
    budgets: Sequence[int] = DEFAULT_BUDGETS,
    methods: Sequence[str] = TREE_METHODS,
    calls: int = 200,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
    compile_backend: str | None = None,
) -> list[dict[str, Any]]:
    """Median milliseconds per tree verification: the device walk, the torch host walk, numpy (module doc).

    One row per ``(V, budget, method)``: ``device_ms``, ``host_ms``, ``numpy_ms``, ``accepted`` (the same
    for all three, checked) and ``ops`` (operations the device walk dispatches); with a
    ``compile_backend``, also ``compiled_ms``: the device walk through ``torch.compile`` with that backend
    (same tokens, checked).
    """
    import torch

    from spec.builders import FixedBuilder
    from spec.llm.host_verify import verify_tree_numpy
    from spec.llm.models import parse_device
    from spec.llm.opcount import count_ops
    from spec.llm.step_graph import _compiled
    from spec.llm.tree_device import TreePlan, read_head, tree_head
    from spec.llm.verify import verify_tree
    from tmc.multidraft import DraftTree, Draw

    if not budgets or any(not isinstance(b, int) or b < 1 for b in budgets):
        raise ValueError(f"budgets must be positive integers (tree nodes), got {list(budgets)!r}")
    _check_cells(vocabs, methods, TREE_METHODS, calls)
    if compile_backend is not None and not isinstance(compile_backend, str):
        raise ValueError(f"compile_backend must be None or a torch.compile backend name, got {compile_backend!r}")
    dev = parse_device(device)
    sync = _syncer(dev)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    rng = np.random.default_rng(seed)
    out: list[dict[str, Any]] = []
    for vocab in vocabs:
        for budget in budgets:
            parents = FixedBuilder(width=2).full_shape(budget)
            n = len(parents)
            logits = 3 * torch.randn(n + 1, vocab, generator=gen, dtype=torch.float64)
            q = torch.softmax(logits, -1)
            p = torch.softmax(logits + torch.randn(n + 1, vocab, generator=gen, dtype=torch.float64), -1)
            drawn = torch.multinomial(q[[par + 1 for par in parents]], 1, generator=gen)[:, 0]
            q_dev, p_dev, tok_dev = q.to(dev), p.to(dev), drawn.to(dev)
            plan = TreePlan.of(parents, Draw.IID, dev)
            sampled = sorted(set(parents))
            for method in methods:
                u = rng.random(n + 1)
                u_dev = torch.from_numpy(u).to(dev)

                def walk(head_of: Callable[..., Any]) -> list[int]:  # as generate's _tree_step with a plan
                    head = head_of(tok_dev, q_dev, p_dev, u_dev)[1:]
                    got = torch.cat([head, tok_dev]).tolist()
                    return read_head(got[: head.shape[0]], got[head.shape[0]:]).tokens.tolist()

                eager = functools.partial(tree_head, method, plan, trusted=True)
                on_device = functools.partial(walk, eager)

                def on_host(method: str = method, u: Any = u) -> list[int]:
                    tokens = tok_dev.tolist()
                    return verify_tree(method, tokens, parents, Draw.IID, q_dev, p_dev, u).tokens.tolist()

                def on_numpy(method: str = method, u: Any = u) -> list[int]:  # as _tree_step's numpy branch
                    tokens = tok_dev.tolist()
                    q_np = q_dev.cpu().numpy()
                    tree = DraftTree(parents, tuple(tokens), (Draw.IID,) * n, {v: q_np[v + 1] for v in sampled}, vocab)
                    return verify_tree_numpy(method, tree, p_dev.cpu().numpy(), u).tokens.tolist()

                got, ops = count_ops(on_device)
                if on_host() != got or on_numpy() != got:
                    raise RuntimeError(f"the tree walks disagree on {method} at V = {vocab}, budget {budget}")
                runs: list[tuple[str, Callable[[], object]]] = [
                    ("device", on_device), ("host", on_host), ("numpy", on_numpy)]
                if compile_backend is not None:
                    on_compiled = functools.partial(walk, _compiled(eager, compile_backend))
                    if on_compiled() != got:  # the first call compiles
                        raise RuntimeError(f"the compiled walk disagrees on {method} at V = {vocab}, budget {budget}")
                    runs.append(("compiled", on_compiled))
                times = {name: _median_ms(fn, calls, sync) for name, fn in runs}
                out.append({"vocab": vocab, "budget": budget, "method": method,
                            **{f"{name}_ms": ms for name, ms in times.items()}, "accepted": len(got) - 1,
                            "ops": ops.outside})
                if progress:
                    progress(f"  V={vocab} budget={budget} {method}: "
                             + ", ".join(f"{name} {ms:.3f} ms" for name, ms in times.items()) + f", {ops.outside} ops")
    return out


def render(report: dict[str, Any]) -> str:
    from tmc.commands.table import format_table

    table = [[str(r["vocab"]), str(r["rows"]), r["method"], f"{r['torch_ms']:.3f}", f"{r['numpy_ms']:.3f}",
              f"{r['numpy_ms'] / r['torch_ms']:.2f}", "numpy" if r["numpy_ms"] < r["torch_ms"] else "torch", r["auto"]]
             for r in report["rows"]]
    text = format_table(["V", "rows", "verifier", "torch ms", "numpy ms", "numpy / torch", "faster", "auto"], table,
                        title=f"chain verification on {report['device']} (torch {report['torch']}), rows on the "
                              f"device, median of {report['calls']} calls")
    if not report.get("trees"):
        return text
    compiled = "compiled_ms" in report["trees"][0]
    trees = [[str(r["vocab"]), str(r["budget"]), r["method"], f"{r['device_ms']:.3f}",
              *([f"{r['compiled_ms']:.3f}"] if compiled else []), f"{r['host_ms']:.3f}", f"{r['numpy_ms']:.3f}",
              f"{r['numpy_ms'] / r['device_ms']:.2f}", str(r["ops"]), str(r["accepted"])]
             for r in report["trees"]]
    return text + "\n\n" + format_table(
        ["V", "nodes", "verifier", "device ms", *(["compiled ms"] if compiled else []), "host ms", "numpy ms",
         "numpy / device", "ops", "accepted"], trees,
        title=f"fixed-tree verification on {report['device']}: the device walk, the torch host walk, numpy; "
              f"median of {report['calls']} calls")


def add_options(parser: argparse.ArgumentParser) -> None:
    """The ``verify:`` options of ``tmc bench`` (its device is ``--device``, shared with ``decode``)."""
    g = parser.add_argument_group("verify (tmc bench verify)")
    g.add_argument("--vocabs", default=",".join(map(str, DEFAULT_VOCABS)),
                   help="verify: comma-separated vocabulary sizes (default 4096,32000,128256)")
    g.add_argument("--rows", default=",".join(map(str, DEFAULT_ROWS)),
                   help="verify: comma-separated target row counts, chain length + 1 (default 5,21)")
    g.add_argument("--budgets", default=",".join(map(str, DEFAULT_BUDGETS)),
                   help="verify: comma-separated node counts of the fixed trees (default 7,15,31; 0 for none)")
    g.add_argument("--calls", type=int, default=200, help="verify: timed calls per cell (default 200)")
    g.add_argument("--compile", action="store_true",
                   help="verify: also time the device tree walk through torch.compile (inductor; compile time apart)")


def bench(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """``tmc bench verify``."""
    from tmc.cli import fail

    try:  # spec.llm imports both (its models and decode modules load transformers)
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        fail("needs torch and transformers: pip install 'tmc-spec[llm]' (CPU torch: pip install torch==2.13.0)")
    from spec.llm.models import parse_device

    try:
        device = str(parse_device(getattr(args, "device", None)))
        vocabs = _positive_list("--vocabs", args.vocabs)
        rows = _positive_list("--rows", args.rows, minimum=2)
        if args.calls < 1:
            raise ValueError(f"--calls must be a positive integer, got {args.calls}")
        budgets = [] if args.budgets.strip() == "0" else _positive_list("--budgets", args.budgets)
        largest = max(vocabs) * max([*rows, *(b + 1 for b in budgets)])
        if largest > MAX_CELL_ENTRIES:  # a torch allocation failure would end in a traceback, or the OOM killer
            raise ValueError(f"the largest cell holds {largest:,} probabilities (rows x V); at most "
                             f"{MAX_CELL_ENTRIES:,} (2 GiB of float64): fewer --vocabs / --rows / --budgets")
        print(f"timing chain verification on {device} ...", file=sys.stderr)

        def progress(message: str) -> None:
            print(message, file=sys.stderr, flush=True)

        report = run_verify_bench(device, vocabs, rows, calls=args.calls, seed=args.seed, progress=progress)
        if budgets:
            print(f"timing fixed-tree verification on {device} ...", file=sys.stderr)
            report["trees"] = run_tree_verify_bench(device, vocabs, budgets, calls=args.calls, seed=args.seed,
                                                    progress=progress,
                                                    compile_backend="inductor" if args.compile else None)
    except ValueError as err:
        fail(str(err))
    return report, render(report)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m spec.bench_verify``: the same as ``tmc bench verify`` without an installed package."""
    from tmc.cli import Parser, add_json, add_seed

    p = Parser(prog="python -m spec.bench_verify", description=(__doc__ or "").split("\n\n")[0])
    add_options(p)
    p.add_argument("--device", default=None, help="torch device (default cuda when available, else cpu)")
    add_seed(p, "benchmark inputs")  # tmc bench's flag: an integer >= 0, refused before any model is loaded
    add_json(p)
    from spec.bench_decode import run_as_module

    return run_as_module("verify", bench, p.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
