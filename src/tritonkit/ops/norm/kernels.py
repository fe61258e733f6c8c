"""Fused residual-add + RMSNorm / LayerNorm kernels, forward and backward; each schedule a kernel of its own, sharing
``@triton.jit`` helpers.

Semantics follow mamba_ssm's fused add+norm (``rms_norm_fn`` / ``layer_norm_fn``): h = x + residual, y =
normalize(h) * (offset + weight) + bias. Statistics are fp32; dweight and dbias are summed in fp32 per row group into
a workspace and reduced in a fixed order (deterministic). The schedules:

- forward: whole rows in registers, ROWS a program (_norm_fwd_kernel); RMSNorm's rows read twice in chunks where
  that is faster (_rms_norm_fwd_looped_kernel); rows wider than one program holds split across programs, which
  combine their slices' partial statistics once all have published them (_norm_fwd_split_row_kernel);
- backward: whole rows in registers (_norm_bwd_kernel); rows too wide for registers by column blocks, each row's
  terms summed in a phase of their own first (_norm_bwd_row_sums_kernel, then _norm_bwd_columns_kernel with the terms
  given), or shared between the column blocks as they go (_norm_bwd_columns_kernel, SHARED); then the dweight/dbias
  workspaces summed (tritonkit._core.jit.row_groups.sum_partials_kernel).

Which schedule a row width takes, and why, is plan.py's (docs/kernels/norm.md has the measurements).
"""

import triton
import triton.language as tl

from tritonkit._core.jit.dropout import keep_mask
from tritonkit._core.jit.row_groups import row_steps, store_partials
from tritonkit._core.jit.row_sync import publish, publish_and_wait, this_slice, wait_for


@triton.jit
def _offset_weight(p_w, o_n, m_n, offset, HAS_W: tl.constexpr):
    """offset + w at columns o_n in fp32 (0 where masked), or 1.0 without a weight."""
    return tl.load(p_w + o_n, mask=m_n, other=0.0).to(tl.float32) + offset if HAS_W else 1.0


@triton.jit
def _weight_and_bias(p_w, p_b, o_n, m_n, offset, HAS_W: tl.constexpr, HAS_B: tl.constexpr):
    """offset + w and b at columns o_n in fp32 (see _offset_weight; b is 0.0 without a bias)."""
    b_b = tl.load(p_b + o_n, mask=m_n, other=0.0).to(tl.float32) if HAS_B else 0.0
    return _offset_weight(p_w, o_n, m_n, offset, HAS_W), b_b


@triton.jit
def _chunk_h(p_x_row, p_res_row, o_n, m_n, HAS_RES: tl.constexpr, EVICT: tl.constexpr):
    """h = x + residual at columns o_n of one row, in fp32 (0 where masked); EVICT: the loads' L2 policy."""
    b_h = tl.load(p_x_row + o_n, mask=m_n, other=0.0, eviction_policy=EVICT).to(tl.float32)
    if HAS_RES:
        b_h += tl.load(p_res_row + o_n, mask=m_n, other=0.0, eviction_policy=EVICT).to(tl.float32)
    return b_h


@triton.jit
def _store_normalized(p_y_row, p_w, p_b, o_n, m_n, b_h, b_mean, b_rstd, offset, HAS_W: tl.constexpr,
                      HAS_B: tl.constexpr):  # fmt: skip
    """y = (h - mean) * rstd * (offset + w) + b at columns o_n of one row, stored in y's dtype."""
    b_w, b_b = _weight_and_bias(p_w, p_b, o_n, m_n, offset, HAS_W, HAS_B)
    b_y = (b_h - b_mean) * b_rstd
    if HAS_W:
        b_y *= b_w
    if HAS_B:
        b_y += b_b
    tl.store(p_y_row + o_n, b_y.to(p_y_row.dtype.element_ty), mask=m_n)


@triton.jit
def _inputs_sum(p_x, p_x1, p_res, p_rowscale, p_seed, p_keep, o_r, m_r, o_n, m_n, n_rows, n_cols, stride_x_row,
                stride_x1_row, stride_res_row, threshold, keep_scale, HAS_RES: tl.constexpr, HAS_X1: tl.constexpr,
                HAS_ROWSCALE: tl.constexpr, HAS_DROPOUT: tl.constexpr, STORE_KEEP: tl.constexpr):  # fmt: skip
    """The options' h = dropout(rowscale * x) + dropout(x1) + residual at rows o_r and columns o_n, in fp32 (0 where
    masked), and the keep masks of x and x1 (all true without dropout). dropout(v) = v * keep / (1 - p)
    (keep_scale = 1 / (1 - p)); element (r, c) of x is kept by its counter r * N + c, of x1 by (n_rows + r) * N + c
    (tritonkit._core.jit.dropout.keep_mask), and with STORE_KEEP the masks are stored at p_keep + counter."""
    m_rn = m_r[:, None] & m_n[None, :]
    b_h = tl.load(p_x + o_r[:, None] * stride_x_row + o_n[None, :], mask=m_rn, other=0.0).to(tl.float32)
    if HAS_ROWSCALE:
        b_h *= tl.load(p_rowscale + o_r, mask=m_r, other=0.0).to(tl.float32)[:, None]
    b_keep, b_keep1 = m_rn, m_rn
    if HAS_DROPOUT:
        o_counter = o_r[:, None] * n_cols + o_n[None, :]  # int64, as o_r
        b_keep = keep_mask(p_seed, o_counter, threshold)
        b_h = tl.where(b_keep, b_h * keep_scale, 0.0)
        if STORE_KEEP:
            tl.store(p_keep + o_counter, b_keep, mask=m_rn)
    if HAS_X1:
        b_x1 = tl.load(p_x1 + o_r[:, None] * stride_x1_row + o_n[None, :], mask=m_rn, other=0.0).to(tl.float32)
        if HAS_DROPOUT:
            o_counter1 = (n_rows + o_r)[:, None] * n_cols + o_n[None, :]
            b_keep1 = keep_mask(p_seed, o_counter1, threshold)
            b_x1 = tl.where(b_keep1, b_x1 * keep_scale, 0.0)
            if STORE_KEEP:
                tl.store(p_keep + o_counter1, b_keep1, mask=m_rn)
        b_h += b_x1
    if HAS_RES:
        b_h += tl.load(p_res + o_r[:, None] * stride_res_row + o_n[None, :], mask=m_rn, other=0.0).to(tl.float32)
    return b_h, b_keep, b_keep1


