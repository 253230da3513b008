"""Tiny Llama models, pair save/load, and a smoke run of the training script (spec.llm.models, spec.llm.train)."""

from __future__ import annotations

import json
import math
import re
import types

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

import torch  # noqa: E402

from spec.llm import train  # noqa: E402
from spec.llm.models import count_parameters, load_pair, parse_device, save_pair, tiny_llama, tiny_pair  # noqa: E402

pytestmark = pytest.mark.llm

VOCAB = 50


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def _logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_tiny_llama_is_a_function_of_its_seed():
    assert _same_weights(tiny_llama(VOCAB, seed=3), tiny_llama(VOCAB, seed=3))
    assert not _same_weights(tiny_llama(VOCAB, seed=3), tiny_llama(VOCAB, seed=4))


def test_tiny_llama_leaves_the_global_generator_alone():
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    tiny_llama(VOCAB, seed=0)
    assert torch.equal(torch.rand(3), expected)


def test_tiny_llama_shape_dtype_mode_and_attention():
    model = tiny_llama(VOCAB, hidden_size=16, layers=3, heads=4, kv_heads=2, intermediate=24, seed=0)
    assert model.dtype == torch.float32 and not model.training
    assert model.config._attn_implementation == "sdpa"
    assert (model.config.num_hidden_layers, model.config.num_key_value_heads) == (3, 2)
    assert _logits(model, torch.tensor([[1, 2, 3]])).shape == (1, 3, VOCAB)


def test_tiny_llama_eager_and_sdpa_attention_give_the_same_logits():
    eager, sdpa = tiny_llama(VOCAB, attn_implementation="eager"), tiny_llama(VOCAB, attn_implementation="sdpa")
    assert eager.config._attn_implementation == "eager"
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    assert torch.allclose(_logits(eager, ids), _logits(sdpa, ids), atol=1e-5)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [({"vocab_size": 1}, "vocab_size"), ({"hidden_size": 30}, "heads"), ({"kv_heads": 3}, "kv_heads")],
)
def test_tiny_llama_bad_input_names_the_argument(kwargs, name):
    args = {"vocab_size": VOCAB, **kwargs}
    with pytest.raises(ValueError, match=name):
        tiny_llama(**args)


def test_tiny_pair_draft_is_smaller_on_the_same_vocabulary():
    target, draft = tiny_pair(VOCAB, seed=1)
    assert target.config.vocab_size == draft.config.vocab_size == VOCAB
    assert count_parameters(draft) < count_parameters(target)
    ids = torch.tensor([[0, 5, 9]])
    assert not torch.allclose(_logits(target, ids).softmax(-1), _logits(draft, ids).softmax(-1))


def test_save_load_round_trip_gives_equal_logits(tmp_path):
    target, draft = tiny_pair(VOCAB, seed=2)
    save_pair(target, draft, None, tmp_path)
    target2, draft2, tokenizer = load_pair(tmp_path)
    assert tokenizer is None
    assert not target2.training and target2.config._attn_implementation == "sdpa"
    ids = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(0))
    assert torch.equal(_logits(target, ids), _logits(target2, ids))
    assert torch.equal(_logits(draft, ids), _logits(draft2, ids))


def test_save_pair_rejects_different_vocabularies(tmp_path):
    with pytest.raises(ValueError, match="vocabulary"):
        save_pair(tiny_llama(VOCAB), tiny_llama(VOCAB + 1), None, tmp_path)


def test_load_pair_rejects_a_folder_without_the_pair(tmp_path):
    with pytest.raises(ValueError, match="path"):
        load_pair(tmp_path)


def test_parse_device_names_what_torch_cannot_use():
    assert parse_device("cpu") == torch.device("cpu")
    assert parse_device(torch.device("cpu")) == torch.device("cpu")
    assert parse_device(None) == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    for bad in ("gpu", "cpu:x", ""):
        with pytest.raises(ValueError, match=f"device '{bad}' is not a torch device"):
            parse_device(bad)
    for bad in ("hpu", "privateuseone"):  # torch knows the name but has no module for it: ModuleNotFoundError
        with pytest.raises(ValueError, match=f"device '{bad}' cannot be used by this torch"):
            parse_device(bad)
    if torch.cuda.is_available():
        assert parse_device("cuda").type == "cuda"
        with pytest.raises(ValueError, match=r"device 'cuda:99': torch sees \d+ CUDA device"):
            parse_device("cuda:99")
    else:
        with pytest.raises(ValueError, match="device 'cuda': torch sees no CUDA device"):
            parse_device("cuda")
    with pytest.raises(ValueError, match="device 'meta' holds shapes without data"):
        parse_device("meta")
    if not torch.backends.mps.is_available():  # every machine but a Mac with a torch built for it
        with pytest.raises(ValueError, match="device 'mps' cannot be used by this torch"):
            parse_device("mps")


