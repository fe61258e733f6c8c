"""Sweep the looped softmax kernels' launch configurations on a GPU: chunk, warps, the chunk loops'
software-pipeline depth, a grid of a few programs per SM looping over rows (0: one program per row), and
the L2 hints that keep a row cached between its two reads; timed on the kernels alone over 2**29 elements,
through the launcher with each configuration as its plan.

The data behind ``softmax_launch_plan``.
`PYTHONPATH=src python3 benchmarks/softmax_configs.py [WIDTH ...] [--fwd-only] [--bwd-only] [--float32] [--log]
[--single-pass | --grid-loop] [--compile-only I/K]` (``--log``: log_softmax's backward too; the forward's
passes read the same bytes with or without the log. ``--single-pass``: instead, rows per program and warps
of the single-pass kernels, rows that fit registers, 16384 of them; ``--grid-loop``: those kernels with a
grid of a few programs per SM looping over row blocks, pipelined, against the plan now;
``--compile-only``: norm_configs.compile_only).
"""

import importlib
import itertools
import sys

import torch
from norm_configs import compile_only, median_ms  # the sibling sweep's timing (1 ms graph replays, inf if too big)

softmax = importlib.import_module("tritonkit.ops.softmax")
ELEMENTS = 16384 * 32768
CONFIGS = [
    (chunk, warps, stages, per_sm, hints)
    for (chunk, warps), stages, per_sm, hints in itertools.product(
        ((4096, 8), (4096, 16), (8192, 16), (8192, 32), (16384, 32)), (1, 3), (0, 1, 2), (False, True)
    )
]


def sweep_tensors(n_rows, n, dtype):
    """x, an upstream gradient dy, x's fp32 log-sum-exp and an output, in kernel_ms's order after ``backward``."""
    x = torch.randn(n_rows, n, device="cuda", dtype=dtype)
    return x, torch.randn_like(x), torch.logsumexp(x.float(), dim=-1), torch.empty_like(x)


def kernel_ms(backward, x, dy, lse, out, log, plan):
    n = x.shape[1]
    if backward:
        args = (softmax._softmax_bwd_kernel, (dy, x, lse, out), (n, n, n))
    else:
        args = (softmax._softmax_fwd_kernel, (x, out, lse), (n, n))
    return median_ms(lambda: softmax._launch(*args, x, log, backward, plan=plan))


def print_single_pass(widths, dtype):
    """The single-pass plan's choices (rows per program, warps) for rows that fit registers, 16384 rows."""
    print("dir  log    dtype     n       (rows, warps)  ms      GB/s  (the plan now)")
    for backward, n in itertools.product((False, True), widths):
        x, dy, lse, out = sweep_tensors(16384, n, dtype)
        times = {}
        for rows, warps in itertools.product((1, 2, 4, 8, 16), (2, 4, 8, 16)):
            if rows * n <= 16384 and 64 * warps <= rows * n:
                plan = softmax.SoftmaxPlan(True, n, rows, warps, 1, 0, False)
                times[(rows, warps)] = kernel_ms(backward, x, dy, lse, out, False, plan)
        best = min(times, key=times.get)
        gbps = (3 if backward else 2) * x.numel() * x.element_size() / times[best] / 1e6
        now = kernel_ms(backward, x, dy, lse, out, False, softmax.softmax_launch_plan(n, backward, x.element_size()))
        print(f"{'bwd' if backward else 'fwd'}  False  {str(dtype)[6:]:<9} {n:<7} {best!s:<14} {times[best]:.4f}  "
              f"{gbps:6.0f}  (now {now:.4f})")  # fmt: skip
        for config in sorted(times, key=times.get)[1:4]:
            print(f"        {config!s:<14} {times[config]:.4f}")


def print_grid_loop(widths, dtype, directions):
    """Whole rows (one per block) with a grid of per_sm programs per SM looping over them, the next row's
    loads issued while this one is reduced (stages), against the plan now; 16384 rows."""
    print("dir  log    dtype     n       (warps, per_sm, stages)  ms      GB/s  (the plan now)")
    for backward, n in itertools.product(directions, widths):
        x, dy, lse, out = sweep_tensors(16384, n, dtype)
        times = {}
        for warps, per_sm, stages in itertools.product((4, 8, 16, 32), (1, 2, 4), (2, 3)):
            if 64 * warps <= n and (warps >= 16 or n <= 8192):
                plan = softmax.SoftmaxPlan(True, n, 1, warps, stages, per_sm, False)
                times[(warps, per_sm, stages)] = kernel_ms(backward, x, dy, lse, out, False, plan)
        best = min(times, key=times.get)
        gbps = (3 if backward else 2) * x.numel() * x.element_size() / times[best] / 1e6
        plan = softmax.softmax_launch_plan(n, backward, x.element_size())
        now = kernel_ms(backward, x, dy, lse, out, False, plan)
        now_config = (plan.rows, plan.warps, plan.stages, plan.programs_per_sm)
        print(f"{'bwd' if backward else 'fwd'}  False  {str(dtype)[6:]:<9} {n:<7} {best!s:<24} {times[best]:.4f}  "
              f"{gbps:6.0f}  ({now_config} {now:.4f})", flush=True)  # fmt: skip
        for config in sorted(times, key=times.get)[1:4]:
            print(f"        {config!s:<24} {times[config]:.4f}", flush=True)


def main():
    compile_only(sys.argv)
    widths = [int(a) for a in sys.argv[1:] if a.isdigit()] or [32768, 65536, 262144]
    dtype = torch.float32 if "--float32" in sys.argv else torch.bfloat16
    directions = [d for d, flag in ((False, "--bwd-only"), (True, "--fwd-only")) if flag not in sys.argv]
    if "--grid-loop" in sys.argv:
        print_grid_loop([int(a) for a in sys.argv[1:] if a.isdigit()] or [4096, 8192, 16384, 32768], dtype, directions)
        return
    if "--single-pass" in sys.argv:
        print_single_pass([int(a) for a in sys.argv[1:] if a.isdigit()] or [1024, 2048, 4096, 8192], dtype)
        return
    print("dir  log    dtype     n       (chunk, warps, stages, per_sm, hints)  ms      GB/s  "
          "(best without hints; the plan now)")  # fmt: skip
    for backward, n, log in itertools.product(directions, widths, (False, True)):
        if log and (not backward or "--log" not in sys.argv):
            continue
        x, dy, lse, out = sweep_tensors(ELEMENTS // n, n, dtype)
        times = {}
        for chunk, warps, stages, per_sm, hints in CONFIGS:
            plan = softmax.SoftmaxPlan(False, chunk, 1, warps, stages, per_sm, hints)
            times[(chunk, warps, stages, per_sm, hints)] = kernel_ms(backward, x, dy, lse, out, log, plan)
        best = min(times, key=times.get)
        passes = 3 if backward else 2
        gbps = passes * x.numel() * x.element_size() / times[best] / 1e6
        plain = {c: t for c, t in times.items() if not c[4]}
        best_plain = min(plain, key=plain.get)
        now = kernel_ms(backward, x, dy, lse, out, log, softmax.softmax_launch_plan(n, backward, x.element_size()))
        print(f"{'bwd' if backward else 'fwd'}  {log!s:<6} {str(dtype)[6:]:<9} {n:<7} {best!s:<38} "
              f"{times[best]:.4f}  {gbps:6.0f}  ({best_plain}, {plain[best_plain]:.4f}; now {now:.4f})")  # fmt: skip
        for config in sorted(times, key=times.get)[1:5]:
            print(f"        {config!s:<38} {times[config]:.4f}")


if __name__ == "__main__":
    main()
