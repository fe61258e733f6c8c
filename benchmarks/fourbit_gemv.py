"""The 4-bit layers' forward at 1, 4 and 16 rows: the GEMV kernel (plan.Gemv4Tiles) over a small sweep of its tiles
against the 16-row dot tile and the peers. One GPU, CUDA-graph GPU time (triton.testing.do_bench_cudagraph), bf16 x,
(N 14336, K 4096) and (N 4096, K 14336), NF4 double-quantized (blocks of 64) and INT4 (groups of 128).

- "dot 16-row": the 16 x 64 dot tile with split-K (linear4_tiles' plan, NF4's default from 2 rows).
- "default": the public op with its default plan (plan.GEMV_FALLBACK: by format and rows, the GEMV or the dot tile).
- "gemv-P NxK wW sS pP": the GEMV with block_n N, block_k K, W warps, S splits of K (auto: choose_splits') and P
  stages, products P: "dot" on the tensor cores (four configurations at every row count) or "fma" on the CUDA cores
  (eight at one row, two at 4 rows, one at 16; each row count compiles its own kernels; INT4 codes that can be read
  as words take _int4_gemv_words_kernel).
- Peers: cuBLAS bf16 F.linear on the dequantized weight, and bitsandbytes' matmul_4bit on the same NF4 codes where
  bitsandbytes imports.

    python benchmarks/fourbit_gemv.py --out DIR

Prints a table and writes ``<date>-<label>.json`` (--label, default fourbit-gemv) into DIR: microseconds, the GB/s
of the packed weight (codes and their scales, zero points or absmax; cuBLAS: its bf16 weight) and cuBLAS's time over
each run's. Past --budget seconds (30) the remaining GEMV configurations are skipped and listed, the dot tile, default
and peers still timed, so that the run stays within a minute.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import time
from pathlib import Path

import torch
import triton.testing

import tritonkit as tk
from tritonkit._core.device import arch
from tritonkit.bench import report
from tritonkit.ops.fourbit import launch
from tritonkit.ops.fourbit.plan import gemv4_tiles, linear4_tiles

SHAPES = ((14336, 4096), (4096, 14336))  # (N, K): an MLP's up and down projections
ROWS = (1, 4, 16)
# (block_n, block_k, warps, splits, products, stages), 0 splits: choose_splits'. The tensor cores' four at every row
# count; on the CUDA cores every one at one row, the first two at 4 rows, one at 16 (each row count compiles kernels of
# its own, slower the more rows). Split counts share a compile (two grids). Stages: the pipeline depth the compiler
# gets (2026-11-29-fourbit-gemv-words-prefetch.md ran a kernel that prefetched a step from 2 on).
# mma.sync; wgmma (its smallest M, 64); narrower tiles, so that more programs stream the weight
DOT_SWEEP = ((32, 256, 2, 0, "dot", 3), (64, 256, 4, 0, "dot", 3), (16, 256, 2, 0, "dot", 3),
             (16, 512, 4, 0, "dot", 3))  # fmt: skip
FMA_SWEEP = ((32, 256, 4, 0, "fma", 3), (128, 128, 4, 0, "fma", 3), (64, 256, 4, 0, "fma", 3),
             (64, 128, 2, 0, "fma", 3), (32, 128, 1, 0, "fma", 3), (128, 256, 8, 0, "fma", 3),
             (16, 512, 4, 1, "fma", 3), (128, 128, 4, 16, "fma", 3))  # fmt: skip
FMA_SWEPT_AT = {1: len(FMA_SWEEP), 4: 2, 16: 1}
REP_MS = 10  # do_bench_cudagraph's timed span per run: enough for µs kernels, and the whole run under a minute


def _bitsandbytes():
    try:
        from tritonkit.bench import fourbit_peers

        return fourbit_peers.bitsandbytes()
    except ImportError:
        return None


def _layer(n: int, k: int) -> dict:
    """(packed bytes, forward(x, plan), op(x)) by format, and the bf16 weight, for a random (n, k) weight."""
    weight = torch.randn(n, k, device="cuda") * k**-0.5
    packed, state = tk.ops.nf4_quantize(weight, blocksize=64, double_quant=True)
    qweight, scales, zeros = tk.ops.int4_quantize(weight.to(torch.bfloat16), group_size=128)
    nf4_args = launch.nf4_arguments(packed, state)
    nested = [t for t in (state.absmax_codes, state.absmax_scales, state.offset) if t is not None]
    return {
        "nf4": (sum(t.numel() * t.element_size() for t in (packed, *state.tensors().values())),
                lambda x, plan: launch.nf4_linear_fwd(x, None, *nf4_args, plan=plan),
                lambda x: tk.ops.nf4_linear(x, packed, state), (packed, nested, state.shape)),
        "int4": (qweight.numel() + scales.numel() * scales.element_size() + zeros.numel(),
                 lambda x, plan: launch.int4_linear_fwd(x, None, qweight, scales, zeros, 128, plan=plan),
                 lambda x: tk.ops.int4_linear(x, qweight, scales, zeros, group_size=128), None),
        "dense": weight.to(torch.bfloat16),
    }  # fmt: skip


def _runs(fmt: str, layer: dict, x: torch.Tensor, sweep) -> list[tuple[str, int, object]]:
    """(label, bytes read, callable): the dot tile, the default, the GEMV sweep, the peers."""
    weight_bytes, forward, op, nf4 = layer[fmt]
    device_arch = arch(x.device)
    base = gemv4_tiles(device_arch, fmt, 1)  # the one-row tiles, with the architecture's NF4 lookup
    runs = [("dot 16-row", weight_bytes, functools.partial(forward, x, linear4_tiles(device_arch, x.shape[0]))),
            ("default", weight_bytes, functools.partial(op, x))]  # fmt: skip
    for block_n, block_k, warps, splits, products, stages in sweep:
        plan = dataclasses.replace(base, block_n=block_n, block_k=block_k, warps=warps, splits=splits,
                                   products=products, stages=stages)  # fmt: skip
        label = f"gemv-{products} {block_n}x{block_k} w{warps} s{splits or 'auto'} p{stages}"
        runs.append((label, weight_bytes, functools.partial(forward, x, plan)))
    dense = layer["dense"]
    runs.append(("cublas bf16", dense.numel() * 2, functools.partial(torch.nn.functional.linear, x, dense)))
    theirs = _bitsandbytes() if nf4 is not None else None
    if theirs is not None:
        packed, nested, shape = nf4
        runs.append(("bitsandbytes nf4", weight_bytes,
                     functools.partial(theirs, x, packed, *nested, shape=shape, blocksize=64)))  # fmt: skip
    return runs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--budget", type=float, default=30.0, help="seconds, then GEMV configurations are skipped")
    parser.add_argument("--formats", nargs="+", choices=("int4", "nf4"), default=["int4", "nf4"])
    parser.add_argument("--label", default="fourbit-gemv", help="the record's name, after the date")
    args = parser.parse_args()
    torch.manual_seed(0)
    start = time.perf_counter()
    rows, skipped = [], []
    for n, k in SHAPES:
        layer = _layer(n, k)
        for fmt in args.formats:
            for m in ROWS:
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                measured = []
                for label, weight_bytes, run in _runs(fmt, layer, x, DOT_SWEEP + FMA_SWEEP[: FMA_SWEPT_AT[m]]):
                    if label.startswith("gemv") and time.perf_counter() - start > args.budget:
                        skipped.append(f"{fmt} {n}x{k} m={m} {label}")
                        continue
                    try:
                        ms = triton.testing.do_bench_cudagraph(run, rep=REP_MS)
                    except Exception as error:  # a peer's own failure (bitsandbytes' build) costs its row only
                        if not label.startswith("bitsandbytes"):
                            raise
                        print(f"{label}: {type(error).__name__}: {error}", flush=True)
                        continue
                    measured.append({"format": fmt, "n": n, "k": k, "m": m, "run": label, "us": ms * 1e3,
                                     "gb_s": weight_bytes / ms / 1e6})  # fmt: skip
                cublas_us = next(row["us"] for row in measured if row["run"] == "cublas bf16")
                for row in measured:
                    row["vs_cublas"] = cublas_us / row["us"]
                    print(f"{fmt:4} N{n:<5} K{k:<5} m={m:<2} {row['run']:30} {row['us']:8.1f} us "
                          f"{row['gb_s']:6.0f} GB/s {row['vs_cublas']:5.2f}x cuBLAS", flush=True)  # fmt: skip
                rows += measured
    if skipped:
        print(f"skipped past the budget: {'; '.join(skipped)}", flush=True)
    record = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows, "skipped": skipped,
              "seconds": time.perf_counter() - start}  # fmt: skip
    report.write_record(args.out, args.label, record)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
