"""``tmc bench decode`` on tiny random pairs: every method runs, greedy rows equal AR, figures add up, bad input."""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from importlib.metadata import entry_points  # noqa: E402

from spec.bench_decode import BASELINES, DEFAULT_METHODS, Method, check_rows, main, parse_method, plot, render, run_decode_bench  # noqa: E402
from spec.llm.generate import ar_generate  # noqa: E402
from spec.llm.models import tiny_pair  # noqa: E402
from tests.spec.llm.conftest import SavedPair  # noqa: E402
from tmc.cli import main as tmc_main  # noqa: E402

pytestmark = pytest.mark.llm


@pytest.fixture(scope="module")
def pair() -> tuple[object, object]:
    return tiny_pair(29, seed=0)


def _methods(names: tuple[str, ...] = DEFAULT_METHODS) -> list[Method]:
    return [parse_method(m, budget=6, chain_budget=3) for m in names]


def test_parse_method() -> None:
    assert parse_method("ar", 16, 4) == Method("ar")
    assert parse_method("chain:sps", 16, 4) == Method("chain:sps", "chain", "sps", 4)
    assert parse_method("dyspec:traversal", 16, 4).budget == 16
    assert parse_method(" fixed:multidraft@32 ", 16, 4) == Method("fixed:multidraft@32", "fixed", "multidraft", 32)
    assert parse_method("wetap:traversal@3", 16, 4).label == "wetap+traversal@3"
    host = parse_method("chain:asps:host@5", 16, 4)
    assert host == Method("chain:asps:host@5", "chain", "asps", 5, True) and host.label == "chain+asps@5/host"
    numpy_host = parse_method("chain:sps:numpy:host", 16, 4)
    assert (numpy_host.on_host, numpy_host.backend, numpy_host.label) == (True, "numpy", "chain+sps@4/host/numpy")
    torch_tree = parse_method("dyspec:traversal:torch@8", 16, 4)
    assert (torch_tree.on_host, torch_tree.backend, torch_tree.label) == (False, "torch", "dyspec+traversal@8/torch")
    assert parse_method("dyspec:traversal", 16, 4).backend == "auto"
    fused_tree = parse_method("fixed/draw=iid:traversal:graph@7", 16, 4)  # a fused tree step
    assert (fused_tree.step_graph, fused_tree.compile_step, fused_tree.label) == (
        True, False, "fixed/draw=iid+traversal@7/graph")
    assert parse_method("chain:multidraft:compiled", 16, 4).compile_step  # a chain is a tree drawn iid
    whole = parse_method("fixed/draw=iid:traversal:whole@7", 16, 4)  # the whole step compiled
    assert (whole.step_graph, whole.compile_step, whole.label) == (True, "whole", "fixed/draw=iid+traversal@7/whole")
    # ranked / swor trees the device drafts at both temperatures: the draft above temperature 0 keeps width tokens
    # a row, a greedy draft makes the tree a chain (fixed draws swor by default)
    for ranked in ("fixed/draw=topk:traversal:dtemp=1:graph@6", "fixed/draw=topk/width=1:multidraft:graph",
                   "chain/draw=topk:traversal:graph", "fixed:traversal:dtemp=1:compiled",
                   "fixed/width=1:traversal:graph", "fixed/draw=topk:traversal:graph", "fixed:traversal:graph",
                   "fixed/draw=topk:traversal:dtemp=0:graph", "fixed/draw=swor:traversal:dtemp=0:graph",
                   "fixed/draw=topk:multidraft:compiled"):
        assert parse_method(ranked, 16, 4).step_graph, ranked
    device_tree = parse_method("fixed/draw=iid:traversal:device@8", 16, 4)  # the tree walked on the device
    assert (device_tree.backend, device_tree.label) == ("device", "fixed/draw=iid+traversal@8/device")
    tree_on_chain = parse_method("chain:traversal:host", 16, 4)  # a tree verifier on a host-drafted chain
    assert (tree_on_chain.on_host, tree_on_chain.label) == (True, "chain+traversal@4/host")
    iid_tree = parse_method("fixed/draw=iid:traversal:host@8", 16, 4)  # a fixed i.i.d. tree drafted on the host
    assert (iid_tree.on_host, iid_tree.label) == (True, "fixed/draw=iid+traversal@8/host")
    warm = parse_method("fixed/draw=topk:traversal:dtemp=1:numpy@8", 16, 4)  # the draft at its own temperature
    assert (warm.draft_temperature, warm.backend, warm.label) == (1.0, "numpy", "fixed/draw=topk+traversal@8/numpy/dtemp=1")
    assert parse_method("chain:sps:host:dtemp=0.5", 16, 4).draft_temperature == 0.5
    assert parse_method("chain:sps:dtemp=0", 16, 4).label == "chain+sps@4/dtemp=0"
    assert parse_method("dyspec:traversal", 16, 4).draft_temperature is None
    # ordered Traversal fused: on a chain, 2-wide trees, a 3-wide swor tree cut to 2 nodes (a whole one is walked
    # on the host: refused below)
    for fused in ("chain:ordered_traversal:compiled", "fixed/draw=iid:ordered_traversal:graph",
                  "fixed/draw=swor/width=2:ordered_traversal:graph", "fixed/draw=swor/width=3:ordered_traversal:graph@2"):
        assert parse_method(fused, 16, 4).verifier == "ordered_traversal"
    for bad in ("nope", "dyspec", "dyspec:nope", "nope:traversal", "chain:sps@0", "chain:sps@x", "chain:sps@-2",
                "dyspec:traversal:host", "wetap:traversal:host", "chain:sps:gpu", "chain:sps:host:x",
                "chain:sps:torch:numpy", "chain:sps:device:torch", "fixed:traversal:numpy:device",
                "dyspec:traversal:numpy:numpy", "chain:sps:host:host", "dyspec:traversal:",
                "dyspec:traversal:dtemp=", "dyspec:traversal:dtemp=x", "dyspec:traversal:dtemp=-1",
                "dyspec:traversal:dtemp=nan", "dyspec:traversal:dtemp=inf", "dyspec:traversal:dtemp=1:dtemp=1",
                "dyspec:traversal:dtemp", "chain/confidence=0:sps", "chain/confidence=1.5:sps@20",
                "dyspec:traversal:graph", "chain:sps:host:graph", "chain/confidence=0.5:traversal:graph",
                "chain:sps:numpy:graph", "chain:sps:graph:graph", "chain:sps:graph:compiled",
                "chain:sps:compiled:whole", "chain:sps:graph:whole", "dyspec:traversal:whole", "chain:sps:host:whole",
                "dyspec:traversal:compiled", "chain/confidence=0.5:ordered_traversal:compiled",
                "chain:sps:host:compiled", "fixed/draw=swor/width=3:ordered_traversal:graph",
                "fixed/draw=iid:sps:graph", "fixed/draw=iid:traversal:host:graph",
                "wetap:traversal:graph", "dynatree:multidraft:graph"):
        with pytest.raises(ValueError, match="method"):
            parse_method(bad, 16, 4)
    # refused only after the models loaded and the earlier rows ran (an audit): now at parsing
    for bad, message in (("fixed:sps", "verifies chains"), ("fixed/draw=iid:block", "verifies chains"),
                         ("dyspec:traversal@5000", "budget must be <= 4,096"),
                         ("dyspec:ordered_traversal", "number of children is fixed"),
                         ("dyspec-threshold:kseq", "number of children is fixed")):
        with pytest.raises(ValueError, match=f"method {bad!r}: .*{message}"):
            parse_method(bad, 16, 4)
    assert parse_method("fixed/draw=topk:sps", 16, 4).verifier == "sps"  # a chain on a greedy draft's rows
    # ... so only rows whose draft is one-hot take it: at temperature 0, or with dtemp=0 at any temperature
    check_rows([parse_method("fixed/draw=topk:sps", 16, 4)], [0.0])
    check_rows([parse_method("fixed/draw=topk:sps:dtemp=0", 16, 4)], [0.0, 1.0])
    with pytest.raises(ValueError, match="at temperature 1: verifier 'sps' verifies chains; a fixed tree drawn topk"):
        check_rows([parse_method("fixed/draw=topk:sps", 16, 4)], [0.0, 1.0])
    with pytest.raises(ValueError, match="verifies chains; dynatree branches unless the draft is one-hot"):
        parse_method("dynatree:sps:dtemp=0.005", 16, 4)


