"""Evaluating a verifier on one audit case: exactly, by calibrated sampling, and sampler vs kernel.

Notation (DESIGN.md §3): ``p`` is the target, ``q`` the draft.  Drafts come
from :mod:`tmc.drafts` and every law from :mod:`tmc.laws` (the averaged output
law ``K̄``, the completed law ``C`` and the target law ``P`` at length ``L``);
this module only decides and records.

* :func:`exact_evaluation` — ``K̄`` from the verifier's kernel over every draft;
  biased when the completion TV ``½ Σ_t |C(t) − P(t)|`` exceeds ``tol``.
* :func:`sampled_evaluation` — draws drafts by weight, runs the verifier's
  sampler, continues each output with the target to length ``L`` and runs the
  finite-sample KL-bound test of the completed counts against ``P``
  (:func:`verification.calibrated.kl_check`: its false-fail rate is a bound
  for every sample size, not an asymptotic approximation).  The sample size is fixed before sampling
  by :func:`sample_size`; an output with target probability 0 is a hard
  failure.
* :func:`sampler_check` — exact mode's check that the sampler draws from its
  kernel: the emitted strings against ``K̄`` by the same calibrated test.

A verifier that raises, or returns something that is not 1..``L`` token ids in
``[0, V)``, on a valid input is a finding, recorded in ``error``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from tmc.drafts import Draft, DraftChain, chain_drafts, tree_drafts
from tmc.laws import averaged_law, completed_law, target_law, total_variation
from tmc.toy import Path, ToyModel
from verification.audit.cases import AuditCase
from verification.calibrated import kl_check, kl_required_samples
from verification.examples import ChainVerifier, Verifier

FloatArray = NDArray[np.float64]


@dataclass(frozen=True)
class Evaluation:
    """The verifier's law on one case next to the target's."""

    output_law: dict[Path, float]  # law of the emitted string (exact, or sample frequencies)
    completed: dict[Path, float]  # C(t) at length L (exact, or sample frequencies)
    target: dict[Path, float]  # P(t) at length L, cells with P(t) > 0
    tv: float  # ½ Σ |C − P| (plug-in estimate in sampling mode)
    biased: bool  # verdict on this case
    samples: int = 0  # sampling mode: steps run (fixed before sampling)
    p_value: float | None = None  # sampling mode: the KL bound on the upper tail
    impossible: int = 0  # sampling mode: outputs with target probability 0
    error: str | None = None  # the verifier raised or returned an invalid output
    detect_tv: float | None = None  # sampling mode: TV the sample size was computed to detect
    alpha: float | None = None  # sampling mode: level of the test

    @property
    def conclusive(self) -> bool:
        """A finding no fresh sample can overturn: a crash, an invalid or an impossible output."""
        return self.error is not None or self.impossible > 0


@dataclass(frozen=True)
class SamplerCheck:
    """Exact mode: the sampler's emitted strings tested against the kernel's averaged law."""

    case: AuditCase  # the case the sampler ran on
    kernel_law: dict[Path, float]  # K̄(s) from the kernel
    sampled_law: dict[Path, float]  # emitted-string frequencies of the sampler
    samples: int  # steps run (fixed before sampling)
    alpha: float  # level of this test (the family's alpha split over the cases checked)
    p_value: float  # the KL bound on the upper tail (1.0 when the sampler failed)
    impossible: int  # emitted strings the kernel gives probability 0
    passed: bool  # no evidence that the sampler is not the kernel
    error: str | None = None  # the sampler raised or returned an invalid output


class VerifierFailure(Exception):
    """The audited verifier raised or returned an invalid output on a valid input."""


def case_drafts(case: AuditCase) -> Sequence[Draft]:
    """Every draft of the case's shape with positive probability (from :mod:`tmc.drafts`)."""
    if case.draw is None:
        return chain_drafts(case.model, case.cell.depth)
    return tree_drafts(case.model, case.widths, case.draw)


def sample_size(bins: int, tv: float, alpha: float, beta: float) -> int:
    """Steps that detect a law at TV ``tv`` from one with ``bins`` positive cells, with probability
    ``1 − beta``, at false-fail rate ``alpha``: :func:`verification.calibrated.kl_required_samples`.

    With one positive cell every discrepancy is mass on impossible outcomes, a
    hard failure: ``(1 − tv)^N ≤ beta`` suffices and the false-fail rate is 0.
    """
    return kl_required_samples(bins, tv, alpha, beta)


# ------------------------------------------------------------------ exact


def exact_evaluation(verifier: Verifier, case: AuditCase, tol: float = 1e-9) -> Evaluation:
    """Exact completion TV of a verifier with a kernel on one case."""
    if verifier.kernel is None:
        raise ValueError(f"verifier {verifier.name!r} has no kernel; use sampling mode")
    target = target_law(case.model, case.length)
    try:
        law = averaged_law(case_drafts(case), verifier.kernel)
        completed = completed_law(case.model, law, case.length)
    except Exception as err:  # the audited kernel failed on a valid input: that is a finding
        return Evaluation({}, {}, target, math.nan, True, error=f"{type(err).__name__}: {err}")
    tv = total_variation(completed, target)
    return Evaluation(law, completed, target, tv, not tv <= tol)


def law_entropy(law: dict[Path, float]) -> float:
    """Shannon entropy of an output law (how spread it is; picks sampler-check cases)."""
    return -math.fsum(m * math.log(m) for m in law.values() if m > 0.0)


# --------------------------------------------------------------- sampling


