"""The decode loop on tiny random Llama pairs: greedy equivalence, losslessness, bad input."""

from __future__ import annotations

import importlib.metadata
import itertools
import re
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from spec.builders import BUILDERS  # noqa: E402
from spec.llm.generate import VERIFIERS, ar_generate, generate  # noqa: E402
from spec.llm.verify import TREE_METHODS  # noqa: E402
from tests.spec.llm.conftest import NULL_DRAWS, SavedPair, greedy_decode, step_roots  # noqa: E402
from tests.spec.llm.test_sampling import reference  # noqa: E402
from verification.calibrated import bonferroni, chi_square_check, chi_square_detectable_tv  # noqa: E402

pytestmark = pytest.mark.llm

CHAIN = ("sps", "asps", "block")
# `tmc decode` is registered through an entry point: without the installed package (e.g. PYTHONPATH only) it is absent
needs_decode_command = pytest.mark.skipif(
    not any(ep.name == "spec" for ep in importlib.metadata.entry_points(group="tmc.commands")),
    reason="package not installed: tmc decode is registered through an entry point")


def test_spec_generate_is_the_decode_loop() -> None:
    """The issue's spelling, ``spec.generate(...)``, reaches the decode loop (loaded on first use)."""
    import spec
    import spec.llm.generate as module

    assert spec.generate is module.generate and spec.ar_generate is module.ar_generate


def _tiny(vocab: int, seed: int, layers: int = 2, hidden: int = 32, scale: float = 1.0) -> object:
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=4,
                                   intermediate_size=64, max_position_embeddings=256, attn_implementation="sdpa")
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # sharper rows than the default init, so trees get deep
        model.lm_head.weight.mul_(scale)
    return model


@pytest.fixture(scope="module")
def pair() -> tuple[object, object]:
    return _tiny(13, 0, scale=40.0), _tiny(13, 1, layers=1, scale=40.0)


def test_temperature_zero_every_builder_and_verifier_is_greedy(pair: tuple[object, object]) -> None:
    target, draft = pair
    prompt = [3, 1, 4, 1, 5]
    ref = greedy_decode(target, prompt, 16)
    assert ar_generate(target, prompt, temperature=0, max_new_tokens=16).tokens == ref
    _assert_every_builder_and_verifier_is_greedy(target, draft, prompt, ref)


def _assert_every_builder_and_verifier_is_greedy(target: object, draft: object, prompt: list[int], ref: list[int],
                                                 **kw: Any) -> None:
    """``generate`` at temperature 0 (with ``kw``) gives ``ref`` for every builder x lossless verifier x backend."""
    ran = 0
    for name, verifier, backend in itertools.product(BUILDERS, VERIFIERS, ("torch", "numpy")):
        if verifier in CHAIN and name != "chain":
            continue
        try:
            out = generate(target, draft, prompt, name, verifier, temperature=0, max_new_tokens=16, budget=6, seed=1,
                           verify_backend=backend, **kw)
        except ValueError as err:  # not lossless on this builder's trees: refused, never run
            assert "verif" in str(err)
            continue
        assert out.tokens == ref, (name, verifier, backend, kw)
        ran += 1
    assert ran >= 40


@pytest.mark.parametrize(("draft_temperature", "top_k"), [(1.0, None), (2.0, 5)])
def test_temperature_zero_with_a_warm_draft_is_greedy(pair: tuple[object, object], draft_temperature: float,
                                                     top_k: int | None) -> None:
    """A draft at its own temperature under a greedy target (``draft_temperature``): every builder x
    verifier still gives plain greedy decoding, and the trees branch.

    At ``temperature=0`` the draft's one-hot rows make every sampled or top-k tree a chain of
    ``budget`` nodes, one draft forward per node; drafted warm, the fixed and DySpec trees of 6 nodes
    have siblings, so their steps take fewer draft forwards (checked for the top-k and the swor fixed
    tree and DySpec, with the residual verifier).  A draft temperature that reached the target's rows
    would break the equality with greedy decoding."""
    target, draft = pair
    prompt = [3, 1, 4, 1, 5]
    ref = greedy_decode(target, prompt, 16)
    _assert_every_builder_and_verifier_is_greedy(target, draft, prompt, ref, top_k=top_k,
                                                 draft_temperature=draft_temperature)
    for name, params in (("fixed", {"draw": "topk"}), ("fixed", {}), ("dyspec", {})):
        forwards = [sum(s.draft_forwards for s in generate(
            target, draft, prompt, name, "multidraft", temperature=0, top_k=top_k, max_new_tokens=16, budget=6,
            seed=1, builder_params=params, draft_temperature=dt).steps) / len(ref) for dt in (None, draft_temperature)]
        assert forwards[1] < forwards[0], (name, params, forwards)


def test_temperature_zero_confidence_chains_are_greedy(pair: tuple[object, object]) -> None:
    """Chains that stop at the first token with ``q(x) < confidence`` (the draft at 1, so its rows are not
    one-hot): plain greedy decoding for every verifier, on both paths, with chains of several lengths."""
    target, draft = pair
    prompt = [3, 1, 4, 1, 5]
    ref = greedy_decode(target, prompt, 16)
    sizes: set[int] = set()
    for verifier, draw, on_device in itertools.product(VERIFIERS, ("iid", "topk"), (True, False)):
        if verifier == "kseq" and draw == "topk":
            continue
        out = generate(target, draft, prompt, "chain", verifier, temperature=0, max_new_tokens=16, budget=6, seed=1,
                       builder_params={"draw": draw, "confidence": 0.2}, draft_temperature=1.0,
                       chain_on_device=on_device)
        assert out.tokens == ref, (verifier, draw, on_device)
        sizes |= {s.tree_size for s in out.steps}
    assert len(sizes) > 2 and max(sizes) <= 6, sizes


def test_confidence_chain_is_transformers_assisted_generation(monkeypatch: pytest.MonkeyPatch) -> None:
    """A second implementation of the same algorithm: at temperature 0, transformers' assisted generation
    drafts the assistant's argmax chain (up to ``num_assistant_tokens`` = 20) and stops after the first
    token whose softmax probability is below ``assistant_confidence_threshold``.  Our argmax chain with
    ``confidence`` and the draft's rows at temperature 1 must give the same tokens in the same number of
    target forwards (one per step for both: transformers feeds the prompt with its first candidates).
    The draft is a noisy copy of the target, so chains of several tokens are accepted; transformers'
    threshold tuning (scikit-learn's ROC curve, when installed) is turned off so the threshold stays put.
    """
    import copy

    import transformers.generation.candidate_generator as candidates

    monkeypatch.setattr(candidates, "is_sklearn_available", lambda: False)
    target = _tiny(29, 3, scale=12.0)
    target.generation_config.eos_token_id = None  # type: ignore[attr-defined]  # token 2 is a token like any other
    draft = copy.deepcopy(target)
    with torch.no_grad():
        w = draft.lm_head.weight  # type: ignore[attr-defined]
        w.add_(torch.randn(w.shape, generator=torch.Generator().manual_seed(0)) * float(w.std()) * 0.5)
    lengths: set[int] = set()
    for confidence, prompt in itertools.product((0.4, 0.7), ([5, 3, 5], [1, 2, 3, 4], [7], [2, 2, 8, 1])):
        draft.generation_config.assistant_confidence_threshold = confidence  # type: ignore[attr-defined]
        ids = torch.tensor([prompt])
        calls = [0]
        hook = target.register_forward_pre_hook(  # type: ignore[attr-defined]
            lambda *_: calls.__setitem__(0, calls[0] + 1))
        try:
            seq = target.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=draft,  # type: ignore[attr-defined]
                                  do_sample=False, max_new_tokens=40, pad_token_id=0)
        finally:
            hook.remove()
        ours = generate(target, draft, prompt, "chain", "sps", budget=20, temperature=0, draft_temperature=1.0,
                        builder_params={"draw": "topk", "confidence": confidence}, max_new_tokens=40, seed=0)
        assert ours.tokens == seq[0, len(prompt):].tolist(), (confidence, prompt)
        assert len(ours.steps) == calls[0], (confidence, prompt)
        lengths |= {s.tree_size for s in ours.steps}
    assert max(lengths) >= 3, lengths


def test_verify_backends_give_the_same_tokens(pair: tuple[object, object]) -> None:
    """The torch verifiers and their numpy references (``verify_backend``) in the whole loop, at temperature
    above 0: the same uniforms give the same tokens and the same accepted counts, step by step."""
    target, draft = pair
    ran = 0
    for name, verifier in itertools.product(BUILDERS, VERIFIERS):
        if (verifier in CHAIN) != (name == "chain"):
            continue
        for seed, (temperature, top_k) in itertools.product(range(3), ((1.0, None), (0.7, 5))):
            kw = dict(temperature=temperature, top_k=top_k, max_new_tokens=12, budget=6, seed=seed)
            try:
                runs = [generate(target, draft, [3, 1, 4], name, verifier, verify_backend=b, **kw)
                        for b in ("torch", "numpy", "auto")]
            except ValueError as err:  # not lossless on this builder's trees
                assert "verif" in str(err)
                break
            steps = [[(s.accepted, s.emitted, s.tree_size) for s in r.steps] for r in runs]
            assert runs[0].tokens == runs[1].tokens == runs[2].tokens, (name, verifier, seed, temperature)
            assert steps[0] == steps[1] == steps[2]
            ran += 1
    assert ran >= 6 * 12


def test_self_draft_accepts_everything(pair: tuple[object, object]) -> None:
    target, _ = pair
    out = generate(target, target, [2, 7], "chain", "sps", temperature=1.0, max_new_tokens=10, budget=4, seed=0)
    assert [s.accepted for s in out.steps] == [4, 4][: len(out.steps)]
    assert out.tokens_per_step == 5.0


def test_one_draft_forward_per_layer(pair: tuple[object, object]) -> None:
    target, draft = pair
    out = generate(target, draft, [1, 2, 3], "fixed", "traversal", temperature=1.0, max_new_tokens=12, budget=12,
                   builder_params={"width": 2, "depth": 3}, seed=2)
    for s in out.steps:
        assert s.draft_forwards <= 3 + 1  # layers (+ the pending tokens of the step)


def assert_steps_count_the_tokens(out: Any) -> None:
    """Per-step statistics consistent with the tokens returned: each step emits its accepted draft tokens
    and one more, except a last step cut by EOS / ``max_new_tokens``, which counts only the tokens it kept."""
    assert sum(s.emitted for s in out.steps) == len(out.tokens)
    assert all(s.accepted == s.emitted - 1 for s in out.steps[:-1])
    assert not out.steps or out.steps[-1].emitted - 1 <= out.steps[-1].accepted <= out.steps[-1].emitted


