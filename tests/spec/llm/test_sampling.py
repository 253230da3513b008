"""spec.llm.sampling: temperature, top-k, top-p on hand cases and against a numpy reference."""

from __future__ import annotations

import itertools
import math
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from spec.llm.sampling import Sampling, point_rows, process_logits  # noqa: E402

pytestmark = pytest.mark.llm


def _probs(logits, temperature=1.0, top_k=None, top_p=None):
    return process_logits(torch.tensor(logits, dtype=torch.float64), temperature, top_k, top_p).numpy()


def reference(logits, temperature, top_k, top_p):
    """Independent loop version of the definition in the module docstring."""
    x = np.asarray(logits, dtype=np.float64)
    out = np.zeros_like(x)
    if temperature == 0:
        out[int(np.argmax(x))] = 1.0  # np.argmax: first maximum
        return out
    ranked = sorted(range(len(x)), key=lambda i: (-x[i], i))  # the logits' order, before the division by T
    x = x / temperature
    kept = ranked[: top_k or len(x)]
    if top_p is not None:
        w = np.exp(x[kept] - x[kept].max())
        w /= w.sum()
        mass, nucleus = 0.0, []
        for tok, wi in zip(kept, w):
            if mass >= top_p:
                break
            nucleus.append(tok)
            mass += wi
        kept = nucleus
    e = np.exp(x[kept] - x[kept].max())
    out[kept] = e / e.sum()
    return out


LN2, LN4 = math.log(2.0), math.log(4.0)

# (logits, temperature, top_k, top_p, expected probabilities), each worked out by hand
HAND = [
    ([0.0, LN2, LN4], 1.0, None, None, [1 / 7, 2 / 7, 4 / 7]),
    ([0.0, LN2, LN4], 2.0, None, None, np.array([1, math.sqrt(2), 2]) / (3 + math.sqrt(2))),
    ([0.0, LN2, LN4], 1.0, 2, None, [0, 1 / 3, 2 / 3]),
    ([0.0, LN2, LN4], 1.0, 1, None, [0, 0, 1]),
    ([0.0, LN2, LN4], 1.0, 5, None, [1 / 7, 2 / 7, 4 / 7]),  # k >= V: no-op
    ([0.0, LN2, LN4], 1.0, None, 0.5, [0, 0, 1]),  # 4/7 >= 0.5
    ([0.0, LN2, LN4], 1.0, None, 0.6, [0, 1 / 3, 2 / 3]),  # 4/7 < 0.6 <= 6/7
    ([0.0, LN2, LN4], 1.0, None, 1.0, [1 / 7, 2 / 7, 4 / 7]),
    ([0.0, LN2, LN4], 1.0, None, 1e-9, [0, 0, 1]),  # the top token always stays
    # order matters: top-k first makes {3, 2} hold 7/9 >= 0.75; top-p first would keep {3, 2, 1}
    (np.log([0.1, 0.2, 0.3, 0.4]), 1.0, 3, 0.75, [0, 0, 3 / 7, 4 / 7]),
    ([1.0, 3.0, 3.0], 0.0, None, None, [0, 1, 0]),  # greedy: ties to the lowest id
    ([5.0, 3.0, 9.0], 0.0, 1, 0.1, [0, 0, 1]),
    ([1.0, 2.0, 2.0, 2.0], 1.0, 2, None, [0, 0.5, 0.5, 0]),  # top-k ties to the lowest ids
    ([0.0, 0.0, 0.0], 1.0, None, 0.5, [0.5, 0.5, 0]),  # top-p ties to the lowest ids
    # the mass before a token must be below top_p: before the third of four ties it is exactly 0.5, so it goes
    ([0.0, 0.0, 0.0, 0.0], 1.0, None, 0.5, [0.5, 0.5, 0, 0]),
    # 64 ties cut to 3 by top-k: the lowest ids (a sort that is not stable on such rows kept [33, 34, 48])
    (np.zeros(64), 1.0, 3, None, [1 / 3] * 3 + [0] * 61),
    ([-math.inf, 0.0, 0.0], 1.0, None, None, [0, 0.5, 0.5]),  # banned token
    # ranked on the logits as given: 1e-17 - 1 and 2e-17 - 1 both round to -1 (so to -2 at T = 0.5), yet
    # 2e-17 is the larger logit and stays; top-p 0.8 needs a second token, since 1 / (1 + 2 e^-2) = 0.787
    ([1.0, 1e-17, 2e-17], 0.5, 2, None, [1 / (1 + math.exp(-2)), 0, math.exp(-2) / (1 + math.exp(-2))]),
    ([1.0, 1e-17, 2e-17], 0.5, None, 0.8, [1 / (1 + math.exp(-2)), 0, math.exp(-2) / (1 + math.exp(-2))]),
]


