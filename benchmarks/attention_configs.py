"""Sweep flash attention's launch tiles on one shape, with SDPA's flash and cuDNN backends timed in the same run.

    python3 benchmarks/attention_configs.py [--b 4 --h 32 --hk 32 --n 4096 --d 128] [--part fwd|dkdv|dq|all]
                                            [--tiles sweep|descriptors] [--out FILE]

Each kernel of the plan (forward, dK/dV, dQ) is swept on its own, the others kept at the measured plan (--tiles
descriptors: each kernel's measured tile with pointer loads and with tensor descriptors, and at d128 the forward tiles
around it both ways). Times are triton.testing.do_bench medians (eager calls; at these sizes a call is
milliseconds, so launch cost is noise). TFLOP/s count 4·B·H·N²·D for the forward, half when causal, and 2.5 times
that for the backward.
"""

from __future__ import annotations

import argparse
import dataclasses
import math

import torch
import triton

from tritonkit.ops.flash_attention import launch
from tritonkit.ops.flash_attention.plan import Tiles, attention_plan

FORWARD = [Tiles(m, n, w, s) for m, n, w, s in (
    (128, 64, 8, 3), (128, 128, 8, 3), (128, 64, 4, 3), (128, 32, 4, 3), (64, 64, 4, 3), (128, 128, 8, 2),
    (128, 64, 8, 4), (64, 128, 4, 3), (128, 128, 8, 4), (64, 64, 4, 4),
)]  # fmt: skip
# --tiles descriptors at d128: forward tiles around the measured one, reading K and V by pointers and by descriptors
DESCRIPTOR_TILES = [Tiles(m, n, w, s, descriptors=kv) for m, n, w, s in (
    (128, 64, 8, 4), (128, 64, 8, 3), (128, 128, 8, 3), (128, 128, 8, 2),
) for kv in (False, True)]  # fmt: skip
DKDV = [Tiles(m, n, w, s) for m, n, w, s in (
    (32, 128, 4, 3), (64, 128, 8, 3), (64, 64, 4, 3), (32, 64, 4, 3), (64, 128, 4, 2), (32, 128, 8, 3),
    (64, 128, 8, 2), (16, 128, 4, 3),
)]  # fmt: skip
DQ = [Tiles(m, n, w, s) for m, n, w, s in (
    (128, 32, 4, 3), (64, 64, 4, 3), (128, 64, 8, 3), (64, 32, 4, 3), (128, 128, 8, 2), (128, 64, 8, 2),
    (64, 128, 4, 3),
)]  # fmt: skip


def _ms(fn, *args, **kwargs) -> float:
    """Median milliseconds of fn(*args, **kwargs)."""
    return triton.testing.do_bench(lambda: fn(*args, **kwargs))


def _both_ways(tiles: Tiles) -> list[Tiles]:
    return [dataclasses.replace(tiles, descriptors=flag) for flag in (False, True)]


def _sdpa_fwd_bwd(q, k, v, grad, **options):
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    return torch.autograd.grad(torch.nn.functional.scaled_dot_product_attention(*leaves, **options), leaves, grad)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in (("b", 4), ("h", 32), ("hk", 32), ("n", 4096), ("d", 128)):
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--part", choices=("fwd", "dkdv", "dq", "all"), default="all")
    parser.add_argument("--causal", choices=("both", "yes", "no"), default="both")
    parser.add_argument(
        "--tiles",
        choices=("sweep", "descriptors"),
        default="sweep",
        help="the tile sweep, or each kernel's tiles with pointer loads against tensor descriptors",
    )
    parser.add_argument("--out")
    args = parser.parse_args()
    b, h, hk, n, d = args.b, args.h, args.hk, args.n, args.d
    torch.manual_seed(0)
    q = torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(b, hk, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    grad = torch.randn_like(q)
    scale = 1 / math.sqrt(d)
    block_d = max(16, triton.next_power_of_2(d))
    measured = attention_plan("sm90", block_d, 2)
    lines = [f"# Flash attention tiles, B{b} H{h}:{hk} N{n} d{d} bf16 on {torch.cuda.get_device_name()}", "",
             f"measured plan: {measured}", "",
             "| causal | kernel | tiles (M, N, warps, stages) | ms | TFLOP/s |", "|---|---|---|---|---|"]  # fmt: skip
    causal_settings = {"both": (False, True), "yes": (True,), "no": (False,)}[args.causal]
    for causal in causal_settings:
        flops = 4 * b * h * n * n * d / (2 if causal else 1)
        window = launch._check_window("sweep", (-1, -1), causal)
        common = (None, None, n, n, 1, scale, *window, 0.0)
        out, lse = launch.attention_fwd(q, k, v, *common)

        def row(kernel, tiles, ms, work, causal=causal):
            lines.append(f"| {causal} | {kernel} | {tuple(dataclasses.astuple(tiles))} | {ms:.3f} | "
                         f"{work / ms / 1e9:.0f} |")  # fmt: skip
            print(lines[-1], flush=True)

        sdpa = torch.nn.functional.scaled_dot_product_attention
        for name, backend in (("sdpa-flash", "FLASH_ATTENTION"), ("sdpa-cudnn", "CUDNN_ATTENTION")):
            try:
                with torch.nn.attention.sdpa_kernel(getattr(torch.nn.attention.SDPBackend, backend)):
                    ms = _ms(sdpa, q, k, v, is_causal=causal, enable_gqa=hk != h)
                    ms_all = _ms(_sdpa_fwd_bwd, q, k, v, grad, is_causal=causal, enable_gqa=hk != h)
                lines.append(f"| {causal} | {name} fwd / fwd+bwd | - | {ms:.3f} / {ms_all:.3f} | "
                             f"{flops / ms / 1e9:.0f} / {3.5 * flops / ms_all / 1e9:.0f} |")  # fmt: skip
            except RuntimeError as error:
                lines.append(f"| {causal} | {name} | - | failed: {str(error).splitlines()[0][:80]} | - |")
            print(lines[-1], flush=True)
        if args.part in ("fwd", "all"):
            if args.tiles == "sweep":
                candidates = FORWARD
            else:  # the measured tile both ways, and at d128 the tiles around it
                candidates = list(
                    dict.fromkeys(_both_ways(measured.forward) + (DESCRIPTOR_TILES if block_d == 128 else []))
                )
            for tiles in candidates:
                plan = dataclasses.replace(measured, forward=tiles)
                try:
                    ms = _ms(launch.attention_fwd, q, k, v, *common, plan=plan)
                except Exception as error:  # out of resources for this tile: say so, go on
                    lines.append(
                        f"| {causal} | fwd | {dataclasses.astuple(tiles)} | failed: {type(error).__name__} | - |"
                    )
                    continue
                row("fwd", tiles, ms, flops)
        for part, candidates in (("dkdv", DKDV), ("dq", DQ)):
            if args.tiles == "descriptors":
                candidates = _both_ways(getattr(measured, part))
            if args.part not in (part, "all"):
                continue
            for tiles in candidates:
                # dkdv_few off: each candidate's own dK/dV tiles, whatever the program count.
                plan = dataclasses.replace(measured, **{part: tiles}, **({"dkdv_few": None} if part == "dkdv" else {}))
                try:
                    ms = _ms(launch.attention_bwd, grad, q, k, v, out, lse, *common, plan=plan)
                except Exception as error:
                    lines.append(f"| {causal} | bwd ({part} swept) | {dataclasses.astuple(tiles)} | failed: "
                                 f"{type(error).__name__} | - |")  # fmt: skip
                    continue
                row(f"bwd ({part} swept)", tiles, ms, 2.5 * flops)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