def test_learning_rate_warms_up_then_decays_to_a_tenth():
    peak, warmup = 1e-3, 0.1
    assert train.learning_rate(0.05, peak, warmup) == pytest.approx(peak / 2)
    assert train.learning_rate(warmup, peak, warmup) == pytest.approx(peak)
    assert train.learning_rate(1.0, peak, warmup) == pytest.approx(peak / 10)
    assert train.learning_rate(2.0, peak, warmup) == pytest.approx(peak / 10)


def test_split_holds_out_every_nth_file_or_the_largest():
    docs = [train.Document(f"f{i}", "x" * (i + 1)) for i in range(10)]
    tr, val = train.split_corpus(docs, val_every=4)
    assert [d.name for d in val] == ["f3", "f7"] and len(tr) == 8
    tr, val = train.split_corpus(docs, val_every=50)
    assert [d.name for d in val] == ["f9"] and len(tr) == 9


def test_validation_windows_spread_over_the_stream():
    stream = torch.arange(1001)
    windows = train.validation_windows(stream, seq_len=10, max_positions=30)
    assert windows.shape == (3, 11)
    assert windows[:, 0].tolist() == [0, 330, 660]
    assert torch.equal(windows[:, 1:] - windows[:, :-1], torch.ones(3, 10, dtype=torch.int64))


def test_evaluate_pair_of_a_model_with_itself_accepts_everything():
    model = tiny_llama(VOCAB, seed=0)
    windows = torch.randint(0, VOCAB, (3, 9), generator=torch.Generator().manual_seed(1))
    out = train.evaluate_pair(model, model, windows, batch=2, device="cpu")
    assert out["greedy_agreement"] == 1.0 and out["sps_acceptance"] == pytest.approx(1.0, abs=1e-5)
    assert out["target_val_loss"] == pytest.approx(out["draft_val_loss"]) and out["eval_positions"] == 24
    assert out["target_val_loss"] == pytest.approx(math.log(VOCAB), rel=0.05)  # random init: near uniform


def test_collect_corpus_respects_the_cap_and_the_order(tmp_path):
    for name, text in [("b.py", "b" * 30), ("a.py", "a" * 50), ("c.py", "c" * 10), ("skip.txt", "t")]:
        (tmp_path / name).write_text(text, encoding="utf-8")
    (tmp_path / "site-packages").mkdir()
    (tmp_path / "site-packages" / "d.py").write_text("d", encoding="utf-8")
    (tmp_path / "bad.py").write_bytes(b"\xff\xfe")
    root = tmp_path.name
    assert [d.name for d in train.collect_corpus([str(tmp_path)])] == [f"{root}/{n}" for n in ("a.py", "b.py", "c.py")]
    # a.py fits, b.py would pass 70 and is skipped, c.py fits
    assert [d.name for d in train.collect_corpus([str(tmp_path)], max_chars=70)] == [f"{root}/a.py", f"{root}/c.py"]


SMOKE_CORPUS = ["--max-chars", "200000", "--val-every", "6", "--eval-tokens", "2048", "--log-every", "1"]


@pytest.fixture(scope="module")
def smoke_pair(tmp_path_factory):
    """The whole pipeline on a 200 k-character corpus in ~15 s: the output folder."""
    out = tmp_path_factory.mktemp("smoke") / "pair"
    assert train.main(["--out", str(out), "--minutes", "0.3", "--vocab", "300", *SMOKE_CORPUS]) == 0
    return out


