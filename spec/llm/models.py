"""Small Llama-architecture models for tests, and saving / loading a (target, draft) pair (DESIGN.md §8).

No weights can be downloaded here, so the LLM side of the project runs on two kinds of
models, both plain ``transformers.LlamaForCausalLM``:

* :func:`tiny_llama` / :func:`tiny_pair`: randomly initialised, built from a ``LlamaConfig``,
  deterministic given the seed.  Unit tests use these: a random model is as good as a trained
  one for checking that a decoder is lossless or that tree logits equal plain decoding.
* pairs trained by :mod:`spec.llm.train` on local Python sources, stored by :func:`save_pair`
  as two ``save_pretrained`` folders, ``DIR/target`` and ``DIR/draft`` (tokenizer in both),
  and read back by :func:`load_pair`.  A user with real weights loads them the same way
  (``AutoModelForCausalLM.from_pretrained`` on a path or hub id).

Notation (DESIGN.md §3): ``p`` is the target, ``q`` the draft; the draft is the smaller model.

Attention defaults to ``sdpa``: tree verification passes a custom 4D mask, which the
flash-attention kernels do not take (DESIGN.md §8).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerFast,
)

__all__ = [
    "count_parameters", "load_for_decoding", "load_pair", "parse_device", "save_pair", "stop_token_ids", "tiny_llama",
    "tiny_pair",
]

TARGET_DIR = "target"
DRAFT_DIR = "draft"


def tiny_llama(
    vocab_size: int,
    hidden_size: int = 32,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int | None = None,
    intermediate: int = 64,
    max_positions: int = 512,
    seed: int = 0,
    attn_implementation: str = "sdpa",
    *,
    bos_token_id: int | None = None,
    eos_token_id: int | None = None,
) -> LlamaForCausalLM:
    """A randomly initialised float32 ``LlamaForCausalLM`` in eval mode, a function of its arguments.

    ``kv_heads=None`` means as many key/value heads as query heads (no grouped-query
    attention).  The weights are drawn from torch's generator seeded with ``seed`` inside
    ``torch.random.fork_rng``, so the caller's global random state is left as it was.
    Token ids the model should know about (for ``generate``) go in ``bos_token_id`` /
    ``eos_token_id``; the pad id is the eos id.
    """
    if vocab_size < 2:
        raise ValueError(f"vocab_size must be at least 2, got {vocab_size}")
    if hidden_size % heads:
        raise ValueError(f"hidden_size ({hidden_size}) must be a multiple of heads ({heads})")
    kv = heads if kv_heads is None else kv_heads
    if heads % kv:
        raise ValueError(f"heads ({heads}) must be a multiple of kv_heads ({kv})")
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        intermediate_size=intermediate,
        max_position_embeddings=max_positions,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=eos_token_id,
        attn_implementation=attn_implementation,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = eos_token_id
    return model.float().eval()


def tiny_pair(vocab_size: int, seed: int = 0) -> tuple[LlamaForCausalLM, LlamaForCausalLM]:
    """(target, draft): two random tiny Llamas on the same vocabulary, the draft smaller.

    Target: hidden 32, 2 layers, 4 heads; draft: hidden 16, 1 layer, 2 heads.  Their seeds
    differ (``seed`` and ``seed + 1``) so that ``p != q``, as in any real pair.
    """
    target = tiny_llama(vocab_size, hidden_size=32, layers=2, heads=4, intermediate=64, seed=seed)
    draft = tiny_llama(vocab_size, hidden_size=16, layers=1, heads=2, intermediate=32, seed=seed + 1)
    return target, draft


def count_parameters(model: torch.nn.Module) -> int:
    """Number of distinct parameters (tied weights counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def save_pair(
    target: PreTrainedModel,
    draft: PreTrainedModel,
    tokenizer: PreTrainedTokenizerFast | None,
    out_dir: str | Path,
) -> Path:
    """Write ``out_dir/target`` and ``out_dir/draft`` with ``save_pretrained``; return ``out_dir``.

    The tokenizer, when given, is saved into both folders, so each one loads on its own
    (``AutoTokenizer.from_pretrained(out_dir / "draft")`` works as well as for the target).
    """
    if target.config.vocab_size != draft.config.vocab_size:
        raise ValueError(
            f"target and draft must share the vocabulary: {target.config.vocab_size} != {draft.config.vocab_size}"
        )
    out = Path(out_dir)
    for name, model in ((TARGET_DIR, target), (DRAFT_DIR, draft)):
        model.save_pretrained(out / name)
        if tokenizer is not None:
            tokenizer.save_pretrained(out / name)
    return out


def load_pair(
    path: str | Path, attn_implementation: str = "sdpa"
) -> tuple[PreTrainedModel, PreTrainedModel, PreTrainedTokenizerFast | None]:
    """(target, draft, tokenizer or None) from a folder written by :func:`save_pair`.

    Both models in eval mode; the tokenizer is read from the target folder when it holds one.
    """
    root = Path(path)
    if not (root / TARGET_DIR).is_dir() or not (root / DRAFT_DIR).is_dir():
        raise ValueError(f"path must hold {TARGET_DIR}/ and {DRAFT_DIR}/ folders: {root}")
    target = AutoModelForCausalLM.from_pretrained(root / TARGET_DIR, attn_implementation=attn_implementation)
    draft = AutoModelForCausalLM.from_pretrained(root / DRAFT_DIR, attn_implementation=attn_implementation)
    tokenizer = None
    if (root / TARGET_DIR / "tokenizer.json").is_file():
        tokenizer = PreTrainedTokenizerFast.from_pretrained(root / TARGET_DIR)
    return target.eval(), draft.eval(), tokenizer


def parse_device(name: str | torch.device | None) -> torch.device:
    """A ``--device`` value as a torch device: ``None`` is cuda when torch sees one, else cpu.

    A one-line ``ValueError`` for a name torch does not know (``gpu``), for cuda where torch sees no
    CUDA device (or not that many), for ``meta`` (shapes without data) and for any device this torch build
    cannot allocate on (``mps`` off a Mac), instead of torch's own error from deep inside a load or a forward.
    """
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise ValueError(f"device {str(name)!r} is not a torch device (cpu, cuda, cuda:1, ...)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {str(name)!r}: torch sees no CUDA device")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"device {str(name)!r}: torch sees {torch.cuda.device_count()} CUDA device(s)")
    if device.type == "meta":
        raise ValueError(f"device {str(name)!r} holds shapes without data: decode on cpu or cuda")
    try:
        torch.empty(1, device=device)
    except (RuntimeError, AssertionError, NotImplementedError, ImportError):  # e.g. mps off a Mac; hpu: no torch.hpu
        raise ValueError(f"device {str(name)!r} cannot be used by this torch ({torch.__version__}): it allocates "
                         f"nothing on {device.type}") from None
    return device


