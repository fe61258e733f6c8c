"""rms_norm and layer_norm, fused with a residual add: the public functions, their autograd built by the one factory.

Semantics follow the fused add+norm of mamba_ssm's ``rms_norm_fn`` / ``layer_norm_fn``: ``h = x + residual`` (when
given), ``y = normalize(h) * (offset + weight) + bias``; with ``prenorm=True`` the call returns ``(y, h)``, ``h`` in
fp32 when ``residual_in_fp32=True``. With a residual, one gradient tensor serves x and the residual when their dtypes
agree. The options of flash-attention's ``layer_norm_fn`` (dropout_p, rowscale, x1, weight1, bias1) run as an op of
their own (norm_options_op), so that a call without them takes the plain op, unchanged.
"""

from __future__ import annotations

import functools

import torch

from tritonkit._core.autograd import differentiable_op
from tritonkit._core.distributed import local_shards, row_axes
from tritonkit._core.dropout import seed_tensor
from tritonkit._core.layout import as_rows
from tritonkit.ops.norm.launch import (
    check_norm_args,
    check_norm_options,
    norm_bwd,
    norm_bwd_fake,
    norm_fwd,
    norm_fwd_fake,
    norm_options_bwd,
    norm_options_bwd_fake,
    norm_options_fwd,
    norm_options_fwd_fake,
    separate_grad,
    shares_dres,
)


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


def _save_options(ctx, inputs, outputs):
    x, x1, weight, weight1, bias, bias1, residual, rowscale, seed, _eps, offset, dropout_p, is_rms, store_h, *_ = inputs
    _, _, _, mean, rstd, _ = outputs
    # x, x1 and the residual, not h: the backward makes h again as the forward did (dropout's masks from the seed),
    # exactly, where a stored 16-bit h would be rounded.
    ctx.save_for_backward(x, x1, weight, weight1, residual, rowscale, seed, None if is_rms else mean, rstd)
    ctx.offset, ctx.dropout_p, ctx.is_rms, ctx.store_h = offset, dropout_p, is_rms, store_h
    ctx.has_bias, ctx.has_bias1 = bias is not None, bias1 is not None


def _options_gradients(ctx, grad_outputs, backward):
    """(dx, dx1, dweight, dweight1, dbias, dbias1, dresidual), None where an input has none."""
    dy, dy1, dh = grad_outputs[:3]
    x, x1, weight, weight1, residual, rowscale, seed, mean, rstd = ctx.saved_tensors
    dy = as_rows(dy) if dy is not None else torch.zeros_like(x)  # None: only y1 or h was used downstream
    if weight1 is not None:
        dy1 = as_rows(dy1) if dy1 is not None else torch.zeros_like(x)
    dh = as_rows(dh) if ctx.store_h and dh is not None else None
    dx, dx1, dres, dw, db, dw1, db1 = backward(
        dy, dy1 if weight1 is not None else None, dh, x, x1, weight, weight1, residual, rowscale, seed, mean, rstd,
        ctx.offset, ctx.dropout_p, ctx.is_rms, ctx.has_bias, ctx.has_bias1,
    )  # fmt: skip
    if not separate_grad(x1, x, ctx.dropout_p, rowscale):
        dx1 = dx
    if not separate_grad(residual, x, ctx.dropout_p, rowscale):
        dres = dx
    return (dx, dx1 if x1 is not None else None, dw if weight is not None else None,
            dw1 if weight1 is not None else None, db if ctx.has_bias else None, db1 if ctx.has_bias1 else None,
            dres if residual is not None else None)  # fmt: skip


norm_options_op = differentiable_op(
    "norm_options",
    forward=norm_options_fwd,
    forward_fake=norm_options_fwd_fake,
    backward=norm_options_bwd,
    backward_fake=norm_options_bwd_fake,
    save=_save_options,
    gradients=_options_gradients,
    non_differentiable=(3, 4, 5),  # mean, rstd and the dropout masks
    inference=functools.partial(norm_options_fwd, store_stats=False),
)


