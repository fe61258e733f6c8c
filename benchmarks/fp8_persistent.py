"""scaled_linear's persistent TMA kernel against its tiled kernel and the vendor's 8-bit GEMMs, one GPU, CUDA-graph GPU
time (triton.testing.do_bench_cudagraph), bf16 output: M = N = K 4096 and 8192 and (M 4096, N 14336, K 4096), float8
e4m3 with tensor scales and with row scales and int8 with row scales. Providers in the same run: each tile of
plan.PERSISTENT_CANDIDATES forced through plan=, the tiled kernel at sm90's plan for the rows (for e4m3 also with
GemmTiles.fp8_fast_accum, as is one candidate; neither with int8, whose sums are exact either way), and
torch._scaled_mm (float8, the same scales) or torch._int_mm (int8, int32 output, its scaling not counted).

    python benchmarks/fp8_persistent.py --out DIR [--dry-run]

Prints a table and writes ``<date>-fp8-persistent.json`` into DIR: milliseconds, TFLOP/s (TOP/s for int8), the ratio
to the peer, and each tritonkit output's rms difference from the tiled kernel's over the output's rms (the kernels sum
the same products, so a wrong tile shows here, and fast accumulation its rounding). ``--dry-run``: every tritonkit
provider once on a small shape under the CPU interpreter against a float64 product, no times.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

SHAPES = ((4096, 4096, 4096), (8192, 8192, 8192), (4096, 14336, 4096))  # (M, N, K)
FORMS = ("e4m3 tensor", "e4m3 row", "int8 row")
# 100 ms of replays a point (10 of a graph of 10 ms): 57 points and ~17 compiles stay within a minute on one H200.
REP_MS = 10
DRY_RUN_SHAPE = (300, 272, 160)  # ragged against every tile: 3 x 3 or 3 x 2 tiles, two K steps, the last one short


def _operands(form: str, m: int, n: int, k: int, device: str):
    """x (M, K) and w (N, K) codes with positive scales of the form's granularity."""
    import torch

    gen = torch.Generator(device).manual_seed(0)
    codes, granularity = form.split()
    if codes == "int8":
        x = torch.randint(-127, 128, (m, k), device=device, generator=gen, dtype=torch.int8)
        w = torch.randint(-127, 128, (n, k), device=device, generator=gen, dtype=torch.int8)
    else:
        x = (torch.randn(m, k, device=device, generator=gen) * 64).to(torch.float8_e4m3fn)
        w = (torch.randn(n, k, device=device, generator=gen) * 64).to(torch.float8_e4m3fn)

    def scale(rows):
        shape = () if granularity == "tensor" else (rows, 1)
        return torch.rand(shape, device=device, generator=gen) * 1e-2 + 5e-3

    return x, w, scale(m), scale(n)


def _providers(form: str, m: int, x, w, x_scale, w_scale) -> dict:
    """name -> a call returning the output; the peer first."""
    import torch

    from tritonkit.ops.gemm.launch import scaled_linear_fwd
    from tritonkit.ops.gemm.plan import PERSISTENT_CANDIDATES, gemm_tiles

    def ours(plan):
        return lambda: scaled_linear_fwd(x, w, x_scale, w_scale, None, torch.bfloat16, plan=plan)

    providers = {}
    if x.is_cuda and form.startswith("int8"):
        providers["torch._int_mm"] = lambda: torch._int_mm(x, w.t())
    elif x.is_cuda:
        scale_b = w_scale.reshape(1, -1).contiguous() if w_scale.dim() else w_scale
        providers["torch._scaled_mm"] = lambda: torch._scaled_mm(x, w.t(), x_scale, scale_b, out_dtype=torch.bfloat16)
    tiled = gemm_tiles("sm90", m)
    providers["tiled (sm90 plan)"] = ours(tiled)
    if not form.startswith("int8"):
        providers["tiled (sm90 plan) fast accum"] = ours(dataclasses.replace(tiled, fp8_fast_accum=True))
    for plan in PERSISTENT_CANDIDATES:
        if plan.fp8_fast_accum and form.startswith("int8"):  # int8 sums are exact: the same kernel
            continue
        label = f"persistent {plan.block_m}x{plan.block_n}x{plan.block_k} w{plan.warps} s{plan.stages}"
        label += (" split" if plan.split_store else "") + (" fast accum" if plan.fp8_fast_accum else "")
        providers[label] = ours(plan)
    return providers


def _relative_rms(out, ref) -> float:
    return float((out.float() - ref.float()).pow(2).mean().sqrt() / ref.float().pow(2).mean().sqrt())


def dry_run() -> int:
    """Each tritonkit provider once under the interpreter on DRY_RUN_SHAPE, against float64."""
    m, n, k = DRY_RUN_SHAPE
    worst = 0.0
    for form in FORMS:
        x, w, x_scale, w_scale = _operands(form, m, n, k, "cpu")
        exact = (x.double() * x_scale.double().reshape(-1, 1)) @ (w.double() * w_scale.double().reshape(-1, 1)).T
        for name, run in _providers(form, m, x, w, x_scale, w_scale).items():
            error = _relative_rms(run().double(), exact)
            worst = max(worst, error)
            print(f"{form:12} {name:47} rms error / rms {error:.2e}", flush=True)
    return 0 if worst < 2**-7 else 1  # bf16 outputs: a rounding of 2^-9 of the rms, far below a wrong tile


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"  # before any kernel is defined
        return dry_run()
    if args.out is None:
        parser.error("--out DIR is needed (unless --dry-run)")

    import torch
    import triton.testing

    rows = []
    print(f"{'M x N x K':>20} {'form':12} {'provider':47} {'ms':>8} {'TFLOP/s':>8} {'vs peer':>8} {'diff':>8}")
    for m, n, k in SHAPES:
        flops = 2 * m * n * k
        for form in FORMS:
            x, w, x_scale, w_scale = _operands(form, m, n, k, "cuda")
            providers = _providers(form, m, x, w, x_scale, w_scale)
            peer = next(iter(providers))
            tiled = providers["tiled (sm90 plan)"]()
            peer_ms = None
            for name, run in providers.items():
                try:
                    diff = None if name == peer else _relative_rms(run(), tiled)
                    ms = triton.testing.do_bench_cudagraph(run, rep=REP_MS)
                except Exception as error:  # a tile this GPU cannot hold: recorded, the sweep goes on
                    message = f"{type(error).__name__}: {str(error)[:120]}"
                    rows.append({"m": m, "n": n, "k": k, "form": form, "provider": name, "error": message})
                    print(f"{f'{m}x{n}x{k}':>20} {form:12} {name:47} failed: {message}", flush=True)
                    continue
                peer_ms = ms if name == peer else peer_ms
                ratio = peer_ms / ms if peer_ms else float("nan")  # nan: the peer failed
                rows.append({"m": m, "n": n, "k": k, "form": form, "provider": name, "ms": ms,
                             "tflops": flops / ms / 1e9, "vs_peer": ratio, "rms_diff_vs_tiled": diff})  # fmt: skip
                shown_diff = "-" if diff is None else f"{diff:.1e}"
                print(f"{f'{m}x{n}x{k}':>20} {form:12} {name:47} {ms:8.3f} {flops / ms / 1e9:8.0f} {ratio:8.2f} "
                      f"{shown_diff:>8}", flush=True)  # fmt: skip
            del x, w, tiled
    record = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "rows": rows}  # fmt: skip
    from tritonkit.bench import report  # after --dry-run has set the interpreter up

    report.write_record(args.out, "fp8-persistent", record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
