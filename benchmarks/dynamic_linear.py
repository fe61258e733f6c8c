"""W8A8 with 1 x 128 activation groups and 128 x 128 weight blocks (DeepSeek-V3's float8 recipe, what
``QuantizedLinear(granularity="block")`` runs): the fused ``dynamic_scaled_linear`` (x quantized inside the GEMM's K
loop) against ``quantize`` then ``scaled_linear`` (two launches, x's codes and scales through memory), on one GPU,
CUDA-graph GPU time (triton.testing.do_bench_cudagraph), bf16 x and output, e4m3 codes, N = K = 7168, M from 16 to
8192. Also cuBLAS's bf16 ``F.linear`` on the dequantized weight, and the fused kernel at each of TILES (plan=).

    python benchmarks/dynamic_linear.py --out DIR [--dry-run]

Prints a table and writes ``<date>-dynamic-linear.json`` into DIR: milliseconds, TFLOP/s, each provider's speed
against the two launches, and each output's largest difference from the two launches' over its rms. ``--dry-run``:
every provider once on a small shape under the CPU interpreter, no times.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

ROWS = (16, 64, 128, 512, 2048, 4096, 8192)
N = K = 7168
GROUP = 128
# Tiles of the fused kernel timed beside its plan (block_m, block_n, block_k = the group, warps, stages, grouping).
TILES = ((64, 128, 128, 4, 3, 8), (128, 128, 128, 8, 4, 8), (64, 64, 128, 4, 4, 8), (128, 64, 128, 4, 3, 8),
         (128, 128, 128, 4, 3, 8), (64, 256, 128, 8, 3, 8))  # fmt: skip
REP_MS = 20


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args(argv)

    import torch

    import tritonkit as tk
    from tritonkit.ops.gemm.launch import dynamic_scaled_linear_fwd
    from tritonkit.ops.gemm.plan import GemmTiles

    device = "cpu" if args.dry_run else "cuda"
    rows, n, k = ((5, 1), 48, 256) if args.dry_run else (ROWS, N, K)
    tiles = TILES[:1] if args.dry_run else TILES
    gen = torch.Generator(device).manual_seed(0)
    weight = torch.randn(n, k, device=device, generator=gen).to(torch.bfloat16)
    w_q, w_scale = tk.ops.quantize(weight, torch.float8_e4m3fn, granularity="block", block_size=GROUP)
    w_dq = tk.ops.dequantize(w_q, w_scale, dtype=torch.bfloat16)
    results = []
    for m in rows:
        x = torch.randn(m, k, device=device, generator=gen).to(torch.bfloat16)

        def two_launches(x=x):
            x_q, x_scale = tk.ops.quantize(x, torch.float8_e4m3fn, granularity="group", block_size=GROUP)
            return tk.ops.scaled_linear(x_q, w_q, x_scale, w_scale, out_dtype=torch.bfloat16)

        providers = {
            "quantize + scaled_linear": two_launches,
            "dynamic_scaled_linear": lambda x=x: tk.ops.dynamic_scaled_linear(x, w_q, w_scale, group_size=GROUP),
            "cuBLAS bf16 (dequantized w)": lambda x=x: torch.nn.functional.linear(x, w_dq),
        }
        for t in tiles:
            plan = GemmTiles(*t)

            def fused(x=x, plan=plan):
                return dynamic_scaled_linear_fwd(x, w_q, w_scale, None, torch.bfloat16, GROUP, torch.float8_e4m3fn,
                                                 plan=plan)  # fmt: skip

            providers[f"fused {t[0]}x{t[1]} w{t[3]} s{t[4]}"] = fused
        expected = two_launches().float()
        rms = expected.pow(2).mean().sqrt().item()
        base_ms = None
        for name, fn in providers.items():
            out = fn().float()
            diff = (out - expected).abs().max().item() / rms
            ms = None
            if not args.dry_run:
                import triton

                ms = triton.testing.do_bench_cudagraph(fn, rep=REP_MS)
                base_ms = base_ms or ms
            tflops = 2 * m * n * k / (ms * 1e-3) / 1e12 if ms else None
            row = {"m": m, "n": n, "k": k, "provider": name, "ms": ms, "tflops": tflops,
                   "speed_vs_two_launches": (base_ms / ms) if ms else None, "max_diff_over_rms": diff}  # fmt: skip
            results.append(row)
            shown = f"{ms * 1e3:9.1f} us {tflops:7.1f} TFLOP/s {base_ms / ms:5.2f}x" if ms else "(dry run)"
            print(f"M {m:5d}  {name:30s} {shown}  max diff {diff:.2e} of rms", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    name = args.out / f"{datetime.date.today().isoformat()}-dynamic-linear.json"
    gpu = "cpu (interpreter)" if args.dry_run else torch.cuda.get_device_name()
    name.write_text(json.dumps({"device": gpu, "timing": "CUDA-graph GPU time", "results": results}, indent=1))
    print(f"wrote {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