def _shaped(t: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """``t`` viewed as ``shape``: a view only where it changes something, since each is an autograd node."""
    return t if t.shape == shape else t.view(shape)


def _norm(name, is_rms, x, weight, bias, residual, eps, prenorm, residual_in_fp32, offset, x1, weight1, bias1,
          dropout_p, rowscale, return_dropout_mask, dropout_seed):  # fmt: skip
    check_norm_args(name, x, weight, bias, residual, eps, offset)
    if (x1 is not None or weight1 is not None or bias1 is not None or rowscale is not None or dropout_p != 0
            or return_dropout_mask is not False):  # fmt: skip
        options = (x1, weight1, bias1, dropout_p, rowscale, return_dropout_mask, dropout_seed)
        return _norm_with_options(name, is_rms, x, weight, bias, residual, eps, prenorm, residual_in_fp32, offset,
                                  *options)  # fmt: skip
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


def _norm_with_options(name, is_rms, x, weight, bias, residual, eps, prenorm, residual_in_fp32, offset, x1, weight1,
                       bias1, dropout_p, rowscale, return_dropout_mask, dropout_seed):  # fmt: skip
    """flash-attention's return convention: y, then y1 with weight1, then h with prenorm, then with
    return_dropout_mask the masks of x and x1 (each None where there is none)."""
    check_norm_options(name, x, x1, weight1, bias1, rowscale, dropout_p, dropout_seed, return_dropout_mask)
    shape = x.shape
    weight, weight1, bias, bias1 = (t.contiguous() if t is not None else None for t in (weight, weight1, bias, bias1))
    rowscale = rowscale.reshape(-1).contiguous() if rowscale is not None else None
    dropout_p = float(dropout_p)
    seed = seed_tensor(dropout_seed, x.device) if dropout_p > 0 else None
    store_keep = return_dropout_mask and dropout_p > 0
    y, y1, h, _, _, keep = norm_options_op(
        as_rows(x), as_rows(x1), weight, weight1, bias, bias1, as_rows(residual), rowscale, seed, float(eps),
        float(offset), dropout_p, is_rms, bool(prenorm), bool(residual_in_fp32), store_keep,
    )  # fmt: skip
    outputs = [_shaped(y, shape)]
    if weight1 is not None:
        outputs.append(_shaped(y1, shape))
    if prenorm:
        outputs.append(_shaped(h, shape))
    if return_dropout_mask:
        outputs.append(keep[0].view(shape) if store_keep else None)
        outputs.append(keep[1].view(shape) if store_keep and x1 is not None else None)
    return outputs[0] if len(outputs) == 1 else tuple(outputs)


def _norm_axes(arguments) -> dict:
    """x, residual and x1 over (rows..., features), the weights and biases over the features, rowscale over the rows."""
    axes = row_axes(("x", "residual", "x1"), ("weight", "bias", "weight1", "bias1"))(arguments)
    return {**axes, "rowscale": axes["x"][:-1]}


# DTensor inputs: rows split across ranks run on each rank's rows (docs/distributed.md); the features stay whole.
_SHARDS = dict(axes=_norm_axes, whole=("features",), outputs=("x",))


@local_shards("rms_norm", **_SHARDS)
def rms_norm(x, weight, bias=None, residual=None, eps=1e-6, prenorm=False, residual_in_fp32=False, offset=0.0, *,
             x1=None, weight1=None, bias1=None, dropout_p=0.0, rowscale=None, return_dropout_mask=False,
             dropout_seed=None):  # fmt: skip
    """RMSNorm of the last dimension, fused with a residual add.

    ``h = x + residual``; ``y = h / sqrt(mean(h^2) + eps) * (offset + weight) + bias``. x: (..., N)
    in fp32/fp16/bf16, weight and bias: (N,) or None, residual: x's shape or None. Returns ``y``
    (x's dtype), or ``(y, h)`` with ``prenorm=True`` (h in fp32 with ``residual_in_fp32=True``, else
    in the residual's dtype, or x's when there is none). Differentiable in x, weight, bias, residual.

    The options of flash-attention's ``layer_norm_fn``, with its semantics and return convention:
    ``h = dropout(rowscale * x) + dropout(x1) + residual``, where dropout keeps each element with probability
    ``1 - dropout_p`` and scales it by ``1 / (1 - dropout_p)`` (whenever ``dropout_p > 0``: a module passes 0 in
    eval mode), ``rowscale`` (x's leading shape, no gradient) scales each row of x, and ``x1`` (x's shape) is a
    second input added in; ``weight1`` (and ``bias1``) make a second output ``y1 = normalize(h) * (offset +
    weight1) + bias1`` from the same normalised rows. The call returns ``y``, then ``y1`` with weight1, then ``h``
    with prenorm, then with ``return_dropout_mask=True`` the bool keep masks of x and x1 (x's shape; None where
    there is none). rowscale and x1 exclude each other. Dropout's mask is a fixed function of a 64-bit seed and each
    element's position (Philox4x32-7; tritonkit._core.dropout.keep_mask computes it in torch): ``dropout_seed``
    (an int in [0, 2**63)) fixes it, else the seed is drawn from torch's generator of x's device, so
    ``torch.manual_seed`` makes it reproducible; the backward recomputes the mask from the seed. With these options
    the rows may be at most 16384 wide.

    Example: ``y, h = tk.ops.rms_norm(x, w, residual=h, prenorm=True, residual_in_fp32=True)``.
    """
    return _norm("rms_norm", True, x, weight, bias, residual, eps, prenorm, residual_in_fp32, offset, x1, weight1,
                 bias1, dropout_p, rowscale, return_dropout_mask, dropout_seed)  # fmt: skip


@local_shards("layer_norm", **_SHARDS)
def layer_norm(x, weight, bias, residual=None, eps=1e-5, prenorm=False, residual_in_fp32=False, *, x1=None,
               weight1=None, bias1=None, dropout_p=0.0, rowscale=None, return_dropout_mask=False,
               dropout_seed=None):  # fmt: skip
    """LayerNorm of the last dimension, fused with a residual add.

    ``h = x + residual``; ``y = (h - mean(h)) / sqrt(var(h) + eps) * weight + bias`` (biased
    variance, as torch). Shapes, dtypes and ``prenorm``/``residual_in_fp32`` as :func:`rms_norm`;
    weight and bias may be None. The options (x1, weight1, bias1, dropout_p, rowscale, return_dropout_mask,
    dropout_seed) as :func:`rms_norm`'s.

    Example: ``y = tk.ops.layer_norm(x, ln.weight, ln.bias)``.
    """
    return _norm("layer_norm", False, x, weight, bias, residual, eps, prenorm, residual_in_fp32, 0.0, x1, weight1,
                 bias1, dropout_p, rowscale, return_dropout_mask, dropout_seed)  # fmt: skip
