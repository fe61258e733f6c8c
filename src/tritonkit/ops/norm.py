"""Fused residual-add + RMSNorm / LayerNorm, forward and backward, as torch custom ops.

Semantics follow the fused add+norm of mamba_ssm's ``rms_norm_fn`` / ``layer_norm_fn``:
``h = x + residual`` (when given), ``y = normalize(h) * (offset + weight) + bias``; with
``prenorm=True`` the call returns ``(y, h)``, ``h`` in fp32 when ``residual_in_fp32=True``.
One kernel pair serves both norms (an ``IS_RMS`` switch). Rows up to 16384 wide are normalised in
registers in one pass; wider rows are split across programs forward (each slice's partial statistics,
combined once the row's programs have all published theirs), and backward go by column blocks, each
row's terms summed first in a phase of their own, or shared between the blocks as they go where that was
measured faster (fp32, and bf16 RMSNorm without a bias: shared_wide_tile).
Statistics are fp32; dweight and dbias are summed in fp32 per program into a workspace and reduced in a
fixed order, so they are deterministic. With a residual, one gradient tensor serves x and the residual
when their dtypes agree.

No ``from __future__ import annotations`` here: torch.library reads the launchers' type hints at runtime.
"""

# ruff: noqa: UP045 - torch.library's schema inference (torch 2.6 and up) is built on typing.Optional

import functools
import math
from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl

from tritonkit._core import alloc
from tritonkit._core.checks import FLOAT_DTYPES, check_device, check_tensor
from tritonkit._core.device import pipeline_depth, sm_count
from tritonkit._core.dispatch import cheapest_path
from tritonkit._core.ints import cdiv, next_power_of_2, prev_power_of_2
from tritonkit._core.layout import as_rows
from tritonkit._core.row_sync import (
    launch_split_rows,
    publish,
    publish_and_wait,
    row_counters,
    this_slice,
    wait_for,
    waits_safely,
)
from tritonkit.registry import Inputs, KernelSpec, Tolerance, register

__all__ = ["layer_norm", "rms_norm"]

MAX_SINGLE_PASS = 16384  # widest row normalised in registers; wider rows are split across programs
LOOP_CHUNK = 4096
# Backward inputs of at most this many elements run as one program that writes dweight/dbias itself:
# 8 x 4096 takes a few µs on one SM, less than the reduction launch it saves.
ONE_PROGRAM_BACKWARD = 1 << 15
# Single-pass forward: at most this many row elements per thread load the weight and bias with x.
WEIGHT_FIRST_ELEMENTS = 32


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
def _rms_norm_fwd_long_row(p_x, p_res, p_w, p_b, p_y, p_h, p_rstd, i_row, n_cols, stride_x_row, stride_res_row,
                           stride_y_row, stride_h_row, eps, offset, HAS_RES: tl.constexpr, HAS_W: tl.constexpr,
                           HAS_B: tl.constexpr, STORE_H: tl.constexpr, BLOCK_N: tl.constexpr,
                           LOOP_STAGES: tl.constexpr, STORE_STATS: tl.constexpr):  # fmt: skip
    """RMSNorm's forward of one row read in BLOCK_N chunks, at the widths where this beats the single pass
    (_RMS_FWD_LOOPED): its sum of squares, then the output. The first pass keeps the row in L2 for the
    second (evict_last), the second lets it go (evict_first)."""
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
def _norm_fwd_kernel(
    p_x, p_res, p_w, p_b, p_y, p_h, p_mean, p_rstd,
    n_rows, n_cols, stride_x_row, stride_res_row, stride_y_row, stride_h_row, eps, offset,
    IS_RMS: tl.constexpr, HAS_RES: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
    STORE_H: tl.constexpr, SINGLE_PASS: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
    LOOP_STAGES: tl.constexpr, WEIGHT_FIRST: tl.constexpr, STORE_STATS: tl.constexpr,
):  # fmt: skip
    """Forward of one block of ROWS rows, or (RMSNorm only) of one row read in chunks (_RMS_FWD_LOOPED).

    h = x + res;  LayerNorm: mean = sum(h)/N, var = sum((h - mean)^2)/N;  RMSNorm: mean = 0,
    var = sum(h^2)/N;  rstd = 1/sqrt(var + eps);  y = (h - mean) * rstd * (offset + w) + b.
    Stores y, h (STORE_H), and with STORE_STATS mean (LayerNorm) and rstd (fp32, for the backward).
    """
    if SINGLE_PASS:
        o_rows = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)
        m_rows = o_rows < n_rows
        o_n = tl.arange(0, BLOCK_N)
        m_n = o_n < n_cols
        # The weight and bias load with x (their latency hidden behind its) when few elements per thread
        # leave registers for them; else after the reductions, since live through them the widest rows
        # spill (LayerNorm fp32 at 16384: 0.53 -> 0.67 ms). WEIGHT_FIRST: RMSNorm 4096 bf16 0.0717 -> 0.070.
        if WEIGHT_FIRST:
            b_w, b_b = _weight_and_bias(p_w, p_b, o_n, m_n, offset, HAS_W, HAS_B)
        m_rn = m_rows[:, None] & m_n[None, :]
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
        # fill it, each partial sector likely costs DRAM a read-modify-write (2% of the forward at 1024 wide)
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
    else:
        tl.static_assert(IS_RMS, "only RMSNorm has a looped forward (_RMS_FWD_LOOPED)")
        _rms_norm_fwd_long_row(p_x, p_res, p_w, p_b, p_y, p_h, p_rstd, tl.program_id(0).to(tl.int64), n_cols,
                               stride_x_row, stride_res_row, stride_y_row, stride_h_row, eps, offset, HAS_RES, HAS_W,
                               HAS_B, STORE_H, BLOCK_N, LOOP_STAGES, STORE_STATS)  # fmt: skip


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


