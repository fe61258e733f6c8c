"""Fast math the kernels share: exp and tanh through exp2, and PTX's approximate ex2 and reciprocal."""

import torch
import triton
import triton.language as tl

from tritonkit._core.env import interpreting

# log2(e): exp(x) = 2^(x log2(e)), so kernels call tl.exp2 (or PTX's ex2) on arguments scaled by it.
LOG2_E = tl.constexpr(1.4426950408889634)

# PTX's approximate exp2 and reciprocal with denormals flushed are one MUFU instruction each; Triton's tl.exp
# and division add range fix-ups around them (docs/kernels/activation.md). The interpreter runs no PTX, so there
# the same math goes through tl.exp2 and a division.
PTX_MATH = tl.constexpr(not interpreting() and torch.version.hip is None)


@triton.jit
def exp_via_exp2(x):
    """exp(x) as 2^(x log2(e)) through tl.exp2, one ex2.approx.ftz: tl.exp's ex2 keeps denormals, with more
    instructions (docs/kernels/softmax.md). Results below 2^-126 flush to 0. Meant for arguments that are a
    difference from a row's maximum or lse, so the argument's rounding (relative 2^-24) moves the result by as little
    as tl.exp's own."""
    return tl.exp2(x * LOG2_E)


@triton.jit
def approx(x, OP: tl.constexpr):
    """In fp32, 2^x for OP "ex2" (results below 2^-126 flush to 0) or 1 / x for OP "rcp" (within an ulp or
    two; 1 / inf = 0)."""
    if PTX_MATH:
        y = tl.inline_asm_elementwise(OP + ".approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32, is_pure=True,
                                      pack=1)  # fmt: skip
    elif OP == "ex2":
        y = tl.exp2(x)
    else:
        y = 1.0 / x
    return y


@triton.jit
def tanh_via_exp2(x):
    """tanh(x) = 1 - 2 / (exp(2x) + 1), the exponential as one exp2: exact at both ends (exp2 overflows to inf and
    gives 1, underflows to 0 and gives -1) and within a few fp32 ulps elsewhere (attention's softcap)."""
    return 1.0 - 2.0 / (tl.exp2(x * (2.0 * LOG2_E)) + 1.0)
