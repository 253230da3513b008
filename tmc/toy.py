"""Toy draft/target model pairs on a small vocabulary.

A toy model gives the draft law ``q(· | prefix)`` and the target law
``p(· | prefix)`` for every prefix, as explicit probability rows.  Rows are
stored per prefix (a tuple of token ids); a default row, if given, serves
every prefix that is not listed.  This is what the exact enumerations in
:mod:`tmc.enumeration` run on.

The dictionary form (also the JSON file format of ``tmc acceptance``)::

    {"vocab": 3,
     "draft":  {"": [0.5, 0.3, 0.2], "0": [0.4, 0.4, 0.2], "*": [...]},
     "target": {"": [0.3, 0.4, 0.3], "*": [...]}}

keys are the prefix tokens joined by commas (``""`` for the root, ``"0,2"``)
and ``"*"`` is the default row.
"""

from __future__ import annotations

from collections.abc import Mapping
import json
import math
from dataclasses import dataclass, field, replace
from itertools import product
from pathlib import Path as Path_
from typing import Any

import numpy as np
from numpy.typing import NDArray

from tmc.validate import as_real_array, as_rng, check_int, check_prob_rows, check_tokens, real_scalar

Path = tuple[int, ...]
FloatArray = NDArray[np.float64]


def _parse_key(key: str, vocab: int, where: str) -> Path | None:
    if key == "*":
        return None
    if key == "":
        return ()
    parts = key.split(",")
    # decimal digits only, spaces around them allowed: int() also reads "1_0", "+1" and "-0"
    if not all(p.strip().isascii() and p.strip().isdigit() for p in parts):
        raise ValueError(f"{where}: prefix key {key!r} is not comma-separated token ids")
    path = tuple(int(t) for t in parts)
    if any(t < 0 or t >= vocab for t in path):
        raise ValueError(f"{where}: prefix key {key!r} has a token outside [0, {vocab})")
    return path


def _rows_from_mapping(
    name: str, rows: Mapping[str, Any], vocab: int
) -> tuple[dict[Path, FloatArray], FloatArray | None]:
    table: dict[Path, FloatArray] = {}
    default: FloatArray | None = None
    keys: dict[Path, str] = {}  # the key each prefix was read from
    for key, row in rows.items():
        if not isinstance(key, str):
            raise ValueError(f"{name}: prefix key {key!r} is not a string")
        arr = as_real_array(f"{name}[{key!r}]", row)
        if arr.ndim != 1:
            raise ValueError(f"{name}[{key!r}] must be a list of {vocab} probabilities, got {row!r}")
        arr = check_prob_rows(f"{name}[{key!r}]", arr[None, :])[0]
        if arr.shape != (vocab,):
            raise ValueError(f"{name}[{key!r}] has {arr.shape[0]} entries; vocab is {vocab}")
        path = _parse_key(key, vocab, name)
        if path is None:
            default = arr
        elif path in keys:  # "0" and " 0" (int() reads both): one row would be dropped silently
            raise ValueError(f"{name}: prefix keys {keys[path]!r} and {key!r} name the same prefix {path}")
        else:
            table[path], keys[path] = arr, key
    return table, default


def _prefix_key(name: str, key: object, vocab: int) -> Path:
    """A :class:`ToyModel` table key as a prefix: a tuple of token ids in ``[0, vocab)`` (``()`` for the root);
    ``ValueError`` naming ``name`` otherwise (an int or a string key would never be looked up: the rows are
    read by tuple)."""
    if not isinstance(key, tuple):
        raise ValueError(f"{name} key {key!r} is not a prefix: give a tuple of token ids (() for the root; "
                         "ToyModel.from_dict reads comma-separated string keys)")
    path = tuple(check_int(f"{name} key {key!r}: token", t) for t in key)
    if any(t < 0 or t >= vocab for t in path):
        raise ValueError(f"{name} key {key!r} has a token outside [0, {vocab})")
    return path


def _toy_row(label: str, row: object, vocab: int) -> FloatArray:
    """A :class:`ToyModel` row as a float64 ``(vocab,)`` array of the values given, checked as a probability
    row (``ValueError`` naming ``label``); not renormalised, so rows built bit-identical stay so."""
    arr = as_real_array(label, row)
    if arr.shape != (vocab,):
        raise ValueError(f"{label} has shape {arr.shape}; expected ({vocab},)")
    check_prob_rows(label, arr[None, :])
    return arr


def _key(path: Path) -> str:
    return ",".join(str(t) for t in path)


