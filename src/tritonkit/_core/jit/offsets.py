"""Offset and mask arithmetic that every kernel repeats (the debug toolkit shows the same helpers to learners)."""

import triton
import triton.language as tl


@triton.jit
def offsets_1d(size: tl.constexpr, n_prev_chunks):
    """Offsets of chunk number ``n_prev_chunks`` of ``size`` elements: n_prev_chunks*size + [0, size)."""
    return n_prev_chunks * size + tl.arange(0, size)


@triton.jit
def offsets_2d(offs_0, offs_1, stride_0, stride_1=1):
    """A [len(offs_0), len(offs_1)] block of offsets: offs_0[:, None]*stride_0 + offs_1[None, :]*stride_1."""
    return tl.expand_dims(offs_0, 1) * stride_0 + tl.expand_dims(offs_1, 0) * stride_1


@triton.jit
def mask_1d(offs, max):
    """Which offsets fall inside a dimension of ``max`` elements."""
    return offs < max


@triton.jit
def mask_2d(offs_0, offs_1, max_0, max_1):
    """A [len(offs_0), len(offs_1)] mask: row offset < max_0 and column offset < max_1."""
    return (tl.expand_dims(offs_0, 1) < max_0) & (tl.expand_dims(offs_1, 0) < max_1)
