"""Scaled GEMMs: out = dequantize(x_q) @ dequantize(w_q)^T (+ bias) in one kernel, in F.linear's layout.

x (M, K) holds int8 or float8 codes with a scale per tensor, row or 1 x G group, or bf16/fp16 values with no scale
(weight-only); w (N, K) holds codes with a scale per tensor, output row, 1 x G group or G x G block. With s_x(m, k)
and s_w(n, k) the scale of each element (1 for unscaled x),

    out[m, n] = sum_k s_x(m, k) x[m, k] s_w(n, k) w[n, k] + bias[n].

When no scale varies along K the products run over the codes themselves (int8 x int8 exact in int32, float8 in fp32)
and the scales multiply once per output in the epilogue: out = s_x(m) s_w(n) sum_k x w. When one does, K steps
through whole groups (BLOCK_K divides G) and each step's partial sum is scaled before it is added,
acc += (sum_{k in step} x w) s_x(m, step) s_w(n, step), in fp32, which also keeps float8's tensor-core sums short (as
DeepSeek-V3's promotion to fp32 every 128 values does). Weight-only: w's codes are converted to x's dtype (exact for
int8 and float8 in bf16 and fp16) for the product.
"""

import triton
import triton.language as tl

from tritonkit._core.jit.dots import dot_fp32
from tritonkit._core.jit.gemm import grouped_tile


@triton.jit
def _load_zero_padded(p_tile, mask):
    """A tile whose masked lanes read 0 (they enter the product). Float8 tiles load their bits as uint8 and view them
    back: the interpreter cannot fill a float8 load with a constant, and bits 0 are +0 in both formats."""
    if p_tile.dtype.element_ty == tl.float8e4nv or p_tile.dtype.element_ty == tl.float8e5:
        bits = tl.load(p_tile.to(tl.pointer_type(tl.uint8)), mask=mask, other=0)
        tile = bits.to(p_tile.dtype.element_ty, bitcast=True)
    else:
        tile = tl.load(p_tile, mask=mask, other=0)
    return tile


@triton.jit
def _row_scales(p_scale, o_r, m_r, stride_r, k_block, GRANULARITY: tl.constexpr, G: tl.constexpr):
    """The scales [R] of rows o_r at K block k_block: one for the tensor, one per row, per (row, group), or per
    (G rows, group); unscaled ("none"): 1."""
    if GRANULARITY == "none":
        scale = tl.full(o_r.shape, 1.0, tl.float32)
    elif GRANULARITY == "tensor":
        scale = tl.load(p_scale) + tl.zeros(o_r.shape, tl.float32)
    elif GRANULARITY == "row":
        scale = tl.load(p_scale + o_r.to(tl.int64) * stride_r, mask=m_r, other=0.0)
    elif GRANULARITY == "group":
        scale = tl.load(p_scale + o_r.to(tl.int64) * stride_r + k_block, mask=m_r, other=0.0)
    else:  # block
        scale = tl.load(p_scale + (o_r // G).to(tl.int64) * stride_r + k_block, mask=m_r, other=0.0)
    return scale


@triton.jit
def _scaled_linear_kernel(
    p_x, p_w, p_x_scale, p_w_scale, p_bias, p_out, M, N, K,
    stride_x_m, stride_w_n, stride_xs_m, stride_ws_n, stride_out_m,
    X_SCALE: tl.constexpr, W_SCALE: tl.constexpr, G: tl.constexpr, HAS_BIAS: tl.constexpr, INT_ACC: tl.constexpr,
    DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_SIZE: tl.constexpr,
):  # fmt: skip
    """One BLOCK_M x BLOCK_N tile of out (tiles in grouped order); x and w have unit stride along K. INT_ACC: int8
    codes summed in int32 (no scale varies along K)."""
    i_m, i_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_SIZE)
    o_m = i_m * BLOCK_M + tl.arange(0, BLOCK_M)
    o_n = i_n * BLOCK_N + tl.arange(0, BLOCK_N)
    o_k = tl.arange(0, BLOCK_K)
    m_m, m_n = o_m < M, o_n < N
    p_x_tile = p_x + o_m.to(tl.int64)[:, None] * stride_x_m + o_k[None, :]
    p_w_tile = p_w + o_n.to(tl.int64)[:, None] * stride_w_n + o_k[None, :]
    PER_STEP: tl.constexpr = X_SCALE == "group" or W_SCALE == "group" or W_SCALE == "block"
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.int32 if INT_ACC else tl.float32)
    for k in range(0, K, BLOCK_K):
        m_k = o_k < K - k
        b_x = _load_zero_padded(p_x_tile, m_m[:, None] & m_k[None, :])  # [M, K]
        b_w = _load_zero_padded(p_w_tile, m_n[:, None] & m_k[None, :])  # [N, K]
        if X_SCALE == "none":  # weight-only: the codes in x's dtype
            if UPCAST:  # noqa: SIM108 (the interpreter converts integers to bf16 wrongly; fp32 is exact)
                b_w = b_w.to(tl.float32)
            else:
                b_w = b_w.to(b_x.dtype)
        if INT_ACC:
            acc = tl.dot(b_x, tl.trans(b_w), acc, out_dtype=tl.int32)
        elif PER_STEP:
            k_block = k // G
            x_scale = _row_scales(p_x_scale, o_m, m_m, stride_xs_m, k_block, X_SCALE, G)
            w_scale = _row_scales(p_w_scale, o_n, m_n, stride_ws_n, k_block, W_SCALE, G)
            acc += dot_fp32(b_x, tl.trans(b_w), DOT_PRECISION, UPCAST) * x_scale[:, None] * w_scale[None, :]
        else:
            acc += dot_fp32(b_x, tl.trans(b_w), DOT_PRECISION, UPCAST)
        p_x_tile += BLOCK_K
        p_w_tile += BLOCK_K
    b_out = acc.to(tl.float32)
    if not PER_STEP:  # the scales that do not vary along K, once per output
        x_scale = _row_scales(p_x_scale, o_m, m_m, stride_xs_m, 0, X_SCALE, G)
        w_scale = _row_scales(p_w_scale, o_n, m_n, stride_ws_n, 0, W_SCALE, G)
        b_out = b_out * x_scale[:, None] * w_scale[None, :]
    if HAS_BIAS:
        b_out += tl.load(p_bias + o_n, mask=m_n, other=0.0).to(tl.float32)[None, :]
    p_out_tile = p_out + o_m.to(tl.int64)[:, None] * stride_out_m + o_n[None, :]
    tl.store(p_out_tile, b_out.to(p_out.dtype.element_ty), mask=m_m[:, None] & m_n[None, :])
