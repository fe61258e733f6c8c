"""scaled_linear and dynamic_scaled_linear: the public functions, forward-only custom ops (``tritonkit::scaled_linear``,
``tritonkit::dynamic_scaled_linear``) that torch.compile traces and CUDA graphs capture."""

from __future__ import annotations

import torch

from tritonkit._core.autograd import inference_op
from tritonkit.ops.gemm.launch import (
    check_dynamic_scaled_linear,
    check_scaled_linear,
    dynamic_scaled_linear_fake,
    dynamic_scaled_linear_fwd,
    scaled_linear_fake,
    scaled_linear_fwd,
)

scaled_linear_op = inference_op("scaled_linear", launcher=scaled_linear_fwd, fake=scaled_linear_fake)
dynamic_scaled_linear_op = inference_op(
    "dynamic_scaled_linear", launcher=dynamic_scaled_linear_fwd, fake=dynamic_scaled_linear_fake
)


def scaled_linear(
    x_q: torch.Tensor,
    w_q: torch.Tensor,
    x_scale: torch.Tensor | None,
    w_scale: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
    use_fast_accum: bool = False,
    check_inputs: bool | None = None,
) -> torch.Tensor:
    """dequantize(x_q) @ dequantize(w_q).T + bias in one kernel, in F.linear's layout: x (..., K), w (N, K).

    - int8 x int8 or float8 x float8 (e4m3, e5m2) codes, as :func:`quantize` makes them, with x scales per tensor
      (()), row ((..., 1)) or 1 x G group ((..., ceil(K / G))) and w scales per tensor, row ((N, 1)), 1 x G group
      ((N, ceil(K / G))) or G x G block ((ceil(N / G), ceil(K / G))); groups and blocks of one size G.
    - Weight-only: x in bf16, fp16 or fp32 and ``x_scale=None``; w's codes are converted in the kernel.
    - Scales that do not vary along K multiply each output once; group and block scales multiply each K step's
      partial sum. fp32 accumulation (int8 products in int32). Returns (..., N) in ``out_dtype``.
    - ``use_fast_accum`` (torch._scaled_mm's name): float8 codes with tensor or row scales let Hopper's tensor cores
      sum the products over all of K in their shortened format instead of adding each K step's sum in fp32: faster,
      and the outputs move by about 2-3e-3 of their rms at K 4096-8192 (docs/kernels/gemm.md). int8 sums are exact
      in int32 either way, and group or block scales scale each K step's sum apart, so those calls (and weight-only
      ones) ignore it, as do GPUs before Hopper and the interpreter, whose sums are fp32 throughout.
    - Non-finite scales raise ValueError where reading them costs no synchronisation (CPU tensors), or with
      ``check_inputs=True`` or TRITONKIT_DEBUG=1. Forward only (inference).

    Example: ``y = tk.ops.scaled_linear(xq, wq, x_scale, w_scale)`` with ``xq, x_scale = tk.ops.quantize(x,
    torch.float8_e4m3fn)`` and ``wq, w_scale = tk.ops.quantize(w, torch.float8_e4m3fn)``.
    """
    if torch.is_grad_enabled() and isinstance(x_q, torch.Tensor) and x_q.requires_grad:
        raise ValueError("scaled_linear is forward only (inference), but x_q requires grad; call it under "
                         "torch.no_grad()")  # fmt: skip
    check_scaled_linear(x_q, w_q, x_scale, w_scale, bias, out_dtype, use_fast_accum, check_inputs)
    return scaled_linear_op(x_q, w_q, x_scale, w_scale, bias, out_dtype, use_fast_accum)


def dynamic_scaled_linear(
    x: torch.Tensor,
    w_q: torch.Tensor,
    w_scale: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    group_size: int = 128,
    x_dtype: torch.dtype | None = None,
    check_inputs: bool | None = None,
) -> torch.Tensor:
    """x @ dequantize(w_q).T + bias with x quantized on the fly to ``x_dtype`` (default w_q's dtype: int8 with int8
    weights, float8 e4m3 or e5m2 with float8 weights) in 1 x ``group_size`` groups along K, inside the GEMM: W8A8
    with per-token-group activation scales (DeepSeek-V3's 1 x 128) in one kernel, no codes or scales of x written to
    memory.

    Equal to ``scaled_linear(*quantize(x, x_dtype, granularity="group", block_size=group_size), w_q, w_scale)``:
    the same codes and scales, each group's partial sum scaled before it is added. x (..., K) in bf16, fp16 or fp32;
    w_q (N, K) with w_scale per tensor, row, 1 x group_size group or group_size x group_size block; group_size 32,
    64 or 128. Returns (..., N) in ``out_dtype`` (default: x's dtype). Forward only (inference).

    Slower than those two launches today: 0.18 to 0.43 times their speed at M 16 to 8192 (H200, N = K = 7168, e4m3,
    benchmarks/dynamic_linear.py), as the in-loop quantization holds up the tensor cores every K step; prefer
    ``quantize`` then ``scaled_linear`` (as ``tk.nn.QuantizedLinear`` does) where speed matters.

    Example: ``wq, w_scale = tk.ops.quantize(w, torch.float8_e4m3fn, granularity="block")`` once, then
    ``y = tk.ops.dynamic_scaled_linear(x, wq, w_scale)`` per call.
    """
    if torch.is_grad_enabled() and isinstance(x, torch.Tensor) and x.requires_grad:
        raise ValueError("dynamic_scaled_linear is forward only (inference), but x requires grad; call it under "
                         "torch.no_grad()")  # fmt: skip
    out_dtype = x.dtype if out_dtype is None and isinstance(x, torch.Tensor) else out_dtype
    x_dtype = w_q.dtype if x_dtype is None and isinstance(w_q, torch.Tensor) else x_dtype
    check_dynamic_scaled_linear(x, w_q, w_scale, bias, out_dtype, group_size, x_dtype, check_inputs)
    return dynamic_scaled_linear_op(x, w_q, w_scale, bias, out_dtype, group_size, x_dtype)