def test_training_script_smoke_run(smoke_pair):
    """Report keys and loadable models."""
    out = smoke_pair
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    for key in ("target_val_loss", "draft_val_loss", "greedy_agreement", "sps_acceptance", "eval_positions", "wall_seconds"):
        assert key in report
    assert 0.0 <= report["greedy_agreement"] <= 1.0 and 0.0 < report["sps_acceptance"] <= 1.0
    assert report["target"]["steps"] >= 1 and report["draft"]["steps"] >= 1
    assert report["target"]["params"] > report["draft"]["params"]
    assert 0 < report["corpus"]["chars_train"] + report["corpus"]["chars_val"] <= 200_000
    assert report["corpus"]["tokens_val"] > 0 and report["tokenizer"]["vocab_size"] <= 300

    target, draft, tokenizer = load_pair(out)
    assert tokenizer is not None and len(tokenizer) == target.config.vocab_size == draft.config.vocab_size
    ids = tokenizer("def f(x):\n    return x", return_tensors="pt")["input_ids"]
    assert ids[0, 0].item() == tokenizer.bos_token_id
    assert tokenizer.decode(ids[0], skip_special_tokens=True) == "def f(x):\n    return x"
    logits = _logits(target, ids)
    assert logits.shape == (1, ids.shape[1], len(tokenizer)) and torch.isfinite(logits).all()
    assert (out / "draft" / "tokenizer.json").is_file()


def test_a_draft_for_a_saved_target(smoke_pair, tmp_path, capsys):
    """``--target-from``: the target and tokenizer are copied unchanged, only a ``pico`` draft trains."""
    out = tmp_path / "pair1"
    argv = ["--out", str(out), "--minutes", "0.15", "--draft-size", "pico", "--target-from", str(smoke_pair / "target")]
    assert train.main([*argv, *SMOKE_CORPUS]) == 0
    assert "warning" not in capsys.readouterr().err  # same corpus options as the target's run
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    old_target, _, old_tok = load_pair(smoke_pair)
    target, draft, tokenizer = load_pair(out)
    assert report["target"] == {"params": count_parameters(old_target), "from": str(smoke_pair / "target")}
    assert report["draft"]["size"] == "pico" and report["draft"]["layers"] == draft.config.num_hidden_layers == 1
    assert report["draft"]["steps"] >= 1 and report["config"]["target_from"] == str(smoke_pair / "target")
    assert report["config"]["vocab"] is None and report["config"]["target_share"] is None  # neither applies
    assert _same_weights(target, old_target)
    assert tokenizer is not None and old_tok is not None
    assert tokenizer.backend_tokenizer.to_str() == old_tok.backend_tokenizer.to_str()
    assert draft.config.vocab_size == target.config.vocab_size == len(tokenizer)
    assert draft.config.max_position_embeddings == target.config.max_position_embeddings
    assert 0.0 < report["sps_acceptance"] <= 1.0

    # other corpus options than the target's run: trained all the same, with a warning naming them
    other = [*SMOKE_CORPUS[:2], "--val-every", "7", *SMOKE_CORPUS[4:]]
    assert train.main(["--out", str(tmp_path / "pair2"), "--minutes", "0.1", "--draft-size", "pico",
                       "--target-from", str(smoke_pair / "target"), *other]) == 0
    assert "other corpus options (val_every): val_every=6" in capsys.readouterr().err


def test_target_from_refuses_what_it_cannot_do(smoke_pair, tmp_path, capsys):
    target = str(smoke_pair / "target")
    for extra, said in ((["--target-size", "small"], "drop --target-size"),
                        (["--target-steps", "3"], "drop --target-steps"),
                        # audit D5 of 2026-11-27: both were ignored, and recorded in the report as if used
                        (["--vocab", "1000"], "drop --vocab"), (["--target-share", "0.5"], "drop --target-share")):
        with pytest.raises(SystemExit):
            train.main(["--out", "unused", "--target-from", target, *extra])
        assert said in capsys.readouterr().err
    with pytest.raises(SystemExit):
        train.main(["--out", "unused", "--target-from", str(tmp_path)])
    assert "holds no tokenizer.json" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        train.main(["--out", str(tmp_path / "x"), "--target-from", target, "--seq-len", "600"])
    assert re.search(r"--seq-len 600 is longer than the target .* can read", capsys.readouterr().err)
    with pytest.raises(SystemExit):
        train.main(["--out", str(tmp_path / "x"), "--target-from", target, "--draft-size", "small", *SMOKE_CORPUS])
    assert re.search(r"--draft-size small .* is not smaller than the target", capsys.readouterr().err)
    no_model = tmp_path / "tokenizer_only"
    load_pair(smoke_pair)[2].save_pretrained(no_model)  # a tokenizer.json but no model
    with pytest.raises(SystemExit):
        train.main(["--out", str(tmp_path / "x"), "--target-from", str(no_model)])
    err = capsys.readouterr().err
    assert "cannot load the target" in err and "Traceback" not in err
    assert not (tmp_path / "x").exists()


