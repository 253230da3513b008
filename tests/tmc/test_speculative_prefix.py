"""Chain verifiers as prefix sub-samplers of the target (TMC Thm 5.7 / B.10, A.29, A.31-A.32)."""

from __future__ import annotations

import numpy as np
import pytest

from tmc import asps_kernel, block_kernel, sps_kernel
from tmc.enumeration import speculative_prefix_kernel, target_tree_distribution
from tmc.order import total_variation
from tmc.prefix import check_prefix_sub_sampler, induced_distribution, self_compose_kernel
from tmc.toy import ToyModel

KERNELS = {"sps": sps_kernel, "asps": asps_kernel, "block": block_kernel}
DEPTH = 4


def _model(seed):
    return ToyModel.random(3, DEPTH, np.random.default_rng(seed), zero_prob=0.3)


@pytest.mark.parametrize("name", sorted(KERNELS))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_speculative_step_is_a_prefix_sub_sampler(name, seed):
    model = _model(seed)
    target = target_tree_distribution(model, DEPTH)
    kernel = speculative_prefix_kernel(model, 2, KERNELS[name], DEPTH)
    check = check_prefix_sub_sampler(kernel, target, tol=1e-10)
    assert check.holds, check


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_repeated_steps_converge_to_the_target_in_tv(name):
    model = _model(3)
    target = target_tree_distribution(model, DEPTH)
    step = speculative_prefix_kernel(model, 2, KERNELS[name], DEPTH)
    tvs = [
        total_variation(induced_distribution(self_compose_kernel(step, m), target.space, ()), target)
        for m in range(DEPTH + 2)
    ]
    assert tvs[0] == pytest.approx(1.0)  # P_sub^0 stops at the root
    assert all(b <= a + 1e-12 for a, b in zip(tvs, tvs[1:])), tvs  # Thm A.32: monotone
    assert tvs[DEPTH] <= 1e-12  # every step emits >= 1 token, so DEPTH steps reach the leaves


def test_biased_step_is_not_a_sub_sampler():
    # Negative control: resample from p instead of the residual after a rejection.
    def biased(ref, q_rows, p_rows):
        k = sps_kernel(ref, q_rows, p_rows)
        if len(ref):
            k[0] = k[0].sum() * np.asarray(p_rows)[0]
        return k

    model = ToyModel(2, {}, {}, np.array([0.7, 0.3]), np.array([0.4, 0.6]))
    target = target_tree_distribution(model, 3)
    check = check_prefix_sub_sampler(speculative_prefix_kernel(model, 2, biased, 3), target, tol=1e-10)
    assert not check.holds
