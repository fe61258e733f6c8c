"""Flash attention kernels: the forward, the backward's row dot product, dK/dV by key block, dQ by query block.

Notation for one (batch, query head) pair: q_i, k_j, v_j the rows of Q (Sq x D), K and V (Sk x D); the query head
reads key head h // (Hq / Hk) (GQA). Scores s_ij = scale * q_i . k_j, or with a softcap c > 0,
s_ij = c * tanh(scale * q_i . k_j / c). Query i sees key j when its position after bottom-right alignment,
r_i = i + Sk - Sq, satisfies r_i - left <= j <= r_i + right (causal is right = 0; an unbounded side is passed as a
bound no position reaches). Then, over the visible keys of row i:

    lse_i = log sum_j exp(s_ij),  p_ij = exp(s_ij - lse_i),  o_i = sum_j p_ij v_j

with o_i = 0 and lse_i = -inf for a row that sees no key. The forward walks the keys in blocks with the online
softmax (running maximum m_i and sum l_i, rescaled by exp2(m_old - m_new) as the maximum grows), in base 2: scores
are scaled by log2(e) once, so each exponential is one exp2.

Backward, for an upstream gradient dO: D_i = sum_d dO_id O_id (the row dot product), then

    dV_j = sum_i p_ij dO_i,   dp_ij = dO_i . v_j,   ds_ij = p_ij (dp_ij - D_i),
    dQ_i = sum_j ds'_ij k_j,  dK_j = sum_i ds'_ij q_i,

where ds' = ds * scale, or with the softcap ds * scale * (1 - tanh^2(scale q.k / c)), the derivative of the score
by the raw product q.k. Each program owns its output block, so every gradient is written once: dK and dV by key
block (looping over the query heads of its key head and the query blocks that see it), dQ by query block; no
atomics, so the backward is deterministic.

Every kernel walks its blocks in three runs: the blocks some mask cuts (a window's edge, the causal diagonal, the
end of a sequence) are masked; the run in between, where every pair is visible, skips the mask.
"""

import triton
import triton.language as tl

from tritonkit._core.jit.dots import dot_fp32
from tritonkit._core.jit.fastmath import LOG2_E, approx, tanh_via_exp2


@triton.jit
def _sequence(i_b, p_cu_seqlens, seqlen, IS_VARLEN: tl.constexpr):
    """(start row as int64, length) of sequence i_b: from cu_seqlens when packed, else (0, the dense length)."""
    if IS_VARLEN:
        start = tl.load(p_cu_seqlens + i_b)
        length = tl.load(p_cu_seqlens + i_b + 1) - start
        start = start.to(tl.int64)
    else:
        start = i_b.to(tl.int64) * 0  # a zero of the packed case's type
        length = seqlen
    return start, length


@triton.jit
def _load_rows(p, start, o_r, stride_s, o_d, n_rows, head_dim, MASK_ROWS: tl.constexpr, EVEN_D: tl.constexpr):
    """The [R, D] tile of rows start + o_r (o_r = arange(R); unit stride along D); rows >= n_rows (with MASK_ROWS)
    and columns >= head_dim (unless EVEN_D) read as 0. The block's start moves the pointer in int64; offsets
    inside the block stay int32."""
    p_tile = p + start.to(tl.int64) * stride_s + o_r[:, None] * stride_s + o_d[None, :]
    if MASK_ROWS:
        mask = (start + o_r)[:, None] < n_rows
        if not EVEN_D:
            mask = mask & (o_d[None, :] < head_dim)
        tile = tl.load(p_tile, mask=mask, other=0.0)
    elif EVEN_D:
        tile = tl.load(p_tile)
    else:
        tile = tl.load(p_tile, mask=o_d[None, :] < head_dim, other=0.0)
    return tile