@triton.jit
def _norm_fwd_kernel(
    p_x, p_res, p_w, p_b, p_y, p_h, p_mean, p_rstd,
    n_rows, n_cols, stride_x_row, stride_res_row, stride_y_row, stride_h_row, eps, offset,
    IS_RMS: tl.constexpr, HAS_RES: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
    STORE_H: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr, WEIGHT_FIRST: tl.constexpr,
    STORE_STATS: tl.constexpr,
    p_x1=None, p_rowscale=None, p_seed=None, p_keep=None, p_w1=None, p_b1=None, p_y1=None, stride_x1_row=None,
    stride_y1_row=None, threshold=None, keep_scale=None, HAS_X1: tl.constexpr = False,
    HAS_ROWSCALE: tl.constexpr = False, HAS_DROPOUT: tl.constexpr = False, STORE_KEEP: tl.constexpr = False,
    HAS_W1: tl.constexpr = False, HAS_B1: tl.constexpr = False,
):  # fmt: skip
    """Forward of one block of ROWS whole rows in registers.

    h = x + res;  LayerNorm: mean = sum(h)/N, var = sum((h - mean)^2)/N;  RMSNorm: mean = 0,
    var = sum(h^2)/N;  rstd = 1/sqrt(var + eps);  y = (h - mean) * rstd * (offset + w) + b.
    Stores y, h (STORE_H), and with STORE_STATS mean (LayerNorm) and rstd (fp32, for the backward).
    The options, absent by default (constexpr None and False: the plain forward compiles without them):
    h = dropout(rowscale * x) + dropout(x1) + res (_inputs_sum), and with HAS_W1 a second output from the same
    normalised rows, y1 = (h - mean) * rstd * (offset + w1) + b1.
    """
    o_rows = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)
    m_rows = o_rows < n_rows
    o_n = tl.arange(0, BLOCK_N)
    m_n = o_n < n_cols
    # The weight and bias load with x (their latency hidden behind its) when few elements per thread leave
    # registers for them (plan.loads_weight_first); else after the reductions, since live through them the widest
    # rows spill.
    if WEIGHT_FIRST:
        b_w, b_b = _weight_and_bias(p_w, p_b, o_n, m_n, offset, HAS_W, HAS_B)
    m_rn = m_rows[:, None] & m_n[None, :]
    if HAS_X1 or HAS_ROWSCALE or HAS_DROPOUT:
        b_h, _, _ = _inputs_sum(
            p_x, p_x1, p_res, p_rowscale, p_seed, p_keep, o_rows, m_rows, o_n, m_n, n_rows, n_cols, stride_x_row,
            stride_x1_row, stride_res_row, threshold, keep_scale, HAS_RES, HAS_X1, HAS_ROWSCALE, HAS_DROPOUT,
            STORE_KEEP,
        )  # fmt: skip
    else:
        b_h = tl.load(p_x + o_rows[:, None] * stride_x_row + o_n[None, :], mask=m_rn, other=0.0).to(tl.float32)
        if HAS_RES:
            p_res_rn = p_res + o_rows[:, None] * stride_res_row + o_n[None, :]
            b_h += tl.load(p_res_rn, mask=m_rn, other=0.0).to(tl.float32)  # [ROWS, BLOCK_N]
    if STORE_H:
        tl.store(p_h + o_rows[:, None] * stride_h_row + o_n[None, :], b_h.to(p_h.dtype.element_ty), mask=m_rn)
    if IS_RMS:
        b_centered = b_h
    else:
        b_mean = tl.sum(b_h, axis=1) / n_cols  # [ROWS]
        if STORE_STATS:  # evict_last: as rstd's, below
            tl.store(p_mean + o_rows, b_mean, mask=m_rows, eviction_policy="evict_last")
        b_centered = tl.where(m_rn, b_h - b_mean[:, None], 0.0)
    b_rstd = tl.rsqrt(tl.sum(b_centered * b_centered, axis=1) / n_cols + eps)  # [ROWS]
    # evict_last: a row's one element shares its 32-byte sector with other programs' rows; evicted before they
    # fill it, each partial sector likely costs DRAM a read-modify-write
    if STORE_STATS:
        tl.store(p_rstd + o_rows, b_rstd, mask=m_rows, eviction_policy="evict_last")
    b_y = b_centered * b_rstd[:, None]
    if not WEIGHT_FIRST:
        b_w, b_b = _weight_and_bias(p_w, p_b, o_n, m_n, offset, HAS_W, HAS_B)
    if HAS_W:
        b_y *= b_w[None, :]
    if HAS_B:
        b_y += b_b[None, :]
    tl.store(p_y + o_rows[:, None] * stride_y_row + o_n[None, :], b_y.to(p_y.dtype.element_ty), mask=m_rn)
    if HAS_W1:  # the parallel output, from the same normalised rows
        b_w1, b_b1 = _weight_and_bias(p_w1, p_b1, o_n, m_n, offset, HAS_W1, HAS_B1)
        b_y1 = b_centered * b_rstd[:, None] * b_w1[None, :]
        if HAS_B1:
            b_y1 += b_b1[None, :]
        tl.store(p_y1 + o_rows[:, None] * stride_y1_row + o_n[None, :], b_y1.to(p_y1.dtype.element_ty), mask=m_rn)


