"""quantize and dequantize: the public functions, forward-only custom ops (``tritonkit::quantize``,
``tritonkit::dequantize``) that torch.compile traces and CUDA graphs capture."""

from __future__ import annotations

import torch

from tritonkit._core.autograd import inference_op
from tritonkit.ops.quant.launch import (
    check_dequantize,
    check_quantize,
    dequantize_fake,
    dequantize_fwd,
    quantize_fake,
    quantize_fwd,
)

quantize_op = inference_op("quantize", launcher=quantize_fwd, fake=quantize_fake)
dequantize_op = inference_op("dequantize", launcher=dequantize_fwd, fake=dequantize_fake)


def quantize(
    x: torch.Tensor, dtype: torch.dtype, *, granularity: str = "row", block_size: int = 128
) -> tuple[torch.Tensor, torch.Tensor]:
    """x in int8 or float8 codes with fp32 scales: (xq, scale), x ~ dequantize(xq, scale).

    - ``dtype``: torch.int8, torch.float8_e4m3fn or torch.float8_e5m2.
    - ``granularity``: one scale for the ``"tensor"`` (scale shape ()); per ``"row"`` of the last dimension
      ((..., 1)); per ``"group"`` of ``block_size`` consecutive values along it ((..., ceil(K / block_size)), the
      1 x 128 activation scales of DeepSeek-V3); per ``"block"`` of block_size x block_size of a 2-D x
      ((ceil(M / bs), ceil(K / bs)), its 128 x 128 weight scales). ``block_size``: a power of two >= 16.
    - scale = amax / qmax over the finite values of each region (qmax: 127, 448, 57344), 1 for a region of zeros;
      codes = x / scale rounded to nearest, ties to even, saturated to [-qmax, qmax] (so +-inf gives +-qmax);
      NaN gives 0 in int8 and NaN in float8.
    - x: fp32, fp16 or bf16, any shape (any strides). Forward only: x must not require grad.

    Example: ``xq, scale = tk.ops.quantize(x, torch.float8_e4m3fn, granularity="group")``.
    """
    if torch.is_grad_enabled() and isinstance(x, torch.Tensor) and x.requires_grad:
        raise ValueError("quantize has no gradient, but x requires grad; pass x.detach() or call it under "
                         "torch.no_grad()")  # fmt: skip
    check_quantize(x, dtype, granularity, block_size)
    return quantize_op(x, dtype, granularity, block_size)


def dequantize(xq: torch.Tensor, scale: torch.Tensor, *, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """xq * scale in ``dtype``, the granularity read from the scale's shape (see :func:`quantize`).

    Example: ``x = tk.ops.dequantize(xq, scale)``.
    """
    check_dequantize(xq, scale, dtype)
    return dequantize_op(xq, scale, dtype)
