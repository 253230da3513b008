"""Shared toy models for the spec tests."""

from __future__ import annotations

import numpy as np
import pytest

from spec.acceptance import random_stationary_model
from tmc.toy import ToyModel


def models(vocab: int, seeds: range, depth: int = 2, concentration: float = 1.0) -> list[ToyModel]:
    return [random_stationary_model(vocab, s, depth=depth, concentration=concentration) for s in seeds]


@pytest.fixture
def hand_model() -> ToyModel:
    """V = 2: q root (0.6, 0.4), every other draft row (0.9, 0.1); target rows all (0.5, 0.5)."""
    half = np.array([0.5, 0.5])
    return ToyModel(2, {(): np.array([0.6, 0.4])}, {}, np.array([0.9, 0.1]), half, name="hand")
