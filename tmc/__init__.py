"""Tree Monte Carlo core: exact kernels and samplers for lossless speculative sampling.

``p`` is always the target model and ``q`` the draft model (the TMC paper's
``P`` and ``P_ref``).  Pure numpy; importing :mod:`tmc` never imports torch.

Main entry points:

* chain verifiers — :func:`sps_kernel`, :func:`asps_kernel`,
  :func:`block_kernel` (exact ``(n + 1, V)`` output laws) and
  :func:`sps_sample`, :func:`asps_sample`, :func:`block_sample`;
* exact enumeration — :func:`chain_output_law` (averaged output law,
  expected length, completion-identity error) on a :class:`ToyModel`;
* tree distributions, the sub-distribution order and prefix samplers in
  :mod:`tmc.tree`, :mod:`tmc.order` and :mod:`tmc.prefix`.
"""

from tmc.chain import (
    asps_kernel,
    asps_sample,
    asps_sample_from_uniforms,
    block_kernel,
    block_sample,
    block_sample_from_uniforms,
    sps_kernel,
    sps_sample,
    sps_sample_from_uniforms,
)
from tmc.enumeration import ChainLaw, chain_joint_law, chain_output_law, completion_error
from tmc.toy import ToyModel, paper_toy_model

__all__ = [
    "ChainLaw",
    "ToyModel",
    "asps_kernel",
    "asps_sample",
    "asps_sample_from_uniforms",
    "block_kernel",
    "block_sample",
    "block_sample_from_uniforms",
    "chain_joint_law",
    "chain_output_law",
    "completion_error",
    "paper_toy_model",
    "sps_kernel",
    "sps_sample",
    "sps_sample_from_uniforms",
]
