"""The 4-bit layers' few-row path (split-K GEMV) by number of splits: one GPU, CUDA-graph GPU time
(triton.testing.do_bench_cudagraph), N 14336 and K 4096 in bf16, NF4 double-quantized (blocks of 64) and INT4
(groups of 128), 1 and 16 rows; each split count forced through plan=, and the default plan beside them.

    python benchmarks/fourbit_splits.py --out DIR

Prints a table and writes ``<date>-fourbit-splits.json`` into DIR: milliseconds and the GB/s of the packed weight
(codes and scales, what the layer must read).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
from pathlib import Path

import torch
import triton.testing

import tritonkit as tk
from tritonkit.bench import report
from tritonkit.ops.fourbit import launch
from tritonkit.ops.fourbit.plan import FALLBACK

N, K = 14336, 4096
SPLITS = (1, 2, 4, 8, 16)


def _layers():
    weight = torch.randn(N, K, device="cuda") * K**-0.5
    packed, state = tk.ops.nf4_quantize(weight, blocksize=64, double_quant=True)
    nf4_bytes = packed.numel() + sum(t.numel() * t.element_size() for t in state.tensors().values())
    qweight, scales, zeros = tk.ops.int4_quantize(weight.to(torch.bfloat16), group_size=128)
    int4_bytes = qweight.numel() + scales.numel() * scales.element_size() + zeros.numel()
    nf4_args = launch.nf4_arguments(packed, state)
    return {
        "nf4": (nf4_bytes, lambda x, plan: launch.nf4_linear_fwd(x, None, *nf4_args, plan=plan),
                lambda x: tk.ops.nf4_linear(x, packed, state)),
        "int4": (int4_bytes, lambda x, plan: launch.int4_linear_fwd(x, None, qweight, scales, zeros, 128, plan=plan),
                 lambda x: tk.ops.int4_linear(x, qweight, scales, zeros, group_size=128)),
    }  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    few_rows = FALLBACK[0][1]
    rows = []
    for name, (weight_bytes, forced, default) in _layers().items():
        for m in (1, 16):
            x = torch.randn(m, K, device="cuda", dtype=torch.bfloat16)
            runs = [(f"splits {s}", functools.partial(forced, x, dataclasses.replace(few_rows, splits=s)))
                    for s in SPLITS] + [("default plan", functools.partial(default, x))]  # fmt: skip
            for label, run in runs:
                ms = triton.testing.do_bench_cudagraph(run)
                gb_s = weight_bytes / ms / 1e6
                rows.append({"format": name, "m": m, "run": label, "ms": ms, "gb_s": gb_s})
                print(f"{name:5} m={m:<3} {label:13} {ms * 1e3:8.1f} us  {gb_s:7.0f} GB/s", flush=True)
    record = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "n": N, "k": K, "rows": rows}
    report.write_record(args.out, "fourbit-splits", record)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
