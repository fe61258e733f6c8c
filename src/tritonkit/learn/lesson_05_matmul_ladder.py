"""Matrix multiplication: naive, then grouped (swizzled), then autotuned.

tk.ops.matmul runs one kernel for the three steps of the ladder. Each program computes one
[BLOCK_M, BLOCK_N] tile of C, walking K in steps of BLOCK_K with tl.dot.

* naive: program k takes tiles in row-major order. Neighbouring programs, which run at the same
  time, share a row of A but each needs a different column block of B, and on a large matrix the
  B blocks are evicted from L2 before the next row of tiles comes back for them.
* grouped: program ids walk GROUP_SIZE tile-rows column by column before moving on, so the programs
  in flight share both rows of A and columns of B while those sit in L2. Same arithmetic, fewer
  trips to memory.
* autotuned: block sizes, warps and pipeline stages chosen per shape by timing candidates
  (triton.autotune), on the GPU only; under the interpreter there is nothing to time and the
  grouped kernel runs instead.

Under the interpreter the lesson shows the order in which programs take tiles, seen by tracing the
kernel's stores (tritonkit.puzzles.trace.MemoryTrace), for naive and grouped. It then plots the
committed H200 benchmark (benchmarks/results/nvidia-h200/2026-11-22-matmul.json, bf16) with --out DIR.
To measure your own GPU instead:

    tritonkit bench matmul_naive matmul_grouped matmul_autotuned --dtype bfloat16 --sizes sweep --out results/
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tritonkit import debug

RESULTS = Path(__file__).resolve().parents[3] / "benchmarks/results/nvidia-h200/2026-11-22-matmul.json"
VARIANTS = ("naive", "grouped", "autotuned")


def tile_order(group_size: int, m: int = 128, n: int = 128, block: int = 32) -> list[list[int]]:
    """Which program wrote each [block, block] tile of an (m, n) output (interpreter only)."""
    import triton

    from tritonkit.ops.tutorial.kernels import _matmul_kernel
    from tritonkit.puzzles.trace import MemoryTrace

    a, b, c = torch.randn(m, 16), torch.randn(16, n), torch.empty(m, n)
    trace = MemoryTrace()
    with trace:
        trace.start_launch({"a": a, "b": b, "c": c}, c)
        # The kernel of tk.ops.matmul, launched here into c so that the trace knows the output.
        _matmul_kernel[(triton.cdiv(m, block) * triton.cdiv(n, block),)](
            a, b, c, m, n, 16, *a.stride(), *b.stride(), *c.stride(),
            BLOCK_M=block, BLOCK_N=block, BLOCK_K=16, GROUP_SIZE=group_size, INPUT_PRECISION="ieee", UPCAST=False,
        )  # fmt: skip
    tiles = [[-1] * triton.cdiv(n, block) for _ in range(triton.cdiv(m, block))]
    for access in trace.accesses:
        if access.kind == "store" and access.tensor == "c":
            row, col = divmod(int(access.offsets.min()), n)
            tiles[row // block][col // block] = access.pid[0]
    return tiles


def plot(out_dir: str) -> Path | None:
    if not RESULTS.exists():
        print(f"(no committed results at {RESULTS}: they ship with the repository, not the package)")
        return None
    from tritonkit.learn import pyplot, save_figure

    plt = pyplot()

    results = json.loads(RESULTS.read_text())["results"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    series = [(f"matmul_{v}", "tritonkit", v) for v in VARIANTS] + [("matmul_naive", "torch", "torch (cuBLAS)")]
    for spec, provider, label in series:
        rows = [r for r in results if (r["spec"], r["provider"], r["dtype"]) == (spec, provider, "bfloat16")]
        rows.sort(key=lambda r: r["case"]["m"])
        ax.plot([r["case"]["m"] for r in rows], [r["tflops"] for r in rows], marker="o", label=label)
        if rows:
            print(f"  {label:<16} " + "  ".join(f"{r['case']['m']}: {r['tflops']:.0f}" for r in rows))
    ax.set_xscale("log", base=2)
    ax.set_xlabel("M = N = K")
    ax.set_ylabel("TFLOP/s (bf16)")
    ax.set_title("matmul ladder on an NVIDIA H200 (committed results)")
    ax.legend()
    return save_figure(fig, out_dir, "matmul_ladder.png")


def run(out_dir: str | None = None) -> None:
    import tritonkit as tk

    device = "cpu" if debug.interpreting() else "cuda"
    a = torch.randn(100, 70, device=device)
    b = torch.randn(70, 90, device=device)
    for variant in VARIANTS:
        c = tk.ops.matmul(a, b, variant=variant)
        error = (c.double() - a.double() @ b.double()).abs().max().item()
        print(f"{variant:<10} max abs error against float64: {error:.2e}")
    if debug.interpreting():
        for variant, group in (("naive", 1), ("grouped, GROUP_SIZE = 2", 2)):
            print(f"{variant}: the program that computes each 32 x 32 tile of a 128 x 128 output")
            for row in tile_order(group):
                print("   " + " ".join(f"{p:>2}" for p in row))
    print("Committed H200 benchmark, TFLOP/s by size:")
    if out_dir:
        plot(out_dir)
    else:
        print("  (pass --out DIR to plot it)")


if __name__ == "__main__":
    run()
