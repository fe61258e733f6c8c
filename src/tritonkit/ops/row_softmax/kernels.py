"""Softmax and log-softmax kernels: whole rows in registers, and rows split across programs.

Whole rows (up to the widest the plans allow) are reduced in one program's registers, ROWS rows at a time, or by a
grid of a few programs per SM looping over row blocks. Longer rows are split across programs: each takes a slice,
publishes the slice's maximum m_b and sum s_b of exp(x - m_b), and once all of the row's programs have
(tritonkit._core.jit.row_sync), combines them, s = sum_b s_b exp(m_b - m), and writes its slice. Rows that are
entirely -inf give NaN, as torch does; a maximum of -inf is replaced by 0 in exponents so that partly masked rows
stay exact.
"""

import triton
import triton.language as tl

from tritonkit._core.jit.fastmath import exp_via_exp2
from tritonkit._core.jit.online_softmax import combined_max_and_sum, finite_or_zero
from tritonkit._core.jit.row_sync import publish_and_wait, this_slice


@triton.jit
def _softmax_fwd_block(p_x, p_y, p_lse, i_block, n_rows, n_cols, stride_x_row, stride_y_row, LOG: tl.constexpr,
                       ROWS: tl.constexpr, BLOCK_N: tl.constexpr, STORE_LSE: tl.constexpr):  # fmt: skip
    """ROWS whole rows in registers: the max and sum of one read, then the output (and with STORE_LSE the rows'
    lse, which only a backward reads)."""
    o_rows = (i_block * ROWS + tl.arange(0, ROWS)).to(tl.int64)
    o_n = tl.arange(0, BLOCK_N)
    m_rn = (o_rows < n_rows)[:, None] & (o_n < n_cols)[None, :]
    b_x = tl.load(p_x + o_rows[:, None] * stride_x_row + o_n[None, :], mask=m_rn, other=float("-inf"))
    b_x = b_x.to(tl.float32)  # [ROWS, BLOCK_N]
    b_m = finite_or_zero(tl.max(b_x, axis=1))[:, None]
    b_p = tl.exp(b_x - b_m)
    b_s = tl.sum(b_p, axis=1)[:, None]
    b_lse = b_m + tl.log(b_s)  # [ROWS, 1]
    if STORE_LSE:  # evict_last, as the norms' statistics: one element a row, the other rows' programs fill its sector
        tl.store(p_lse + o_rows, tl.sum(b_lse, axis=1), mask=o_rows < n_rows, eviction_policy="evict_last")
    b_y = b_x - b_lse if LOG else b_p * (1.0 / b_s)  # one reciprocal per row, not a divide per element
    tl.store(p_y + o_rows[:, None] * stride_y_row + o_n[None, :], b_y.to(p_y.dtype.element_ty), mask=m_rn)


@triton.jit
def _softmax_fwd_kernel(
    p_x, p_y, p_lse, n_rows, n_cols, stride_x_row, stride_y_row,
    LOG: tl.constexpr, GRID_LOOP: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
    LOOP_STAGES: tl.constexpr, STORE_LSE: tl.constexpr,
):  # fmt: skip
    """softmax: y = exp(x - lse);  log_softmax: y = x - lse;  lse = m + log(s), m = max(x),
    s = sum(exp(x - m)). lse is stored (fp32) for the backward with STORE_LSE. Whole rows, ROWS a block."""
    if not GRID_LOOP:
        _softmax_fwd_block(p_x, p_y, p_lse, tl.program_id(0), n_rows, n_cols, stride_x_row, stride_y_row, LOG, ROWS,
                           BLOCK_N, STORE_LSE)  # fmt: skip
    else:
        # A grid of a few programs per SM looping over row blocks, the next block's loads issued (cp.async)
        # while this one is reduced: with one wide row per program an SM otherwise idles its memory while
        # it computes the exps and reductions.
        for i_block in tl.range(tl.program_id(0), tl.cdiv(n_rows, ROWS), tl.num_programs(0), num_stages=LOOP_STAGES):
            _softmax_fwd_block(p_x, p_y, p_lse, i_block, n_rows, n_cols, stride_x_row, stride_y_row, LOG, ROWS,
                               BLOCK_N, STORE_LSE)  # fmt: skip


