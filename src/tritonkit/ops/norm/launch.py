"""Norm launchers: validate the public arguments, allocate, launch (tensors in, tensors out; ``plan=`` optional).

x and residual arrive as (rows, N) matrices with unit column stride (tritonkit._core.layout.as_rows). Absent outputs
are empty tensors (the custom ops cannot return None).
"""

from __future__ import annotations

import math

import torch

from tritonkit._core.checks import FLOAT_DTYPES, check_device, check_tensor
from tritonkit._core.device import arch, pipeline_depth, sm_count
from tritonkit._core.ints import cdiv, next_power_of_2
from tritonkit._core.row_sync import launch_split_rows, row_counters, waits_safely
from tritonkit.ops.norm.kernels import (
    _norm_bwd_columns_kernel,
    _norm_bwd_kernel,
    _norm_bwd_row_sums_kernel,
    _norm_fwd_kernel,
    _norm_fwd_split_row_kernel,
    _rms_norm_fwd_looped_kernel,
    _sum_partials_kernel,
)
from tritonkit.ops.norm.plan import (
    MANY_ROWS,
    ONE_PROGRAM_BACKWARD,
    PARTIAL_SUM_WARPS,
    ROW_SUMS_CHUNK,
    ROW_SUMS_STAGES,
    ROW_SUMS_WARPS,
    BwdGivenPlan,
    BwdRowsPlan,
    BwdSharedPlan,
    FwdLoopedPlan,
    FwdSplitRowPlan,
    NormBwdPlan,
    NormFwdPlan,
    given_plan,
    loads_weight_first,
    norm_bwd_plan,
    norm_fwd_plan,
    partial_sum_block,
    saves_registers,
)


def check_norm_args(name, x, weight, bias, residual, eps, offset) -> None:
    """The public functions' checks; every error names the argument, what was expected and what came."""
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


def _or(t: torch.Tensor | None, placeholder: torch.Tensor) -> torch.Tensor:
    """A kernel argument that may be absent: ``placeholder`` stands in (the kernel's switches never touch it)."""
    return t if t is not None else placeholder


def _present(t: torch.Tensor | None, placeholder: torch.Tensor) -> torch.Tensor:
    """An output that may be absent or empty: ``placeholder`` stands in (an empty CUDA tensor has no address)."""
    return t if t is not None and t.numel() > 0 else placeholder


def _stride0(t: torch.Tensor | None) -> int:
    return t.stride(0) if t is not None else 0


def _bytes_per_element(*tensors) -> int:
    """Bytes a kernel loads per row element from ``tensors`` (None skipped): one pipeline stage's share."""
    return sum(t.element_size() for t in tensors if t is not None)


def _h_dtype(x, residual, h_fp32: bool) -> torch.dtype:
    return torch.float32 if h_fp32 else (residual.dtype if residual is not None else x.dtype)


