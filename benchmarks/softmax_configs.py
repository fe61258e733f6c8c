"""Sweep the looped softmax kernels' launch configurations on a GPU: chunk, warps and the chunk loop's
software-pipeline depth, timed on the kernels alone over 2**29 elements.

The data behind ``softmax_launch_plan``'s looped path and ``LOOP_STAGES_BWD``.
`PYTHONPATH=src python3 benchmarks/softmax_configs.py [WIDTH ...] [--fwd-only] [--bwd-only] [--float32]`
"""

import importlib
import itertools
import sys

import torch
from norm_configs import median_ms  # the sibling sweep's timing (short repetitions, out-of-resources as inf)

softmax = importlib.import_module("tritonkit.ops.softmax")
ELEMENTS = 16384 * 32768


def kernel_ms(backward, x, dy, lse, out, log, chunk, warps, stages):
    n_rows, n = x.shape
    if backward:
        tensors, strides = (dy, x, lse, out), (n, n, n)
    else:
        tensors, strides = (x, out, lse), (n, n)
    kernel = softmax._softmax_bwd_kernel if backward else softmax._softmax_fwd_kernel

    def run():
        kernel[(n_rows,)](*tensors, n_rows, n, *strides, LOG=log, SINGLE_PASS=False, ROWS=1, BLOCK_N=chunk,
                          LOOP_STAGES=stages, num_warps=warps)  # fmt: skip

    return median_ms(run)


def main():
    widths = [int(a) for a in sys.argv[1:] if a.isdigit()] or [32768, 65536, 262144]
    dtype = torch.float32 if "--float32" in sys.argv else torch.bfloat16
    directions = [d for d, flag in ((False, "--bwd-only"), (True, "--fwd-only")) if flag not in sys.argv]
    print("dir  log    dtype     n       (chunk, warps, stages)  ms      GB/s  (best without pipelining)")
    for backward, n, log in itertools.product(directions, widths, (False, True)):
        x = torch.randn(ELEMENTS // n, n, device="cuda", dtype=dtype)
        dy, out = torch.randn_like(x), torch.empty_like(x)
        lse = torch.logsumexp(x.float(), dim=-1)
        times = {}
        for config in itertools.product((2048, 4096, 8192), (8, 16, 32), (1, 2, 3)):
            if config[1] * 32 * 4 <= config[0]:
                times[config] = kernel_ms(backward, x, dy, lse, out, log, *config)
        best = min(times, key=times.get)
        passes = 3 if backward else 2
        gbps = passes * x.numel() * x.element_size() / times[best] / 1e6
        flat = {c: t for c, t in times.items() if c[2] == 1}
        best_flat = min(flat, key=flat.get)
        single_pass, chunk, _, warps, stages = softmax.softmax_launch_plan(n, backward, x.element_size(), log)
        now = "single pass" if single_pass else f"now {times[(chunk, warps, stages)]:.4f}"
        print(f"{'bwd' if backward else 'fwd'}  {log!s:<6} {str(dtype)[6:]:<9} {n:<7} {best!s:<23} "
              f"{times[best]:.4f}  {gbps:6.0f}  ({best_flat}, {flat[best_flat]:.4f}; {now})")  # fmt: skip


if __name__ == "__main__":
    main()
