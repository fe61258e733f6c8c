"""Rotary position embedding (RoPE) kernel of q and k, Hugging Face's rotate-half convention, forward and backward.

``q_embed = q * cos + rotate_half(q) * sin`` on the first ``rotary_dim`` columns of each head, with
``rotate_half(x) = cat(-x2, x1)`` (x1, x2 the two halves), the other columns copied; the same for k.
This is ``apply_rotary_pos_emb`` of transformers' Llama, and its partial-rotary form (GPT-NeoX, Phi).

One program handles one (batch, token) pair: it reads that token's cos/sin row once and rotates every
head of q and of k with it, so each byte of q, k, cos and sin is read once and each output byte written
once. The rotation is orthogonal, so the backward is the same kernel with sin negated (and its halves
swapped, which keeps it exact for tables whose halves differ): one kernel, a ``BACKWARD`` switch.

cos and sin are constants: no gradient flows to them, and passing ones that require grad raises.
"""

import triton
import triton.language as tl


@triton.jit
def _rotate_heads(
    p_x, p_y, n_heads, stride_x_h, stride_x_d, stride_y_h, stride_y_d, b_cos1, b_cos2, b_sin1, b_sin2,
    half, n_pass, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_PASS: tl.constexpr,
):  # fmt: skip
    """Every head of one token: y1 = x1 * cos1 - x2 * sin1, y2 = x2 * cos2 + x1 * sin2 over the rotary
    columns [0, half) and [half, 2 * half); columns [2 * half, 2 * half + n_pass) copied (BLOCK_PASS > 0)."""
    o_d = tl.arange(0, BLOCK_HALF)
    m_d = o_d < half
    for h_start in range(0, n_heads, BLOCK_H):
        o_h = (h_start + tl.arange(0, BLOCK_H)).to(tl.int64)  # head * stride can pass 2**31
        m_h = o_h < n_heads
        m_hd = m_h[:, None] & m_d[None, :]
        p_x1 = p_x + o_h[:, None] * stride_x_h + o_d[None, :] * stride_x_d
        p_y1 = p_y + o_h[:, None] * stride_y_h + o_d[None, :] * stride_y_d
        b_x1 = tl.load(p_x1, mask=m_hd, other=0.0).to(tl.float32)  # [BLOCK_H, BLOCK_HALF]
        b_x2 = tl.load(p_x1 + half * stride_x_d, mask=m_hd, other=0.0).to(tl.float32)  # [BLOCK_H, BLOCK_HALF]
        tl.store(p_y1, (b_x1 * b_cos1[None, :] - b_x2 * b_sin1[None, :]).to(p_y.dtype.element_ty), mask=m_hd)
        b_y2 = b_x2 * b_cos2[None, :] + b_x1 * b_sin2[None, :]
        tl.store(p_y1 + half * stride_y_d, b_y2.to(p_y.dtype.element_ty), mask=m_hd)
        if BLOCK_PASS > 0:
            o_p = 2 * half + tl.arange(0, BLOCK_PASS)
            m_hp = m_h[:, None] & (o_p < 2 * half + n_pass)[None, :]
            b_pass = tl.load(p_x + o_h[:, None] * stride_x_h + o_p[None, :] * stride_x_d, mask=m_hp)
            tl.store(p_y + o_h[:, None] * stride_y_h + o_p[None, :] * stride_y_d, b_pass, mask=m_hp)


@triton.jit
def _rope_kernel(
    p_q, p_k, p_cos, p_sin, p_pos, p_q_out, p_k_out,
    n_tokens, n_q_heads, n_k_heads, half, n_pass, n_positions,
    stride_q_b, stride_q_h, stride_q_t, stride_q_d, stride_k_b, stride_k_h, stride_k_t, stride_k_d,
    stride_qo_b, stride_qo_h, stride_qo_t, stride_qo_d, stride_ko_b, stride_ko_h, stride_ko_t, stride_ko_d,
    stride_cos_b, stride_cos_t, stride_cos_d, stride_sin_b, stride_sin_t, stride_sin_d, stride_pos_b, stride_pos_t,
    BACKWARD: tl.constexpr, HAS_POS: tl.constexpr, BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr,
    BLOCK_HALF: tl.constexpr, BLOCK_PASS: tl.constexpr,
):  # fmt: skip
    """RoPE of token (b, t) = divmod(program id, n_tokens), all heads of q and k (strides in b, h, t, d order).

    Forward, with c = (c1, c2), s = (s1, s2) the halves of this token's cos and sin rows (row
    position_ids[b, t] when HAS_POS, else row t of batch b, or of the one shared batch):
      y1 = x1 * c1 - x2 * s1,  y2 = x2 * c2 + x1 * s2,  pass-through columns copied.
    Backward (BACKWARD), the transpose of that rotation, given the output gradients g:
      dx1 = g1 * c1 + g2 * s2,  dx2 = g2 * c2 - g1 * s1,
    which is the forward with (s1, s2) replaced by (-s2, -s1). A position outside [0, n_positions)
    reads NaN instead of memory outside the table, so its row comes out NaN.
    """
    i_bt = tl.program_id(0).to(tl.int64)
    i_b = i_bt // n_tokens
    i_t = i_bt % n_tokens
    o_d = tl.arange(0, BLOCK_HALF)
    if HAS_POS:
        i_row = tl.load(p_pos + i_b * stride_pos_b + i_t * stride_pos_t).to(tl.int64)
        # A position outside the table masks every column. The mask stays a comparison of blocks: a block mask
        # `&` a scalar condition is an int32 mask under the interpreter, which triton >= 3.9's tl.load rejects.
        n_cols = tl.where((i_row >= 0) & (i_row < n_positions), half, 0)
    else:
        i_row = i_t
        n_cols = half
    m_d = o_d < n_cols
    p_cos_row = p_cos + i_b * stride_cos_b + i_row * stride_cos_t + o_d * stride_cos_d
    p_sin_row = p_sin + i_b * stride_sin_b + i_row * stride_sin_t + o_d * stride_sin_d
    b_cos1 = tl.load(p_cos_row, mask=m_d, other=float("nan")).to(tl.float32)  # [BLOCK_HALF]
    b_cos2 = tl.load(p_cos_row + half * stride_cos_d, mask=m_d, other=float("nan")).to(tl.float32)
    b_sin1 = tl.load(p_sin_row, mask=m_d, other=float("nan")).to(tl.float32)
    b_sin2 = tl.load(p_sin_row + half * stride_sin_d, mask=m_d, other=float("nan")).to(tl.float32)
    if BACKWARD:
        b_minus_sin1 = -b_sin1
        b_sin1 = -b_sin2
        b_sin2 = b_minus_sin1
    _rotate_heads(
        p_q + i_b * stride_q_b + i_t * stride_q_t, p_q_out + i_b * stride_qo_b + i_t * stride_qo_t, n_q_heads,
        stride_q_h, stride_q_d, stride_qo_h, stride_qo_d, b_cos1, b_cos2, b_sin1, b_sin2, half, n_pass,
        BLOCK_HQ, BLOCK_HALF, BLOCK_PASS,
    )  # fmt: skip
    _rotate_heads(
        p_k + i_b * stride_k_b + i_t * stride_k_t, p_k_out + i_b * stride_ko_b + i_t * stride_ko_t, n_k_heads,
        stride_k_h, stride_k_d, stride_ko_h, stride_ko_d, b_cos1, b_cos2, b_sin1, b_sin2, half, n_pass,
        BLOCK_HK, BLOCK_HALF, BLOCK_PASS,
    )  # fmt: skip