@triton.jit
def _rms_norm_fwd_looped_kernel(
    p_x, p_res, p_w, p_b, p_y, p_h, p_rstd,
    n_cols, stride_x_row, stride_res_row, stride_y_row, stride_h_row, eps, offset,
    HAS_RES: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, STORE_H: tl.constexpr, BLOCK_N: tl.constexpr,
    LOOP_STAGES: tl.constexpr, STORE_STATS: tl.constexpr,
):  # fmt: skip
    """RMSNorm's forward of one row per program, read in BLOCK_N chunks twice (the widths where that beats one pass
    in registers: plan.FwdLoopedPlan): h = x + res, rstd = 1/sqrt(sum(h^2)/N + eps), then
    y = h * rstd * (offset + w) + b. The first pass keeps the row in L2 for the second (evict_last), the second
    lets it go (evict_first). The gradient is _norm_bwd_kernel's."""
    i_row = tl.program_id(0).to(tl.int64)
    p_x_row = p_x + i_row * stride_x_row
    p_res_row = p_res + i_row * stride_res_row
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for start in tl.range(0, n_cols, BLOCK_N, num_stages=LOOP_STAGES):
        o_n = start + tl.arange(0, BLOCK_N)
        b_h = _chunk_h(p_x_row, p_res_row, o_n, o_n < n_cols, HAS_RES, "evict_last")
        acc += b_h * b_h
    b_rstd = tl.rsqrt(tl.sum(acc, axis=0) / n_cols + eps)
    if STORE_STATS:
        tl.store(p_rstd + i_row, b_rstd)
    for start in tl.range(0, n_cols, BLOCK_N, num_stages=LOOP_STAGES):
        o_n = start + tl.arange(0, BLOCK_N)
        m_n = o_n < n_cols
        b_h = _chunk_h(p_x_row, p_res_row, o_n, m_n, HAS_RES, "evict_first")
        if STORE_H:
            tl.store(p_h + i_row * stride_h_row + o_n, b_h.to(p_h.dtype.element_ty), mask=m_n)
        _store_normalized(p_y + i_row * stride_y_row, p_w, p_b, o_n, m_n, b_h, 0.0, b_rstd, offset, HAS_W, HAS_B)


@triton.jit
def _norm_fwd_split_row_kernel(
    p_x, p_res, p_w, p_b, p_y, p_h, p_mean, p_rstd, p_part, p_count,
    n_rows, n_cols, n_blocks, stride_x_row, stride_res_row, stride_y_row, stride_h_row, eps, offset,
    IS_RMS: tl.constexpr, HAS_RES: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
    STORE_H: tl.constexpr, BLOCK_N: tl.constexpr, SUB_N: tl.constexpr, BLOCKS_P2: tl.constexpr,
    PHASES: tl.constexpr, STORE_STATS: tl.constexpr,
):  # fmt: skip
    """Forward of rows wider than one program holds: ``n_blocks`` programs share a row, one BLOCK_N slice
    each (program id = row * n_blocks + slice).

    Phase 1: h = x + res on the slice (stored if STORE_H); its partial statistics into p_part: RMSNorm
    s_b = sum(h^2); LayerNorm s_b = sum(h) and m_b = sum((h - s_b / n_b)^2) over its n_b columns.
    Phase 2: the row's statistics from its parts, summed in a fixed order: RMSNorm var = sum_b s_b / N;
    LayerNorm mean = sum_b s_b / N, var = (sum_b m_b + sum_b n_b (s_b / n_b - mean)^2) / N (the exact split of
    the squared deviations by slice); rstd = 1/sqrt(var + eps); then y = (h - mean) * rstd * (offset + w) + b
    on the slice in SUB_N pieces, h read again (L2 kept it: evict_last in phase 1). The gradient is
    _norm_bwd_kernel's.
    PHASES: 3 both in one launch, the slice's programs waiting for each other between them
    (_core.row_sync); 1 or 2 one phase per launch.
    """
    i_row, i_block, o_n, m_n = this_slice(n_cols, n_blocks, BLOCK_N)
    p_x_row = p_x + i_row * stride_x_row
    p_res_row = p_res + i_row * stride_res_row
    p_sums = p_part + i_row * n_blocks  # s_b of the row's slices; LayerNorm's m_b n_rows * n_blocks further
    p_squares = p_sums + n_rows * n_blocks
    if PHASES != 2:
        b_h = _chunk_h(p_x_row, p_res_row, o_n, m_n, HAS_RES, "evict_last")
        if STORE_H:
            tl.store(p_h + i_row * stride_h_row + o_n, b_h.to(p_h.dtype.element_ty), mask=m_n)
        if IS_RMS:
            tl.store(p_sums + i_block, tl.sum(b_h * b_h, axis=0))
        else:
            b_sum = tl.sum(b_h, axis=0)
            b_centered = tl.where(m_n, b_h - b_sum / tl.minimum(n_cols - i_block * BLOCK_N, BLOCK_N), 0.0)
            tl.store(p_sums + i_block, b_sum)
            tl.store(p_squares + i_block, tl.sum(b_centered * b_centered, axis=0))
        if PHASES == 3:
            publish_and_wait(p_count + i_row, n_blocks)
    if PHASES != 1:
        o_b = tl.arange(0, BLOCKS_P2)
        m_b = o_b < n_blocks
        # volatile: the parts were written by other programs during this launch; never serve them from L1.
        b_sums = tl.load(p_sums + o_b, mask=m_b, other=0.0, volatile=True)
        if IS_RMS:
            b_mean = 0.0
            b_var = tl.sum(b_sums, axis=0) / n_cols
        else:
            b_mean = tl.sum(b_sums, axis=0) / n_cols
            b_count = tl.maximum(tl.minimum(n_cols - o_b * BLOCK_N, BLOCK_N), 1).to(tl.float32)
            b_between = tl.where(m_b, b_sums / b_count - b_mean, 0.0)
            b_squares = tl.load(p_squares + o_b, mask=m_b, other=0.0, volatile=True)
            b_var = (tl.sum(b_squares, axis=0) + tl.sum(b_count * b_between * b_between, axis=0)) / n_cols
        b_rstd = tl.rsqrt(b_var + eps)
        if STORE_STATS and i_block == 0:
            tl.store(p_rstd + i_row, b_rstd)
            if not IS_RMS:
                tl.store(p_mean + i_row, b_mean)
        # In SUB_N pieces: h, the weight and the bias of the whole slice at once would hold three times the
        # registers phase 1 needs.
        for start in range(0, BLOCK_N, SUB_N):
            o_s = i_block * BLOCK_N + start + tl.arange(0, SUB_N)
            m_s = o_s < n_cols
            b_piece = _chunk_h(p_x_row, p_res_row, o_s, m_s, HAS_RES, "evict_first")  # h, read again
            _store_normalized(p_y + i_row * stride_y_row, p_w, p_b, o_s, m_s, b_piece, b_mean, b_rstd, offset, HAS_W,
                              HAS_B)  # fmt: skip


