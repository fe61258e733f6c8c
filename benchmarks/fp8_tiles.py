"""scaled_linear's tiled kernel at 8192^3 under a sweep of GemmTiles, against torch._scaled_mm and torch._int_mm in
the same run (GPU time of the kernel alone, triton.testing.do_bench, median), and the float8 product's error at small
K against float64 (relative to the output's rms), ours beside _scaled_mm's with and without its fast accumulation.
Findings: docs/kernels/gemm.md.

    PYTHONPATH=src python3 benchmarks/fp8_tiles.py [--size 8192] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

TILES = (  # block_m, block_n, block_k, warps, stages, group, fp8_promote
    (128, 128, 64, 8, 3, 8, 0),  # the fallback's many-rows tile, float8 never promoted (Triton's sm_90 default)
    (128, 128, 64, 8, 3, 8, 64),
    (128, 128, 128, 8, 3, 8, 0),
    (128, 128, 128, 8, 3, 8, 128),
    (128, 128, 128, 8, 3, 8, 64),
    (128, 256, 128, 8, 3, 8, 128),
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=8192)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)

    import torch
    from triton.testing import do_bench

    from tritonkit.ops.gemm.launch import scaled_linear_fwd
    from tritonkit.ops.gemm.plan import GemmTiles

    size = args.size
    gen = torch.Generator("cuda").manual_seed(0)
    x = torch.randn(size, size, device="cuda", generator=gen)
    w = torch.randn(size, size, device="cuda", generator=gen)
    forms = {
        "e4m3 row": (x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn), torch.ones(size, 1, device="cuda"),
                     torch.ones(size, 1, device="cuda")),
        "int8 row": (x.clamp(-3, 3).mul(40).round().to(torch.int8), w.clamp(-3, 3).mul(40).round().to(torch.int8),
                     torch.ones(size, 1, device="cuda"), torch.ones(size, 1, device="cuda")),
        "e4m3 1x128 / 128x128": (x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn),
                                 torch.ones(size, size // 128, device="cuda"),
                                 torch.ones(size // 128, size // 128, device="cuda")),
        "bf16 x, int8 w rows": (x.to(torch.bfloat16), w.clamp(-3, 3).mul(40).round().to(torch.int8), None,
                                torch.ones(size, 1, device="cuda")),
    }  # fmt: skip
    flops = 2 * size**3
    rows = []

    def record(form, provider, ms):
        rows.append({"form": form, "provider": provider, "ms": ms, "tflops": flops / ms / 1e9})
        print(f"{form:>22} {provider:>40} {ms:8.3f} ms {flops / ms / 1e9:7.0f} TFLOP/s", flush=True)

    for form, (xq, wq, xs, ws) in forms.items():
        if form.startswith("e4m3 row"):
            one = torch.ones((), device="cuda")
            for fast in (False, True):
                ms = do_bench(lambda fast=fast, xq=xq, wq=wq, one=one: torch._scaled_mm(
                    xq, wq.t(), one, one, out_dtype=torch.bfloat16, use_fast_accum=fast))  # fmt: skip
                record(form, f"_scaled_mm fast_accum={fast}", ms)
        if form.startswith("int8"):
            record(form, "_int_mm", do_bench(lambda xq=xq, wq=wq: torch._int_mm(xq, wq.t())))
        for tile in TILES:
            plan = GemmTiles(*tile)
            try:
                ms = do_bench(lambda xq=xq, wq=wq, xs=xs, ws=ws, plan=plan: scaled_linear_fwd(
                    xq, wq, xs, ws, None, torch.bfloat16, False, plan=plan))  # fmt: skip
            except Exception as error:  # a tile this GPU cannot hold: recorded, the sweep goes on
                print(f"{form:>22} {tile!s:>40} failed: {type(error).__name__}: {str(error)[:80]}", flush=True)
                continue
            record(form, str(tile), ms)

    # The float8 product's error over the output's rms, at three K (the registry's tolerance, spec.FLOAT8_SUM_ERROR).
    errors = []
    for k in (128, 1024, 8192):
        a = torch.randn(256, k, device="cuda", generator=gen).to(torch.float8_e4m3fn)
        b = torch.randn(256, k, device="cuda", generator=gen).to(torch.float8_e4m3fn)
        exact = a.double() @ b.double().t()
        rms = exact.pow(2).mean().sqrt().item()
        one = torch.ones((), device="cuda")
        ones = torch.ones(256, 1, device="cuda")
        candidates = {
            **{f"tritonkit promote {promote}": scaled_linear_fwd(a, b, ones, ones, None, torch.float32, False,
                                                                 plan=GemmTiles(128, 128, 128, 8, 3, 8, promote))
               for promote in (0, 128, 32)},
            "_scaled_mm": torch._scaled_mm(a, b.t(), one, one, out_dtype=torch.float32),
            "_scaled_mm fast": torch._scaled_mm(a, b.t(), one, one, out_dtype=torch.float32, use_fast_accum=True),
        }  # fmt: skip
        for name, got in candidates.items():
            error = (got.double() - exact).abs().max().item() / rms
            errors.append({"k": k, "provider": name, "max_error_over_rms": error})
            print(f"float8 error k={k:5d} {name:>16}: max |error| / rms = {error:.2e}", flush=True)
    if args.out:
        args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "size": size, "rows": rows,
                                        "errors": errors}, indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
