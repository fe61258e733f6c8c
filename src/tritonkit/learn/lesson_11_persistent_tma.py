"""The matmul ladder's last rung: a persistent kernel that moves its tiles with TMA.

tk.ops.matmul(a, b, variant="persistent") keeps lesson 5's arithmetic (one [BLOCK_M, BLOCK_N] tile of C summed over
K steps of tl.dot, tiles taken in grouped order) and changes two things, both for Hopper GPUs.

* Persistent. Lesson 5 launches one program per tile, and the GPU starts each one when an SM frees up. Here the grid
  is one program per multiprocessor, P of them (132 on an H100; fewer if there are fewer tiles), and program p
  computes tiles p, p + P, p + 2P, ... of the grouped order: `for tile in tl.range(p, n_tiles, P, flatten=True)`.
  No program waits to be scheduled, and flatten=True makes the tile loop and the K loop one software pipeline, so
  the next tile's first loads are in flight while this tile's accumulator is converted and stored (the epilogue).
  The cost: tiles go out in waves of P. With fewer tiles than SMs (N = 4096 at M = 16 is 16 tiles of 128 x 256 for
  132 SMs) most SMs idle, and a partial last wave leaves the SMs with no tile left idle while the others finish:
  hence narrower tiles for products with few rows (tk.ops.tutorial.plan.persistent_tile picks by M and N).
* TMA. A, B and C reach the kernel as tensor descriptors built on the host, TensorDescriptor.from_tensor(t, block):
  the base address, shape and strides of a row-major 2-D tensor and the shape of the block one copy moves.
  desc.load([row, col]) has the tensor memory accelerator (a copy engine) fetch that whole tile into shared memory,
  zero-filling what lies past the tensor's edges (desc.store clips them), so the K loop has no masks and no pointer
  arithmetic. It needs Hopper (sm90) or newer, row-major operands, and rows and base address on multiples of 16
  bytes; otherwise variant="persistent" runs the variant auto picks. A weight in F.linear's layout, W (N x K,
  row-major) used as B = W.t(), is described as W itself: the kernel loads [BLOCK_N, BLOCK_K] tiles of B^T and
  transposes them in registers, or, for a few rows of A, uses them as they are and computes the tile transposed
  (C^T = B^T A^T): Hopper's tensor cores take 64 rows a warpgroup on one side and as few as 8 on the other, so the
  weight's columns go on the wide side instead of padding 16 rows of A to 64.

Measured in bf16 on an H200, CUDA-graph GPU time (benchmarks/results/nvidia-h200/2026-11-28-gemm-table-matmul.json,
which ships with the repository, not the package): at 8192^3 the persistent kernel ran at 719 TFLOP/s, cuBLAS
(torch.matmul) at 679, the autotuned rung at 598. Over the LLM sweep (x @ W.t() for the (N, K) of Llama 3 8B and 70B
and Qwen 2.5 7B layers), with the tile chosen by M and N, the geometric mean of its TFLOP/s over cuBLAS's was 1.03x
at M = 16, 0.87x at M = 128 and 1.00x to 1.02x from M = 1024 up. With one 128 x 256 tile for every M, an H100 run
(benchmarks/results/nvidia-h100/2026-11-28-gemm-table.json) had measured 0.34x to 0.97x at M = 16 and 128, the ratio
tracking the number of tiles: N = 3584 makes 14 for 132 SMs (0.40x at M = 16), N = 28672 makes 112 (0.95x).

The lesson runs the persistent variant on small shapes (the interpreter runs tensor descriptors too) and shows which
program computes each tile of a 4 x 4 grid with 5 programs, in which turn: the kernel launched with 5 programs gets C
right, and under the interpreter its stores come in that order. It prints the sweep (plotted with --out DIR). To
measure your GPU, in a clone of the repository:

    python benchmarks/gemm_table.py --out results/
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import torch

from tritonkit import debug

RESULTS = Path(__file__).resolve().parents[3] / "benchmarks/results/nvidia-h200/2026-11-28-gemm-table-matmul.json"
TILE, PROGRAMS, GROUP = 32, 5, 2  # the schedule shown: 32 x 32 tiles of a 128 x 128 C, 5 programs, 2-row groups


class DescriptorTrace:
    """Under the interpreter, how many tiles a kernel loads through tensor descriptors, and the program and origin
    (row, column) of each tile it stores, in order (the interpreter's builder wrapped, as MemoryTrace does)."""

    def __init__(self):
        from triton.runtime.interpreter import interpreter_builder

        self.builder, self.loads, self.stores = interpreter_builder, 0, []

    def __enter__(self):
        load, store = self.builder.create_descriptor_load, self.builder.create_descriptor_store

        def traced_load(*args, **kwargs):
            self.loads += 1
            return load(*args, **kwargs)

        def traced_store(desc, value, indices):
            self.stores.append((self.builder.grid_idx[0], *(int(i.data.item()) for i in indices)))
            return store(desc, value, indices)

        self.builder.create_descriptor_load, self.builder.create_descriptor_store = traced_load, traced_store
        return self

    def __exit__(self, *exc):
        del self.builder.create_descriptor_load, self.builder.create_descriptor_store  # the builder's own again


def traced(device: str):
    return DescriptorTrace() if device == "cpu" else contextlib.nullcontext()


def product_error(c, a, b) -> float:
    """C's largest error against float64; each element within 2^-9 of sum_k |a_ik b_kj| (TF32's rounding, lesson 10)."""
    a, b = a.double(), b.double()
    error = (c.double() - a @ b).abs()
    assert (error <= 2.0**-9 * (a.abs() @ b.abs())).all(), error.max().item()
    return error.max().item()


def grouped_order(tiles_m: int, tiles_n: int, group: int) -> list[tuple[int, int]]:
    """The output tiles (row, column) in grouped order: down a band of `group` tile-rows, one column at a time, then
    the next band (the last one may be thinner)."""
    order = []
    for top in range(0, tiles_m, group):
        rows = min(group, tiles_m - top)
        order += [(top + i % rows, i // rows) for i in range(rows * tiles_n)]
    return order


def kernel_schedule(device: str) -> dict | None:
    """Launch the persistent kernel with PROGRAMS programs on a 128 x 128 C and check C; under the interpreter, return
    the (program, turn) of each tile as the kernel's stores show it."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    from tritonkit.ops.tutorial.kernels import _matmul_persistent_kernel as kernel

    a, b = torch.randn(4 * TILE, TILE, device=device), torch.randn(TILE, 4 * TILE, device=device)
    c = torch.full((4 * TILE, 4 * TILE), float("nan"), device=device)  # a tile never stored stays NaN: check fails
    named = {"M": 4 * TILE, "N": 4 * TILE, "K": TILE, "n_programs": PROGRAMS, "BLOCK_M": TILE, "BLOCK_N": TILE,
             "BLOCK_K": TILE, "GROUP_SIZE": GROUP, "B_TRANSPOSED": False, "SWAP_AB": False, "INPUT_PRECISION": "ieee",
             "UPCAST": False}  # fmt: skip
    with traced(device) as trace:  # descriptors whose block is one tile; by name, the arguments this kernel takes
        kernel[(PROGRAMS,)](*(TensorDescriptor.from_tensor(t, [TILE, TILE]) for t in (a, b, c)),
                            **{name: named[name] for name in kernel.arg_names if name in named})  # fmt: skip
    product_error(c, a, b)
    seen, turns = {}, [0] * PROGRAMS
    for program, row, col in trace.stores if trace else ():  # a program stores its tiles in the order it takes them
        seen[row // TILE, col // TILE] = (program, turns[program])
        turns[program] += 1
    return seen or None


def sweep(out_dir: str | None) -> None:
    if not RESULTS.exists():
        print(f"(no committed results at {RESULTS}: they ship with the repository, not the package)")
        return
    tflops = {}
    for row in json.loads(RESULTS.read_text())["results"]:
        if row["spec"] == "matmul_persistent" and row["tflops"]:
            case = row["case"]
            tflops[row["provider"], case["m"], case["n"], case["k"], case.get("b_transposed", False)] = row["tflops"]
    big = [tflops[provider, 8192, 8192, 8192, False] for provider in ("tritonkit", "torch", "matmul_autotuned")]
    print("  8192^3: persistent {:.0f}, cuBLAS {:.0f}, autotuned {:.0f} TFLOP/s".format(*big))
    shapes, ms = sorted({key[2:4] for key in tflops if key[4]}), sorted({key[1] for key in tflops if key[4]})

    def ratio(n: int, k: int) -> list[float]:  # persistent / cuBLAS at each M of the sweep
        return [tflops["tritonkit", m, n, k, True] / tflops["torch", m, n, k, True] for m in ms]

    print("  LLM sweep, x @ W.t(): persistent / cuBLAS by M")
    print(f"    {'N x K':<13}" + "".join(f"{m:>7}" for m in ms))
    for n, k in shapes:
        print(f"    {f'{n} x {k}':<13}" + "".join(f"{r:7.2f}" for r in ratio(n, k)))
    if not out_dir:
        print("  (pass --out DIR to plot it)")
        return
    from tritonkit.learn import pyplot, save_figure

    fig, (left, right) = pyplot().subplots(1, 2, figsize=(13, 5))
    for index, (n, k) in enumerate(shapes):
        left.plot(ms, ratio(n, k), marker="o", color=f"C{index}", label=f"N {n}, K {k}")
        for provider, style in (("tritonkit", "-"), ("torch", "--")):
            right.plot(ms, [tflops[provider, m, n, k, True] for m in ms], style, marker="o", color=f"C{index}")
    left.axhline(1.0, color="grey", linewidth=1)
    left.set_ylabel("persistent / cuBLAS (TFLOP/s)")
    left.legend(fontsize=8)
    right.set_ylabel("TFLOP/s: persistent solid, cuBLAS dashed")
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ms, [str(m) for m in ms])
        ax.set_xlabel("M (rows of x)")
    fig.suptitle("bf16 x @ W.t() on an NVIDIA H200, tiles chosen by M and N (committed results)")
    save_figure(fig, out_dir, "persistent_tma.png")


def run(out_dir: str | None = None) -> None:
    import tritonkit as tk

    device = "cpu" if debug.interpreting() else "cuda"
    a, w = torch.randn(100, 76, device=device), torch.randn(92, 76, device=device)  # w: F.linear's layout, N x K
    odd = (torch.randn(100, 70, device=device), torch.randn(70, 90, device=device))  # rows of 280 and 360 bytes
    cases = (("100 x 76 @ 76 x 92", a, w.t().contiguous(), True), ("100 x 76 @ w.t(), w 92 x 76", a, w.t(), True),
             ("100 x 70 @ 70 x 90", *odd, False))  # fmt: skip
    for label, x, y, readable in cases:  # readable: every row a multiple of 16 bytes, so TMA can address them
        with traced(device) as trace:
            error = product_error(tk.ops.matmul(x, y, variant="persistent"), x, y)
        loads = f", {trace.loads} tiles loaded through descriptors" if trace else ""
        print(f"{label:<28} max abs error against float64 {error:.1e}{loads}")
        assert trace is None or (trace.loads > 0) == readable  # the persistent kernel ran, or the fallback did
    order = grouped_order(4, 4, GROUP)
    shown = {tile: (t % PROGRAMS, t // PROGRAMS) for t, tile in enumerate(order)}  # the t-th tile: program t % P
    print(f"\n{len(order)} tiles in grouped order (GROUP_SIZE {GROUP}), {PROGRAMS} programs: program/turn of each tile")
    for i in range(4):
        print("   " + "  ".join("{}/{}".format(*shown[i, j]) for j in range(4)))
    print(f"   {-len(order) % PROGRAMS} of the {PROGRAMS} programs have no tile in the last turn")
    if device == "cpu" or torch.cuda.get_device_capability()[0] >= 9:  # TMA: Hopper and newer
        seen = kernel_schedule(device)
        assert seen is None or seen == shown
        print(f"   the kernel launched with {PROGRAMS} programs: C right" + (", its stores in this order" * bool(seen)))
    print("\nCommitted H200 benchmark:")
    sweep(out_dir)


if __name__ == "__main__":
    run()