def test_parse_method_builder_parameters() -> None:
    m = parse_method("wetap/w_min=4/w-max=16/gamma=1.5:traversal@16", 8, 4)
    assert (m.builder, m.verifier, m.budget) == ("wetap", "traversal", 16)
    assert m.params == (("w_min", 4), ("w_max", 16), ("gamma", 1.5))
    assert m.label == "wetap/w_min=4/w_max=16/gamma=1.5+traversal@16"
    fixed = parse_method("fixed/draw=topk/depth=null:traversal", 8, 4)
    assert fixed.params == (("draw", "topk"), ("depth", None)) and fixed.budget == 8
    host = parse_method("chain/draw=topk:sps:host@3", 8, 4)
    assert host.on_host and host.params == (("draw", "topk"),) and host.label == "chain/draw=topk+sps@3/host"
    assert parse_method("dyspec:traversal", 8, 4).params == ()
    cases = {  # text -> what the message names
        "wetap/w_min=0:traversal": "w_min",  # the builder's own check
        "wetap/w_min=9/w_max=4:traversal": "w_min <= w_max",
        "wetap/width=4:traversal": "width",  # not a WETAP parameter
        "fixed/draw=nope:traversal": "draw",
        "wetap/w_min:traversal": "/KEY=VALUE",
        "wetap/=4:traversal": "/KEY=VALUE",
        "wetap/w_min=:traversal": "/KEY=VALUE",
        "wetap/w_min=2/w_min=3:traversal": "twice",
    }
    for text, named in cases.items():
        with pytest.raises(ValueError, match="method") as err:
            parse_method(text, 16, 4)
        assert named in str(err.value), (text, str(err.value))


def test_builder_parameters_reach_the_builder(pair: tuple[object, object]) -> None:
    target, draft = pair
    methods = [parse_method(m, budget=6, chain_budget=3) for m in ("fixed:traversal", "fixed/depth=1:traversal")]
    report = run_decode_bench(target, draft, [[4, 4, 1]], methods, temperatures=(1.0,), new_tokens=8, warmup=False)
    full, shallow = report["rows"]
    assert shallow["method"] == "fixed/depth=1+traversal@6"
    assert full["mean_tree"] == 6.0  # width 2, no depth limit: the budget decides
    assert shallow["mean_tree"] <= 2.0  # one layer of at most 2 children


def test_mean_tree_is_per_step_over_every_run() -> None:
    """One run of 1 step with 2 nodes and one of 3 steps with 6: 20 nodes over 4 steps is 5 a step (the mean of
    the runs' means, 4, weighed a short run like a long one)."""
    from spec.bench_decode import _row

    parts = dict.fromkeys(("build_s", "draft_s", "target_s", "verify_s", "graph_s", "loop_s"), 1.0)
    runs = [dict(parts, tokens=[1, 2], seconds=1.0, steps=1, tree=2.0), dict(parts, tokens=[1] * 6, seconds=1.0, steps=3, tree=6.0)]
    row = _row(parse_method("fixed:traversal", 6, 3), 1.0, runs)
    assert row["mean_tree"] == 5.0 and row["tokens_per_step"] == 2.0


def test_host_chain_rows_run_beside_device_chain_rows(pair: tuple[object, object]) -> None:
    target, draft = pair
    methods = [parse_method(m, budget=6, chain_budget=3) for m in ("ar", "chain:block", "chain:block:host")]
    report = run_decode_bench(target, draft, [[4, 4, 1]], methods, temperatures=(0.0,), new_tokens=8, warmup=False)
    assert [r["method"] for r in report["rows"]] == ["ar", "chain+block@3", "chain+block@3/host"]
    assert all(r["agree_ar"] == 1.0 for r in report["rows"])