@dataclass(frozen=True)
class ToyModel:
    """A draft/target pair given by explicit rows (``q`` draft, ``p`` target)."""

    vocab: int  # vocabulary size V; tokens are 0..V-1
    draft_rows: Mapping[Path, FloatArray]  # q(· | prefix) for listed prefixes
    target_rows: Mapping[Path, FloatArray]  # p(· | prefix) for listed prefixes
    draft_default: FloatArray | None = None  # q row for any prefix not listed
    target_default: FloatArray | None = None  # p row for any prefix not listed
    name: str = field(default="toy")  # label used in reports

    def __post_init__(self) -> None:
        vocab = check_int("vocab", self.vocab, minimum=1)
        object.__setattr__(self, "vocab", vocab)
        for which, table, default in (
            ("draft", self.draft_rows, self.draft_default),
            ("target", self.target_rows, self.target_default),
        ):
            if not isinstance(table, Mapping):
                raise ValueError(f"{which}_rows must map prefixes to rows, got {type(table).__name__}")
            stored: dict[Path, FloatArray] = {}
            for key, row in table.items():
                stored[_prefix_key(f"{which}_rows", key, vocab)] = _toy_row(f"{which}_rows[{key!r}]", row, vocab)
            # rows kept as checked float64 arrays (a list row would reach the enumerations as a list)
            object.__setattr__(self, f"{which}_rows", stored)
            if default is not None:
                object.__setattr__(self, f"{which}_default", _toy_row(f"{which}_default", default, vocab))

    def q(self, prefix: Path) -> FloatArray:
        """Draft row ``q(· | prefix)``."""
        return self._row("draft", self.draft_rows, self.draft_default, prefix)

    def p(self, prefix: Path) -> FloatArray:
        """Target row ``p(· | prefix)``."""
        return self._row("target", self.target_rows, self.target_default, prefix)

    def _row(
        self, which: str, rows: Mapping[Path, FloatArray], default: FloatArray | None, prefix: Path
    ) -> FloatArray:
        row = rows.get(tuple(prefix))  # a listed prefix is a valid one (the keys are checked)
        if row is not None:
            return row
        self.checked_path("prefix", prefix)  # else the default row would answer for a token off the vocabulary
        if default is None:
            raise ValueError(f"toy model has no {which} row for prefix {prefix!r} and no default '*'")
        return default

    def chain_rows(self, ref: Path, prefix: Path = ()) -> tuple[FloatArray, FloatArray]:
        """``(q_rows, p_rows)`` of shapes ``(n, V)`` and ``(n + 1, V)`` along ``ref``."""
        ctx = [tuple(prefix) + tuple(ref[:i]) for i in range(len(ref) + 1)]
        q_rows = np.array([self.q(c) for c in ctx[:-1]]).reshape(len(ref), self.vocab)
        p_rows = np.array([self.p(c) for c in ctx])
        return q_rows, p_rows

    def checked_path(self, name: str, path: object) -> Path:
        """``path`` (a prefix, an output string) as a tuple of token ids in ``[0, vocab)``; ``ValueError``
        naming ``name`` otherwise (a token past the vocabulary would fall back to the default row, or wrap
        around a row's end, and give a silently wrong value)."""
        if isinstance(path, tuple):  # the common case, read without numpy (a loop: half a generator's cost)
            vocab = self.vocab
            for t in path:
                if type(t) is not int or not 0 <= t < vocab:
                    break
            else:
                return path
        if isinstance(path, str | bytes):
            raise ValueError(f"{name} must be a sequence of token ids, got {path!r}")
        return tuple(int(t) for t in check_tokens(name, path, self.vocab))  # type: ignore[arg-type]

    def target_path_prob(self, path: Path, prefix: Path = ()) -> float:
        """``P(path | prefix)`` under the target: product of conditionals."""
        path, prefix = self.checked_path("path", path), self.checked_path("prefix", prefix)
        prob = 1.0
        for i, tok in enumerate(path):
            prob *= float(self.p(tuple(prefix) + tuple(path[:i]))[tok])
        return prob

    # ---------------------------------------------------------- construction

    @classmethod
    def from_dict(cls, obj: Mapping[str, Any], name: str = "toy") -> ToyModel:
        """Build from the dictionary / JSON form described in the module doc."""
        if not isinstance(obj, Mapping):
            raise ValueError(f"a toy model must be an object with 'vocab', 'draft' and 'target', got {type(obj).__name__}")
        vocab_value = obj.get("vocab")
        if isinstance(vocab_value, bool) or not isinstance(vocab_value, int) or vocab_value < 1:
            raise ValueError(f"toy model needs an integer 'vocab' >= 1, got {vocab_value!r}")
        vocab = int(obj["vocab"])
        for part in ("draft", "target"):
            if not isinstance(obj.get(part), Mapping):
                raise ValueError(f"toy model needs a '{part}' object mapping prefix keys to rows")
        d_rows, d_def = _rows_from_mapping("draft", obj["draft"], vocab)
        t_rows, t_def = _rows_from_mapping("target", obj["target"], vocab)
        return cls(vocab, d_rows, t_rows, d_def, t_def, name)

    def to_dict(self) -> dict[str, Any]:
        """Inverse of :meth:`from_dict`."""

        def rows(table: Mapping[Path, FloatArray], default: FloatArray | None) -> dict[str, Any]:
            out: dict[str, Any] = {_key(k): [float(x) for x in v] for k, v in table.items()}
            if default is not None:
                out["*"] = [float(x) for x in default]
            return out

        return {
            "vocab": self.vocab,
            "draft": rows(self.draft_rows, self.draft_default),
            "target": rows(self.target_rows, self.target_default),
        }

    @classmethod
    def random(
        cls,
        vocab: int,
        depth: int,
        rng: np.random.Generator | int,
        zero_prob: float = 0.2,
        concentration: float = 1.0,
        name: str = "random",
    ) -> ToyModel:
        """Independent random rows for every prefix of length ``<= depth``.

        Each entry is set to an exact zero with probability ``zero_prob``
        (keeping at least one positive entry per row); the rest are Dirichlet
        draws with the given ``concentration``.  ``rng`` is a generator or a seed.
        """
        vocab = check_int("vocab", vocab, minimum=1)
        depth = check_int("depth", depth, minimum=0)
        _check_row_params(zero_prob, concentration)
        rng = as_rng(rng)
        d_rows: dict[Path, FloatArray] = {}
        t_rows: dict[Path, FloatArray] = {}
        for length in range(depth + 1):
            for prefix in product(range(vocab), repeat=length):
                d_rows[prefix] = random_row(vocab, rng, zero_prob, concentration)
                t_rows[prefix] = random_row(vocab, rng, zero_prob, concentration)
        return cls(vocab, d_rows, t_rows, name=name)


