"""Train a small Llama-architecture (target, draft) pair on local Python sources (DESIGN.md §8).

No weights can be downloaded here, so the project makes its own pair.  Run::

    python -m spec.llm.train --out DIR [--minutes 20] [--vocab 4096] [--seed 0]
                             [--device cpu|cuda] [--target-size small|base] [--site-packages]
                             [--max-chars N] [--target-from DIR --draft-size pico] ...

Pipeline (one function per stage; ``python -m spec.llm.train --help`` lists every option):

1. ``collect_corpus``: the ``*.py`` files of the standard library
   (``sysconfig.get_paths()["stdlib"]``, its ``site-packages`` left out) and, with
   ``--site-packages``, of ``purelib``; sorted paths, so the order is deterministic;
   files that are not UTF-8 are skipped; ``--max-chars`` caps the total (whole files, in
   order, skipping those that would pass the cap).  Every 50th file (``--val-every``) is held
   out for validation: the held-out files sample the whole tree, not the alphabetically last
   packages (a corpus of fewer files holds out its largest); a training file with the exact
   text of a held-out one, or half its runs of 8 lines (a vendored copy, perhaps a few lines apart),
   is dropped, so validation text is unseen.
2. ``train_tokenizer``: byte-level BPE (``tokenizers``) on the training files, ``--vocab``
   entries at most (fewer on a tiny corpus), special tokens ``<|bos|>`` (id 0) and ``<|eos|>``
   (id 1; also the pad token); encoding prepends ``<|bos|>``.  Wrapped as a
   ``PreTrainedTokenizerFast``.
3. ``encode_corpus``: each file becomes ``<|bos|> ids <|eos|>``; the files are concatenated
   into one training stream and one validation stream.
4. ``train_model``: the target, then the draft, by wall-clock budget so the whole run fits
   ``--minutes``: the time left after the corpus stages and a reserve for the evaluation
   goes ``--target-share`` to the target, the rest (whatever the target left) to the draft.
   Random windows of ``--seq-len`` + 1 tokens, AdamW (betas 0.9/0.95, weight decay 0.1 on
   matrices, gradient clipping at 1), learning rate warmed up linearly over the first 3 % of
   the budget then cosine-decayed to 10 % at its end; the schedule follows elapsed time, so it
   completes whatever the machine's speed or load.  bf16 autocast on CUDA.  Progress goes to
   stderr every ``--log-every`` seconds.
5. ``evaluate_pair``: on validation windows spread over the held-out stream (``--eval-tokens``
   positions at most), each model's loss (nats/token), the draft's greedy agreement with the
   target (``argmax q == argmax p``) and the SpS acceptance rate at temperature 1,
   ``E[sum_x min(p(x), q(x))] = 1 - E[TV(p, q)]`` (Leviathan et al. 2023, §3.3, alpha =
   ``E(beta)``; Chen et al. 2023, Alg. 2), mean over positions.

Output in ``DIR``: ``target/`` and ``draft/`` (``save_pretrained``, tokenizer in both; read
them back with :func:`spec.llm.models.load_pair`) and ``report.json`` (figures above,
parameter counts, corpus size in characters and tokens, step counts, timings, versions and
the configuration).  The report's headline figures are also printed on stdout.

Reproducibility: the corpus, tokenizer, initial weights (``--seed``) and batch order are
functions of the options; how many steps fit the budget depends on the machine's speed and
load, and is reported.  ``--target-steps`` / ``--draft-steps`` replace a model's time share
by an exact step count (the schedule then runs on steps): such a run is deterministic on the
same hardware and thread count.

Presets (``--target-size`` / ``--draft-size``; parameters at a 4096-token vocabulary, untied
embeddings): ``pico`` 64 wide x 1 layer (0.57 M, a cheaper CPU draft), ``nano`` 64 x 2 (0.62 M,
the CPU draft), ``micro`` 256 x 2 (3.7 M,
the GPU draft), ``small`` 128 x 6 (2.24 M, the CPU target) and ``base`` 768 x 12 (91 M, the
GPU target).  The CPU target is narrow because on 2 cores the number of steps decides the
loss: in 150 s trials, 256 x 4 (5.3 M) reached validation loss 6.24 against 5.23 for 128 x 4.

A draft for a saved target: ``--target-from DIR`` loads the target and its tokenizer from
``DIR`` (an earlier run's ``target/``), skips the tokenizer and the target's training, gives
the whole budget to a ``--draft-size`` draft and writes the pair as above (the target
copied).  Give the corpus options the target was trained with; a warning names those that
differ from the ``report.json`` next to ``DIR``.  The draft must have fewer parameters than
the target.

CPU threads: on a CPU shared with other jobs, set ``OMP_WAIT_POLICY=PASSIVE`` (or
``--threads 1``) for training: spinning OpenMP workers then stop starving each other; measured
here under load, 2.5 to 4x the tokens/s of the default.  Do not keep it for decoding
benchmarks on an idle CPU: there the sleeping workers made a 5-token forward of the CPU target
2-3x slower (``tmc bench decode`` warns).

Measured here (2 CPU cores shared with other jobs, torch 2.13 CPU, transformers 5.23,
``OMP_WAIT_POLICY=PASSIVE``), ``python -m spec.llm.train --out DIR`` with the defaults:
standard library only, 1,758 files (1,723 train + 35 validation), 31.5 M characters,
9.38 M tokens (3.36 characters per token); corpus 0.2 s, tokenizer 12 s, encoding 23 s;
target ``small`` 1,199 steps (2.46 M tokens, 2,700 tokens/s, 912 s), draft ``nano`` 993 steps
(2.03 M tokens, 8,900 tokens/s, 227 s); evaluation on 65,536 positions 12 s; 1,187 s in all.
Validation loss: target 3.95, draft 4.10 nats/token; greedy agreement 0.58; SpS acceptance at
T = 1: 0.68 (before the copies of held-out files were dropped from training: 2 tiny files,
105 characters, in the standard library; 7 of the 274 held-out files, 1.1% of validation
characters, with ``--site-packages``).  The test suite's smoke run (``--max-chars 200000 --minutes 0.3 --vocab 300``)
takes ~15 s.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import sys
import sysconfig
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import tokenizers
import torch
import torch.nn.functional as F
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import AutoModelForCausalLM, LlamaForCausalLM, PreTrainedTokenizerFast

from spec.llm.models import count_parameters, save_pair, tiny_llama

__all__ = [
    "SIZES",
    "Document",
    "ModelSize",
    "TrainConfig",
    "Plan",
    "collect_corpus",
    "encode_corpus",
    "evaluate_pair",
    "main",
    "run",
    "train_model",
    "train_tokenizer",
]

BOS = "<|bos|>"
EOS = "<|eos|>"
VOCAB_MIN = 258  # the byte-level alphabet's 256 symbols and the two special tokens
SKIP_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__"})


@dataclass(frozen=True)
class ModelSize:
    """A Llama shape preset and the peak learning rate that suits it."""

    hidden: int  # model width
    layers: int  # decoder blocks
    heads: int  # attention heads (key/value heads: as many)
    intermediate: int  # MLP width (SwiGLU), ~8/3 of hidden as in Llama
    lr: float  # peak AdamW learning rate


SIZES: dict[str, ModelSize] = {
    "pico": ModelSize(hidden=64, layers=1, heads=4, intermediate=172, lr=3e-3),
    "nano": ModelSize(hidden=64, layers=2, heads=4, intermediate=172, lr=3e-3),
    "micro": ModelSize(hidden=256, layers=2, heads=4, intermediate=688, lr=2e-3),
    "small": ModelSize(hidden=128, layers=6, heads=4, intermediate=344, lr=2e-3),
    "base": ModelSize(hidden=768, layers=12, heads=12, intermediate=2048, lr=6e-4),
}
SEED_LIMIT = 2**62  # 2 * seed + 1 stays within torch.manual_seed's 64 bits
ORDER = ("pico", "nano", "small", "micro", "base")  # increasing parameter count at every vocabulary size
DEFAULT_DRAFT = {"micro": "nano", "small": "nano", "base": "micro"}


@dataclass(frozen=True)
class TrainConfig:
    """Everything a run depends on (recorded in ``report.json``)."""

    out: str  # output folder
    minutes: float = 20.0  # wall-clock budget for the whole run
    vocab: int | None = 4096  # BPE vocabulary size (an upper bound on a tiny corpus); None with target_from
    seed: int = 0  # model initialisation and batch order
    device: str = "cpu"  # "cpu" or "cuda" (bf16 autocast)
    target_size: str = "small"  # key of SIZES
    draft_size: str = "nano"  # key of SIZES
    site_packages: bool = False  # add purelib's sources to the standard library's
    max_chars: int | None = None  # cap on corpus characters (whole files, in order)
    val_every: int = 50  # every val_every-th file is held out
    seq_len: int = 128  # training and evaluation window
    batch: int = 16  # windows per step
    target_share: float | None = 0.8  # share of the training time given to the target; None with target_from
    warmup: float = 0.03  # share of each model's run spent in linear warm-up
    eval_tokens: int = 65536  # validation positions evaluated, at most
    target_steps: int | None = None  # exact step count (deterministic run); None: by the time budget
    draft_steps: int | None = None  # same for the draft
    log_every: float = 5.0  # seconds between progress lines
    threads: int | None = None  # torch intra-op threads; None: torch's default (all cores)
    roots: tuple[str, ...] = ()  # source folders (standard library, purelib), from the options
    target_from: str | None = None  # a saved target (with its tokenizer): train only a draft for it


@dataclass(frozen=True)
class Document:
    """One source file: its name (root label / relative path) and text."""

    name: str
    text: str


# --- 1. corpus -----------------------------------------------------------------------------


def source_roots(site_packages: bool) -> tuple[str, ...]:
    """The standard library folder, then purelib when asked for."""
    paths = sysconfig.get_paths()
    roots = [paths["stdlib"]]
    if site_packages and paths["purelib"] not in roots:
        roots.append(paths["purelib"])
    return tuple(roots)


def _python_files(root: Path) -> Iterator[Path]:
    """``*.py`` under ``root`` in sorted order, skipping nested site-packages and caches."""
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
        for name in sorted(files):
            if name.endswith(".py"):
                yield Path(folder, name)


def collect_corpus(roots: Sequence[str], max_chars: int | None = None) -> list[Document]:
    """UTF-8, non-blank ``*.py`` files under ``roots``, in order, at most ``max_chars`` characters in all.

    A file that would take the total past ``max_chars`` is skipped and the walk goes on, so a
    cap fills up with whole files; the walk stops once the cap is reached.
    """
    if max_chars is not None and max_chars <= 0:
        raise ValueError(f"max_chars must be positive, got {max_chars}")
    docs: list[Document] = []
    total = 0
    for root in map(Path, roots):
        label = root.name
        for path in _python_files(root):
            try:
                text = path.read_bytes().decode("utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            if not text.strip():
                continue
            if max_chars is not None and total + len(text) > max_chars:
                continue
            docs.append(Document(f"{label}/{path.relative_to(root).as_posix()}", text))
            total += len(text)
            if total == max_chars:
                return docs
    return docs


def split_corpus(docs: Sequence[Document], val_every: int) -> tuple[list[Document], list[Document]]:
    """(train, validation): every ``val_every``-th file held out, and no training file that copies a held-out
    one, exactly or nearly.

    A corpus of fewer than ``val_every`` files (a small ``max_chars``) holds out its largest
    file instead, the one most likely to give a few validation windows.  Copies of a held-out
    file elsewhere in the tree (``site-packages`` vendors packages: pip's and setuptools' copies
    of ``packaging`` and ``rich``, often a few lines apart) are dropped from training, so
    validation measures text the models did not train on: the rule is :class:`_NearCopies`'.
    """
    if val_every < 2:
        raise ValueError(f"val_every must be at least 2, got {val_every}")
    if len(docs) < 2:
        raise ValueError(f"the corpus needs at least 2 files, got {len(docs)}: no readable non-blank *.py file"
                         if not docs else f"the corpus needs at least 2 files, got 1 ({docs[0].name}): raise "
                         "max_chars or give a root with more files")
    largest = max(range(len(docs)), key=lambda i: len(docs[i].text))
    held = {i for i in range(len(docs)) if i % val_every == val_every - 1} or {largest}
    val = [d for i, d in enumerate(docs) if i in held]
    near = _NearCopies(val)
    train = [d for i, d in enumerate(docs) if i not in held and not near.of(d.text)]
    if not train:
        raise ValueError(f"no training file is left: each of the {len(docs) - len(val)} not held out copies a "
                         "held-out file, exactly or nearly (give a corpus of more distinct files)")
    return train, val


NEAR_LINES = 8  # a run: this many consecutive non-blank lines, trailing whitespace stripped
NEAR_SHARE = 0.5  # a near copy shares at least this share of one side's runs


def _lines(text: str) -> list[str]:
    return [line for line in (raw.rstrip() for raw in text.splitlines()) if line]


def _runs(lines: Sequence[str]) -> set[tuple[str, ...]]:
    return {tuple(lines[i : i + NEAR_LINES]) for i in range(len(lines) - NEAR_LINES + 1)}


class _NearCopies:
    """Which texts are copies or near copies of the held-out files (:func:`split_corpus`).

    A text is one when its non-blank lines, trailing whitespace stripped, are those of a held-out file, or
    when it shares with one held-out file at least :data:`NEAR_SHARE` of that file's runs of
    :data:`NEAR_LINES` lines or of its own (a vendored copy a few lines apart, a file holding a held-out
    one, a file a held-out one holds).  A licence header or a common idiom is a few runs of a file, so
    files that merely share one stay."""

    def __init__(self, held: Sequence[Document]) -> None:
        lines = [_lines(d.text) for d in held]
        runs = [_runs(ls) for ls in lines]
        self._texts = {"\n".join(ls) for ls in lines}
        self._sizes = [len(r) for r in runs]
        self._owners: dict[tuple[str, ...], list[int]] = {}
        for j, held_runs in enumerate(runs):
            for run in held_runs:
                self._owners.setdefault(run, []).append(j)

    def of(self, text: str) -> bool:
        lines = _lines(text)
        if "\n".join(lines) in self._texts:
            return True
        runs = _runs(lines)
        shared: dict[int, int] = {}
        for run in runs:
            for j in self._owners.get(run, ()):
                shared[j] = shared.get(j, 0) + 1
        return any(n >= NEAR_SHARE * min(self._sizes[j], len(runs)) for j, n in shared.items())


# --- 2-3. tokenizer and token streams ------------------------------------------------------


def train_tokenizer(texts: Sequence[str], vocab: int, max_positions: int) -> PreTrainedTokenizerFast:
    """Byte-level BPE with ``<|bos|>`` = 0 and ``<|eos|>`` = 1; encoding prepends ``<|bos|>``."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab < len(alphabet) + 2:
        raise ValueError(f"vocab must be at least {len(alphabet) + 2} (bytes + 2 special tokens), got {vocab}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=[BOS, EOS], initial_alphabet=alphabet, show_progress=False
    )
    tok.train_from_iterator(texts, trainer, length=len(texts))
    assert tok.token_to_id(BOS) == 0 and tok.token_to_id(EOS) == 1
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, 0)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=EOS, model_max_length=max_positions
    )