TILE: tl.constexpr = tl.constexpr(0)  # _norm_bwd_kernel's ROW_TERMS
GIVEN: tl.constexpr = tl.constexpr(1)
SHARED: tl.constexpr = tl.constexpr(2)


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
def _norm_bwd_kernel(
    p_dy, p_dh, p_x, p_res, p_w, p_mean, p_rstd, p_c_xhat, p_c_one, p_count, p_dx, p_dres, p_dw_part, p_db_part,
    n_rows, n_cols, rows_per_program, stride_dy_row, stride_dh_row, stride_x_row, stride_res_row,
    stride_dx_row, stride_dres_row, offset,
    IS_RMS: tl.constexpr, HAS_RES: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
    HAS_DH: tl.constexpr, STORE_DRES: tl.constexpr, ROW_TERMS: tl.constexpr, ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCKS_P2: tl.constexpr, LOOP_STAGES: tl.constexpr, LOW_REGISTERS: tl.constexpr,
    AHEAD: tl.constexpr = False, INTERLEAVED: tl.constexpr = False,
):  # fmt: skip
    """Backward of the rows of group k = program_id(1), over column block program_id(0), ROWS rows at a time:
    rows [k*rows_per_program, (k+1)*rows_per_program), or with INTERLEAVED the steps k, k + G, k + 2G, ... of
    ROWS rows each (G groups), so that the programs sweep the rows together, as a non-persistent grid does.
    With LOW_REGISTERS (saves_registers), where registers are short, the weight is reloaded at each step
    (from cache) instead of held, and dw, db are summed before the row terms, so that dy is dead across
    those sums.

    With xhat = (h - mean) * rstd and g = (offset + w) * dy, and per row c_xhat = mean(g * xhat) and
    c_one = mean(g):
      RMSNorm:   dh = rstd * (g - xhat * c_xhat)
      LayerNorm: dh = rstd * (g - xhat * c_xhat - c_one)
    plus the gradient of the returned h (prenorm); dx = dres = dh. The row terms (ROW_TERMS): TILE from the
    tile itself, which then spans whole rows (one column block); for rows too wide for registers GIVEN by
    _norm_bwd_row_sums_kernel, or SHARED: each column block stores its part of the sums (p_c_xhat, p_c_one
    as [rows, column blocks]) and waits for the row's other column blocks (_core.row_sync; p_count: a
    counter per step's first row), then sums the parts in a fixed order. With AHEAD (SHARED only), a block
    publishes its parts of the next step before it waits for this step's, and reads this step's tile again
    (from L2) after: the wait then finds the other blocks one step ahead, not at the same barrier.
    Program k's share of dw = sum_rows(dy * xhat) and db = sum_rows(dy) over these columns goes to row k of
    the fp32 workspaces (or, with a single program, to dw and db in their own dtype).
    """
    # Whole rows start at column 0 as a constant, which the compiler's layout analysis sees through.
    o_n = (tl.program_id(0) * BLOCK_N if ROW_TERMS != TILE else 0) + tl.arange(0, BLOCK_N)
    m_n = o_n < n_cols
    i_part = tl.program_id(1).to(tl.int64)
    if INTERLEAVED:
        # With a block of rows each, several hundred programs streamed regions of their own: the same work took
        # them 45-52 us (median 49; %globaltimer read at each program's start and end), and the kernel, which
        # ends with the slowest, ran 3-6% longer than this (2026-11-22-norm-bwd-{timeline,interleaved}.txt).
        row_start = i_part * ROWS  # int64 bounds: row * stride can pass 2**31
        row_end = n_rows
        row_step = tl.num_programs(1) * ROWS
    else:
        row_start = i_part * rows_per_program
        row_end = tl.minimum(row_start + rows_per_program, n_rows)
        row_step = ROWS
    if not LOW_REGISTERS:
        b_w = _offset_weight(p_w, o_n, m_n, offset, HAS_W)
    acc_dw = tl.zeros((BLOCK_N,), dtype=tl.float32)
    acc_db = tl.zeros((BLOCK_N,), dtype=tl.float32)
    if AHEAD:  # noqa: SIM102 (a constexpr test, then a runtime one: Triton prunes the first at compile time)
        if row_start < row_end:  # the first step's parts; each iteration then publishes the next one's
            _publish_step(p_dy, p_x, p_res, p_w, p_mean, p_rstd, p_c_xhat, p_c_one, p_count, row_start, row_end,
                          stride_dy_row, stride_x_row, stride_res_row, o_n, m_n, offset, IS_RMS, HAS_RES, HAS_W,
                          ROWS)  # fmt: skip
    # ROWS rows per iteration, and with LOOP_STAGES > 1 the next iteration's loads issued (cp.async) while
    # this one is reduced: more loads in flight per program than one row at a time.
    for r0 in tl.range(row_start, row_end, row_step, num_stages=LOOP_STAGES):
        o_r = r0 + tl.arange(0, ROWS)
        m_r = o_r < row_end
        if AHEAD:  # noqa: SIM102 (a constexpr test, then a runtime one: Triton prunes the first at compile time)
            if r0 + row_step < row_end:
                _publish_step(p_dy, p_x, p_res, p_w, p_mean, p_rstd, p_c_xhat, p_c_one, p_count, r0 + row_step,
                              row_end, stride_dy_row, stride_x_row, stride_res_row, o_n, m_n, offset, IS_RMS,
                              HAS_RES, HAS_W, ROWS)  # fmt: skip
        if LOW_REGISTERS:
            b_w = _offset_weight(p_w, o_n, m_n, offset, HAS_W)
        b_xhat, b_dy, b_wdy, b_rstd = _norm_tile_terms(
            p_dy, p_x, p_res, p_mean, p_rstd, o_r, m_r, stride_dy_row, stride_x_row, stride_res_row, o_n, m_n,
            b_w, IS_RMS, HAS_RES, HAS_W, "evict_first" if AHEAD else "",
        )  # fmt: skip
        if LOW_REGISTERS:  # dw and db first: dy is then dead across the row sums, a row's worth of registers
            acc_dw += tl.sum(b_dy * b_xhat, axis=0)
            acc_db += tl.sum(b_dy, axis=0)
        if ROW_TERMS == GIVEN:
            c_xhat = tl.load(p_c_xhat + o_r, mask=m_r, other=0.0)
            c_one = c_xhat if IS_RMS else tl.load(p_c_one + o_r, mask=m_r, other=0.0)
        elif ROW_TERMS == SHARED:
            if not AHEAD:
                _store_row_parts(p_c_xhat, p_c_one, o_r, m_r, b_xhat, b_wdy, IS_RMS)
                publish(p_count + r0)
            c_xhat, c_one = _combined_row_terms(p_c_xhat, p_c_one, p_count + r0, o_r, m_r, n_cols, IS_RMS,
                                                BLOCKS_P2)  # fmt: skip
        else:
            c_xhat = tl.sum(b_xhat * b_wdy, axis=1) / n_cols  # [ROWS]
            c_one = tl.sum(b_wdy, axis=1) / n_cols
        b_dh = _norm_dh(p_dh, o_r, m_r, stride_dh_row, o_n, m_n, b_xhat, b_wdy, b_rstd, c_xhat, c_one, IS_RMS,
                        HAS_DH)  # fmt: skip
        _store_tile_grad(p_dx, p_dres, o_r, m_r, stride_dx_row, stride_dres_row, o_n, m_n, b_dh, STORE_DRES)
        if not LOW_REGISTERS:  # here, as the tables were measured (the other order: fp32 RMSNorm 2048 8% slower)
            acc_dw += tl.sum(b_dy * b_xhat, axis=0)
            acc_db += tl.sum(b_dy, axis=0)
    # fp32 workspace rows, or dweight/dbias themselves when one program covers every row
    if HAS_W:
        tl.store(p_dw_part + i_part * n_cols + o_n, acc_dw.to(p_dw_part.dtype.element_ty), mask=m_n)
    if HAS_B:
        tl.store(p_db_part + i_part * n_cols + o_n, acc_db.to(p_db_part.dtype.element_ty), mask=m_n)


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