@triton.jit
def _norm_tile_terms(p_dy, p_x, p_res, p_mean, p_rstd, o_r, m_r, stride_dy_row, stride_x_row, stride_res_row, o_n,
                     m_n, b_w, IS_RMS: tl.constexpr, HAS_RES: tl.constexpr, HAS_W: tl.constexpr,
                     EVICT: tl.constexpr):  # fmt: skip
    """For rows o_r and columns o_n: xhat = (h - mean) * rstd, dy and g = (offset + w) * dy, each
    [rows, columns] (zero where masked), and rstd [rows]. EVICT: the L2 policy of the x, residual and dy loads."""
    m_rn = m_r[:, None] & m_n[None, :]
    b_rstd = tl.load(p_rstd + o_r, mask=m_r, other=0.0)
    p_x_rn = p_x + o_r[:, None] * stride_x_row + o_n[None, :]
    b_h = tl.load(p_x_rn, mask=m_rn, other=0.0, eviction_policy=EVICT).to(tl.float32)
    if HAS_RES:
        p_res_rn = p_res + o_r[:, None] * stride_res_row + o_n[None, :]
        b_h += tl.load(p_res_rn, mask=m_rn, other=0.0, eviction_policy=EVICT).to(tl.float32)
    if IS_RMS:
        b_xhat = b_h * b_rstd[:, None]
    else:
        b_mean = tl.load(p_mean + o_r, mask=m_r, other=0.0)
        b_xhat = tl.where(m_rn, (b_h - b_mean[:, None]) * b_rstd[:, None], 0.0)
    p_dy_rn = p_dy + o_r[:, None] * stride_dy_row + o_n[None, :]
    b_dy = tl.load(p_dy_rn, mask=m_rn, other=0.0, eviction_policy=EVICT).to(tl.float32)
    b_wdy = b_dy * b_w[None, :] if HAS_W else b_dy
    return b_xhat, b_dy, b_wdy, b_rstd


@triton.jit
def _norm_dh(p_dh, o_r, m_r, stride_dh_row, o_n, m_n, b_xhat, b_wdy, b_rstd, c_xhat, c_one, IS_RMS: tl.constexpr,
             HAS_DH: tl.constexpr):  # fmt: skip
    """dh = rstd * (g - xhat * c_xhat - c_one) per row (c_one only for LayerNorm), plus the gradient of
    the returned h (prenorm)."""
    b_dh = b_wdy - b_xhat * c_xhat[:, None]
    if not IS_RMS:
        b_dh -= c_one[:, None]
    b_dh *= b_rstd[:, None]
    if HAS_DH:
        m_rn = m_r[:, None] & m_n[None, :]
        b_dh += tl.load(p_dh + o_r[:, None] * stride_dh_row + o_n[None, :], mask=m_rn, other=0.0).to(tl.float32)
    return b_dh


@triton.jit
def _store_tile_grad(p_dx, p_dres, o_r, m_r, stride_dx_row, stride_dres_row, o_n, m_n, b_dh,
                     STORE_DRES: tl.constexpr):  # fmt: skip
    """dx = dh, and dresidual = dh when it is a tensor of its own (another dtype than x's)."""
    m_rn = m_r[:, None] & m_n[None, :]
    tl.store(p_dx + o_r[:, None] * stride_dx_row + o_n[None, :], b_dh.to(p_dx.dtype.element_ty), mask=m_rn)
    if STORE_DRES:
        p_dres_rn = p_dres + o_r[:, None] * stride_dres_row + o_n[None, :]
        tl.store(p_dres_rn, b_dh.to(p_dres.dtype.element_ty), mask=m_rn)