def encode_corpus(tokenizer: PreTrainedTokenizerFast, docs: Sequence[Document]) -> torch.Tensor:
    """One int64 stream, ``<|bos|> ids <|eos|>`` per document, in order.  Shape (N,).

    A document's own text is encoded as text throughout: a source file that spells ``<|eos|>`` (a string
    literal) gets the tokens of those characters, not the special id, so the stream's only ``<|bos|>`` and
    ``<|eos|>`` are those that bound the documents."""
    backend = tokenizer.backend_tokenizer
    texts = [d.text for d in docs]
    # encode_batch_fast skips offsets (twice as fast); older tokenizers only have encode_batch
    encode = getattr(backend, "encode_batch_fast", backend.encode_batch)
    eos = tokenizer.eos_token_id
    ids: list[int] = []
    before = backend.encode_special_tokens
    backend.encode_special_tokens = True  # the post-processor still prepends <|bos|>
    try:
        for enc in encode(texts):
            ids.extend(enc.ids)
            ids.append(eos)
    finally:
        backend.encode_special_tokens = before
    return torch.tensor(ids, dtype=torch.int64)


# --- 4. training ---------------------------------------------------------------------------


def build_model(size: ModelSize, vocab: int, max_positions: int, seed: int, tokenizer: PreTrainedTokenizerFast) -> LlamaForCausalLM:
    return tiny_llama(
        vocab,
        hidden_size=size.hidden,
        layers=size.layers,
        heads=size.heads,
        intermediate=size.intermediate,
        max_positions=max_positions,
        seed=seed,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )


def _autocast(device: str) -> contextlib.AbstractContextManager[Any]:
    if device == "cuda":
        return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def sample_batch(stream: torch.Tensor, batch: int, seq_len: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, labels), each (batch, seq_len): random windows of ``seq_len + 1`` tokens, shifted by one."""
    starts = torch.randint(0, stream.numel() - seq_len, (batch,), generator=gen)
    idx = starts[:, None] + torch.arange(seq_len + 1)  # (B, T+1)
    windows = stream[idx.to(stream.device)]
    return windows[:, :-1], windows[:, 1:]


def next_token_loss(model: torch.nn.Module, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy (nats) of ``labels`` under the model's float32 logits."""
    logits = model(input_ids=inputs, use_cache=False).logits  # (B, T, V)
    return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten())


def make_optimizer(model: torch.nn.Module, lr: float) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not on norm gains)."""
    decay = [p for p in model.parameters() if p.ndim >= 2]
    keep = [p for p in model.parameters() if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": keep, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8)


def learning_rate(progress: float, peak: float, warmup: float) -> float:
    """Linear warm-up over the first ``warmup`` of the run, then cosine from ``peak`` to ``peak / 10``.

    ``progress`` in [0, 1] is the share of the run done: elapsed time over the time budget,
    or steps done over the step count when the count is fixed.
    """
    if progress < warmup:
        return peak * max(progress / warmup, 0.01)
    rest = min(1.0, (progress - warmup) / (1.0 - warmup))
    return peak * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * rest)))


def _train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, inputs: torch.Tensor, labels: torch.Tensor, device: str) -> float:
    with _autocast(device):
        loss = next_token_loss(model, inputs, labels)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.item()


@torch.no_grad()
def forward_seconds_per_token(model: torch.nn.Module, cfg: TrainConfig, vocab: int) -> float:
    """Cost of an evaluation forward pass per position (after one warm-up pass), to budget the evaluation."""
    model.to(cfg.device).eval()
    x = torch.zeros((cfg.batch, cfg.seq_len), dtype=torch.int64, device=cfg.device) + (vocab - 1)
    with _autocast(cfg.device):
        model(input_ids=x, use_cache=False)
        _sync(cfg.device)
        t = time.perf_counter()
        model(input_ids=x, use_cache=False)
        _sync(cfg.device)
    return (time.perf_counter() - t) / x.numel()


@dataclass(frozen=True)
class Plan:
    """How long one model trains: a time budget, or an exact step count (a deterministic run)."""

    seconds: float  # wall-clock budget (ignored when steps is set)
    steps: int | None = None  # exact number of steps; None: as many as fit in seconds

    def __str__(self) -> str:
        return f"{self.steps} steps" if self.steps is not None else f"{self.seconds:.0f} s"


def train_model(
    model: torch.nn.Module,
    stream: torch.Tensor,
    plan: Plan,
    size: ModelSize,
    cfg: TrainConfig,
    data_seed: int,
    log: Callable[[str], None],
    name: str,
) -> dict[str, Any]:
    """Train ``model`` in place with AdamW on random windows of ``stream``, for ``plan``.

    With a time budget the schedule runs on elapsed time, so it completes its decay whatever
    the machine's speed (and whatever else shares the CPU); the step count reached is
    reported.  Passing it back as ``plan.steps`` does *not* replay that run: with a step count
    the schedule runs on steps, so the learning rates differ; a step-count run is the
    deterministic one (the same weights on the same hardware and thread count).  At least one
    step is always taken.
    """
    if plan.steps is not None and plan.steps < 1:
        raise ValueError(f"plan.steps must be positive, got {plan.steps}")
    if stream.numel() <= cfg.seq_len + 1:
        raise ValueError(f"the training stream ({stream.numel()} tokens) is shorter than seq_len + 2")
    model.to(cfg.device).train()
    opt = make_optimizer(model, size.lr)
    gen = torch.Generator().manual_seed(data_seed)
    stream = stream.to(cfg.device)
    start = last_log = time.perf_counter()
    recent: list[float] = []
    step = 0
    while True:
        elapsed = time.perf_counter() - start
        progress = step / plan.steps if plan.steps is not None else elapsed / max(plan.seconds, 1e-9)
        if progress >= 1.0 and step > 0:
            break
        lr = learning_rate(progress, size.lr, cfg.warmup)
        for group in opt.param_groups:
            group["lr"] = lr
        inputs, labels = sample_batch(stream, cfg.batch, cfg.seq_len, gen)
        recent.append(_train_step(model, opt, inputs, labels, cfg.device))
        step += 1
        now = time.perf_counter()
        if now - last_log >= cfg.log_every:
            tok_s = step * cfg.batch * cfg.seq_len / (now - start)
            log(f"[{name}] step {step} ({min(progress, 1.0):.0%}) loss {sum(recent) / len(recent):.3f} lr {lr:.2e} {tok_s:,.0f} tok/s")
            last_log, recent = now, []
    model.eval()
    seconds = time.perf_counter() - start
    tokens = step * cfg.batch * cfg.seq_len
    log(f"[{name}] trained {step} steps, {tokens:,} tokens in {seconds:.0f} s")
    if plan.steps is None and plan.seconds <= 0.0:
        log(f"[{name}] warning: its time budget was spent before it began (the stages before it took the "
            f"--minutes given): it took the one step always taken and is barely trained; raise --minutes")
    return {
        "steps": step,
        "tokens_seen": tokens,
        "train_seconds": round(seconds, 2),
        "tokens_per_second": round(tokens / seconds, 1),
    }


# --- 5. evaluation -------------------------------------------------------------------------


def validation_windows(stream: torch.Tensor, seq_len: int, max_positions: int) -> torch.Tensor:
    """Non-overlapping windows of ``seq_len + 1`` tokens spread evenly over ``stream``.  Shape (W, T+1)."""
    available = (stream.numel() - 1) // seq_len
    if available < 1:
        raise ValueError(f"the validation stream ({stream.numel()} tokens) is shorter than seq_len + 1")
    count = max(1, min(available, max_positions // seq_len))
    # window k of `count` is the `available * k // count`-th slot, so the windows sample the whole stream
    slots = torch.tensor([available * k // count for k in range(count)])
    idx = slots[:, None] * seq_len + torch.arange(seq_len + 1)  # (W, T+1)
    return stream[idx]


@torch.no_grad()
def evaluate_pair(
    target: torch.nn.Module, draft: torch.nn.Module, windows: torch.Tensor, batch: int, device: str
) -> dict[str, float]:
    """Losses of ``p`` (target) and ``q`` (draft), greedy agreement and SpS acceptance at T = 1.

    At every position: ``-log p(next)``, ``-log q(next)``, ``[argmax q == argmax p]`` and
    ``sum_x min(p(x), q(x))`` (the probability that one SpS step accepts the draft's token,
    Leviathan et al. 2023, §3.3); each averaged over all positions of ``windows``.
    """
    sums = {"target_val_loss": 0.0, "draft_val_loss": 0.0, "greedy_agreement": 0.0, "sps_acceptance": 0.0}
    positions = 0
    for chunk in windows.split(batch):
        chunk = chunk.to(device)
        inputs, labels = chunk[:, :-1], chunk[:, 1:]
        with _autocast(device):
            logp = target(input_ids=inputs, use_cache=False).logits.float().log_softmax(-1)  # (B, T, V)
            logq = draft(input_ids=inputs, use_cache=False).logits.float().log_softmax(-1)  # (B, T, V)
        sums["target_val_loss"] += -logp.gather(-1, labels[..., None]).sum().item()
        sums["draft_val_loss"] += -logq.gather(-1, labels[..., None]).sum().item()
        sums["greedy_agreement"] += (logp.argmax(-1) == logq.argmax(-1)).sum().item()
        sums["sps_acceptance"] += torch.minimum(logp, logq).exp().sum(-1).double().sum().item()
        positions += labels.numel()
    out = {k: v / positions for k, v in sums.items()}
    out["eval_positions"] = positions
    return out


# --- driver --------------------------------------------------------------------------------


def _logger(start: float) -> Callable[[str], None]:
    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - start:7.1f}s] {msg}", file=sys.stderr, flush=True)

    return log


#: Options that decide the corpus and its split: a draft for a saved target should use the target's.
CORPUS_OPTIONS = ("roots", "max_chars", "val_every")


def _saved_target(cfg: TrainConfig, log: Callable[[str], None]) -> tuple[Any, PreTrainedTokenizerFast]:
    """The target and tokenizer in ``cfg.target_from`` (``--target-from``), in eval mode on ``cfg.device``.

    When the folder's parent holds this script's ``report.json`` whose corpus options differ
    from ``cfg``'s, a warning is logged: the draft would then train, and the pair be
    evaluated, on other files than the target's.
    """
    assert cfg.target_from is not None
    folder = Path(cfg.target_from)
    try:
        tokenizer = PreTrainedTokenizerFast.from_pretrained(folder)
        target: Any = AutoModelForCausalLM.from_pretrained(folder)
    except (OSError, ValueError) as err:
        raise ValueError(f"--target-from {folder}: cannot load the target: {' '.join(str(err).split())[:200]}") from None
    target = target.to(cfg.device).eval()
    if len(tokenizer) != target.config.vocab_size:
        raise ValueError(f"--target-from {folder}: the tokenizer has {len(tokenizer)} entries, "
                         f"the model {target.config.vocab_size}")
    positions = int(target.config.max_position_embeddings)
    if cfg.seq_len > positions:
        raise ValueError(f"--seq-len {cfg.seq_len} is longer than the target in {folder} can read ({positions} positions)")
    report = folder.parent / "report.json"
    if report.is_file():
        saved = json.loads(report.read_text(encoding="utf-8")).get("config", {})
        ours = asdict(cfg)
        differ = [k for k in CORPUS_OPTIONS if k in saved and saved[k] != (list(ours[k]) if k == "roots" else ours[k])]
        if differ:
            log(f"warning: the target's run ({report}) used other corpus options ({', '.join(differ)}): "
                + ", ".join(f"{k}={saved[k]!r}" for k in differ))
    return target, tokenizer


def check_out_folder(out: str) -> None:
    """``ValueError`` unless ``out`` is a writable folder or can be made as one (nothing is made here):
    its nearest existing ancestor, or itself, must be a folder this process may write in."""
    path = Path(out).absolute()
    here = path
    while not here.exists():
        here = here.parent
    if not here.is_dir():
        what = "is a file" if here == path else f"lies under {here}, a file"
        raise ValueError(f"--out {out}: {what}, not a folder")
    if not os.access(here, os.W_OK | os.X_OK):
        raise ValueError(f"--out {out}: {here} is not writable")


def run(cfg: TrainConfig) -> dict[str, Any]:
    """The whole pipeline (module docstring); returns the report it writes to ``cfg.out/report.json``."""
    start = time.perf_counter()
    budget_end = start + 60.0 * cfg.minutes
    log = _logger(start)
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    check_out_folder(cfg.out)  # before any training: a bad --out found after 20 minutes loses them
    times: dict[str, float] = {}

    def lap(key: str, since: float) -> float:
        now = time.perf_counter()
        times[key] = round(now - since, 2)
        return now

    t = time.perf_counter()
    loaded = _saved_target(cfg, log) if cfg.target_from is not None else None
    docs = collect_corpus(cfg.roots, cfg.max_chars)
    train_docs, val_docs = split_corpus(docs, cfg.val_every)
    t = lap("corpus", t)
    dropped = len(docs) - len(train_docs) - len(val_docs)
    log(f"corpus: {len(train_docs)} + {len(val_docs)} files ({dropped} copies or near copies of held-out files dropped), "
        f"{sum(len(d.text) for d in docs):,} characters")

    if loaded is None:
        max_positions = max(512, cfg.seq_len)
        if cfg.vocab is None:  # config_from_args sets None only with target_from
            raise ValueError("vocab is None: give a vocabulary size (None goes with target_from only)")
        tokenizer = train_tokenizer([d.text for d in train_docs], cfg.vocab, max_positions)
    else:
        target, tokenizer = loaded
        max_positions = int(target.config.max_position_embeddings)
    vocab = len(tokenizer)
    tsize, dsize = SIZES[cfg.target_size], SIZES[cfg.draft_size]
    draft = build_model(dsize, vocab, max_positions, cfg.seed + 1, tokenizer)
    if loaded is not None and count_parameters(draft) >= count_parameters(target):  # before the corpus is encoded
        raise ValueError(f"--draft-size {cfg.draft_size} ({count_parameters(draft):,} parameters) is not smaller "
                         f"than the target in {cfg.target_from} ({count_parameters(target):,})")
    t = lap("tokenizer", t)
    train_stream = encode_corpus(tokenizer, train_docs)
    val_stream = encode_corpus(tokenizer, val_docs)
    t = lap("encode", t)
    log(f"tokens: {train_stream.numel():,} train, {val_stream.numel():,} validation, vocabulary {vocab}")

    if loaded is None:
        target = build_model(tsize, vocab, max_positions, cfg.seed, tokenizer)
    windows = validation_windows(val_stream, cfg.seq_len, cfg.eval_tokens)
    fwd = forward_seconds_per_token(target, cfg, vocab) + forward_seconds_per_token(draft, cfg, vocab)
    # evaluation is reserved with a 2x margin (the CPU may be shared) plus time to save
    reserve = 2.0 * windows[:, 1:].numel() * fwd + 5.0
    t = lap("probe", t)

    t_stats: dict[str, Any]
    if loaded is None:
        left = max(0.0, budget_end - time.perf_counter() - reserve)
        if cfg.target_share is None:  # as vocab
            raise ValueError("target_share is None: give the target's share of the time (None goes with target_from only)")
        plan = Plan(seconds=cfg.target_share * left, steps=cfg.target_steps)
        log(f"target: {count_parameters(target):,} parameters, {plan}")
        t_stats = {"size": cfg.target_size, **asdict(tsize), **train_model(target, train_stream, plan, tsize, cfg,
                                                                          2 * cfg.seed, log, "target")}
    else:
        log(f"target: {count_parameters(target):,} parameters, loaded from {cfg.target_from} (not trained)")
        t_stats = {"from": cfg.target_from}
    t = lap("target", t)

    plan = Plan(seconds=max(0.0, budget_end - time.perf_counter() - reserve), steps=cfg.draft_steps)
    log(f"draft: {count_parameters(draft):,} parameters, {plan}")
    d_stats = train_model(draft, train_stream, plan, dsize, cfg, 2 * cfg.seed + 1, log, "draft")
    t = lap("draft", t)

    metrics = evaluate_pair(target, draft, windows, cfg.batch, cfg.device)
    t = lap("eval", t)
    save_pair(target.cpu(), draft.cpu(), tokenizer, cfg.out)
    t = lap("save", t)
    times["total"] = round(time.perf_counter() - start, 2)

    report: dict[str, Any] = {
        **metrics,
        "wall_seconds": times["total"],
        "target": {"params": count_parameters(target), **t_stats},
        "draft": {"params": count_parameters(draft), "size": cfg.draft_size, **asdict(dsize), **d_stats},
        "corpus": {
            "roots": list(cfg.roots),
            "files_train": len(train_docs),
            "files_val": len(val_docs),
            "files_dropped": dropped,  # copies or near copies of held-out files
            "chars_train": sum(len(d.text) for d in train_docs),
            "chars_val": sum(len(d.text) for d in val_docs),
            "tokens_train": train_stream.numel(),
            "tokens_val": val_stream.numel(),
            "chars": sum(len(d.text) for d in docs),
            "tokens": train_stream.numel() + val_stream.numel(),
        },
        "tokenizer": {"vocab_size": vocab, "vocab_requested": cfg.vocab, "bos_token": BOS, "eos_token": EOS},
        "timings_s": times,
        "config": asdict(cfg),
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
            "threads": torch.get_num_threads(),
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        },
    }
    Path(cfg.out, "report.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    log(f"done in {times['total']:.0f} s: {cfg.out}")
    return report


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m spec.llm.train",
        description="Train a small Llama (target, draft) pair on local Python sources and save both.",
    )
    p.add_argument("--out", required=True, help="output folder (target/, draft/, report.json)")
    p.add_argument("--minutes", type=float, default=20.0, help="wall-clock budget for the whole run (default 20)")
    p.add_argument("--vocab", type=int, default=None,
                   help="BPE vocabulary size (default 4096; with --target-from, the target's tokenizer's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--target-size", choices=ORDER[2:], default=None, help="default: small on cpu, base on cuda")
    p.add_argument("--draft-size", choices=ORDER[:-1], default=None,
                   help="default: nano for small, micro for base; fewer parameters than the target")
    p.add_argument("--site-packages", action="store_true", help="add purelib's *.py files to the standard library's")
    p.add_argument("--max-chars", type=int, default=None, help="cap on corpus characters (whole files, in order)")
    p.add_argument("--val-every", type=int, default=50, help="hold out every N-th file (default 50: 2%%)")
    p.add_argument("--seq-len", type=int, default=None, help="window length (default 128 on cpu, 256 on cuda)")
    p.add_argument("--batch", type=int, default=None, help="windows per step (default 16 on cpu, 64 on cuda)")
    p.add_argument("--target-share", type=float, default=None,
                   help="share of training time for the target (default 0.8; with --target-from the draft has it all)")
    p.add_argument("--warmup", type=float, default=0.03, help="share of each run in linear warm-up (default 0.03)")
    p.add_argument("--eval-tokens", type=int, default=65536, help="validation positions evaluated, at most")
    p.add_argument("--target-steps", type=int, default=None, help="exact target step count instead of its time share")
    p.add_argument("--draft-steps", type=int, default=None, help="exact draft step count instead of the time left")
    p.add_argument("--log-every", type=float, default=5.0, help="seconds between progress lines")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--target-from", metavar="DIR", default=None,
                   help="train only a draft, for the target saved in DIR with its tokenizer (an earlier run's target/); "
                        "give the corpus options that target was trained with")
    return p


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available")
    if args.target_share is not None and not 0.0 < args.target_share < 1.0:
        raise ValueError(f"--target-share must lie in (0, 1), got {args.target_share}")
    for flag, value, low in (("--target-steps", args.target_steps, 1), ("--draft-steps", args.draft_steps, 1),
                             ("--vocab", args.vocab, VOCAB_MIN), ("--max-chars", args.max_chars, 1),
                             ("--val-every", args.val_every, 2)):
        if value is not None and value < low:  # before any training (--draft-steps 0 failed after the target's)
            raise ValueError(f"{flag} must be at least {low}, got {value}")
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be positive, got {args.threads}")
    if not 0 <= args.seed < SEED_LIMIT:  # the models' seeds are seed, seed + 1, 2 seed and 2 seed + 1
        raise ValueError(f"--seed must lie in [0, 2**62), got {args.seed}")
    if not 0.0 < args.warmup < 1.0:
        raise ValueError(f"--warmup must lie in (0, 1), got {args.warmup}")
    if not (math.isfinite(args.minutes) and args.minutes > 0):  # inf trained forever, nan one step a model
        raise ValueError(f"--minutes must be a positive number, got {args.minutes}")
    for flag, value in (("--seq-len", args.seq_len), ("--batch", args.batch)):
        if value is not None and value < 1:
            raise ValueError(f"{flag} must be positive, got {value}")
    seq_len = args.seq_len if args.seq_len is not None else (256 if cuda else 128)
    if args.eval_tokens < seq_len:  # the evaluation takes whole windows of seq_len positions
        raise ValueError(f"--eval-tokens must be at least --seq-len ({seq_len}: one validation window), "
                         f"got {args.eval_tokens}")
    if not math.isfinite(args.log_every) or args.log_every < 0:
        raise ValueError(f"--log-every must be a number of seconds >= 0, got {args.log_every}")
    if args.target_from is not None:
        given = [flag for flag, value in (("--target-size", args.target_size), ("--target-steps", args.target_steps),
                                          ("--vocab", args.vocab), ("--target-share", args.target_share))
                 if value is not None]
        if given:
            raise ValueError(f"--target-from trains no target: drop {' and '.join(given)}")
        if not Path(args.target_from, "tokenizer.json").is_file():
            raise ValueError(f"--target-from: {args.target_from} holds no tokenizer.json (a target/ folder of this script's output has one)")
    target_size = args.target_size or ("base" if cuda else "small")
    draft_size = args.draft_size or DEFAULT_DRAFT[target_size]
    if args.target_from is None and ORDER.index(draft_size) >= ORDER.index(target_size):
        raise ValueError(f"--draft-size ({draft_size}) must be smaller than --target-size ({target_size})")
    return TrainConfig(
        out=args.out,
        minutes=args.minutes,
        vocab=None if args.target_from is not None else 4096 if args.vocab is None else args.vocab,
        seed=args.seed,
        device=args.device,
        target_size=target_size,
        draft_size=draft_size,
        site_packages=args.site_packages,
        max_chars=args.max_chars,
        val_every=args.val_every,
        seq_len=seq_len,
        batch=args.batch if args.batch is not None else (64 if cuda else 16),
        target_share=None if args.target_from is not None else 0.8 if args.target_share is None else args.target_share,
        warmup=args.warmup,
        eval_tokens=args.eval_tokens,
        target_steps=args.target_steps,
        draft_steps=args.draft_steps,
        log_every=args.log_every,
        threads=args.threads,
        roots=source_roots(args.site_packages),
        target_from=args.target_from,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        cfg = config_from_args(args)
        check_out_folder(cfg.out)
    except ValueError as err:
        parser.error(str(err))
    try:
        report = run(cfg)
    except ValueError as err:  # bad input found once files are read (e.g. --target-from's model): one line
        parser.error(str(err))
    headline = ("target_val_loss", "draft_val_loss", "greedy_agreement", "sps_acceptance", "eval_positions", "wall_seconds")
    for key in headline:
        print(f"{key}: {report[key]:.4f}" if isinstance(report[key], float) else f"{key}: {report[key]}")
    print(f"params: target {report['target']['params']:,}, draft {report['draft']['params']:,}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
