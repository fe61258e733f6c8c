"""rms_norm_gated: mamba2's RMSNormGated as a public function, its autograd built by the one factory."""

from __future__ import annotations

import functools

import torch

from tritonkit._core.autograd import differentiable_op
from tritonkit._core.layout import as_rows
from tritonkit.ops.gated_norm.launch import (
    check_rms_norm_gated_args,
    rms_norm_gated_bwd,
    rms_norm_gated_bwd_fake,
    rms_norm_gated_fwd,
    rms_norm_gated_fwd_fake,
)


def _save(ctx, inputs, outputs):
    x, weight, z, group_size, norm_before_gate, _eps = inputs
    ctx.save_for_backward(x, weight, z, outputs[1])
    ctx.group_size, ctx.norm_before_gate = group_size, norm_before_gate


def _gradients(ctx, grad_outputs, backward):
    """(dx, dweight, dz), None where an input has none."""
    dy = grad_outputs[0]
    if dy is None:
        return ()
    x, weight, z, rstd = ctx.saved_tensors
    dx, dz, dw = backward(as_rows(dy), x, weight, z, rstd, ctx.group_size, ctx.norm_before_gate)
    return dx, dw, dz if z is not None else None


rms_norm_gated_op = differentiable_op(
    "rms_norm_gated",
    forward=rms_norm_gated_fwd,
    forward_fake=rms_norm_gated_fwd_fake,
    backward=rms_norm_gated_bwd,
    backward_fake=rms_norm_gated_bwd_fake,
    save=_save,
    gradients=_gradients,
    non_differentiable=(1,),  # rstd
    # Where no gradient is needed: without the backward's statistics.
    inference=functools.partial(rms_norm_gated_fwd, store_stats=False),
)


def rms_norm_gated(
    x: torch.Tensor, weight: torch.Tensor, z: torch.Tensor | None = None, *, group_size: int | None = None,
    norm_before_gate: bool = True, eps: float = 1e-6,
) -> torch.Tensor:  # fmt: skip
    """Gated RMSNorm, mamba2's ``RMSNormGated`` (mamba_ssm's ``rmsnorm_fn`` without a bias).

    With ``s = silu(z)``: ``norm_before_gate=True`` gives ``rmsnorm(x) * weight * s``, ``False`` gives
    ``rmsnorm(x * s) * weight``; without z, ``rmsnorm(x) * weight``. ``group_size`` splits the last dimension into
    groups of that many columns, each normalised on its own (mamba2's ngroups); None is one group. x: (..., N) in
    fp32/fp16/bf16, z: x's shape or None, weight: (N,); groups of at most 16384 columns. Returns y in x's dtype.
    Differentiable in x, weight and z; dweight is summed in fp32 in a fixed order (deterministic).

    Example: ``y = tk.ops.rms_norm_gated(x, norm.weight, z, group_size=d_inner // ngroups, norm_before_gate=False)``.
    """
    group_size = check_rms_norm_gated_args(x, weight, z, group_size, norm_before_gate, eps)
    y, _ = rms_norm_gated_op(as_rows(x), weight.contiguous(), as_rows(z), group_size, norm_before_gate, float(eps))
    return y if y.shape == x.shape else y.view(x.shape)
