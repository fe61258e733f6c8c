"""scaled_linear's persistent TMA kernel against its tiled kernel and the vendor's 8-bit GEMMs, in precise and fast
accumulation, one GPU, CUDA-graph GPU time (triton.testing.do_bench_cudagraph), bf16 output: M = N = K 4096 and 8192
and (M 4096, N 14336, K 4096), float8 e4m3 with tensor scales and with row scales and int8 with row scales. Providers
in the same run: tritonkit's own plan (the persistent kernel at these sizes on sm90) and the tiled kernel at sm90's
plan for the rows, and torch._scaled_mm (float8, the same scales) or torch._int_mm (int8, int32 output, its scaling
not counted); for float8 each of them also with use_fast_accum=True (ours and torch's), which int8 has no use for
(its sums are exact either way). ``--tiles`` adds each tile of plan.PERSISTENT_CANDIDATES forced through plan=.
``--blocks`` times DeepSeek-V3's form instead: e4m3 with 1 x 128 scales of x and 128 x 128 scales of w, on its
shapes (M 2048 and 4096; N, K 7168 x 7168, 24576 x 1536, 2112 x 7168), against torchao's Triton block-scaled GEMM
(tritonkit.bench.gemm_peers.torchao_blockwise; its wheel carried) where torch._scaled_mm refuses these scales, and
tritonkit's plan again with x's scales stored K-major (DeepGEMM's layout, copied to row-major by the launcher).

    python benchmarks/fp8_persistent.py --out DIR [--tiles] [--blocks] [--dry-run]

Prints a table and writes ``<date>-fp8-persistent.json`` into DIR: milliseconds, TFLOP/s (TOP/s for int8), the ratio
to the peer in the same accumulation mode (precise rows against _scaled_mm's default, fast rows against its
use_fast_accum=True), and each float8 or tritonkit output's rms difference from the tiled kernel's precise one over
the output's rms (the kernels sum the same products, so a wrong tile shows here, and fast accumulation its rounding).
``--dry-run``: every tritonkit provider once on a small shape under the CPU interpreter against a float64 product, no
times.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sweep_cli  # the benchmarks folder is no package: its own path

SHAPES = ((4096, 4096, 4096), (8192, 8192, 8192), (4096, 14336, 4096))  # (M, N, K)
FORMS = ("e4m3 tensor", "e4m3 row", "int8 row")
BLOCK_SHAPES = ((2048, 7168, 7168), (4096, 7168, 7168), (4096, 24576, 1536), (4096, 2112, 7168))
BLOCK_FORMS = ("e4m3 block",)  # x: 1 x 128 groups, w: 128 x 128 blocks
BLOCK = 128
# --blocks --tiles: the tiled kernel's tiles timed beside the plan's (block_m, block_n, warps, stages; K steps of 128),
# torchao's autotuned space (8 warps, 16-128 x 32-128, 3-6 stages) around sm90's 128 x 128 x 128 w8 s3.
BLOCK_TILES = ((128, 128, 8, 4), (128, 128, 8, 5), (64, 128, 8, 4), (64, 128, 8, 6), (128, 64, 8, 4),
               (64, 128, 4, 4), (128, 128, 4, 4))  # fmt: skip
# 100 ms of replays a point (10 of a graph of 10 ms): 45 points and ~10 compiles stay well within a minute on one
# H200 (--tiles: 63 points).
REP_MS = 10
FAST = " fast accum"  # the suffix of a provider run with use_fast_accum=True
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

    def scale(shape):
        return torch.rand(shape, device=device, generator=gen) * 1e-2 + 5e-3

    if granularity == "block":
        groups = -(-k // BLOCK)
        return x, w, scale((m, groups)), scale((-(-n // BLOCK), groups))
    if granularity == "tensor":
        return x, w, scale(()), scale(())
    return x, w, scale((m, 1)), scale((n, 1))


def _dequantized(x, w, x_scale, w_scale):
    """x and w in float64 with their scales applied (any of the forms above)."""

    def expand(codes, scale, rows_per_scale):
        if scale.dim() == 0 or scale.shape[-1] == 1:
            return codes.double() * scale.double().reshape(-1, 1) if scale.dim() else codes.double() * scale.double()
        full = scale.double().repeat_interleave(rows_per_scale, 0).repeat_interleave(BLOCK, 1)
        return codes.double() * full[: codes.shape[0], : codes.shape[1]]

    return expand(x, x_scale, 1), expand(w, w_scale, BLOCK)


def _providers(form: str, m: int, x, w, x_scale, w_scale, tiles: bool) -> dict:
    """name -> a call returning the output; each mode's peer before the providers it is compared with."""
    import torch

    from tritonkit.ops.gemm.launch import scaled_linear_fwd
    from tritonkit.ops.gemm.plan import PERSISTENT_CANDIDATES, GemmTiles, gemm_tiles

    def ours(plan, fast=False):
        return lambda: scaled_linear_fwd(x, w, x_scale, w_scale, None, torch.bfloat16, fast, plan=plan)

    blocks = form.endswith("block")
    # int8's sums are exact, and block scales keep each step's sum apart: fast accumulation changes neither.
    modes = (False,) if form.startswith("int8") or blocks else (False, True)
    providers = {}
    for fast in modes:
        suffix = FAST if fast else ""
        if x.is_cuda and blocks:
            from tritonkit.bench.gemm_peers import torchao_blockwise

            peer = torchao_blockwise()
            providers["torchao blockwise"] = lambda peer=peer: peer(x, w, x_scale, w_scale)
        elif x.is_cuda and form.startswith("int8"):
            providers["torch._int_mm"] = lambda: torch._int_mm(x, w.t())
        elif x.is_cuda:
            scale_b = w_scale.reshape(1, -1).contiguous() if w_scale.dim() else w_scale
            providers["torch._scaled_mm" + suffix] = lambda fast=fast, scale_b=scale_b: torch._scaled_mm(
                x, w.t(), x_scale, scale_b, out_dtype=torch.bfloat16, use_fast_accum=fast)  # fmt: skip
        providers["tritonkit (its plan)" + suffix] = ours(None, fast)
        if blocks:  # x's group scales stored K-major (the launcher copies them to row-major)
            k_major = x_scale.t().contiguous().t()
            providers["tritonkit, x scales K-major"] = lambda k_major=k_major: scaled_linear_fwd(
                x, w, k_major, w_scale, None, torch.bfloat16, False)  # fmt: skip
        providers["tiled (sm90 plan)" + suffix] = ours(gemm_tiles("sm90", m, per_step=blocks), fast)
    for block_m, block_n, warps, stages in BLOCK_TILES if tiles and blocks else ():
        providers[f"tiled {block_m}x{block_n}x128 w{warps} s{stages}"] = ours(
            GemmTiles(block_m, block_n, 128, warps, stages, 8)
        )
    for plan in PERSISTENT_CANDIDATES if tiles else ():
        label = f"persistent {plan.block_m}x{plan.block_n}x{plan.block_k} w{plan.warps} s{plan.stages}"
        providers[label + (" split" if plan.split_store else "")] = ours(plan)
    return providers


