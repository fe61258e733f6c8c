"""4-bit dequantization against the copy bandwidth: one GPU, CUDA-graph GPU time (triton.testing.do_bench_cudagraph),
weights of N 14336 x K 4096 and 4096 x 14336 into bf16, NF4 double-quantized (blocks of 64) and INT4 (groups of 128).

Per weight: a bf16 copy of the output's size (the ceiling), torch.compile of the plain torch dequantization, the
public nf4_dequantize / int4_dequantize, and the 4-bit layers' dequantize-first kernel at its default plan and at the
DequantizeFirst variants of VARIANTS (tile, warps, NF4's lookup, K tiles a program), each forced through the launch.

    python benchmarks/dequantize_speed.py --out DIR
    python benchmarks/dequantize_speed.py --dry-run     # interpreter: every variant once, bit-exact

Prints GB/s on the bytes read and written (codes, scales or absmax, and the bf16 output; the copy's: its read and its
write) and the percentage of the copy's GB/s, and writes ``<date>-dequantize-speed.json`` into DIR. --dry-run runs
small weights on the CPU through the Triton interpreter and checks that every variant, the public op and the plain
torch dequantization give the default plan's output bit for bit (the public ops within one unit in the last
place: their bf16 conversion is the interpreter's, which rounds wrongly).
"""

from __future__ import annotations

import argparse
import functools
import os
from pathlib import Path

SHAPES = ((14336, 4096), (4096, 14336))
DRY_SHAPES = ((48, 320), (16, 1024))  # odd row counts of tiles, K past one 1024-column tile
NF4_BLOCK, INT4_GROUP = 64, 128
TIMED_MS = 10  # of replays a run: 50 runs and their compiles within a minute; ~200 replays of a 50 us kernel


def _variants():
    from tritonkit.ops.fourbit.plan import DequantizeFirst

    return {
        "64x256 w4": DequantizeFirst(64, 256, 4),
        "64x256 w8": DequantizeFirst(64, 256, 8),
        "128x256 w8": DequantizeFirst(128, 256, 8),
        "16x1024 w4": DequantizeFirst(16, 1024, 4),
        "16x1024 w8": DequantizeFirst(16, 1024, 8),
        "32x512 w4": DequantizeFirst(32, 512, 4),
        "32x128 w4 k8": DequantizeFirst(32, 128, 4, k_tiles=8),
        "32x256 w8 k4": DequantizeFirst(32, 256, 8, k_tiles=4),
        "64x256 w8 k4": DequantizeFirst(64, 256, 8, k_tiles=4),
        "32x128 w4 select": DequantizeFirst(32, 128, 4, nf4_decode="select"),
        "32x128 w4 prmt": DequantizeFirst(32, 128, 4, nf4_decode="prmt"),
        "64x256 w8 prmt": DequantizeFirst(64, 256, 8, nf4_decode="prmt"),
    }