@pytest.mark.parametrize("logits, temperature, top_k, top_p, expected", HAND)
def test_process_logits_equals_hand_computed_rows(logits, temperature, top_k, top_p, expected):
    got = _probs(logits, temperature, top_k, top_p)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)
    np.testing.assert_allclose(got, reference(logits, temperature, top_k, top_p), rtol=0, atol=1e-12)


SETTINGS = [(1.0, None, None), (0.7, None, None), (1.3, 5, None), (1.0, None, 0.9), (0.8, 8, 0.7), (2.0, 1, 0.5),
            (0.0, None, None), (0.5, 40, 0.99), (1.0, None, 0.3)]


@pytest.mark.parametrize("temperature, top_k, top_p", SETTINGS)
def test_process_logits_equals_numpy_reference_on_random_rows(temperature, top_k, top_p):
    rng = np.random.default_rng(12345)
    logits = rng.normal(scale=3.0, size=(6, 40))
    logits[1, :5] = logits[1, 5]  # exact ties
    got = process_logits(torch.tensor(logits), temperature, top_k, top_p).numpy()
    expected = np.stack([reference(row, temperature, top_k, top_p) for row in logits])
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got.sum(axis=-1), 1.0, rtol=0, atol=1e-12)


@pytest.mark.parametrize("temperature", [1e-300, 1e-307, 5e-324])
def test_a_tiny_temperature_gives_the_greedy_row_not_nan(temperature):
    """Logits / T overflowed float64 below T ~ 1e-307 (then softmax gave NaN rows, which the chain sampler
    turned into token 0); the rows are shifted by their maximum first, so a tiny T is greedy decoding."""
    logits = torch.tensor([[20.0, 19.5, -3.0], [-1.0, 4.0, 3.9]], dtype=torch.float64)
    for top_k, top_p in ((None, None), (2, None), (None, 0.9)):
        got = process_logits(logits, temperature, top_k, top_p)
        assert torch.equal(got, process_logits(logits, 0.0)), (top_k, top_p)


def test_process_logits_greedy_is_one_hot_at_the_argmax():
    logits = torch.randn(5, 30, generator=torch.Generator().manual_seed(0))
    got = process_logits(logits, 0.0, 3, 0.5)
    assert torch.equal(got, torch.nn.functional.one_hot(logits.argmax(-1), 30).to(torch.float64))


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")  # torch's own code
def test_point_rows_are_float64_one_hot_rows_eagerly_and_under_inductor():
    """Eager and compiled (inductor on the CPU: the comparison form) rows equal numpy's one-hot rows, in float64;
    torch 2.11's inductor turned the eager form's scatter into float32 rows."""
    top = torch.tensor([[3], [0], [6]])
    want = np.eye(7)[[3, 0, 6]]
    eager = point_rows(top, 7)
    compiled = torch.compile(point_rows, fullgraph=True, dynamic=False)(top, 7)
    torch._dynamo.reset()
    for got in (eager, compiled):
        assert got.dtype == torch.float64 and np.array_equal(got.numpy(), want)