def test_graph_rows_run_beside_device_chain_rows(pair: tuple[object, object]) -> None:
    """A ``graph`` row (fused steps on the static cache, whatever ``cache`` the others use) decodes the device
    chain's tokens; its costs come from ``ChainStepGraph.profile``, which does not split builder and verifier."""
    target, draft = pair
    graph = parse_method("chain:asps:torch:graph@3", 16, 4)
    assert graph.step_graph and graph.backend == "torch" and graph.label == "chain+asps@3/torch/graph"
    compiled = parse_method("chain:block:compiled", 16, 4)
    assert compiled.step_graph and compiled.compile_step and compiled.label == "chain+block@4/compiled"
    assert not graph.compile_step
    methods = [parse_method(m, budget=6, chain_budget=3) for m in ("ar", "chain:asps", "chain:asps:graph")]
    report = run_decode_bench(target, draft, [[4, 4, 1], [2, 7, 1]], methods, temperatures=(0.0, 1.0), new_tokens=12,
                              warmup=False, cache="dynamic")
    rows = {(r["temperature"], r["method"]): r for r in report["rows"]}
    for temp in (0.0, 1.0):
        fused, plain = rows[(temp, "chain+asps@3/graph")], rows[(temp, "chain+asps@3")]
        assert fused["tokens_per_step"] == plain["tokens_per_step"]
        assert fused["builder_pct"] is None and fused["verify_pct"] is None and "step_overhead_pct" in fused
        assert min(fused["step_step_ms"], fused["step_forwards_ms"], fused["step_target_ms"]) > 0
        assert "step_ms" not in plain
        # "as called": the fused row's whole call of the step (draw_step); the unfused row's parts plus what follows
        # the verifier; "host": that call with the run left out (only fused rows have it)
        assert fused["called_pct"] == fused["step_call_overhead_pct"] and fused["loop_pct"] is None
        assert fused["host_pct"] == fused["step_host_pct"] > 0 and "host_pct" not in plain
        assert plain["loop_s"] > 0 and plain["loop_pct"] == pytest.approx(100 * plain["loop_s"] / plain["target_s"])
        assert plain["called_pct"] == pytest.approx(plain["overhead_pct"] + plain["loop_pct"])
    assert rows[(0.0, "chain+asps@3/graph")]["agree_ar"] == 1.0
    table = render(report).splitlines()
    header = next(line for line in table if line.startswith("method"))
    fused_line = next(line for line in table if line.startswith("chain+asps@3/graph"))
    plain_line = next(line for line in table if line.startswith("chain+asps@3 "))
    at = header.index("host %")  # right-aligned: the cell ends where the header does
    host = format(rows[(0.0, "chain+asps@3/graph")]["host_pct"], ".1f")
    assert fused_line[: at + len("host %")].endswith(host) and plain_line[: at + len("host %")].endswith("-")


