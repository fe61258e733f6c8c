"""Softmax and log-softmax along any dimension, forward and backward, as torch custom ops.

Rows up to MAX_SINGLE_PASS wide are reduced in registers. Longer rows are split across programs: each
takes a slice, publishes the slice's maximum m_b and sum s_b of exp(x - m_b), and once all of the row's
programs have (_core.row_sync), combines them, s = sum_b s_b exp(m_b - m), and writes its slice. Rows
that are entirely -inf give NaN, as torch does; a maximum of -inf is replaced by 0 in exponents so that
partly masked rows stay exact.

No ``from __future__ import annotations`` here: torch.library reads the launchers' type hints at runtime.
"""

import functools
import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from tritonkit._core import alloc
from tritonkit._core.checks import FLOAT_DTYPES, check_device, check_tensor
from tritonkit._core.device import pipeline_depth, sm_count
from tritonkit._core.dispatch import cheapest_path
from tritonkit._core.fastmath import LOG2_E
from tritonkit._core.ints import cdiv, next_power_of_2
from tritonkit._core.layout import as_rows
from tritonkit._core.row_sync import launch_split_rows, publish_and_wait, this_slice
from tritonkit.registry import Inputs, KernelSpec, Tolerance, register

__all__ = ["log_softmax", "softmax"]

MAX_SINGLE_PASS = 32768
# Rows wider than MAX_SINGLE_PASS: (slice, warps) of the split-row kernels, keyed by (backward, element size).
# Holding the slice in registers across the wait, with one exp an element, beat reading it again from L2 and
# taking the exps again: kernels alone over 2**28 elements at 65536, 131072 and 262144 wide on the H200 (a scratch
# probe, 2026-11-22-softmax-split-row-hold.txt), % of the copy ceiling, bf16 forward 82.9/81.6/78.1 (was
# 71.5/68.0/66.4), backward 87.0/85.8/82.2 (84.0/83.5/84.3); fp32 forward 93.9/92.9/91.6 (83.1/82.0/80.9), backward
# 101.0/99.6/96.5 (87.5/87.8/86.5). Then swept through the launchers over 2**29 elements
# (2026-11-22-softmax-split-row-configs-hold-{bf16,fp32}.txt): these entries are the best or within 2% of it.
SPLIT_ROW = {(False, 2): (8192, 4), (False, 4): (8192, 8), (True, 2): (8192, 8), (True, 4): (8192, 8)}
# The single pass's (rows per program, warps), keyed by (row width, element size, backward): the fastest
# (or within 1% of it, with fewer warps) in a sweep of 16384 rows on the H200
# (2026-11-22-softmax-single-pass-configs.txt). Against about 4096 elements a program, the bf16 forward
# gained 13% at 1024 and 10% at 2048, the rest 0-4%. The 16-bit backward at 32768 with 32 warps: 0.80 ms
# against 0.84 looped with the L2 hints and 1.07 with 16 warps (2026-11-22-register-caps.txt). Other
# widths keep that rule.
_SINGLE_PASS_MEASURED = {
    (1024, 2, False): (2, 2), (2048, 2, False): (1, 4), (4096, 2, False): (1, 4), (8192, 2, False): (1, 4),
    (1024, 2, True): (1, 4), (2048, 2, True): (1, 4), (4096, 2, True): (1, 4), (8192, 2, True): (1, 8),
    (32768, 2, True): (1, 32),
    (1024, 4, False): (1, 2), (2048, 4, False): (1, 2), (4096, 4, False): (1, 16), (8192, 4, False): (1, 16),
    (1024, 4, True): (1, 2), (2048, 4, True): (1, 16), (4096, 4, True): (1, 16), (8192, 4, True): (1, 16),
}  # fmt: skip
# Whole rows with a grid of a few programs per SM looping over them, the next row's loads issued while
# this one is reduced: (warps, programs per SM, pipeline depth), same keys. Where one row per program
# leaves one program on an SM, its memory idles while it computes; this overlap gained 16-22%: bf16
# forward 32768 0.664 -> 0.546 ms (93% of the copy bandwidth), backward 16384 bf16 0.465 -> 0.392 and
# fp32 0.959 -> 0.765 (2026-11-22-softmax-grid-loop-configs.txt). Elsewhere it was slower.
_GRID_LOOP_MEASURED = {(32768, 2, False): (16, 2, 3), (16384, 2, True): (16, 1, 3), (16384, 4, True): (32, 4, 3)}


