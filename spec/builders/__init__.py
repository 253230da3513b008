"""Tree builders behind one interface (DESIGN.md §7): draft model + budget + rng in, ``DraftTree`` out.

=====================  ==========================================  ======
name                   builder                                     draws
=====================  ==========================================  ======
``chain``              :class:`ChainBuilder` (n tokens, or fewer)  iid / topk
``fixed``              :class:`FixedBuilder` (depth × width)       iid / swor / topk
``dyspec``             :class:`DySpecBuilder` (Alg. 1, heap)       swor
``dyspec-threshold``   :class:`DySpecThresholdBuilder` (Alg. 2)    swor
``dynatree``           :class:`DynaTreeBuilder`                    topk
``wetap``              :class:`WetapBuilder` (construction only)   topk
=====================  ==========================================  ======

The interface and what makes every builder lossless under a tree verifier
are in :mod:`spec.builders.base`.
"""

from __future__ import annotations

from typing import Any

from spec.builders.base import TreeBuilder
from spec.builders.dynatree import DynaTreeBuilder, DynaTreeState
from spec.builders.dyspec import DySpecBuilder, DySpecThresholdBuilder
from spec.builders.simple import ChainBuilder, FixedBuilder
from spec.builders.wetap import WetapBuilder

#: Every builder by its command-line name.
BUILDERS: dict[str, type[TreeBuilder]] = {
    cls.name: cls
    for cls in (ChainBuilder, FixedBuilder, DySpecBuilder, DySpecThresholdBuilder, DynaTreeBuilder, WetapBuilder)
}

__all__ = [
    "BUILDERS",
    "ChainBuilder",
    "DySpecBuilder",
    "DySpecThresholdBuilder",
    "DynaTreeBuilder",
    "DynaTreeState",
    "FixedBuilder",
    "TreeBuilder",
    "WetapBuilder",
    "make_builder",
]


def make_builder(builder: str | TreeBuilder, **params: Any) -> TreeBuilder:
    """A builder from its name and parameters (or a builder object, returned as is)."""
    if isinstance(builder, TreeBuilder):
        if params:
            raise ValueError("parameters go with a builder name, not with a builder object")
        return builder
    if not isinstance(builder, str) or builder not in BUILDERS:  # a list or dict is no name (and unhashable)
        raise ValueError(f"unknown builder {builder!r}; choose one of {', '.join(BUILDERS)}")
    try:
        return BUILDERS[builder](**params)
    except TypeError as err:
        raise ValueError(f"builder {builder!r}: {err}") from None