@triton.jit
def _store_row_parts(p_c_xhat, p_c_one, o_r, m_r, b_xhat, b_wdy, IS_RMS: tl.constexpr):
    """This column block's parts of rows o_r's terms, sum(g * xhat) and (LayerNorm) sum(g), at [row, block]."""
    o_part = o_r * tl.num_programs(0) + tl.program_id(0)
    tl.store(p_c_xhat + o_part, tl.sum(b_xhat * b_wdy, axis=1), mask=m_r)
    if not IS_RMS:
        tl.store(p_c_one + o_part, tl.sum(b_wdy, axis=1), mask=m_r)


@triton.jit
def _combined_row_terms(p_c_xhat, p_c_one, p_count, o_r, m_r, n_cols, IS_RMS: tl.constexpr, BLOCKS_P2: tl.constexpr):
    """c_xhat and c_one of rows o_r: once every column block has published its parts (wait_for on p_count),
    the parts summed in a fixed order."""
    n_blocks = tl.num_programs(0)
    wait_for(p_count, n_blocks)
    o_b = tl.arange(0, BLOCKS_P2)
    o_parts = o_r[:, None] * n_blocks + o_b[None, :]
    m_parts = m_r[:, None] & (o_b < n_blocks)[None, :]
    # volatile: the parts were written by other programs during this launch; never serve them from L1.
    c_xhat = tl.sum(tl.load(p_c_xhat + o_parts, mask=m_parts, other=0.0, volatile=True), axis=1) / n_cols
    c_one = c_xhat
    if not IS_RMS:
        c_one = tl.sum(tl.load(p_c_one + o_parts, mask=m_parts, other=0.0, volatile=True), axis=1) / n_cols
    return c_xhat, c_one


@triton.jit
def _publish_step(p_dy, p_x, p_res, p_w, p_mean, p_rstd, p_c_xhat, p_c_one, p_count, r0, row_end, stride_dy_row,
                  stride_x_row, stride_res_row, o_n, m_n, offset, IS_RMS: tl.constexpr, HAS_RES: tl.constexpr,
                  HAS_W: tl.constexpr, ROWS: tl.constexpr):  # fmt: skip
    """AHEAD: the step of rows [r0, r0 + ROWS): its tile read (kept in L2 for the second read), this column
    block's parts of the row terms stored and published on the step's counter, p_count + r0."""
    o_r = r0 + tl.arange(0, ROWS)
    m_r = o_r < row_end
    b_w = _offset_weight(p_w, o_n, m_n, offset, HAS_W)
    b_xhat, _, b_wdy, _ = _norm_tile_terms(
        p_dy, p_x, p_res, p_mean, p_rstd, o_r, m_r, stride_dy_row, stride_x_row, stride_res_row, o_n, m_n, b_w, IS_RMS,
        HAS_RES, HAS_W, "evict_last",
    )  # fmt: skip
    _store_row_parts(p_c_xhat, p_c_one, o_r, m_r, b_xhat, b_wdy, IS_RMS)
    publish(p_count + r0)


@triton.jit
def _step_terms(p_dy, p_x, p_res, p_w, p_mean, p_rstd, o_r, m_r, stride_dy_row, stride_x_row, stride_res_row, o_n,
                m_n, b_w, offset, acc_dw, acc_db, IS_RMS: tl.constexpr, HAS_RES: tl.constexpr, HAS_W: tl.constexpr,
                LOW_REGISTERS: tl.constexpr, EVICT: tl.constexpr):  # fmt: skip
    """A step's tile terms (_norm_tile_terms). With LOW_REGISTERS the weight is reloaded here (from cache) instead
    of held, and dw, db are summed before the row terms, so that dy is dead across those sums."""
    if LOW_REGISTERS:
        b_w = _offset_weight(p_w, o_n, m_n, offset, HAS_W)
    b_xhat, b_dy, b_wdy, b_rstd = _norm_tile_terms(
        p_dy, p_x, p_res, p_mean, p_rstd, o_r, m_r, stride_dy_row, stride_x_row, stride_res_row, o_n, m_n, b_w,
        IS_RMS, HAS_RES, HAS_W, EVICT,
    )  # fmt: skip
    if LOW_REGISTERS:
        acc_dw += tl.sum(b_dy * b_xhat, axis=0)
        acc_db += tl.sum(b_dy, axis=0)
    return b_xhat, b_dy, b_wdy, b_rstd, acc_dw, acc_db


@triton.jit
def _step_grads(p_dh, p_dx, p_dres, o_r, m_r, stride_dh_row, stride_dx_row, stride_dres_row, o_n, m_n, b_xhat, b_dy,
                b_wdy, b_rstd, c_xhat, c_one, acc_dw, acc_db, IS_RMS: tl.constexpr, HAS_DH: tl.constexpr,
                STORE_DRES: tl.constexpr, LOW_REGISTERS: tl.constexpr):  # fmt: skip
    """A step's dx (and dresidual) from its row terms, and (unless _step_terms did) its share of dw, db: in this
    order, as the tables were measured (the other order made fp32 RMSNorm at 2048 8% slower)."""
    b_dh = _norm_dh(p_dh, o_r, m_r, stride_dh_row, o_n, m_n, b_xhat, b_wdy, b_rstd, c_xhat, c_one, IS_RMS, HAS_DH)
    _store_tile_grad(p_dx, p_dres, o_r, m_r, stride_dx_row, stride_dres_row, o_n, m_n, b_dh, STORE_DRES)
    if not LOW_REGISTERS:
        acc_dw += tl.sum(b_dy * b_xhat, axis=0)
        acc_db += tl.sum(b_dy, axis=0)
    return acc_dw, acc_db