@triton.jit
def _softmax_bwd_block(p_dy, p_x, p_lse, p_dx, i_block, n_rows, n_cols, stride_dy_row, stride_x_row, stride_dx_row,
                       LOG: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    """ROWS whole rows in registers: the row sum c, then dx."""
    o_rows = (i_block * ROWS + tl.arange(0, ROWS)).to(tl.int64)
    o_n = tl.arange(0, BLOCK_N)
    m_rn = (o_rows < n_rows)[:, None] & (o_n < n_cols)[None, :]
    b_dy = tl.load(p_dy + o_rows[:, None] * stride_dy_row + o_n[None, :], mask=m_rn, other=0.0).to(tl.float32)
    b_x = tl.load(p_x + o_rows[:, None] * stride_x_row + o_n[None, :], mask=m_rn, other=float("-inf"))
    b_lse = tl.load(p_lse + o_rows, mask=o_rows < n_rows, other=0.0)[:, None]
    b_p = tl.exp(b_x.to(tl.float32) - b_lse)  # [ROWS, BLOCK_N]
    b_p = b_p * (1.0 / tl.sum(b_p, axis=1))[:, None]  # lse's rounding, shared by every p, divided out
    c = tl.sum(b_dy if LOG else b_dy * b_p, axis=1)[:, None]
    b_dx = b_dy - b_p * c if LOG else b_p * (b_dy - c)
    tl.store(p_dx + o_rows[:, None] * stride_dx_row + o_n[None, :], b_dx.to(p_dx.dtype.element_ty), mask=m_rn)


@triton.jit
def _softmax_bwd_kernel(
    p_dy, p_x, p_lse, p_dx, n_rows, n_cols, stride_dy_row, stride_x_row, stride_dx_row,
    LOG: tl.constexpr, GRID_LOOP: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
    LOOP_STAGES: tl.constexpr,
):  # fmt: skip
    """With p = exp(x - lse) recomputed in fp32 from the input:
    softmax: dx = p * (dy - sum(dy * p));  log_softmax: dx = dy - p * sum(dy).
    Recomputing beats reading a stored 16-bit output. exp(y) of a bf16 log-probability is off by
    |y| * 2**-8 relative (4% at y = -10), and a near one-hot softmax row cancels dy - sum(dy * y).
    The recomputed p are divided by their sum: lse's own fp32 rounding (up to 2**-24 |lse|, 4e-6 at logits near
    100) scales every p alike, and a near one-hot row would carry it into dy - sum(dy * p) as an absolute error of
    that size times |dy| (1.1e-5 seen at logits 30 x N(0, 1), 30 times torch's own fp32 backward).
    Programs as in _softmax_fwd_kernel."""
    if not GRID_LOOP:
        _softmax_bwd_block(p_dy, p_x, p_lse, p_dx, tl.program_id(0), n_rows, n_cols, stride_dy_row, stride_x_row,
                           stride_dx_row, LOG, ROWS, BLOCK_N)  # fmt: skip
    else:
        for i_block in tl.range(tl.program_id(0), tl.cdiv(n_rows, ROWS), tl.num_programs(0), num_stages=LOOP_STAGES):
            _softmax_bwd_block(p_dy, p_x, p_lse, p_dx, i_block, n_rows, n_cols, stride_dy_row, stride_x_row,
                               stride_dx_row, LOG, ROWS, BLOCK_N)  # fmt: skip


@triton.jit
def _softmax_fwd_split_row_kernel(
    p_x, p_y, p_lse, p_part, p_count, n_rows, n_cols, n_blocks, stride_x_row, stride_y_row,
    LOG: tl.constexpr, BLOCK_N: tl.constexpr, BLOCKS_P2: tl.constexpr, PHASES: tl.constexpr,
):  # fmt: skip
    """Forward of rows wider than one program holds: ``n_blocks`` programs share a row, one BLOCK_N slice
    each (program id = row * n_blocks + slice).

    Phase 1 stores the slice's m_b = max(x) and s_b = sum(p_b), p_b = exp(x - m_b). Phase 2: m = max_b m_b,
    s = sum_b s_b exp(m_b - m) (a fixed order), lse = m + log(s); softmax y = p_b * (exp(m_b - m) / s),
    log_softmax y = x - lse on the slice. PHASES: 3 both in one launch, the row's programs waiting for each
    other between them (_core.row_sync), the slice held in registers across the wait (p_b for softmax, x for
    log_softmax): one exp an element and one read; 1 or 2 one phase per launch, phase 2 reading x again and
    taking p_b = exp(x - m_b) anew.
    """
    i_row, i_block, o_n, m_n = this_slice(n_cols, n_blocks, BLOCK_N)
    p_x_row = p_x + i_row * stride_x_row
    p_maxes = p_part + i_row * n_blocks
    p_sums = p_maxes + n_rows * n_blocks
    if PHASES != 2:
        b_x = tl.load(p_x_row + o_n, mask=m_n, other=float("-inf")).to(tl.float32)
        b_m = tl.max(b_x, axis=0)
        b_p = exp_via_exp2(b_x - finite_or_zero(b_m))
        tl.store(p_maxes + i_block, b_m)
        tl.store(p_sums + i_block, tl.sum(b_p, axis=0))
        if PHASES == 3:
            publish_and_wait(p_count + i_row, n_blocks)
    if PHASES != 1:
        o_b = tl.arange(0, BLOCKS_P2)
        # volatile: the parts were written by other programs during this launch; never serve them from L1.
        b_maxes = tl.load(p_maxes + o_b, mask=o_b < n_blocks, other=float("-inf"), volatile=True)
        b_sums = tl.load(p_sums + o_b, mask=o_b < n_blocks, other=0.0, volatile=True)
        m_safe, s = combined_max_and_sum(b_maxes, b_sums)
        lse = m_safe + tl.log(s)
        if i_block == 0:
            tl.store(p_lse + i_row, lse)
        if PHASES == 2:
            b_m = tl.load(p_maxes + i_block)
            b_x = tl.load(p_x_row + o_n, mask=m_n, other=float("-inf")).to(tl.float32)
            b_p = exp_via_exp2(b_x - finite_or_zero(b_m))
        # exp(m_b - m) from the slice's own maximum: 0 for a slice of -inf alone, whose p_b is 0 (never 0 * inf)
        b_y = b_x - lse if LOG else b_p * (exp_via_exp2(b_m - m_safe) / s)
        tl.store(p_y + i_row * stride_y_row + o_n, b_y.to(p_y.dtype.element_ty), mask=m_n)


@triton.jit
def _softmax_bwd_split_row_kernel(
    p_dy, p_x, p_lse, p_dx, p_part, p_count, n_rows, n_cols, n_blocks, stride_dy_row, stride_x_row, stride_dx_row,
    LOG: tl.constexpr, BLOCK_N: tl.constexpr, BLOCKS_P2: tl.constexpr, PHASES: tl.constexpr,
):  # fmt: skip
    """Backward of rows wider than one program holds, slices and PHASES as _softmax_fwd_split_row_kernel's.
    With p = exp(x - lse): phase 1 the slice's part of c, sum(dy) (log_softmax) or sum(dy * p) (softmax), and of
    sum(p); phase 2 c and the total = the parts' sums in a fixed order, p divided by the total (as in
    _softmax_bwd_kernel), then dx = dy - p * c or p * (dy - c / total) on the slice. In one launch (PHASES 3) dy
    and p stay in registers across the wait; in two, phase 2 reads dy and x again."""
    i_row, i_block, o_n, m_n = this_slice(n_cols, n_blocks, BLOCK_N)
    p_dy_row = p_dy + i_row * stride_dy_row
    p_x_row = p_x + i_row * stride_x_row
    p_parts = p_part + i_row * n_blocks
    p_sums = p_parts + n_rows * n_blocks
    lse = tl.load(p_lse + i_row)
    if PHASES != 2:
        b_dy = tl.load(p_dy_row + o_n, mask=m_n, other=0.0).to(tl.float32)
        b_p = exp_via_exp2(tl.load(p_x_row + o_n, mask=m_n, other=float("-inf")).to(tl.float32) - lse)
        tl.store(p_parts + i_block, tl.sum(b_dy if LOG else b_dy * b_p, axis=0))
        tl.store(p_sums + i_block, tl.sum(b_p, axis=0))
        if PHASES == 3:
            publish_and_wait(p_count + i_row, n_blocks)
    if PHASES != 1:
        o_b = tl.arange(0, BLOCKS_P2)
        c = tl.sum(tl.load(p_parts + o_b, mask=o_b < n_blocks, other=0.0, volatile=True), axis=0)
        inv_total = 1.0 / tl.sum(tl.load(p_sums + o_b, mask=o_b < n_blocks, other=0.0, volatile=True), axis=0)
        if PHASES == 2:
            b_dy = tl.load(p_dy_row + o_n, mask=m_n, other=0.0).to(tl.float32)
            b_p = exp_via_exp2(tl.load(p_x_row + o_n, mask=m_n, other=float("-inf")).to(tl.float32) - lse)
        b_p = b_p * inv_total  # lse's rounding divided out, as in _softmax_bwd_kernel
        b_dx = b_dy - b_p * c if LOG else b_p * (b_dy - c * inv_total)
        tl.store(p_dx + i_row * stride_dx_row + o_n, b_dx.to(p_dx.dtype.element_ty), mask=m_n)
