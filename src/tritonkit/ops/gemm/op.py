"""scaled_linear: the public function, a forward-only custom op (``tritonkit::scaled_linear``) that torch.compile
traces and CUDA graphs capture."""

from __future__ import annotations

import torch

from tritonkit._core.autograd import inference_op
from tritonkit.ops.gemm.launch import check_scaled_linear, scaled_linear_fake, scaled_linear_fwd

scaled_linear_op = inference_op("scaled_linear", launcher=scaled_linear_fwd, fake=scaled_linear_fake)


def scaled_linear(
    x_q: torch.Tensor,
    w_q: torch.Tensor,
    x_scale: torch.Tensor | None,
    w_scale: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
    check_inputs: bool | None = None,
) -> torch.Tensor:
    """dequantize(x_q) @ dequantize(w_q).T + bias in one kernel, in F.linear's layout: x (..., K), w (N, K).

    - int8 x int8 or float8 x float8 (e4m3, e5m2) codes, as :func:`quantize` makes them, with x scales per tensor
      (()), row ((..., 1)) or 1 x G group ((..., ceil(K / G))) and w scales per tensor, row ((N, 1)), 1 x G group
      ((N, ceil(K / G))) or G x G block ((ceil(N / G), ceil(K / G))); groups and blocks of one size G.
    - Weight-only: x in bf16, fp16 or fp32 and ``x_scale=None``; w's codes are converted in the kernel.
    - Scales that do not vary along K multiply each output once; group and block scales multiply each K step's
      partial sum. fp32 accumulation (int8 products in int32). Returns (..., N) in ``out_dtype``.
    - Non-finite scales raise ValueError where reading them costs no synchronisation (CPU tensors), or with
      ``check_inputs=True`` or TRITONKIT_DEBUG=1. Forward only (inference).

    Example: ``y = tk.ops.scaled_linear(xq, wq, x_scale, w_scale)`` with ``xq, x_scale = tk.ops.quantize(x,
    torch.float8_e4m3fn)`` and ``wq, w_scale = tk.ops.quantize(w, torch.float8_e4m3fn)``.
    """
    if torch.is_grad_enabled() and isinstance(x_q, torch.Tensor) and x_q.requires_grad:
        raise ValueError("scaled_linear is forward only (inference), but x_q requires grad; call it under "
                         "torch.no_grad()")  # fmt: skip
    check_scaled_linear(x_q, w_q, x_scale, w_scale, bias, out_dtype, check_inputs)
    return scaled_linear_op(x_q, w_q, x_scale, w_scale, bias, out_dtype)
