"""Gated RMSNorm launchers: validate the public arguments, allocate, launch (tensors in, tensors out; ``plan=``).

x and z arrive as (rows, N) matrices with unit column stride (tritonkit._core.layout.as_rows); the statistics are one
fp32 rstd per row and group. Absent outputs are empty tensors (the custom ops cannot return None).
"""

from __future__ import annotations

import math

import torch

from tritonkit._core.checks import FLOAT_DTYPES, check_device, check_tensor
from tritonkit._core.device import arch, sm_count
from tritonkit._core.ints import cdiv, next_power_of_2
from tritonkit._core.partial_sums import sum_partials
from tritonkit.ops.gated_norm.kernels import _rms_norm_gated_bwd_kernel, _rms_norm_gated_fwd_kernel
from tritonkit.ops.gated_norm.plan import (
    MAX_GROUP,
    ONE_PROGRAM_BACKWARD,
    GatedBwdPlan,
    GatedFwdPlan,
    gated_bwd_plan,
    gated_fwd_plan,
)

NAME = "rms_norm_gated"


def check_rms_norm_gated_args(x, weight, z, group_size, norm_before_gate, eps) -> int:
    """The public function's checks (every error names the argument, what was expected and what came); returns the
    group size (the whole last dimension for None)."""
    check_tensor("x", x, dtypes=FLOAT_DTYPES)
    if x.dim() == 0 or x.shape[-1] == 0:
        raise ValueError(f"{NAME}: x must be (..., N) with N >= 1, got shape {tuple(x.shape)}")
    n_cols = x.shape[-1]
    check_tensor("weight", weight, dtypes=FLOAT_DTYPES)
    if weight.shape != (n_cols,):
        raise ValueError(f"{NAME}: weight must have shape ({n_cols},) to match x's last dimension, "
                         f"got {tuple(weight.shape)}")  # fmt: skip
    if z is not None:
        check_tensor("z", z, dtypes=FLOAT_DTYPES)
        if z.shape != x.shape:
            raise ValueError(f"{NAME}: z must have x's shape {tuple(x.shape)}, got {tuple(z.shape)}")
    if group_size is None:
        group_size = n_cols
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size <= 0 or n_cols % group_size:
        raise ValueError(f"{NAME}: group_size must be None or a positive int dividing x's last dimension {n_cols}, "
                         f"got {group_size!r}")  # fmt: skip
    if group_size > MAX_GROUP:
        raise ValueError(f"{NAME}: group_size (x's last dimension when None) may be at most {MAX_GROUP} (a group in "
                         f"one program's registers), got {group_size}")  # fmt: skip
    if not isinstance(norm_before_gate, bool):
        raise TypeError(f"{NAME}: norm_before_gate must be a bool, got {type(norm_before_gate).__name__}")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps <= 0:
        raise ValueError(f"{NAME}: eps must be a positive number, got {eps!r}")
    check_device(x=x, weight=weight, **({"z": z} if z is not None else {}))
    return group_size


def rms_norm_gated_fwd(
    x: torch.Tensor,
    weight: torch.Tensor,
    z: torch.Tensor | None,
    group_size: int,
    norm_before_gate: bool,
    eps: float,
    *,
    store_stats: bool = True,
    plan: GatedFwdPlan | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """x, z: (rows, N); weight: (N,). Returns y (x's dtype) and rstd, fp32 (rows, N / group_size) (empty without
    ``store_stats``: a forward no backward follows)."""
    n_rows, n_cols = x.shape
    n_groups = n_cols // group_size
    y = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
    rstd = torch.empty((n_rows, n_groups) if store_stats else (0,), dtype=torch.float32, device=x.device)
    if n_rows == 0:
        return y, rstd
    plan = plan or gated_fwd_plan(group_size, arch(x.device))
    _rms_norm_gated_fwd_kernel[(cdiv(n_rows, plan.rows), n_groups)](
        x, z if z is not None else x, weight, y, rstd if store_stats else y, n_rows, group_size, n_groups,
        x.stride(0), z.stride(0) if z is not None else 0, y.stride(0), eps, HAS_Z=z is not None,
        GATE_FIRST=not norm_before_gate, STORE_STATS=store_stats, ROWS=plan.rows,
        BLOCK_N=next_power_of_2(group_size), num_warps=plan.warps,
    )  # fmt: skip
    return y, rstd


def rms_norm_gated_fwd_fake(x, weight, z, group_size, norm_before_gate, eps):
    n_rows, n_cols = x.shape
    return x.new_empty((n_rows, n_cols)), x.new_empty((n_rows, n_cols // group_size), dtype=torch.float32)


def rms_norm_gated_bwd(
    dy: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    z: torch.Tensor | None,
    rstd: torch.Tensor,
    group_size: int,
    norm_before_gate: bool,
    *,
    plan: GatedBwdPlan | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns dx, dz (empty without z) and dweight (weight's dtype, summed in fp32 in a fixed order). ``plan``: the
    plan for the group size, or one row group that writes dweight itself for a few elements, unless given."""
    n_rows, n_cols = x.shape
    n_groups = n_cols // group_size
    device = x.device
    dx = torch.empty((n_rows, n_cols), dtype=x.dtype, device=device)
    dz = torch.empty((n_rows, n_cols) if z is not None else (0,), dtype=z.dtype if z is not None else x.dtype,
                     device=device)  # fmt: skip
    one_program = plan is None and 0 < n_rows * n_cols <= ONE_PROGRAM_BACKWARD
    plan = plan or gated_bwd_plan(group_size, arch(device))
    if one_program:  # one row group sums dweight over every row and stores it in the weight's dtype itself
        n_parts, dw_part = 1, torch.empty((n_cols,), dtype=weight.dtype, device=device)
    else:  # each row group's fp32 share, summed in a fixed order below (no rows: zeros, so a zero dweight)
        n_parts = max(1, min(cdiv(n_rows, plan.rows), plan.programs_per_sm * sm_count(device) // n_groups))
        dw_part = (torch.empty if n_rows > 0 else torch.zeros)((n_parts, n_cols), dtype=torch.float32, device=device)
    if n_rows > 0:
        _rms_norm_gated_bwd_kernel[(n_parts, n_groups)](
            dy, x, z if z is not None else x, weight, rstd, dx, dz if z is not None else dx, dw_part, n_rows, n_cols,
            group_size, n_groups, cdiv(n_rows, n_parts), dy.stride(0), x.stride(0), z.stride(0) if z is not None else 0,
            dx.stride(0), dz.stride(0) if z is not None else 0, HAS_Z=z is not None, GATE_FIRST=not norm_before_gate,
            ROWS=plan.rows, BLOCK_N=next_power_of_2(group_size), num_warps=plan.warps,
        )  # fmt: skip
    dw = dw_part if one_program else sum_partials(dw_part, None, weight.dtype, n_cols, device)[0]
    return dx, dz, dw


def rms_norm_gated_bwd_fake(dy, x, weight, z, rstd, group_size, norm_before_gate):
    return (
        x.new_empty(x.shape),
        x.new_empty(x.shape, dtype=z.dtype) if z is not None else x.new_empty((0,)),
        weight.new_empty(weight.shape),
    )
