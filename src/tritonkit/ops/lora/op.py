"""lora_linear: the public function, its autograd built by the one factory."""

from __future__ import annotations

import math

import torch

from tritonkit._core.autograd import differentiable_op, needed
from tritonkit.ops.lora.launch import check_lora_args, lora_bwd, lora_bwd_fake, lora_fwd, lora_fwd_fake


def _save(ctx, inputs, outputs):
    x, weight, lora_a, lora_b, bias, scale = inputs
    ctx.save_for_backward(x, weight, lora_a, lora_b, outputs[1])
    ctx.scale, ctx.has_bias = scale, bias is not None


def _gradients(ctx, grad_outputs, backward):
    """(dx, dweight, dlora_a, dlora_b, dbias), None where not needed."""
    dy = grad_outputs[0]
    if dy is None:  # y was not used: no gradient flows
        return ()
    x, weight, lora_a, lora_b, xa = ctx.saved_tensors
    needs = (*ctx.needs_input_grad[:4], ctx.needs_input_grad[4] and ctx.has_bias)
    grads = backward(dy, x, weight, lora_a, lora_b, xa, ctx.scale, *needs)
    return needed(grads, needs)


lora_op = differentiable_op(
    "lora",
    forward=lora_fwd,
    forward_fake=lora_fwd_fake,
    backward=lora_bwd,
    backward_fake=lora_bwd_fake,
    save=_save,
    gradients=_gradients,
    # x A^T is internal, saved for the backward; no gradient flows from it.
    non_differentiable=(1,),
)


def lora_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    lora_a: torch.Tensor,
    lora_b: torch.Tensor,
    scale: float,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """``x W^T + scale * (x A^T) B^T + bias``: a linear layer with a LoRA adapter, fused.

    x: (..., K), any leading shape and strides; weight: (N, K) as nn.Linear's; lora_a: (r, K) and
    lora_b: (N, r) as PEFT's lora_A / lora_B weights, 1 <= r <= 128; bias: (N,) or None; scale: a
    Python number (PEFT's lora_alpha / r). Returns (..., N) in x's dtype.

    Dtypes: fp32, fp16 or bf16, and every tensor must have x's dtype (TypeError naming the one that
    differs). Adapters kept in fp32 over a 16-bit model are cast to the compute dtype first, as
    torch.autocast does for nn.Linear; their fp32 master copies stay with the optimizer.

    Differentiable in x, weight, lora_a, lora_b and bias; a weight that does not require grad (a
    frozen base model) gets no dW GEMM. The forward and dx are fused Triton kernels; dA, dB, dW and
    dbias are torch matmuls (cuBLAS), see the module docstring. fp32 inputs use TF32 only when
    ``torch.get_float32_matmul_precision()`` allows it, like torch.matmul.

    Example: ``y = tk.ops.lora_linear(x, base.weight, lora_A.weight, lora_B.weight, alpha / r, base.bias)``.
    """
    check_lora_args(x, weight, lora_a, lora_b, scale, bias)
    rows = x.reshape(math.prod(x.shape[:-1]), x.shape[-1])  # not -1: K may be 0
    bias = bias.contiguous() if bias is not None else None  # read with unit stride; W, A, B take strides
    y, _ = lora_op(rows, weight, lora_a, lora_b, bias, float(scale))
    return y.view(*x.shape[:-1], weight.shape[0])
