"""Tensor-core products accumulated in fp32, correct under the interpreter too."""

import triton
import triton.language as tl


@triton.jit
def dot_fp32(a, b, DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr, MAX_IMPRECISE: tl.constexpr = None, acc=None):
    """a @ b accumulated in fp32; acc + a @ b where acc is given, the tensor cores adding into acc itself. UPCAST
    (bf16 under the interpreter, which computes 16-bit dots wrongly) takes the operands to fp32 first; they hold bf16
    values, so the product is the one the tensor cores compute.
    MAX_IMPRECISE (float8 operands on sm_90): how many products the tensor cores may sum in their shortened format
    before the partial sum is added in fp32; None: Triton's default, which on sm_90 never promotes."""
    if UPCAST:
        a, b = a.to(tl.float32), b.to(tl.float32)
    return tl.dot(a, b, acc, input_precision=DOT_PRECISION, max_num_imprecise_acc=MAX_IMPRECISE)