@triton.jit
def _norm_bwd_kernel(
    p_dy, p_dh, p_x, p_res, p_w, p_mean, p_rstd, p_dx, p_dres, p_dw_part, p_db_part,
    n_rows, n_cols, rows_per_program, stride_dy_row, stride_dh_row, stride_x_row, stride_res_row,
    stride_dx_row, stride_dres_row, offset,
    IS_RMS: tl.constexpr, HAS_RES: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
    HAS_DH: tl.constexpr, STORE_DRES: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
    LOOP_STAGES: tl.constexpr, LOW_REGISTERS: tl.constexpr, INTERLEAVED: tl.constexpr,
):  # fmt: skip
    """Backward over whole rows in registers: row group program_id(0) takes ROWS rows a step (row_steps), each
    row's terms summed from its own tile.

    With xhat = (h - mean) * rstd and g = (offset + w) * dy, and per row c_xhat = mean(g * xhat) and
    c_one = mean(g):
      RMSNorm:   dh = rstd * (g - xhat * c_xhat)
      LayerNorm: dh = rstd * (g - xhat * c_xhat - c_one)
    plus the gradient of the returned h (prenorm); dx = dres = dh. dw = sum_rows(dy * xhat), db = sum_rows(dy): each
    row group's share goes to its row of the fp32 workspaces (store_partials), summed by sum_partials_kernel.
    """
    o_n = tl.arange(0, BLOCK_N)
    m_n = o_n < n_cols
    i_part = tl.program_id(0).to(tl.int64)
    row_start, row_end, row_step = row_steps(i_part, rows_per_program, n_rows, ROWS, INTERLEAVED)
    b_w = _offset_weight(p_w, o_n, m_n, offset, HAS_W) if not LOW_REGISTERS else 0.0
    acc_dw = tl.zeros((BLOCK_N,), dtype=tl.float32)
    acc_db = tl.zeros((BLOCK_N,), dtype=tl.float32)
    # ROWS rows per iteration, and with LOOP_STAGES > 1 the next iteration's loads issued (cp.async) while this one
    # is reduced: more loads in flight per program than one row at a time.
    for r0 in tl.range(row_start, row_end, row_step, num_stages=LOOP_STAGES):
        o_r = r0 + tl.arange(0, ROWS)
        m_r = o_r < row_end
        b_xhat, b_dy, b_wdy, b_rstd, acc_dw, acc_db = _step_terms(
            p_dy, p_x, p_res, p_w, p_mean, p_rstd, o_r, m_r, stride_dy_row, stride_x_row, stride_res_row, o_n, m_n,
            b_w, offset, acc_dw, acc_db, IS_RMS, HAS_RES, HAS_W, LOW_REGISTERS, "",
        )  # fmt: skip
        c_xhat = tl.sum(b_xhat * b_wdy, axis=1) / n_cols  # [ROWS]
        c_one = tl.sum(b_wdy, axis=1) / n_cols
        acc_dw, acc_db = _step_grads(
            p_dh, p_dx, p_dres, o_r, m_r, stride_dh_row, stride_dx_row, stride_dres_row, o_n, m_n, b_xhat, b_dy,
            b_wdy, b_rstd, c_xhat, c_one, acc_dw, acc_db, IS_RMS, HAS_DH, STORE_DRES, LOW_REGISTERS,
        )  # fmt: skip
    store_partials(p_dw_part, p_db_part, i_part, n_cols, o_n, m_n, acc_dw, acc_db, HAS_W, HAS_B)


