"""Sweep the softmax kernels' launch plans on a GPU, timed on the launchers alone with each configuration passed as
their ``plan=``. The data behind the sm90 tables of ``tritonkit/ops/row_softmax/plan.py`` (softmax_plan); what each
sweep found is in docs/kernels/softmax.md.

    PYTHONPATH=src python3 benchmarks/softmax_configs.py [WIDTH ...] [--fwd-only] [--bwd-only] [--float32]
        [--single-pass | --grid-loop] [--log] [--compile-only I/K]

By default rows wider than one pass holds (65536, 131072, 262144 over 2**29 elements): the split-row kernels'
SplitRowPlan (slice, warps). ``--single-pass``: WholeRowPlan's rows per program and warps, 16384 rows;
``--grid-loop``: WholeRowPlan with a grid of a few programs per SM looping over row blocks, pipelined (warps,
programs per SM, stages), against the plan now; ``--compile-only``: norm_configs.compile_only. log_softmax shares
softmax's plans: its passes move the same bytes; ``--log`` times log_softmax's kernels (whose backward holds other
values in registers) instead of softmax's.
"""

import dataclasses
import itertools
import sys

import torch
from norm_configs import compile_only, median_ms  # the sibling sweep's timing (1 ms graph replays, inf if too big)

from tritonkit._core.device import arch
from tritonkit.ops.row_softmax.launch import softmax_bwd, softmax_fwd
from tritonkit.ops.row_softmax.plan import SplitRowPlan, WholeRowPlan, softmax_plan

DEVICE = torch.device("cuda")  # where the sweeps' tensors are made
ELEMENTS = 16384 * 32768
LOG = "--log" in sys.argv  # log_softmax's kernels in place of softmax's


def sweep_tensors(n_rows, n, dtype):
    """x, an upstream gradient dy, x's fp32 log-sum-exp, and an output for kernels launched directly."""
    x = torch.randn(n_rows, n, device=DEVICE, dtype=dtype)
    return x, torch.randn_like(x), torch.logsumexp(x.float(), dim=-1), torch.empty_like(x)


def plan_now(n, backward, x):
    """The plan the launcher takes for rows of ``n`` elements of x's dtype on x's device."""
    return softmax_plan(n, backward, x.element_size(), arch(x.device))


def kernel_ms(backward, x, dy, lse, log, plan):
    """The forward or backward launcher with ``plan`` (its outputs allocated as in use)."""
    if backward:
        return median_ms(lambda: softmax_bwd(dy, x, lse, log, plan=plan))
    return median_ms(lambda: softmax_fwd(x, log, plan=plan))


def print_single_pass(widths, dtype):
    """The single-pass plan's choices (rows per program, warps) for rows that fit registers, 16384 rows."""
    print("dir  log    dtype     n       (rows, warps)  ms      GB/s  (the plan now)")
    for backward, n in itertools.product((False, True), widths):
        x, dy, lse, _ = sweep_tensors(16384, n, dtype)
        times = {}
        for rows, warps in itertools.product((1, 2, 4, 8, 16), (2, 4, 8, 16)):
            if rows * n <= 16384 and 64 * warps <= rows * n:
                plan = WholeRowPlan(rows=rows, warps=warps)
                times[(rows, warps)] = kernel_ms(backward, x, dy, lse, LOG, plan)
        best = min(times, key=times.get)
        gbps = (3 if backward else 2) * x.numel() * x.element_size() / times[best] / 1e6
        now = kernel_ms(backward, x, dy, lse, LOG, plan_now(n, backward, x))
        print(f"{'bwd' if backward else 'fwd'}  {LOG!s:<5}  {str(dtype)[6:]:<9} {n:<7} {best!s:<14} {times[best]:.4f}  "
              f"{gbps:6.0f}  (now {now:.4f})")  # fmt: skip
        for config in sorted(times, key=times.get)[1:4]:
            print(f"        {config!s:<14} {times[config]:.4f}")