@pytest.mark.parametrize(("top", "vocab", "match"), [
    (torch.tensor(3), 7, "top must be an int64 tensor of shape"),
    (torch.tensor([3, 1]), 7, r"top must be an int64 tensor of shape \(\.\.\., 1\), got torch.int64 \(2,\)"),
    (torch.tensor([[3.0]]), 7, "got torch.float32"),
    (torch.tensor([[3]]), 0, "vocab must be an int >= 1, got 0"),
    (torch.tensor([[3]]), 7.0, "vocab must be an int >= 1, got 7.0"),
])
def test_point_rows_refuse_bad_arguments(top, vocab, match):
    with pytest.raises(ValueError, match=match):
        point_rows(top, vocab)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_greedy_rows_break_ties_to_the_lowest_id_in_every_dtype(dtype):
    """Greedy rows are taken on the logits in their own dtype: with many exact ties (small integer
    logits) the one-hot sits at numpy's first maximum of the widened row."""
    gen = torch.Generator().manual_seed(3)
    logits = torch.randint(-3, 3, (400, 7), generator=gen).to(dtype)
    want = np.zeros((400, 7))
    want[np.arange(400), np.argmax(logits.to(torch.float64).numpy(), axis=-1)] = 1.0
    assert np.array_equal(process_logits(logits, 0.0).numpy(), want)
    p, fault = Sampling(0.0).probs_with_fault(logits)
    assert np.array_equal(p.numpy(), want) and p.dtype == torch.float64 and not bool(fault)


@pytest.mark.parametrize("bad", [math.nan, math.inf, "row"])
@pytest.mark.parametrize("temperature", [0.0, 1.0, 0.7])
def test_probs_with_fault_flags_what_logits_fault_flags(bad, temperature):
    """The flag given with the rows (temperature 0) is :func:`logits_fault` of the logits: NaN,
    ``+inf`` and an all ``-inf`` row raise it, a ``-inf`` entry does not; above 0 no flag comes."""
    from spec.llm.sampling import logits_fault

    logits = torch.randn(4, 11, generator=torch.Generator().manual_seed(4))
    logits[0, 5] = -math.inf  # a banned token: allowed
    cfg = Sampling(temperature)
    for x, faulty in ((logits, False), (logits.clone(), True)):
        if faulty:
            if bad == "row":
                x[2] = -math.inf
            else:
                x[3, 1] = bad
        assert bool(logits_fault(x)) == faulty
        p, fault = cfg.probs_with_fault(x)
        if faulty:
            assert fault is None if temperature else bool(fault)
            continue
        assert torch.equal(p, cfg.probs_unchecked(x)) and torch.equal(p, cfg.probs(x))
        assert fault is None if temperature else not bool(fault)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_logits_fault_of_several_tensors_flags_any_of_them(dtype):
    """One flag for several logits tensors (a fused step's draft rows and target rows): raised by a NaN, a
    ``+inf`` or an all ``-inf`` row in any of them, not by ``-inf`` entries or the largest finite logits (whose
    differences must not overflow into a false flag); the same as the flags of each, or-ed."""
    from spec.llm.sampling import logits_fault, nonfinite

    big = torch.finfo(dtype).max
    base = [torch.randn(3, 7, generator=torch.Generator().manual_seed(s)).to(dtype) for s in range(3)]
    base[0][1, 2] = -math.inf
    base[1][0] = big
    base[2][2, 0] = -big
    assert not bool(logits_fault(*base)) and not bool(nonfinite(torch.tensor([big, -big], dtype=dtype)))
    for which, (row, col), value in itertools.product(range(3), [(0, 0), (2, 6)], [math.nan, math.inf, "row"]):
        xs = [x.clone() for x in base]
        if value == "row":
            xs[which][row] = -math.inf
        else:
            xs[which][row, col] = value
        assert bool(logits_fault(*xs)), (which, row, col, value)
        assert [bool(logits_fault(x)) for x in xs] == [i == which for i in range(3)]
    with pytest.raises(ValueError, match="at least one logits tensor"):
        logits_fault()