def test_a_subnormal_temperature_decodes_greedily(pair: tuple[object, object]) -> None:
    """T = 1e-320 passed validation and overflowed logits / T (NaN rows: an AssertionError deep in the
    sampler, or token 0 every step with the torch verifier); it is greedy decoding on every path."""
    target, draft = pair
    ref = greedy_decode(target, [5, 6], 6)
    for builder, verifier, kw in (("chain", "sps", {}), ("chain", "sps", {"verify_backend": "torch"}),
                                  ("fixed", "traversal", {}), ("dyspec", "traversal", {})):
        out = generate(target, draft, [5, 6], builder, verifier, temperature=1e-320, max_new_tokens=6, **kw)
        assert out.tokens == ref, (builder, verifier, kw)
    assert ar_generate(target, [5, 6], temperature=1e-320, max_new_tokens=6).tokens == ref


def test_eos_and_length_cuts(pair: tuple[object, object]) -> None:
    target, draft = pair
    ref = greedy_decode(target, [5, 6], 12)
    out = generate(target, draft, [5, 6], "dyspec", "multidraft", temperature=0, max_new_tokens=7, budget=8)
    assert out.tokens == ref[:7]
    assert_steps_count_the_tokens(out)
    eos = ref[3]
    out = generate(target, draft, [5, 6], "dyspec", "multidraft", temperature=0, max_new_tokens=12, budget=8, eos_token_id=eos)
    assert out.tokens == ref[: ref.index(eos) + 1]
    assert_steps_count_the_tokens(out)
    assert generate(target, draft, [5, 6], max_new_tokens=0).tokens == []
    # the target drafting for itself: every draft token accepted, so a step cut to n < 5 tokens keeps n of
    # its 4 accepted ones (it used to report all 4), eagerly and fused
    for kw in ({}, {"step_graph": True, "cache": "static"}):
        for n in (1, 2, 7):
            out = generate(target, target, [5, 6], "chain", "sps", temperature=0, budget=4, max_new_tokens=n, **kw)
            assert out.tokens == ref[:n]
            assert_steps_count_the_tokens(out)
            assert out.steps[0].accepted == min(n, 4)


def _cut(tokens: list[int], stops: set[int]) -> list[int]:
    """``tokens`` up to and including the first one in ``stops`` (written out here, not imported)."""
    out = []
    for t in tokens:
        out.append(t)
        if t in stops:
            break
    return out


@pytest.mark.parametrize(("builder", "verifier", "params"), [
    ("chain", "sps", {}),  # the device chain step
    ("chain", "traversal", {"confidence": 0.5}),  # a confidence chain with a tree verifier: the host builder
    ("fixed", "traversal", {"width": 2, "depth": 3}),  # the device tree step (i.i.d.)
    ("dyspec", "multidraft", {}),  # the host builder
])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_several_stop_tokens_end_generation_at_the_first_of_any(
        pair: tuple[object, object], builder: str, verifier: str, params: dict[str, Any], temperature: float) -> None:
    """``eos_token_id`` as a list (a ``generation_config`` may list several): the output is the run without
    stop tokens cut after the first token in the list, whichever it is.  The steps before the cut draw the
    same noise, so at T = 1 this holds sample by sample.  The stop listed second occurs first, so honouring
    only the first id of the list fails."""
    target, draft = pair
    kw: dict[str, Any] = dict(temperature=temperature, budget=6, seed=3, builder_params=params)
    for prompt in ([5, 6], [2, 9, 4]):
        free = generate(target, draft, prompt, builder, verifier, max_new_tokens=24, **kw).tokens
        k = next(i for i in range(2, len(free)) if free[i] not in free[:i])  # a token's first occurrence
        late = next(t for t in range(13) if t not in free[: k + 1])  # not met before position k
        for stops in ([late, free[k]], (free[k], late), np.array([late, free[k]]), torch.tensor([free[k], late])):
            out = generate(target, draft, prompt, builder, verifier, max_new_tokens=24, eos_token_id=stops, **kw)
            assert out.tokens == free[: k + 1] == _cut(free, {late, free[k]})
            assert_steps_count_the_tokens(out)
        plain = ar_generate(target, prompt, temperature=temperature, seed=3, max_new_tokens=24).tokens
        j = max(i for i in range(len(plain)) if plain[i] not in plain[:i])  # the last new token
        other = next(t for t in range(13) if t not in plain[: j + 1])
        assert ar_generate(target, prompt, temperature=temperature, seed=3, max_new_tokens=24,
                           eos_token_id=[other, plain[j]]).tokens == plain[: j + 1]


@pytest.mark.parametrize(("value", "expected"), [
    (None, set()), (4, {4}), ([4, 7], {4, 7}), ((7, 4, 7), {4, 7}), ([], set()), ({0, 12}, {0, 12}),
    (np.array([3, 5]), {3, 5}), (np.int64(5), {5}), (torch.tensor(6), {6}), (torch.tensor([6, 1]), {1, 6}),
])
def test_stop_ids_reads_one_id_or_a_collection(value: object, expected: set[int]) -> None:
    from spec.llm.generate import stop_ids

    assert stop_ids(value, 13) == expected


@pytest.mark.parametrize(("value", "message"), [
    ("2", "a collection of token ids"),
    (b"2", "a collection of token ids"),
    (13, "eos_token_id = 13 is outside the vocabulary"),
    ([1, 13], r"eos_token_id\[1\] = 13 is outside the vocabulary"),
    ([1, -1], r"eos_token_id\[1\]"),
    (-2, "eos_token_id"),
    (2.5, "eos_token_id"),
    ([1, [2]], r"eos_token_id\[1\]"),
    (True, "eos_token_id"),
    ({1: 2}, "a collection of token ids"),  # audit of 2026-11-27: read as its keys, stopping at 1
])
def test_bad_stop_ids_are_named(pair: tuple[object, object], value: object, message: str) -> None:
    target, draft = pair
    with pytest.raises(ValueError, match=message):
        generate(target, draft, [1, 2], "chain", "sps", max_new_tokens=3, eos_token_id=value)
    with pytest.raises(ValueError, match=message):
        ar_generate(target, [1, 2], max_new_tokens=3, eos_token_id=value)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"input_ids": []}, "at least one"),
        ({"input_ids": [99]}, "outside the vocabulary"),
        ({"input_ids": [5, 13]}, r"outside the vocabulary \[0, 13\): \[13\]"),  # the first id past it
        ({"verifier": "nope"}, "unknown verifier"),
        ({"builder": "nope"}, "unknown builder"),
        ({"builder": "dyspec", "verifier": "sps"}, "chains"),
        # a one-wide swor tree is a chain, refused up front by its draw (not at its first step's verification)
        ({"builder": "fixed", "verifier": "sps", "builder_params": {"width": 1, "draw": "swor"}}, "fixed draws swor"),
        ({"builder": "dyspec", "verifier": "ordered_traversal"}, "number of children"),
        ({"temperature": -1.0}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_k": 0}, "top_k"),
        ({"budget": 0}, "budget"),
        ({"order": "zigzag"}, "order"),
        ({"verify_backend": "jax"}, "verify_backend"),
        ({"draft_temperature": -0.5}, "draft_temperature must be >= 0"),
        ({"draft_temperature": float("nan")}, "draft_temperature must be a finite"),
        ({"draft_temperature": "1"}, "draft_temperature must be a finite"),
        # found by an audit of the decode API: each was accepted or raised something other than a ValueError
        ({"input_ids": {2, 1}}, "input_ids must be a sequence .* got set"),  # decoded as [1, 2]
        ({"input_ids": {1: 0, 2: 0}}, "input_ids must be a sequence .* got dict"),  # decoded as its keys
        ({"input_ids": bytearray(b"\x01\x02")}, "input_ids must be a sequence .* got bytearray"),
        ({"input_ids": np.array(1)}, r"input_ids must be a 1-D sequence .* got shape \(\)"),  # a TypeError
        ({"input_ids": np.array([[1, 2], [1, 2]])}, r"input_ids: batch size 1 only, got shape \(2, 2\)"),
        ({"input_ids": [[1, 2], [1, 2]]}, r"input_ids: batch size 1 only, got 2 rows"),
        ({"input_ids": torch.tensor([1, 2], device="meta")}, "input_ids must be a dense tensor with data"),
        ({"input_ids": torch.tensor([[1, 2]]).to_sparse()}, "input_ids must be a dense tensor with data"),
        # audit of 2026-11-27: decoded, although a bf16 / fp16 ids tensor may hold rounded ids
        ({"input_ids": torch.tensor([1.0, 2.0])}, "input_ids must hold integer token ids, got a tensor of dtype "
                                                  "torch.float32"),
        ({"input_ids": torch.tensor([[1, 2]], dtype=torch.bfloat16)}, "integer token ids, .* torch.bfloat16"),
        ({"input_ids": np.array([1.0, 2.0])}, "integer token ids, got a tensor of dtype float64"),
        ({"input_ids": torch.tensor([True, False])}, "integer token ids, got a tensor of dtype torch.bool"),
        ({"builder": ["chain"]}, r"unknown builder \['chain'\]"),  # a TypeError (unhashable)
        ({"builder_params": "width=2"}, "builder_params must be a mapping .* got str"),  # a TypeError
        ({"builder_params": [("width", 2)]}, "builder_params must be a mapping .* got list"),
    ],
)
def test_bad_input(pair: tuple[object, object], kwargs: dict[str, object], message: str) -> None:
    target, draft = pair
    args = {"input_ids": [1, 2], "builder": "chain", "verifier": "traversal", "max_new_tokens": 3, **kwargs}
    with pytest.raises(ValueError, match=message):
        generate(target, draft, **args)  # type: ignore[arg-type]


@pytest.mark.parametrize("builder, params", [("dynatree", {}), ("wetap", {}), ("fixed", {"draw": "topk"})])
def test_a_chain_verifier_on_a_branching_builder_is_refused_before_any_step(pair: tuple[object, object], builder: str,
                                                                            params: dict[str, object]) -> None:
    """These builders grow ``topk`` chains from a one-hot draft only.  From a near-greedy draft (temperature 0.005)
    the first branching tree came after 3 to 20 steps by seed, and the decode raised there, its tokens lost
    (audit of 2026-11-28); now refused before the target runs, and decoded in full from a one-hot draft."""
    target, draft = pair
    calls = {"n": 0}
    hook = target.register_forward_hook(lambda *_: calls.__setitem__("n", calls["n"] + 1))  # type: ignore[attr-defined]
    try:
        for seed in range(3):
            with pytest.raises(ValueError, match="verifier 'sps' verifies chains; .*branches unless the draft is one-hot"):
                generate(target, draft, [1, 2], builder, "sps", budget=4, temperature=1.0, draft_temperature=0.005,
                         max_new_tokens=24, seed=seed, builder_params=params)
        assert calls["n"] == 0
    finally:
        hook.remove()
    want = greedy_decode(target, [1, 2], 8)
    # the last: the draft at its own temperature keeps top_k (and top_p), so top_k 1 still makes it one-hot
    for one_hot in ({"temperature": 0.0}, {"temperature": 1.0, "draft_temperature": 0.0}, {"temperature": 1.0, "top_k": 1},
                    {"temperature": 1.0, "top_k": 1, "draft_temperature": 0.7}):
        out = generate(target, draft, [1, 2], builder, "sps", budget=4, max_new_tokens=8, seed=0, builder_params=params,
                       **one_hot)  # type: ignore[arg-type]
        assert len(out.tokens) == 8
        if one_hot["temperature"] == 0.0 or "top_k" in one_hot:  # target greedy too: greedy decoding's tokens
            assert out.tokens == want


