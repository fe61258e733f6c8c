"""Scale granularities shared by quantization and the scaled GEMMs: which granularity a scale's shape names.

Scales of codes with shape (..., K) (a 2-D (M, K) for blocks): "tensor" (), "row" (..., 1), "group"
(..., ceil(K / G)), "block" (ceil(M / G), ceil(K / G)), G a power of two >= MIN_BLOCK.
"""

from __future__ import annotations

import math

import torch

from tritonkit._core.ints import cdiv

MIN_BLOCK = 16  # the smallest group or block side: the smallest K step of the tensor cores
FORMATS = {torch.int8: "int8", torch.float8_e4m3fn: "e4m3", torch.float8_e5m2: "e5m2"}  # code dtype -> kernels' KIND
QMAX = {torch.int8: 127.0, torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}  # each format's largest value


def granularity_of(codes_shape: tuple, scale_shape_: tuple) -> tuple[str, int] | None:
    """(granularity, block size) that makes ``scale_shape_`` for codes of ``codes_shape``, or None. A group's or
    block's size is the power of two >= 16 that gives the scale's count; one scale per row reads as "row"."""
    if scale_shape_ == () or (len(codes_shape) == 0 and scale_shape_ in ((), (1,))):
        return "tensor", 0
    if not codes_shape or len(scale_shape_) != len(codes_shape):
        return None
    k = codes_shape[-1]
    if scale_shape_[:-1] == codes_shape[:-1]:
        if scale_shape_[-1] == 1:
            return "row", 0
        size = _block_for(k, scale_shape_[-1])
        return ("group", size) if size else None
    if len(codes_shape) == 2:
        size = _block_for(k, scale_shape_[1])
        if size and cdiv(codes_shape[0], size) == scale_shape_[0]:
            return "block", size
    return None


def _block_for(length: int, count: int) -> int:
    """The power of two >= MIN_BLOCK that cuts ``length`` into ``count`` pieces, or 0."""
    size = MIN_BLOCK
    while size < 2 * max(length, 1):
        if cdiv(length, size) == count:
            return size
        size *= 2
    return 0


def expand_scale(scale, shape: tuple, granularity: str, size: int):
    """A scale per element of codes of ``shape`` (torch; the references' dequantization)."""
    if granularity in ("tensor", "row"):
        return scale.expand(shape)
    wide = scale.repeat_interleave(size, dim=-1)[..., : shape[-1]]
    if granularity == "group":
        return wide
    return wide.repeat_interleave(size, dim=0)[: shape[0]]


def _regions(x: torch.Tensor, granularity: str, block_size: int) -> torch.Tensor:
    """x (fp32) viewed so that each region is one row of the last dim: (regions..., region elements)."""
    if granularity == "tensor":
        return x.reshape(1, -1)
    k = x.shape[-1]
    if granularity == "row":
        return x.reshape(*x.shape[:-1], 1, k)
    padded = torch.nn.functional.pad(x, (0, cdiv(k, block_size) * block_size - k), value=0.0)
    if granularity == "group":
        return padded.unflatten(-1, (-1, block_size))
    m = x.shape[0]
    padded = torch.nn.functional.pad(padded, (0, 0, 0, cdiv(m, block_size) * block_size - m), value=0.0)
    blocks = padded.unflatten(0, (-1, block_size)).unflatten(-1, (-1, block_size))  # (bm, bs, bk, bs)
    return blocks.transpose(1, 2).flatten(-2)  # (bm, bk, bs * bs)


def quantize_reference(x, dtype, *, granularity="row", block_size=128):
    """quantize's definition (_core/jit/quantize.py) in torch: x cast to fp32 (every input dtype is exact in it),
    then the definition step by step with torch's IEEE operations (tensor by tensor divisions, round half to even,
    torch's own float8 conversions). Returns (codes, fp32 scales), which the kernels must match exactly."""
    x = x.float()
    top = QMAX[dtype]
    magnitude = x.abs()
    finite = torch.where(magnitude < math.inf, magnitude, torch.zeros_like(magnitude))
    amax = _regions(finite, granularity, block_size).amax(-1)
    if granularity == "row":
        amax = amax.reshape(*x.shape[:-1], 1)
    elif granularity == "tensor":
        amax = amax.reshape(())
    scale = torch.where(amax > 0, amax / torch.full_like(amax, top), torch.ones_like(amax))
    y = (x / expand_scale(scale, tuple(x.shape), granularity, block_size)).clamp(-top, top)
    if dtype == torch.int8:
        codes = torch.where(torch.isnan(x), torch.zeros_like(y), torch.round(y)).to(torch.int8)
    else:
        codes = torch.where(torch.isnan(x), x, y).to(dtype)
    return codes, scale
