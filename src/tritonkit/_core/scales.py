"""Scale granularities shared by quantization and the scaled GEMMs: which granularity a scale's shape names.

Scales of codes with shape (..., K) (a 2-D (M, K) for blocks): "tensor" (), "row" (..., 1), "group"
(..., ceil(K / G)), "block" (ceil(M / G), ceil(K / G)), G a power of two >= MIN_BLOCK.
"""

from __future__ import annotations

from tritonkit._core.ints import cdiv

MIN_BLOCK = 16  # the smallest group or block side: the smallest K step of the tensor cores


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
