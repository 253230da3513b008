"""Speculative decoding: token trees, tree builders and the LLM adapter (DESIGN.md §7-§8; later issues).

``spec.generate`` and ``spec.ar_generate`` are :func:`spec.llm.generate.generate` and
:func:`spec.llm.generate.ar_generate`, imported on first use: ``import spec`` itself loads
neither torch nor transformers (the ``llm`` extra), so the builders and the command line
work without them.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ar_generate", "generate"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from spec.llm import generate as module

        return getattr(module, name)
    raise AttributeError(f"module 'spec' has no attribute {name!r}")
