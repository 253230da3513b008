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

Run as ``tmc bench verify`` (``--device cuda``, ``--vocabs``, ``--rows``,
``--calls``), or ``python -m spec.bench_verify`` without an installed package.
Figures are medians of ``--calls`` timed calls after one untimed call, with the
device synchronised before each.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = ["add_options", "bench", "main", "render", "run_verify_bench"]

METHODS = ("sps", "asps", "block")
DEFAULT_VOCABS = (4096, 32000, 128256)
DEFAULT_ROWS = (5, 21)


def _positive_list(name: str, text: str, minimum: int = 1) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",")]
    except ValueError:
        raise ValueError(f"{name} takes comma-separated integers, got {text!r}") from None
    if not vals or any(v < minimum for v in vals):
        raise ValueError(f"{name} must hold integers >= {minimum}, got {text!r}")
    return vals


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

    if not vocabs or any(not isinstance(v, int) or v < 1 for v in vocabs):
        raise ValueError(f"vocabs must be positive integers, got {list(vocabs)!r}")
    if not rows or any(not isinstance(n, int) or n < 2 for n in rows):
        raise ValueError(f"rows must be integers >= 2 (a chain of rows - 1 tokens), got {list(rows)!r}")
    if not methods or any(m not in METHODS for m in methods):
        raise ValueError(f"methods must be among {METHODS}, got {list(methods)!r}")
    if not isinstance(calls, int) or calls < 1:
        raise ValueError(f"calls must be a positive integer, got {calls!r}")
    dev = parse_device(device)

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

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
                times = {}
                for name, fn in (("torch", on_device), ("numpy", on_host)):
                    ts = []
                    for _ in range(calls):
                        sync()
                        t0 = time.perf_counter()
                        fn()
                        ts.append(time.perf_counter() - t0)
                    times[name] = 1e3 * statistics.median(ts)
                row = {"vocab": vocab, "rows": n_rows, "method": method, "torch_ms": times["torch"],
                       "numpy_ms": times["numpy"], "accepted": accepted,
                       "auto": resolve_verify_backend(model, "auto", True, n_rows * vocab)}
                out.append(row)
                if progress:
                    progress(f"  V={vocab} rows={n_rows} {method}: torch {times['torch']:.3f} ms, "
                             f"numpy {times['numpy']:.3f} ms")
    return {"device": str(dev), "torch": torch.__version__, "calls": calls, "seed": seed, "rows": out}


def render(report: dict[str, Any]) -> str:
    from tmc.commands.table import format_table

    table = [[str(r["vocab"]), str(r["rows"]), r["method"], f"{r['torch_ms']:.3f}", f"{r['numpy_ms']:.3f}",
              f"{r['numpy_ms'] / r['torch_ms']:.2f}", "numpy" if r["numpy_ms"] < r["torch_ms"] else "torch", r["auto"]]
             for r in report["rows"]]
    return format_table(["V", "rows", "verifier", "torch ms", "numpy ms", "numpy / torch", "faster", "auto"], table,
                        title=f"chain verification on {report['device']} (torch {report['torch']}), rows on the "
                              f"device, median of {report['calls']} calls")


def add_options(parser: argparse.ArgumentParser) -> None:
    """The ``verify:`` options of ``tmc bench`` (its device is ``--device``, shared with ``decode``)."""
    g = parser.add_argument_group("verify (tmc bench verify)")
    g.add_argument("--vocabs", default=",".join(map(str, DEFAULT_VOCABS)),
                   help="verify: comma-separated vocabulary sizes (default 4096,32000,128256)")
    g.add_argument("--rows", default=",".join(map(str, DEFAULT_ROWS)),
                   help="verify: comma-separated target row counts, chain length + 1 (default 5,21)")
    g.add_argument("--calls", type=int, default=200, help="verify: timed calls per cell (default 200)")


def bench(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """``tmc bench verify``."""
    from tmc.cli import fail

    try:
        import torch  # noqa: F401
    except ImportError:
        fail("needs torch: pip install torch==2.13.0 (the CPU build)")
    from spec.llm.models import parse_device

    try:
        device = str(parse_device(getattr(args, "device", None)))
        vocabs = _positive_list("--vocabs", args.vocabs)
        rows = _positive_list("--rows", args.rows, minimum=2)
        if args.calls < 1:
            raise ValueError(f"--calls must be a positive integer, got {args.calls}")
        print(f"timing chain verification on {device} ...", file=sys.stderr)
        report = run_verify_bench(device, vocabs, rows, calls=args.calls, seed=args.seed,
                                  progress=lambda m: print(m, file=sys.stderr, flush=True))
    except ValueError as err:
        fail(str(err))
    return report, render(report)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m spec.bench_verify``: the same as ``tmc bench verify`` without an installed package."""
    p = argparse.ArgumentParser(prog="python -m spec.bench_verify", description=(__doc__ or "").split("\n\n")[0])
    add_options(p)
    p.add_argument("--device", default=None, help="torch device (default cuda when available, else cpu)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    from spec.bench_decode import run_as_module

    return run_as_module("verify", bench, p.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
