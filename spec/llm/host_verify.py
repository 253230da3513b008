"""The numpy reference verifiers behind the torch interface, for rows that sit on the host.

``p`` is the target's law and ``q`` the draft's (DESIGN.md §3); ``p_rows`` / ``q_rows`` hold their rows.

:mod:`spec.llm.verify` ports every :mod:`tmc` sampler to torch, operation for
operation, and is tested equal to it on identical noise.  On the CPU the two
give the same tokens, and the numpy code is about 3x faster: a verification step
is a few dozen small operations, and a torch call costs several microseconds
of dispatch where a numpy call costs one or two (measured in the decode loop,
2-core CPU, ``V = 4096``: a 16-node Traversal step 2.4 ms in torch, 0.8 ms in
numpy; a 4-token SpS chain 1.5 ms against 0.5 ms).  So the decode loop
(:func:`spec.llm.generate.generate`, ``verify_backend``) calls these
functions by default, except for a chain drafted on a GPU, which the torch
chain verifiers keep on the device.  A tree verifier walks on the host
either way (the torch ports copy the rows there first), so trees take the
numpy walk on a GPU too; that choice rests on the CPU measurement above and
was not timed on a GPU.

Both functions return a :class:`~spec.llm.verify.Verified` with the tokens
as a CPU tensor.  The numpy samplers return the emitted tokens, not the
accepted node: :func:`verify_tree_numpy` finds the node path from the
emitted tokens (:func:`spec.tree.accepted_nodes`).  Two i.i.d. siblings may
carry the same token; the node found may then be the twin of the one the
walk accepted, with the same path of tokens and hence the same keys and
values in the KV cache, which is all the decode loop reads from it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType

import numpy as np
import torch
from numpy.typing import NDArray

from spec.llm.verify import CHAIN_METHODS, TREE_METHODS, Verified, _check_method, check_swor_enumeration
from spec.tree import accepted_nodes
from tmc.chain import asps_sample_from_uniforms, block_sample_from_uniforms, chain_sample_trusted, sps_sample_from_uniforms
from tmc.kseq import kseq_sample_from_uniforms
from tmc.multidraft import DraftTree, multidraft_sample_from_uniforms
from tmc.noise import check_uniforms
from tmc.ordered_traversal import ordered_traversal_sample_from_uniforms
from tmc.traversal import traversal_sample_from_uniforms
from tmc.validate import check_tokens

__all__ = ["NUMPY_CHAIN_SAMPLERS", "NUMPY_TREE_SAMPLERS", "verify_chain_numpy", "verify_tree_numpy"]

FloatArray = NDArray[np.float64]

#: The :mod:`tmc` sampler each chain method of :mod:`spec.llm.verify` ports: ``(tokens, q_rows, p_rows, u)``.
NUMPY_CHAIN_SAMPLERS: Mapping[str, Callable[..., list[int]]] = MappingProxyType(
    {"sps": sps_sample_from_uniforms, "asps": asps_sample_from_uniforms, "block": block_sample_from_uniforms}
)
#: The :mod:`tmc` sampler each tree method of :mod:`spec.llm.verify` ports: ``(tree, p_rows, u)``.
NUMPY_TREE_SAMPLERS: Mapping[str, Callable[..., list[int]]] = MappingProxyType(
    {
        "multidraft": multidraft_sample_from_uniforms,
        "traversal": traversal_sample_from_uniforms,
        "ordered_traversal": ordered_traversal_sample_from_uniforms,
        "kseq": kseq_sample_from_uniforms,
    }
)
assert tuple(NUMPY_CHAIN_SAMPLERS) == CHAIN_METHODS and tuple(NUMPY_TREE_SAMPLERS) == TREE_METHODS


def verify_chain_numpy(
    method: str, draft_tokens: Sequence[int], draft_probs: FloatArray | None, target_probs: FloatArray,
    uniforms: FloatArray, *, trusted: bool = False,
) -> Verified:
    """:func:`spec.llm.verify.verify_chain` by its numpy reference (same arrays; ``None`` = point masses).

    The reference validates the arrays and raises its own ``ValueError``.
    ASpS takes one uniform or ``n + 1`` and then reads the first, as the torch port does.
    ``trusted``: skip those checks (:func:`tmc.chain.chain_sample_trusted`:
    same tokens on valid input, garbage on bad input), for the decode loop,
    whose rows are softmax rows of logits it checked and whose draft tokens
    were drawn from ``draft_probs``.
    """
    sampler = NUMPY_CHAIN_SAMPLERS[_check_method(method, CHAIN_METHODS)]
    tokens = list(draft_tokens)
    if method == "asps" and np.shape(uniforms) == (len(tokens) + 1,):
        if not trusted:  # all of them checked, as the torch port does, before the first is read
            check_uniforms("uniforms", uniforms, len(tokens) + 1)
        uniforms = np.asarray(uniforms)[:1]
    if trusted:  # None: point masses, which the trusted sampler forms only where it reads them
        out = chain_sample_trusted(method, np.asarray(tokens, dtype=np.int64),
                                   None if draft_probs is None else np.asarray(draft_probs, dtype=np.float64),
                                   np.asarray(target_probs, dtype=np.float64), np.asarray(uniforms, dtype=np.float64))
    else:
        if draft_probs is None:  # a deterministic draft: each token drawn with probability 1
            p = np.asarray(target_probs)
            if p.ndim != 2:
                raise ValueError(f"target_probs must be a 2-D (n + 1, V) array, got shape {p.shape}")
            ids = check_tokens("draft_tokens", tokens, p.shape[1])
            draft_probs = np.zeros((len(ids), p.shape[1]))
            draft_probs[np.arange(len(ids)), ids] = 1.0
        out = sampler(tokens, draft_probs, target_probs, uniforms)
    n_acc = len(out) - 1
    return Verified(torch.tensor(out, dtype=torch.int64), n_acc, tuple(range(n_acc)))


def verify_tree_numpy(method: str, tree: DraftTree, target_probs: FloatArray, uniforms: FloatArray) -> Verified:
    """:func:`spec.llm.verify.verify_tree` by its numpy reference, on the builder's :class:`DraftTree`.

    ``target_probs`` ``(N + 1, V)`` and ``uniforms`` as there; the tree
    carries the tokens, parents, draw kinds and draft rows (validated when it
    was built).  The accepted nodes come from the emitted tokens
    (:func:`spec.tree.accepted_nodes`, module doc).
    """
    sampler = NUMPY_TREE_SAMPLERS[_check_method(method, TREE_METHODS)]
    if not isinstance(tree, DraftTree):
        raise ValueError(f"tree must be a tmc.DraftTree, got {type(tree).__name__}")
    check_swor_enumeration(method, tree)
    out = sampler(tree, target_probs, uniforms)
    nodes = accepted_nodes(tree, out)
    return Verified(torch.tensor(out, dtype=torch.int64), len(nodes), nodes)
