"""Sweep the RoPE kernel's launch configuration on a GPU: heads per tile and warps, per layout.

The forward kernel alone at the issue's shape (q (4, 32, 4096, 128), k (4, 8, 4096, 128), bf16),
bytes moved = q and k read and written once. `PYTHONPATH=src python3 benchmarks/rope_configs.py`.
"""

import importlib
import itertools

import torch
import triton
import triton.testing

rope = importlib.import_module("tritonkit.ops.rope")
B, HQ, HK, T, D = 4, 32, 8, 4096, 128


def main():
    cos = torch.randn(1, T, D, device="cuda", dtype=torch.bfloat16)
    sin = torch.randn(1, T, D, device="cuda", dtype=torch.bfloat16)
    print("layout  heads/tile  warps   ms      GB/s")
    for layout, heads_dim in rope.HEADS_DIM.items():
        shape = (B, HQ, T, D) if layout == "bhtd" else (B, T, HQ, D)
        q = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
        k = torch.randn((B, HK, T, D) if layout == "bhtd" else (B, T, HK, D), device="cuda", dtype=torch.bfloat16)
        q_out, k_out = torch.empty_like(q), torch.empty_like(k)
        args = (
            q, k, cos, sin, cos, q_out, k_out, T, HQ, HK, D // 2, 0, T,
            *rope._bhtd_strides(q, heads_dim), *rope._bhtd_strides(k, heads_dim),
            *rope._bhtd_strides(q_out, heads_dim), *rope._bhtd_strides(k_out, heads_dim),
            0, cos.stride(1), cos.stride(2), 0, sin.stride(1), sin.stride(2), 0, 0,
        )  # fmt: skip
        results = {}
        for block_h, warps in itertools.product((4, 8, 16, 32), (1, 2, 4, 8)):

            def run(args=args, block_h=block_h, warps=warps):
                rope._rope_kernel[(B * T,)](
                    *args, BACKWARD=False, HAS_POS=False, BLOCK_HQ=block_h, BLOCK_HK=min(block_h, HK),
                    BLOCK_HALF=D // 2, BLOCK_PASS=0, num_warps=warps,
                )  # fmt: skip

            results[(block_h, warps)] = triton.testing.do_bench(run, return_mode="median")
        moved = 2 * (q.numel() + k.numel()) * q.element_size()
        for (block_h, warps), ms in sorted(results.items(), key=lambda item: item[1])[:6]:
            print(f"{layout:7} {block_h:<11} {warps:<6} {ms:.4f}  {moved / ms / 1e6:6.0f}")


if __name__ == "__main__":
    main()