@triton.jit
def _sum_partials_kernel(
    p_dw_part, p_db_part, p_dw, p_db, n_parts, n_cols,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """dw = sum over parts of dw_part[part, :], likewise db, in fp32 and in a fixed order (deterministic),
    each cast once to the weight's dtype. One program per BLOCK_N columns, for both sums: one launch in
    place of a torch ``sum`` and a cast per gradient."""
    o_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    m_n = o_n < n_cols
    acc_dw = tl.zeros((BLOCK_P, BLOCK_N), dtype=tl.float32)
    acc_db = tl.zeros((BLOCK_P, BLOCK_N), dtype=tl.float32)
    for start in range(0, n_parts, BLOCK_P):
        o_p = (start + tl.arange(0, BLOCK_P)).to(tl.int64)
        offsets = o_p[:, None] * n_cols + o_n[None, :]
        mask = (o_p < n_parts)[:, None] & m_n[None, :]
        if HAS_W:
            acc_dw += tl.load(p_dw_part + offsets, mask=mask, other=0.0)
        if HAS_B:
            acc_db += tl.load(p_db_part + offsets, mask=mask, other=0.0)
    if HAS_W:
        tl.store(p_dw + o_n, tl.sum(acc_dw, axis=0).to(p_dw.dtype.element_ty), mask=m_n)
    if HAS_B:
        tl.store(p_db + o_n, tl.sum(acc_db, axis=0).to(p_db.dtype.element_ty), mask=m_n)


# --------------------------------------------------------------------------------------------------
# Launch configuration
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Plan:
    single_pass: bool  # forward: whole rows in registers
    block_n: int  # forward: the row's power of two, or the chunk of a looped row
    rows: int  # forward rows per block
    num_warps: int
    fwd_stages: int  # software-pipeline depth of the looped forward's chunk loops (1: none)
    bwd_single_pass: bool  # backward: whole rows in registers; else the two-phase wide path
    bwd_programs_per_sm: int = 0  # the single-pass backward's configuration (unused on the wide path)
    bwd_warps: int = 0
    bwd_rows: int = 1  # rows per backward loop iteration
    bwd_stages: int = 1  # software-pipeline depth of the backward's loop over rows
    split_row: bool = False  # forward: rows wider than one program, block_n-element slices (see SPLIT_ROW_FWD)
    split_sub_n: int = 0  # the split-row forward's output pieces
    bwd_interleaved: bool = True  # single-pass backward: interleaved steps of rows per program, else a block of rows


# Fastest launch configurations measured on the H200 over 16384 rows by benchmarks/norm_configs.py
# (benchmarks/results/nvidia-h200/2026-11-22-norm-configs-pipelined-*.txt), keyed by (power-of-two row width, element
# size). Forward: (rows per program, warps); backward: (programs per SM, warps, rows per loop iteration,
# pipeline depth). Pipelining the backward's loop over rows (cp.async of the next rows while this one is
# reduced) gained 6-23%. A persistent, pipelined forward (programs looping over row blocks) gained nothing
# once the weight stayed out of registers during the reductions, and was removed (benchmarks/NOTES.md).
# The forward entries were measured again with 1 and 2 warps too and in CUDA graphs (the kernel alone,
# 2026-11-22-norm-fwd-configs-graph.txt): one warp a row at 1024 wide in fp32 (RMSNorm 92.6 -> 94.1% of the
# ceiling, LayerNorm 90.2 -> 93.4%), as torch.compile does it. Where RMSNorm's and LayerNorm's best differed,
# the entry is the one within 2% of both, or LayerNorm has its own.
_FWD_MEASURED = {
    (1024, 2): (2, 4), (2048, 2): (1, 4), (4096, 2): (1, 4), (8192, 2): (2, 4), (16384, 2): (1, 8),
    (1024, 4): (1, 1), (2048, 4): (1, 2), (4096, 4): (2, 16), (8192, 4): (1, 8), (16384, 4): (2, 16),
}  # fmt: skip
# LayerNorm's own, measured with its bias (2026-11-22-norm-fwd-configs-graph-ln-bias.txt): bf16 at 1024 79.5 -> 83.8%,
# at 4096 92.5 -> 95.0%, at 8192 90.9 -> 94.5%. Without a bias its best were others: the bias, loaded with x, takes
# registers too (one warp per row of 16384 spilled: 58% of the ceiling).
# bf16 at 1024 and 2048 measured again once the statistics' stores kept their sectors in L2 (evict_last), through
# the launcher at 16384/32768/65536 rows (2026-11-22-norm-fwd-stats-configs.txt): 1024 (1, 2) -> (2, 2) 84.6 -> 85.9,
# 91.3 -> 92.9, 94.1 -> 94.0%; 2048 (1, 4) -> (1, 2) 88.8 -> 89.9, 92.5 -> 95.7, 91.0 -> 97.5%.
_LN_FWD_MEASURED = {(1024, 2): (2, 2), (2048, 2): (1, 2), (4096, 2): (2, 8), (8192, 2): (1, 4)}
# LayerNorm's forward where no backward follows (no statistics stored, norm_fwd_launch's store_stats), where its best
# differed from the entries above by 2% or more: swept through the launcher at 32768 rows against the tables' entry
# and torch.compile, which stores none either (2026-11-22-norm-fwd-no-stats-configs.txt), % of the copy ceiling:
# bf16 1024 92.3 -> 94.7 (torch.compile 93.3), fp32 1024 94.8 -> 96.8 (bf16 2048's (1, 2), 93.1 -> 95.2, is now the
# entry above). Elsewhere within 1.2%.
_LN_FWD_NO_STATS = {(1024, 2): (2, 4), (1024, 4): (1, 2)}
# RMSNorm rows that its looped forward (two passes over each row in chunks, the first keeping the row in L2
# for the second) moves faster than one pass in registers: (chunk, warps, pipeline depth). bf16 at 4096
# 94.3 -> 97.5%; fp32 at 4096 96.2 -> 100.1%, at 8192 96.4 -> 99.6%. LayerNorm's three passes lost there.
_RMS_FWD_LOOPED = {(4096, 2): (2048, 8, 1), (4096, 4): (4096, 16, 1), (8192, 4): (2048, 16, 1)}
_BWD_MEASURED = {
    (1024, 2): (4, 4, 2, 3), (2048, 2): (4, 4, 1, 3), (4096, 2): (1, 8, 2, 3), (8192, 2): (1, 8, 1, 3),
    (16384, 2): (1, 16, 1, 1),
    (1024, 4): (4, 4, 1, 3), (2048, 4): (1, 8, 2, 3), (4096, 4): (1, 16, 1, 3), (8192, 4): (1, 16, 1, 1),
    (16384, 4): (1, 8, 1, 1),  # saves_registers' order: 0.794 ms against 0.94 before and 1.26 on the wide path
}  # fmt: skip
# fp32 at 2048 and 4096 swept again once the programs took interleaved steps, through the launcher at 128 MB a tensor
# (2026-11-22-norm-launcher-interleaved.txt): RMSNorm 0.1022 -> 0.0993 ms and 0.1058 -> 0.0998; and 8192 at 16384 rows
# (2026-11-22-norm-launcher-8192-interleaved.txt): 0.4005 -> 0.3863.
# LayerNorm's backward (with a bias) holds a dbias accumulator too. At 16384 its single pass spilled 2 KB a
# thread (6.4 ms in bf16 against 0.66 on the wide path) until the LOW_REGISTERS order (saves_registers);
# now, with 8 warps, 0.542 ms in bf16 and 1.196 in fp32 against the wide path's 0.661 and 1.265
# (2026-11-22-norm-16384-bwd-configs.txt); bf16 there takes a block of rows per program (_BWD_ROW_BLOCKS), and
# without a bias 16 warps (_LN_BWD_NO_BIAS). The dbias accumulator costs both norms 16-25% at 16384 (bf16 RMSNorm
# 0.400 -> 0.479 ms with one; 2026-11-22-norm-ln-16384-bias-cost.txt). Elsewhere RMSNorm's entries. None: the wide
# backward, whose one-launch form later beat the single pass in fp32 at 16384 (_NARROW_SHARED_TILE). fp32 at 2048 and
# 4096: swept through the launcher, the dweight/dbias sum timed too (`norm_configs.py --launcher`,
# 2026-11-22-norm-launcher-sweep.txt), one program per SM beat RMSNorm's four: 0.1077 -> 0.1059 ms and 0.2107 ->
# 0.2039.
_LN_BWD_MEASURED = {
    (16384, 2): (1, 8, 1, 1), (8192, 4): (2, 8, 1, 3), (16384, 4): None,  # fp32 8192: 90.8 -> 92.4%
    (2048, 4): (1, 4, 2, 3), (4096, 4): (1, 4, 1, 3),
    (4096, 2): (1, 16, 2, 4),  # interleaved steps, bf16 16384 x 4096 through the launcher: 0.1038 -> 0.1010 ms
}  # fmt: skip
# Backward configurations for MANY_ROWS rows or more, keyed by (power-of-two width, element size, RMSNorm?), where
# they beat the entries above: fewer programs (each with more rows, and fewer dweight/dbias partial rows to sum)
# and deeper pipelines. Swept through the launcher at 32768 rows, 1-6 deep (`norm_configs.py --launcher
# --rows=32768 --stages=1,3,4,6`, 2026-11-22-norm-launcher-many-rows.txt), ms against the entries above: bf16 2048
# RMSNorm 0.1098 -> 0.1043, LayerNorm 0.1130 -> 0.1073; fp32 1024 RMSNorm 0.1065 -> 0.1032, LayerNorm 0.1094 ->
# 0.1055; fp32 2048 RMSNorm 0.2081 -> 0.2036. bf16 at 1024 gains only from 65536 rows (RMSNorm 0.1087 -> 0.1044,
# LayerNorm 0.1078 -> 0.1070), and its entry is level at 32768 (0.0554 against 0.0553). At 16384 rows the entries
# above stay best (bf16 2048 RMSNorm 0.0554 against 0.0561); fp32 LayerNorm at 2048 keeps its entry (0.2051
# against the best 0.2049). Once the programs took interleaved steps, LayerNorm's bf16 entries were swept again
# (2026-11-22-norm-launcher-interleaved.txt): 1024 0.0542 -> 0.0530 ms, 2048 0.1023 -> 0.1013; RMSNorm's stayed best.
MANY_ROWS = 32768
_BWD_MANY_ROWS = {
    (1024, 2, True): (4, 2, 1, 4), (1024, 2, False): (2, 4, 4, 3),
    (2048, 2, True): (2, 4, 1, 4), (2048, 2, False): (2, 4, 1, 6),
    (1024, 4, True): (2, 2, 1, 4), (1024, 4, False): (2, 2, 1, 4), (2048, 4, True): (1, 16, 2, 3),
}  # fmt: skip
# Single-pass backwards whose programs take a block of rows each, not interleaved steps, keyed by (power-of-two
# width, element size, RMSNorm?, bias?): bf16 LayerNorm with a bias at 16384, one 8-warp program per SM. Through the
# launcher (2026-11-22-norm-bwd-blocks-16384.txt), against interleaved steps with 8 and 16 warps: 0.5465 against
# 0.6041 and 0.5922 ms at 16384 rows, 0.1545 against 0.1646 and 0.1595 at 4096. At the other entries measured there
# (bf16 8192 and RMSNorm 16384, fp32 8192 and RMSNorm 16384) interleaved steps were 1-5% faster.
_BWD_ROW_BLOCKS = {(16384, 2, False, True)}
# LayerNorm's backward without a bias, where it is faster than the entries above (measured with a bias): one
# accumulator fewer, like RMSNorm's. bf16 at 16384 with RMSNorm's 16 warps and interleaved steps: 0.548 -> 0.446 ms
# (2026-11-22-norm-ln-16384-bias-cost.txt).
_LN_BWD_NO_BIAS = {(16384, 2): (1, 16, 1, 1)}
# Rows wider than MAX_SINGLE_PASS, forward (_norm_fwd_split_row_kernel), keyed by (element size, RMSNorm?):
# (slice, warps, output piece), a slice per program, several programs per row. Swept at 32768, 65536 and 131072
# wide through the launcher (2026-11-22-norm-split-row-configs.txt), % of the copy ceiling against the loop of
# one program per row it replaced: bf16 RMSNorm 87.0/85.9/85.3 (was 85.1/69.4/64.4), LayerNorm 75.5/72.5/71.3
# (65536: 60.8); fp32 RMSNorm 87.5/87.2/86.8, LayerNorm 84.1/82.4/82.4. Output pieces below the slice keep
# h, the weight and the bias from taking three slices' worth of registers at once.
SPLIT_ROW_FWD = {(2, True): (16384, 16, 4096), (2, False): (8192, 4, 2048),
                 (4, True): (16384, 16, 16384), (4, False): (8192, 4, 4096)}  # fmt: skip


@functools.lru_cache(maxsize=256)
def norm_launch_plan(n_cols: int, element_size: int, is_rms: bool = True, many_rows: bool = False,
                     store_stats: bool = True, has_bias: bool = False) -> _Plan:  # fmt: skip
    """Launch configuration for rows of ``n_cols`` elements of ``element_size`` bytes (``many_rows``: a backward of
    MANY_ROWS rows or more; ``store_stats``: a forward that stores the backward's statistics; ``has_bias``: a
    backward that sums dbias too, which LayerNorm's tables assume).

    Widths in the measured tables use their fastest configuration (for RMSNorm at some widths the looped
    forward). Narrower rows pack 4096 elements per program (4 warps) and take 8 backward programs per SM.
    Rows wider than MAX_SINGLE_PASS are split across programs in the forward and take the wide backward
    (wide_bwd_plan, _wide_bwd). Pipeline depths are the measured ones; launchers lower them where the device
    has less shared memory (_core.device.pipeline_depth).
    """
    block_n = next_power_of_2(n_cols)
    if block_n > MAX_SINGLE_PASS:
        block, warps, sub_n = SPLIT_ROW_FWD[element_size, is_rms]
        return _Plan(False, block, 1, warps, 1, False, split_row=True, split_sub_n=sub_n)
    key = (block_n, element_size)
    looped = _RMS_FWD_LOOPED.get(key) if is_rms else None
    if looped is not None:
        chunk, warps, stages = looped
        fwd_plan = (False, chunk, 1, warps, stages)
    else:
        rows, warps = (
            (_LN_FWD_NO_STATS.get(key) if not is_rms and not store_stats else None)
            or (_LN_FWD_MEASURED.get(key) if not is_rms else None)
            or _FWD_MEASURED.get(key)
            or (max(1, min(64, 4096 // block_n)), 4)
        )
        fwd_plan = (True, block_n, rows, warps, 1)
    bwd = _BWD_MEASURED.get(key) if is_rms else _LN_BWD_MEASURED.get(key, _BWD_MEASURED.get(key))
    if not is_rms and not has_bias:
        bwd = _LN_BWD_NO_BIAS.get(key, bwd)
    if many_rows:
        bwd = _BWD_MANY_ROWS.get((*key, is_rms), bwd)
    if bwd is None and block_n < 1024:
        bwd = (8, 4, 1, 1)
    if bwd is None:  # an element size never measured, 1024 wide or more: the wide backward
        return _Plan(*fwd_plan, False)
    return _Plan(*fwd_plan, True, *bwd, bwd_interleaved=(*key, is_rms, has_bias) not in _BWD_ROW_BLOCKS)


def _empty_like_rows(rows: int, n_cols: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return alloc.empty((rows, n_cols), dtype=dtype, device=device)


# --------------------------------------------------------------------------------------------------
# Launchers (tensors in, tensors out)
# --------------------------------------------------------------------------------------------------
def norm_fwd_launch(x, weight, bias, residual, eps, offset, is_rms, store_h, h_fp32, store_stats=True):
    """x, residual: (rows, N) with unit column stride. Returns y, h (None unless store_h), mean (None
    for RMSNorm) and rstd, the last two fp32 of shape (rows,), or both None without ``store_stats``: a
    forward no backward follows needs no statistics, and their one-element stores per row cost it 2%
    (LayerNorm 32768 x 1024 bf16 on the H200, benchmarks/NOTES.md)."""
    n_rows, n_cols = x.shape
    y = _empty_like_rows(n_rows, n_cols, x.dtype, x.device)
    h = None
    if store_h:
        h_dtype = torch.float32 if h_fp32 else (residual.dtype if residual is not None else x.dtype)
        h = _empty_like_rows(n_rows, n_cols, h_dtype, x.device)
    mean = None if is_rms or not store_stats else torch.empty((n_rows,), dtype=torch.float32, device=x.device)
    rstd = torch.empty((n_rows,), dtype=torch.float32, device=x.device) if store_stats else None
    if n_rows == 0:
        return y, h, mean, rstd
    plan = norm_launch_plan(n_cols, x.element_size(), is_rms, store_stats=store_stats)
    if plan.split_row:
        _split_row_fwd(x, weight, bias, residual, y, h, mean, rstd, eps, offset, is_rms, plan, store_stats)
        return y, h, mean, rstd
    # RMSNorm's looped forward: its two pipelined passes over a row each have buffers of their own.
    stage_bytes = 2 * plan.block_n * _bytes_per_element(x, residual)
    stages = pipeline_depth(plan.fwd_stages, stage_bytes, x.device)
    _norm_fwd_kernel[(cdiv(n_rows, plan.rows) if plan.single_pass else n_rows,)](
        x, residual if residual is not None else x, weight if weight is not None else x,
        bias if bias is not None else x, y, h if h is not None else y, *_stats_pointers(mean, rstd, y),
        n_rows, n_cols, x.stride(0), residual.stride(0) if residual is not None else 0, y.stride(0),
        h.stride(0) if h is not None else 0, eps, offset,
        IS_RMS=is_rms, HAS_RES=residual is not None, HAS_W=weight is not None, HAS_B=bias is not None,
        STORE_H=store_h, SINGLE_PASS=plan.single_pass, ROWS=plan.rows, BLOCK_N=plan.block_n,
        LOOP_STAGES=stages, WEIGHT_FIRST=loads_weight_first(plan.rows, plan.block_n, plan.num_warps),
        STORE_STATS=store_stats, num_warps=plan.num_warps,
    )  # fmt: skip
    return y, h, mean, rstd


def _stats_pointers(mean, rstd, placeholder):
    """The forward kernels' p_mean and p_rstd: ``placeholder`` where one is absent (never written then)."""
    return (mean if mean is not None else rstd if rstd is not None else placeholder,
            rstd if rstd is not None else placeholder)  # fmt: skip


def _split_row_fwd(x, weight, bias, residual, y, h, mean, rstd, eps, offset, is_rms, plan, store_stats):
    """Launches _norm_fwd_split_row_kernel (row_sync.launch_split_rows: one launch, or one per phase)."""
    n_rows, n_cols = x.shape
    launch_split_rows(
        _norm_fwd_split_row_kernel,
        (x, residual if residual is not None else x, weight if weight is not None else x,
         bias if bias is not None else x, y, h if h is not None else y, *_stats_pointers(mean, rstd, y)),
        (x.stride(0), residual.stride(0) if residual is not None else 0, y.stride(0),
         h.stride(0) if h is not None else 0, eps, offset),
        n_rows, n_cols, plan.block_n, 1 if is_rms else 2, x.device, plan.num_warps,
        IS_RMS=is_rms, HAS_RES=residual is not None, HAS_W=weight is not None, HAS_B=bias is not None,
        STORE_H=h is not None, SUB_N=plan.split_sub_n, STORE_STATS=store_stats,
    )  # fmt: skip


def loads_weight_first(rows: int, block_n: int, num_warps: int) -> bool:
    """Whether the single-pass forward loads the weight and bias with x: where at most
    WEIGHT_FIRST_ELEMENTS row elements per thread leave registers for them."""
    return rows * block_n <= WEIGHT_FIRST_ELEMENTS * 32 * num_warps


def saves_registers(rows: int, block_n: int, num_warps: int) -> bool:
    """Whether the backward takes its LOW_REGISTERS order: where the step's fp32 terms (xhat, dy, g and the
    dweight sum, a row's worth each per thread) and the weight would pass the registers a thread may have.
    At 16384 wide, bf16, 16 warps, the usual order spilled 168 bytes a thread (ptxas) and this one none:
    RMSNorm's backward 0.575 -> 0.424 ms, and LayerNorm's single pass, which spilled 2 KB, now beats its
    wide path (benchmarks/NOTES.md)."""
    per_thread = rows * block_n // (32 * num_warps)
    return 5 * per_thread > min(255, 65536 // (32 * num_warps))


def _bytes_per_element(*tensors) -> int:
    """Bytes a kernel loads per row element from ``tensors`` (None skipped): one pipeline stage's share."""
    return sum(t.element_size() for t in tensors if t is not None)


def _shares_dres(x, residual) -> bool:
    """d(loss)/d(residual) is d(loss)/dx (both are dh): one tensor serves both when their dtypes agree,
    which saves the backward writing it twice."""
    return residual is not None and residual.dtype == x.dtype


def norm_bwd_launch(dy, dh, x, weight, residual, mean, rstd, offset, is_rms, has_bias):
    """Returns dx, dresidual (None without a residual, or when it is dx: _shares_dres), dweight and
    dbias (None when absent)."""
    n_rows, n_cols = x.shape
    dx = _empty_like_rows(n_rows, n_cols, x.dtype, x.device)
    separate_dres = residual is not None and not _shares_dres(x, residual)
    dres = _empty_like_rows(n_rows, n_cols, residual.dtype, x.device) if separate_dres else None
    w_dtype = weight.dtype if weight is not None else x.dtype
    plan = norm_launch_plan(n_cols, x.element_size(), is_rms, many_rows=n_rows >= MANY_ROWS, has_bias=has_bias)
    n_sums = (weight is not None) + has_bias
    one_program = plan.bwd_single_pass and 0 < n_rows * n_cols <= ONE_PROGRAM_BACKWARD
    if one_program:
        # A few rows: one program sums dweight/dbias over all of them in fp32 and stores them in the
        # weight's dtype itself, which saves the reduction's launch (the host's cost dominates here).
        n_parts = 1
        dw_part = torch.empty((n_cols,), dtype=w_dtype, device=x.device) if weight is not None else None
        db_part = torch.empty((n_cols,), dtype=w_dtype, device=x.device) if has_bias else None
    else:
        # One fp32 workspace holds each program's (or row group's) share of dweight and dbias, summed
        # in a fixed order afterwards, and on the wide path each row's terms (c_xhat, and c_one for
        # LayerNorm). No rows: zeros, which that sum turns into zero gradients.
        if plan.bwd_single_pass:  # at most one program per step of rows (interleaved: none past the last)
            n_parts = max(1, min(cdiv(n_rows, plan.bwd_rows), plan.bwd_programs_per_sm * sm_count(x.device)))
        else:
            wide = wide_bwd_plan(n_cols, x.element_size(), is_rms, has_bias, x.device)
            n_parts = max(1, min(n_rows, wide.per_sm * sm_count(x.device) // cdiv(n_cols, wide.block_n)))
        n_partials = n_sums * n_parts * n_cols
        n_row_terms = 0 if plan.bwd_single_pass else wide.row_terms_size(n_rows, n_cols, is_rms)
        allocate = torch.empty if n_rows > 0 else torch.zeros
        workspace = allocate((n_partials + n_row_terms,), dtype=torch.float32, device=x.device)
        partials = workspace[:n_partials].view(n_sums, n_parts, n_cols)
        row_terms = workspace[n_partials:]
        dw_part = partials[0] if weight is not None else None
        db_part = partials[n_sums - 1] if has_bias else None
    if n_rows > 0:
        tensors = (dy, dh if dh is not None else dy, x, residual if residual is not None else x,
                   weight if weight is not None else x, mean if mean is not None else rstd, rstd)  # fmt: skip
        outputs = (dx, dres if dres is not None else dx, dw_part if dw_part is not None else rstd,
                   db_part if db_part is not None else rstd)  # fmt: skip
        strides = (dy.stride(0), dh.stride(0) if dh is not None else 0, x.stride(0),
                   residual.stride(0) if residual is not None else 0, dx.stride(0),
                   dres.stride(0) if dres is not None else 0)  # fmt: skip
        flags = dict(IS_RMS=is_rms, HAS_RES=residual is not None, HAS_W=weight is not None, HAS_B=has_bias,
                     HAS_DH=dh is not None, STORE_DRES=separate_dres)  # fmt: skip
        streamed = _bytes_per_element(dy, dh, x, residual)  # loaded per element, each row
        if plan.bwd_single_pass:  # whole rows: one column block; the row terms from the tile itself
            row_block = next_power_of_2(n_cols)  # plan.block_n is the forward's, a chunk where it loops
            _norm_bwd_kernel[(1, n_parts)](
                *tensors, rstd, rstd, rstd, *outputs, n_rows, n_cols, cdiv(n_rows, n_parts), *strides, offset,
                **flags, ROW_TERMS=TILE.value, ROWS=plan.bwd_rows, BLOCK_N=row_block, BLOCKS_P2=1,
                INTERLEAVED=plan.bwd_interleaved,
                LOOP_STAGES=pipeline_depth(plan.bwd_stages, plan.bwd_rows * row_block * streamed, x.device),
                LOW_REGISTERS=saves_registers(plan.bwd_rows, row_block, plan.bwd_warps),
                num_warps=plan.bwd_warps,
            )  # fmt: skip
        else:
            _wide_bwd(tensors, outputs, strides, flags, n_rows, n_cols, n_parts, offset, row_terms, streamed, wide)
    if one_program:
        return dx, dres, dw_part, db_part
    dw, db = _sum_partials(dw_part, db_part, w_dtype)
    return dx, dres, dw, db


# Backward of rows too wide for registers, phase 2, by element size: (columns per program, rows per
# step, warps, programs per SM). Phase 1 reads rows in LOOP_CHUNK steps with 8 warps. Measured by
# `norm_configs.py --wide` at 16384 and 131072 (2026-11-22-norm-wide-configs.txt): within 7% of each
# other over the grid's better half, the best 0.66-0.69 ms for 16384 x 16384 bf16 (94% of the copy
# bandwidth over the five passes).
WIDE_BWD_TILE = {2: (1024, 4, 4, 4, 1), 4: (1024, 4, 4, 8, 1)}  # ..., and the loop's pipeline depth
WIDE_ROW_SUMS_STAGES = 3  # phase 1's chunk loop: 0.684 -> 0.659 ms for LayerNorm 16384 x 16384 bf16 (2 deep: 0.729)
# The one-launch backward of wide rows (ROW_TERMS=SHARED), keyed by (element size, RMSNorm?, bias?): (columns per
# program, rows per step, warps, programs per SM, whether each step is published ahead of the wait: AHEAD). Swept
# through the launcher against the two phases at 65536 and 131072 wide, the bytes of 16384 x 16384, ms
# (`norm_configs.py --wide [--small-tiles]`, 2026-11-22-norm-wide-shared-configs.txt, -norm-wide-ahead-*.txt):
# - fp32, steps in turn: RMSNorm 0.854/0.902 against 1.257/1.259, LayerNorm 1.077/1.197 against 1.262/1.263.
#   Published ahead, fp32 lost (RMSNorm 0.96-1.00): the second read of each tile costs more than the wait.
# - bf16 RMSNorm, published ahead with small tiles and 8 programs per SM: 0.509/0.521 against 0.640/0.641. In
#   turn, bf16 had lost to the two phases (0.595/0.684): its steps carry half fp32's bytes for the same wait.
# - bf16 with a bias or LayerNorm's terms: the two phases (0.64 ms) beat every tile, in turn, ahead or under
#   register caps (RMSNorm with a bias 0.73-0.88, LayerNorm 0.72-1.02): their accumulators double the registers
#   (250 against 122 a thread: 4 programs a SM instead of 8; -norm-wide-ahead-capped.txt).
WIDE_BWD_SHARED_TILE = {
    (2, True, False): (1024, 2, 2, 8, True),
    (4, True, False): (4096, 2, 4, 2, False), (4, True, True): (4096, 2, 4, 2, False),
    (4, False, False): (4096, 2, 4, 2, False), (4, False, True): (4096, 2, 4, 2, False),
}  # fmt: skip
# Rows one pass holds whose backward is faster shared than single-pass, keyed by (power-of-two width, element size,
# RMSNorm?): fp32 LayerNorm at 16384, 0.995 against 1.208 ms (its single pass spills;
# 2026-11-22-norm-wide-ahead-small.txt).
_NARROW_SHARED_TILE = {(16384, 4, False): (4096, 1, 4, 2, False)}


def shared_wide_tile(n_cols: int, element_size: int, is_rms: bool, has_bias: bool) -> tuple | None:
    """The one-launch wide backward's tile for these rows, or None where the two phases are faster."""
    narrow = _NARROW_SHARED_TILE.get((next_power_of_2(n_cols), element_size, is_rms))
    return narrow or WIDE_BWD_SHARED_TILE.get((element_size, is_rms, has_bias))


@dataclass(frozen=True)
class _WidePlan:
    shared: bool  # one launch, the column blocks sharing the row terms (else two phases, the terms given)
    block_n: int
    rows: int
    warps: int
    per_sm: int
    stages: int
    ahead: bool = False  # shared: each step's parts published an iteration ahead of the wait (AHEAD)

    def row_terms_size(self, n_rows: int, n_cols: int, is_rms: bool) -> int:
        """fp32 elements of workspace for the row terms: a part per row and column block and a counter per
        row (shared), or the terms per row (given)."""
        terms = 1 if is_rms else 2
        if self.shared:
            return terms * n_rows * cdiv(n_cols, self.block_n) + n_rows
        return terms * n_rows


def wide_bwd_plan(n_cols: int, element_size: int, is_rms: bool, has_bias: bool, device: torch.device) -> _WidePlan:
    """The wide backward's tile: one launch whose column blocks share the row terms where it was measured
    faster (shared_wide_tile) and they may wait for each other (row_sync.waits_safely), else the two phases."""
    shared = shared_wide_tile(n_cols, element_size, is_rms, has_bias)
    if shared is not None and waits_safely(cdiv(n_cols, shared[0]), device):
        block_n, rows, warps, per_sm, ahead = shared
        return _WidePlan(True, block_n, rows, warps, per_sm, 1, ahead)
    return _WidePlan(False, *WIDE_BWD_TILE[element_size])


def _wide_bwd(tensors, outputs, strides, flags, n_rows, n_cols, n_groups, offset, row_terms, streamed, wide):
    """Shared (one launch): _norm_bwd_kernel by column blocks, each summing its part of every row's terms
    and waiting for the row's other blocks; three passes over the rows' data. Else two phases: each row's
    terms c_xhat, c_one (reads x and dy), then _norm_bwd_kernel by column blocks with those terms given: dx
    and the per-group dw/db partials (reads x and dy again), five passes. ``row_terms``: the caller's
    workspace (wide.row_terms_size); ``streamed``: bytes loaded per row element (pipeline stages' size)."""
    dy, _, x, residual, weight, mean, rstd = tensors
    n_blocks = cdiv(n_cols, wide.block_n)
    grid = (n_blocks, n_groups)
    tile = dict(ROWS=wide.rows, BLOCK_N=wide.block_n,
                LOW_REGISTERS=saves_registers(wide.rows, wide.block_n, wide.warps),
                LOOP_STAGES=pipeline_depth(wide.stages, wide.rows * wide.block_n * streamed, x.device),
                num_warps=wide.warps)  # fmt: skip
    if wide.shared:
        n_parts = n_rows * n_blocks
        c_xhat = row_terms[:n_parts]
        c_one = c_xhat if flags["IS_RMS"] else row_terms[n_parts : 2 * n_parts]
        counters = row_counters(row_terms, n_rows)
        _norm_bwd_kernel[grid](
            *tensors, c_xhat, c_one, counters, *outputs, n_rows, n_cols, cdiv(n_rows, n_groups), *strides, offset,
            **flags, ROW_TERMS=SHARED.value, BLOCKS_P2=next_power_of_2(n_blocks), AHEAD=wide.ahead, **tile,
        )  # fmt: skip
        return
    c_xhat = row_terms[:n_rows]
    c_one = c_xhat if flags["IS_RMS"] else row_terms[n_rows : 2 * n_rows]
    dy_stride, _, x_stride, res_stride, _, _ = strides
    _norm_bwd_row_sums_kernel[(n_rows,)](
        dy, x, residual, weight, mean, rstd, c_xhat, c_one, n_cols, dy_stride, x_stride, res_stride, offset,
        IS_RMS=flags["IS_RMS"], HAS_RES=flags["HAS_RES"], HAS_W=flags["HAS_W"], BLOCK_N=LOOP_CHUNK,
        LOOP_STAGES=pipeline_depth(WIDE_ROW_SUMS_STAGES, LOOP_CHUNK * streamed, x.device), num_warps=8,
    )  # fmt: skip
    _norm_bwd_kernel[grid](
        *tensors, c_xhat, c_one, rstd, *outputs, n_rows, n_cols, cdiv(n_rows, n_groups), *strides, offset,
        **flags, ROW_TERMS=GIVEN.value, BLOCKS_P2=1, **tile,
    )  # fmt: skip


PARTIAL_SUM_ELEMENTS = 4096  # a program's tile per loop step, BLOCK_P x BLOCK_N, for each of dw and db


def partial_sum_block(n_parts: int, n_cols: int, device: torch.device) -> tuple[int, int]:
    """(BLOCK_P, BLOCK_N) for _sum_partials_kernel: columns split into about two programs per SM (8 to 32
    columns each), parts in tiles of PARTIAL_SUM_ELEMENTS. With 32 columns a program, as before, 1024
    columns made 32 programs, each reading its 528 parts in 5 dependent steps: 9 us against a 33 us
    backward kernel (Nsight Compute on the H100, caches flushed; benchmarks/NOTES.md)."""
    block_n = min(32, max(8, prev_power_of_2(max(1, n_cols // (2 * sm_count(device))))))
    return min(next_power_of_2(n_parts), PARTIAL_SUM_ELEMENTS // block_n), block_n


def _sum_partials(dw_part, db_part, dtype):
    """Column sums of the backward's fp32 workspaces (n_programs, N), cast to ``dtype``; None where the
    workspace is None."""
    parts = [t for t in (dw_part, db_part) if t is not None]
    if not parts:
        return None, None
    n_parts, n_cols = parts[0].shape
    dw = torch.empty((n_cols,), dtype=dtype, device=parts[0].device) if dw_part is not None else None
    db = torch.empty((n_cols,), dtype=dtype, device=parts[0].device) if db_part is not None else None
    if n_cols > 0:
        block_p, block_n = partial_sum_block(n_parts, n_cols, parts[0].device)
        _sum_partials_kernel[(cdiv(n_cols, block_n),)](
            dw_part if dw_part is not None else db_part, db_part if db_part is not None else dw_part,
            dw if dw is not None else db, db if db is not None else dw, n_parts, n_cols,
            HAS_W=dw_part is not None, HAS_B=db_part is not None, BLOCK_P=block_p, BLOCK_N=block_n, num_warps=4,
        )  # fmt: skip
    return dw, db


# --------------------------------------------------------------------------------------------------
# Autograd, shared by the eager path (an autograd.Function) and the compiled path (a torch custom op);
# _core.dispatch.cheapest_path picks one per call
# --------------------------------------------------------------------------------------------------
def _save(ctx, x, weight, bias, residual, offset, is_rms, store_h, mean, rstd, h):
    # With prenorm, a residual and everything in fp32, the returned h is exactly the x + residual the
    # forward normalised: the backward reads it (one tensor) instead of x and the residual (two). A 16-bit
    # h is rounded, and reading it failed the float64 check on dweight (benchmarks/NOTES.md), so there
    # the backward sums x + residual again.
    ctx.reuse_h = store_h and residual is not None and x.dtype == residual.dtype == h.dtype == torch.float32
    ctx.save_for_backward(h if ctx.reuse_h else x, weight, None if ctx.reuse_h else residual, mean, rstd)
    ctx.offset, ctx.is_rms, ctx.has_bias, ctx.store_h = offset, is_rms, bias is not None, store_h
    ctx.has_residual = residual is not None


def _grads(ctx, dy, dh, backward_launch):
    x, weight, residual, mean, rstd = ctx.saved_tensors  # x is h (and residual None) with ctx.reuse_h
    if dy is None:  # only h was used downstream
        dy = torch.zeros_like(x)
    dy = as_rows(dy)  # an expanded (stride-0) gradient from y.sum() is materialised here
    dh = as_rows(dh) if ctx.store_h and dh is not None else None
    dx, dres, dw, db = backward_launch(dy, dh, x, weight, residual, mean, rstd, ctx.offset, ctx.is_rms,
                                       ctx.has_bias)  # fmt: skip
    return dx, (dx if ctx.reuse_h or _shares_dres(x, residual) else dres), dw, db


class _NormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, residual, eps, offset, is_rms, store_h, h_fp32):
        y, h, mean, rstd = norm_fwd_launch(x, weight, bias, residual, eps, offset, is_rms, store_h, h_fp32)
        _save(ctx, x, weight, bias, residual, offset, is_rms, store_h, mean, rstd, h)
        ctx.mark_non_differentiable(rstd, *([mean] if mean is not None else []))
        ctx.set_materialize_grads(False)  # no zero gradients for rstd and mean (see softmax's Function)
        return y, h, mean, rstd

    @staticmethod
    def backward(ctx, dy, dh, dmean, drstd):
        dx, dres, dw, db = _grads(ctx, dy, dh, norm_bwd_launch)
        return dx, dw, db, dres, None, None, None, None, None


def _or_empty(t: Optional[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    """Custom ops cannot return None: an absent output is an empty tensor."""
    return t if t is not None else like.new_empty((0,))


@torch.library.custom_op("tritonkit::norm_fwd", mutates_args=())
def norm_fwd(
    x: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor], residual: Optional[torch.Tensor],
    eps: float, offset: float, is_rms: bool, store_h: bool, h_fp32: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """:func:`norm_fwd_launch` as a custom op (absent outputs empty)."""
    y, h, mean, rstd = norm_fwd_launch(x, weight, bias, residual, eps, offset, is_rms, store_h, h_fp32)
    return y, _or_empty(h, x), _or_empty(mean, rstd), rstd


@norm_fwd.register_fake
def _(x, weight, bias, residual, eps, offset, is_rms, store_h, h_fp32):
    n_rows, n_cols = x.shape
    h_dtype = torch.float32 if h_fp32 else (residual.dtype if residual is not None else x.dtype)
    return (
        x.new_empty((n_rows, n_cols)),
        x.new_empty((n_rows, n_cols), dtype=h_dtype) if store_h else x.new_empty((0,)),
        x.new_empty((0 if is_rms else n_rows,), dtype=torch.float32),
        x.new_empty((n_rows,), dtype=torch.float32),
    )


@torch.library.custom_op("tritonkit::norm_bwd", mutates_args=())
def norm_bwd(
    dy: torch.Tensor, dh: Optional[torch.Tensor], x: torch.Tensor, weight: Optional[torch.Tensor],
    residual: Optional[torch.Tensor], mean: Optional[torch.Tensor], rstd: torch.Tensor, offset: float,
    is_rms: bool, has_bias: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """:func:`norm_bwd_launch` as a custom op (absent outputs empty)."""
    dx, dres, dw, db = norm_bwd_launch(dy, dh, x, weight, residual, mean, rstd, offset, is_rms, has_bias)
    return dx, _or_empty(dres, x), _or_empty(dw, x), _or_empty(db, x)


@norm_bwd.register_fake
def _(dy, dh, x, weight, residual, mean, rstd, offset, is_rms, has_bias):
    n_rows, n_cols = x.shape
    w_dtype = weight.dtype if weight is not None else x.dtype
    return (
        x.new_empty((n_rows, n_cols)),
        x.new_empty((n_rows, n_cols), dtype=residual.dtype)
        if residual is not None and not _shares_dres(x, residual)
        else x.new_empty((0,)),
        x.new_empty((n_cols,), dtype=w_dtype) if weight is not None else x.new_empty((0,)),
        x.new_empty((n_cols,), dtype=w_dtype) if has_bias else x.new_empty((0,)),
    )


def _setup_context(ctx, inputs, output):
    x, weight, bias, residual, _eps, offset, is_rms, store_h, _h_fp32 = inputs
    _, h, mean, rstd = output
    _save(ctx, x, weight, bias, residual, offset, is_rms, store_h, mean if not is_rms else None, rstd, h)


def _custom_op_backward(ctx, dy, dh, dmean, drstd):
    dx, dres, dw, db = _grads(ctx, dy, dh, norm_bwd)
    weight = ctx.saved_tensors[1]
    return (dx, dw if weight is not None else None, db if ctx.has_bias else None,
            dres if ctx.has_residual else None, None, None, None, None, None)  # fmt: skip


norm_fwd.register_autograd(_custom_op_backward, setup_context=_setup_context)


# --------------------------------------------------------------------------------------------------
# Public functions
# --------------------------------------------------------------------------------------------------
def _check_norm_args(name, x, weight, bias, residual, eps, offset) -> None:
    check_tensor("x", x, dtypes=FLOAT_DTYPES)
    if x.dim() == 0:
        raise ValueError(f"{name}: x must have at least one dimension, got a scalar")
    n_cols = x.shape[-1]
    if n_cols == 0:
        raise ValueError(
            f"{name}: x's last dimension (the normalised one) must be non-empty, got shape {tuple(x.shape)}"
        )
    for arg_name, value in (("weight", weight), ("bias", bias)):
        if value is not None:
            check_tensor(arg_name, value, dtypes=FLOAT_DTYPES)
            if value.shape != (n_cols,):
                raise ValueError(f"{name}: {arg_name} must have shape ({n_cols},) to match x's last dimension, "
                                 f"got {tuple(value.shape)}")  # fmt: skip
    if residual is not None:
        check_tensor("residual", residual, dtypes=FLOAT_DTYPES)
        if residual.shape != x.shape:
            raise ValueError(f"{name}: residual must have x's shape {tuple(x.shape)}, got {tuple(residual.shape)}")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps <= 0:
        raise ValueError(f"{name}: eps must be a positive number, got {eps!r}")
    if isinstance(offset, bool) or not isinstance(offset, (int, float)) or not math.isfinite(offset):
        raise ValueError(f"{name}: offset must be a finite number, got {offset!r}")
    if offset != 0 and weight is None:
        raise ValueError(f"{name}: offset={offset} scales the weight, but weight is None")
    tensors = {"x": x, "weight": weight, "bias": bias, "residual": residual}
    check_device(**{k: v for k, v in tensors.items() if v is not None})


# The bare launcher's call where no gradient is needed: without the backward's statistics.
_norm_fwd_no_backward = functools.partial(norm_fwd_launch, store_stats=False)


def _norm(name, is_rms, x, weight, bias, residual, eps, prenorm, residual_in_fp32, offset):
    _check_norm_args(name, x, weight, bias, residual, eps, offset)
    shape = x.shape
    # The kernels read weight and bias with unit stride: a strided view (w[::2]) is made dense once.
    weight = weight.contiguous() if weight is not None else None
    bias = bias.contiguous() if bias is not None else None
    rows, residual_rows = as_rows(x), as_rows(residual)
    call = cheapest_path(norm_fwd, _NormFunction, _norm_fwd_no_backward, (rows, weight, bias, residual_rows))
    y, h, _, _ = call(rows, weight, bias, residual_rows, float(eps), float(offset), is_rms, bool(prenorm),
                      bool(residual_in_fp32))  # fmt: skip
    if y.shape != shape:  # a view only where it changes something: each is an autograd node
        y, h = y.view(shape), (h.view(shape) if prenorm else h)
    return (y, h) if prenorm else y


def rms_norm(x, weight, bias=None, residual=None, eps=1e-6, prenorm=False, residual_in_fp32=False, offset=0.0):
    """RMSNorm of the last dimension, fused with a residual add.

    ``h = x + residual``; ``y = h / sqrt(mean(h^2) + eps) * (offset + weight) + bias``. x: (..., N)
    in fp32/fp16/bf16, weight and bias: (N,) or None, residual: x's shape or None. Returns ``y``
    (x's dtype), or ``(y, h)`` with ``prenorm=True`` (h in fp32 with ``residual_in_fp32=True``, else
    in the residual's dtype, or x's when there is none). Differentiable in x, weight, bias, residual.

    Example: ``y, h = tk.ops.rms_norm(x, w, residual=h, prenorm=True, residual_in_fp32=True)``.
    """
    return _norm("rms_norm", True, x, weight, bias, residual, eps, prenorm, residual_in_fp32, offset)


def layer_norm(x, weight, bias, residual=None, eps=1e-5, prenorm=False, residual_in_fp32=False):
    """LayerNorm of the last dimension, fused with a residual add.

    ``h = x + residual``; ``y = (h - mean(h)) / sqrt(var(h) + eps) * weight + bias`` (biased
    variance, as torch). Shapes, dtypes and ``prenorm``/``residual_in_fp32`` as :func:`rms_norm`;
    weight and bias may be None.

    Example: ``y = tk.ops.layer_norm(x, ln.weight, ln.bias)``.
    """
    return _norm("layer_norm", False, x, weight, bias, residual, eps, prenorm, residual_in_fp32, 0.0)


# --------------------------------------------------------------------------------------------------
# References (float64) and registry specs
# --------------------------------------------------------------------------------------------------
def _reference(is_rms, x, weight, bias=None, residual=None, eps=1e-6, prenorm=False, residual_in_fp32=False,
               offset=0.0):  # fmt: skip
    h = x + residual if residual is not None else x
    if is_rms:
        y = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    else:
        centered = h - h.mean(-1, keepdim=True)
        y = centered * torch.rsqrt(centered.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * (offset + weight)
    if bias is not None:
        y = y + bias
    return (y, h) if prenorm else y


def _rms_norm_reference(x, weight, bias=None, residual=None, eps=1e-6, prenorm=False, residual_in_fp32=False,
                        offset=0.0):  # fmt: skip
    return _reference(True, x, weight, bias, residual, eps, prenorm, residual_in_fp32, offset)


def _layer_norm_reference(x, weight, bias, residual=None, eps=1e-5, prenorm=False, residual_in_fp32=False):
    return _reference(False, x, weight, bias, residual, eps, prenorm, residual_in_fp32)


def _norm_inputs(case, device, dtype, generator):
    rows, n = case["rows"], case["n"]
    lead = case.get("lead", (rows,))

    def randn(*shape, scale=1.0):
        return (scale * torch.randn(shape, device=device, generator=generator, dtype=torch.float32)).to(dtype)

    layout = case.get("layout", "contiguous")
    if layout == "sliced":
        x = randn(*lead, n + 5, scale=case.get("scale", 1.0))[..., 2 : n + 2]
    elif layout == "transposed":
        x = randn(n, *lead, scale=case.get("scale", 1.0)).movedim(0, -1)
    else:
        x = randn(*lead, n, scale=case.get("scale", 1.0))
    if case.get("trend"):  # a ramp along the row, so that parts of a row have different means
        x = (x.float() + torch.linspace(-case["trend"], case["trend"], n, device=device)).to(dtype)
    kwargs = {"eps": case.get("eps", 1e-5)}
    if case.get("residual", False):
        kwargs["residual"] = randn(*x.shape)
    kwargs["prenorm"] = case.get("prenorm", False)
    kwargs["residual_in_fp32"] = case.get("residual_in_fp32", False)
    weight = None if case.get("no_weight") else 1.0 + 0.1 * randn(n).float()
    weight = weight.to(dtype) if weight is not None else None
    bias = 0.1 * randn(n) if case.get("bias", True) else None
    if case.get("offset"):
        kwargs["offset"] = case["offset"]
    return Inputs((x, weight), {"bias": bias, **kwargs})


def _layer_norm_inputs(case, device, dtype, generator):
    inputs = _norm_inputs(case, device, dtype, generator)
    x, weight = inputs.args
    kwargs = dict(inputs.kwargs)
    bias = kwargs.pop("bias")
    kwargs.pop("offset", None)
    return Inputs((x, weight, bias), kwargs)


def _norm_bytes(case, dtype, backward=False):
    """Fewest bytes moved. Forward: x (and residual) in, y (and h) out. Backward: x (and residual)
    and dy (and dh) in, dx out (which is also dresidual). The weight and bias are counted once."""
    elements = math.prod(case.get("lead", (case["rows"],))) * case["n"]
    residual, prenorm = bool(case.get("residual")), bool(case.get("prenorm"))
    tensors = (3 + residual + prenorm) if backward else (2 + residual + prenorm)
    return tensors * elements * dtype.itemsize + 2 * case["n"] * dtype.itemsize


def _liger_rms_norm():
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction

    def call(x, weight, bias=None, residual=None, eps=1e-6, prenorm=False, residual_in_fp32=False, offset=0.0):
        if bias is not None or residual is not None or prenorm:
            raise ValueError("liger-kernel's RMSNorm has no bias, residual or prenorm")
        return LigerRMSNormFunction.apply(x, weight, eps, offset)

    return call


def _liger_layer_norm():
    from liger_kernel.ops.layer_norm import LigerLayerNormFunction

    def call(x, weight, bias, residual=None, eps=1e-5, prenorm=False, residual_in_fp32=False):
        if residual is not None or prenorm:
            raise ValueError("liger-kernel's LayerNorm has no residual or prenorm")
        return LigerLayerNormFunction.apply(x, weight, bias, eps)

    return call


_NORM_TESTS = (
    {"rows": 3, "n": 1},
    {"rows": 5, "n": 7},
    {"rows": 33, "n": 128},
    {"rows": 4, "n": 1000, "residual": True},
    {"rows": 40, "n": 1000, "residual": True},  # above ONE_PROGRAM_BACKWARD: per-program partial sums
    {"rows": 6, "n": 96, "residual": True, "prenorm": True},
    {"rows": 6, "n": 96, "residual": True, "prenorm": True, "residual_in_fp32": True},
    {"rows": 0, "n": 64},
    {"rows": 6, "n": 48, "lead": (2, 3), "layout": "transposed"},
    {"rows": 7, "n": 50, "layout": "sliced", "residual": True},
    {"rows": 9, "n": 64, "scale": 1e-3, "eps": 1e-5},  # variance near eps: a wrong eps shows
    {"rows": 5, "n": 40, "no_weight": True, "bias": False},
    # The split-row forward, the wide backward; a ramp along the row gives LayerNorm's slices (three of 8192
    # in bf16) different means, which its between-slice term must account for.
    {"rows": 2, "n": 20000, "residual": True, "prenorm": True, "trend": 4.0},
    # the 16384 block: single pass both ways, the backward in saves_registers' order
    {"rows": 3, "n": 9000, "residual": True},
    {"rows": 3, "n": 3000, "residual": True, "prenorm": True},  # RMSNorm's looped forward within one block
)
_NORM_GPU = (
    {"rows": 4096, "n": 4096},
    {"rows": 1000, "n": 5120, "residual": True, "prenorm": True, "residual_in_fp32": True},
    {"rows": 333, "n": 131072, "residual": True},
    {"rows": 7, "n": 65537},
    {"rows": 8, "n": 4096},
    {"rows": 4097, "n": 123, "lead": (17, 241), "layout": "transposed"},
    {"rows": 1111, "n": 16000, "residual": True},  # the widest single-pass forward, with a residual
    {"rows": 64, "n": 40000, "trend": 4.0, "residual": True, "prenorm": True, "residual_in_fp32": True},
    {"rows": 1001, "n": 1024},  # LayerNorm's forward plans of two rows a block at 1024, with statistics and without
    {"rows": 999, "n": 2048},  # (_LN_FWD_MEASURED, _LN_FWD_NO_STATS): odd rows; its plan at 2048 changed too
)
# The small case first (`--sizes small`), the sweep over widths, then the fused add + prenorm case.
_NORM_BENCH = (
    {"rows": 8, "n": 4096, "bias": False},
    *({"rows": 16384, "n": n, "bias": False} for n in (1024, 2048, 4096, 8192, 16384)),
    {"rows": 4096, "n": 65536, "bias": False},  # rows split across programs (the bytes of 16384 x 16384)
    {"rows": 16384, "n": 4096, "bias": False, "residual": True, "prenorm": True},
)

_RMS_TESTS = (*_NORM_TESTS, {"rows": 5, "n": 64, "offset": 1.0})


def _norm_tolerance(case, dtype):
    """fp32 gradients need 1e-4: the backward's g - mean(g) - xhat * mean(g * xhat) cancels, and rstd
    scales the remainder, so fp32 rounding reaches ~3e-5 relative on rows whose variance is near eps
    (seen in the scale=1e-3 case). A wrong eps or a dropped term is still off by orders more."""
    return Tolerance(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else None


_LAYER_NORM_BENCH = tuple({**case, "bias": True} for case in _NORM_BENCH)  # LayerNorm usually has a bias

for _name, _fn, _reference_fn, _inputs, _tests, _bench, _liger in (
    ("rms_norm", rms_norm, _rms_norm_reference, _norm_inputs, _RMS_TESTS, _NORM_BENCH, _liger_rms_norm),
    (
        "layer_norm",
        layer_norm,
        _layer_norm_reference,
        _layer_norm_inputs,
        _NORM_TESTS,
        _LAYER_NORM_BENCH,
        _liger_layer_norm,
    ),
):
    register(KernelSpec(
        name=_name,
        family="norm",
        summary=f"Fused residual add + {'RMSNorm' if _name == 'rms_norm' else 'LayerNorm'}, forward and backward.",
        description="h = x + residual, y = normalize(h) * (offset + weight) + bias, with prenorm returning h "
                    "(optionally fp32), as mamba_ssm's fused add+norm. One pass in registers up to 16384 "
                    "columns; beyond, programs share each row (forward, and the backward where faster); fp32 "
                    "statistics; deterministic fp32 dweight/dbias.",
        usage=f"y, h = tk.ops.{_name}(x, weight{', bias' if _name == 'layer_norm' else ''}, residual=h, "
              "prenorm=True)",
        tags=("norm", "fused", "memory-bound", "backward"),
        limits="Normalises the last dimension; any leading shape; hidden sizes from 1 up (wide rows split).",
        fn=_fn,
        reference=_reference_fn,
        make_inputs=_inputs,
        test_cases=_tests,
        gpu_cases=_NORM_GPU,
        bench_cases=_bench,
        bytes_moved=_norm_bytes,
        bytes_moved_bwd=functools.partial(_norm_bytes, backward=True),
        flops=lambda case, dtype: 5 * math.prod(case.get("lead", (case["rows"],))) * case["n"],
        dtypes=FLOAT_DTYPES,
        has_backward=True,
        tolerance=_norm_tolerance,
        peers={"liger": _liger},
    ))  # fmt: skip
