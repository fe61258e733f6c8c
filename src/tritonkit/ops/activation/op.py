"""gelu, silu, swiglu and geglu: the public functions, their autograd built by the one factory."""

from __future__ import annotations

import torch

from tritonkit._core.autograd import differentiable_op
from tritonkit.ops.activation.kernels import SILU
from tritonkit.ops.activation.launch import (
    activation_bwd,
    activation_fake,
    activation_fwd,
    check_activation_args,
    check_gated_args,
    gated_bwd,
    gated_bwd_fake,
    gated_fwd,
    gated_fwd_fake,
    gelu_act,
)


def _save_act(ctx, inputs, outputs):
    x, act = inputs
    ctx.save_for_backward(x)
    ctx.act = act


def _activation_gradients(ctx, grad_outputs, backward):
    (x,) = ctx.saved_tensors
    return (backward(grad_outputs[0], x, ctx.act),)


activation_op = differentiable_op(
    "activation",
    forward=activation_fwd,
    forward_fake=activation_fake,
    backward=activation_bwd,
    backward_fake=activation_fake,
    save=_save_act,
    gradients=_activation_gradients,
)


def _save_gated(ctx, inputs, outputs):
    gate, up, act = inputs
    ctx.save_for_backward(gate, up)
    ctx.act = act


def _gated_gradients(ctx, grad_outputs, backward):
    gate, up = ctx.saved_tensors
    return backward(grad_outputs[0], gate, up, ctx.act)


gated_op = differentiable_op(
    "gated",
    forward=gated_fwd,
    forward_fake=gated_fwd_fake,
    backward=gated_bwd,
    backward_fake=gated_bwd_fake,
    save=_save_gated,
    gradients=_gated_gradients,
)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """SwiGLU: ``silu(gate) * up``, one pass. gate and up of one shape and floating dtype, any strides;
    differentiable in both. Example: ``h = tk.ops.swiglu(x @ w_gate.T, x @ w_up.T)``."""
    check_gated_args("swiglu", gate, up)
    return gated_op(gate, up, SILU)


def geglu(gate: torch.Tensor, up: torch.Tensor, approximate: str = "tanh") -> torch.Tensor:
    """GeGLU: ``gelu(gate, approximate) * up``, one pass; approximate "tanh" (default) or "none"."""
    act = gelu_act(approximate)
    check_gated_args("geglu", gate, up)
    return gated_op(gate, up, act)


def gelu(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """``torch.nn.functional.gelu(x, approximate=...)``, approximate "none" (erf) or "tanh".

    Any shape and strides, fp32/fp16/bf16, differentiable. Example: ``h = tk.ops.gelu(x, approximate="tanh")``.
    """
    act = gelu_act(approximate)
    check_activation_args(x)
    return activation_op(x, act)


def silu(x: torch.Tensor) -> torch.Tensor:
    """``torch.nn.functional.silu(x)`` = x * sigmoid(x). Any shape and strides, differentiable."""
    check_activation_args(x)
    return activation_op(x, SILU)