def _relative_rms(out, ref) -> float:
    return float((out.float() - ref.float()).pow(2).mean().sqrt() / ref.float().pow(2).mean().sqrt())


def dry_run() -> int:
    """Each tritonkit provider once under the interpreter on DRY_RUN_SHAPE, against float64."""
    m, n, k = DRY_RUN_SHAPE
    worst = 0.0
    for form in FORMS + BLOCK_FORMS:
        x, w, x_scale, w_scale = _operands(form, m, n, k, "cpu")
        x_values, w_values = _dequantized(x, w, x_scale, w_scale)
        exact = x_values @ w_values.T
        for name, run in _providers(form, m, x, w, x_scale, w_scale, tiles=True).items():
            error = _relative_rms(run().double(), exact)
            worst = max(worst, error)
            print(f"{form:12} {name:47} rms error / rms {error:.2e}", flush=True)
    return 0 if worst < 2**-7 else 1  # bf16 outputs: a rounding of 2^-9 of the rms, far below a wrong tile


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiles", action="store_true", help="also time each of plan.PERSISTENT_CANDIDATES")
    parser.add_argument("--blocks", action="store_true", help="e4m3 with 1 x 128 by 128 x 128 scales on "
                        "DeepSeek-V3's shapes, against torchao's block-scaled GEMM")  # fmt: skip
    args = sweep_cli.parse(parser)
    if args.dry_run:
        return dry_run()

    import torch
    import triton.testing

    rows = []
    print(f"{'M x N x K':>20} {'form':12} {'provider':47} {'ms':>8} {'TFLOP/s':>8} {'vs peer':>8} {'diff':>8}")
    for m, n, k in BLOCK_SHAPES if args.blocks else SHAPES:
        flops = 2 * m * n * k
        for form in BLOCK_FORMS if args.blocks else FORMS:
            x, w, x_scale, w_scale = _operands(form, m, n, k, "cuda")
            providers = _providers(form, m, x, w, x_scale, w_scale, args.tiles)
            tiled = providers["tiled (sm90 plan)"]()
            peer_ms = {}  # accumulation mode -> the peer's time
            for name, run in providers.items():
                is_peer, fast = name.startswith(("torch.", "torchao")), name.endswith(FAST)
                try:
                    diff = None if name == "torch._int_mm" else _relative_rms(run(), tiled)
                    ms = triton.testing.do_bench_cudagraph(run, rep=REP_MS)
                except Exception as error:  # a tile this GPU cannot hold: recorded, the sweep goes on
                    message = f"{type(error).__name__}: {str(error)[:120]}"
                    rows.append({"m": m, "n": n, "k": k, "form": form, "provider": name, "error": message})
                    print(f"{f'{m}x{n}x{k}':>20} {form:12} {name:47} failed: {message}", flush=True)
                    continue
                if is_peer:
                    peer_ms[fast] = ms
                ratio = peer_ms[fast] / ms if fast in peer_ms else float("nan")  # nan: the peer failed
                rows.append({"m": m, "n": n, "k": k, "form": form, "provider": name, "ms": ms,
                             "tflops": flops / ms / 1e9, "vs_peer": ratio, "fast_accum": fast,
                             "rms_diff_vs_tiled": diff})  # fmt: skip
                shown_diff = "-" if diff is None else f"{diff:.1e}"
                print(f"{f'{m}x{n}x{k}':>20} {form:12} {name:47} {ms:8.3f} {flops / ms / 1e9:8.0f} {ratio:8.2f} "
                      f"{shown_diff:>8}", flush=True)  # fmt: skip
            del x, w, tiled
    record = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "rows": rows}  # fmt: skip
    from tritonkit.bench import report  # after --dry-run has set the interpreter up

    report.write_record(args.out, "fp8-blocks" if args.blocks else "fp8-persistent", record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