@triton.jit
def _exp(x):
    """exp(x) as 2^(x log2(e)) through tl.exp2, one ex2.approx.ftz: tl.exp's ex2 keeps denormals, with more
    instructions that cost the split-row bf16 forward 20% (2600 against 3090 GB/s at 65536 wide, H200). Results
    below 2^-126 flush to 0. The argument is a difference from the row's maximum or lse, so its rounding
    (relative 2^-24) moves the result by as little as tl.exp's own; scaling x and the maximum separately
    moved log_softmax's lse by 1e-6."""
    return tl.exp2(x * LOG2_E)


@triton.jit
def _finite_or_zero(m):
    """A row maximum usable in exponents: -inf (a fully masked row) becomes 0."""
    return tl.where(m == float("-inf"), 0.0, m)


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
    b_m = _finite_or_zero(tl.max(b_x, axis=1))[:, None]
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
        b_p = _exp(b_x - _finite_or_zero(b_m))
        tl.store(p_maxes + i_block, b_m)
        tl.store(p_sums + i_block, tl.sum(b_p, axis=0))
        if PHASES == 3:
            publish_and_wait(p_count + i_row, n_blocks)
    if PHASES != 1:
        o_b = tl.arange(0, BLOCKS_P2)
        # volatile: the parts were written by other programs during this launch; never serve them from L1.
        b_maxes = tl.load(p_maxes + o_b, mask=o_b < n_blocks, other=float("-inf"), volatile=True)
        b_sums = tl.load(p_sums + o_b, mask=o_b < n_blocks, other=0.0, volatile=True)
        m_safe = _finite_or_zero(tl.max(b_maxes, axis=0))
        s = tl.sum(b_sums * _exp(b_maxes - m_safe), axis=0)
        lse = m_safe + tl.log(s)
        if i_block == 0:
            tl.store(p_lse + i_row, lse)
        if PHASES == 2:
            b_m = tl.load(p_maxes + i_block)
            b_x = tl.load(p_x_row + o_n, mask=m_n, other=float("-inf")).to(tl.float32)
            b_p = _exp(b_x - _finite_or_zero(b_m))
        # exp(m_b - m) from the slice's own maximum: 0 for a slice of -inf alone, whose p_b is 0 (never 0 * inf)
        b_y = b_x - lse if LOG else b_p * (_exp(b_m - m_safe) / s)
        tl.store(p_y + i_row * stride_y_row + o_n, b_y.to(p_y.dtype.element_ty), mask=m_n)


@triton.jit
def _softmax_bwd_split_row_kernel(
    p_dy, p_x, p_lse, p_dx, p_part, p_count, n_rows, n_cols, n_blocks, stride_dy_row, stride_x_row, stride_dx_row,
    LOG: tl.constexpr, BLOCK_N: tl.constexpr, BLOCKS_P2: tl.constexpr, PHASES: tl.constexpr,
):  # fmt: skip
    """Backward of rows wider than one program holds, slices and PHASES as _softmax_fwd_split_row_kernel's.
    With p = exp(x - lse): phase 1 the slice's part of c, sum(dy) (log_softmax) or sum(dy * p) (softmax);
    phase 2 c = the parts' sum in a fixed order, then dx = dy - p * c or p * (dy - c) on the slice. In one
    launch (PHASES 3) dy and p stay in registers across the wait; in two, phase 2 reads dy and x again."""
    i_row, i_block, o_n, m_n = this_slice(n_cols, n_blocks, BLOCK_N)
    p_dy_row = p_dy + i_row * stride_dy_row
    p_x_row = p_x + i_row * stride_x_row
    p_parts = p_part + i_row * n_blocks
    lse = tl.load(p_lse + i_row)
    if PHASES != 2:
        b_dy = tl.load(p_dy_row + o_n, mask=m_n, other=0.0).to(tl.float32)
        b_p = _exp(tl.load(p_x_row + o_n, mask=m_n, other=float("-inf")).to(tl.float32) - lse)
        tl.store(p_parts + i_block, tl.sum(b_dy if LOG else b_dy * b_p, axis=0))
        if PHASES == 3:
            publish_and_wait(p_count + i_row, n_blocks)
    if PHASES != 1:
        o_b = tl.arange(0, BLOCKS_P2)
        c = tl.sum(tl.load(p_parts + o_b, mask=o_b < n_blocks, other=0.0, volatile=True), axis=0)
        if PHASES == 2:
            b_dy = tl.load(p_dy_row + o_n, mask=m_n, other=0.0).to(tl.float32)
            b_p = _exp(tl.load(p_x_row + o_n, mask=m_n, other=float("-inf")).to(tl.float32) - lse)
        b_dx = b_dy - b_p * c if LOG else b_p * (b_dy - c)
        tl.store(p_dx + i_row * stride_dx_row + o_n, b_dx.to(p_dx.dtype.element_ty), mask=m_n)