def _one_line(err: Exception, width: int = 200) -> str:
    """An exception's message on one line, cut at ``width`` characters (transformers' run to many lines)."""
    return " ".join(str(err).split())[:width]


def load_for_decoding(
    target: str, draft: str, device: str | torch.device = "cpu", dtype: torch.dtype | None = None
) -> tuple[Any, Any, Any]:
    """(target, draft, tokenizer) for the command line: folders or hub ids, sdpa, eval mode, on ``device``.

    The tokenizer is the target's.  ``dtype=None`` keeps the stored dtype.  A path that
    holds no tokenizer or no causal LM raises a one-line ``ValueError`` naming it, and so does a
    ``device`` torch cannot use (:func:`parse_device`).
    """
    device = parse_device(device)
    # any failure of a load is the folder's, in one line: weights that do not match config.json
    # (RuntimeError), a config value of the wrong type (huggingface_hub's validation errors), a truncated
    # safetensors file (SafetensorError) had ended in tracebacks; running out of memory is not the folder's
    try:
        tokenizer = AutoTokenizer.from_pretrained(target)
    except MemoryError:
        raise
    except Exception as err:
        raise ValueError(f"cannot load a tokenizer from {target!r}: {_one_line(err)}") from None
    extra = {} if dtype is None else {"dtype": dtype}
    models = []
    for path in (target, draft):
        try:
            models.append(AutoModelForCausalLM.from_pretrained(path, attn_implementation="sdpa", **extra).to(device).eval())
        except MemoryError:
            raise
        except Exception as err:
            raise ValueError(f"cannot load a causal LM from {path!r}: {_one_line(err)}") from None
    return models[0], models[1], tokenizer


#: Files of which a saved tokenizer has at least one (``tokenizers``' JSON, or the slow tokenizers' vocabularies).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model", "spiece.model")


def draft_tokenizer_note(tokenizer: Any, draft: str) -> str | None:
    """A note when the draft folder's own tokenizer is not the target's (``tokenizer``), else ``None``.

    The decode reads the draft's rows as target ids, so a draft that numbers tokens differently stays lossless
    but is almost never accepted (a permuted vocabulary of the same size: 1.00 tokens a step instead of 2.67).
    A draft folder without tokenizer files gets no note (it is meant to share the target's); one whose
    tokenizer cannot be read gets one.  A hub id's tokenizer is compared when it loads.
    """
    folder = Path(draft)
    if folder.is_dir() and not any((folder / name).is_file() for name in TOKENIZER_FILES):
        return None
    try:
        own = AutoTokenizer.from_pretrained(draft)
    except MemoryError:
        raise
    except Exception as err:
        if not folder.is_dir():
            return None
        return f"note: the draft folder's tokenizer cannot be read ({_one_line(err, 120)}); its ids are taken as the target's"
    if own.get_vocab() != tokenizer.get_vocab():
        return ("note: the draft's tokenizer differs from the target's; its rows are read as target ids (still "
                "lossless, but few drafts will be accepted): give a draft trained with the target's tokenizer")
    return None


def stop_token_ids(model: Any, tokenizer: Any = None) -> list[int]:
    """The stop tokens a decode of ``model`` should honour, ascending: the ids of its
    ``generation_config.eos_token_id`` (an int or a list, as transformers allows; Llama 3 lists
    three) and the tokenizer's ``eos_token_id``, whichever are set.  ``[]`` when neither is.
    """
    found: set[int] = set()
    config = getattr(model, "generation_config", None)
    for value in (getattr(config, "eos_token_id", None), getattr(tokenizer, "eos_token_id", None)):
        if value is None:
            continue
        if isinstance(value, torch.Tensor):
            value = value.tolist()
        found.update(int(v) for v in (value if isinstance(value, (list, tuple)) else [value]))
    return sorted(found)
