"""The clip rule (slidedp.step.optimizer.clip_coefficient), the one the host updater and the device update share:
a norm at most max_grad_norm leaves the gradients as they are, a larger one scales them by
max_grad_norm / (norm + 1e-6) as torch.nn.utils.clip_grad_norm_ does, a non-finite norm skips the step, and
max_grad_norm 0 turns clipping off."""

from __future__ import annotations

import math

import pytest
import torch
from slidedp.config import OptimizerConfig
from slidedp.step.optimizer import CLIP_EPS, clip_coefficient, clips


def rule(norm: float, max_grad_norm: float) -> tuple[float, bool]:
    coef, skip = clip_coefficient(torch.tensor(norm, dtype=torch.float64), max_grad_norm)
    assert coef.dtype == torch.float64 and coef.shape == () and skip.shape == ()
    return float(coef), bool(skip)


@pytest.mark.parametrize("norm", [0.0, 1e-12, 0.3, 0.999998])
def test_a_norm_within_the_limit_leaves_the_gradients_alone(norm):
    assert rule(norm, 1.0) == (1.0, False)


@pytest.mark.parametrize("norm, max_norm", [(1.0, 1.0), (1.5, 1.0), (123.25, 0.5), (7e8, 2.0), (0.02, 0.01)])
def test_a_larger_norm_scales_by_max_over_norm_plus_eps(norm, max_norm):
    coef, skip = rule(norm, max_norm)
    assert not skip
    assert coef == max_norm / (norm + 1e-6)  # the float64 quotient, to the bit
    assert coef < 1.0  # at the limit too: the eps puts the norm just above it, as in torch


def test_the_scaled_gradients_are_torch_clip_grad_norm_s():
    gen = torch.Generator().manual_seed(3)
    grads = [torch.randn(n, generator=gen) * s for n, s in ((300, 2.0), (17, 0.5), (1000, 1.0))]
    params = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads]
    for p, g in zip(params, grads):
        p.grad = g.clone()
    torch_norm = torch.nn.utils.clip_grad_norm_(params, max_norm=1.5)
    norm = math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads))
    assert norm == pytest.approx(float(torch_norm), rel=1e-6)
    coef, skip = clip_coefficient(torch.tensor(norm, dtype=torch.float64), 1.5)
    assert not skip and float(coef) < 0.1
    for p, g in zip(params, grads):
        torch.testing.assert_close(g * coef.to(torch.float32), p.grad, rtol=2e-7, atol=0)


@pytest.mark.parametrize("norm", [math.inf, -math.inf, math.nan])
def test_a_non_finite_norm_skips_the_step(norm):
    _, skip = rule(norm, 1.0)
    assert skip is True


def test_the_rule_is_elementwise_on_the_norm_s_device_without_a_sync():
    """The device update hands it a tensor and uses both results as tensors (found_inf for the fused AdamW)."""
    norms = torch.tensor([0.5, 4.0, math.inf, math.nan], dtype=torch.float64)
    coef, skip = clip_coefficient(norms, 2.0)
    assert coef[:2].tolist() == [1.0, 2.0 / (4.0 + CLIP_EPS)]
    assert coef[2].item() == 0.0  # 2 / inf; the step is skipped anyway
    assert skip.tolist() == [False, False, True, True]


@pytest.mark.parametrize("max_norm, on", [(0.0, False), (1e-9, True), (1.0, True)])
def test_max_grad_norm_zero_turns_clipping_off(max_norm, on):
    assert clips(OptimizerConfig(max_grad_norm=max_norm)) is on
