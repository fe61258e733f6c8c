"""Sweep the softmax kernels' launch configurations on a GPU, timed on the launchers alone with each
configuration as their plan. The data behind ``softmax_launch_plan``.

`PYTHONPATH=src python3 benchmarks/softmax_configs.py [WIDTH ...] [--fwd-only] [--bwd-only] [--float32]
[--single-pass | --grid-loop] [--compile-only I/K]`. By default rows wider than one pass holds (65536, 131072,
262144 over 2**29 elements): the split-row kernels' slice and warps. ``--single-pass``: rows per program and
warps of the whole-row kernels, 16384 rows; ``--grid-loop``: those kernels with a grid of a few programs
per SM looping over row blocks, pipelined, against the plan now; ``--compile-only``: norm_configs.compile_only.
log_softmax shares softmax's plans: its passes move the same bytes.
"""

import importlib
import itertools
import sys

import torch
from norm_configs import compile_only, median_ms  # the sibling sweep's timing (1 ms graph replays, inf if too big)

softmax = importlib.import_module("tritonkit.ops.softmax")
ELEMENTS = 16384 * 32768


def sweep_tensors(n_rows, n, dtype):
    """x, an upstream gradient dy, x's fp32 log-sum-exp, and an output for kernels launched directly."""
    x = torch.randn(n_rows, n, device="cuda", dtype=dtype)
    return x, torch.randn_like(x), torch.logsumexp(x.float(), dim=-1), torch.empty_like(x)


def kernel_ms(backward, x, dy, lse, log, plan):
    """The forward or backward launcher with ``plan`` (its outputs allocated as in use)."""
    if backward:
        return median_ms(lambda: softmax.softmax_bwd_launch(dy, x, lse, log, plan))
    return median_ms(lambda: softmax.softmax_fwd_launch(x, log, plan))


def print_single_pass(widths, dtype):
    """The single-pass plan's choices (rows per program, warps) for rows that fit registers, 16384 rows."""
    print("dir  log    dtype     n       (rows, warps)  ms      GB/s  (the plan now)")
    for backward, n in itertools.product((False, True), widths):
        x, dy, lse, _ = sweep_tensors(16384, n, dtype)
        times = {}
        for rows, warps in itertools.product((1, 2, 4, 8, 16), (2, 4, 8, 16)):
            if rows * n <= 16384 and 64 * warps <= rows * n:
                plan = softmax.SoftmaxPlan(False, n, rows, warps, 1, 0)
                times[(rows, warps)] = kernel_ms(backward, x, dy, lse, False, plan)
        best = min(times, key=times.get)
        gbps = (3 if backward else 2) * x.numel() * x.element_size() / times[best] / 1e6
        now = kernel_ms(backward, x, dy, lse, False, softmax.softmax_launch_plan(n, backward, x.element_size()))
        print(f"{'bwd' if backward else 'fwd'}  False  {str(dtype)[6:]:<9} {n:<7} {best!s:<14} {times[best]:.4f}  "
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
                plan = softmax.SoftmaxPlan(False, n, 1, warps, stages, per_sm)
                times[(warps, per_sm, stages)] = kernel_ms(backward, x, dy, lse, False, plan)
        best = min(times, key=times.get)
        gbps = (3 if backward else 2) * x.numel() * x.element_size() / times[best] / 1e6
        plan = softmax.softmax_launch_plan(n, backward, x.element_size())
        now = kernel_ms(backward, x, dy, lse, False, plan)
        now_config = (plan.rows, plan.warps, plan.stages, plan.programs_per_sm)
        print(f"{'bwd' if backward else 'fwd'}  False  {str(dtype)[6:]:<9} {n:<7} {best!s:<24} {times[best]:.4f}  "
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
                plan = softmax.SoftmaxPlan(True, block, 1, warps, 1, 0)
                times[(block, warps)] = kernel_ms(backward, x, dy, lse, False, plan)
        best = min(times, key=times.get)
        gbps = (3 if backward else 2) * x.numel() * x.element_size() / times[best] / 1e6
        plan = softmax.softmax_launch_plan(n, backward, x.element_size())
        now = kernel_ms(backward, x, dy, lse, False, plan)
        print(f"{'bwd' if backward else 'fwd'}  {str(dtype)[6:]:<9} {n:<7} {best!s:<15} {times[best]:.4f}  "
              f"{gbps:6.0f}  (now {(plan.block_n, plan.warps)} {now:.4f})", flush=True)  # fmt: skip
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