@triton.jit
def _norm_bwd_options_kernel(
    p_dy, p_dy1, p_dh, p_x, p_x1, p_res, p_rowscale, p_seed, p_w, p_w1, p_mean, p_rstd,
    p_dx, p_dx1, p_dres, p_dw_part, p_db_part, p_dw1_part, p_db1_part,
    n_rows, n_cols, rows_per_program, stride_dy_row, stride_dy1_row, stride_dh_row, stride_x_row, stride_x1_row,
    stride_res_row, stride_dx_row, stride_dx1_row, stride_dres_row, offset, threshold, keep_scale,
    IS_RMS: tl.constexpr, HAS_RES: tl.constexpr, HAS_X1: tl.constexpr, HAS_ROWSCALE: tl.constexpr,
    HAS_DROPOUT: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, HAS_W1: tl.constexpr, HAS_B1: tl.constexpr,
    HAS_DH: tl.constexpr, STORE_DX1: tl.constexpr, STORE_DRES: tl.constexpr, ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr, LOOP_STAGES: tl.constexpr, INTERLEAVED: tl.constexpr,
):  # fmt: skip
    """Backward of the options (dropout, rowscale, x1, the parallel output y1) over whole rows in registers, in
    _norm_bwd_kernel's loop: h made again as the forward made it (_inputs_sum: the masks come back from the seed),
    and with y1 = xhat * (offset + w1) + b1, g = (offset + w) * dy + (offset + w1) * dy1. As there,
    dh = rstd * (g - xhat * c_xhat [- c_one]) plus the gradient of the returned h; then
      dresidual = dh,  dx = dh * keep / (1 - p) * rowscale,  dx1 = dh * keep1 / (1 - p),
      dw = sum_rows(dy * xhat), db = sum_rows(dy), dw1 = sum_rows(dy1 * xhat), db1 = sum_rows(dy1),
    each row group's share of the last four to its workspace rows. Where they equal dh (STORE_DRES, STORE_DX1 off)
    dx serves as dresidual and dx1 too.
    """
    o_n = tl.arange(0, BLOCK_N)
    m_n = o_n < n_cols
    i_part = tl.program_id(0).to(tl.int64)
    row_start, row_end, row_step = row_steps(i_part, rows_per_program, n_rows, ROWS, INTERLEAVED)
    b_w = _offset_weight(p_w, o_n, m_n, offset, HAS_W)
    b_w1 = _offset_weight(p_w1, o_n, m_n, offset, HAS_W1)
    acc_dw = tl.zeros((BLOCK_N,), dtype=tl.float32)
    acc_db = tl.zeros((BLOCK_N,), dtype=tl.float32)
    acc_dw1 = tl.zeros((BLOCK_N,), dtype=tl.float32)
    acc_db1 = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for r0 in tl.range(row_start, row_end, row_step, num_stages=LOOP_STAGES):
        o_r = r0 + tl.arange(0, ROWS)
        m_r = o_r < row_end
        m_rn = m_r[:, None] & m_n[None, :]
        b_h, b_keep, b_keep1 = _inputs_sum(
            p_x, p_x1, p_res, p_rowscale, p_seed, p_x, o_r, m_r, o_n, m_n, n_rows, n_cols, stride_x_row,
            stride_x1_row, stride_res_row, threshold, keep_scale, HAS_RES, HAS_X1, HAS_ROWSCALE, HAS_DROPOUT, False,
        )  # fmt: skip
        b_rstd = tl.load(p_rstd + o_r, mask=m_r, other=0.0)
        if IS_RMS:
            b_xhat = b_h * b_rstd[:, None]
        else:
            b_mean = tl.load(p_mean + o_r, mask=m_r, other=0.0)
            b_xhat = tl.where(m_rn, (b_h - b_mean[:, None]) * b_rstd[:, None], 0.0)
        b_dy = tl.load(p_dy + o_r[:, None] * stride_dy_row + o_n[None, :], mask=m_rn, other=0.0).to(tl.float32)
        b_wdy = b_dy * b_w[None, :] if HAS_W else b_dy
        acc_dw += tl.sum(b_dy * b_xhat, axis=0)
        acc_db += tl.sum(b_dy, axis=0)
        if HAS_W1:
            p_dy1_rn = p_dy1 + o_r[:, None] * stride_dy1_row + o_n[None, :]
            b_dy1 = tl.load(p_dy1_rn, mask=m_rn, other=0.0).to(tl.float32)  # [ROWS, BLOCK_N]
            b_wdy += b_dy1 * b_w1[None, :]
            acc_dw1 += tl.sum(b_dy1 * b_xhat, axis=0)
            acc_db1 += tl.sum(b_dy1, axis=0)
        c_xhat = tl.sum(b_xhat * b_wdy, axis=1) / n_cols  # [ROWS]
        c_one = tl.sum(b_wdy, axis=1) / n_cols
        b_dh = _norm_dh(p_dh, o_r, m_r, stride_dh_row, o_n, m_n, b_xhat, b_wdy, b_rstd, c_xhat, c_one, IS_RMS, HAS_DH)
        if STORE_DRES:
            _store_tile_grad(p_dres, p_dres, o_r, m_r, stride_dres_row, 0, o_n, m_n, b_dh, False)
        b_dx = tl.where(b_keep, b_dh * keep_scale, 0.0) if HAS_DROPOUT else b_dh
        if HAS_ROWSCALE:
            b_dx *= tl.load(p_rowscale + o_r, mask=m_r, other=0.0).to(tl.float32)[:, None]
        _store_tile_grad(p_dx, p_dx, o_r, m_r, stride_dx_row, 0, o_n, m_n, b_dx, False)
        if STORE_DX1:
            b_dx1 = tl.where(b_keep1, b_dh * keep_scale, 0.0) if HAS_DROPOUT else b_dh
            _store_tile_grad(p_dx1, p_dx1, o_r, m_r, stride_dx1_row, 0, o_n, m_n, b_dx1, False)
    store_partials(p_dw_part, p_db_part, i_part, n_cols, o_n, m_n, acc_dw, acc_db, HAS_W, HAS_B)
    store_partials(p_dw1_part, p_db1_part, i_part, n_cols, o_n, m_n, acc_dw1, acc_db1, HAS_W1, HAS_B1)


