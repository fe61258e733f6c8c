"""Norm launchers: validate the public arguments, allocate, launch (tensors in, tensors out; ``plan=`` optional).

x and residual arrive as (rows, N) matrices with unit column stride (tritonkit._core.layout.as_rows). Absent outputs
are empty tensors (the custom ops cannot return None).
"""

from __future__ import annotations

import math

import torch

from tritonkit._core.checks import FLOAT_DTYPES, check_device, check_tensor
from tritonkit._core.device import arch, pipeline_depth, sm_count
from tritonkit._core.dropout import SEED_LIMIT, keep_scale, keep_threshold
from tritonkit._core.ints import cdiv, next_power_of_2
from tritonkit._core.partial_sums import sum_partials
from tritonkit._core.row_sync import launch_split_rows, row_counters, waits_safely
from tritonkit.ops.norm.kernels import (
    _norm_bwd_columns_kernel,
    _norm_bwd_kernel,
    _norm_bwd_options_kernel,
    _norm_bwd_row_sums_kernel,
    _norm_fwd_kernel,
    _norm_fwd_split_row_kernel,
    _rms_norm_fwd_looped_kernel,
)
from tritonkit.ops.norm.plan import (
    MANY_ROWS,
    MAX_SINGLE_PASS,
    ONE_PROGRAM_BACKWARD,
    ROW_SUMS_CHUNK,
    ROW_SUMS_STAGES,
    ROW_SUMS_WARPS,
    BwdGivenPlan,
    BwdRowsPlan,
    BwdSharedPlan,
    FwdLoopedPlan,
    FwdRowsPlan,
    FwdSplitRowPlan,
    NormBwdPlan,
    NormFwdPlan,
    given_plan,
    loads_weight_first,
    norm_bwd_plan,
    norm_fwd_plan,
    options_bwd_plan,
    options_fwd_plan,
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


def check_norm_options(name, x, x1, weight1, bias1, rowscale, dropout_p, dropout_seed, return_dropout_mask) -> None:
    """The checks of the options flash-attention's layer_norm_fn has (x1, weight1, bias1, rowscale, dropout_p) and of
    the seed; x, weight, bias and residual passed check_norm_args first."""
    n_cols = x.shape[-1]
    if x1 is not None:
        check_tensor("x1", x1, dtypes=FLOAT_DTYPES)
        if x1.shape != x.shape:
            raise ValueError(f"{name}: x1 must have x's shape {tuple(x.shape)}, got {tuple(x1.shape)}")
    for arg_name, value in (("weight1", weight1), ("bias1", bias1)):
        if value is not None:
            check_tensor(arg_name, value, dtypes=FLOAT_DTYPES)
            if value.shape != (n_cols,):
                raise ValueError(f"{name}: {arg_name} must have shape ({n_cols},) to match x's last dimension, "
                                 f"got {tuple(value.shape)}")  # fmt: skip
    if bias1 is not None and weight1 is None:
        raise ValueError(f"{name}: bias1 is the bias of the second output y1, which weight1 makes, but weight1 is None")
    if rowscale is not None:
        check_tensor("rowscale", rowscale, dtypes=FLOAT_DTYPES)
        if rowscale.shape != x.shape[:-1]:
            raise ValueError(f"{name}: rowscale must have x's leading shape {tuple(x.shape[:-1])} (one scale a row), "
                             f"got {tuple(rowscale.shape)}")  # fmt: skip
        if x1 is not None:
            raise ValueError(f"{name}: rowscale scales x alone, so it cannot be combined with x1 (as in "
                             "flash-attention's layer_norm_fn); pass one of them")  # fmt: skip
        if torch.is_grad_enabled() and rowscale.requires_grad:
            raise ValueError(f"{name}: rowscale requires grad, but the norms give it no gradient (neither does "
                             "flash-attention's layer_norm_fn); pass rowscale.detach()")  # fmt: skip
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)) or not 0 <= dropout_p < 1:
        raise ValueError(f"{name}: dropout_p must be a probability in [0, 1), got {dropout_p!r}")
    if dropout_seed is not None and (
        isinstance(dropout_seed, bool) or not isinstance(dropout_seed, int) or not 0 <= dropout_seed < SEED_LIMIT
    ):
        raise ValueError(f"{name}: dropout_seed must be None or an int in [0, 2**63), got {dropout_seed!r}")
    if not isinstance(return_dropout_mask, bool):
        raise TypeError(f"{name}: return_dropout_mask must be a bool, got {type(return_dropout_mask).__name__}")
    if n_cols > MAX_SINGLE_PASS:
        raise ValueError(f"{name}: x1, weight1, dropout_p and rowscale take rows of at most {MAX_SINGLE_PASS} "
                         f"elements (whole rows in one program), got x's last dimension {n_cols}")  # fmt: skip
    tensors = {"x": x, "x1": x1, "weight1": weight1, "bias1": bias1, "rowscale": rowscale}
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
    return dx, dres, *sum_partials(dw_part, db_part, w_dtype, n_cols, device)


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