@triton.jit
def _stream_tile(p, desc, i_b, i_h, start, o_r, stride_s, o_d, n_rows, head_dim, MASK_ROWS: tl.constexpr,
                 EVEN_D: tl.constexpr, DESCRIPTOR: tl.constexpr, SEQ_FIRST: tl.constexpr):  # fmt: skip
    """The [R, D] tile of rows start + o_r of (batch i_b, head i_h) that a kernel's loop streams (K and V in the
    forward and dQ, Q and dO in dK/dV): through the tensor descriptor ``desc`` (TMA on Hopper; its 4-D box is one
    head's rows, so rows past the sequence and columns past head_dim read as 0 with no mask; SEQ_FIRST: the tensor
    is (B, S, H, D), else (B, H, S, D)), or as _load_rows reads it."""
    if DESCRIPTOR:
        block: tl.constexpr = (o_r.shape[0], o_d.shape[0])
        if SEQ_FIRST:
            tile = tl.reshape(desc.load([i_b, start, i_h, 0]), block)
        else:
            tile = tl.reshape(desc.load([i_b, i_h, start, 0]), block)
    else:
        tile = _load_rows(p, start, o_r, stride_s, o_d, n_rows, head_dim, MASK_ROWS, EVEN_D)
    return tile


@triton.jit
def _runs(lo, hi, full_from, full_to, BLOCK: tl.constexpr):
    """Blocks of BLOCK starting at lo, lo + BLOCK, ... up to hi: their count, and the run [first_full, last_full)
    of those whose start lies in [full_from, full_to] (the ones no mask cuts)."""
    n_blocks = tl.cdiv(tl.maximum(hi - lo, 0), BLOCK)
    first_full = tl.minimum(tl.cdiv(tl.maximum(full_from - lo, 0), BLOCK), n_blocks)
    n_left_of_end = tl.where(full_to >= lo, (full_to - lo) // BLOCK + 1, 0)
    last_full = tl.maximum(first_full, tl.minimum(n_left_of_end, n_blocks))
    return n_blocks, first_full, last_full


@triton.jit
def _run_span(run: tl.constexpr, first_full, last_full, n_blocks):
    """Blocks [begin, end) of run 0 (masked, before the whole ones), 1 (whole, no mask) or 2 (masked, after)."""
    begin = first_full if run == 1 else (last_full if run == 2 else 0)
    end = first_full if run == 0 else (last_full if run == 1 else n_blocks)
    return begin, end


@triton.jit
def _key_runs(m_lo, shift, left, right, seqlen_k, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """For query rows [m_lo, m_lo + BLOCK_M): the first key lo, the number of key blocks, and the run of blocks
    every row sees whole. Rows past the sequence's end count as rows; their results are never stored."""
    lo = tl.maximum(m_lo + shift - left, 0)
    hi = tl.minimum(m_lo + BLOCK_M + shift + right, seqlen_k)
    # Whole: every key >= the last row's left edge, <= the first row's right edge, and inside the sequence.
    full_from = m_lo + BLOCK_M - 1 + shift - left
    full_to = tl.minimum(m_lo + shift + right - BLOCK_N + 1, seqlen_k - BLOCK_N)
    n_blocks, first_full, last_full = _runs(lo, hi, full_from, full_to, BLOCK_N)
    return lo, n_blocks, first_full, last_full


@triton.jit
def _query_runs(n_lo, shift, left, right, seqlen_q, seqlen_k, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """For keys [n_lo, n_lo + BLOCK_N): the first query row that sees any of them, the number of query blocks, and
    the run of blocks whose every row sees every key (none when the key block runs past the sequence's end)."""
    lo = tl.maximum(n_lo - right - shift, 0)
    hi = tl.minimum(n_lo + BLOCK_N + left - shift, seqlen_q)
    full_from = n_lo + BLOCK_N - 1 - right - shift
    full_to = tl.minimum(n_lo + left - shift - BLOCK_M + 1, seqlen_q - BLOCK_M)
    full_to = tl.where(n_lo + BLOCK_N <= seqlen_k, full_to, -1)
    n_blocks, first_full, last_full = _runs(lo, hi, full_from, full_to, BLOCK_M)
    return lo, n_blocks, first_full, last_full


@triton.jit
def _visible(o_m, o_n, shift, left, right, seqlen_q, seqlen_k):
    """[M, N] mask of the pairs (query o_m, key o_n) that attend: inside both sequences and the window."""
    r = o_m[:, None] + shift
    j = o_n[None, :]
    return (j >= r - left) & (j <= r + right) & (j < seqlen_k) & (o_m[:, None] < seqlen_q)


@triton.jit
def _scores(b_q, b_k, qk_scale, softcap_log2, SOFTCAP: tl.constexpr, DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """[M, N] scores in base 2 (s * log2(e)) and, with a softcap, tanh of the capped argument (the backward's
    derivative). qk_scale is scale * log2(e), or scale / c with a softcap c; softcap_log2 is c * log2(e)."""
    b_s = dot_fp32(b_q, tl.trans(b_k), DOT_PRECISION, UPCAST) * qk_scale
    if SOFTCAP:
        b_t = tanh_via_exp2(b_s)
        b_s = b_t * softcap_log2
    else:
        b_t = b_s
    return b_s, b_t


@triton.jit
def _fwd_block(acc, m_i, l_i, b_q, p_k, p_v, desc_k, desc_v, i_b, i_hk, start_n, o_m, o_n, o_d, shift, left, right,
               seqlen_q, seqlen_k, head_dim, stride_k_s, stride_v_s, qk_scale, softcap_log2,
               MASK: tl.constexpr, SOFTCAP: tl.constexpr, RAW_MAX: tl.constexpr, EVEN_D: tl.constexpr,
               DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr, DESCRIPTORS: tl.constexpr,
               SEQ_FIRST: tl.constexpr):  # fmt: skip
    """One online-softmax step over the keys [start_n, start_n + BLOCK_N).

    The step is bound by the arithmetic per score as much as by the products (the exponentials and the fp32 work
    beside them take about as long as the two tensor-core products at d128), so each score costs as few
    instructions as possible: with RAW_MAX (no softcap, a positive scale) the maximum is taken over the raw products
    and scaled once per row, since scaling by a positive factor keeps the order and rounds monotonically, and each
    score then takes one fused multiply-add (raw * qk_scale - m) before its exponential; the exponential is PTX's
    ex2.approx.ftz (one instruction; arguments are <= 0, so only terms below 2^-126 of the row's largest flush)."""
    o_j = start_n + o_n
    b_k = _stream_tile(p_k, desc_k, i_b, i_hk, start_n, o_n, stride_k_s, o_d, seqlen_k, head_dim, MASK, EVEN_D,
                       DESCRIPTORS, SEQ_FIRST)  # fmt: skip
    b_v = _stream_tile(p_v, desc_v, i_b, i_hk, start_n, o_n, stride_v_s, o_d, seqlen_k, head_dim, MASK, EVEN_D,
                       DESCRIPTORS, SEQ_FIRST)  # fmt: skip
    if RAW_MAX:
        b_s = dot_fp32(b_q, tl.trans(b_k), DOT_PRECISION, UPCAST)  # [M, N], unscaled
    else:
        b_s, _ = _scores(b_q, b_k, qk_scale, softcap_log2, SOFTCAP, DOT_PRECISION, UPCAST)  # [M, N], base 2
    if MASK:
        b_s = tl.where(_visible(o_m, o_j, shift, left, right, seqlen_q, seqlen_k), b_s, float("-inf"))
    score_scale = qk_scale if RAW_MAX else 1.0  # b_s * score_scale: the scores in base 2
    m_new = tl.maximum(m_i, tl.max(b_s, axis=1) * score_scale)
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that saw no key yet: exp2(-inf - 0) = 0
    b_p = approx(b_s * score_scale - m_safe[:, None], "ex2")
    alpha = approx(m_i - m_safe, "ex2")
    l_i = l_i * alpha + tl.sum(b_p, axis=1)
    acc = acc * alpha[:, None] + dot_fp32(b_p.to(b_v.dtype), b_v, DOT_PRECISION, UPCAST)
    return acc, m_new, l_i


@triton.jit
def _program_blocks(HEADS_FASTEST: tl.constexpr):
    """(batch * heads index, block index, blocks) of this program. HEADS_FASTEST: the grid is (heads, blocks), so a
    wave holds the same blocks of many heads (their K and V must share L2); else (blocks, heads), a head's blocks
    together, reading one head's K and V from L2."""
    if HEADS_FASTEST:
        return tl.program_id(0), tl.program_id(1), tl.num_programs(1)
    else:
        return tl.program_id(1), tl.program_id(0), tl.num_programs(0)


@triton.jit
def _attention_fwd_kernel(
    p_q, p_k, p_v, desc_k, desc_v, p_o, p_lse, p_cu_seqlens_q, p_cu_seqlens_k,
    seqlen_q, seqlen_k, n_heads_q, group, head_dim, left, right, qk_scale, softcap_log2,
    stride_q_b, stride_q_h, stride_q_s, stride_k_b, stride_k_h, stride_k_s, stride_v_b, stride_v_h, stride_v_s,
    stride_o_b, stride_o_h, stride_o_s, stride_lse_b, stride_lse_h,
    IS_VARLEN: tl.constexpr, SOFTCAP: tl.constexpr, RAW_MAX: tl.constexpr, DOT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr,
    DESCRIPTORS: tl.constexpr, SEQ_FIRST: tl.constexpr, HEADS_FASTEST: tl.constexpr,
):  # fmt: skip
    """O and lse (natural log, fp32) for BLOCK_M query rows of one (batch, query head); see the module docstring.
    The head dimension has unit stride (the launcher makes it so); lse rows have unit stride. DESCRIPTORS (dense
    inputs only): K and V are read through the tensor descriptors desc_k and desc_v (_stream_tile)."""
    i_bh, i_block, n_blocks = _program_blocks(HEADS_FASTEST)
    i_m = n_blocks - 1 - i_block  # the last rows first: under a causal mask they see the most keys
    i_b, i_h = i_bh // n_heads_q, i_bh % n_heads_q
    q_start, seqlen_q = _sequence(i_b, p_cu_seqlens_q, seqlen_q, IS_VARLEN)
    k_start, seqlen_k = _sequence(i_b, p_cu_seqlens_k, seqlen_k, IS_VARLEN)
    m_lo = i_m * BLOCK_M
    if m_lo >= seqlen_q:
        return
    i_b64, i_hk64 = i_b.to(tl.int64), (i_h // group).to(tl.int64)
    p_q += i_b64 * stride_q_b + i_h.to(tl.int64) * stride_q_h + q_start * stride_q_s
    p_k += i_b64 * stride_k_b + i_hk64 * stride_k_h + k_start * stride_k_s
    p_v += i_b64 * stride_v_b + i_hk64 * stride_v_h + k_start * stride_v_s
    o_m = m_lo + tl.arange(0, BLOCK_M)
    o_n = tl.arange(0, BLOCK_N)
    o_d = tl.arange(0, BLOCK_D)
    o_r = tl.arange(0, BLOCK_M)
    b_q = _load_rows(p_q, m_lo, o_r, stride_q_s, o_d, seqlen_q, head_dim, True, EVEN_D)  # [M, D]
    shift = seqlen_k - seqlen_q
    lo, n_blocks, first_full, last_full = _key_runs(m_lo, shift, left, right, seqlen_k, BLOCK_M, BLOCK_N)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    for run in tl.static_range(3):  # masked blocks, whole blocks (no mask), masked blocks
        begin, end = _run_span(run, first_full, last_full, n_blocks)
        for i_n in range(begin, end):
            acc, m_i, l_i = _fwd_block(acc, m_i, l_i, b_q, p_k, p_v, desc_k, desc_v, i_b, i_h // group,
                                       lo + i_n * BLOCK_N, o_m, o_n, o_d, shift, left, right, seqlen_q, seqlen_k,
                                       head_dim, stride_k_s, stride_v_s, qk_scale, softcap_log2, run != 1, SOFTCAP,
                                       RAW_MAX, EVEN_D, DOT_PRECISION, UPCAST, DESCRIPTORS,
                                       SEQ_FIRST)  # fmt: skip
    seen = l_i > 0.0
    l_safe = tl.where(seen, l_i, 1.0)
    b_o = acc / l_safe[:, None]
    lse = tl.where(seen, (m_i + tl.log2(l_safe)) / LOG2_E, float("-inf"))
    p_o += i_b64 * stride_o_b + i_h.to(tl.int64) * stride_o_h + (q_start + m_lo) * stride_o_s
    m_o = (o_m[:, None] < seqlen_q) & (o_d[None, :] < head_dim)
    tl.store(p_o + o_r[:, None] * stride_o_s + o_d[None, :], b_o.to(p_o.dtype.element_ty), mask=m_o)
    p_lse += i_b64 * stride_lse_b + i_h.to(tl.int64) * stride_lse_h + q_start
    tl.store(p_lse + o_m, lse, mask=o_m < seqlen_q)


@triton.jit
def _attention_bwd_delta_kernel(
    p_o, p_do, p_delta, p_cu_seqlens_q, seqlen_q, n_heads_q, head_dim,
    stride_o_b, stride_o_h, stride_o_s, stride_do_b, stride_do_h, stride_do_s, stride_delta_b, stride_delta_h,
    IS_VARLEN: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """D_i = sum_d dO_id O_id in fp32, laid out as lse."""
    i_m, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // n_heads_q, i_bh % n_heads_q
    q_start, seqlen_q = _sequence(i_b, p_cu_seqlens_q, seqlen_q, IS_VARLEN)
    m_lo = i_m * BLOCK_M
    if m_lo >= seqlen_q:
        return
    i_b64, i_h64 = i_b.to(tl.int64), i_h.to(tl.int64)
    o_r = tl.arange(0, BLOCK_M)
    o_d = tl.arange(0, BLOCK_D)
    p_o += i_b64 * stride_o_b + i_h64 * stride_o_h + q_start * stride_o_s
    p_do += i_b64 * stride_do_b + i_h64 * stride_do_h + q_start * stride_do_s
    b_o = _load_rows(p_o, m_lo, o_r, stride_o_s, o_d, seqlen_q, head_dim, True, False).to(tl.float32)  # [M, D]
    b_do = _load_rows(p_do, m_lo, o_r, stride_do_s, o_d, seqlen_q, head_dim, True, False).to(tl.float32)  # [M, D]
    p_delta += i_b64 * stride_delta_b + i_h64 * stride_delta_h + q_start
    tl.store(p_delta + m_lo + o_r, tl.sum(b_o * b_do, axis=1), mask=m_lo + o_r < seqlen_q)


@triton.jit
def _dkdv_block(dk, dv, b_k, b_v, p_q, p_do, desc_q, desc_do, i_b, i_h, p_lse, p_delta, start_m, o_m, o_n, o_d, shift,
                left, right, seqlen_q, seqlen_k, head_dim, stride_q_s, stride_do_s, qk_scale, softcap_log2, ds_scale,
                MASK: tl.constexpr, SOFTCAP: tl.constexpr, EVEN_D: tl.constexpr, DOT_PRECISION: tl.constexpr,
                UPCAST: tl.constexpr, DESCRIPTORS: tl.constexpr, SEQ_FIRST: tl.constexpr):  # fmt: skip
    """Add the query rows [start_m, start_m + BLOCK_M) to the key block's dK and dV, in transposed form ([N, M]
    tiles), so that no tile needs a transpose before its product."""
    o_i = start_m + o_m
    b_q = _stream_tile(p_q, desc_q, i_b, i_h, start_m, o_m, stride_q_s, o_d, seqlen_q, head_dim, MASK, EVEN_D,
                       DESCRIPTORS, SEQ_FIRST)  # fmt: skip
    b_do = _stream_tile(p_do, desc_do, i_b, i_h, start_m, o_m, stride_do_s, o_d, seqlen_q, head_dim, MASK, EVEN_D,
                        DESCRIPTORS, SEQ_FIRST)  # fmt: skip
    if MASK:
        lse_log2 = tl.load(p_lse + o_i, mask=o_i < seqlen_q, other=0.0) * LOG2_E  # [M]
        b_delta = tl.load(p_delta + o_i, mask=o_i < seqlen_q, other=0.0)  # [M]
    else:
        lse_log2 = tl.load(p_lse + o_i) * LOG2_E  # [M]
        b_delta = tl.load(p_delta + o_i)  # [M]
    b_st, b_t = _scores(b_k, b_q, qk_scale, softcap_log2, SOFTCAP, DOT_PRECISION, UPCAST)  # [N, M]
    b_pt = tl.exp2(b_st - lse_log2[None, :])
    if MASK:
        b_pt = tl.where(tl.trans(_visible(o_i, o_n, shift, left, right, seqlen_q, seqlen_k)), b_pt, 0.0)
    dv += dot_fp32(b_pt.to(b_do.dtype), b_do, DOT_PRECISION, UPCAST)
    b_dpt = dot_fp32(b_v, tl.trans(b_do), DOT_PRECISION, UPCAST)  # [N, M]
    b_dst = b_pt * (b_dpt - b_delta[None, :]) * ds_scale
    if SOFTCAP:
        b_dst = b_dst * (1.0 - b_t * b_t)
    b_dst = b_dst.to(b_q.dtype)
    dk += dot_fp32(b_dst, b_q, DOT_PRECISION, UPCAST)
    return dk, dv


@triton.jit
def _attention_bwd_dkdv_kernel(
    p_q, p_k, p_v, p_do, p_lse, p_delta, desc_q, desc_do, p_dk, p_dv, p_cu_seqlens_q, p_cu_seqlens_k,
    seqlen_q, seqlen_k, n_heads_k, group, head_dim, left, right, qk_scale, softcap_log2, ds_scale,
    stride_q_b, stride_q_h, stride_q_s, stride_k_b, stride_k_h, stride_k_s, stride_v_b, stride_v_h, stride_v_s,
    stride_do_b, stride_do_h, stride_do_s, stride_lse_b, stride_lse_h,
    stride_dk_b, stride_dk_h, stride_dk_s, stride_dv_b, stride_dv_h, stride_dv_s,
    IS_VARLEN: tl.constexpr, SOFTCAP: tl.constexpr, DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr,
    DESCRIPTORS: tl.constexpr, SEQ_FIRST: tl.constexpr, HEADS_FASTEST: tl.constexpr,
):  # fmt: skip
    """dK and dV of BLOCK_N keys of one (batch, key head): the sum over the group's query heads and the query blocks
    that see these keys (the delta and lse tensors share one layout). DESCRIPTORS (dense inputs only): Q and dO are
    read through desc_q and desc_do (_stream_tile)."""
    i_bh, i_n, _ = _program_blocks(HEADS_FASTEST)  # the first key blocks, seen by most rows, start first
    i_b, i_hk = i_bh // n_heads_k, i_bh % n_heads_k
    q_start, seqlen_q = _sequence(i_b, p_cu_seqlens_q, seqlen_q, IS_VARLEN)
    k_start, seqlen_k = _sequence(i_b, p_cu_seqlens_k, seqlen_k, IS_VARLEN)
    n_lo = i_n * BLOCK_N
    if n_lo >= seqlen_k:
        return
    i_b64, i_hk64 = i_b.to(tl.int64), i_hk.to(tl.int64)
    o_m = tl.arange(0, BLOCK_M)
    o_r = tl.arange(0, BLOCK_N)
    o_n = n_lo + o_r
    o_d = tl.arange(0, BLOCK_D)
    p_k += i_b64 * stride_k_b + i_hk64 * stride_k_h + k_start * stride_k_s
    p_v += i_b64 * stride_v_b + i_hk64 * stride_v_h + k_start * stride_v_s
    b_k = _load_rows(p_k, n_lo, o_r, stride_k_s, o_d, seqlen_k, head_dim, True, EVEN_D)  # [N, D]
    b_v = _load_rows(p_v, n_lo, o_r, stride_v_s, o_d, seqlen_k, head_dim, True, EVEN_D)  # [N, D]
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    shift = seqlen_k - seqlen_q
    lo, n_blocks, first_full, last_full = _query_runs(n_lo, shift, left, right, seqlen_q, seqlen_k, BLOCK_M, BLOCK_N)
    for i_g in range(0, group):
        i_h = i_hk * group + i_g
        i_h64 = i_h.to(tl.int64)
        p_q_h = p_q + i_b64 * stride_q_b + i_h64 * stride_q_h + q_start * stride_q_s
        p_do_h = p_do + i_b64 * stride_do_b + i_h64 * stride_do_h + q_start * stride_do_s
        p_lse_h = p_lse + i_b64 * stride_lse_b + i_h64 * stride_lse_h + q_start
        p_delta_h = p_delta + i_b64 * stride_lse_b + i_h64 * stride_lse_h + q_start
        for run in tl.static_range(3):  # masked blocks, whole blocks (no mask), masked blocks
            begin, end = _run_span(run, first_full, last_full, n_blocks)
            for i_m in range(begin, end):
                dk, dv = _dkdv_block(dk, dv, b_k, b_v, p_q_h, p_do_h, desc_q, desc_do, i_b, i_h, p_lse_h, p_delta_h,
                                     lo + i_m * BLOCK_M, o_m, o_n, o_d, shift, left, right, seqlen_q, seqlen_k,
                                     head_dim, stride_q_s, stride_do_s, qk_scale, softcap_log2, ds_scale, run != 1,
                                     SOFTCAP, EVEN_D, DOT_PRECISION, UPCAST, DESCRIPTORS, SEQ_FIRST)  # fmt: skip
    p_dk += i_b64 * stride_dk_b + i_hk64 * stride_dk_h + (k_start + n_lo) * stride_dk_s
    p_dv += i_b64 * stride_dv_b + i_hk64 * stride_dv_h + (k_start + n_lo) * stride_dv_s
    m_kv = (o_n[:, None] < seqlen_k) & (o_d[None, :] < head_dim)
    tl.store(p_dk + o_r[:, None] * stride_dk_s + o_d[None, :], dk.to(p_dk.dtype.element_ty), mask=m_kv)
    tl.store(p_dv + o_r[:, None] * stride_dv_s + o_d[None, :], dv.to(p_dv.dtype.element_ty), mask=m_kv)


@triton.jit
def _dq_block(dq, b_q, b_do, lse_log2, b_delta, p_k, p_v, desc_k, desc_v, i_b, i_hk, start_n, o_m, o_n, o_d, shift,
              left, right, seqlen_q, seqlen_k, head_dim, stride_k_s, stride_v_s, qk_scale, softcap_log2, ds_scale,
              MASK: tl.constexpr, SOFTCAP: tl.constexpr, EVEN_D: tl.constexpr, DOT_PRECISION: tl.constexpr,
              UPCAST: tl.constexpr, DESCRIPTORS: tl.constexpr, SEQ_FIRST: tl.constexpr):  # fmt: skip
    """Add the keys [start_n, start_n + BLOCK_N) to the query block's dQ."""
    o_j = start_n + o_n
    b_k = _stream_tile(p_k, desc_k, i_b, i_hk, start_n, o_n, stride_k_s, o_d, seqlen_k, head_dim, MASK, EVEN_D,
                       DESCRIPTORS, SEQ_FIRST)  # fmt: skip
    b_v = _stream_tile(p_v, desc_v, i_b, i_hk, start_n, o_n, stride_v_s, o_d, seqlen_k, head_dim, MASK, EVEN_D,
                       DESCRIPTORS, SEQ_FIRST)  # fmt: skip
    b_s, b_t = _scores(b_q, b_k, qk_scale, softcap_log2, SOFTCAP, DOT_PRECISION, UPCAST)  # [M, N]
    b_p = tl.exp2(b_s - lse_log2[:, None])
    if MASK:
        b_p = tl.where(_visible(o_m, o_j, shift, left, right, seqlen_q, seqlen_k), b_p, 0.0)
    b_dp = dot_fp32(b_do, tl.trans(b_v), DOT_PRECISION, UPCAST)  # [M, N]
    b_ds = b_p * (b_dp - b_delta[:, None]) * ds_scale
    if SOFTCAP:
        b_ds = b_ds * (1.0 - b_t * b_t)
    dq += dot_fp32(b_ds.to(b_k.dtype), b_k, DOT_PRECISION, UPCAST)
    return dq


@triton.jit
def _attention_bwd_dq_kernel(
    p_q, p_k, p_v, p_do, p_lse, p_delta, desc_k, desc_v, p_dq, p_cu_seqlens_q, p_cu_seqlens_k,
    seqlen_q, seqlen_k, n_heads_q, group, head_dim, left, right, qk_scale, softcap_log2, ds_scale,
    stride_q_b, stride_q_h, stride_q_s, stride_k_b, stride_k_h, stride_k_s, stride_v_b, stride_v_h, stride_v_s,
    stride_do_b, stride_do_h, stride_do_s, stride_lse_b, stride_lse_h, stride_dq_b, stride_dq_h, stride_dq_s,
    IS_VARLEN: tl.constexpr, SOFTCAP: tl.constexpr, DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr,
    DESCRIPTORS: tl.constexpr, SEQ_FIRST: tl.constexpr, HEADS_FASTEST: tl.constexpr,
):  # fmt: skip
    """dQ of BLOCK_M query rows of one (batch, query head): the sum over the key blocks they see. DESCRIPTORS (dense
    inputs only): K and V are read through desc_k and desc_v (_stream_tile)."""
    i_bh, i_block, n_blocks = _program_blocks(HEADS_FASTEST)
    i_m = n_blocks - 1 - i_block  # the last rows first: under a causal mask they see the most keys
    i_b, i_h = i_bh // n_heads_q, i_bh % n_heads_q
    q_start, seqlen_q = _sequence(i_b, p_cu_seqlens_q, seqlen_q, IS_VARLEN)
    k_start, seqlen_k = _sequence(i_b, p_cu_seqlens_k, seqlen_k, IS_VARLEN)
    m_lo = i_m * BLOCK_M
    if m_lo >= seqlen_q:
        return
    i_b64, i_h64, i_hk64 = i_b.to(tl.int64), i_h.to(tl.int64), (i_h // group).to(tl.int64)
    o_r = tl.arange(0, BLOCK_M)
    o_m = m_lo + o_r
    o_n = tl.arange(0, BLOCK_N)
    o_d = tl.arange(0, BLOCK_D)
    p_q += i_b64 * stride_q_b + i_h64 * stride_q_h + q_start * stride_q_s
    p_do += i_b64 * stride_do_b + i_h64 * stride_do_h + q_start * stride_do_s
    b_q = _load_rows(p_q, m_lo, o_r, stride_q_s, o_d, seqlen_q, head_dim, True, EVEN_D)  # [M, D]
    b_do = _load_rows(p_do, m_lo, o_r, stride_do_s, o_d, seqlen_q, head_dim, True, EVEN_D)  # [M, D]
    p_lse += i_b64 * stride_lse_b + i_h64 * stride_lse_h + q_start
    p_delta += i_b64 * stride_lse_b + i_h64 * stride_lse_h + q_start
    lse_log2 = tl.load(p_lse + o_m, mask=o_m < seqlen_q, other=0.0) * LOG2_E  # [M]
    b_delta = tl.load(p_delta + o_m, mask=o_m < seqlen_q, other=0.0)  # [M]
    p_k += i_b64 * stride_k_b + i_hk64 * stride_k_h + k_start * stride_k_s
    p_v += i_b64 * stride_v_b + i_hk64 * stride_v_h + k_start * stride_v_s
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    shift = seqlen_k - seqlen_q
    lo, n_blocks, first_full, last_full = _key_runs(m_lo, shift, left, right, seqlen_k, BLOCK_M, BLOCK_N)
    for run in tl.static_range(3):  # masked blocks, whole blocks (no mask), masked blocks
        begin, end = _run_span(run, first_full, last_full, n_blocks)
        for i_n in range(begin, end):
            dq = _dq_block(dq, b_q, b_do, lse_log2, b_delta, p_k, p_v, desc_k, desc_v, i_b, i_h // group,
                           lo + i_n * BLOCK_N, o_m, o_n, o_d, shift, left, right, seqlen_q, seqlen_k, head_dim,
                           stride_k_s, stride_v_s, qk_scale, softcap_log2, ds_scale, run != 1, SOFTCAP, EVEN_D,
                           DOT_PRECISION, UPCAST, DESCRIPTORS, SEQ_FIRST)  # fmt: skip
    p_dq += i_b64 * stride_dq_b + i_h64 * stride_dq_h + (q_start + m_lo) * stride_dq_s
    m_q = (o_m[:, None] < seqlen_q) & (o_d[None, :] < head_dim)
    tl.store(p_dq + o_r[:, None] * stride_dq_s + o_d[None, :], dq.to(p_dq.dtype.element_ty), mask=m_q)