def test_process_logits_works_on_batched_shapes_and_low_precision_inputs():
    logits = torch.randn(2, 3, 17, generator=torch.Generator().manual_seed(1))
    got = process_logits(logits.to(torch.bfloat16), 0.9, 6, 0.8)
    assert got.shape == (2, 3, 17) and got.dtype == torch.float64
    flat = process_logits(logits.to(torch.bfloat16).reshape(6, 17), 0.9, 6, 0.8)
    assert torch.equal(got.reshape(6, 17), flat)


def test_sampling_dataclass_applies_its_settings():
    logits = torch.randn(4, 9, generator=torch.Generator().manual_seed(2))
    cfg = Sampling(temperature=0.5, top_k=4, top_p=0.9)
    assert torch.equal(cfg.probs(logits), process_logits(logits, 0.5, 4, 0.9))
    assert Sampling(0.0).greedy and not Sampling().greedy


@pytest.mark.parametrize("number", [Fraction, np.float32, np.float64, Decimal])
def test_sampling_keeps_its_settings_as_checked_python_numbers(number):
    """A Fraction (any Real) passes the checks; the decode loop's unchecked paths then divided a tensor by it
    (``TypeError`` mid-decode) while ``probs`` worked.  The dataclass now keeps the checked float / int."""
    if number is Decimal:  # not a numbers.Real: refused, not stored
        with pytest.raises(ValueError, match="temperature"):
            Sampling(Decimal("0.5"))
        return
    cfg = Sampling(number(1) / number(2), np.int64(4), number(9) / number(10) if number is Fraction else number(0.9))
    assert (type(cfg.temperature), type(cfg.top_k), type(cfg.top_p)) == (float, int, float)
    logits = torch.randn(3, 9, generator=torch.Generator().manual_seed(4))
    assert torch.equal(cfg.probs_unchecked(logits), cfg.probs(logits))
    assert torch.equal(cfg.probs_with_fault(logits)[0], process_logits(logits, 0.5, 4, 0.9))


BAD_SETTINGS = [
    (-0.1, None, None, "temperature"),
    (math.nan, None, None, "temperature"),
    (math.inf, None, None, "temperature"),
    pytest.param(10**400, None, None, "temperature", id="temperature-10**400"),  # OverflowError from float()
    ("1", None, None, "temperature"),
    (1.0, 0, None, "top_k"),
    (1.0, 1.5, None, "top_k"),
    (1.0, True, None, "top_k"),
    (1.0, 0.0, None, "top_k"),
    (1.0, math.inf, None, "top_k"),
    (1.0, "3", None, "top_k"),
    (1.0, None, 0.0, "top_p"),
    (1.0, None, 1.1, "top_p"),
    (1.0, None, math.nan, "top_p"),
]


