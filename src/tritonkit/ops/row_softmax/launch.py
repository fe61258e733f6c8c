"""Softmax launchers: validate the public arguments, allocate, launch (tensors in, tensors out; ``plan=`` optional)."""

from __future__ import annotations

import torch

from tritonkit._core.checks import FLOAT_DTYPES, check_device, check_tensor
from tritonkit._core.device import arch, pipeline_depth, sm_count
from tritonkit._core.ints import cdiv, next_power_of_2
from tritonkit._core.row_sync import launch_split_rows
from tritonkit.ops.row_softmax.kernels import (
    _softmax_bwd_kernel,
    _softmax_bwd_split_row_kernel,
    _softmax_fwd_kernel,
    _softmax_fwd_split_row_kernel,
)
from tritonkit.ops.row_softmax.plan import SoftmaxPlan, SplitRowPlan, softmax_plan


def check_softmax_args(name: str, x, dim) -> None:
    """The public functions' checks: a floating tensor on a device Triton runs on, an int dim within x's."""
    check_tensor("x", x, dtypes=FLOAT_DTYPES)
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"{name}: dim must be an int, got {type(dim).__name__}")
    ndim = max(x.dim(), 1)
    if not -ndim <= dim < ndim:
        raise ValueError(f"{name}: dim must be in [{-ndim}, {ndim - 1}] for x of shape {tuple(x.shape)}, got {dim}")
    check_device(x=x)


def _launch(kernel, split_row_kernel, tensors, strides, x, log, backward, plan, **whole_row_constexprs):
    """The whole-row kernel, or for a split-row plan the split-row kernel (both its phases in one launch where the
    row's programs may wait for each other, else one launch per phase). ``whole_row_constexprs``: the whole-row
    kernel's own beyond the plan's."""
    n_rows, n_cols = x.shape
    if isinstance(plan, SplitRowPlan):
        # Two parts a slice either way: the maximum and sum of exp (forward), c's part and sum(p) (backward).
        launch_split_rows(split_row_kernel, tensors, strides, n_rows, n_cols, plan.slice, 2, x.device, plan.warps,
                          LOG=log)  # fmt: skip
        return
    block_n = next_power_of_2(n_cols)
    n_programs = cdiv(n_rows, plan.rows)
    if plan.programs_per_sm:
        n_programs = min(n_programs, plan.programs_per_sm * sm_count(x.device))
    # Bytes one pipelined loop iteration loads: a block of whole rows of x (forward) or dy and x.
    stage_bytes = plan.rows * block_n * (2 if backward else 1) * x.element_size()
    kernel[(n_programs,)](*tensors, n_rows, n_cols, *strides, LOG=log, GRID_LOOP=plan.programs_per_sm > 0,
                          ROWS=plan.rows, BLOCK_N=block_n,
                          LOOP_STAGES=pipeline_depth(plan.stages, stage_bytes, x.device),
                          num_warps=plan.warps, **whole_row_constexprs)  # fmt: skip


def softmax_fwd(x: torch.Tensor, log: bool, *, plan: SoftmaxPlan | None = None,
                store_lse: bool = True) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """x: (rows, N) with unit column stride. Returns y (x's shape and dtype) and the fp32 row log-sum-exp the
    backward needs. Without ``store_lse`` (a forward no backward follows) whole rows skip its one-element store per
    row and return an empty lse; rows split across programs store it regardless (docs/kernels/softmax.md).
    ``plan``: the measured plan for x unless a sweep or a test gives one."""
    n_rows, n_cols = x.shape
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.numel() and plan is None:
        plan = softmax_plan(n_cols, False, x.element_size(), arch(x.device))
    store_lse = store_lse or isinstance(plan, SplitRowPlan)
    lse = torch.empty((n_rows if store_lse else 0,), dtype=torch.float32, device=x.device)
    if x.numel():
        _launch(_softmax_fwd_kernel, _softmax_fwd_split_row_kernel, (x, y, lse if store_lse else y),
                (x.stride(0), y.stride(0)), x, log, False, plan, STORE_LSE=store_lse)  # fmt: skip
    return y, lse


def softmax_fwd_fake(x, log):
    return torch.empty_like(x), x.new_empty((x.shape[0],), dtype=torch.float32)


def softmax_bwd(dy: torch.Tensor, x: torch.Tensor, lse: torch.Tensor, log: bool, *,
                plan: SoftmaxPlan | None = None) -> torch.Tensor:  # fmt: skip
    """dy, x: (rows, N) with unit column stride; lse from the forward; ``plan`` as softmax_fwd's."""
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.numel():
        plan = plan or softmax_plan(x.shape[1], True, x.element_size(), arch(x.device))
        _launch(_softmax_bwd_kernel, _softmax_bwd_split_row_kernel, (dy, x, lse, dx),
                (dy.stride(0), x.stride(0), dx.stride(0)), x, log, True, plan)  # fmt: skip
    return dx


def softmax_bwd_fake(dy, x, lse, log):
    return torch.empty_like(x)
