"""Tensor-core products accumulated in fp32, correct under the interpreter too."""

import triton
import triton.language as tl


@triton.jit
def dot_fp32(a, b, DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """a @ b accumulated in fp32. UPCAST (bf16 under the interpreter, which computes 16-bit dots wrongly) takes the
    operands to fp32 first; they hold bf16 values, so the product is the one the tensor cores compute."""
    if UPCAST:
        a, b = a.to(tl.float32), b.to(tl.float32)
    return tl.dot(a, b, input_precision=DOT_PRECISION)
