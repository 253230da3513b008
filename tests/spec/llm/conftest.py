"""Shared set-up of the LLM tests: one torch thread (tiny models run several times faster on a busy
2-core machine) and a tiny pair saved to disk with its tokenizer, for the command-line tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest


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


def greedy_decode(model: Any, prompt: list[int], n: int) -> list[int]:
    """Plain greedy decoding, full recompute through the model's own masks, no cache: the reference
    (minGPT style)."""
    import torch

    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]