def sample_outputs(
    verifier: Verifier, case: AuditCase, drafts: Sequence[Draft], samples: int, rng: np.random.Generator
) -> Counter[Path]:
    """Emitted strings of ``samples`` steps, each on a draft drawn by its weight.

    Raises :class:`VerifierFailure` when the verifier raises or returns an invalid output.
    """
    weights = np.array([d.weight for d in drafts])
    per_draft = rng.multinomial(samples, weights / weights.sum())  # (n_drafts,) steps on each draft
    out: Counter[Path] = Counter()
    for draft, count in zip(drafts, per_draft):
        for _ in range(int(count)):
            out[_one_step(verifier, case, draft, rng)] += 1
    return out


def _one_step(verifier: Verifier, case: AuditCase, draft: Draft, rng: np.random.Generator) -> Path:
    try:
        if isinstance(verifier, ChainVerifier):
            assert isinstance(draft, DraftChain)
            out = verifier.sample(list(draft.ref), draft.q_rows.copy(), draft.p_rows.copy(), rng)
        else:
            assert not isinstance(draft, DraftChain)
            out = verifier.sample(draft.tree, draft.p_rows.copy(), rng)
    except Exception as err:  # the audited code failed on a valid input: that is a finding
        raise VerifierFailure(f"{type(err).__name__}: {err}") from None
    return as_output(out, case.vocab, case.length)


def as_output(out: object, vocab: int, length: int) -> Path:
    """A verifier's return value as a token path; :class:`VerifierFailure` if it is not one."""
    try:
        toks = tuple(int(t) for t in out)  # type: ignore[attr-defined]
    except (TypeError, ValueError):
        raise VerifierFailure(f"invalid output: returned {out!r}, not a list of token ids") from None
    if not 1 <= len(toks) <= length or any(not 0 <= t < vocab for t in toks):
        raise VerifierFailure(f"invalid output: returned {list(toks)}; need 1..{length} tokens in [0, {vocab})")
    return toks


def complete_counts(
    model: ToyModel, emitted: Counter[Path], length: int, rng: np.random.Generator
) -> tuple[Counter[Path], int]:
    """Continue every emitted string with the target to ``length`` tokens.

    The ``c`` copies of an output ``s`` are continued at once by one
    multinomial draw from ``P(· | s)`` (the same law as continuing each copy
    token by token).  Returns the completed counts and the number of outputs
    with target probability 0 (which have no continuation law to compare).
    """
    completed: Counter[Path] = Counter()
    impossible = 0
    for s, count in emitted.items():
        if model.target_path_prob(s) == 0.0:
            impossible += count
            continue
        tails = target_law(model, length - len(s), prefix=s)
        keys = list(tails)
        probs = np.array([tails[t] for t in keys])
        for tail, c in zip(keys, rng.multinomial(count, probs / probs.sum())):
            if c:
                completed[s + tail] += int(c)
    return completed, impossible


def sampled_evaluation(
    verifier: Verifier, case: AuditCase, *, tv: float, alpha: float, beta: float, rng: np.random.Generator
) -> Evaluation:
    """Calibrated test (:func:`~verification.calibrated.kl_check`) of the completed output law against the
    target on one case.

    The sample size is fixed by ``(bins, tv, alpha, beta)`` before sampling.
    """
    target = target_law(case.model, case.length)
    cells = sorted(target)
    samples = sample_size(len(cells), tv, alpha, beta)
    try:
        emitted = sample_outputs(verifier, case, case_drafts(case), samples, rng)
    except VerifierFailure as err:
        return Evaluation({}, {}, target, math.nan, True, samples, error=str(err), detect_tv=tv, alpha=alpha)
    completed, impossible = complete_counts(case.model, emitted, case.length, rng)
    counts = np.array([completed.get(t, 0) for t in cells] + [impossible], dtype=np.int64)
    probs = np.array([target[t] for t in cells] + [0.0])  # last cell: target probability 0
    check = kl_check(counts, probs, alpha)
    freq = {t: c / samples for t, c in completed.items()}
    law = {s: c / samples for s, c in emitted.items()}
    # the impossible outputs are one more cell, of target probability 0
    tv_hat = total_variation(freq, target) + 0.5 * impossible / samples
    return Evaluation(law, freq, target, tv_hat, not check.passed, samples, check.p_value,
                      impossible, detect_tv=tv, alpha=alpha)


# ------------------------------------------------------ sampler vs kernel


def sampler_check(
    verifier: Verifier, case: AuditCase, *, tv: float, alpha: float, beta: float, rng: np.random.Generator
) -> SamplerCheck:
    """Test the sampler's emitted strings against the kernel's averaged law ``K̄`` on one case."""
    assert verifier.kernel is not None
    drafts = case_drafts(case)
    law = averaged_law(drafts, verifier.kernel)
    total = math.fsum(law.values())
    cells = sorted(s for s, m in law.items() if m > 0.0)
    samples = sample_size(len(cells), tv, alpha, beta)
    try:
        emitted = sample_outputs(verifier, case, drafts, samples, rng)
    except VerifierFailure as err:
        return SamplerCheck(case, law, {}, samples, alpha, 1.0, 0, False, str(err))
    outside = sum(c for s, c in emitted.items() if s not in law or law[s] <= 0.0)
    counts = np.array([emitted.get(s, 0) for s in cells] + [outside], dtype=np.int64)
    probs = np.array([law[s] / total for s in cells] + [0.0])
    check = kl_check(counts, probs, alpha)
    sampled = {s: c / samples for s, c in emitted.items()}
    return SamplerCheck(case, law, sampled, samples, alpha, check.p_value, outside, check.passed)
