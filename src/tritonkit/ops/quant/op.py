"""quantize, dequantize, nf4_quantize, nf4_dequantize, int4_quantize and int4_dequantize: the public functions,
forward-only custom ops (``tritonkit::quantize``, ...) that torch.compile traces and CUDA graphs capture."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from tritonkit._core.autograd import inference_op
from tritonkit._core.checks import FLOAT_DTYPES, check_device, check_tensor
from tritonkit._core.ints import cdiv
from tritonkit.ops.quant.launch import (
    NESTED_BLOCK,
    check_dequantize,
    check_int4_dequantize,
    check_int4_quantize,
    check_nf4_quantize,
    check_quantize,
    dequantize_fake,
    dequantize_fwd,
    dynamic_code,
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


@dataclass(frozen=True)
class NF4State:
    """What dequantizes NF4 codes: the weight's shape and dtype, the block size, and each block's absmax, either as
    fp32 values (``absmax``) or double-quantized (``absmax_codes`` uint8 in ``nested_code``, one fp32
    ``absmax_scales`` per 256 blocks, and the ``offset`` that was subtracted first), as bitsandbytes' QuantState."""

    shape: tuple
    dtype: torch.dtype
    blocksize: int
    absmax: torch.Tensor | None = None
    absmax_codes: torch.Tensor | None = None
    absmax_scales: torch.Tensor | None = None
    offset: torch.Tensor | None = None
    nested_code: torch.Tensor | None = None

    @property
    def nested(self) -> bool:
        return self.absmax is None

    @classmethod
    def from_bitsandbytes(cls, quant_state) -> NF4State:
        """The state of a weight bitsandbytes quantized (``Params4bit.quant_state``, a ``QuantState`` with
        ``quant_type="nf4"``); the weight's data is ``param.data`` itself (uint8, two codes a byte)."""
        if getattr(quant_state, "quant_type", None) != "nf4":
            raise ValueError(f"NF4State.from_bitsandbytes: quant_state must be an nf4 QuantState, got quant_type "
                             f"{getattr(quant_state, 'quant_type', None)!r}")  # fmt: skip
        common = {"shape": tuple(quant_state.shape), "dtype": quant_state.dtype, "blocksize": quant_state.blocksize}
        if not getattr(quant_state, "nested", False):
            return cls(**common, absmax=quant_state.absmax.float())
        inner = quant_state.state2
        if inner.blocksize != NESTED_BLOCK:
            raise ValueError(f"NF4State.from_bitsandbytes: the nested absmax blocks must hold {NESTED_BLOCK} values, "
                             f"got {inner.blocksize}")  # fmt: skip
        return cls(**common, absmax_codes=quant_state.absmax, absmax_scales=inner.absmax.float(),
                   offset=torch.as_tensor(quant_state.offset, dtype=torch.float32, device=quant_state.absmax.device),
                   nested_code=inner.code.float())  # fmt: skip


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
    code = dynamic_code().to(absmax.device)
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
    check_tensor(f"{name}: packed", packed, dtypes=(torch.uint8,))
    if not isinstance(state, NF4State):
        raise TypeError(f"{name}: state must be an NF4State (nf4_quantize's, or NF4State.from_bitsandbytes), got "
                        f"{type(state).__name__}")  # fmt: skip
    if dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name}: dtype must be one of float32, float16, bfloat16, got {dtype}")
    n = math.prod(state.shape)
    if packed.numel() != (n + 1) // 2:
        raise ValueError(f"{name}: packed holds {packed.numel()} bytes, but state.shape {state.shape} needs "
                         f"{(n + 1) // 2}")  # fmt: skip
    blocks = cdiv(n, state.blocksize)
    if state.nested:
        for arg, tensor, dtype_, count in (("absmax_codes", state.absmax_codes, torch.uint8, blocks),
                                           ("absmax_scales", state.absmax_scales, torch.float32,
                                            cdiv(blocks, NESTED_BLOCK))):  # fmt: skip
            check_tensor(f"{name}: state.{arg}", tensor, dtypes=(dtype_,))
            if tensor.numel() != count:
                raise ValueError(f"{name}: state.{arg} must hold {count} values, got {tensor.numel()}")
        if state.offset is None:
            raise ValueError(f"{name}: a double-quantized state needs its offset")
    else:
        check_tensor(f"{name}: state.absmax", state.absmax, dtypes=(torch.float32,))
        if state.absmax.numel() != blocks:
            raise ValueError(f"{name}: state.absmax must hold one value per block of {state.blocksize} ({blocks}), "
                             f"got {state.absmax.numel()}")  # fmt: skip
    state_tensors = {"absmax": state.absmax} if not state.nested else {
        "absmax_codes": state.absmax_codes, "absmax_scales": state.absmax_scales, "offset": state.offset}  # fmt: skip
    check_device(packed=packed, **state_tensors)
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