@pytest.mark.parametrize("top_k", [3.0, np.float64(3.0), np.int64(3), Fraction(6, 2)])
def test_top_k_takes_integral_numbers_as_the_other_counts_do(top_k):
    """``top_k`` follows :func:`tmc.validate.check_int` like ``max_new_tokens`` and the budgets: ``3.0`` is 3
    (it was refused while ``max_new_tokens=3.0`` passed); the rows equal those of ``top_k=3``."""
    logits = torch.randn(2, 7, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    cfg = Sampling(1.0, top_k)
    assert type(cfg.top_k) is int and cfg.top_k == 3
    assert torch.equal(process_logits(logits, 1.0, top_k), process_logits(logits, 1.0, 3))


@pytest.mark.parametrize("temperature, top_k, top_p, name", BAD_SETTINGS)
def test_process_logits_rejects_bad_settings(temperature, top_k, top_p, name):
    with pytest.raises(ValueError, match=name):
        process_logits(torch.zeros(3), temperature, top_k, top_p)
    with pytest.raises(ValueError, match=name):
        Sampling(temperature, top_k, top_p)


@pytest.mark.parametrize(
    "logits, match",
    [
        (torch.tensor([0.0, math.nan]), "NaN"),
        (torch.tensor([0.0, math.inf]), r"\+inf"),
        (torch.tensor([[0.0, 1.0], [-math.inf, -math.inf]]), "every token is -inf"),
        (torch.tensor([1, 2]), "floating-point"),
        (np.zeros(3), "floating-point"),
        (torch.zeros(2, 0), "vocabulary size 0"),
        (torch.zeros(2, 3).to(torch.float8_e4m3fn), "float8_e4m3fn are not supported"),  # NotImplementedError
    ],
)
def test_process_logits_rejects_bad_logits(logits, match):
    with pytest.raises(ValueError, match=match):
        process_logits(logits)


def test_ranked_tokens_equal_top_tokens_with_ties_and_zeros() -> None:
    """:func:`spec.llm.sampling.ranked_tokens` (the device path of top-k trees) orders each row as
    :func:`spec.builders.base.top_tokens` does, the full definition: largest first, equal values by the
    lowest id.  Rows drawn from five values make ties common, zeros included; the values returned are
    the rows' own, so an entry ``<= 0`` marks a row with fewer than ``k`` positive entries."""
    from spec.builders.base import top_tokens
    from spec.llm.sampling import ranked_tokens

    rng = np.random.default_rng(11)
    cases = ties = short = 0
    for _ in range(400):
        vocab, m = int(rng.integers(1, 12)), int(rng.integers(1, 4))
        k = int(rng.integers(1, vocab + 1))
        rows = rng.choice([0.0, 0.05, 0.1, 0.2, 0.3], size=(m, vocab))
        idx, val = ranked_tokens(torch.from_numpy(rows), k)
        assert idx.shape == val.shape == (m, k) and idx.dtype == torch.int64
        for row, i, v in zip(rows, idx.tolist(), val.tolist()):
            assert v == [row[j] for j in i]
            want = top_tokens(row, k)
            assert [j for j, x in zip(i, v) if x > 0] == want, (row, k, i)
            assert len(set(i)) == k
            cases += 1
            ties += len(set(v)) < k
            short += len(want) < k
    assert cases > 700 and ties > 100 and short > 100
    big = torch.softmax(torch.from_numpy(rng.normal(size=(3, 4096))), dim=-1)
    big[1, 17] = big[1, 9] = big[1].max()  # a tie at the top of a 4096 row
    idx, _ = ranked_tokens(big, 3)
    assert idx[1, :2].tolist() == [9, 17]
    assert idx.tolist() == [top_tokens(r, 3) for r in big.numpy()]


def test_categorical_draw_equals_the_host_rule_row_by_row() -> None:
    """:func:`spec.llm.sampling.categorical_draw` on one row and on a batch of rows gives
    :func:`tmc.noise.categorical`'s index for each (zero weights, u = 0 and u just below 1 included)."""
    from spec.llm.sampling import categorical_draw
    from tmc.noise import categorical

    rng = np.random.default_rng(5)
    edges = [0.0, float(np.nextafter(1.0, 0.0)), 0.5]
    for vocab in (1, 2, 3, 17, 4096):
        rows = rng.dirichlet(np.ones(vocab) * 0.3, size=6)
        rows[rows < 0.02] = 0.0  # exact zeros, at the ends too
        rows[np.arange(6), rng.integers(vocab, size=6)] += 0.1  # every row keeps a positive weight
        u = np.concatenate([edges, rng.random(3)])
        want = [categorical(r, float(x)) for r, x in zip(rows, u)]
        got = categorical_draw(torch.from_numpy(rows), torch.from_numpy(u))
        assert got.shape == (6,) and got.tolist() == want
        for r, x, w in zip(rows, u, want):
            one = categorical_draw(torch.from_numpy(r), torch.tensor(x, dtype=torch.float64))
            assert one.shape == () and int(one) == w
            assert r[w] > 0.0
    # denormal weights: u * total rounds up to total, and the host rule falls back to the last positive weight
    tiny = np.array([0.0, 3 * 5e-324, 0.0, 2 * 5e-324, 0.0])
    u_top = float(np.nextafter(1.0, 0.0))
    assert u_top * float(np.cumsum(tiny)[-1]) == float(np.cumsum(tiny)[-1])  # the case is the fallback's
    assert int(categorical_draw(torch.from_numpy(tiny), torch.tensor(u_top, dtype=torch.float64))) \
        == categorical(tiny, u_top) == 3


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")  # torch's own code
def test_the_compiled_draw_equals_the_host_rule() -> None:
    """Under ``torch.compile`` (inductor on the CPU) :func:`categorical_draw` takes its counting form and gives
    :func:`tmc.noise.categorical`'s index on every row: zero weights at the ends, u = 0, u just below 1, the
    denormal rows where ``u * total`` rounds up to ``total``, and one flattened ``(5 * 4096,)`` row (the ASpS
    head's draw, which torch 2.11's inductor could not generate in the eager form)."""
    from spec.llm.sampling import _draw_compiled, categorical_draw
    from tmc.noise import categorical

    draw = torch.compile(categorical_draw, fullgraph=True, dynamic=False)
    rng = np.random.default_rng(6)
    u_top = float(np.nextafter(1.0, 0.0))
    cases = []
    for vocab in (1, 3, 4096):
        rows = rng.dirichlet(np.ones(vocab) * 0.3, size=8)
        rows[rows < 0.02] = 0.0
        rows[:, 0] = 0.0 if vocab > 1 else rows[:, 0]  # zeros at both ends
        rows[:, -1] = 0.0 if vocab > 2 else rows[:, -1]
        rows[np.arange(8), rng.integers(vocab, size=8)] += 0.1
        cases.append((rows, np.concatenate([[0.0, u_top, 0.5], rng.random(5)])))
    cases.append((np.array([[0.0, 3 * 5e-324, 0.0, 2 * 5e-324, 0.0]] * 2), np.array([u_top, 0.0])))
    flat = rng.dirichlet(np.ones(5 * 4096) * 0.1)
    flat[flat < 1e-5] = 0.0
    cases += [(flat[None], np.array([x])) for x in (0.0, u_top, 0.37)]
    with torch._dynamo.config.patch(recompile_limit=64):
        for rows, u in cases:
            want = [categorical(r, float(x)) for r, x in zip(rows, u)]
            got = draw(torch.from_numpy(rows), torch.from_numpy(u))
            assert got.tolist() == want
            assert _draw_compiled(torch.from_numpy(rows), torch.from_numpy(u)).tolist() == want  # the form itself
            assert all(r[w] > 0.0 for r, w in zip(rows, want))
    torch._dynamo.reset()


def test_swor_draws_equal_the_host_builders_rule() -> None:
    """:func:`spec.llm.sampling.swor_draws` (a layer of ``swor`` siblings on the device) gives, node by node,
    the token :class:`spec.builders.FixedBuilder` draws: :func:`tmc.noise.categorical` on the parent's row with
    the earlier siblings' tokens set to 0 (:func:`spec.builders.base.without`), one uniform a node; and it
    flags exactly the layers where some sibling's law had no mass left (the host builder stops there).
    Rows with exact zeros and few positive entries make both cases common; u = 0 and u just below 1 are
    among the uniforms."""
    from spec.builders.base import without
    from spec.llm.sampling import swor_draws
    from tmc.noise import categorical

    rng = np.random.default_rng(8)
    full = short = 0
    for _ in range(300):
        vocab, parents, width = int(rng.integers(1, 9)), int(rng.integers(1, 4)), int(rng.integers(1, 5))
        rows = rng.dirichlet(np.ones(vocab), size=parents)
        rows[rng.random(rows.shape) < 0.4] = 0.0
        rows[np.arange(parents), rng.integers(vocab, size=parents)] += 0.2  # each row keeps some mass
        of_node = [p for p in range(parents) for _ in range(width)]  # node i: parent of_node[i], rank i % width
        u = rng.random(len(of_node))
        u[rng.random(len(u)) < 0.15] = 0.0
        u[rng.random(len(u)) < 0.15] = float(np.nextafter(1.0, 0.0))
        ranks = [(torch.tensor(of_node[j::width]), torch.arange(j, len(of_node), width)) for j in range(width)]
        tok, cut = swor_draws(torch.from_numpy(rows), ranks, torch.from_numpy(u))
        empty = False
        for p in range(parents):
            drawn: list[int] = []
            for j in range(width):
                law = without(rows[p], drawn)
                if not law.any():
                    empty = True
                    break
                drawn.append(categorical(law, float(u[p * width + j])))
            if len(drawn) == width:  # a full sibling group: every token the host's
                assert tok[p * width : (p + 1) * width].tolist() == drawn
        assert bool(cut) == empty
        full += not empty
        short += empty
    assert full > 80 and short > 80, (full, short)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_step_fault_is_raised_by_a_bad_row_of_the_target_or_of_any_draft_tensor(temperature):
    """:func:`step_fault` (the fused heads' and the unfused steps' one rule) against a row-by-row check written
    here: a tensor is faulty when some row holds a NaN or ``+inf`` or has no finite entry; the step is faulty
    when the target's logits or one of the draft's are.  The target's part comes from
    ``probs_with_fault`` (free at temperature 0, ``None`` above), as the steps call it."""
    from spec.llm.sampling import step_fault

    def faulty(x: torch.Tensor) -> bool:
        return any(bool(torch.isnan(r).any()) or bool((r == math.inf).any()) or not bool(torch.isfinite(r).any())
                   for r in x)

    gen = torch.Generator().manual_seed(9)
    clean = [torch.randn(3, 6, generator=gen) for _ in range(3)]  # the target's, then two draft tensors
    clean[1][0, 4] = -math.inf  # a banned token is no fault
    cfg = Sampling(temperature)
    cases = [None] + [(i, bad) for i in range(3) for bad in (math.nan, math.inf, "row")]
    for case in cases:
        xs = [x.clone() for x in clean]
        if case is not None:
            i, bad = case
            if bad == "row":
                xs[i][2] = -math.inf
            else:
                xs[i][1, 3] = bad
        want = any(faulty(x) for x in xs)
        assert want == (case is not None)
        _, t_fault = cfg.probs_with_fault(xs[0])
        assert (t_fault is None) == (temperature != 0)
        assert bool(step_fault(xs[0], t_fault, xs[1], xs[2])) == want, case
        assert bool(step_fault(xs[0], t_fault)) == faulty(xs[0]), case  # the unfused steps: the target's part


def test_tie_rules_differ_from_transformers_warpers_as_documented() -> None:
    """The module docstring and the README say how the filters' ties differ from transformers' warpers
    (found by an audit of 2026-11-27: top-p's difference was not written down).  Both differences are
    pinned here, so a release that changes transformers' rules makes the text stale visibly."""
    from transformers import TopKLogitsWarper, TopPLogitsWarper

    def hf(logits: list[float], warper: object) -> list[float]:
        x = torch.tensor([logits], dtype=torch.float32)
        return torch.softmax(warper(torch.zeros((1, 1), dtype=torch.long), x), dim=-1)[0].tolist()  # type: ignore[operator]

    assert _probs([0.0, 0.0, 0.0], top_p=0.5).tolist() == [0.5, 0.5, 0.0]  # ties to the lowest ids
    assert hf([0.0, 0.0, 0.0], TopPLogitsWarper(0.5)) == [0.0, 0.5, 0.5]  # transformers: cut from the low ids
    assert _probs([1.0, 2.0, 2.0, 2.0], top_k=2).tolist() == [0.0, 0.5, 0.5, 0.0]  # exactly min(k, V) kept
    assert hf([1.0, 2.0, 2.0, 2.0], TopKLogitsWarper(2)) == pytest.approx([0.0, 1 / 3, 1 / 3, 1 / 3])  # every tie
