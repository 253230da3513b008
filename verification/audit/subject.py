"""What is audited: loading ``MODULE:FUNCTION``, wrapping plain functions, checking the convention.

Notation (DESIGN.md §3): ``p`` is the target, ``q`` the draft.  A verifier is a
:class:`~verification.examples.ChainVerifier` / :class:`~verification.examples.TreeVerifier`
record, or a plain function with the chain convention ``f(ref, q_rows, p_rows, rng)``
or the tree convention ``f(tree, p_rows, rng)``.  Every problem found here is a
usage error: a ``ValueError`` with a one-line message (exit status 2 on the
command line), never a finding about the verifier.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from tmc.drafts import chain_drafts, tree_drafts
from tmc.multidraft import ALL_DRAWS, Draw
from tmc.toy import ToyModel
from verification.audit.space import Kind
from verification.audit.evaluate import VerifierFailure, as_output
from verification.examples import ChainVerifier, TreeVerifier, Verifier

_CONVENTION = {
    "chain": "f(ref, q_rows, p_rows, rng) -> list of token ids",
    "tree": "f(tree, p_rows, rng) -> list of token ids",
}


def load_target(spec: str) -> object:
    """Import ``MODULE:NAME`` (``NAME`` may be dotted); ``ValueError`` (one line) if it cannot be had.

    Any exception raised while importing the module (``ImportError``, a
    ``SyntaxError`` in it, a ``RuntimeError`` at its top level, ...) is
    reported as one line.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr or "" in attr.split("."):
        raise ValueError(f"expected MODULE:FUNCTION (e.g. verification.examples:SPS), got {spec!r}")
    try:
        obj: object = importlib.import_module(module_name)
    except (Exception, SystemExit) as err:  # the module's own top level failed: report it, do not crash
        raise ValueError(f"cannot import module {module_name!r}: {type(err).__name__}: {_one_line(err)}") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"{spec} is a {type(obj).__name__}, not a callable verifier")
    return obj


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split()) or "(no message)"


def as_verifier(verifier: object, kind: str | None, draws: Sequence[Draw] | None) -> Verifier:
    """The verifier as a record; ``kind`` is required for a plain function."""
    if kind is not None and kind not in ("chain", "tree"):
        raise ValueError(f"kind must be 'chain' or 'tree', got {kind!r}")
    if isinstance(verifier, (ChainVerifier, TreeVerifier)):
        if kind is not None and kind != verifier.kind:
            raise ValueError(f"verifier {verifier.name!r} is a {verifier.kind} verifier, not {kind}")
        if draws and isinstance(verifier, TreeVerifier):
            return replace(verifier, draws=tuple(draws))
        return verifier
    if not callable(verifier):
        raise ValueError(f"verifier must be callable, got {type(verifier).__name__}")
    if kind is None:
        raise ValueError("kind ('chain' or 'tree') is required for a plain function (--kind on the command line)")
    name = getattr(verifier, "__qualname__", None) or repr(verifier)
    module = getattr(verifier, "__module__", None)
    label = f"{module}:{name}" if module else str(name)
    if kind == "chain":
        return ChainVerifier(label, verifier)
    return TreeVerifier(label, verifier, draws=tuple(draws) if draws else ALL_DRAWS)


def verifier_kind(verifier: Verifier) -> Kind:
    return "chain" if isinstance(verifier, ChainVerifier) else "tree"


def preflight(verifier: Verifier) -> None:
    """Run the verifier once on the simplest valid input; any failure is a usage error.

    The input: ``V = 2``, one draft token, ``p = q`` uniform.  A function that
    cannot take it has the wrong calling convention (or is not a verifier);
    reporting that as a bias would bury a usage mistake in a search.
    """
    uniform = np.full(2, 0.5)
    model = ToyModel(2, {}, {}, uniform, uniform)
    rng = np.random.default_rng(0)
    try:
        if isinstance(verifier, ChainVerifier):
            chain = chain_drafts(model, 1)[0]
            out = verifier.sample(list(chain.ref), chain.q_rows, chain.p_rows, rng)
        else:
            draft = tree_drafts(model, (1,), verifier.draws[0])[0]
            out = verifier.sample(draft.tree, draft.p_rows, rng)
        as_output(out, 2, 2)
    except Exception as err:
        kind = verifier_kind(verifier)
        what = _one_line(err) if isinstance(err, VerifierFailure) else f"{type(err).__name__}: {_one_line(err)}"
        raise ValueError(
            f"{verifier.name} does not follow the {kind} verifier convention {_CONVENTION[kind]}: on the"
            f" simplest valid input (V = 2, one draft token, p = q uniform) it gave {what}"
        ) from None