@triton.jit
def _norm_bwd_columns_kernel(
    p_dy, p_dh, p_x, p_res, p_w, p_mean, p_rstd, p_c_xhat, p_c_one, p_count, p_dx, p_dres, p_dw_part, p_db_part,
    n_rows, n_cols, rows_per_program, stride_dy_row, stride_dh_row, stride_x_row, stride_res_row,
    stride_dx_row, stride_dres_row, offset,
    IS_RMS: tl.constexpr, HAS_RES: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
    HAS_DH: tl.constexpr, STORE_DRES: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCKS_P2: tl.constexpr, LOOP_STAGES: tl.constexpr, LOW_REGISTERS: tl.constexpr, SHARED: tl.constexpr,
    AHEAD: tl.constexpr,
):  # fmt: skip
    """Backward of rows too wide for registers, by column blocks: column block program_id(0) of row group
    program_id(1)'s block of rows, ROWS rows a step. Each row's terms c_xhat and c_one are

    - given (not SHARED): p_c_xhat, p_c_one hold them, from _norm_bwd_row_sums_kernel run before;
    - or SHARED: each column block stores its part of each step's terms (p_c_xhat, p_c_one as [rows, column blocks]),
      publishes them on the step's counter (p_count: one per step's first row), waits for the row's other column
      blocks (tritonkit._core.jit.row_sync) and sums the parts in a fixed order. With AHEAD a block publishes its parts
      of the next step before it waits for this step's, and reads this step's tile again (from L2) after: the wait
      then finds the other blocks one step ahead, not at the same barrier.

    With xhat = (h - mean) * rstd and g = (offset + w) * dy, and per row c_xhat = mean(g * xhat) and
    c_one = mean(g):
      RMSNorm:   dh = rstd * (g - xhat * c_xhat)
      LayerNorm: dh = rstd * (g - xhat * c_xhat - c_one)
    plus the gradient of the returned h (prenorm); dx = dres = dh. dw = sum_rows(dy * xhat), db = sum_rows(dy): each
    row group's share goes to its row of the fp32 workspaces (store_partials), summed by sum_partials_kernel.
    """
    o_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    m_n = o_n < n_cols
    i_part = tl.program_id(1).to(tl.int64)
    row_start, row_end, row_step = row_steps(i_part, rows_per_program, n_rows, ROWS, False)
    b_w = _offset_weight(p_w, o_n, m_n, offset, HAS_W) if not LOW_REGISTERS else 0.0
    acc_dw = tl.zeros((BLOCK_N,), dtype=tl.float32)
    acc_db = tl.zeros((BLOCK_N,), dtype=tl.float32)
    if AHEAD:  # noqa: SIM102 (a constexpr test, then a runtime one: Triton prunes the first at compile time)
        if row_start < row_end:  # the first step's parts; each iteration then publishes the next one's
            _publish_step(p_dy, p_x, p_res, p_w, p_mean, p_rstd, p_c_xhat, p_c_one, p_count, row_start, row_end,
                          stride_dy_row, stride_x_row, stride_res_row, o_n, m_n, offset, IS_RMS, HAS_RES, HAS_W,
                          ROWS)  # fmt: skip
    for r0 in tl.range(row_start, row_end, row_step, num_stages=LOOP_STAGES):
        o_r = r0 + tl.arange(0, ROWS)
        m_r = o_r < row_end
        if AHEAD:  # noqa: SIM102 (as above)
            if r0 + row_step < row_end:
                _publish_step(p_dy, p_x, p_res, p_w, p_mean, p_rstd, p_c_xhat, p_c_one, p_count, r0 + row_step,
                              row_end, stride_dy_row, stride_x_row, stride_res_row, o_n, m_n, offset, IS_RMS,
                              HAS_RES, HAS_W, ROWS)  # fmt: skip
        b_xhat, b_dy, b_wdy, b_rstd, acc_dw, acc_db = _step_terms(
            p_dy, p_x, p_res, p_w, p_mean, p_rstd, o_r, m_r, stride_dy_row, stride_x_row, stride_res_row, o_n, m_n,
            b_w, offset, acc_dw, acc_db, IS_RMS, HAS_RES, HAS_W, LOW_REGISTERS, "evict_first" if AHEAD else "",
        )  # fmt: skip
        if SHARED:
            if not AHEAD:
                _store_row_parts(p_c_xhat, p_c_one, o_r, m_r, b_xhat, b_wdy, IS_RMS)
                publish(p_count + r0)
            c_xhat, c_one = _combined_row_terms(p_c_xhat, p_c_one, p_count + r0, o_r, m_r, n_cols, IS_RMS,
                                                BLOCKS_P2)  # fmt: skip
        else:
            c_xhat = tl.load(p_c_xhat + o_r, mask=m_r, other=0.0)
            c_one = c_xhat if IS_RMS else tl.load(p_c_one + o_r, mask=m_r, other=0.0)
        acc_dw, acc_db = _step_grads(
            p_dh, p_dx, p_dres, o_r, m_r, stride_dh_row, stride_dx_row, stride_dres_row, o_n, m_n, b_xhat, b_dy,
            b_wdy, b_rstd, c_xhat, c_one, acc_dw, acc_db, IS_RMS, HAS_DH, STORE_DRES, LOW_REGISTERS,
        )  # fmt: skip
    store_partials(p_dw_part, p_db_part, i_part, n_cols, o_n, m_n, acc_dw, acc_db, HAS_W, HAS_B)


@triton.jit
def _norm_bwd_row_sums_kernel(
    p_dy, p_x, p_res, p_w, p_mean, p_rstd, p_c_xhat, p_c_one,
    n_cols, stride_dy_row, stride_x_row, stride_res_row, offset,
    IS_RMS: tl.constexpr, HAS_RES: tl.constexpr, HAS_W: tl.constexpr, BLOCK_N: tl.constexpr,
    LOOP_STAGES: tl.constexpr,
):  # fmt: skip
    """Wide rows, backward phase 1, one program per row, BLOCK_N columns per step: the row terms of dh,
    c_xhat = mean(g * xhat) and (LayerNorm) c_one = mean(g), in fp32."""
    o_r = tl.program_id(0).to(tl.int64) + tl.arange(0, 1)
    m_r = o_r >= 0  # [1], all true: the grid has one program per row
    acc_xhat = tl.zeros((1, BLOCK_N), dtype=tl.float32)
    acc_one = tl.zeros((1, BLOCK_N), dtype=tl.float32)
    for start in tl.range(0, n_cols, BLOCK_N, num_stages=LOOP_STAGES):
        o_n = start + tl.arange(0, BLOCK_N)
        m_n = o_n < n_cols
        b_w = _offset_weight(p_w, o_n, m_n, offset, HAS_W)
        b_xhat, _, b_wdy, _ = _norm_tile_terms(
            p_dy, p_x, p_res, p_mean, p_rstd, o_r, m_r, stride_dy_row, stride_x_row, stride_res_row, o_n, m_n,
            b_w, IS_RMS, HAS_RES, HAS_W, "",
        )  # fmt: skip
        acc_xhat += b_xhat * b_wdy
        acc_one += b_wdy
    tl.store(p_c_xhat + o_r, tl.sum(acc_xhat, axis=1) / n_cols)
    if not IS_RMS:
        tl.store(p_c_one + o_r, tl.sum(acc_one, axis=1) / n_cols)
