"""nf4_linear and int4_linear: the public functions, their autograd (the input's and the bias's gradients; the 4-bit
weight is frozen) built by the one factory, as torch custom ops that torch.compile traces."""

from __future__ import annotations

import math

import torch

from tritonkit._core.autograd import differentiable_op
from tritonkit._core.fourbit import NF4State
from tritonkit.ops.fourbit.launch import (
    CheckedWeight,
    check_int4_linear,
    check_nf4_linear,
    check_x_with_weight,
    int4_linear_bwd,
    int4_linear_bwd_fake,
    int4_linear_fwd,
    int4_linear_fwd_fake,
    nf4_arguments,
    nf4_linear_bwd,
    nf4_linear_bwd_fake,
    nf4_linear_fwd,
    nf4_linear_fwd_fake,
)


def _save(ctx, inputs, outputs):
    """The weight's tensors (the frozen W the input gradient multiplies by) and its sizes."""
    _, bias, *weight = inputs
    tensors = [t for t in weight if isinstance(t, torch.Tensor) or t is None]
    ctx.save_for_backward(*tensors)
    ctx.sizes = weight[len(tensors) :]
    ctx.has_bias = bias is not None


def _gradients(ctx, grad_outputs, backward):
    """(dx, dbias), None where not needed."""
    dy = grad_outputs[0]
    if dy is None:  # y was not used: no gradient flows
        return ()
    needs = (ctx.needs_input_grad[0], ctx.needs_input_grad[1] and ctx.has_bias)
    dx, dbias = backward(dy, *ctx.saved_tensors, *ctx.sizes, *needs)
    return (dx if needs[0] else None, dbias if needs[1] else None)


nf4_linear_op = differentiable_op("nf4_linear", forward=nf4_linear_fwd, forward_fake=nf4_linear_fwd_fake,
                                  backward=nf4_linear_bwd, backward_fake=nf4_linear_bwd_fake, save=_save,
                                  gradients=_gradients)  # fmt: skip
int4_linear_op = differentiable_op("int4_linear", forward=int4_linear_fwd, forward_fake=int4_linear_fwd_fake,
                                   backward=int4_linear_bwd, backward_fake=int4_linear_bwd_fake, save=_save,
                                   gradients=_gradients)  # fmt: skip


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(math.prod(x.shape[:-1]), x.shape[-1])  # not -1: K may be 0


def nf4_linear(
    x: torch.Tensor, packed: torch.Tensor, state: NF4State, *, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``x @ W.T + bias`` for a weight W (N, K) in bitsandbytes' NF4 format, dequantized in registers: the result of
    ``F.linear(x, tk.ops.nf4_dequantize(packed, state, dtype=x.dtype), bias)`` without the full-precision weight.

    - x: (..., K), fp32, fp16 or bf16, any strides; ``packed`` and ``state`` from :func:`nf4_quantize` (or
      bitsandbytes' ``Params4bit`` data and ``NF4State.from_bitsandbytes``) for a 2-D weight; any K, block size and
      double quantization; bias (N,) in x's dtype or None. Returns (..., N) in x's dtype.
    - Each weight value is dequantized in fp32 and rounded to x's dtype (as nf4_dequantize would give it), the
      products summed in fp32 (tensor cores), rounded once; but one row of x (a decoding step) with K a multiple of
      the block size multiplies by the exact weight: each block's products summed in fp32, then times its absmax
      (closer to the quantized model, and within the output's rounding of the rounded weight's product). Few rows
      (M <= 16, decoding) split K across programs and add the splits' partial sums in a fixed order (deterministic);
      from 17 rows the weight is dequantized once into x's dtype (a temporary of N x K) and multiplied on cuBLAS
      with fp32 sums, as bitsandbytes does.
    - Differentiable in x and bias; the weight is frozen, and a state tensor that requires grad is refused.

    Example: ``y = tk.ops.nf4_linear(x, *tk.ops.nf4_quantize(linear.weight.detach(), double_quant=True))``.
    """
    check_nf4_linear(x, packed, state, bias)
    y = nf4_linear_op(_rows(x), bias, *nf4_arguments(packed, state))
    return y.view(*x.shape[:-1], state.shape[0])


def int4_linear(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    *,
    group_size: int = 128,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """``x @ W.T + bias`` for a weight W (N, K) in grouped INT4 codes (:func:`int4_quantize`'s, or a converted
    AWQ/GPTQ checkpoint's), dequantized in registers: ``F.linear(x, tk.ops.int4_dequantize(qweight, scales, zeros,
    group_size=group_size, dtype=x.dtype), bias)`` without the full-precision weight.

    - x: (..., K) with K = 2 * qweight.shape[1], fp32, fp16 or bf16, any strides; qweight uint8 (N, K / 2), scales
      fp32 and zeros uint8 (N, ceil(K / group_size)); bias (N,) in x's dtype or None. Returns (..., N).
    - Schedules, precision and gradients as :func:`nf4_linear`'s: one row of x multiplies by the exact weight, y =
      sum over groups of scale * sum x (q - zero) in fp32, each group's sum scaled once (codes that can be read as
      int32 words, K a multiple of 8 and rows 4-byte aligned, take a kernel of their own).

    Example: ``y = tk.ops.int4_linear(x, *tk.ops.int4_quantize(linear.weight.detach()), group_size=128)``.
    """
    check_int4_linear(x, qweight, scales, zeros, group_size, bias)
    y = int4_linear_op(_rows(x), bias, qweight, scales, zeros, group_size)
    return y.view(*x.shape[:-1], qweight.shape[0])


def linear_4bit(x: torch.Tensor, weight: CheckedWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """nf4_linear or int4_linear on a weight checked once (launch.checked_nf4_weight / checked_int4_weight): the same
    op and result, with x and the bias checked per call and the weight not (tk.nn.Linear4bit's path: its codes are
    checked when they change, not every step)."""
    check_x_with_weight(x, weight, bias)
    op = nf4_linear_op if weight.format == "nf4" else int4_linear_op
    y = op(_rows(x), bias, *weight.arguments)
    # Rows in, the op's own output out (not a view of it): an adapter's in-place addmm_ on it then costs autograd no
    # CopySlices node.
    return y if x.dim() == 2 else y.view(*x.shape[:-1], weight.shape[0])