def _runs(n: int, k: int, device: str, compile_peer: bool) -> dict:
    """Format -> (bytes moved, {label: callable giving the bf16 weight (N, K)})."""
    import torch

    import tritonkit as tk
    from tritonkit._core.fourbit import int4_weight, nf4_tables, nf4_weight
    from tritonkit.ops.fourbit import launch
    from tritonkit.ops.fourbit.plan import DequantizeFirst

    dtype = torch.bfloat16
    weight = torch.randn(n, k, device=device) * k**-0.5
    packed, state = tk.ops.nf4_quantize(weight, blocksize=NF4_BLOCK, double_quant=True)
    qweight, scales, zeros = tk.ops.int4_quantize(weight.to(dtype), group_size=INT4_GROUP)
    state_tensors = tuple(t for name, t in state.tensors().items() if name != "nested_code")
    nf4_in = packed.numel() + sum(t.numel() * t.element_size() for t in state_tensors)
    int4_in = qweight.numel() + scales.numel() * scales.element_size() + zeros.numel()
    out_bytes = n * k * dtype.itemsize
    tables = nf4_tables(packed.device)

    def plain_nf4(*tensors, tables):
        return nf4_weight(*tensors, shape=(n, k), blocksize=NF4_BLOCK, tables=tables).to(dtype)

    def plain_int4(q, s, z):
        return int4_weight(q, s, z, group_size=INT4_GROUP).to(dtype)

    wrap = functools.partial(torch.compile, dynamic=False) if compile_peer else (lambda f: f)
    nf4_args = launch.nf4_arguments(packed, state)
    nf4_weight_args = launch._nf4_weight(*nf4_args[:6], k, NF4_BLOCK)
    int4_weight_args = launch._int4_weight(qweight, scales, zeros, INT4_GROUP)
    plans = {"default plan": DequantizeFirst(), **_variants()}
    compiled_nf4, compiled_int4 = wrap(plain_nf4), wrap(plain_int4)
    nf4 = {
        "torch.compile": lambda: compiled_nf4(packed, *state_tensors, tables=tables),
        "nf4_dequantize": lambda: tk.ops.nf4_dequantize(packed, state, dtype=dtype).view(n, k),
        **{label: functools.partial(launch._dequantized, nf4_weight_args, n, k, dtype, device, plan)
           for label, plan in plans.items()},
    }  # fmt: skip
    int4_plans = {label: plan for label, plan in plans.items() if plan.nf4_decode == "gather"}  # INT4 has no lookup
    int4 = {
        "torch.compile": lambda: compiled_int4(qweight, scales, zeros),
        "int4_dequantize": lambda: tk.ops.int4_dequantize(qweight, scales, zeros, group_size=INT4_GROUP, dtype=dtype),
        **{label: functools.partial(launch._dequantized, int4_weight_args, n, k, dtype, device, plan)
           for label, plan in int4_plans.items()},
    }  # fmt: skip
    return {"nf4": (nf4_in + out_bytes, nf4), "int4": (int4_in + out_bytes, int4)}


def dry_run() -> int:
    """Every variant once under the interpreter, bit-exact against the default plan."""
    import torch

    failures = 0
    for n, k in DRY_SHAPES:
        for fmt, (_, runs) in _runs(n, k, "cpu", compile_peer=False).items():
            expected = runs["default plan"]().view(torch.int16)
            for label, run in runs.items():
                ulps = (run().view(torch.int16).int() - expected.int()).abs().max().item()
                # The public ops round by Triton's conversion, which the interpreter gets wrong (a GPU rounds to
                # nearest even, as the layers' kernel does by the bits): one unit in the last place is let pass.
                allowed = 1 if label.endswith("_dequantize") else 0
                failures += ulps > allowed
                verdict = "bit-exact" if ulps == 0 else f"{ulps} ulp off" + (" (allowed)" if ulps <= allowed else "")
                print(f"{fmt:4} {n:5} x {k:<5} {label:18} {verdict}", flush=True)
    print("every run as required" if not failures else f"{failures} runs differ from the default plan")
    return int(failures > 0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--dry-run", action="store_true", help="interpreter, small weights, bit-exact checks")
    args = parser.parse_args()
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
        return dry_run()
    if args.out is None:
        parser.error("--out is required (or --dry-run)")
    import torch
    import triton.testing

    from tritonkit.bench import report

    rows = []
    for n, k in SHAPES:
        source = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        target = torch.empty_like(source)
        copy_ms = triton.testing.do_bench_cudagraph(functools.partial(target.copy_, source), rep=TIMED_MS)
        copy_gb_s = 2 * source.numel() * source.element_size() / copy_ms / 1e6
        rows.append({"format": "bf16", "n": n, "k": k, "run": "copy", "ms": copy_ms, "gb_s": copy_gb_s})
        print(f"{n} x {k}: bf16 copy {copy_ms * 1e3:7.1f} us {copy_gb_s:7.0f} GB/s", flush=True)
        for fmt, (moved, runs) in _runs(n, k, "cuda", compile_peer=True).items():
            for label, run in runs.items():
                ms = triton.testing.do_bench_cudagraph(run, rep=TIMED_MS)
                gb_s = moved / ms / 1e6
                rows.append({"format": fmt, "n": n, "k": k, "run": label, "ms": ms, "gb_s": gb_s,
                             "of_copy": gb_s / copy_gb_s})  # fmt: skip
                print(f"{fmt:4} {n} x {k} {label:18} {ms * 1e3:7.1f} us {gb_s:7.0f} GB/s {100 * gb_s / copy_gb_s:5.1f}%"
                      " of copy", flush=True)  # fmt: skip
    record = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}
    report.write_record(args.out, "dequantize-speed", record)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
