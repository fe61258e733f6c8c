"""rms_norm and layer_norm, fused with a residual add: the public functions, their autograd built by the one factory.

Semantics follow the fused add+norm of mamba_ssm's ``rms_norm_fn`` / ``layer_norm_fn``: ``h = x + residual`` (when
given), ``y = normalize(h) * (offset + weight) + bias``; with ``prenorm=True`` the call returns ``(y, h)``, ``h`` in
fp32 when ``residual_in_fp32=True``. With a residual, one gradient tensor serves x and the residual when their dtypes
agree.
"""

from __future__ import annotations

import functools

import torch

from tritonkit._core.autograd import differentiable_op
from tritonkit._core.distributed import local_shards, row_axes
from tritonkit._core.layout import as_rows
from tritonkit.ops.norm.launch import check_norm_args, norm_bwd, norm_bwd_fake, norm_fwd, norm_fwd_fake, shares_dres


def _save(ctx, inputs, outputs):
    x, weight, bias, residual, _eps, offset, is_rms, store_h, _h_fp32 = inputs
    _, h, mean, rstd = outputs
    # With prenorm, a residual and everything in fp32, the returned h is exactly the x + residual the forward
    # normalised: the backward reads it (one tensor) instead of x and the residual (two). A 16-bit h is rounded, and
    # reading it failed the float64 check on dweight, so there the backward sums x + residual again.
    ctx.reuse_h = store_h and residual is not None and x.dtype == residual.dtype == h.dtype == torch.float32
    ctx.save_for_backward(h if ctx.reuse_h else x, weight, None if ctx.reuse_h else residual,
                          None if is_rms else mean, rstd)  # fmt: skip
    ctx.offset, ctx.is_rms, ctx.has_bias, ctx.store_h = offset, is_rms, bias is not None, store_h
    ctx.has_residual = residual is not None


def _gradients(ctx, grad_outputs, backward):
    """(dx, dweight, dbias, dresidual), None where an input has none."""
    dy, dh = grad_outputs[0], grad_outputs[1]
    x, weight, residual, mean, rstd = ctx.saved_tensors  # x is h (and residual None) with ctx.reuse_h
    if dy is None:  # only h was used downstream
        dy = torch.zeros_like(x)
    dy = as_rows(dy)  # an expanded (stride-0) gradient from y.sum() is materialised here
    dh = as_rows(dh) if ctx.store_h and dh is not None else None
    dx, dres, dw, db = backward(dy, dh, x, weight, residual, mean, rstd, ctx.offset, ctx.is_rms, ctx.has_bias)
    if ctx.reuse_h or shares_dres(x, residual):
        dres = dx
    return (dx, dw if weight is not None else None, db if ctx.has_bias else None,
            dres if ctx.has_residual else None)  # fmt: skip


norm_op = differentiable_op(
    "norm",
    forward=norm_fwd,
    forward_fake=norm_fwd_fake,
    backward=norm_bwd,
    backward_fake=norm_bwd_fake,
    save=_save,
    gradients=_gradients,
    non_differentiable=(2, 3),  # mean and rstd
    # Where no gradient is needed: without the backward's statistics.
    inference=functools.partial(norm_fwd, store_stats=False),
)


def _norm(name, is_rms, x, weight, bias, residual, eps, prenorm, residual_in_fp32, offset):
    check_norm_args(name, x, weight, bias, residual, eps, offset)
    shape = x.shape
    # The kernels read weight and bias with unit stride: a strided view (w[::2]) is made dense once.
    weight = weight.contiguous() if weight is not None else None
    bias = bias.contiguous() if bias is not None else None
    rows, residual_rows = as_rows(x), as_rows(residual)
    y, h, _, _ = norm_op(rows, weight, bias, residual_rows, float(eps), float(offset), is_rms, bool(prenorm),
                         bool(residual_in_fp32))  # fmt: skip
    if y.shape != shape:  # a view only where it changes something: each is an autograd node
        y, h = y.view(shape), (h.view(shape) if prenorm else h)
    return (y, h) if prenorm else y


# DTensor inputs: rows split across ranks run on each rank's rows (docs/distributed.md); the features stay whole.
_SHARDS = dict(axes=row_axes(("x", "residual"), ("weight", "bias")), whole=("features",), outputs=("x",))


@local_shards("rms_norm", **_SHARDS)
def rms_norm(x, weight, bias=None, residual=None, eps=1e-6, prenorm=False, residual_in_fp32=False, offset=0.0):
    """RMSNorm of the last dimension, fused with a residual add.

    ``h = x + residual``; ``y = h / sqrt(mean(h^2) + eps) * (offset + weight) + bias``. x: (..., N)
    in fp32/fp16/bf16, weight and bias: (N,) or None, residual: x's shape or None. Returns ``y``
    (x's dtype), or ``(y, h)`` with ``prenorm=True`` (h in fp32 with ``residual_in_fp32=True``, else
    in the residual's dtype, or x's when there is none). Differentiable in x, weight, bias, residual.

    Example: ``y, h = tk.ops.rms_norm(x, w, residual=h, prenorm=True, residual_in_fp32=True)``.
    """
    return _norm("rms_norm", True, x, weight, bias, residual, eps, prenorm, residual_in_fp32, offset)


@local_shards("layer_norm", **_SHARDS)
def layer_norm(x, weight, bias, residual=None, eps=1e-5, prenorm=False, residual_in_fp32=False):
    """LayerNorm of the last dimension, fused with a residual add.

    ``h = x + residual``; ``y = (h - mean(h)) / sqrt(var(h) + eps) * weight + bias`` (biased
    variance, as torch). Shapes, dtypes and ``prenorm``/``residual_in_fp32`` as :func:`rms_norm`;
    weight and bias may be None.

    Example: ``y = tk.ops.layer_norm(x, ln.weight, ln.bias)``.
    """
    return _norm("layer_norm", False, x, weight, bias, residual, eps, prenorm, residual_in_fp32, 0.0)
