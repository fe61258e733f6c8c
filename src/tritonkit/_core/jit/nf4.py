"""NF4's 16 values chosen in registers: the fused 4-bit layers' code lookup."""

import triton
import triton.language as tl

from tritonkit._core.fourbit import NF4_CODE

# The code book as constexprs (a jit function reads globals only as constexprs), from the one table in _core.fourbit.
_V0, _V1, _V2, _V3 = (tl.constexpr(value) for value in NF4_CODE[0:4])
_V4, _V5, _V6, _V7 = (tl.constexpr(value) for value in NF4_CODE[4:8])
_V8, _V9, _V10, _V11 = (tl.constexpr(value) for value in NF4_CODE[8:12])
_V12, _V13, _V14, _V15 = (tl.constexpr(value) for value in NF4_CODE[12:16])


@triton.jit
def nf4_value(q):
    """NF4_CODE[q] in fp32 for 4-bit codes q (integers 0 to 15), by a tree of selects on q's bits: 15 selects a value
    on the CUDA cores. (A gather from the table in global memory saturated the L1 cache: 94% of its throughput and
    1.4% of DRAM's for the NF4 linear layer at one row on an H200, ten times INT4's time. Kernels that only
    dequantize, with no products to feed, measured faster with the gather.)"""
    bit0 = (q & 1) != 0
    pair0 = tl.where(bit0, _V1, _V0)
    pair1 = tl.where(bit0, _V3, _V2)
    pair2 = tl.where(bit0, _V5, _V4)
    pair3 = tl.where(bit0, _V7, _V6)
    pair4 = tl.where(bit0, _V9, _V8)
    pair5 = tl.where(bit0, _V11, _V10)
    pair6 = tl.where(bit0, _V13, _V12)
    pair7 = tl.where(bit0, _V15, _V14)
    bit1 = (q & 2) != 0
    quad0 = tl.where(bit1, pair1, pair0)
    quad1 = tl.where(bit1, pair3, pair2)
    quad2 = tl.where(bit1, pair5, pair4)
    quad3 = tl.where(bit1, pair7, pair6)
    bit2 = (q & 4) != 0
    low = tl.where(bit2, quad1, quad0)
    high = tl.where(bit2, quad3, quad2)
    return tl.where((q & 8) != 0, high, low).to(tl.float32)