def test_fixed_step_training_is_a_function_of_the_seed():
    cfg = train.TrainConfig(out="unused", seq_len=8, batch=2, log_every=1e9)
    stream = torch.randint(0, VOCAB, (500,), generator=torch.Generator().manual_seed(0))
    size = train.ModelSize(hidden=16, layers=1, heads=2, intermediate=32, lr=1e-2)

    def trained(data_seed: int) -> torch.nn.Module:
        model = tiny_llama(VOCAB, hidden_size=16, layers=1, heads=2, intermediate=32, seed=0)
        stats = train.train_model(model, stream, train.Plan(seconds=0.0, steps=4), size, cfg, data_seed, print, "m")
        assert stats["steps"] == 4 and not model.training
        return model

    assert _same_weights(trained(1), trained(1))
    assert not _same_weights(trained(1), trained(2))


def test_a_budget_spent_before_training_is_said():
    """``--minutes 0.001`` exited 0 with one step a model and no word of it (the corpus stages had taken the
    budget): the forced step now comes with a warning line; a budget of time or steps gives none."""
    cfg = train.TrainConfig(out="unused", seq_len=8, batch=2, log_every=1e9)
    stream = torch.randint(0, VOCAB, (500,), generator=torch.Generator().manual_seed(0))
    size = train.ModelSize(hidden=16, layers=1, heads=2, intermediate=32, lr=1e-2)
    for plan, warned in ((train.Plan(seconds=0.0), True), (train.Plan(seconds=0.05), False),
                         (train.Plan(seconds=0.0, steps=1), False)):
        lines: list[str] = []
        model = tiny_llama(VOCAB, hidden_size=16, layers=1, heads=2, intermediate=32, seed=0)
        stats = train.train_model(model, stream, plan, size, cfg, 0, lines.append, "m")
        assert (stats["steps"] == 1) >= warned
        assert any("warning: its time budget was spent before it began" in line for line in lines) is warned, plan


def test_vocab_floor_is_the_byte_alphabet_and_two_specials():
    """``--vocab`` is refused below ``VOCAB_MIN`` before any training; ``train_tokenizer`` needs that many."""
    from tokenizers import pre_tokenizers

    assert train.VOCAB_MIN == len(pre_tokenizers.ByteLevel.alphabet()) + 2
    with pytest.raises(ValueError, match=f"vocab must be at least {train.VOCAB_MIN}"):
        train.train_tokenizer(["x = 1\n"], train.VOCAB_MIN - 1, 64)


def test_tokenizer_is_deterministic_byte_level_with_bos():
    texts = ["def f(x):\n    return x + 1\n" * 20, "import os\nprint(os.sep)\n" * 20]
    a, b = train.train_tokenizer(texts, 300, 64), train.train_tokenizer(texts, 300, 64)
    assert a.backend_tokenizer.to_str() == b.backend_tokenizer.to_str()
    assert (a.bos_token_id, a.eos_token_id, a.pad_token_id) == (0, 1, 1)
    ids = a("héllo wörld\t")["input_ids"]  # bytes outside the corpus still encode losslessly
    assert ids[0] == 0 and a.decode(ids, skip_special_tokens=True) == "héllo wörld\t"
    stream = train.encode_corpus(a, [train.Document("x", "import os")])
    assert stream[0].item() == 0 and stream[-1].item() == 1


def test_corpus_text_that_spells_a_special_token_stays_text():
    """A source file with the literal ``'<|eos|>'`` put the special id inside the training stream (a false end
    of document; decoding with ``skip_special_tokens`` lost the characters): each document now has exactly one
    ``<|bos|>`` first and one ``<|eos|>`` last, and its middle decodes to its text."""
    tok = train.train_tokenizer(["def f(x):\n    return x + 1\n" * 20], 300, 64)
    texts = ["END = '<|eos|>'\nSTART = '<|bos|>'\n", "x = '<|bos|><|eos|>'"]
    stream = train.encode_corpus(tok, [train.Document(f"d{i}", t) for i, t in enumerate(texts)]).tolist()
    assert stream.count(0) == 2 and stream.count(1) == 2
    cut = stream.index(1)
    assert stream[0] == 0 and stream[cut + 1] == 0 and stream[-1] == 1
    assert [tok.decode(part) for part in (stream[1:cut], stream[cut + 2 : -1])] == texts
    assert tok.backend_tokenizer.encode_special_tokens is False  # the tokenizer handed back as it was


