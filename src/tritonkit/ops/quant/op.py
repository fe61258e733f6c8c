"""quantize, dequantize, nf4_quantize, nf4_dequantize, int4_quantize and int4_dequantize: the public functions,
forward-only custom ops (``tritonkit::quantize``, ...) that torch.compile traces and CUDA graphs capture."""

from __future__ import annotations

import torch

from tritonkit._core.autograd import inference_op
from tritonkit._core.checks import FLOAT_DTYPES, check_device
from tritonkit._core.fourbit import NESTED_BLOCK, NF4State, check_nf4_state, nf4_tables
from tritonkit._core.ints import cdiv
from tritonkit.ops.quant.launch import (
    check_dequantize,
    check_int4_dequantize,
    check_int4_quantize,
    check_nf4_quantize,
    check_quantize,
    dequantize_fake,
    dequantize_fwd,
    int4_dequantize_fake,
    int4_dequantize_fwd,
    int4_quantize_fake,
    int4_quantize_fwd,
    nf4_dequantize_fake,
    nf4_dequantize_fwd,
    nf4_quantize_fake,
    nf4_quantize_fwd,
    quantize_fake,
    quantize_fwd,
)

quantize_op = inference_op("quantize", launcher=quantize_fwd, fake=quantize_fake)
dequantize_op = inference_op("dequantize", launcher=dequantize_fwd, fake=dequantize_fake)
nf4_quantize_op = inference_op("nf4_quantize", launcher=nf4_quantize_fwd, fake=nf4_quantize_fake)
nf4_dequantize_op = inference_op("nf4_dequantize", launcher=nf4_dequantize_fwd, fake=nf4_dequantize_fake)
int4_quantize_op = inference_op("int4_quantize", launcher=int4_quantize_fwd, fake=int4_quantize_fake)
int4_dequantize_op = inference_op("int4_dequantize", launcher=int4_dequantize_fwd, fake=int4_dequantize_fake)


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


def _nested(absmax: torch.Tensor) -> dict:
    """bitsandbytes' double quantization of the absmax values (torch; one value per block of weights): their mean
    subtracted, then blocks of 256 scaled by the reciprocal of their absmax, clamped to [-1, 1] and stored as the
    index of the nearest value of the dynamic code (a value on a midpoint takes the lower one)."""
    offset = absmax.mean()
    centered = absmax - offset
    blocks = cdiv(centered.numel(), NESTED_BLOCK)
    padded = torch.nn.functional.pad(centered, (0, blocks * NESTED_BLOCK - centered.numel()))
    scales = padded.view(blocks, NESTED_BLOCK).abs().amax(-1)
    inverse = torch.ones_like(scales) / scales.clamp(min=1e-38)
    scaled = (padded.view(blocks, NESTED_BLOCK) * inverse[:, None]).clamp(-1, 1).reshape(-1)[: centered.numel()]
    # The device's copy, made once (nf4_tables): a copy from the host here would sync and break CUDA-graph capture.
    code = nf4_tables(absmax.device)[2].clone()
    codes = torch.bucketize(scaled, (code[:-1] + code[1:]) / 2).to(torch.uint8)
    return {"absmax_codes": codes, "absmax_scales": scales, "offset": offset, "nested_code": code}


def nf4_quantize(w: torch.Tensor, *, blocksize: int = 64, double_quant: bool = False) -> tuple[torch.Tensor, NF4State]:
    """A weight in bitsandbytes' NF4 format: (packed, state).

    The flattened weight is cut into blocks of ``blocksize`` values (32 to 4096, a power of two); each block's absmax
    (fp32) scales it into [-1, 1] (multiplied by the reciprocal), and each value becomes the index of the nearest of
    the 16 NF4 values, two a byte, the first in the high nibble: ``packed`` is uint8 (ceil(numel / 2),).
    ``double_quant`` (bitsandbytes' ``compress_statistics``) stores the absmax values in 8 bits too: their mean is
    subtracted and blocks of 256 are quantized to the dynamic 8-bit code. Bit for bit what bitsandbytes makes.

    Example: ``packed, state = tk.ops.nf4_quantize(linear.weight, double_quant=True)``.
    """
    if torch.is_grad_enabled() and isinstance(w, torch.Tensor) and w.requires_grad:
        raise ValueError("nf4_quantize has no gradient, but w requires grad; pass w.detach()")
    check_nf4_quantize(w, blocksize, double_quant)
    packed, absmax = nf4_quantize_op(w, blocksize)
    common = {"shape": tuple(w.shape), "dtype": w.dtype, "blocksize": blocksize}
    if double_quant:
        return packed, NF4State(**common, **_nested(absmax))
    return packed, NF4State(**common, absmax=absmax)


def nf4_dequantize(packed: torch.Tensor, state: NF4State, *, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """The weight (state.shape, ``dtype``) of NF4 codes: each value code[q] * absmax of its block, in fp32, cast once
    (double-quantized absmax values first decoded as bitsandbytes does), bit for bit bitsandbytes' dequantize_4bit.

    Example: ``w = tk.ops.nf4_dequantize(packed, state)``.
    """
    name = "nf4_dequantize"
    n = check_nf4_state(name, packed, state)
    if dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name}: dtype must be one of float32, float16, bfloat16, got {dtype}")
    check_device(packed=packed, **state.tensors())
    flat = packed.reshape(-1)
    out = nf4_dequantize_op(flat, state.absmax, state.absmax_codes, state.absmax_scales,
                            None if state.offset is None else state.offset.reshape(1), state.nested_code, n,
                            state.blocksize, dtype)  # fmt: skip
    return out.view(state.shape)


def int4_quantize(
    w: torch.Tensor, *, group_size: int = 128, symmetric: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A weight (N, K) in 4-bit codes with a scale and a zero point per group of ``group_size`` values along K (AWQ
    and GPTQ style): (qweight, scales, zeros).

    - Asymmetric (default): scale = max(max - min, 1e-5) / 15 and zero = round(-min / scale) over each group, its
      range widened to hold 0 (GPTQ's rule: the zero point is a code, and a group of one sign loses nothing to a
      clamped zero point, as AWQ's recipe would); symmetric: scale = max(max |w|, 1e-5) / 7 and zero = 8.
    - code = clamp(round(w / scale) + zero, 0, 15), rounding to nearest, ties to even; w' = (code - zero) * scale.
    - qweight uint8 (N, K / 2): two codes a byte along K, the even column in the low nibble; scales fp32 and zeros
      uint8, (N, ceil(K / group_size)). K must be even; a last group may be shorter. group_size: a power of two
      >= 16.

    Example: ``qweight, scales, zeros = tk.ops.int4_quantize(linear.weight)``.
    """
    if torch.is_grad_enabled() and isinstance(w, torch.Tensor) and w.requires_grad:
        raise ValueError("int4_quantize has no gradient, but w requires grad; pass w.detach()")
    check_int4_quantize(w, group_size, symmetric)
    return int4_quantize_op(w, group_size, symmetric)


def int4_dequantize(
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    *,
    group_size: int = 128,
    dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """The weight (N, K) in ``dtype`` of :func:`int4_quantize`'s tensors: (code - zero) * scale in fp32, cast once.

    Example: ``w = tk.ops.int4_dequantize(qweight, scales, zeros)``.
    """
    check_int4_dequantize(qweight, scales, zeros, group_size, dtype)
    return int4_dequantize_op(qweight, scales, zeros, group_size, dtype)
