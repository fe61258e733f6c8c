"""Tensor-core products accumulated in fp32, correct under the interpreter too."""

import triton
import triton.language as tl

from tritonkit._core.jit.fastmath import PTX_MATH


@triton.jit
def dot_fp32(a, b, DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr, MAX_IMPRECISE: tl.constexpr = None, acc=None):
    """a @ b accumulated in fp32; acc + a @ b where acc is given, the tensor cores adding into acc itself. UPCAST
    (bf16 under the interpreter, which computes 16-bit dots wrongly) takes the operands to fp32 first; they hold bf16
    values, so the product is the one the tensor cores compute.
    MAX_IMPRECISE (float8 operands on sm_90): how many products the tensor cores may sum in their shortened format
    before the partial sum is added in fp32; None: Triton's default, which on sm_90 never promotes."""
    if UPCAST:
        a, b = _as_fp32(a), _as_fp32(b)
    return tl.dot(a, b, acc, input_precision=DOT_PRECISION, max_num_imprecise_acc=MAX_IMPRECISE)


@triton.jit
def _as_fp32(x):
    """x in fp32 under the interpreter. Its conversion from e4m3 decodes the NaN codes (bits 0x7F, 0xFF) as +-480,
    which would make a NaN operand finite where the tensor cores keep it NaN: NaN by the bits instead."""
    if x.dtype == tl.float8e4nv:
        nan_code = (x.to(tl.uint8, bitcast=True) & 0x7F) == 0x7F
        return tl.where(nan_code, float("nan"), x.to(tl.float32))
    else:
        return x.to(tl.float32)


@triton.jit
def joined_operand(x):
    """x (a 16-bit tile built by tl.join) unchanged, as an operand of tl.dot that keeps the 16-bit layout. Triton
    (3.6) picks a product's operand layout from the narrowest load behind it and halves that width for every join
    on the way, so a tile joined from 16-bit values is laid out as 8-bit codes would be (kWidth 4), and ptxas then
    copies every fragment into place before each MMA (about one MOV a value in flash decoding's int4 loop). A copy
    the compiler may not look through (inline assembly with side effects, one MOV a pair that ptxas removes) ends
    that trace. The interpreter and other GPUs take x as it is."""
    if PTX_MATH:
        return tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [x], dtype=x.dtype, is_pure=False, pack=2)
    else:
        return x
