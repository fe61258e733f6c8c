"""softmax and log_softmax: the public functions, their autograd built by the one factory."""

from __future__ import annotations

import functools

import torch

from tritonkit._core.autograd import differentiable_op
from tritonkit._core.layout import as_rows
from tritonkit.ops.row_softmax.launch import (
    check_softmax_args,
    softmax_bwd,
    softmax_bwd_fake,
    softmax_fwd,
    softmax_fwd_fake,
)


def _save(ctx, inputs, outputs):
    x, log = inputs
    ctx.save_for_backward(x, outputs[1])
    ctx.log = log


def _gradients(ctx, grad_outputs, backward):
    dy = grad_outputs[0]
    if dy is None:  # only lse was used downstream, and it carries no gradient
        return (None,)
    x, lse = ctx.saved_tensors
    return (backward(as_rows(dy), x, lse, ctx.log),)


softmax_op = differentiable_op(
    "softmax",
    forward=softmax_fwd,
    forward_fake=softmax_fwd_fake,
    backward=softmax_bwd,
    backward_fake=softmax_bwd_fake,
    save=_save,
    gradients=_gradients,
    non_differentiable=(1,),
    # Where no gradient is needed: without the backward's lse.
    inference=functools.partial(softmax_fwd, store_lse=False),
)


def _softmax(name: str, x: torch.Tensor, dim: int, log: bool) -> torch.Tensor:
    check_softmax_args(name, x, dim)
    ndim = max(x.dim(), 1)
    # Only the views that change something: each one is an autograd node, forward and backward.
    last = dim % ndim == ndim - 1
    moved = x.reshape(1) if x.dim() == 0 else x if last else x.movedim(dim, -1)
    rows = as_rows(moved)
    y, _ = softmax_op(rows, log)
    if y.shape != moved.shape:
        y = y.view(moved.shape)
    return y.view(x.shape) if x.dim() == 0 else y if last else y.movedim(-1, dim)


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``torch.softmax(x, dim)``: exp(x - max) / sum(exp(x - max)) along ``dim``, computed in fp32.

    Any shape and strides, fp32/fp16/bf16; -inf entries are zero, fully -inf rows NaN (as torch).
    Differentiable. Example: ``p = tk.ops.softmax(scores, dim=-1)``.
    """
    return _softmax("softmax", x, dim, log=False)


def log_softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``torch.log_softmax(x, dim)``: x - max - log(sum(exp(x - max))) along ``dim``, computed in fp32.

    Same shapes, dtypes and masking behaviour as :func:`softmax`. Differentiable.
    """
    return _softmax("log_softmax", x, dim, log=True)