def test_bad_options_are_reported_by_name(capsys, tmp_path):
    """Refused in one line before any training (the audit's cases: ``--minutes inf`` trained forever,
    ``nan`` one step a model, ``--batch -1`` raised in torch, ``--seq-len 0`` / ``--batch 0`` became the
    defaults, ``--eval-tokens 0`` evaluated a window all the same, an ``--out`` under a file failed after
    the training, ``micro`` drafted for ``small`` although it has more parameters)."""
    a_file = tmp_path / "afile"
    a_file.write_text("x")
    for argv, said in (
        (["--target-size", "small", "--draft-size", "micro"], "--draft-size (micro) must be smaller"),
        (["--minutes", "inf"], "--minutes must be a positive number, got inf"),
        (["--minutes", "nan"], "--minutes must be a positive number, got nan"),
        (["--minutes", "0"], "--minutes must be a positive number"),
        (["--seq-len", "0"], "--seq-len must be positive, got 0"),
        (["--batch", "0"], "--batch must be positive, got 0"),
        (["--batch", "-1"], "--batch must be positive, got -1"),
        (["--eval-tokens", "0"], "--eval-tokens must be at least --seq-len (128"),
        (["--seq-len", "64", "--eval-tokens", "63"], "--eval-tokens must be at least --seq-len (64"),
        (["--log-every", "-1"], "--log-every must be a number of seconds"),
        # audit D3 of 2026-11-27: --draft-steps 0 was refused after the target had trained ("plan.steps")
        (["--draft-steps", "0"], "--draft-steps must be at least 1, got 0"),
        (["--target-steps", "-3"], "--target-steps must be at least 1, got -3"),
        (["--vocab", "257"], "--vocab must be at least 258, got 257"),
        (["--max-chars", "0"], "--max-chars must be at least 1, got 0"),
        (["--val-every", "1"], "--val-every must be at least 2, got 1"),
        (["--target-share", "1"], "--target-share must lie in (0, 1), got 1"),
        # torch.manual_seed's "Overflow when unpacking long long" after the corpus and tokenizer stages
        (["--seed", str(10**20)], "--seed must lie in [0, 2**62), got 100000000000000000000"),
        (["--seed", str(2**62)], "--seed must lie in [0, 2**62)"),
        (["--seed", "-1"], "--seed must lie in [0, 2**62), got -1"),
    ):
        with pytest.raises(SystemExit):
            train.main(["--out", str(tmp_path / "out"), *argv])
        err = capsys.readouterr().err
        assert said in err and "Traceback" not in err, argv
    for out, said in ((a_file, "is a file, not a folder"), (a_file / "sub" / "x", "a file, not a folder")):
        with pytest.raises(SystemExit):
            train.main(["--out", str(out)])
        assert said in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_presets_grow_in_parameters_at_every_vocabulary():
    """``ORDER`` is what the draft-smaller-than-target check compares: it must be the parameter order."""
    ids = types.SimpleNamespace(bos_token_id=0, eos_token_id=1)
    for vocab in (300, 4096, 32000):
        with torch.device("meta"):  # shapes only: no memory for the 91 M+ base
            counts = [count_parameters(train.build_model(train.SIZES[name], vocab, 64, 0, ids)) for name in train.ORDER]
        assert counts == sorted(counts) and len(set(counts)) == len(counts), (vocab, counts)


def test_run_uses_the_configured_threads(tmp_path):
    """``run`` (not only the command line) applies ``threads``; here the run stops at the empty corpus."""
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        with pytest.raises(ValueError, match="corpus"):
            train.run(train.TrainConfig(out=str(tmp_path / "o"), threads=1, roots=(str(tmp_path),)))
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_split_drops_training_copies_of_held_out_files():
    """A vendored copy of a held-out file elsewhere in the tree would be validation text seen in training."""
    docs = [train.Document(f"f{i}", f"text {i}") for i in range(8)]
    docs[1] = train.Document("vendored/f3", "text 3")  # the same text as f3, held out at val_every = 4
    docs[5] = train.Document("other/f3", "text 3 more")  # a short file that differs in its line: kept
    docs[6] = train.Document("spaced/f7", "\ntext 7  \r\n\n")  # f7 but for blank lines and trailing space
    tr, val = train.split_corpus(docs, val_every=4)
    assert [d.name for d in val] == ["f3", "f7"]
    assert [d.name for d in tr] == ["f0", "f2", "f4", "other/f3"]


