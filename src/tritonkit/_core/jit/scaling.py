"""A gradient scaled by the upstream 0-d gradient and cast in one pass (the fused losses' saved gradients)."""

import triton
import triton.language as tl


@triton.jit
def scale_cast_kernel(p_x, p_factor, p_out, n_elements, BLOCK_SIZE: tl.constexpr):
    """out = x * factor, in fp32, rounded once to out's dtype; factor is a 0-d tensor (no host read of its value).
    x and out are contiguous, n_elements long (int64 offsets: a 128256 x 4096 d(weight) has 2^29 elements)."""
    offsets = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    factor = tl.load(p_factor).to(tl.float32)
    x = tl.load(p_x + offsets, mask=mask).to(tl.float32)
    tl.store(p_out + offsets, (x * factor).to(p_out.dtype.element_ty), mask=mask)


@triton.jit
def scale_in_place_kernel(p_x, p_factor, n_elements, BLOCK_SIZE: tl.constexpr):
    """x = x * factor in place, in fp32, rounded once to x's dtype; factor is a 0-d tensor. Each program strides
    over the blocks (a grid of about one wave), so that where factor is 1 (a loss's usual upstream gradient) the
    kernel is that wave reading one scalar and leaving: nothing read or written, decided on the device."""
    factor = tl.load(p_factor).to(tl.float32)
    if factor != 1.0:
        first = tl.program_id(0).to(tl.int64) * BLOCK_SIZE
        stride = tl.num_programs(0).to(tl.int64) * BLOCK_SIZE
        for start in tl.range(first, n_elements.to(tl.int64), stride):
            offsets = start + tl.arange(0, BLOCK_SIZE)
            mask = offsets < n_elements
            x = tl.load(p_x + offsets, mask=mask).to(tl.float32)
            tl.store(p_x + offsets, (x * factor).to(p_x.dtype.element_ty), mask=mask)