class SoftmaxPlan(NamedTuple):
    split_row: bool  # rows wider than one program: block_n-element slices, several programs a row (SPLIT_ROW)
    block_n: int  # the row's power of two, or the slice
    rows: int  # rows per block (whole rows)
    warps: int
    stages: int  # software-pipeline depth of a grid loop over row blocks
    programs_per_sm: int  # a grid of this many programs per SM looping over row blocks (0: one each)


@functools.lru_cache(maxsize=256)
def softmax_launch_plan(n_cols: int, backward: bool = False, element_size: int = 2) -> SoftmaxPlan:
    """Whole rows in registers up to MAX_SINGLE_PASS, as measured (_GRID_LOOP_MEASURED,
    _SINGLE_PASS_MEASURED) or about 4096 elements a program; rows split across programs beyond (SPLIT_ROW).
    log_softmax shares softmax's plans: its passes move the same bytes."""
    block_n = next_power_of_2(n_cols)
    if block_n > MAX_SINGLE_PASS:
        block, warps = SPLIT_ROW[backward, element_size]
        return SoftmaxPlan(True, block, 1, warps, 1, 0)
    grid_loop = _GRID_LOOP_MEASURED.get((block_n, element_size, backward))
    if grid_loop is not None:
        warps, per_sm, stages = grid_loop
        return SoftmaxPlan(False, block_n, 1, warps, stages, per_sm)
    measured = _SINGLE_PASS_MEASURED.get((block_n, element_size, backward))
    if measured is not None:
        return SoftmaxPlan(False, block_n, *measured, 1, 0)
    rows = max(1, min(64, 4096 // block_n))
    elements = rows * block_n
    return SoftmaxPlan(False, block_n, rows, 4 if elements <= 2048 else 8 if elements <= 8192 else 16, 1, 0)


def _launch(kernel, split_row_kernel, tensors, strides, x, log, backward, plan, **whole_row_constexprs):
    """Launches the whole-row kernel, or for a split-row plan the split-row kernel: both its phases in one
    launch where the row's programs may wait for each other (row_sync.waits_safely), else one launch per
    phase (each row read twice). ``whole_row_constexprs``: the whole-row kernel's own beyond the plan's."""
    n_rows, n_cols = x.shape
    if plan.split_row:
        launch_split_rows(split_row_kernel, tensors, strides, n_rows, n_cols, plan.block_n, 1 if backward else 2,
                          x.device, plan.warps, LOG=log)  # fmt: skip
        return
    n_programs = cdiv(n_rows, plan.rows)
    if plan.programs_per_sm:
        n_programs = min(n_programs, plan.programs_per_sm * sm_count(x.device))
    # Bytes one pipelined loop iteration loads: a block of whole rows of x (forward) or dy and x.
    stage_bytes = plan.rows * plan.block_n * (2 if backward else 1) * x.element_size()
    kernel[(n_programs,)](*tensors, n_rows, n_cols, *strides, LOG=log, GRID_LOOP=plan.programs_per_sm > 0,
                          ROWS=plan.rows, BLOCK_N=plan.block_n,
                          LOOP_STAGES=pipeline_depth(plan.stages, stage_bytes, x.device),
                          num_warps=plan.warps, **whole_row_constexprs)  # fmt: skip


def softmax_fwd_launch(
    x: torch.Tensor, log: bool, plan: SoftmaxPlan | None = None, store_lse: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """x: (rows, N) with unit column stride. Returns y (x's shape and dtype) and the fp32 row
    log-sum-exp the backward needs. Without ``store_lse`` (a forward no backward follows) whole rows skip its
    one-element store per row, 2% of the forward at 1024 wide, and return None for it; rows split across
    programs store it regardless (one program a row; skipping it measured 6% slower for log_softmax,
    2026-11-22-softmax-fwd-lse-ab.txt). ``plan``: softmax_launch_plan's, unless a sweep or a test gives one."""
    y = alloc.empty(x.shape, dtype=x.dtype, device=x.device)
    plan = plan or (softmax_launch_plan(x.shape[1], False, x.element_size()) if x.numel() else None)
    store_lse = store_lse or (plan is not None and plan.split_row)
    lse = alloc.empty((x.shape[0],), dtype=torch.float32, device=x.device) if store_lse else None
    if x.numel():
        _launch(_softmax_fwd_kernel, _softmax_fwd_split_row_kernel, (x, y, lse if store_lse else y),
                (x.stride(0), y.stride(0)), x, log, False, plan, STORE_LSE=store_lse)  # fmt: skip
    return y, lse


def softmax_bwd_launch(dy: torch.Tensor, x: torch.Tensor, lse: torch.Tensor, log: bool,
                       plan: SoftmaxPlan | None = None) -> torch.Tensor:  # fmt: skip
    """dy, x: (rows, N) with unit column stride; lse from the forward; ``plan`` as softmax_fwd_launch's."""
    dx = alloc.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.numel():
        plan = plan or softmax_launch_plan(x.shape[1], True, x.element_size())
        _launch(_softmax_bwd_kernel, _softmax_bwd_split_row_kernel, (dy, x, lse, dx),
                (dy.stride(0), x.stride(0), dx.stride(0)), x, log, True, plan)  # fmt: skip
    return dx


def _save(ctx, x, lse, log):
    ctx.save_for_backward(x, lse)
    ctx.log = log


def _grad(ctx, dy, backward_launch):
    x, lse = ctx.saved_tensors
    return backward_launch(as_rows(dy), x, lse, ctx.log)


class _SoftmaxFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, log):
        y, lse = softmax_fwd_launch(x, log)
        _save(ctx, x, lse, log)
        ctx.mark_non_differentiable(lse)
        # No zero gradient for lse: autograd's zeros cost a fill launch from its backward thread, ~200 µs
        # of host time per step on the H200's host (torch.profiler), more than the rest of the step.
        ctx.set_materialize_grads(False)
        return y, lse

    @staticmethod
    def backward(ctx, dy, dlse):
        return (_grad(ctx, dy, softmax_bwd_launch) if dy is not None else None), None


@torch.library.custom_op("tritonkit::softmax_fwd", mutates_args=())
def softmax_fwd(x: torch.Tensor, log: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return softmax_fwd_launch(x, log)


@softmax_fwd.register_fake
def _(x, log):
    return torch.empty_like(x), x.new_empty((x.shape[0],), dtype=torch.float32)


@torch.library.custom_op("tritonkit::softmax_bwd", mutates_args=())
def softmax_bwd(dy: torch.Tensor, x: torch.Tensor, lse: torch.Tensor, log: bool) -> torch.Tensor:
    return softmax_bwd_launch(dy, x, lse, log)


@softmax_bwd.register_fake
def _(dy, x, lse, log):
    return torch.empty_like(x)


def _setup_context(ctx, inputs, output):
    x, log = inputs
    _, lse = output
    _save(ctx, x, lse, log)


def _custom_op_backward(ctx, dy, dlse):
    return _grad(ctx, dy, softmax_bwd), None


softmax_fwd.register_autograd(_custom_op_backward, setup_context=_setup_context)


# The bare launcher's call where no gradient is needed: without the backward's lse.
_softmax_fwd_no_backward = functools.partial(softmax_fwd_launch, store_lse=False)


def _softmax(name: str, x: torch.Tensor, dim: int, log: bool) -> torch.Tensor:
    check_tensor("x", x, dtypes=FLOAT_DTYPES)
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"{name}: dim must be an int, got {type(dim).__name__}")
    ndim = max(x.dim(), 1)
    if not -ndim <= dim < ndim:
        raise ValueError(f"{name}: dim must be in [{-ndim}, {ndim - 1}] for x of shape {tuple(x.shape)}, got {dim}")
    check_device(x=x)
    # Only the views that change something: each one is an autograd node, forward and backward.
    last = dim % ndim == ndim - 1
    moved = x.reshape(1) if x.dim() == 0 else x if last else x.movedim(dim, -1)
    rows = as_rows(moved)
    y, _ = cheapest_path(softmax_fwd, _SoftmaxFunction, _softmax_fwd_no_backward, (rows,))(rows, log)
    if y.shape != moved.shape:
        y = y.view(moved.shape)
    return y.view(x.shape) if x.dim() == 0 else y if last else y.movedim(-1, dim)


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``torch.softmax(x, dim)``: exp(x - max) / sum(exp(x - max)) along ``dim``, computed in fp32.

    Any shape and strides, fp32/fp16/bf16; -inf entries are zero, fully -inf rows NaN (as torch).
    Differentiable. Example: ``p = tk.ops.softmax(scores, dim=-1)``.
    """
    return _softmax("softmax", x, dim, log=False)


def log_softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``torch.log_softmax(x, dim)``: x - max - log(sum(exp(x - max))) along ``dim``, computed in fp32.

    Same shapes, dtypes and masking behaviour as :func:`softmax`. Differentiable.
    """
    return _softmax("log_softmax", x, dim, log=True)


# --------------------------------------------------------------------------------------------------
# References and registry specs
# --------------------------------------------------------------------------------------------------
def _softmax_reference(x, dim=-1):
    return torch.softmax(x, dim)


def _log_softmax_reference(x, dim=-1):
    return torch.log_softmax(x, dim)


def _softmax_inputs(case, device, dtype, generator):
    rows, n = case["rows"], case["n"]
    x = (case.get("scale", 3.0) * torch.randn(rows, n, device=device, generator=generator)).to(dtype)
    if case.get("masked"):  # a causal-style mask: -inf above the diagonal, and one fully masked row
        x = x.masked_fill(torch.ones(rows, n, dtype=torch.bool, device=device).triu(1), float("-inf"))
        x[0] = float("-inf")
    if case.get("transposed"):
        x = x.t().contiguous().t()  # same values, column-major: dim -1 is strided
    if case.get("dim", -1) != -1:
        x = x.movedim(-1, case["dim"]).contiguous()
    return Inputs((x,), {"dim": case.get("dim", -1)})


def _softmax_bytes(case, dtype, backward=False):
    return (3 if backward else 2) * case["rows"] * case["n"] * dtype.itemsize


_TESTS = (
    {"rows": 1, "n": 1},
    {"rows": 5, "n": 7},
    {"rows": 33, "n": 128},
    {"rows": 3, "n": 1000, "transposed": True},
    {"rows": 6, "n": 16, "masked": True},
    {"rows": 2, "n": 40000},  # rows split across programs
    {"rows": 3, "n": 20000},  # a 32768 block: the 16-bit backward's 32-warp single pass
    {"rows": 2, "n": 40000, "masked": True},
    {"rows": 0, "n": 16},
    {"rows": 4, "n": 9, "dim": 0},
    {"rows": 4, "n": 64, "scale": 30.0},  # large logits: exp would overflow without the max shift
)
_GPU = (
    {"rows": 4096, "n": 4096},
    {"rows": 1024, "n": 262144},
    {"rows": 1000, "n": 50257, "masked": True},
    {"rows": 2048, "n": 4096, "transposed": True},
    {"rows": 8, "n": 4096},
)
# The small case, the width sweep, then rows split across programs (the bytes of 16384 x 16384).
_BENCH = (
    {"rows": 8, "n": 4096},
    *({"rows": 16384, "n": n} for n in (1024, 2048, 4096, 8192, 32768)),
    {"rows": 4096, "n": 65536},
)


def _log_softmax_tolerance(case, dtype):
    """fp32 needs an absolute bound that grows with the row: the gradient g - exp(y) * sum(g) sums n
    upstream values of unit scale (|sum| ~ sqrt(n)), and where exp(y) is near 1 the subtraction cancels,
    leaving the sum's rounding, a few ulp of sqrt(n), as absolute error. Measured: at most 5.7 * 2**-24 *
    sqrt(n) over 12 seeds each at n = 40000 and 100000 (torch's own fp32 CPU backward: 39). Softmax's gradient
    p * (g - sum(p * g)) sums a weighted mean instead and keeps the table's bound."""
    if dtype != torch.float32:
        return None
    return Tolerance(atol=max(1e-5, 16 * 2**-24 * math.sqrt(case["n"])), rtol=1e-5)


for _name, _fn, _ref, _tolerance in (
    ("softmax", softmax, _softmax_reference, None),
    ("log_softmax", log_softmax, _log_softmax_reference, _log_softmax_tolerance),
):
    register(KernelSpec(
        name=_name,
        family="softmax",
        summary=f"{'Log-softmax' if _name == 'log_softmax' else 'Softmax'} along any dimension, forward and backward.",
        description="Rows up to 32768 in registers; longer rows split across programs, which combine their "
                    "slices' maxima and rescaled sums once all have published them, each holding its slice in "
                    "registers meanwhile: one read of each element. fp32 arithmetic; -inf handled as torch.",
        usage=f"p = tk.ops.{_name}(x, dim=-1)",
        tags=("softmax", "memory-bound", "backward"),
        limits="Any shape, dim and strides (a strided dim costs one torch copy); rows of any length.",
        fn=_fn,
        reference=_ref,
        make_inputs=_softmax_inputs,
        test_cases=_TESTS,
        gpu_cases=_GPU,
        bench_cases=_BENCH,
        bytes_moved=_softmax_bytes,
        bytes_moved_bwd=functools.partial(_softmax_bytes, backward=True),
        flops=lambda case, dtype: 5 * case["rows"] * case["n"],
        dtypes=FLOAT_DTYPES,
        has_backward=True,
        tolerance=_tolerance,
        status="experimental",
    ))  # fmt: skip
