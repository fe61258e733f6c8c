"""The fused LoRA GEMM: out = P Q + scale (P L1) L2 (+ bias) from one pass over P's tiles, the rank-r product kept
in fp32 and split hi + lo where it meets 16-bit operands (the forward with P = x, the input gradient with P = dy);
and the adapter's thin weight gradients, scale * small^T big, for few tokens."""

import triton
import triton.language as tl

from tritonkit._core.gemm_plan import autotune_configs
from tritonkit._core.jit.gemm import grouped_tile
from tritonkit._core.jit.offsets import mask_2d, offsets_2d


@triton.jit
def _split_dot(b_t, b_right, acc, SPLIT: tl.constexpr, INPUT_PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """acc + t @ right for an fp32 tile t and a tile ``right`` of the input dtype.

    SPLIT (16-bit inputs): t = hi + lo with hi = t rounded to the input dtype and lo the rest, also
    rounded; two tensor-core dots keep t to about twice the dtype's precision. Without SPLIT (fp32
    inputs) one dot at the TF32 policy's precision.
    """
    if SPLIT:
        b_hi = b_t.to(b_right.dtype)
        b_lo = (b_t - b_hi.to(tl.float32)).to(b_right.dtype)
        if UPCAST:
            b_hi = b_hi.to(tl.float32)
            b_lo = b_lo.to(tl.float32)
            b_right = b_right.to(tl.float32)
        acc = tl.dot(b_hi, b_right, acc, input_precision=INPUT_PRECISION)
        acc = tl.dot(b_lo, b_right, acc, input_precision=INPUT_PRECISION)
    else:
        acc = tl.dot(b_t, b_right, acc, input_precision=INPUT_PRECISION)
    return acc


@triton.jit
def _lora_matmul_kernel(
    p_p, p_q, p_l1, p_l2, p_bias, p_out, p_pl1,
    M, N, D, R, scale,
    stride_p_m, stride_p_d, stride_q_d, stride_q_n, stride_l1_d, stride_l1_r, stride_l2_r, stride_l2_n,
    stride_out_m, stride_out_n, stride_pl1_m,
    HAS_BIAS: tl.constexpr, R_PAD: tl.constexpr, SPLIT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_SIZE: tl.constexpr,
    INPUT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """out[M, N] = P[M, D] @ Q[D, N] + scale * (P @ L1[D, R]) @ L2[R, N] (+ bias[N]); PL1 = P @ L1 (fp32).

    Forward:  P = x, Q = W^T, L1 = A^T, L2 = B^T, D = K: out = y, PL1 = x A^T.
    Backward: P = dy, Q = W, L1 = B, L2 = A, D = N:     out = dx = dy W + scale (dy B) A, PL1 = dy B.
    The D loop feeds one loaded P tile to both dots; the rank R is padded to R_PAD with zeros. Every
    program of tile-column 0 stores its rows of PL1 (the others computed the same values). Tiles are
    visited in groups of GROUP_SIZE tile-rows, as tk.ops.matmul does.
    """
    i_m, i_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_SIZE)
    o_m = (i_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    o_n = (i_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    o_k = tl.arange(0, BLOCK_K)
    o_r = tl.arange(0, R_PAD)
    p_p_tile = p_p + offsets_2d(o_m, o_k, stride_p_m, stride_p_d)
    p_q_tile = p_q + offsets_2d(o_k, o_n, stride_q_d, stride_q_n)
    p_l1_tile = p_l1 + offsets_2d(o_k, o_r, stride_l1_d, stride_l1_r)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_pl1 = tl.zeros((BLOCK_M, R_PAD), dtype=tl.float32)
    for i_k in range(0, tl.cdiv(D, BLOCK_K)):
        k_left = D - i_k * BLOCK_K
        b_p = tl.load(p_p_tile, mask=mask_2d(o_m, o_k, M, k_left), other=0.0)  # [BLOCK_M, BLOCK_K]
        b_q = tl.load(p_q_tile, mask=mask_2d(o_k, o_n, k_left, N), other=0.0)  # [BLOCK_K, BLOCK_N]
        b_l1 = tl.load(p_l1_tile, mask=mask_2d(o_k, o_r, k_left, R), other=0.0)  # [BLOCK_K, R_PAD]
        if UPCAST:  # bf16 under the interpreter, which computes 16-bit dots wrongly
            b_p, b_q, b_l1 = b_p.to(tl.float32), b_q.to(tl.float32), b_l1.to(tl.float32)
        acc = tl.dot(b_p, b_q, acc, input_precision=INPUT_PRECISION)
        acc_pl1 = tl.dot(b_p, b_l1, acc_pl1, input_precision=INPUT_PRECISION)
        p_p_tile += BLOCK_K * stride_p_d
        p_q_tile += BLOCK_K * stride_q_d
        p_l1_tile += BLOCK_K * stride_l1_d
    if i_n == 0:
        tl.store(p_pl1 + offsets_2d(o_m, o_r, stride_pl1_m, 1), acc_pl1, mask=mask_2d(o_m, o_r, M, R))
    b_l2 = tl.load(p_l2 + offsets_2d(o_r, o_n, stride_l2_r, stride_l2_n), mask=mask_2d(o_r, o_n, R, N), other=0.0)
    acc = _split_dot(acc_pl1 * scale, b_l2, acc, SPLIT, INPUT_PRECISION, UPCAST)  # [BLOCK_M, BLOCK_N]
    if HAS_BIAS:
        acc += tl.load(p_bias + o_n, mask=o_n < N, other=0.0).to(tl.float32)[None, :]
    p_out_tile = p_out + offsets_2d(o_m, o_n, stride_out_m, stride_out_n)
    tl.store(p_out_tile, acc.to(p_out.dtype.element_ty), mask=mask_2d(o_m, o_n, M, N))


@triton.jit
def _lora_thin_grad_kernel(
    p_small, p_big, p_out, M, C, R, scale,
    stride_small_m, stride_big_m, stride_big_c, stride_out_r, stride_out_c,
    R_PAD: tl.constexpr, SPLIT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr,
    INPUT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """out[R, C] = scale * small[M, R]^T @ big[M, C], summed over the tokens M in fp32 and rounded once.

    dA = scale (dy B)^T x:        small = dy B (fp32), big = x,  C = K, out = dA (R, K).
    dB = scale dy^T (x A^T), i.e. dB^T = scale (x A^T)^T dy: small = x A^T (fp32), big = dy, C = N, out = dB^T
    (written through transposed strides into dB (N, R)).
    The fp32 factor (times scale) meets the 16-bit big in two tensor-core dots, hi + lo (_split_dot). A program
    owns BLOCK_C columns of out and walks every token; the rank is padded to R_PAD with zeros.
    """
    o_c = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    o_r = tl.arange(0, R_PAD)
    o_m = tl.arange(0, BLOCK_M)
    acc = tl.zeros((R_PAD, BLOCK_C), dtype=tl.float32)
    for m_start in range(0, M, BLOCK_M):
        rows = m_start + o_m
        b_small = tl.load(p_small + offsets_2d(rows.to(tl.int64), o_r, stride_small_m), mask=mask_2d(rows, o_r, M, R),
                          other=0.0)  # fmt: skip  # [BLOCK_M, R_PAD] fp32
        b_big = tl.load(p_big + offsets_2d(rows.to(tl.int64), o_c, stride_big_m, stride_big_c),
                        mask=mask_2d(rows, o_c, M, C), other=0.0)  # fmt: skip  # [BLOCK_M, BLOCK_C]
        acc = _split_dot(tl.trans(b_small * scale), b_big, acc, SPLIT, INPUT_PRECISION, UPCAST)
    p_out_tile = p_out + offsets_2d(o_r, o_c.to(tl.int64), stride_out_r, stride_out_c)
    tl.store(p_out_tile, acc.to(p_out.dtype.element_ty), mask=mask_2d(o_r, o_c, R, C))


# The same kernel autotuned per shape over the GEMM tile space the matmul ladder searches, and 16-row tiles for the
# few tokens of decoding and small batches (where the fused kernel runs: plan.FUSED_MAX_TOKENS).
_lora_matmul_autotuned = triton.autotune(configs=autotune_configs(few_rows=True), key=["M", "N", "D", "R_PAD"])(
    _lora_matmul_kernel
)