def test_a_prompt_as_a_numpy_or_list_row_decodes_as_the_list(pair: tuple[object, object]) -> None:
    """``return_tensors="np"`` gives a ``(1, n)`` array, refused before as ``input_ids[0] must be an integer``;
    it and ``[[1, 2]]`` now decode as ``[1, 2]``, as a ``(1, n)`` tensor did."""
    target, draft = pair
    want = generate(target, draft, [1, 2], "chain", "traversal", max_new_tokens=4).tokens
    for ids in (np.array([[1, 2]]), [[1, 2]], torch.tensor([[1, 2]]), np.array([1, 2])):
        assert generate(target, draft, ids, "chain", "traversal", max_new_tokens=4).tokens == want


def test_a_model_in_training_mode_is_refused(pair: tuple[object, object]) -> None:
    """A model built from a config is in training mode; with dropout (GPT-2's 0.1) every forward had another
    law, so temperature 0 gave a different text each run, unlike greedy decoding.  Refused by name."""
    target, draft = pair
    for role, model in (("target", target), ("draft", draft)):
        model.train()  # type: ignore[attr-defined]
        try:
            with pytest.raises(ValueError, match=f"{role} is in training mode .* call {role}.eval\\(\\)"):
                generate(target, draft, [1, 2], "chain", "traversal", max_new_tokens=2)
            if role == "target":
                with pytest.raises(ValueError, match="target is in training mode"):
                    ar_generate(target, [1, 2], max_new_tokens=2)
        finally:
            model.eval()  # type: ignore[attr-defined]


def test_a_static_cache_past_any_device_is_a_memory_error_before_torch_is_asked(pair: tuple[object, object]) -> None:
    """``max_new_tokens = 2**62`` with the static cache ended in torch's "Storage size calculation overflowed"
    (a RuntimeError) and 2**63 in a TypeError, both tracebacks from ``tmc decode``."""
    target, draft = pair
    for n in (2**62, 2**63):
        with pytest.raises(MemoryError, match="the static cache of .* slots needs"):
            generate(target, draft, [1, 2], "chain", "sps", max_new_tokens=n, cache="static")
        with pytest.raises(MemoryError, match="the static cache of .* slots needs"):
            ar_generate(target, [1, 2], max_new_tokens=n, cache="static")


@pytest.mark.parametrize(("builder", "temperature"), list(itertools.product(sorted(BUILDERS), (0.0, 1.0))))
def test_nan_target_logits_are_named_for_every_builder(builder: str, temperature: float) -> None:
    """The same for the target's logits: the message names the target (it read "logits contain NaN" for either
    model), on every builder's path and in plain decoding."""
    target, draft = _tiny(13, 0, scale=40.0), _tiny(13, 1, layers=1, scale=40.0)
    with torch.no_grad():
        target.lm_head.weight[:, 0] = float("nan")  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="^target's logits contain NaN"):
        generate(target, draft, [1, 2], builder, "traversal", temperature=temperature, max_new_tokens=4, budget=4)
    with pytest.raises(ValueError, match="^target's logits contain NaN"):
        ar_generate(target, [1, 2], temperature=temperature, max_new_tokens=4)


@pytest.mark.parametrize(("builder", "temperature"), list(itertools.product(sorted(BUILDERS), (0.0, 1.0))))
def test_nan_draft_logits_are_named_for_every_builder(builder: str, temperature: float) -> None:
    """A draft whose logits hold NaN gives the usual ``ValueError`` on every builder's path: host builders
    (DySpec's rows, WETAP's beam, DynaTree's per-row ranking on the draft's side), chains and fixed trees
    drafted on the device, and the chains a greedy draft gives them."""
    target, draft = _tiny(13, 0, scale=40.0), _tiny(13, 1, layers=1, scale=40.0)
    with torch.no_grad():
        draft.lm_head.weight[:, 0] = float("nan")  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="^draft's logits contain NaN"):  # named: draft and target share a Sampling
        generate(target, draft, [1, 2], builder, "traversal", temperature=temperature, max_new_tokens=4, budget=4)


def test_models_on_two_devices_are_refused_before_any_forward(pair: tuple[object, object]) -> None:
    """The device chain and tree paths hand the draft's tensors to the target: one device for both, else a
    ``ValueError`` naming the two (a draft on the meta device stands in for a second device here)."""
    import copy

    target, draft = pair
    elsewhere = copy.deepcopy(draft).to("meta")  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="target and draft must be on one device, got cpu and meta"):
        generate(target, elsewhere, [1, 2], "chain", "sps", max_new_tokens=3)


