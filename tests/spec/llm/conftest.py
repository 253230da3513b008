"""Shared set-up of the LLM tests: one torch thread (tiny models run several times faster on a busy
2-core machine) and a tiny pair saved to disk with its tokenizer, for the command-line tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest

#: Null samples simulated for each chi-square p-value of the law checks against an exact two-token law
#: (``verification.calibrated.chi_square_check(..., simulate=NULL_DRAWS)``): at 700 samples on 16 cells some
#: expected counts are near 5, where the chi-square tail gave about twice the stated rate (1e-4 per case:
#: 2.1e-4 measured); the simulated p-value keeps each stated rate to within ~10% at 1e-4.
NULL_DRAWS = 1_000_000


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread() -> Iterator[None]:
    try:
        import torch
    except ImportError:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


class SavedPair(NamedTuple):
    path: Path  # holds target/ and draft/, each with the tokenizer
    tokenizer: Any
    target: Any
    draft: Any


@pytest.fixture(scope="session")
def saved_pair(tmp_path_factory: pytest.TempPathFactory) -> SavedPair:
    """A tiny random pair on a 300-token BPE vocabulary, saved once for the session (read-only: load it)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from spec.llm.models import save_pair, tiny_pair
    from spec.llm.train import train_tokenizer

    tok = train_tokenizer(["def f(x):\n    return x + 1\n" * 50, "import os\nprint(os.sep)\n" * 50], 300, 256)
    target, draft = tiny_pair(len(tok), seed=1)
    path = save_pair(target, draft, tok, tmp_path_factory.mktemp("pair") / "pair")
    return SavedPair(path, tok, target, draft)


def transformers_version() -> tuple[int, ...]:
    """The installed transformers' (major, minor)."""
    import transformers

    return tuple(int(part) for part in transformers.__version__.split(".")[:2])


def greedy_decode(model: Any, prompt: list[int], n: int) -> list[int]:
    """Plain greedy decoding, full recompute through the model's own masks, no cache: the reference
    (minGPT style)."""
    import torch

    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]


def step_roots(prompt: list[int], steps: list[Any]) -> Iterator[tuple[int, Any]]:
    """Each step of a decode (``GenerateOutput.steps``) with its root's position: the prompt's last token's for
    the first, then past the tokens each step emitted; its nodes sit at root + depth."""
    root = len(prompt) - 1
    for step in steps:
        yield root, step
        root += step.emitted


def no_host_scalar_writes() -> Any:
    """A dispatch mode that raises where a Python scalar is written into a tensor by indexing
    (``x[i] = 1.0``).  Torch makes that scalar a tensor first, and for a CUDA ``x`` it makes it on the
    host and copies it in, which a CUDA graph capture refuses.  On the ``meta`` device the same write
    dispatches a ``scalar_tensor`` that then feeds a ``copy_`` or ``index_put_``: that is what this
    catches, so a capture's code can be checked on the CPU.  (``fill_(1.0)`` and ``torch.where(c, 1.0,
    x)`` pass the scalar as an argument of the kernel and are not flagged.)"""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class NoHostScalarWrites(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.scalars: set[int] = set()  # ids of the 0-d tensors made by scalar_tensor
            self.kept: list[Any] = []  # those tensors, kept alive so that their ids stay unique

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            if func is torch.ops.aten.scalar_tensor.default:
                self.scalars.add(id(out))
                self.kept.append(out)
            elif func in (torch.ops.aten.copy_.default, torch.ops.aten.index_put_.default) and any(
                    id(a) in self.scalars for a in args[1:] if isinstance(a, torch.Tensor)):
                raise AssertionError(f"{func}: a Python scalar written by indexing (a host copy on CUDA)")
            return out

    return NoHostScalarWrites()
