"""quantize of a transposed bf16 operand (as float8 training's backward quantizes dy^T, x^T and W^T), read where it
lies, against copying it first and against a row-major operand of the same size: one GPU, CUDA-graph GPU time
(triton.testing.do_bench_cudagraph), e4m3 codes, row and tensor scales, at 8192 x 14336, 8192 x 4096 and 14336 x 4096.

    python benchmarks/quantize_columns.py

Prints, per case, µs and GB/s (the bf16 read, the codes written) of each path and of each candidate tile of the
transposed codes' kernel (``quant.plan.transposed_plan``: the stored tensor read along its rows, its codes transposed
in registers) forced through ``plan=``, and whether the codes and scales equal the copy's. Needs a GPU.
"""

from __future__ import annotations

import sys

SHAPES = ((8192, 14336), (8192, 4096), (14336, 4096))
TILES = ((64, 64, 4), (32, 128, 4), (128, 32, 4), (64, 128, 8), (128, 64, 8), (32, 64, 4), (16, 128, 4))


def _paths(a, granularity: str) -> list:
    """(name, call) of each path for the transposed view of ``a``."""
    import torch

    import tritonkit as tk
    from tritonkit.ops.quant.launch import quantize_fwd
    from tritonkit.ops.quant.plan import QuantPlan

    e4m3, view = torch.float8_e4m3fn, a.t()
    paths = [
        ("row-major operand", lambda: tk.ops.quantize(a, e4m3, granularity=granularity)),
        ("copy, then quantize", lambda: tk.ops.quantize(view.contiguous(), e4m3, granularity=granularity)),
        ("in place (plan)", lambda: tk.ops.quantize(view, e4m3, granularity=granularity)),
    ]
    for rows, cols, warps in TILES:
        plan = QuantPlan(rows, cols, warps, hardware_rounding=True)
        paths.append((f"in place {rows}x{cols} w{warps}",
                      lambda plan=plan: quantize_fwd(view, e4m3, granularity, 128, plan=plan)))  # fmt: skip
    return paths


def main() -> int:
    import torch
    import triton

    for m, n in SHAPES:
        a = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        moved = a.numel() * 3  # bf16 read, one-byte codes written
        for granularity in ("row", "tensor"):
            paths = _paths(a, granularity)
            copied, in_place = paths[1][1](), paths[2][1]()
            same = all(torch.equal(c.view(torch.uint8) if c.dtype != torch.float32 else c,
                                   p.view(torch.uint8) if p.dtype != torch.float32 else p)
                       for c, p in zip(copied, in_place, strict=True))  # fmt: skip
            print(f"\n{m} x {n} transposed, {granularity} scales (codes equal to the copy's: {same})")
            for name, call in paths:
                ms = triton.testing.do_bench_cudagraph(call, rep=100)
                print(f"  {name:28s} {ms * 1e3:8.1f} us {moved / ms / 1e6:7.0f} GB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
