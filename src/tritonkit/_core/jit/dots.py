"""Tensor-core products accumulated in fp32, correct under the interpreter too, and operands taken by parts of their
depth."""

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
        a, b = as_fp32(a), as_fp32(b)
    return tl.dot(a, b, acc, input_precision=DOT_PRECISION, max_num_imprecise_acc=MAX_IMPRECISE)


@triton.jit
def as_fp32(x):
    """x in fp32 under the interpreter. Its conversion from e4m3 decodes the NaN codes (bits 0x7F, 0xFF) as +-480,
    which would make a NaN operand finite where the tensor cores keep it NaN: NaN by the bits instead."""
    if x.dtype == tl.float8e4nv:
        nan_code = (x.to(tl.uint8, bitcast=True) & 0x7F) == 0x7F
        return tl.where(nan_code, float("nan"), x.to(tl.float32))
    else:
        return x.to(tl.float32)


@triton.jit
def interleaved_parts(b_x, PARTS: tl.constexpr):
    """x [M, K] as PARTS (2 or 4) tiles x_j [M, K / PARTS], x_j[m, e] = x[m, PARTS e + j], for a product taken part by
    part of its depth (x @ y = sum_j x_j @ y_j, y's rows parted alike): register moves only."""
    rows: tl.constexpr = b_x.shape[0]
    width: tl.constexpr = b_x.shape[1] // PARTS
    if PARTS == 2:
        return tl.split(tl.reshape(b_x, (rows, width, 2)))
    else:
        x_even, x_odd = tl.split(tl.reshape(b_x, (rows, width, 2, 2)))  # 4 e + 2 a + b: b = 0 / 1
        x_0, x_2 = tl.split(x_even)
        x_1, x_3 = tl.split(x_odd)
        return x_0, x_1, x_2, x_3