def _check_row_params(zero_prob: object, concentration: object) -> None:
    """``ValueError`` unless ``zero_prob`` is in ``[0, 1]`` (1: one-hot rows) and ``concentration`` is finite
    and positive."""
    z, c = real_scalar("zero_prob", zero_prob), real_scalar("concentration", concentration)
    if not 0.0 <= z <= 1.0:  # NaN fails too
        raise ValueError(f"zero_prob must be in [0, 1], got {zero_prob!r}")
    if not (0.0 < c < math.inf):
        raise ValueError(f"concentration must be a finite number > 0, got {concentration!r}")


def random_row(
    vocab: int, rng: np.random.Generator, zero_prob: float = 0.2, concentration: float = 1.0
) -> FloatArray:
    """A random probability row with exact zeros (at least one entry positive)."""
    _check_row_params(zero_prob, concentration)
    row = rng.dirichlet(np.full(vocab, concentration))
    zeros = rng.random(vocab) < zero_prob
    zeros[rng.integers(vocab)] = False
    row[zeros] = 0.0
    out: FloatArray = row / row.sum()
    return out


#: The TMC paper's toy example as shipped data (also the example file of ``tmc acceptance``).
PAPER_TOY_FILE = Path_(__file__).with_name("models") / "paper_toy.json"


class _RepeatedKey(Exception):
    pass


def _no_repeated_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _RepeatedKey(key)
        out[key] = value
    return out


def load_model(path: str | Path_) -> ToyModel:
    """Read a toy model JSON file (format in the module doc); ``ValueError`` if unreadable or malformed."""
    if not isinstance(path, str | Path_):
        raise ValueError(f"path must be a file path (str or pathlib.Path), got {type(path).__name__}")
    where = str(path)
    try:
        text = Path_(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"{where}: cannot read the model file ({err.strerror if isinstance(err, OSError) else err})") from None
    try:
        obj = json.loads(text, object_pairs_hook=_no_repeated_keys)
    except json.JSONDecodeError as err:
        raise ValueError(f"{where}: not valid JSON ({err})") from None
    except _RepeatedKey as err:  # json keeps the last of two equal keys: a row given twice lost the first
        raise ValueError(f"{where}: key {err.args[0]!r} appears twice in one object") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected a JSON object with 'vocab', 'draft' and 'target'")
    try:
        return ToyModel.from_dict(obj, name=str(obj.get("name", Path_(path).stem)))
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from None


def paper_toy_model() -> ToyModel:
    """The TMC paper's toy example (Tables 1–3), Σ = {a, b, c} as tokens 0, 1, 2.

    Read from :data:`PAPER_TOY_FILE`, the one copy of its rows.  Given by the
    paper: draft root (0.5, 0.3, 0.2), target root (0.3, 0.4, 0.3), draft after
    ``a`` (0.4, 0.4, 0.2) (Table 2's 0.2/0.2/0.1 of 0.5), target after ``a``
    uniform (0.1/0.1/0.1 of 0.3).  Every other row — draft and target after
    ``b``, after ``c``, and at depth 2 — is uniform, as the project's issue #2
    completes the rows the paper leaves open.
    """
    return replace(load_model(PAPER_TOY_FILE), name="paper-toy")
