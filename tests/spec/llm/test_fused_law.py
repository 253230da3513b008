"""Losslessness of the fused steps (``step_graph=True``), end to end on a tiny Llama pair.

The fused chain and tree steps (:mod:`spec.llm.step_graph`,
:mod:`spec.llm.tree_step_graph`) are tested token for token against the
unfused device path on identical noise, whose law ``test_generate`` checks.
Here the first two tokens of the fused path itself are checked against the
target's exact processed law, as ``test_generate`` checks the unfused one:
eagerly for every fused draw and verifier, and with inductor's code on the
CPU (``compile_step=True``, whose draws and totals take other but equal
forms under compile) for the chains and three trees.  Every decode must have taken
the fused path in its first step (``graph_s > 0``), or the check would
measure the unfused loop.  A last test shows the check has power against a
bug inside the fused head.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tests.spec.llm.test_generate import (  # noqa: E402
    SAMPLES,
    SETTINGS,
    _law_pair,
    exact_two_token_law,
    two_token_counts,
)
from tests.spec.llm.conftest import NULL_DRAWS  # noqa: E402
from verification.calibrated import bonferroni, chi_square_check, chi_square_detectable_tv  # noqa: E402

pytestmark = pytest.mark.llm

# (builder, verifier, builder params, compile_step, setting index): every fused chain verifier (and an argmax
# chain, whose verifier takes no draft rows), every fused tree draw with each device-walked tree verifier (a
# budget-3 fixed tree of width 2: the root's two children and one grandchild; K-SEQ i.i.d. only; ordered
# Traversal on top-k trees is Traversal), the filtered setting where the fused path takes it (chains and i.i.d.
# trees; ranked and swor trees are fused only without top-p), and inductor's code for every chain verifier and
# three trees
FUSED = [("chain", "sps", {}, False, 0), ("chain", "asps", {}, False, 0), ("chain", "block", {}, False, 0),
         ("chain", "sps", {}, False, 1), ("chain", "sps", {"draw": "topk"}, False, 0),
         *[("fixed", verifier, {"width": 2, "draw": draw}, False, 0)
           for verifier in ("multidraft", "traversal") for draw in ("iid", "swor", "topk")],
         *[("fixed", "ordered_traversal", {"width": 2, "draw": draw}, False, 0) for draw in ("iid", "swor")],
         ("fixed", "kseq", {"width": 2, "draw": "iid"}, False, 0),
         ("fixed", "traversal", {"width": 2, "draw": "iid"}, False, 1),
         *[("chain", verifier, {}, True, 0) for verifier in ("sps", "asps", "block")],
         ("fixed", "traversal", {"width": 2, "draw": "iid"}, True, 0),
         ("fixed", "ordered_traversal", {"width": 2, "draw": "swor"}, True, 0),
         ("fixed", "kseq", {"width": 2, "draw": "iid"}, True, 0)]
# one check per case, and each negative control's fit to its bug's own law (two of them): one family
FUSED_ALPHA = bonferroni(1e-3, len(FUSED) + 2)
FUSED_IDS = [f"{b}-{v}-{p.get('draw', 'iid')}-{'compiled' if c else 'eager'}-setting{s}"
             for b, v, p, c, s in FUSED]


def fused_counts(target: Any, draft: Any, builder: str, verifier: str, params: dict[str, object],
                 setting: tuple[float, int | None, float | None], compile_step: bool = False) -> np.ndarray:
    """Counts of the first two tokens over ``SAMPLES`` seeded fused decodes (budget 3, static caches); every
    decode's first step must have been a fused one."""
    return two_token_counts(target, draft, builder, verifier, params, setting, cache="static", step_graph=True,
                            compile_step=compile_step)


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")  # inductor's import
@pytest.mark.parametrize(("builder", "verifier", "params", "compile_step", "setting"), FUSED, ids=FUSED_IDS)
def test_fused_steps_follow_the_target_law(builder: str, verifier: str, params: dict[str, object],
                                           compile_step: bool, setting: int) -> None:
    """Chi-square of the fused path's first two tokens against the target's exact processed law.

    False-fail rate 1e-3 over the cases and the negative controls' fits (Bonferroni); 700 samples on at most 16 cells detect a total
    variation of about ``chi_square_detectable_tv(law, 700, FUSED_ALPHA)`` (0.17; 0.146 on the 4 cells of top-k 3 / top-p 0.8) with probability 0.999, and a sample
    in a cell of probability 0 (removed by top-k / top-p) fails the check."""
    target, draft = _law_pair()
    law = exact_two_token_law(target, *SETTINGS[setting])
    try:
        counts = fused_counts(target, draft, builder, verifier, params, SETTINGS[setting], compile_step)
    finally:
        if compile_step:  # dynamo counts every compiled partial against one code object: leave no entries behind
            torch._dynamo.reset()
    result = chi_square_check(counts, law, FUSED_ALPHA, simulate=NULL_DRAWS)
    assert result.passed, (result, chi_square_detectable_tv(law, SAMPLES, FUSED_ALPHA))


@pytest.mark.parametrize(("builder", "params"), [("chain", {}), ("fixed", {"width": 2, "draw": "iid"})],
                         ids=["chain", "fixed-tree"])
def test_the_fused_law_check_rejects_a_head_that_drops_the_temperature(monkeypatch: pytest.MonkeyPatch, builder: str,
                                                                       params: dict[str, object]) -> None:
    """The check has power against a bug inside a fused head: the target's logits reach it scaled back up by
    ``T`` (so its processing divides the temperature out), with the filters kept.

    As in ``test_generate``'s test of the same bug in the unfused loop: that
    head is lossless for the target's law at temperature 1 with the same
    filters, which puts 0 on cells the right law fills with an expected 41 of
    700 samples (asserted > 30), so the chi-square check fails with
    overwhelming probability; that the counts fit the bug's own law fails
    falsely with probability ``FUSED_ALPHA``.
    """
    from spec.llm import step_graph, tree_step_graph

    setting = SETTINGS[1]
    target, draft = _law_pair()
    right, wrong = exact_two_token_law(target, *setting), exact_two_token_law(target, 1.0, *setting[1:])
    lost = (right > 0) & (wrong == 0)
    assert right[lost].sum() * SAMPLES > 30  # the bug empties cells the right law fills
    plain = step_graph.target_rows_and_fault

    def unscaled(sampling: Any, t_logits: torch.Tensor, *args: Any) -> Any:
        return plain(sampling, t_logits * setting[0], *args)

    monkeypatch.setattr(step_graph, "target_rows_and_fault", unscaled)  # the chain head's
    monkeypatch.setattr(tree_step_graph, "target_rows_and_fault", unscaled)  # the tree head's
    counts = fused_counts(target, draft, builder, "traversal" if builder == "fixed" else "sps", params, setting)
    assert counts[lost].sum() == 0 and counts.sum() == SAMPLES
    assert not chi_square_check(counts, right, FUSED_ALPHA, simulate=NULL_DRAWS).passed
    assert chi_square_check(counts, wrong, FUSED_ALPHA, simulate=NULL_DRAWS).passed  # it follows the bug's law: not just noise