@pytest.mark.parametrize("impl", ["flex_attention", "flash_attention_2"])
def test_attention_that_ignores_the_tree_mask_is_refused_before_any_forward(
        pair: tuple[object, object], impl: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only ``sdpa`` and ``eager`` take the tree's 4D mask: another implementation on either model is named
    in a ``ValueError`` before the prefill (the config is relabelled: flash-attention is not installed
    here).  ``ar_generate`` on the static cache, whose forwards pass a mask, refuses it too."""
    import spec.llm.generate as gen

    target, draft = pair
    fed: list[object] = []
    for name, model in (("target", target), ("draft", draft)):
        with monkeypatch.context() as m:
            m.setattr(gen, "_prefill", lambda *a: fed.append(a))
            m.setattr(model.config, "_attn_implementation", impl)  # type: ignore[attr-defined]
            with pytest.raises(ValueError, match=f"{name} attends with attn_implementation='{impl}'.*'sdpa'"):
                generate(target, draft, [1, 2], "chain", "sps", max_new_tokens=3)
            if name == "target":
                with pytest.raises(ValueError, match="target attends with"):
                    ar_generate(target, [1, 2], max_new_tokens=3, cache="static")
    assert fed == []
    with monkeypatch.context() as m:
        m.setattr(target.config, "_attn_implementation", "eager")  # type: ignore[attr-defined]
        assert generate(target, draft, [1, 2], "chain", "sps", temperature=0, max_new_tokens=6).tokens == \
            greedy_decode(target, [1, 2], 6)


#: Other causal LM families, as tiny random models: (model class, config class, config arguments).  They
#: differ from Llama where a tree pass could go wrong: learned absolute positions (GPT-2; OPT with its offset),
#: partial rotary (GPT-NeoX, GPT-J), scaled embeddings (Gemma), fused projections (Phi-3), q/k norms (Qwen3),
#: multi-query attention (Falcon, GPTBigCode).
_LLAMA_LIKE: dict[str, Any] = dict(hidden_size=32, num_attention_heads=4, intermediate_size=64,
                                   max_position_embeddings=256)
ARCHITECTURES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "qwen2": ("Qwen2ForCausalLM", "Qwen2Config", dict(_LLAMA_LIKE, num_key_value_heads=2)),
    "qwen3": ("Qwen3ForCausalLM", "Qwen3Config", dict(_LLAMA_LIKE, num_key_value_heads=2, head_dim=8)),
    "phi3": ("Phi3ForCausalLM", "Phi3Config", dict(_LLAMA_LIKE, num_key_value_heads=2, pad_token_id=0)),
    "gemma": ("GemmaForCausalLM", "GemmaConfig", dict(_LLAMA_LIKE, num_key_value_heads=2, head_dim=8)),
    "gpt_neox": ("GPTNeoXForCausalLM", "GPTNeoXConfig", dict(_LLAMA_LIKE)),
    "opt": ("OPTForCausalLM", "OPTConfig", dict(hidden_size=32, num_attention_heads=4, ffn_dim=64,
                                                 word_embed_proj_dim=32, max_position_embeddings=256)),
    "gpt2": ("GPT2LMHeadModel", "GPT2Config", dict(n_embd=32, n_head=4, n_positions=256)),
    # one key/value head (the static cache sizes its buffers for it), and Falcon's layout that caches a
    # key per query head
    "falcon": ("FalconForCausalLM", "FalconConfig", dict(hidden_size=32, num_attention_heads=4)),
    "falcon_new": ("FalconForCausalLM", "FalconConfig", dict(hidden_size=32, num_attention_heads=4, num_kv_heads=2,
                                                             new_decoder_architecture=True)),
    "gpt_bigcode": ("GPTBigCodeForCausalLM", "GPTBigCodeConfig", dict(n_embd=32, n_head=4, n_positions=256)),
    "gptj": ("GPTJForCausalLM", "GPTJConfig", dict(n_embd=32, n_head=4, n_positions=256, rotary_dim=4)),
}
#: the config's name for the number of layers, where it is not ``num_hidden_layers``
_DEPTH_KEY = {"gpt2": "n_layer", "gpt_bigcode": "n_layer", "gptj": "n_layer"}
#: GPT-J takes no sdpa in transformers 5.17; eager takes the mask in every version
_IMPL = {"gptj": "eager"}
#: transformers 5.17's GPTBigCode module uses torch.jit.script, which torch 2.13 deprecates on import
_ARCH_PARAMS = [pytest.param(name, marks=pytest.mark.filterwarnings(
    "ignore:`torch.jit.script` is deprecated:DeprecationWarning")) if name == "gpt_bigcode" else name
    for name in sorted(ARCHITECTURES)]


def _tiny_arch(name: str, seed: int, layers: int) -> object:
    model_cls, config_cls, extra = ARCHITECTURES[name]
    depth = {_DEPTH_KEY.get(name, "num_hidden_layers"): layers}
    torch.manual_seed(seed)
    config = getattr(transformers, config_cls)(vocab_size=13, bos_token_id=None, eos_token_id=None, **extra, **depth)
    config._attn_implementation = _IMPL.get(name, "sdpa")
    model = getattr(transformers, model_cls)(config).eval()
    with torch.no_grad():  # sharper rows, so trees get deep (GPT-2's tied head is sharp enough as it is)
        model.get_output_embeddings().weight.mul_(1.0 if name == "gpt2" else 10.0)
    return model


@pytest.mark.parametrize("arch", _ARCH_PARAMS)
def test_other_architectures_decode_greedily_through_the_tree_pass(arch: str) -> None:
    """Beyond Llama: at T = 0, a host tree builder, the device chain and a device tree give plain greedy
    decoding (full recompute) on both caches, for ten other families of causal LM."""
    target, draft = _tiny_arch(arch, 0, 2), _tiny_arch(arch, 1, 1)
    prompt = [3, 1, 4, 1, 5]
    ref = greedy_decode(target, prompt, 16)
    assert ar_generate(target, prompt, temperature=0, max_new_tokens=16).tokens == ref
    for (builder, verifier), cache in itertools.product(
            [("dyspec", "traversal"), ("chain", "sps"), ("fixed", "multidraft")], ["dynamic", "static"]):
        out = generate(target, draft, prompt, builder, verifier, temperature=0, max_new_tokens=16, budget=6,
                       cache=cache, draft_temperature=1.0)
        assert out.tokens == ref, (builder, verifier, cache)
        assert max(s.tree_size for s in out.steps) > 1


@pytest.mark.parametrize("arch", ["gpt2", "opt", "gpt_bigcode"])
def test_learned_position_tables_bound_the_decode_by_name(arch: str, pair: tuple[object, object]) -> None:
    """A learned absolute position table of 24 positions (OPT's with its offset of 2): a decode that stays
    within it gives greedy decoding; one that could feed position 24 is refused by name before it starts
    (it failed with an index error deep in the forward: a tree's nodes sit up to ``budget`` past its root).
    A speculative decode cuts its last steps' trees to the positions left, so it runs to one position short
    of plain decoding's end (until 2026-11-27 it was refused ``budget`` - 1 positions earlier: at 14 new
    tokens here instead of 19; and WETAP, whose draft is fed ``length`` - 1 deep whatever the budget, failed
    with an ``IndexError`` within that bound)."""
    import spec.llm.adapter as adapter

    key = {"gpt2": "n_positions", "gpt_bigcode": "n_positions"}.get(arch, "max_position_embeddings")
    model_cls, config_cls, extra = ARCHITECTURES[arch]
    models = []
    for seed, layers in ((0, 2), (1, 1)):
        torch.manual_seed(seed)
        config = getattr(transformers, config_cls)(vocab_size=13, bos_token_id=None, eos_token_id=None,
                                                   **dict(extra, **{key: 24}),
                                                   **{_DEPTH_KEY.get(arch, "num_hidden_layers"): layers})
        models.append(getattr(transformers, model_cls)(config).eval())
    target, draft = models
    assert adapter.learned_positions(target) == 24 and adapter.learned_positions(pair[0]) is None  # Llama: rotary
    prompt = [3, 1, 4, 1, 5]
    ref = greedy_decode(target, prompt, 20)
    assert ar_generate(target, prompt, temperature=0, max_new_tokens=20).tokens == ref  # feeds positions 0 .. 23
    with pytest.raises(ValueError, match="target has position embeddings for 24 positions.*may feed it 25"):
        ar_generate(target, prompt, temperature=0, max_new_tokens=21)
    capped = 0
    for (builder, verifier, params), cache in itertools.product(
            [("chain", "sps", {}), ("dyspec", "traversal", {}), ("fixed", "traversal", {"draw": "iid", "width": 2}),
             ("wetap", "traversal", {"w_min": 2, "w_max": 4})],  # L = 8 layers feed the draft 7 deep: cut too
            ["dynamic", "static"]):
        out = generate(target, draft, prompt, builder, verifier, temperature=0, max_new_tokens=19, budget=6,
                       draft_temperature=1.0, builder_params=params, cache=cache)
        assert out.tokens == ref[:19], (builder, verifier, cache)
        for past, s in step_roots(prompt, out.steps):  # its nodes go up to past + tree_size
            assert past + s.tree_size <= 23, (builder, cache, past, s)
            capped += s.tree_size < 6 and past + 6 > 23
        with pytest.raises(ValueError, match="position embeddings for 24 positions.*may feed it 25 .prompt "
                                             "\\+ max_new_tokens: the last step's root and one node"):
            generate(target, draft, prompt, builder, verifier, temperature=0, max_new_tokens=20, budget=6,
                     builder_params=params, cache=cache)
    assert capped >= 8  # every decode had a step whose full tree would have passed the table


def _gpt2(seed: int, layers: int, vocab: int, positions: int, **config: Any) -> Any:
    """A random-init GPT-2 of ``positions`` learned positions (no BOS / EOS)."""
    torch.manual_seed(seed)
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=vocab, n_layer=layers, n_positions=positions, bos_token_id=None, eos_token_id=None,
        **config)).eval()


def test_steps_cut_to_a_position_table_give_the_unfused_tokens_at_temperature_1() -> None:
    """Near a learned table's end the fused step (whose shape is fixed) hands over to the unfused path with
    the draft's state, and the device chain drafts fewer tokens: at T = 1 the fused, device-chain and host
    paths give the same tokens on the same seed (they draw the same uniforms), a GPT-2 pair of 24 positions
    decoded to 19 new tokens with a budget of 6, and some fused steps ran before the cut."""
    target, draft = (_gpt2(seed, layers, 13, 24, n_embd=32, n_head=4) for seed, layers in ((0, 2), (1, 1)))
    prompt = [3, 1, 4, 1, 5]
    fused_then_cut = 0
    for builder, verifier, params in (("chain", "sps", {}), ("chain", "traversal", {}),
                                      ("fixed", "traversal", {"draw": "iid", "width": 2})):
        for seed in range(3):
            outs = [generate(target, draft, prompt, builder, verifier, temperature=1, max_new_tokens=19, budget=6,
                             builder_params=params, cache="static", step_graph=graph, chain_on_device=device,
                             seed=seed) for graph, device in ((True, True), (False, True), (False, False))]
            assert outs[0].tokens == outs[1].tokens == outs[2].tokens, (builder, verifier, seed)
            graphed = [s.graph_s > 0 for s in outs[0].steps]
            fused_then_cut += any(graphed) and outs[0].steps[-1].tree_size < 6
    assert fused_then_cut >= 5


def test_a_wetap_decode_sizes_the_drafts_static_cache_for_its_unpruned_layers(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """WETAP feeds its draft every node of its first ``length`` - 1 layers (here up to 8 + 3 x 64), many more
    than its budget of 6: the draft's static cache is allocated once, for them, where it had to grow during
    the decode (here from 128 to 256 slots; each growth drops the graphs the cache captured)."""
    from spec.llm.models import tiny_pair
    from spec.llm.static_cache import StaticTreeCache

    sizes: list[int] = []
    real = StaticTreeCache._allocate

    def alloc(self: StaticTreeCache, capacity: int) -> None:
        sizes.append(capacity)
        real(self, capacity)

    monkeypatch.setattr(StaticTreeCache, "_allocate", alloc)
    target, draft = tiny_pair(29, seed=5)  # fresh models: fresh shared caches
    out = generate(target, draft, [1, 2, 3], "wetap", "traversal", max_new_tokens=12, budget=6, cache="static",
                   builder_params={"w_min": 8, "w_max": 64, "length": 5})
    assert len(out.tokens) == 12
    assert len(sizes) == 2, sizes  # target and draft, once each


@pytest.mark.parametrize("arch", ["GPTJ", "CodeGen"])
def test_fixed_sinusoid_position_tables_bound_the_decode_by_name(arch: str, pair: tuple[object, object]) -> None:
    """GPT-J and CodeGen keep a sinusoid table of ``n_positions`` rows as a buffer (``embed_positions``), not an
    embedding module, so it went unseen: a decode past it failed with an IndexError in the forward (a device
    assert on CUDA).  It is now read, and the decode refused by name before it starts."""
    import spec.llm.adapter as adapter

    torch.manual_seed(0)
    config = getattr(transformers, f"{arch}Config")(vocab_size=13, n_positions=24, n_embd=32, n_layer=1, n_head=4,
                                                   rotary_dim=4, bos_token_id=None, eos_token_id=None)
    config._attn_implementation = "eager"
    target = getattr(transformers, f"{arch}ForCausalLM")(config).eval()
    assert adapter.learned_positions(target) == 24
    prompt = [3, 1, 4, 1, 5]
    ref = greedy_decode(target, prompt, 20)
    assert ar_generate(target, prompt, temperature=0, max_new_tokens=20).tokens == ref
    with pytest.raises(ValueError, match="target has position embeddings for 24 positions.*may feed it 25"):
        ar_generate(target, prompt, temperature=0, max_new_tokens=21)
    # the last steps' chains cut to the table (a Llama draft: rotary, no table)
    assert generate(target, pair[1], prompt, "chain", "sps", temperature=0, max_new_tokens=19, budget=6,
                    draft_temperature=1.0).tokens == ref[:19]
    with pytest.raises(ValueError, match="target has position embeddings for 24 positions.*may feed it 25"):
        generate(target, pair[1], prompt, "chain", "sps", temperature=0, max_new_tokens=20, budget=6)


def test_auto_backend_is_torch_only_for_a_chain_verifier_on_a_gpu_drafted_chain_with_large_rows(
        pair: tuple[object, object], monkeypatch: pytest.MonkeyPatch) -> None:
    """``verify_backend="auto"``: the torch port for SpS / ASpS / block on a chain drafted on a GPU whose
    ``(budget + 1) x V`` target rows exceed ``HOST_VERIFY_MAX_ENTRIES``; the numpy reference for everything
    else, tree verifiers on a device-drafted chain and the CPU included.  ``generate`` passes its rows' size."""
    import spec.llm.generate as gen

    target, draft = pair
    bound = gen.HOST_VERIFY_MAX_ENTRIES
    assert bound == 4096 * 32  # 21 rows of V = 4096 under it, 5 rows of V = 32000 over it (README's H100 figures)

    class OnGpu:  # resolve_verify_backend reads only the device of the first parameter
        def parameters(self) -> Any:
            yield torch.empty(0, device="meta")

    assert gen.resolve_verify_backend(OnGpu(), "auto", True, bound + 1) == "torch"
    assert gen.resolve_verify_backend(OnGpu(), "auto", True, bound) == "numpy"
    assert gen.resolve_verify_backend(OnGpu(), "auto", True, 21 * 4096) == "numpy"
    assert gen.resolve_verify_backend(OnGpu(), "auto", True, 5 * 32000) == "torch"
    assert gen.resolve_verify_backend(OnGpu(), "auto", False, 10 * bound) == "numpy"
    assert gen.resolve_verify_backend(target, "auto", True, 10 * bound) == "numpy"  # the CPU
    assert gen.resolve_verify_backend(OnGpu(), "numpy", True, 10 * bound) == "numpy"
    assert gen.resolve_verify_backend(OnGpu(), "torch", True, 1) == "torch"
    seen: list[tuple[bool, int]] = []
    real = gen.resolve_verify_backend

    def spy(model: Any, backend: str, device_chain: bool, entries: int = 0) -> str:
        seen.append((device_chain, entries))
        return real(model, backend, device_chain, entries)

    monkeypatch.setattr(gen, "resolve_verify_backend", spy)
    vocab = int(target.config.vocab_size)  # type: ignore[attr-defined]
    for builder, verifier, on_device in (("chain", "sps", True), ("chain", "traversal", True),
                                         ("chain", "block", False), ("fixed", "traversal", True)):
        generate(target, draft, [1, 2], builder, verifier, max_new_tokens=2, budget=3, chain_on_device=on_device)
    assert seen == [(True, 4 * vocab), (False, 4 * vocab), (False, 4 * vocab), (False, 4 * vocab)]


def test_a_stateful_builder_is_told_how_many_tokens_each_step_accepted(pair: tuple[object, object]) -> None:
    """DynaTree's history adaptation reads each step's accepted count from ``next_state``: the decode passes the
    verifier's count, the ``accepted`` of the step's statistics (the last step's may be cut by the length).  The
    target drafts for itself, so most drafts are accepted and a count of 0 would show."""
    from spec.builders import DynaTreeBuilder

    seen: list[tuple[int, int]] = []

    class Recording(DynaTreeBuilder):  # a subclass: the host path, where the host builder keeps the state
        def next_state(self, state: Any, tree: Any, accepted: int) -> Any:
            seen.append((tree.size, accepted))
            return super().next_state(state, tree, accepted)

    target, _ = pair
    out = generate(target, target, [1, 2, 3], Recording(), "traversal", budget=6, max_new_tokens=60, seed=0)
    told, stats = [a for _, a in seen], [s.accepted for s in out.steps]
    assert len(told) == len(stats) and sum(told) > len(told)
    assert told[:-1] == stats[:-1] and told[-1] >= stats[-1]
    assert [n for n, _ in seen] == [s.tree_size for s in out.steps]
    assert sum(s.emitted for s in out.steps) == len(out.tokens) == 60


def test_one_token_vocabulary() -> None:
    """V = 1: every builder with every verifier it takes, both verifier backends, T = 0 and 1.
    The only law is the point mass at token 0, so every drafted token is accepted: a chain step
    emits its ``budget`` drafts plus one."""
    target, draft = _tiny(1, 0), _tiny(1, 1, layers=1)
    ran = 0
    for name, verifier, backend, temperature in itertools.product(BUILDERS, VERIFIERS, ("torch", "numpy"), (0.0, 1.0)):
        if verifier in CHAIN and name != "chain":
            continue
        try:
            out = generate(target, draft, [0], name, verifier, temperature=temperature, max_new_tokens=11, budget=4,
                           verify_backend=backend)
        except ValueError as err:  # not lossless on this builder's trees
            assert "verif" in str(err)
            continue
        assert out.tokens == [0] * 11, (name, verifier)
        if name == "chain":
            # 5 + 5 + 1: the last step, cut to the one token left, counts that one of its 4 accepted
            assert [s.accepted for s in out.steps] == [4, 4, 1], (verifier, backend)
        ran += 1
    assert ran >= 40
    for verifier, backend, on_device in itertools.product(TREE_METHODS, ("torch", "numpy"), (True, False)):
        # a fixed i.i.d. tree (on the device path by default): all four nodes are twins of token 0
        out = generate(target, draft, [0], "fixed", verifier, temperature=1.0, max_new_tokens=11, budget=4,
                       builder_params={"draw": "iid"}, verify_backend=backend, chain_on_device=on_device)
        assert out.tokens == [0] * 11 and out.steps[0].accepted == 2, (verifier, backend, on_device)  # depth 2
    with pytest.raises(ValueError, match="outside the vocabulary"):
        generate(target, draft, [1])


def test_ordered_traversal_refuses_wide_swor_nodes_on_a_large_vocabulary() -> None:
    """A fixed tree of width 3 drawn ``swor`` at T = 1 over 200 tokens: ordered Traversal would
    enumerate 7.9 M ordered triples per node, so ``generate`` refuses on both verifier backends.
    Before, the numpy backend (the CPU default) had no such check and enumerated them; one such
    node took the torch walk 22 s with its check turned off.  Width 2 has a closed form and runs."""
    target, draft = _tiny(200, 0), _tiny(200, 1, layers=1)
    for backend in ("torch", "numpy"):
        with pytest.raises(ValueError, match="3 children drawn 'swor'.*MAX_SWOR_TUPLES"):
            generate(target, draft, [1, 2], "fixed", "ordered_traversal", builder_params={"width": 3},
                     max_new_tokens=4, budget=6, verify_backend=backend)
        out = generate(target, draft, [1, 2], "fixed", "ordered_traversal", builder_params={"width": 2},
                       max_new_tokens=4, budget=6, verify_backend=backend)
        assert len(out.tokens) == 4


@pytest.mark.parametrize("draft_vocab", [11, 16])
def test_a_draft_with_another_vocabulary_size_gives_greedy_decoding(draft_vocab: int) -> None:
    """A draft whose embedding is smaller or larger than the target's (Qwen-style padding) drafts on the
    target's ids: seven builder × verifier pairs, both caches, a one-hot and a warm draft, T = 0.  The second
    prompt holds ids the smaller draft cannot embed, and greedy decoding emits them too."""
    target, draft = _tiny(13, 0, scale=40.0), _tiny(draft_vocab, 1, layers=1, scale=40.0)
    cases = [("chain", "sps"), ("chain", "block"), ("chain", "traversal"), ("fixed", "multidraft"),
             ("fixed", "traversal"), ("dyspec", "traversal"), ("dynatree", "multidraft")]
    for prompt in ([3, 1, 4, 1, 5], [12, 11, 2]):
        ref = greedy_decode(target, prompt, 16)
        if prompt[0] == 12:
            assert any(t >= 11 for t in ref)  # the target emits ids the 11-token draft lacks
        for (builder, verifier), cache, dtemp in itertools.product(cases, ["dynamic", "static"], [None, 1.0]):
            out = generate(target, draft, prompt, builder, verifier, temperature=0, max_new_tokens=16, budget=6,
                           cache=cache, draft_temperature=dtemp)
            assert out.tokens == ref, (builder, verifier, cache, dtemp)


def test_draft_rows_live_on_the_decode_vocabulary() -> None:
    """``LLMDraft(vocab=V)``: a smaller draft's rows are its own law with zeros at the ids it lacks, a
    larger draft's rows are the law of its logits cut to ``V``, and an id the draft cannot embed is fed
    as id 0."""
    from transformers import DynamicCache

    from spec.llm.adapter import LLMDraft
    from spec.llm.sampling import Sampling, process_logits

    ctx = [3, 1, 4]
    for size, sampling in ((11, Sampling(1.0)), (16, Sampling(0.7, top_k=5)), (16, Sampling(0.0))):
        model = _tiny(size, 1, layers=1)
        draft = LLMDraft(model, DynamicCache(), 0, pending=ctx, sampling=sampling, vocab=13)
        rows = draft.rows([(), (5,), (5, 2)])
        assert rows.shape == (3, 13) and draft.vocab == 13
        for row, path in zip(rows, [(), (5,), (5, 2)]):
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([ctx + list(path)])).logits[0, -1]  # type: ignore[operator]
            own = process_logits(logits[:13], sampling.temperature, sampling.top_k, sampling.top_p).numpy()
            want = np.zeros(13)
            want[: min(size, 13)] = own
            np.testing.assert_allclose(row, want, rtol=1e-6, atol=1e-9)
    small = _tiny(11, 1, layers=1)
    a = LLMDraft(small, DynamicCache(), 0, pending=[3, 12], vocab=13).rows([()])
    b = LLMDraft(small, DynamicCache(), 0, pending=[3, 0], vocab=13).rows([()])
    np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        LLMDraft(small, DynamicCache(), 0, pending=[13], vocab=13)
    for bad in (0, -3, 2.5, "13", True):
        with pytest.raises(ValueError, match="vocab"):
            LLMDraft(small, DynamicCache(), 0, pending=[1], vocab=bad)  # type: ignore[arg-type]


# ---------------------------------------------------------------- losslessness on a real model

VOCAB = 4
PROMPT = [1, 3]
SAMPLES = 700
# the block verifier on chains that stop at the first token with q(x) < 0.3: on this pair the first step's chain
# has 1, 2 or 3 tokens (measured while writing the test: 68 / 80 / 52 of 200 seeds at T = 1)
CONFIGS = [("chain", "sps", {}), ("chain", "asps", {}), ("chain", "block", {"confidence": 0.3}),
           ("dyspec", "traversal", {}), ("fixed", "multidraft", {"width": 2})]
# (temperature, top_k, top_p): the plain law, and one that each setting changes on this pair (measured while
# writing the test: leaving out top-k or top-p moves the two tokens' law by a total variation of 0.31, leaving
# out the temperature by 0.12) and that leaves 4 of the 16 cells possible, so a filtered token that slips
# through fails the check outright
SETTINGS = [(1.0, None, None), (1.5, 3, 0.8)]
# one check per config and setting, and the negative control's fit to the bug's own law (one family)
ALPHA = bonferroni(1e-3, len(CONFIGS) * len(SETTINGS) + 1)


def _law_pair() -> tuple[object, object]:
    return _tiny(VOCAB, 3, scale=8.0), _tiny(VOCAB, 4, layers=1, scale=8.0)


def exact_two_token_law(model: object, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
                        *, prompt: list[int] = PROMPT) -> np.ndarray:
    """p(t1, t2 | prompt) of the model's processed law over ids ``0..VOCAB-1``, from plain forwards (the model's
    own masks) and the loop reference of ``test_sampling`` (not the :func:`~spec.llm.sampling.process_logits`
    under test)."""
    def row(ids: list[int]) -> np.ndarray:
        logits = model(input_ids=torch.tensor([ids])).logits[0, -1].double().numpy()  # type: ignore[operator]
        return reference(logits, temperature, top_k, top_p)

    law = np.zeros((VOCAB, VOCAB))
    with torch.no_grad():
        p1 = row(prompt)
        for a in range(VOCAB):
            law[a] = p1[a] * row(prompt + [a])
    return law.ravel()


def two_token_counts(target: object, draft: object, builder: str, verifier: str, params: dict[str, object],
                     setting: tuple[float, int | None, float | None] = (1.0, None, None),
                     draft_temperature: float | None = None, *, prompt: list[int] = PROMPT,
                     cache: str = "auto", step_graph: bool = False, compile_step: bool = False) -> np.ndarray:
    """Counts of the first two generated tokens over ``SAMPLES`` seeded decodes (budget 3) on ``cache``; with
    ``step_graph`` every decode's first step must have been a fused one (``test_fused_law``)."""
    temperature, top_k, top_p = setting
    counts = np.zeros(VOCAB * VOCAB, dtype=np.int64)
    for seed in range(SAMPLES):
        out = generate(target, draft, prompt, builder, verifier, temperature=temperature, top_k=top_k, top_p=top_p,
                       max_new_tokens=2, budget=3, seed=seed, builder_params=params,
                       draft_temperature=draft_temperature, cache=cache, step_graph=step_graph,
                       compile_step=compile_step)
        assert not step_graph or out.steps[0].graph_s > 0, (builder, verifier, params, seed)  # fused, not the loop
        counts[out.tokens[0] * VOCAB + out.tokens[1]] += 1
    return counts


#: (draft vocabulary size, builder, verifier, params): drafts smaller and larger than the 4-token target
OTHER_VOCAB_CONFIGS = [(3, "chain", "sps", {}), (3, "dyspec", "traversal", {}), (3, "fixed", "multidraft", {"width": 2}),
                       (6, "chain", "asps", {}), (6, "dyspec", "traversal", {})]
OTHER_VOCAB_ALPHA = bonferroni(1e-3, len(OTHER_VOCAB_CONFIGS))


@pytest.mark.parametrize(("draft_vocab", "builder", "verifier", "params"), OTHER_VOCAB_CONFIGS)
def test_first_two_tokens_follow_the_target_law_with_a_draft_of_another_vocabulary_size(
        draft_vocab: int, builder: str, verifier: str, params: dict[str, object]) -> None:
    """A 3-token draft never proposes the target's token 3 and gets the prompt's 3 as id 0; a 6-token draft
    is cut to the target's 4 ids.  The first two tokens must still follow the target's exact law at T = 1.

    False-fail rate 1e-3 over the five cases; 700 samples on 16 cells detect a total variation of about
    ``chi_square_detectable_tv(law, 700, OTHER_VOCAB_ALPHA)`` (0.164; no cell merged) with probability 0.999."""
    target = _law_pair()[0]
    draft = _tiny(draft_vocab, 4, layers=1, scale=8.0)
    law = exact_two_token_law(target, *SETTINGS[0])
    counts = two_token_counts(target, draft, builder, verifier, params, SETTINGS[0])
    result = chi_square_check(counts, law, OTHER_VOCAB_ALPHA, simulate=NULL_DRAWS)
    assert result.passed, (result, chi_square_detectable_tv(law, SAMPLES, OTHER_VOCAB_ALPHA))


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize(("builder", "verifier", "params"), CONFIGS)
def test_first_two_tokens_follow_the_target_law(builder: str, verifier: str, params: dict[str, object],
                                                setting: tuple[float, int | None, float | None]) -> None:
    """Chi-square of the first two generated tokens against the target's exact processed law.

    False-fail rate 1e-3 over the ten cases (Bonferroni); with 700 samples
    on at most 16 cells the check detects a total variation of about
    ``chi_square_detectable_tv(law, 700, alpha)`` (0.167 on 16 cells; 0.142 on the
    4 of top-k 3 / top-p 0.8; no cell merged) with probability about 0.999 (an
    asymptotic figure: 0.9988 against the hardest such alternative on 16 cells,
    300k simulations, a statistics audit of 2026-11-28), and any
    sample in a cell of probability 0 (a token that top-k or top-p removed)
    fails it.  Exact losslessness of the same verifiers on the same trees is
    proved by enumeration in the numpy tests; this checks the LLM plumbing
    end to end: the draft and target rows processed alike, the draft tokens
    drawn from the rows the verifier is given.
    """
    target, draft = _law_pair()
    law = exact_two_token_law(target, *setting)
    counts = two_token_counts(target, draft, builder, verifier, params, setting)
    result = chi_square_check(counts, law, ALPHA, simulate=NULL_DRAWS)
    assert result.passed, (result, chi_square_detectable_tv(law, SAMPLES, ALPHA))


#: builder, verifier, params of the steps cut at a position table's end; WETAP's 4 layers cut to 3 there
CUT_CONFIGS = [("chain", "sps", {}), ("dyspec", "traversal", {}), ("fixed", "multidraft", {"width": 2}),
               ("wetap", "traversal", {"w_min": 2, "w_max": 3, "length": 4})]
CUT_ALPHA = bonferroni(1e-3, len(CUT_CONFIGS))


@pytest.mark.parametrize(("builder", "verifier", "params"), CUT_CONFIGS)
def test_steps_cut_at_a_position_table_keep_the_target_law(builder: str, verifier: str,
                                                           params: dict[str, object]) -> None:
    """A GPT-2 pair of 8 positions (V = 4), a prompt of 6 and 2 new tokens with a budget of 3: the first step's
    tree is cut to 2 nodes, the second's to 1, and the two tokens must follow the target's exact law at T = 1
    (from plain forwards: :func:`exact_two_token_law`).  The draft's law is far from it (total variation 0.68),
    so the verifier's corrections carry the check.

    False-fail rate 1e-3 over the four cases; 700 samples on 16 cells detect a total variation of about
    ``chi_square_detectable_tv(law, 700, CUT_ALPHA)`` (on the cells, merged ones included) with probability 0.999."""
    target, draft = (_gpt2(seed, layers, VOCAB, 8, n_embd=16, n_head=2, initializer_range=0.2)
                     for seed, layers in ((3, 2), (4, 1)))
    prompt = [1, 3, 0, 2, 1, 3]
    law = exact_two_token_law(target, prompt=prompt)
    counts = np.zeros(VOCAB * VOCAB, dtype=np.int64)
    for seed in range(SAMPLES):
        out = generate(target, draft, prompt, builder, verifier, max_new_tokens=2, budget=3, seed=seed,
                       builder_params=params)
        assert out.steps[0].tree_size <= 2 and all(s.tree_size == 1 for s in out.steps[1:]), out.steps
        counts[out.tokens[0] * VOCAB + out.tokens[1]] += 1
    result = chi_square_check(counts, law, CUT_ALPHA, simulate=NULL_DRAWS)
    assert result.passed, (result, chi_square_detectable_tv(law, SAMPLES, CUT_ALPHA))


def test_the_law_check_rejects_target_rows_processed_at_the_wrong_temperature(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above has power against a real processing bug: the target's logits reach the verifier
    without the temperature (scaled back up by ``T`` before the shared processing divides by it).

    That pipeline is lossless for the target's law at temperature 1 with the
    same filters, whose exact two-token law puts 0 on a cell the right law
    gives 0.059 (an expected count of 41 in 700 samples, asserted > 30
    below).  No sample can land there, so the chi-square statistic gets
    about 41 from that cell alone, twice the critical value at ``ALPHA``
    with 3 degrees of freedom (21.3): the check misses this bug with
    negligible probability.  The last assertion, that the counts fit the
    bug's own law, fails falsely with probability ``ALPHA``.
    """
    setting = SETTINGS[1]
    target, draft = _law_pair()
    right, wrong = exact_two_token_law(target, *setting), exact_two_token_law(target, 1.0, *setting[1:])
    lost = (right > 0) & (wrong == 0)
    assert right[lost].sum() * SAMPLES > 30  # the bug empties cells the right law fills

    from spec.llm.adapter import tree_logits as plain_tree_logits

    def unscaled(*args: Any, **kwargs: Any) -> Any:
        return plain_tree_logits(*args, **kwargs) * setting[0]

    monkeypatch.setattr("spec.llm.generate.tree_logits", unscaled)
    counts = two_token_counts(target, draft, "dyspec", "traversal", {}, setting)
    assert counts[lost].sum() == 0 and counts.sum() == SAMPLES
    assert not chi_square_check(counts, right, ALPHA, simulate=NULL_DRAWS).passed
    assert chi_square_check(counts, wrong, ALPHA, simulate=NULL_DRAWS).passed  # it follows the law of the bug: the check is not just noisy


@needs_decode_command
def test_decode_command_reports_a_missing_model_in_one_line(tmp_path: object, capsys: pytest.CaptureFixture[str]) -> None:
    from tmc.cli import main

    missing = str(tmp_path) + "/nothing-here"
    notes = [f"note: --target {missing} is not a folder here: loading it as a Hugging Face hub id",
             f"note: --draft {missing} is not a folder here: loading it as a Hugging Face hub id"]
    code = main(["decode", "--target", missing, "--draft", missing, "--prompt", "x", "--max-new-tokens", "2"])
    err = capsys.readouterr().err
    assert code == 2
    lines = err.strip().splitlines()  # a path that is no folder is tried as a hub id (a minute's retries): said first
    assert lines[:2] == notes and len(lines) == 3 and "cannot load" in lines[2] and "Traceback" not in err
    code = main(["decode", "--target", missing, "--draft", missing, "--prompt", "x", "--device", "gpu"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and lines[:2] == notes and len(lines) == 3 and "device 'gpu' is not a torch device" in lines[2]


@needs_decode_command
@pytest.mark.parametrize(("extra", "message"), [
    (["--verifier", "bogus"], "unknown verifier 'bogus'"),
    (["--builder", "fixed", "--verifier", "sps"], "verifier 'sps' verifies chains"),  # fixed draws swor
    (["--builder", "fixed", "--param", "draw=iid", "--verifier", "asps"], "verifies chains"),
    (["--builder", "dyspec", "--verifier", "ordered_traversal"], "number of children is fixed"),
    (["--temperature", "-1"], "temperature must be >= 0"),
    (["--top-p", "0"], r"top_p must be None or a number in \(0, 1\]"),
    (["--top-p", "1.5"], r"top_p must be None or a number in \(0, 1\]"),
    (["--draft-temperature", "-1"], "draft_temperature must be >= 0"),
    (["--budget", "5000"], "budget must be <= 4,096"),
    (["--builder", "fixed", "--param", "width=0"], "width must be >= 1"),
    (["--builder", "fixed", "--param", "width=2", "--param", "width=3"], r"--param width given twice \(2 and 3\)"),
])
def test_decode_command_refuses_bad_settings_before_loading_the_models(
        extra: list[str], message: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Each of these was refused only after both models had loaded (minutes for a large pair, or a download), and a
    repeated ``--param`` kept its last value silently: now one line, and no model is loaded."""
    import spec.llm.models as models
    from tmc.cli import main

    def no_load(*args: object, **kwargs: object) -> None:
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(models, "load_for_decoding", no_load)
    code = main(["decode", "--target", "t", "--draft", "d", "--prompt", "x", *extra])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1, lines
    assert re.search(message, lines[0]), lines


@needs_decode_command
def test_decode_command_on_a_saved_pair(saved_pair: SavedPair, capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """``tmc decode`` end to end: greedy chains equal plain greedy decoding on both chain paths
    (``--host-chain``, ``--verify-backend``), so does a top-k tree drafted warm (``--draft-temperature``),
    and ``--param`` reaches the builder."""
    import json

    import spec.llm.generate as gen
    from tmc.cli import main

    paths: list[tuple[bool, str]] = []

    def spy(*args: Any, **kwargs: Any) -> Any:
        paths.append((kwargs["chain_on_device"], kwargs["verify_backend"], kwargs["draft_temperature"]))
        return generate(*args, **kwargs)

    monkeypatch.setattr(gen, "generate", spy)  # the command imports it when it runs

    pair, tok, target = saved_pair.path, saved_pair.tokenizer, saved_pair.target
    base = ["decode", "--target", str(pair / "target"), "--draft", str(pair / "draft"), "--prompt", "def f(x):",
            "--max-new-tokens", "12", "--json", "--seed", "3", "--warmup", "0"]

    def run(*extra: str) -> dict[str, Any]:
        assert main([*base, *extra]) == 0
        return dict(json.loads(capsys.readouterr().out))

    ids = tok("def f(x):")["input_ids"]
    greedy = ar_generate(target, ids, temperature=0.0, max_new_tokens=12, eos_token_id=tok.eos_token_id).tokens
    device = run("--builder", "chain", "--verifier", "asps", "--budget", "3", "--temperature", "0", "--no-ar")
    host = run("--builder", "chain", "--verifier", "asps", "--budget", "3", "--temperature", "0", "--no-ar",
               "--host-chain", "--verify-backend", "torch")
    warm = run("--builder", "fixed", "--param", "draw=topk", "--budget", "6", "--temperature", "0", "--no-ar",
               "--draft-temperature", "1")
    assert paths == [(True, "auto", None), (False, "torch", None), (True, "auto", 1.0)]
    assert device["tokens"] == host["tokens"] == warm["tokens"] == greedy
    assert device["steps"] == host["steps"]
    wide = run("--builder", "fixed", "--param", "width=3", "--param", "depth=1", "--budget", "8", "--temperature", "1")
    assert wide["mean_tree_size"] <= 3.0 and wide["new_tokens"] >= 1 and "speedup_vs_ar" in wide
    for bad, said in (("-1", "draft_temperature must be >= 0"), ("nan", "draft_temperature must be a finite")):
        assert main([*base, "--no-ar", "--draft-temperature", bad]) == 2
        err = capsys.readouterr().err
        assert said in err and "Traceback" not in err
    stopped = run("--builder", "chain", "--param", "draw=topk", "--param", "confidence=0.4", "--budget", "20",
                  "--verifier", "sps", "--temperature", "0", "--draft-temperature", "1", "--no-ar")
    assert stopped["tokens"] == greedy and stopped["mean_tree_size"] <= 20
    for bad in ("0", "2", "-0.5", "\"high\""):
        assert main([*base, "--no-ar", "--builder", "chain", "--param", f"confidence={bad}"]) == 2
        err = capsys.readouterr().err
        assert "confidence must be" in err and "Traceback" not in err


@needs_decode_command
def test_decode_command_times_warm_runs(saved_pair: SavedPair, capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """``tmc decode`` timed its speculative run cold (the first call, ``torch.compile`` and graph captures
    included: 7.0 of 7.3 s with ``--compile-step``) against an autoregressive run made after it (audit D2 of
    2026-11-27: "speedup 0.04x").  Now ``--warmup N`` (default 1) untimed decodes of each run, with the
    same settings and seed, come first; the figures are those of the last calls."""
    import json

    import spec.llm.generate as gen
    from tmc.cli import main

    calls: list[tuple[str, Any]] = []
    plain_generate, plain_ar = gen.generate, gen.ar_generate

    def spy(name: str, fn: Any) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            out = fn(*args, **kwargs)
            calls.append((name, out))
            return out
        return run

    monkeypatch.setattr(gen, "generate", spy("spec", plain_generate))  # the command imports them when it runs
    monkeypatch.setattr(gen, "ar_generate", spy("ar", plain_ar))
    pair = saved_pair.path
    base = ["decode", "--target", str(pair / "target"), "--draft", str(pair / "draft"), "--prompt", "def f(x):",
            "--max-new-tokens", "8", "--json", "--builder", "chain", "--verifier", "sps", "--budget", "3"]
    for extra, order in (([], ["spec", "ar", "spec", "ar"]), (["--warmup", "2", "--no-ar"], ["spec"] * 3),
                         (["--warmup", "0"], ["spec", "ar"])):
        calls.clear()
        assert main([*base, *extra]) == 0, extra
        out = capsys.readouterr()
        report = json.loads(out.out)
        assert [name for name, _ in calls] == order, extra
        assert report["warmup"] == (2 if "2" in extra else 0 if "0" in extra else 1)
        assert ("untimed warm-up" in out.err) == (report["warmup"] > 0)
        timed = [o for name, o in calls if name == "spec"][-1]
        assert report["tokens"] == timed.tokens and report["tokens_per_s"] == timed.summary()["tokens_per_s"]
        assert all(o.tokens == timed.tokens for name, o in calls if name == "spec")  # same seed, same tokens
        if "--no-ar" not in extra:
            assert report["ar_tokens_per_s"] == [o for name, o in calls if name == "ar"][-1].summary()["tokens_per_s"]
    with pytest.raises(SystemExit):  # argparse
        main([*base, "--warmup", "-1"])
    assert "argument --warmup: must be >= 0, got -1" in capsys.readouterr().err


@needs_decode_command
def test_decode_command_notes_a_draft_with_more_token_ids(saved_pair: SavedPair, tmp_path: Any,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """A draft saved with its embeddings padded by 4 ids decodes greedily with ``tmc decode``, which says on
    stderr that the draft's rows are cut to the target's ids; a same-size pair gets no such note."""
    import copy
    import json

    from tmc.cli import main

    pair, tok, target = saved_pair.path, saved_pair.tokenizer, saved_pair.target
    padded = copy.deepcopy(saved_pair.draft)
    size = int(padded.config.vocab_size)
    padded.resize_token_embeddings(size + 4)
    padded.save_pretrained(tmp_path / "draft")
    ids = tok("def f(x):")["input_ids"]
    greedy = ar_generate(target, ids, temperature=0.0, max_new_tokens=8, eos_token_id=tok.eos_token_id).tokens
    for draft, note in ((tmp_path / "draft", f"the draft has {size + 4} token ids and the target {size}"),
                        (pair / "draft", None)):
        assert main(["decode", "--target", str(pair / "target"), "--draft", str(draft), "--prompt", "def f(x):",
                     "--max-new-tokens", "8", "--temperature", "0", "--no-ar", "--json"]) == 0
        out = capsys.readouterr()
        assert json.loads(out.out)["tokens"] == greedy
        assert (note in out.err and "cut to the target's ids" in out.err) if note else "note:" not in out.err


@needs_decode_command
def test_decode_command_stops_at_any_stop_token_of_the_generation_config(
        saved_pair: SavedPair, tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """A target whose ``generation_config.eos_token_id`` is a list (as Llama 3's is): ``tmc decode`` stops
    at the first token met of the list and the tokenizer's eos, and reports them.  The report names the
    dtype, as stored or as ``--dtype`` asks."""
    import json
    import shutil

    from tmc.cli import main

    pair = tmp_path / "pair"
    shutil.copytree(saved_pair.path, pair)
    tok, target = saved_pair.tokenizer, saved_pair.target
    ids = tok("def f(x):")["input_ids"]
    greedy = ar_generate(target, ids, temperature=0.0, max_new_tokens=12, eos_token_id=tok.eos_token_id).tokens
    k = next(i for i in range(2, len(greedy)) if greedy[i] not in greedy[:i])
    config_file = pair / "target" / "generation_config.json"
    config = json.loads(config_file.read_text())
    late = next(t for t in range(target.config.vocab_size - 1, 0, -1) if t not in greedy[: k + 1])
    config["eos_token_id"] = [late, greedy[k]]
    config_file.write_text(json.dumps(config))
    code = main(["decode", "--target", str(pair / "target"), "--draft", str(pair / "draft"), "--prompt", "def f(x):",
                 "--max-new-tokens", "12", "--json", "--temperature", "0", "--builder", "chain", "--verifier", "sps"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["stop_token_ids"] == sorted({greedy[k], late, tok.eos_token_id})
    assert report["tokens"] == greedy[: k + 1]
    assert report["ar_tokens_per_s"] > 0
    assert report["dtype"] == "float32"  # as stored
    code = main(["decode", "--target", str(pair / "target"), "--draft", str(pair / "draft"), "--prompt", "def f(x):",
                 "--max-new-tokens", "5", "--json", "--no-ar", "--dtype", "bfloat16"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["dtype"] == "bfloat16" and 1 <= report["new_tokens"] <= 5


@needs_decode_command
def test_decode_command_runs_fused_steps(saved_pair: SavedPair, capsys: pytest.CaptureFixture[str]) -> None:
    """``tmc decode --step-graph`` (and ``--compile-step`` / ``--compile-step whole``, through dynamo's
    ``eager`` backend here) on the static cache decodes greedily with a fused chain and a fused top-k tree;
    without the static cache, or ``--compile-step`` alone, it exits 2 naming what is missing."""
    import json

    from spec.llm import generate as gen
    from tmc.cli import main

    pair, tok, target = saved_pair.path, saved_pair.tokenizer, saved_pair.target
    ids = tok("def f(x):")["input_ids"]
    greedy = ar_generate(target, ids, temperature=0.0, max_new_tokens=10, eos_token_id=tok.eos_token_id).tokens
    base = ["decode", "--target", str(pair / "target"), "--draft", str(pair / "draft"), "--prompt", "def f(x):",
            "--max-new-tokens", "10", "--temperature", "0", "--no-ar", "--json"]
    runs = (["--builder", "chain", "--verifier", "sps", "--budget", "3"],
            ["--builder", "fixed", "--param", "draw=topk", "--verifier", "traversal", "--budget", "6",
             "--draft-temperature", "1"])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gen, "COMPILE_BACKEND", "eager")
        for run, extra in itertools.product(runs, ([], ["--compile-step"], ["--compile-step", "whole"])):
            assert main([*base, *run, "--cache", "static", "--step-graph", *extra]) == 0, (run, extra)
            assert json.loads(capsys.readouterr().out)["tokens"] == greedy, (run, extra)
    for choice in ("auto", "off"):  # on the CPU neither fuses; the tokens are the same
        assert main([*base, *runs[0], "--cache", "static", "--step-graph", choice]) == 0, choice
        assert json.loads(capsys.readouterr().out)["tokens"] == greedy, choice
    assert main([*base, *runs[0], "--cache", "dynamic", "--step-graph"]) == 2
    assert "step_graph=True needs cache='static'" in capsys.readouterr().err
    assert main([*base, *runs[0], "--cache", "static", "--compile-step"]) == 2
    assert "it needs step_graph=True" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # argparse: not a scope
        main([*base, *runs[0], "--cache", "static", "--step-graph", "--compile-step", "all"])
    with pytest.raises(SystemExit):  # argparse: not one of auto, on, off
        main([*base, *runs[0], "--cache", "static", "--step-graph", "yes"])
    assert "invalid choice: 'yes'" in capsys.readouterr().err


@needs_decode_command
def test_decode_command_prints_the_fused_steps_time(saved_pair: SavedPair, capsys: pytest.CaptureFixture[str]) -> None:
    """A fused step records its time whole (``graph_s``), none of it as builder, target or verifier time, and
    the printed breakdown left it out: "target 0.00 s" for 11 fused target forwards (audit D5).  With fused
    steps it now says its three times are the unfused steps' and prints the fused steps' time; without, as
    before."""
    import re

    from tmc.cli import main

    pair = saved_pair.path
    base = ["decode", "--target", str(pair / "target"), "--draft", str(pair / "draft"), "--prompt", "def f(x):",
            "--max-new-tokens", "10", "--temperature", "0", "--no-ar", "--builder", "chain", "--verifier", "sps",
            "--budget", "3", "--cache", "static"]
    stats = r"\d+ tokens in \d+ steps: [\d.]+ tokens/step, [\d.]+ tokens/s \("
    times = r"builder [\d.]+ s, target [\d.]+ s, verifier [\d.]+ s"
    assert main([*base, "--step-graph", "on"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert re.fullmatch(stats + r"unfused steps: " + times + r"; fused steps [\d.]+ s, not split\)", line), line
    assert main([*base, "--step-graph", "off"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert re.fullmatch(stats + times + r"\)", line), line


#: (builder, verifier, params, draft temperature) under the plain target law at T = 1: a cooler draft, a warmer
#: one, and a one-hot (greedy) draft whose sampled nodes all record a point mass
WARM_CONFIGS = [("chain", "sps", {}, 0.5), ("dyspec", "traversal", {}, 2.0), ("fixed", "multidraft", {"width": 2}, 0.0)]
WARM_ALPHA = bonferroni(1e-3, len(WARM_CONFIGS) + 1)  # and the negative control's fit to the bug's law


@pytest.mark.parametrize(("builder", "verifier", "params", "draft_temperature"), WARM_CONFIGS)
def test_first_two_tokens_follow_the_target_law_with_the_draft_at_its_own_temperature(
        builder: str, verifier: str, params: dict[str, object], draft_temperature: float) -> None:
    """``draft_temperature`` changes the law the draft draws from, and with it what each node records;
    the output law must stay the target's.

    False-fail rate 1e-3 over the three cases and the next test's fit to its bug's law; 700 samples on 16 cells detect a total variation of
    ``chi_square_detectable_tv(law, 700, WARM_ALPHA)`` (0.163; no cell merged) with probability 0.999.  The next test shows
    the check's power against the bug this setting invites (tokens drawn warm, rows recorded cold)."""
    target, draft = _law_pair()
    law = exact_two_token_law(target, *SETTINGS[0])
    counts = two_token_counts(target, draft, builder, verifier, params, SETTINGS[0], draft_temperature)
    result = chi_square_check(counts, law, WARM_ALPHA, simulate=NULL_DRAWS)
    assert result.passed, (result, chi_square_detectable_tv(law, SAMPLES, WARM_ALPHA))


def test_the_law_check_rejects_draft_tokens_drawn_from_another_law_than_recorded(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Power of the check against the bug a draft temperature invites: the token drawn from the draft
    at temperature 1/10 (its row to the power 10, renormalised) while the tree records, and SpS is given,
    the row at temperature 1.

    With a chain of one node, the first token's law under the bug is, in closed form from plain forwards,
    ``r(x) min(1, p/q) + (1 − Σ_y r(y) min(1, p/q)) · res(x)`` with ``r ∝ q¹⁰`` and
    ``res ∝ max(p − q, 0)``.  On this pair it lies a total variation above 0.2 from ``p`` (0.21; asserted),
    above the 0.14 that 700 samples on 4 cells detect with probability 0.999 at ``WARM_ALPHA``: the
    check misses the bug with probability below 1e-3.  (A draft at temperature 1/3 would move the law
    by 0.10 only.)  The last assertion, that the counts fit the
    bug's own law, fails falsely with probability ``WARM_ALPHA``."""
    target, draft = _law_pair()

    def row(model: object) -> np.ndarray:
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([PROMPT])).logits[0, -1].double().numpy()  # type: ignore[operator]
        return reference(logits, 1.0, None, None)

    p, q = row(target), row(draft)
    r = q**10 / (q**10).sum()
    accept = r * np.minimum(1.0, p / q)
    res = np.maximum(p - q, 0.0)
    wrong = accept + (1.0 - accept.sum()) * res / res.sum()
    assert 0.5 * np.abs(wrong - p).sum() > 0.2 > chi_square_detectable_tv(p, SAMPLES, WARM_ALPHA)

    from spec.randomness import RngSampler

    class Colder(RngSampler):
        def draw(self, law: np.ndarray) -> int:  # type: ignore[override]
            return super().draw(law**10 / (law**10).sum())

    monkeypatch.setattr("spec.llm.generate.RngSampler", Colder)
    counts = np.zeros(VOCAB, dtype=np.int64)
    for seed in range(SAMPLES):
        out = generate(target, draft, PROMPT, "chain", "sps", temperature=1.0, max_new_tokens=1, budget=1, seed=seed,
                       chain_on_device=False)
        counts[out.tokens[0]] += 1
    assert not chi_square_check(counts, p, WARM_ALPHA, simulate=NULL_DRAWS).passed
    assert chi_square_check(counts, wrong, WARM_ALPHA, simulate=NULL_DRAWS).passed


@needs_decode_command
def test_decode_command_gives_one_line_for_a_broken_model_folder(saved_pair: SavedPair, tmp_path: Any,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Weights that do not match config.json (RuntimeError), a truncated safetensors file (SafetensorError) and
    a config value of the wrong type had ended ``tmc decode`` in tracebacks: one line, exit 2, naming the path."""
    import json
    import shutil

    from tmc.cli import main

    broken = {}
    for name in ("mismatched", "truncated", "typed"):
        shutil.copytree(saved_pair.path / "draft", tmp_path / name)
        broken[name] = tmp_path / name
    config = json.loads((broken["mismatched"] / "config.json").read_text())
    (broken["mismatched"] / "config.json").write_text(json.dumps({**config, "hidden_size": 2 * config["hidden_size"]}))
    weights = broken["truncated"] / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:200])
    (broken["typed"] / "config.json").write_text(json.dumps({**config, "vocab_size": "many"}))
    for name, folder in broken.items():
        for role in ("--target", "--draft"):
            other = "--draft" if role == "--target" else "--target"
            argv = ["decode", role, str(folder), other, str(saved_pair.path / "target"), "--prompt", "def f(x):",
                    "--max-new-tokens", "2", "--no-ar"]
            assert main(argv) == 2, (name, role)
            err = capsys.readouterr().err  # transformers' own load report may come first: it is the detail
            last = err.strip().splitlines()[-1]
            assert "Traceback (most recent call last)" not in err, (name, role, err)
            assert last.startswith("tmc decode: cannot load a ") and str(folder) in last, (name, role, last)


@needs_decode_command
def test_decode_command_notes_a_draft_with_another_tokenizer(saved_pair: SavedPair, tmp_path: Any,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """A draft folder whose tokenizer numbers tokens otherwise was accepted silently (its rows read as target
    ids: 1.00 tokens a step instead of 2.67); it now gets a note, as does one whose tokenizer cannot be read.
    A draft folder without a tokenizer, or with the target's, gets none."""
    import shutil

    from spec.llm.models import draft_tokenizer_note
    from spec.llm.train import train_tokenizer

    tok = saved_pair.tokenizer
    assert draft_tokenizer_note(tok, str(saved_pair.path / "draft")) is None
    bare = tmp_path / "bare"
    saved_pair.draft.save_pretrained(bare)
    assert draft_tokenizer_note(tok, str(bare)) is None
    other = tmp_path / "other"
    shutil.copytree(bare, other)
    train_tokenizer(["select * from t where x = 1;\n" * 50, "<p>hello</p>\n" * 50], 300, 256).save_pretrained(other)
    assert "the draft's tokenizer differs from the target's" in (draft_tokenizer_note(tok, str(other)) or "")
    unreadable = tmp_path / "unreadable"
    shutil.copytree(saved_pair.path / "draft", unreadable)
    (unreadable / "tokenizer.json").write_text("{not json")
    assert "tokenizer cannot be read" in (draft_tokenizer_note(tok, str(unreadable)) or "")


def test_static_cache_too_large_for_memory_is_a_memory_error(pair: tuple[object, object]) -> None:
    """``--max-new-tokens 1000000000 --cache static`` asked torch for 6 TB and ended in its RuntimeError's
    traceback; the cache now raises MemoryError (which ``tmc`` prints in one line) naming the size."""
    from spec.llm.static_cache import StaticTreeCache

    with pytest.raises(MemoryError, match=r"the static cache of 1,000,000,000,000 slots needs .* GiB"):
        StaticTreeCache(pair[0], 10**12)


def test_budget_is_bounded(pair: tuple[object, object]) -> None:
    """``--budget 100000`` grew a 10,709-node tree whose mask took the machine's memory (the kernel killed the
    process): a budget over MAX_BUDGET is refused by name before any forward."""
    from spec.llm.generate import MAX_BUDGET

    with pytest.raises(ValueError, match=f"budget must be <= {MAX_BUDGET:,} draft nodes a step, got 100,000"):
        generate(pair[0], pair[1], [1, 2], "dyspec", "traversal", budget=100_000, max_new_tokens=2)
    with pytest.raises(ValueError, match=f"got {MAX_BUDGET + 1:,}"):
        generate(pair[0], pair[1], [1, 2], "chain", "sps", budget=MAX_BUDGET + 1, max_new_tokens=0)
    assert generate(pair[0], pair[1], [1, 2], "chain", "sps", budget=MAX_BUDGET, max_new_tokens=0).tokens == []


def test_summary_reads_the_step_statistics(pair: tuple[object, object]) -> None:
    """``GenerateOutput.summary()`` (what ``tmc decode --json`` and the bench print) against its steps, summed or
    averaged here: a DynaTree decode, whose trees differ in size from step to step and from what they accept."""
    out = generate(pair[0], pair[1], [1, 2, 3], "dynatree", "traversal", budget=6, max_new_tokens=20, seed=1)
    s, steps = out.summary(), out.steps
    sizes = [x.tree_size for x in steps]
    assert len(set(sizes)) > 1 and sizes != [x.accepted for x in steps]
    assert s["new_tokens"] == len(out.tokens) == 20 and s["steps"] == len(steps)
    assert s["tokens_per_step"] == 20 / len(steps) and s["mean_tree_size"] == sum(sizes) / len(steps)
    for key in ("build_s", "draft_s", "target_s", "verify_s", "graph_s", "loop_s"):
        assert s[key] == pytest.approx(sum(getattr(x, key) for x in steps), rel=1e-12, abs=0.0)
    assert s["total_s"] == out.total_s and s["tokens_per_s"] == pytest.approx(20 / out.total_s, rel=1e-12)