@pytest.mark.parametrize(("row", "label", "flag"), [
    ("fixed/draw=iid:traversal", "fixed/draw=iid+traversal@6", "graph"),
    ("fixed/draw=topk:traversal:dtemp=1", "fixed/draw=topk+traversal@6", "graph"),
    ("fixed:traversal", "fixed+traversal@6", "graph"),  # at T = 0 the greedy draft's chain
    ("fixed/draw=iid:traversal", "fixed/draw=iid+traversal@6", "whole"),
])
def test_fused_tree_rows_run_beside_device_tree_rows(pair: tuple[object, object], row: str, label: str, flag: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A fused tree row (``:graph``; i.i.d., ranked from the draft at 1, or swor, which a greedy draft makes a chain;
    ``:whole``, the whole step through ``torch.compile``, here with dynamo's ``eager`` backend: real tracing, no
    code generated) decodes the device tree's tokens; its costs come from ``TreeStepGraph.profile`` on the graph
    its decodes used."""
    from spec.llm import generate as gen

    monkeypatch.setattr(gen, "COMPILE_BACKEND", "eager")
    target, draft = pair
    methods = [parse_method(m, budget=6, chain_budget=3) for m in ("ar", row, f"{row}:{flag}")]
    report = run_decode_bench(target, draft, [[4, 4, 1], [2, 7, 1]], methods, temperatures=(0.0, 1.0), new_tokens=12,
                              warmup=False, cache="static")
    rows = {(r["temperature"], r["method"].replace("/dtemp=1", "")): r for r in report["rows"]}
    for temp in (0.0, 1.0):
        fused, plain = rows[(temp, f"{label}/{flag}")], rows[(temp, label)]
        assert fused["tokens_per_step"] == plain["tokens_per_step"]
        assert fused["builder_pct"] is None and "step_overhead_pct" in fused
        assert min(fused["step_step_ms"], fused["step_forwards_ms"], fused["step_target_ms"]) > 0
    assert rows[(0.0, f"{label}/{flag}")]["agree_ar"] == 1.0
    torch._dynamo.reset()


def test_every_method_runs_and_greedy_rows_equal_ar(pair: tuple[object, object]) -> None:
    target, draft = pair
    prompts = [[1, 2, 3, 4, 5, 6], [7, 3, 9, 2, 2, 8]]
    report = run_decode_bench(target, draft, prompts, _methods(), temperatures=(0.0, 1.0), new_tokens=10, seed=3,
                              warmup=False)
    rows = report["rows"]
    assert len(rows) == 2 * len(DEFAULT_METHODS)
    labels = [m.label for m in _methods()]
    assert [r["method"] for r in rows] == labels * 2
    for r in rows:
        assert r["new_tokens"] == 2 * 10  # EOS never stops a benchmark run
        assert r["tokens_per_s"] > 0 and r["seconds"] > 0
        assert 1.0 <= r["tokens_per_step"] <= 7.0 + 1e-9  # at most budget 6 accepted + 1 per step
        if r["method"] in ("ar", "ar-static"):
            assert r["tokens_per_step"] == 1.0
        if r["method"] not in BASELINES:
            assert r["draft_s"] <= r["build_s"]
            expected = 100 * (r["build_s"] - r["draft_s"] + r["verify_s"]) / r["target_s"]
            assert r["overhead_pct"] == pytest.approx(expected)
            assert r["overhead_pct"] == pytest.approx(r["builder_pct"] + r["verify_pct"])
        base = next(b for b in rows if b["temperature"] == r["temperature"] and b["method"] == "ar")
        assert r["speedup_ar"] == pytest.approx(r["tokens_per_s"] / base["tokens_per_s"])
        assert [len(rr) for rr in r["tokens"]] == [len(prompts)] and all(len(t) == 10 for t in r["tokens"][0])
        if r["temperature"] == 0:
            # float32 on CPU: every lossless method, HF's static and assisted generation included, is greedy decoding
            assert r["agree_ar"] == 1.0, r["method"]
            assert r["tokens"] == base["tokens"], r["method"]  # the tokens kept are the ones compared
        else:
            assert "agree_ar" not in r
    text = render(report)
    assert "T = 0" in text and "T = 1" in text and "wetap+traversal@6" in text
    json.dumps(report)  # JSON-able


def test_methods_take_turns_prompt_by_prompt(pair: tuple[object, object], monkeypatch: pytest.MonkeyPatch) -> None:
    """Interleaving: each prompt is decoded by every method before the next prompt, the order rotated by one."""
    import spec.bench_decode as bd

    calls: list[tuple[str, int]] = []
    real = bd._run_one

    def spy(method: Method, target: object, draft: object, prompt: list[int], *args: object) -> dict[str, object]:
        calls.append((method.label, prompt[0]))
        return real(method, target, draft, prompt, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(bd, "_run_one", spy)
    names = ("ar", "chain:sps", "dyspec:traversal")
    labels = [m.label for m in _methods(names)]
    run_decode_bench(*pair, [[1, 2], [3, 2], [5, 2]], _methods(names), temperatures=(1.0,), new_tokens=2,
                     warmup=False, rounds=2)
    order = [labels[k] for k in (0, 1, 2, 1, 2, 0, 2, 0, 1, 0, 1, 2, 1, 2, 0, 2, 0, 1)]
    assert [c[0] for c in calls] == order
    assert [c[1] for c in calls] == [p for _ in range(2) for p in (1, 3, 5) for _ in range(3)]
    calls.clear()
    report = run_decode_bench(*pair, [[1, 2], [3, 2]], _methods(names), temperatures=(0.0,), new_tokens=2,
                              warmup=False, order="sequential")
    assert calls == [(lab, p) for lab in labels for p in (1, 3)]
    assert report["order"] == "sequential" and "methods sequential" in render(report)
    assert all(r["agree_ar"] == 1.0 for r in report["rows"])


def test_no_timed_run_grows_a_static_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """On the static cache a growing cache drops every graph it captured, so the caches are sized for the
    longest run before the warm-up: every allocation comes before the first decode.  Without the sizing, the
    rows of a larger budget grow the caches in their own runs (checked, so the test can fail)."""
    import spec.bench_decode as bd
    from spec.llm.static_cache import StaticTreeCache

    events: list[str] = []
    real_run, real_alloc = bd._run_one, StaticTreeCache._allocate

    def run(*args: object) -> dict[str, object]:
        events.append("run")
        return real_run(*args)  # type: ignore[arg-type]

    def alloc(self: StaticTreeCache, capacity: int) -> None:
        events.append("alloc")
        real_alloc(self, capacity)

    monkeypatch.setattr(bd, "_run_one", run)
    monkeypatch.setattr(StaticTreeCache, "_allocate", alloc)
    # WETAP feeds its draft its unpruned layers, up to 8 + 4 x 128 nodes a step here: until 2026-11-27 its warm-up
    # grew the draft's cache (TreeBuilder.draft_nodes)
    names = ("ar-loop", "chain:sps", "dyspec:traversal@40", "fixed:traversal@90",
             "wetap/w_min=8/w_max=128/length=6:traversal")
    for presize in (True, False):
        if not presize:
            monkeypatch.setattr(bd, "_presize_static_caches", lambda *args: None)
        events.clear()
        target, draft = tiny_pair(29, seed=0)  # fresh models: fresh shared caches
        run_decode_bench(target, draft, [[1, 2, 3], [4, 5, 6]], _methods(names), temperatures=(1.0,), new_tokens=12,
                         cache="static")
        first = events.index("run")
        assert events.count("run") == 3 * len(names)  # the warm-up and two prompts
        assert ("alloc" in events[first:]) is not presize, presize
        assert events[:first].count("alloc") == (2 if presize else 0)  # target and draft, once each


def test_rounds_give_each_speedup_a_range(pair: tuple[object, object]) -> None:
    """Two rounds: the same tokens twice, per-round tok/s, and each speedup's range over the rounds, which holds
    the whole-run speedup (equal tokens per round make it a mediant of the rounds' ratios)."""
    prompts = [[1, 2, 3], [4, 5, 6]]
    report = run_decode_bench(*pair, prompts, _methods(("ar", "hf-assisted", "chain:sps")), temperatures=(0.0,),
                              new_tokens=6, warmup=False, rounds=2)
    assert report["rounds"] == 2 and report["order"] == "interleaved"
    for r in report["rows"]:
        assert r["runs"] == 4 and r["prompts"] == 2 and r["new_tokens"] == 4 * 6
        assert len(r["tokens_per_s_rounds"]) == 2 and all(v > 0 for v in r["tokens_per_s_rounds"])
        assert r["agree_ar"] == 1.0
        for key in ("speedup_ar", "speedup_assisted"):
            lo, hi = r[key + "_range"]
            assert lo - 1e-12 <= r[key] <= hi + 1e-12, (r["method"], key)
        assert r["speedup_ar_static_range"] is None  # no ar-static row
    ar = report["rows"][0]
    assert ar["speedup_ar_range"] == [1.0, 1.0]
    text = render(report)
    assert "2 rounds" in text and "×assisted per round" in text
    one = run_decode_bench(*pair, prompts, _methods(("ar",)), temperatures=(0.0,), new_tokens=2, warmup=False)
    assert one["rounds"] == 1 and "tokens_per_s_rounds" not in one["rows"][0] and "per round" not in render(one)
    json.dumps(report)


def test_plot_writes_a_png(pair: tuple[object, object], tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    target, draft = pair
    report = run_decode_bench(target, draft, [[1, 2, 3]], _methods(("ar", "chain:sps")), temperatures=(1.0,),
                              new_tokens=4, warmup=False)
    plot(report, tmp_path / "d.png")
    assert (tmp_path / "d.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_rows_that_cannot_be_run_are_refused_before_any_model_loads(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """No method, a repeated method or a repeated temperature were refused only after both models had loaded
    (a CLI audit of 2026-11-28; minutes for a large pair), though README promises such checks first."""
    import spec.llm.models

    def never(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(spec.llm.models, "load_for_decoding", never)
    for d in ("target", "draft"):
        (tmp_path / d).mkdir()
    for extra, said in ((["--methods", ","], "methods must name at least one method"),
                        (["--methods", "ar,ar"], "methods repeat ar: each may appear once"),
                        (["--methods", "ar", "--temperatures", "0,0"], "temperatures repeat 0.0: each may appear once"),
                        # a topk tree branches from a draft above temperature 0: a chain verifier's row at T = 1 would
                        # raise at its first branching step, after the earlier rows ran
                        (["--methods", "fixed/draw=topk:sps"],
                         "method 'fixed/draw=topk:sps' at temperature 1: verifier 'sps' verifies chains")):
        assert main(["--pair", str(tmp_path), "--device", "cpu", *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and said in err[0], err


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"prompts": []}, "prompts"),
        ({"new_tokens": 0}, "new_tokens"),
        ({"methods": []}, "methods"),
        ({"cache": "paged"}, "cache must be one of"),
        ({"rounds": 0}, "rounds must be a positive integer"),
        ({"rounds": 1.5}, "rounds must be a positive integer"),
        ({"rounds": True}, "rounds must be a positive integer"),
        ({"order": "random"}, "order must be one of"),
        # a repeat overwrote a row keyed by (temperature, label): `ar` was compared with itself (0.89x)
        ({"temperatures": (0.0, 0.0)}, "temperatures repeat 0.0"),
        ({"methods": _methods(("ar", "chain:sps", "chain:sps@3"))}, "methods repeat chain[+]sps@3"),
    ],
)
def test_bad_arguments(pair: tuple[object, object], kwargs: dict[str, object], message: str) -> None:
    target, draft = pair
    args: dict[str, object] = {"prompts": [[1, 2]], "methods": _methods(("ar",)), "new_tokens": 2}
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        run_decode_bench(target, draft, **args)  # type: ignore[arg-type]


REGISTERED = any(ep.name == "decode" for ep in entry_points(group="tmc.benchmarks"))


@pytest.mark.parametrize("entry", [
    pytest.param("tmc", marks=pytest.mark.skipif(not REGISTERED, reason="package not installed: no tmc.benchmarks entry")),
    "module",
])
def test_command_on_a_saved_pair(saved_pair: SavedPair, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                 entry: str) -> None:
    """End to end through ``tmc bench decode`` (and ``python -m spec.bench_decode``): held-out prompts, table,
    JSON and PNG."""
    pytest.importorskip("matplotlib")
    argv = ["--pair", str(saved_pair.path), "--prompts", "2", "--prompt-tokens", "8", "--new-tokens", "4",
            "--methods", "ar,chain:sps@2,dyspec:traversal@4", "--device", "cpu", "--threads", "1", "--save", str(tmp_path / "out")]
    counted = entry == "tmc"  # --count-ops through one entry point
    code = tmc_main(["bench", "decode", *argv, "--count-ops"]) if counted else main(argv)
    out = capsys.readouterr()
    assert code == 0
    assert "dyspec+traversal@4" in out.out and "tok/s" in out.out
    assert ("ops/step" in out.out) == counted
    report = json.loads((tmp_path / "out" / "decode.json").read_text())
    assert [("ops_per_step" in r) for r in report["rows"]] == [False, counted, counted] * 2  # T = 0, then 1
    assert {r["method"] for r in report["rows"]} == {"ar", "chain+sps@2", "dyspec+traversal@4"}
    assert report["prompt_tokens"] == [8, 8]
    assert report["environment"]["threads"] == 1
    from tmc.commands.bench import cpu_name
    assert report["environment"]["device"] == cpu_name()  # the processor and its cores, not "cpu"
    assert (tmp_path / "out" / "decode.png").is_file()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--methods", "ar"], "--pair DIR or --target DIR and --draft DIR"),
        (["--pair", "P", "--target", "T"], "not both"),
        (["--pair", "{tmp}/missing", "--methods", "ar"], "--pair {tmp}/missing: no such folder"),
        (["--pair", "P", "--methods", "ar,bogus"], "method 'bogus'"),
        (["--pair", "P", "--methods", "ar,wetap/w_max=0:traversal"], "w_max"),
        (["--pair", "P", "--temperatures", "0,-1"], "--temperatures"),
        (["--pair", "P", "--new-tokens", "0"], "--new-tokens must be a positive integer"),
        (["--pair", "P", "--threads", "0"], "--threads must be a positive integer"),
        (["--pair", "P", "--rounds", "0"], "--rounds must be a positive integer"),
        (["--pair", "P", "--device", "gpu"], "device 'gpu' is not a torch device"),
        (["--pair", "P", "--device", "meta"], "device 'meta' holds shapes without data"),
        (["--pair", "{tmp}/missing", "--save", "{tmp}/a_file"], "--save {tmp}/a_file: File exists"),  # before loading
        (["--pair", "{tmp}/half", "--methods", "ar"], "--pair {tmp}/half: no draft/ folder in it"),
    ],
)
def test_command_errors_are_one_line(argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a_file").write_text("")
    (tmp_path / "half" / "target").mkdir(parents=True)
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    message = message.replace("{tmp}", str(tmp_path))
    assert main(argv) == 2  # the same function as `tmc bench decode` (test_command_on_a_saved_pair runs both)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_thread_wait_policy_is_recorded_and_passive_is_flagged(pair: tuple[object, object], saved_pair: SavedPair,
                                                               capsys: pytest.CaptureFixture[str],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The report names OMP_WAIT_POLICY, and a multi-threaded CPU run under PASSIVE prints the note (once)."""
    from spec.bench_decode import PASSIVE_WARNING

    target, draft = pair
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    plain = run_decode_bench(target, draft, [[1, 2, 3]], _methods(("ar",)), temperatures=(0.0,), new_tokens=2,
                             warmup=False)
    assert plain["environment"]["omp_wait_policy"] is None and "OMP_WAIT_POLICY" not in render(plain)
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    passive = run_decode_bench(target, draft, [[1, 2, 3]], _methods(("ar",)), temperatures=(0.0,), new_tokens=2,
                               warmup=False)
    assert passive["environment"]["omp_wait_policy"] == "PASSIVE" and "OMP_WAIT_POLICY=PASSIVE" in render(passive)

    threads = torch.get_num_threads()
    try:
        for n, warned in ((1, False), (2, True)):
            argv = ["--pair", str(saved_pair.path), "--prompts", "1", "--prompt-tokens", "8", "--new-tokens", "2",
                    "--methods", "ar", "--device", "cpu", "--threads", str(n)]
            assert main(argv) == 0
            assert capsys.readouterr().err.count(PASSIVE_WARNING) == int(warned), n
    finally:
        torch.set_num_threads(threads)


def test_hf_baselines_ignore_the_models_generation_config() -> None:
    """HF ``generate`` reads every setting the call leaves out from the model's ``generation_config``; a
    checkpoint's processors there (``repetition_penalty``, ``no_repeat_ngram_size``, ``suppress_tokens``)
    gave ``ar`` / ``ar-static`` / ``hf-assisted`` another law than our rows (audit D1: ``=ar`` 0.25 with a
    penalty of 1.05).  Now greedy rows all equal ``ar-loop``, sampled baselines draw suppressed tokens, and
    the configs are the models' own again afterwards."""
    target, draft = tiny_pair(29, seed=0)
    configs = (target.generation_config, draft.generation_config)
    methods = _methods(("ar", "ar-static", "hf-assisted", "ar-loop", "chain:sps@3"))
    prompts = [[3, 4, 5, 3], [7, 8, 9, 10, 7]]
    for config in configs:
        config.repetition_penalty, config.no_repeat_ngram_size = 2.0, 1
    greedy = run_decode_bench(target, draft, prompts, methods, temperatures=(0.0,), new_tokens=10, warmup=False)
    assert {r["method"]: r["agree_ar"] for r in greedy["rows"]} == dict.fromkeys(
        ("ar", "ar-static", "hf-assisted", "ar-loop", "chain+sps@3"), 1.0)
    assert greedy["rows"][0]["tokens"] == greedy["rows"][3]["tokens"]  # ar, ar-loop
    for config in configs:
        config.no_repeat_ngram_size, config.suppress_tokens = None, list(range(2, 20))
    sampled = run_decode_bench(target, draft, prompts, methods[:3], temperatures=(1.0,), new_tokens=10,
                               warmup=False)
    for row in sampled["rows"]:  # 20 draws, 18 of the 29 tokens suppressed: all outside them has odds 4e-9
        assert {t for run in row["tokens"][0] for t in run} & set(range(2, 20)), row["method"]
    assert target.generation_config is configs[0] and draft.generation_config is configs[1]
    assert configs[0].repetition_penalty == 2.0 and configs[1].suppress_tokens == list(range(2, 20))


def test_hf_baselines_decode_through_the_models_eos_as_our_rows_do() -> None:
    """Our loops decode every row to ``new_tokens`` with no EOS.  The HF baselines kept the checkpoint's EOS
    and masked it with ``min_new_tokens`` (audit D1 of 2026-11-27): where the EOS was the greedy token they
    decoded another sequence (``=ar`` 0.0 for every lossless row), and at T > 0 another law.  With the EOS
    set to the third greedy token every row now gives the greedy tokens, EOS included."""
    target, draft = tiny_pair(29, seed=0)
    prompt = [1, 2, 3, 4, 5, 6]
    greedy = ar_generate(target, prompt, temperature=0.0, max_new_tokens=6, cache="dynamic").tokens
    eos = greedy[2]
    assert eos not in greedy[:2]
    for model in (target, draft):
        model.generation_config.eos_token_id = eos
    names = ("ar", "ar-static", "hf-assisted", "ar-loop", "chain:sps@3")
    report = run_decode_bench(target, draft, [prompt], _methods(names), temperatures=(0.0,), new_tokens=6,
                              warmup=False)
    for row in report["rows"]:
        assert row["tokens"][0][0] == greedy and row["agree_ar"] == 1.0, row["method"]
    assert target.generation_config.eos_token_id == eos  # the models' own config is back


def _gpt2(positions: int, seed: int) -> Any:
    torch.manual_seed(seed)
    config = transformers.GPT2Config(vocab_size=29, n_embd=16, n_layer=1, n_head=2, n_positions=positions)
    return transformers.GPT2LMHeadModel(config).eval()


@pytest.mark.parametrize(("methods", "target_positions", "draft_positions", "message"), [
    (("ar", "chain:sps@3"), 16, 16, "target has position embeddings for 16 positions, and this decode may feed it 17"),
    (("ar-static",), 12, 12, "target has position embeddings for 12 positions, and this decode may feed it 16"),
    (("ar", "hf-assisted"), 64, 8, "draft has position embeddings for 8 positions, and this decode may feed it 16"),
])
def test_a_decode_past_a_position_table_is_refused_before_any_run(
        methods: tuple[str, ...], target_positions: int, draft_positions: int, message: str) -> None:
    """A prompt + new tokens past a learned position table: the HF baselines failed with an ``IndexError``
    from the embedding (audit D3: exit 1 and a traceback), our rows with the one-line ``ValueError`` only
    when their turn came.  Now every run is refused up front, the same way, naming the model."""
    target, draft = _gpt2(target_positions, 0), _gpt2(draft_positions, 1)
    with pytest.raises(ValueError, match=message):
        run_decode_bench(target, draft, [list(range(2, 15))], _methods(methods), temperatures=(0.0,),
                         new_tokens=4, warmup=False)
    # the draft's table does not matter to rows that do not use it; a prompt that fits runs
    ok = run_decode_bench(_gpt2(64, 0), draft, [list(range(2, 15))], _methods(("ar", "ar-loop")),
                          temperatures=(0.0,), new_tokens=4, warmup=False)
    assert [r["agree_ar"] for r in ok["rows"]] == [1.0, 1.0]
    # a speculative row needs one position more than AR (its last steps' trees are cut to the table), not budget
    ok = run_decode_bench(_gpt2(17, 0), _gpt2(17, 1), [list(range(2, 15))], _methods(("ar", "chain:sps@3")),
                          temperatures=(0.0,), new_tokens=4, warmup=False)
    assert [r["agree_ar"] for r in ok["rows"]] == [1.0, 1.0]


def test_a_missing_pair_folder_fails_at_once_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """``--pair DIR`` is a folder, never a hub id: a relative one that does not exist (or lacks draft/) went to
    the hub, 55 s of retries and an error blaming the network (audit D4).  Now one line names the folder at once
    (the hub is switched off here, so the old code fails on the message, not on the clock)."""
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "half" / "target").mkdir(parents=True)
    for args, said in ((["--pair", "nosuchpair"], "--pair nosuchpair: no such folder"),
                       (["--pair", "half"], "--pair half: no draft/ folder in it"),
                       # --target / --draft too (audit D4 of 2026-11-27: only --pair was checked)
                       (["--target", "nosuch/target", "--draft", "half/target"], "--target nosuch/target: no such folder"),
                       (["--target", "half/target", "--draft", "half/draft"], "--draft half/draft: no such folder")):
        t0 = time.perf_counter()
        assert main([*args, "--methods", "ar"]) == 2
        assert time.perf_counter() - t0 < 3.0, args
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and said in err[0], err


def _windows(tokenizer: Any, docs: list[Any], length: int) -> set[tuple[int, ...]]:
    """The prompt each document can give (``heldout_prompts``: ``length`` tokens from a third of the way in)."""
    out = set()
    for doc in docs:
        ids = tokenizer(doc.text)["input_ids"]
        out.add(tuple(ids[len(ids) // 3: len(ids) // 3 + length]))
    return out


def test_prompts_are_held_out_by_the_pairs_own_training_options(
        saved_pair: SavedPair, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The prompts come from files the pair's training held out, under the corpus options its ``report.json``
    records (``val_every``, ``max_chars``, ``roots``); the bench rebuilt the split with the defaults, so a pair
    trained with ``--val-every 100`` got 4 prompts of 8 from its training files (audit D2).  Without a
    report.json the defaults are used, and the command says so; an unreadable one is a one-line error."""
    import spec.bench_decode as bench_decode
    from spec.llm.train import collect_corpus, source_roots, split_corpus

    seen: list[list[list[int]]] = []
    real = bench_decode.run_decode_bench

    def spy(target: Any, draft: Any, prompts: list[list[int]], *args: Any, **kwargs: Any) -> Any:
        seen.append([list(p) for p in prompts])
        return real(target, draft, prompts, *args, **kwargs)

    monkeypatch.setattr(bench_decode, "run_decode_bench", spy)
    pair = tmp_path / "pair"
    shutil.copytree(saved_pair.path, pair)
    roots, max_chars, val_every = list(source_roots(False)), 300_000, 7  # a small corpus: a fast split
    (pair / "report.json").write_text(json.dumps({"config": {"val_every": val_every, "max_chars": max_chars,
                                                             "roots": roots}}))
    argv = ["--pair", str(pair), "--prompts", "2", "--prompt-tokens", "8", "--new-tokens", "1", "--methods", "ar",
            "--temperatures", "0", "--device", "cpu", "--threads", "1", "--json"]
    assert main(argv) == 0
    out = capsys.readouterr()
    train, val = split_corpus(collect_corpus(roots, max_chars), val_every)
    held = _windows(saved_pair.tokenizer, val, 8)
    assert len(seen[-1]) == 2 and all(tuple(p) in held for p in seen[-1]), "a prompt outside the held-out files"
    assert not {tuple(p) for p in seen[-1]} & _windows(saved_pair.tokenizer, train, 8)
    assert f"held out as the pair's training held them out ({pair / 'report.json'}: val_every=7" in out.err
    assert json.loads(out.out)["heldout"]["val_every"] == val_every

    assert main([*argv[:1], str(saved_pair.path), *argv[2:]]) == 0  # no report.json: the defaults, said so
    assert f"no spec.llm.train report.json in {saved_pair.path}" in capsys.readouterr().err

    (pair / "report.json").write_text("{")
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "report.json: cannot read spec.llm.train's report" in err[0], err


@pytest.mark.parametrize(("config", "message"), [
    ({"val_every": None}, "config.val_every must be an integer >= 2, got None"),
    ({"val_every": "7"}, "config.val_every must be an integer >= 2, got '7'"),
    ({"val_every": 1}, "config.val_every must be an integer >= 2, got 1"),
    ({"val_every": 9, "max_chars": "1e6"}, "config.max_chars must be null or an integer >= 1, got '1e6'"),
    ({"val_every": 9, "max_chars": 0}, "config.max_chars must be null or an integer >= 1, got 0"),
    ({"val_every": 9, "roots": "/usr/lib"}, "config.roots must be a list of folder names"),
])
def test_heldout_options_refuse_a_report_with_fields_of_the_wrong_type(
        tmp_path: Path, config: dict[str, Any], message: str) -> None:
    """A ``null`` or text ``val_every`` / ``max_chars`` in ``report.json`` had reached the corpus split and ended
    the benchmark in a ``TypeError`` traceback: now a one-line ``ValueError`` naming the file."""
    from spec.bench_decode import heldout_options

    (tmp_path / "report.json").write_text(json.dumps({"config": config}))
    with pytest.raises(ValueError, match=f"report.json: {message}"):
        heldout_options(tmp_path)


def test_a_failed_save_keeps_the_table_and_exits_1(saved_pair: SavedPair, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """A write that failed after the run (here ``decode.json`` is a folder) lost the table, and ``python -m
    spec.bench_decode`` ended in a traceback: now the table is printed, stderr says what was not written, exit 1."""
    out = tmp_path / "out"
    (out / "decode.json").mkdir(parents=True)
    argv = ["--pair", str(saved_pair.path), "--prompts", "1", "--prompt-tokens", "8", "--new-tokens", "1",
            "--methods", "ar", "--temperatures", "0", "--device", "cpu", "--threads", "1", "--save", str(out)]
    assert main(argv) == 1
    got = capsys.readouterr()
    assert "tok/step" in got.out and "\nar " in got.out, got.out
    assert "the table follows, the report is not saved" in got.err and "decode.json" in got.err
    assert tmc_main(["bench", "decode", *argv]) == 1
    assert "the report is not saved" in capsys.readouterr().err


def test_heldout_options_use_this_machines_roots_for_roots_it_lacks(tmp_path: Path) -> None:
    """A pair trained on another machine records roots this one may not have: the split is rebuilt from this
    machine's standard library (with the recorded val_every and max_chars), and the note says so."""
    from spec.bench_decode import heldout_options
    from spec.llm.train import source_roots

    (tmp_path / "report.json").write_text(json.dumps({"config": {"val_every": 9, "max_chars": 1000,
                                                                 "roots": ["/nonexistent/python3.0"]}}))
    options, note = heldout_options(tmp_path)
    assert options == {"val_every": 9, "max_chars": 1000, "roots": list(source_roots(False))}
    assert "not on this machine" in note


def test_save_without_matplotlib_names_only_the_json(saved_pair: SavedPair, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """``--save`` without matplotlib writes decode.json only, and says so: it printed "decode.png not written"
    and then "wrote .../decode.json and .../decode.png" (audit D6)."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    out = tmp_path / "out"
    assert main(["--pair", str(saved_pair.path), "--prompts", "1", "--prompt-tokens", "8", "--new-tokens", "1",
                 "--methods", "ar", "--temperatures", "0", "--device", "cpu", "--threads", "1",
                 "--save", str(out)]) == 0
    err = capsys.readouterr().err.splitlines()
    assert sorted(p.name for p in out.iterdir()) == ["decode.json"]
    assert "tmc bench decode: matplotlib is not installed; decode.png not written" in err
    assert [line for line in err if line.startswith("wrote ")] == [f"wrote {out / 'decode.json'}"]


@pytest.mark.filterwarnings("ignore:.*original_max_position_embeddings.*")
def test_eq_ar_compares_with_ar_loop_where_hf_generate_leaves_a_longrope_targets_greedy_decoding(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """transformers 5.17-5.19 (the GPU machine's 5.17 among them): a ``longrope`` target's own ``generate`` drops
    its cache at the switch but feeds only the newest token, so from position ``s + 1`` its tokens leave greedy
    decoding; the ``=ar`` column then read 0.00 for every row of ours (a tiny Phi-3 pair on 5.17, checked).  There
    the column compares with ``ar-loop`` (full forwards' law) and the table says why; elsewhere with ``ar``.  On
    this transformers the real case runs; from 5.20 on, a version set back to 5.19 checks the switch-over."""
    import spec.bench_decode as bench
    from tests.spec.llm.conftest import greedy_decode, transformers_version
    from tests.spec.llm.test_windows import _rope_model

    target, draft = _rope_model("longrope", 0, init=0.5), _rope_model("longrope", 1, init=0.5)
    prompts = [[5] * 15, [7] * 16]  # switch 16: both meet the dropped cache at position 17 (12 new tokens)
    methods = _methods(("ar", "ar-loop", "chain:sps@3", "dyspec:traversal@4"))

    def run(new_tokens: int) -> dict[str, Any]:
        return run_decode_bench(target, draft, prompts, methods, temperatures=(0.0,), new_tokens=new_tokens,
                                warmup=False)

    real = run(12)
    if transformers_version() < (5, 20):
        assert real["reference"] == "ar-loop" and "fixed in 5.20" in real["reference_why"]
        agree = {r["method"]: r["agree_ar"] for r in real["rows"]}
        assert agree == {"ar": 0.0, "ar-loop": 1.0, "chain+sps@3": 1.0, "dyspec+traversal@4": 1.0}
        assert "=ar compares with ar-loop's tokens" in render(real)
        return
    assert (real["reference"], real["reference_why"]) == ("ar", None)
    assert all(r["agree_ar"] == 1.0 for r in real["rows"])
    assert "=ar compares" not in render(real)
    monkeypatch.setattr(bench, "_transformers_version", lambda: "5.19.0")
    old = run(12)
    assert old["reference"] == "ar-loop" and old["reference_why"].startswith("transformers 5.19.0's generate")
    assert all(r["agree_ar"] == 1.0 for r in old["rows"])  # this generate is right: the plumbing only
    assert "=ar compares with ar-loop's tokens" in render(old)
    without = run_decode_bench(target, draft, prompts, _methods(("ar", "chain:sps@3")), temperatures=(0.0,),
                               new_tokens=12, warmup=False)
    assert without["reference"] is None and all("agree_ar" not in r for r in without["rows"])
    assert "=ar left out (add ar-loop for a reference)" in render(without)
    # the forward that decodes position s + 1 = 17 is the first one affected: a prompt of 15 meets it with 3 tokens
    assert bench._hf_generate_off_greedy(target, [[5] * 15], 2) is None
    assert bench._hf_generate_off_greedy(target, [[5] * 15], 3) is not None
    assert bench._hf_generate_off_greedy(target, [[5] * 17], 30) is None  # a prefill past the switch: no cache
    assert [greedy_decode(target, p, 12) for p in prompts] == [r["tokens"][0] for r in old["rows"] if r["method"] == "ar-loop"][0]