def _source(tag: str, n: int) -> str:
    """``n`` distinct non-blank lines (trailing spaces, a blank line after every third)."""
    return "".join(f"{tag}_{i} = {i}  \n" + ("\n" if i % 3 == 0 else "") for i in range(n))


def test_split_drops_near_copies_of_held_out_files_and_keeps_shared_headers():
    """``site-packages`` vendors files a few lines apart from their originals (pip's copy of ``rich/align.py``:
    97% of its text in identical runs): exact-text matching kept them, so validation text was trained on.  A
    training file sharing with a held-out file at least half of the smaller one's runs of ``NEAR_LINES``
    non-blank lines is dropped; one sharing a header of a few runs stays.  Counts by hand: held out at
    ``val_every = 4`` are f3 (9 header lines + a0..a29: 39 lines, 32 runs) and f7 (b0..b29: 23 runs);
    ``_source``'s 4 physical lines hold 3 of its lines, so ``[:20]`` ends at a14 and ``[:24]`` at a17."""
    assert train.NEAR_LINES == 8 and train.NEAR_SHARE == 0.5
    body3, body7 = _source("a", 30), _source("b", 30)
    header = "".join(f"# licence line {i}\n" for i in range(9))
    lines3, lines7 = body3.splitlines(keepends=True), body7.splitlines(keepends=True)
    docs = [
        # a0..a14, x, a15..a29: 24 runs; the 16 all-a runs that skip x are f3's: 16 >= 24 / 2
        train.Document("edited", "".join(lines3[:20]) + "x = 1\n" + "".join(lines3[20:])),
        train.Document("holds", _source("d", 200) + body7),  # all 23 of f7's runs inside 223
        train.Document("held", "".join(lines7[:12])),  # b0..b8: 2 runs, both in f7
        train.Document("f3", header + body3),
        train.Document("header", header + _source("e", 40)),  # 42 runs, 2 of them f3's (the header): 2 < 16
        train.Document("part", "".join(lines3[:20]) + _source("g", 10)),  # a0..a14 + 10: 18 runs, 8 f3's: 8 < 9
        train.Document("more", "".join(lines3[:24]) + _source("h", 11)),  # a0..a17 + 11: 22 runs, 11 f3's: 11 >= 11
        train.Document("f7", body7),
    ]
    tr, val = train.split_corpus(docs, val_every=4)
    assert [d.name for d in val] == ["f3", "f7"]
    assert [d.name for d in tr] == ["header", "part"]
    with pytest.raises(ValueError, match="no training file is left: each of the 1 not held out copies"):
        train.split_corpus([train.Document("a", "x = 1\n"), train.Document("b", "x = 1\n\n")], val_every=4)
    with pytest.raises(ValueError, match="got 0: no readable non-blank"):
        train.split_corpus([], val_every=4)
    with pytest.raises(ValueError, match=r"got 1 \(a\): raise max_chars"):
        train.split_corpus([train.Document("a", "x = 1\n")], val_every=4)


def test_stop_token_ids_reads_the_generation_config_and_the_tokenizer() -> None:
    """The command line's stop tokens: the target's ``generation_config.eos_token_id`` (an int or a list)
    together with the tokenizer's eos, ascending, each once."""
    from types import SimpleNamespace

    from spec.llm.models import stop_token_ids

    model = tiny_llama(16, eos_token_id=3)
    assert stop_token_ids(model) == [3]
    assert stop_token_ids(model, SimpleNamespace(eos_token_id=3)) == [3]
    assert stop_token_ids(model, SimpleNamespace(eos_token_id=1)) == [1, 3]
    model.generation_config.eos_token_id = [9, 3, 7]
    assert stop_token_ids(model, SimpleNamespace(eos_token_id=1)) == [1, 3, 7, 9]
    model.generation_config.eos_token_id = None
    assert stop_token_ids(model, SimpleNamespace(eos_token_id=None)) == []
    assert stop_token_ids(SimpleNamespace(), SimpleNamespace(eos_token_id=5)) == [5]
