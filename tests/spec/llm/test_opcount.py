"""spec.llm.opcount: torch operations dispatched outside the models' forwards, and what the decode loop's
savings of them rest on (the trusted chain verifier, one staged upload per static-cache forward)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from spec.bench_decode import parse_method, render, run_decode_bench  # noqa: E402
from spec.llm.generate import generate  # noqa: E402
from spec.llm.models import tiny_pair  # noqa: E402
from spec.llm.opcount import count_ops  # noqa: E402
from spec.llm.verify import verify_chain_on_device  # noqa: E402

pytestmark = pytest.mark.llm


class Doubler(torch.nn.Module):
    """One aten operation per forward (``mul``), optionally calling an inner module first."""

    def __init__(self, inner: torch.nn.Module | None = None) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.inner is not None:
            x = self.inner(x)
        return x * 2


def test_operations_inside_a_forward_are_counted_apart() -> None:
    inner = Doubler()
    outer = Doubler(inner)
    x = torch.ones(3)

    def work() -> torch.Tensor:
        y = x + 1  # outside: add
        z = outer(y)  # inside: two muls (the outer forward calls the inner one)
        return torch.neg(z)  # outside: neg

    out, count = count_ops(work, [outer, inner])  # nested forwards: inside until the outermost returns
    assert out.tolist() == [-8.0, -8.0, -8.0]  # -((1 + 1) * 2 * 2)
    assert (count.outside, count.inside) == (2, 2)
    assert count.by_name == {"aten.add.Tensor": 1, "aten.neg.default": 1}
    _, unlisted = count_ops(work, [inner])  # the outer module not listed: its own mul is outside
    assert (unlisted.outside, unlisted.inside) == (3, 1)
    _, none = count_ops(work)
    assert (none.outside, none.inside) == (4, 0)
    assert count.per(2) == 1.0
    assert count.views == 0 and count.kernels == 2 and count.per(2, kernels=True) == 1.0


def test_views_are_counted_apart_from_kernels() -> None:
    """Operations that only make a view (``is_view``, and ``_unsafe_view``) launch nothing: ``kernels`` leaves
    them out, ``outside`` keeps them."""
    x = torch.arange(12.0).reshape(3, 4)

    def work() -> torch.Tensor:
        a = x[1:]  # slice: a view
        b = a.t().unsqueeze(0)  # transpose and unsqueeze: views
        c = torch.ops.aten._unsafe_view(b.contiguous(), (8,))  # a copy (clone: a kernel), then a view
        return (c * 2).sum()  # two kernels

    _, count = count_ops(work)
    names = count.by_name
    views = sum(n for name, n in names.items()
                if name.split(".")[1] in ("slice", "t", "transpose", "unsqueeze", "_unsafe_view"))
    assert count.views == views >= 4 and count.kernels == count.outside - views >= 3, names


def test_hooks_are_removed_even_when_the_callable_raises() -> None:
    model = Doubler()

    def boom() -> None:
        model(torch.ones(1))
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        count_ops(boom, [model])
    assert not model._forward_pre_hooks and not model._forward_hooks
    x = torch.ones(1)
    _, after = count_ops(lambda: model(x))  # no stale hook: the mul counts as outside
    assert (after.outside, after.inside) == (1, 0)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="models must be torch modules"):
        count_ops(lambda: None, [object()])  # type: ignore[list-item]
    _, count = count_ops(lambda: None)
    with pytest.raises(ValueError, match="steps must be >= 1"):
        count.per(0)


def test_the_trusted_chain_verifier_dispatches_fewer_operations_for_the_same_tokens() -> None:
    """``trusted=True`` must skip the value checks (a mutant that ignores it fails here)."""
    rng = np.random.default_rng(0)
    vocab, n = 50, 4
    q = torch.from_numpy(rng.dirichlet(np.ones(vocab), size=n))
    p = torch.from_numpy(rng.dirichlet(np.ones(vocab), size=n + 1))
    tok = torch.tensor([int(rng.choice(vocab, p=row.numpy())) for row in q])
    u = torch.from_numpy(rng.random(n + 1))
    clear = torch.zeros((), dtype=torch.bool)
    for method in ("sps", "asps", "block"):
        (checked, _), c = count_ops(lambda: verify_chain_on_device(method, tok, q, p, u, clear))
        (trusted, _), t = count_ops(lambda: verify_chain_on_device(method, tok, q, p, u, clear, trusted=True))
        assert checked is not None and trusted is not None
        assert trusted.tokens.tolist() == checked.tokens.tolist()
        assert t.outside <= c.outside - 40, (method, t.outside, c.outside)  # 45 fewer; each half of the checks is 20-25


@pytest.mark.parametrize("pad", [True, False])
def test_static_cache_forwards_upload_their_inputs_once(pad: bool) -> None:
    """A static-cache forward copies its host inputs in one upload, into buffers kept from an earlier forward
    of the same size: padded (the CUDA layout, run eagerly here) or not."""
    from spec.llm.static_cache import StaticTreeCache

    target, _ = tiny_pair(29, seed=0)
    cache = StaticTreeCache(target, 64, pad=pad)
    cache.forward([1, 2, 3], [0, 1, 2], np.tril(np.ones((3, 3), dtype=bool)))  # first use of its size: allocates
    allowed = np.ones((3, 6), dtype=bool)
    allowed[0, 4:] = allowed[1, 5] = False  # a chain of three after the first three
    _, count = count_ops(lambda: cache.forward([4, 5, 6], [3, 4, 5], allowed), [target])  # the same size again
    assert count.by_name["aten.copy_.default"] == 1  # the staged buffer; no other copy, no allocation
    assert count.by_name["aten.zeros.default"] == 0


def test_generate_and_the_bench_report_operations_per_step() -> None:
    target, draft = tiny_pair(29, seed=0)
    out, count = count_ops(lambda: generate(target, draft, [1, 2, 3], "chain", "sps", budget=3, temperature=1.0,
                                            max_new_tokens=8, seed=0), [target, draft])
    assert count.inside > 0 and count.per(len(out.steps)) > 10
    methods = [parse_method(m, budget=4, chain_budget=3) for m in ("ar", "ar-loop", "chain:sps")]
    report = run_decode_bench(target, draft, [[1, 2, 3, 4]], methods, (1.0,), new_tokens=6, warmup=False,
                              count_ops=True)
    rows = {r["method"]: r for r in report["rows"]}
    assert "ops_per_step" not in rows["ar"]  # HF baselines are not counted
    assert rows["ar-loop"]["ops_per_step"] > 0 and rows["chain+sps@3"]["ops_per_step"] > 0
    for name in ("ar-loop", "chain+sps@3"):  # some of them are views
        assert 0 < rows[name]["kernels_per_step"] < rows[name]["ops_per_step"]
    assert "ops/step" in render(report) and "kernels/step" in render(report)
    plain = run_decode_bench(target, draft, [[1, 2, 3, 4]], methods[:1], (1.0,), new_tokens=2, warmup=False)
    assert "ops/step" not in render(plain)


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")  # torch's own code
def test_the_bench_leaves_compiled_rows_uncounted(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.compile refuses to trace under the counting dispatch mode (the whole bench stopped on a GPU): a
    ``:compiled`` row gets no count, the ``:graph`` row beside it does (dynamo's ``eager`` backend here)."""
    from spec.llm import generate as gen

    monkeypatch.setattr(gen, "COMPILE_BACKEND", "eager")
    target, draft = tiny_pair(29, seed=0)
    methods = [parse_method(m, budget=4, chain_budget=3) for m in ("chain:sps:graph", "chain:sps:compiled")]
    report = run_decode_bench(target, draft, [[1, 2, 3, 4]], methods, (1.0,), new_tokens=6, warmup=False,
                              cache="static", count_ops=True)
    rows = {r["method"]: r for r in report["rows"]}
    assert rows["chain+sps@3/graph"]["ops_per_step"] > 0
    assert "ops_per_step" not in rows["chain+sps@3/compiled"]
    torch._dynamo.reset()