# ----------------------------------------------------------------------------------------------------------------
# Forward
# ----------------------------------------------------------------------------------------------------------------
def norm_fwd(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    residual: torch.Tensor | None,
    eps: float,
    offset: float,
    is_rms: bool,
    store_h: bool,
    h_fp32: bool,
    *,
    store_stats: bool = True,
    plan: NormFwdPlan | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns y, h (empty unless store_h), mean (empty for RMSNorm) and rstd, the last two fp32 of shape (rows,).
    Without ``store_stats`` (a forward no backward follows) mean and rstd are empty too: their one-element stores
    per row cost a forward 2% (docs/kernels/norm.md). ``plan``: the measured plan unless a sweep or a test gives
    one."""
    n_rows, n_cols = x.shape
    y = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
    h = torch.empty((n_rows, n_cols) if store_h else (0,), dtype=_h_dtype(x, residual, h_fp32), device=x.device)
    mean = torch.empty((n_rows if store_stats and not is_rms else 0,), dtype=torch.float32, device=x.device)
    rstd = torch.empty((n_rows if store_stats else 0,), dtype=torch.float32, device=x.device)
    if n_rows == 0:
        return y, h, mean, rstd
    plan = plan or norm_fwd_plan(n_cols, x.element_size(), is_rms, arch(x.device))
    tensors = (x, _or(residual, x), _or(weight, x), _or(bias, x), y, h if store_h else y)
    strides = (x.stride(0), _stride0(residual), y.stride(0), h.stride(0) if store_h else 0, eps, offset)
    flags = dict(HAS_RES=residual is not None, HAS_W=weight is not None, HAS_B=bias is not None, STORE_H=store_h,
                 STORE_STATS=store_stats)  # fmt: skip
    p_rstd = _present(rstd, y)  # no statistics stored: y stands in (never written)
    p_mean = _present(mean, p_rstd)
    if isinstance(plan, FwdSplitRowPlan):
        launch_split_rows(_norm_fwd_split_row_kernel, (*tensors, p_mean, p_rstd), strides, n_rows,
                          n_cols, plan.slice, 1 if is_rms else 2, x.device, plan.warps, IS_RMS=is_rms,
                          SUB_N=plan.piece, **flags)  # fmt: skip
    elif isinstance(plan, FwdLoopedPlan):
        if not is_rms:
            raise ValueError("norm_fwd: only RMSNorm has a looped forward (FwdLoopedPlan)")
        # Its two pipelined passes over a row each have buffers of their own.
        stage_bytes = 2 * plan.chunk * _bytes_per_element(x, residual)
        _rms_norm_fwd_looped_kernel[(n_rows,)](
            *tensors, p_rstd, n_cols, *strides, **flags, BLOCK_N=plan.chunk,
            LOOP_STAGES=pipeline_depth(plan.stages, stage_bytes, x.device), num_warps=plan.warps,
        )  # fmt: skip
    else:
        block_n = next_power_of_2(n_cols)
        _norm_fwd_kernel[(cdiv(n_rows, plan.rows),)](
            *tensors, p_mean, p_rstd, n_rows, n_cols, *strides, IS_RMS=is_rms, **flags,
            ROWS=plan.rows, BLOCK_N=block_n, WEIGHT_FIRST=loads_weight_first(plan.rows, block_n, plan.warps),
            num_warps=plan.warps,
        )  # fmt: skip
    return y, h, mean, rstd


def norm_fwd_fake(x, weight, bias, residual, eps, offset, is_rms, store_h, h_fp32):
    n_rows, n_cols = x.shape
    return (
        x.new_empty((n_rows, n_cols)),
        x.new_empty((n_rows, n_cols) if store_h else (0,), dtype=_h_dtype(x, residual, h_fp32)),
        x.new_empty((0 if is_rms else n_rows,), dtype=torch.float32),
        x.new_empty((n_rows,), dtype=torch.float32),
    )


# ----------------------------------------------------------------------------------------------------------------
# Backward
# ----------------------------------------------------------------------------------------------------------------
def shares_dres(x: torch.Tensor, residual: torch.Tensor | None) -> bool:
    """d(loss)/d(residual) is d(loss)/dx (both are dh): one tensor serves both when their dtypes agree, which saves
    the backward writing it twice."""
    return residual is not None and residual.dtype == x.dtype


def norm_bwd(
    dy: torch.Tensor,
    dh: torch.Tensor | None,
    x: torch.Tensor,
    weight: torch.Tensor | None,
    residual: torch.Tensor | None,
    mean: torch.Tensor | None,
    rstd: torch.Tensor,
    offset: float,
    is_rms: bool,
    has_bias: bool,
    *,
    plan: NormBwdPlan | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns dx, dresidual (empty without a residual, or when it is dx: shares_dres), dweight and dbias (empty
    when absent). ``plan``: the measured plan, or one program that writes dweight and dbias itself for a few rows,
    unless a sweep or a test gives one (a shared plan runs as the two phases where programs may not wait)."""
    n_rows, n_cols = x.shape
    device = x.device
    dx = torch.empty((n_rows, n_cols), dtype=x.dtype, device=device)
    separate_dres = residual is not None and not shares_dres(x, residual)
    dres = torch.empty((n_rows, n_cols) if separate_dres else (0,), dtype=_or(residual, x).dtype, device=device)
    w_dtype = weight.dtype if weight is not None else x.dtype
    # A few rows take one program, unless a plan is given: then its row groups run as it says.
    one_program = plan is None and 0 < n_rows * n_cols <= ONE_PROGRAM_BACKWARD
    plan = plan or norm_bwd_plan(n_cols, x.element_size(), is_rms, has_bias, n_rows >= MANY_ROWS, arch(device))
    if isinstance(plan, BwdSharedPlan) and not waits_safely(cdiv(n_cols, plan.block_n), device):
        plan = given_plan(x.element_size(), arch(device))
    one_program = one_program and isinstance(plan, BwdRowsPlan)
    n_sums = (weight is not None) + has_bias
    if one_program:
        # A few rows: one program sums dweight/dbias over all of them in fp32 and stores them in the weight's dtype
        # itself, which saves the reduction's launch (the host's cost dominates here).
        n_parts = 1
        dw_part = torch.empty((n_cols if weight is not None else 0,), dtype=w_dtype, device=device)
        db_part = torch.empty((n_cols if has_bias else 0,), dtype=w_dtype, device=device)
    else:
        # One fp32 workspace holds each row group's share of dweight and dbias, summed in a fixed order afterwards,
        # and on the wide paths each row's terms. No rows: zeros, which that sum turns into zero gradients.
        if isinstance(plan, BwdRowsPlan):  # at most one group per step of rows (interleaved: none past the last)
            n_parts = max(1, min(cdiv(n_rows, plan.rows), plan.programs_per_sm * sm_count(device)))
        else:
            n_parts = max(1, min(n_rows, plan.programs_per_sm * sm_count(device) // cdiv(n_cols, plan.block_n)))
        n_partials = n_sums * n_parts * n_cols
        allocate = torch.empty if n_rows > 0 else torch.zeros
        workspace = allocate((n_partials + _row_terms_size(plan, n_rows, n_cols, is_rms),), dtype=torch.float32,
                             device=device)  # fmt: skip
        partials = workspace[:n_partials].view(n_sums, n_parts, n_cols)
        row_terms = workspace[n_partials:]
        dw_part = partials[0] if weight is not None else None
        db_part = partials[n_sums - 1] if has_bias else None
    if n_rows > 0:
        tensors = (dy, _or(dh, dy), x, _or(residual, x), _or(weight, x), _or(mean, rstd), rstd)
        outputs = (dx, dres if separate_dres else dx, _present(dw_part, rstd), _present(db_part, rstd))
        strides = (dy.stride(0), _stride0(dh), x.stride(0), _stride0(residual), dx.stride(0),
                   dres.stride(0) if separate_dres else 0)  # fmt: skip
        flags = dict(IS_RMS=is_rms, HAS_RES=residual is not None, HAS_W=weight is not None, HAS_B=has_bias,
                     HAS_DH=dh is not None, STORE_DRES=separate_dres)  # fmt: skip
        streamed = _bytes_per_element(dy, dh, x, residual)  # loaded per element, each row
        if isinstance(plan, BwdRowsPlan):
            _rows_bwd(tensors, outputs, strides, flags, n_rows, n_cols, n_parts, offset, streamed, plan)
        else:
            _wide_bwd(tensors, outputs, strides, flags, n_rows, n_cols, n_parts, offset, row_terms, streamed, plan)
    if one_program:
        return dx, dres, dw_part, db_part
    return dx, dres, *_sum_partials(dw_part, db_part, w_dtype, n_cols, device)


def norm_bwd_fake(dy, dh, x, weight, residual, mean, rstd, offset, is_rms, has_bias):
    n_rows, n_cols = x.shape
    w_dtype = weight.dtype if weight is not None else x.dtype
    separate_dres = residual is not None and not shares_dres(x, residual)
    return (
        x.new_empty((n_rows, n_cols)),
        x.new_empty((n_rows, n_cols), dtype=residual.dtype) if separate_dres else x.new_empty((0,)),
        x.new_empty((n_cols,) if weight is not None else (0,), dtype=w_dtype),
        x.new_empty((n_cols,) if has_bias else (0,), dtype=w_dtype),
    )


def _row_terms_size(plan: NormBwdPlan, n_rows: int, n_cols: int, is_rms: bool) -> int:
    """fp32 elements of workspace for the row terms (c_xhat, and c_one for LayerNorm): none over whole rows; a part
    per row and column block and a counter per row (shared); the terms per row (given)."""
    terms = 1 if is_rms else 2
    if isinstance(plan, BwdSharedPlan):
        return terms * n_rows * cdiv(n_cols, plan.block_n) + n_rows
    return terms * n_rows if isinstance(plan, BwdGivenPlan) else 0


def _rows_bwd(tensors, outputs, strides, flags, n_rows, n_cols, n_parts, offset, streamed, plan: BwdRowsPlan):
    """Whole rows: _norm_bwd_kernel over n_parts row groups."""
    block_n = next_power_of_2(n_cols)
    _norm_bwd_kernel[(n_parts,)](
        *tensors, *outputs, n_rows, n_cols, cdiv(n_rows, n_parts), *strides, offset, **flags, ROWS=plan.rows,
        BLOCK_N=block_n, LOOP_STAGES=pipeline_depth(plan.stages, plan.rows * block_n * streamed, tensors[0].device),
        LOW_REGISTERS=saves_registers(plan.rows, block_n, plan.warps), INTERLEAVED=plan.interleaved,
        num_warps=plan.warps,
    )  # fmt: skip


def _wide_bwd(tensors, outputs, strides, flags, n_rows, n_cols, n_groups, offset, row_terms, streamed, plan):
    """_norm_bwd_columns_kernel by column blocks. Shared (one launch): each block sums its part of every row's terms
    and waits for the row's other blocks; three passes over the rows' data. Given (two phases): each row's terms
    c_xhat, c_one first (reads x and dy), then the column blocks with those terms (reads x and dy again), five
    passes. ``row_terms``: the caller's workspace (_row_terms_size)."""
    dy, _, x, residual, weight, mean, rstd = tensors
    n_blocks = cdiv(n_cols, plan.block_n)
    grid = (n_blocks, n_groups)
    stages = plan.stages if isinstance(plan, BwdGivenPlan) else 1
    tile = dict(ROWS=plan.rows, BLOCK_N=plan.block_n, num_warps=plan.warps,
                LOW_REGISTERS=saves_registers(plan.rows, plan.block_n, plan.warps),
                LOOP_STAGES=pipeline_depth(stages, plan.rows * plan.block_n * streamed, x.device))  # fmt: skip
    if isinstance(plan, BwdSharedPlan):
        n_parts = n_rows * n_blocks
        c_xhat = row_terms[:n_parts]
        c_one = c_xhat if flags["IS_RMS"] else row_terms[n_parts : 2 * n_parts]
        counters = row_counters(row_terms, n_rows)
    else:
        c_xhat = row_terms[:n_rows]
        c_one = c_xhat if flags["IS_RMS"] else row_terms[n_rows : 2 * n_rows]
        counters = rstd  # never read without SHARED
        dy_stride, _, x_stride, res_stride, _, _ = strides
        _norm_bwd_row_sums_kernel[(n_rows,)](
            dy, x, residual, weight, mean, rstd, c_xhat, c_one, n_cols, dy_stride, x_stride, res_stride, offset,
            IS_RMS=flags["IS_RMS"], HAS_RES=flags["HAS_RES"], HAS_W=flags["HAS_W"], BLOCK_N=ROW_SUMS_CHUNK,
            LOOP_STAGES=pipeline_depth(ROW_SUMS_STAGES, ROW_SUMS_CHUNK * streamed, x.device),
            num_warps=ROW_SUMS_WARPS,
        )  # fmt: skip
    _norm_bwd_columns_kernel[grid](
        *tensors, c_xhat, c_one, counters, *outputs, n_rows, n_cols, cdiv(n_rows, n_groups), *strides, offset,
        **flags, BLOCKS_P2=next_power_of_2(n_blocks), SHARED=isinstance(plan, BwdSharedPlan),
        AHEAD=isinstance(plan, BwdSharedPlan) and plan.ahead, **tile,
    )  # fmt: skip


def _sum_partials(dw_part, db_part, dtype, n_cols, device):
    """Column sums of the backward's fp32 workspaces (n_parts, N), cast to ``dtype``; empty where the workspace is
    None."""
    dw = torch.empty((n_cols if dw_part is not None else 0,), dtype=dtype, device=device)
    db = torch.empty((n_cols if db_part is not None else 0,), dtype=dtype, device=device)
    parts = [t for t in (dw_part, db_part) if t is not None]
    if parts and n_cols > 0:
        n_parts = parts[0].shape[0]
        block_p, block_n = partial_sum_block(n_parts, n_cols, sm_count(device))
        _sum_partials_kernel[(cdiv(n_cols, block_n),)](
            _or(dw_part, db_part), _or(db_part, dw_part), dw if dw_part is not None else db,
            db if db_part is not None else dw, n_parts, n_cols, HAS_W=dw_part is not None, HAS_B=db_part is not None,
            BLOCK_P=block_p, BLOCK_N=block_n, num_warps=PARTIAL_SUM_WARPS,
        )  # fmt: skip
    return dw, db