def print_grid_loop(widths, dtype, directions):
    """Whole rows (one per block) with a grid of per_sm programs per SM looping over them, the next row's
    loads issued while this one is reduced (stages), against the plan now; 16384 rows."""
    print("dir  log    dtype     n       (warps, per_sm, stages)  ms      GB/s  (the plan now)")
    for backward, n in itertools.product(directions, widths):
        x, dy, lse, _ = sweep_tensors(16384, n, dtype)
        times = {}
        for warps, per_sm, stages in itertools.product((4, 8, 16, 32), (1, 2, 4), (2, 3)):
            if 64 * warps <= n and (warps >= 16 or n <= 8192):
                plan = WholeRowPlan(rows=1, warps=warps, programs_per_sm=per_sm, stages=stages)
                times[(warps, per_sm, stages)] = kernel_ms(backward, x, dy, lse, LOG, plan)
        best = min(times, key=times.get)
        gbps = (3 if backward else 2) * x.numel() * x.element_size() / times[best] / 1e6
        plan = plan_now(n, backward, x)
        now = kernel_ms(backward, x, dy, lse, LOG, plan)
        now_config = (plan.rows, plan.warps, plan.stages, plan.programs_per_sm)
        print(f"{'bwd' if backward else 'fwd'}  {LOG!s:<5}  {str(dtype)[6:]:<9} {n:<7} {best!s:<24} {times[best]:.4f}  "
              f"{gbps:6.0f}  ({now_config} {now:.4f})", flush=True)  # fmt: skip
        for config in sorted(times, key=times.get)[1:4]:
            print(f"        {config!s:<24} {times[config]:.4f}", flush=True)


def print_split_row(widths, dtype, directions):
    """Rows wider than one pass holds: the split-row kernels' (slice, warps), the counters' zeroing included."""
    print("dir  dtype     n       (slice, warps)  ms      GB/s  (the plan now)")
    for backward, n in itertools.product(directions, widths):
        x, dy, lse, _ = sweep_tensors(ELEMENTS // n, n, dtype)
        times = {}
        for block, warps in itertools.product((4096, 8192, 16384, 32768), (4, 8, 16, 32)):
            if 16 <= block // (32 * warps) <= 64:
                plan = SplitRowPlan(slice=block, warps=warps)
                times[(block, warps)] = kernel_ms(backward, x, dy, lse, LOG, plan)
        best = min(times, key=times.get)
        gbps = (3 if backward else 2) * x.numel() * x.element_size() / times[best] / 1e6
        plan = plan_now(n, backward, x)
        now = kernel_ms(backward, x, dy, lse, LOG, plan)
        print(f"{'bwd' if backward else 'fwd'}  {str(dtype)[6:]:<9} {n:<7} {best!s:<15} {times[best]:.4f}  "
              f"{gbps:6.0f}  (now {dataclasses.astuple(plan)} {now:.4f})", flush=True)  # fmt: skip
        for config in sorted(times, key=times.get)[1:4]:
            print(f"        {config!s:<15} {times[config]:.4f}")


def main():
    compile_only(sys.argv)
    widths = [int(a) for a in sys.argv[1:] if a.isdigit()] or [65536, 131072, 262144]
    dtype = torch.float32 if "--float32" in sys.argv else torch.bfloat16
    directions = [d for d, flag in ((False, "--bwd-only"), (True, "--fwd-only")) if flag not in sys.argv]
    if "--grid-loop" in sys.argv:
        print_grid_loop([int(a) for a in sys.argv[1:] if a.isdigit()] or [4096, 8192, 16384, 32768], dtype, directions)
        return
    if "--single-pass" in sys.argv:
        print_single_pass([int(a) for a in sys.argv[1:] if a.isdigit()] or [1024, 2048, 4096, 8192], dtype)
        return
    print_split_row(widths, dtype, directions)


if __name__ == "__main__":
    main()
