"""Constants the kernels' exp2-based math shares."""

import triton.language as tl

# log2(e): exp(x) = 2^(x log2(e)), so kernels call tl.exp2 (or PTX's ex2) on arguments scaled by it.
LOG2_E = tl.constexpr(1.4426950408889634)
