"""Sweep RoPE's launch plan on a GPU: RopePlan's half_tile (elements of one [heads, rotary_dim / 2] tile of the head
loop, so heads per step = half_tile / 64 here) and warps, per layout.

The forward launcher (tritonkit.ops.rotary.launch.rope_fwd) with each RopePlan passed as ``plan=``, at the issue's
shape (q (4, 32, 4096, 128), k (4, 8, 4096, 128), bf16), bytes moved = q and k read and written once. The data behind
``tritonkit/ops/rotary/plan.py``; what it found is in docs/kernels/rope.md.

    PYTHONPATH=src python3 benchmarks/rope_configs.py
"""

import itertools

import torch
import triton.testing

from tritonkit.ops.rotary.launch import HEADS_DIM, rope_fwd
from tritonkit.ops.rotary.plan import RopePlan

DEVICE = "cuda"  # where the sweep's tensors are made
B, HQ, HK, T, D = 4, 32, 8, 4096, 128


def main():
    cos = torch.randn(1, T, D, device=DEVICE, dtype=torch.bfloat16)
    sin = torch.randn(1, T, D, device=DEVICE, dtype=torch.bfloat16)
    print("layout  half_tile  heads/tile  warps   ms      GB/s")
    for layout, heads_dim in HEADS_DIM.items():
        shape = (B, HQ, T, D) if layout == "bhtd" else (B, T, HQ, D)
        q = torch.randn(shape, device=DEVICE, dtype=torch.bfloat16)
        k = torch.randn((B, HK, T, D) if layout == "bhtd" else (B, T, HK, D), device=DEVICE, dtype=torch.bfloat16)
        results = {}
        for heads, warps in itertools.product((4, 8, 16, 32), (1, 2, 4, 8)):
            plan = RopePlan(half_tile=heads * (D // 2), warps=warps)

            def run(q=q, k=k, heads_dim=heads_dim, plan=plan):
                rope_fwd(q, k, cos, sin, None, heads_dim, False, plan=plan)

            results[plan] = triton.testing.do_bench(run, return_mode="median")
        moved = 2 * (q.numel() + k.numel()) * q.element_size()
        for plan, ms in sorted(results.items(), key=lambda item: item[1])[:6]:
            heads = plan.half_tile // (D // 2)
            print(f"{layout:7} {plan.half_tile:<10} {heads:<11} {plan.warps:<6} {ms:.4f}  {moved / ms / 1e6:6.0f}")


if __name__ == "__main__":
    main()