# ----------------------------------------------------------------------------------------------------------------
# The options: dropout, rowscale, x1 and the parallel output (whole rows only)
# ----------------------------------------------------------------------------------------------------------------
def _dropout_args(dropout_p: float) -> dict:
    """The kernels' dropout arguments; none (constexpr None in the kernel) without dropout."""
    if dropout_p == 0:
        return {"threshold": None, "keep_scale": None}
    return {"threshold": keep_threshold(dropout_p), "keep_scale": keep_scale(dropout_p)}


def norm_options_fwd(
    x: torch.Tensor,
    x1: torch.Tensor | None,
    weight: torch.Tensor | None,
    weight1: torch.Tensor | None,
    bias: torch.Tensor | None,
    bias1: torch.Tensor | None,
    residual: torch.Tensor | None,
    rowscale: torch.Tensor | None,
    seed: torch.Tensor | None,
    eps: float,
    offset: float,
    dropout_p: float,
    is_rms: bool,
    store_h: bool,
    h_fp32: bool,
    store_keep: bool,
    *,
    store_stats: bool = True,
    plan: FwdRowsPlan | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The forward with options: h = dropout(rowscale * x) + dropout(x1) + residual, y from h and the parallel y1 =
    normalize(h) * (offset + weight1) + bias1. rowscale (rows,); seed: the (1,) int64 dropout seed (None without
    dropout). Returns y, y1 (empty without weight1), h (empty unless store_h), mean (empty for RMSNorm), rstd and
    the keep masks of x and x1 as (1 or 2, rows, N) bools (empty unless store_keep)."""
    n_rows, n_cols = x.shape
    y = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
    h = torch.empty((n_rows, n_cols) if store_h else (0,), dtype=_h_dtype(x, residual, h_fp32), device=x.device)
    mean = torch.empty((n_rows if store_stats and not is_rms else 0,), dtype=torch.float32, device=x.device)
    rstd = torch.empty((n_rows if store_stats else 0,), dtype=torch.float32, device=x.device)
    y1 = torch.empty((n_rows, n_cols) if weight1 is not None else (0,), dtype=x.dtype, device=x.device)
    streams = 2 if x1 is not None else 1
    keep = torch.empty((streams, n_rows, n_cols) if store_keep else (0,), dtype=torch.bool, device=x.device)
    if n_rows == 0:
        return y, y1, h, mean, rstd, keep
    plan = plan or options_fwd_plan(n_cols, x.element_size(), is_rms, arch(x.device))
    block_n = next_power_of_2(n_cols)
    p_rstd = _present(rstd, y)  # no statistics stored: y stands in (never written)
    _norm_fwd_kernel[(cdiv(n_rows, plan.rows),)](
        x, _or(residual, x), _or(weight, x), _or(bias, x), y, h if store_h else y, _present(mean, p_rstd), p_rstd,
        n_rows, n_cols, x.stride(0), _stride0(residual), y.stride(0), h.stride(0) if store_h else 0, eps, offset,
        IS_RMS=is_rms, HAS_RES=residual is not None, HAS_W=weight is not None, HAS_B=bias is not None,
        STORE_H=store_h, ROWS=plan.rows, BLOCK_N=block_n, WEIGHT_FIRST=loads_weight_first(plan.rows, block_n,
        plan.warps), STORE_STATS=store_stats, p_x1=x1, p_rowscale=rowscale, p_seed=seed,
        p_keep=keep if store_keep else None, p_w1=weight1, p_b1=bias1, p_y1=y1 if weight1 is not None else None,
        stride_x1_row=x1.stride(0) if x1 is not None else None, stride_y1_row=y1.stride(0) if weight1 is not None
        else None, **_dropout_args(dropout_p), HAS_X1=x1 is not None, HAS_ROWSCALE=rowscale is not None,
        HAS_DROPOUT=dropout_p > 0, STORE_KEEP=store_keep, HAS_W1=weight1 is not None, HAS_B1=bias1 is not None,
        num_warps=plan.warps,
    )  # fmt: skip
    return y, y1, h, mean, rstd, keep


def norm_options_fwd_fake(x, x1, weight, weight1, bias, bias1, residual, rowscale, seed, eps, offset, dropout_p, is_rms,
                          store_h, h_fp32, store_keep):  # fmt: skip
    y, h, mean, rstd = norm_fwd_fake(x, weight, bias, residual, eps, offset, is_rms, store_h, h_fp32)
    n_rows, n_cols = x.shape
    streams = 2 if x1 is not None else 1
    return (
        y,
        x.new_empty((n_rows, n_cols) if weight1 is not None else (0,)),
        h,
        mean,
        rstd,
        x.new_empty((streams, n_rows, n_cols) if store_keep else (0,), dtype=torch.bool),
    )


def _scales_dx(dropout_p: float, rowscale: torch.Tensor | None) -> bool:
    """Whether dx differs from dh (the gradient of h): dropout or rowscale scale it."""
    return dropout_p > 0 or rowscale is not None


def separate_grad(t: torch.Tensor | None, x: torch.Tensor, dropout_p: float, rowscale: torch.Tensor | None) -> bool:
    """Whether the gradient of ``t`` (the residual, or x1 without its own dropout) needs a tensor of its own, or dx
    serves: it is dh, as dx is without dropout and rowscale, and shares x's dtype."""
    return t is not None and (_scales_dx(dropout_p, rowscale) or t.dtype != x.dtype)


def norm_options_bwd(
    dy: torch.Tensor,
    dy1: torch.Tensor | None,
    dh: torch.Tensor | None,
    x: torch.Tensor,
    x1: torch.Tensor | None,
    weight: torch.Tensor | None,
    weight1: torch.Tensor | None,
    residual: torch.Tensor | None,
    rowscale: torch.Tensor | None,
    seed: torch.Tensor | None,
    mean: torch.Tensor | None,
    rstd: torch.Tensor,
    offset: float,
    dropout_p: float,
    is_rms: bool,
    has_bias: bool,
    has_bias1: bool,
    *,
    plan: BwdRowsPlan | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The options' backward (_norm_bwd_options_kernel). Returns dx, dx1, dresidual (each of the last two empty when
    absent or when dx serves: separate_grad), dweight, dbias, dweight1 and dbias1 (empty when absent)."""
    n_rows, n_cols = x.shape
    device = x.device
    dx = torch.empty((n_rows, n_cols), dtype=x.dtype, device=device)
    store_dx1, store_dres = (separate_grad(t, x, dropout_p, rowscale) for t in (x1, residual))
    dx1 = torch.empty((n_rows, n_cols) if store_dx1 else (0,), dtype=_or(x1, x).dtype, device=device)
    dres = torch.empty((n_rows, n_cols) if store_dres else (0,), dtype=_or(residual, x).dtype, device=device)
    one_program = plan is None and 0 < n_rows * n_cols <= ONE_PROGRAM_BACKWARD  # as norm_bwd's
    plan = plan or options_bwd_plan(n_cols, x.element_size(), is_rms, has_bias, n_rows >= MANY_ROWS, arch(device))
    n_parts = 1 if one_program else max(1, min(cdiv(n_rows, plan.rows), plan.programs_per_sm * sm_count(device)))
    w_dtype, w1_dtype = _or(weight, x).dtype, _or(weight1, x).dtype
    sums = ((weight is not None, w_dtype), (has_bias, w_dtype), (weight1 is not None, w1_dtype), (has_bias1, w1_dtype))
    if one_program:  # one program writes the gradients themselves, in their dtypes
        parts = [torch.empty((n_cols,), dtype=dtype, device=device) if present else None for present, dtype in sums]
    else:  # each row group's fp32 share, summed in a fixed order below (no rows: zeros, so zero gradients)
        n_sums = sum(present for present, _ in sums)
        allocate = torch.empty if n_rows > 0 else torch.zeros
        workspace = allocate((n_sums, n_parts, n_cols), dtype=torch.float32, device=device)
        rows = iter(workspace)
        parts = [next(rows) if present else None for present, _ in sums]
    if n_rows > 0:
        streamed = _bytes_per_element(dy, dy1, dh, x, x1, residual)  # loaded per element, each row
        block_n = next_power_of_2(n_cols)
        _norm_bwd_options_kernel[(n_parts,)](
            dy, dy1, dh, x, x1, residual, rowscale, seed, weight, weight1, mean, rstd, dx, dx1 if store_dx1 else None,
            dres if store_dres else None, *parts, n_rows, n_cols, cdiv(n_rows, n_parts), dy.stride(0),
            _stride0(dy1), _stride0(dh), x.stride(0), _stride0(x1), _stride0(residual), dx.stride(0),
            dx1.stride(0) if store_dx1 else 0, dres.stride(0) if store_dres else 0, offset,
            *_dropout_args(dropout_p).values(), IS_RMS=is_rms, HAS_RES=residual is not None, HAS_X1=x1 is not None,
            HAS_ROWSCALE=rowscale is not None, HAS_DROPOUT=dropout_p > 0, HAS_W=weight is not None, HAS_B=has_bias,
            HAS_W1=weight1 is not None, HAS_B1=has_bias1, HAS_DH=dh is not None, STORE_DX1=store_dx1,
            STORE_DRES=store_dres, ROWS=plan.rows, BLOCK_N=block_n,
            LOOP_STAGES=pipeline_depth(plan.stages, plan.rows * block_n * streamed, device),
            INTERLEAVED=plan.interleaved, num_warps=plan.warps,
        )  # fmt: skip
    if one_program:
        grads = [t if t is not None else torch.empty((0,), dtype=dtype, device=device)
                 for t, (_, dtype) in zip(parts, sums, strict=True)]  # fmt: skip
    else:
        grads = [*sum_partials(parts[0], parts[1], w_dtype, n_cols, device),
                 *sum_partials(parts[2], parts[3], w1_dtype, n_cols, device)]  # fmt: skip
    return dx, dx1, dres, *grads


def norm_options_bwd_fake(dy, dy1, dh, x, x1, weight, weight1, residual, rowscale, seed, mean, rstd, offset,
                          dropout_p, is_rms, has_bias, has_bias1):  # fmt: skip
    n_rows, n_cols = x.shape
    w_dtype, w1_dtype = _or(weight, x).dtype, _or(weight1, x).dtype

    def grad(present, dtype, shape):
        return x.new_empty(shape if present else (0,), dtype=dtype)

    full = (n_rows, n_cols)
    return (
        grad(True, x.dtype, full),
        grad(separate_grad(x1, x, dropout_p, rowscale), _or(x1, x).dtype, full),
        grad(separate_grad(residual, x, dropout_p, rowscale), _or(residual, x).dtype, full),
        grad(weight is not None, w_dtype, (n_cols,)),
        grad(has_bias, w_dtype, (n_cols,)),
        grad(weight1 is not None, w1_dtype, (n_cols,)),
        grad(has_bias1, w1_dtype, (n_cols,)),
    )
