"""quantize against torch.compile of the same expression and against a copy, one GPU, CUDA-graph GPU time
(triton.testing.do_bench_cudagraph): x (8192, 8192) bf16 to int8 and float8 e4m3 with row, 1 x 128 group and
128 x 128 block scales. Providers in the same run: tritonkit with its plan; the plan's variants forced through plan=
(float8 rounded in fp32 arithmetic instead of by the conversion; the fallback plan's tiles where the GPU's plan
differs: 2048-column chunks of a row and 32-row chunks of a 128 x 128 block, each read twice); torch.compile of
``_core.scales.quantize_reference``, the definition the codes must match; and a copy of x into a preallocated bf16
tensor, the bandwidth ceiling.

    python benchmarks/quantize_speed.py --out DIR [--sweep] [--budget-s 45] [--dry-run]

Prints a table and writes ``<date>-quantize-speed.json`` into DIR: microseconds, GB/s (x read, codes and scales
written), the share of the copy's GB/s, the ratio to torch.compile, and whether the codes and scales equal the
definition's (quantize_reference run eagerly) bit for bit; torch.compile's own need not (Inductor may rewrite the
divisions). Providers not started within BUDGET_S of the first are skipped, so that the run stays
under a minute whatever the compiles cost. ``--dry-run``: every tritonkit provider once on a small ragged x under
the CPU interpreter, its codes checked bit for bit against the definition, no times.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sweep_cli  # the benchmarks folder is no package: its own path

SHAPE = (8192, 8192)
BLOCK = 128  # groups 1 x 128 and blocks 128 x 128, DeepSeek-V3's
FORMS = tuple((fmt, granularity) for fmt in ("int8", "e4m3") for granularity in ("row", "group", "block"))
REP_MS = 10  # 100 ms of replays a point: ~30 points and ~20 compiles within a minute on one H200
BUDGET_S = 45.0  # providers not started within this many seconds are skipped: a compile may follow (limit: a minute)
# --sweep: tiles (rows, columns, warps) timed beside the plan's, by granularity
SWEEP = {
    "row": ((1, 8192, 4), (1, 8192, 16), (2, 8192, 16)),
    "group": ((16, 128, 4), (64, 128, 4), (64, 128, 8), (32, 128, 2)),
    "block": ((128, 128, 4), (128, 128, 16), (64, 128, 8)),
}
DRY_RUN_SHAPE = (300, 520)  # ragged against 128-wide groups and blocks, and against every tile's rows


def _providers(fmt: str, granularity: str, x, sweep: bool = False) -> tuple:
    """(the codes' dtype, name -> a call returning (codes, scale)): tritonkit's plan first, then its variants (and
    the SWEEP tiles if ``sweep``)."""
    import dataclasses

    from tritonkit._core.device import arch
    from tritonkit._core.scales import FORMATS
    from tritonkit.ops.quant.launch import quantize_fwd
    from tritonkit.ops.quant.plan import blocks_plan, groups_plan

    dtype = next(d for d, kind in FORMATS.items() if kind == fmt)
    group = BLOCK if granularity == "group" else x.shape[1]
    default = blocks_plan(arch(x.device), BLOCK) if granularity == "block" else groups_plan(arch(x.device), group)
    plans = {"tritonkit (its plan)": None}
    if fmt != "int8":
        plans["tritonkit, float8 rounded in fp32"] = dataclasses.replace(default, hardware_rounding=False)
    fallback = blocks_plan("sm80", BLOCK) if granularity == "block" else groups_plan("sm80", group)  # no sm80 entry
    if fallback != dataclasses.replace(default, hardware_rounding=False):
        plans["tritonkit, the fallback's tiles"] = dataclasses.replace(
            fallback, hardware_rounding=default.hardware_rounding
        )
    for rows, columns, warps in SWEEP[granularity] if sweep else ():
        tiles = dataclasses.replace(default, block_r=rows, block_c=columns, warps=warps)
        plans[f"tritonkit, {rows} x {columns} tile, {warps} warps"] = tiles
    return dtype, {name: functools.partial(quantize_fwd, x, dtype, granularity, BLOCK, plan=plan)
                   for name, plan in plans.items()}  # fmt: skip


def _same_bits(ours, expected) -> bool:
    """Codes and scales equal bit for bit (NaN codes by NaN-ness: the NaN's bits may differ)."""
    import torch

    (codes, scale), (codes_ref, scale_ref) = ours, expected
    nan = torch.isnan(codes_ref.float())
    bits, bits_ref = codes.view(torch.uint8), codes_ref.view(torch.uint8)
    return bool(torch.equal(scale, scale_ref) and torch.equal(torch.isnan(codes.float()), nan)
                and torch.equal(bits[~nan], bits_ref[~nan]))  # fmt: skip


def dry_run() -> int:
    """Each tritonkit provider once under the interpreter on DRY_RUN_SHAPE, checked against the definition."""
    import torch

    from tritonkit._core.scales import quantize_reference

    x = (torch.randn(DRY_RUN_SHAPE, generator=torch.Generator().manual_seed(0)) * 3).to(torch.bfloat16)
    failures = 0
    for fmt, granularity in FORMS:
        dtype, providers = _providers(fmt, granularity, x, sweep=True)
        expected = quantize_reference(x, dtype, granularity=granularity, block_size=BLOCK)
        for name, run in providers.items():
            same = _same_bits(run(), expected)
            failures += not same
            print(f"{fmt:5} {granularity:6} {name:40} codes {'equal' if same else 'DIFFER'}", flush=True)
    return 1 if failures else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sweep", action="store_true", help="also time the SWEEP tiles")
    parser.add_argument("--budget-s", type=float, default=BUDGET_S, help="skip providers not started by then")
    args = sweep_cli.parse(parser)
    if args.dry_run:
        return dry_run()

    import torch
    import triton
    import triton.testing

    from tritonkit._core.scales import quantize_reference

    start = time.perf_counter()
    x = torch.randn(SHAPE, device="cuda", dtype=torch.bfloat16) * 3
    m, k = SHAPE
    copy_out = torch.empty_like(x)
    copy_ms = triton.testing.do_bench_cudagraph(lambda: copy_out.copy_(x), rep=REP_MS)
    copy_gbps = 2 * x.numel() * x.element_size() / copy_ms / 1e6
    rows = [{"form": "copy", "provider": "bf16 copy_", "ms": copy_ms, "gb_s": copy_gbps}]
    print(f"copy of x (bf16 {m} x {k}): {copy_ms * 1e3:.1f} us, {copy_gbps:.0f} GB/s", flush=True)
    print(f"{'form':12} {'provider':40} {'us':>8} {'GB/s':>7} {'% copy':>7} {'vs compile':>10} {'bits':>5}")
    for fmt, granularity in FORMS:
        dtype, providers = _providers(fmt, granularity, x, sweep=args.sweep)
        compiled = torch.compile(functools.partial(quantize_reference, x, dtype=dtype, granularity=granularity,
                                                   block_size=BLOCK), dynamic=False)  # fmt: skip
        runs = {"torch.compile (reference)": compiled, **providers}
        compile_ms, expected = None, quantize_reference(x, dtype, granularity=granularity, block_size=BLOCK)
        for name, run in runs.items():
            form = f"{fmt} {granularity}"
            if time.perf_counter() - start > args.budget_s:
                rows.append({"form": form, "provider": name, "skipped": f"not started within {args.budget_s:.0f} s"})
                print(f"{form:12} {name:40} skipped: time budget", flush=True)
                continue
            result = run()
            same = _same_bits(result, expected)
            ms = triton.testing.do_bench_cudagraph(run, rep=REP_MS)
            codes, scale = result
            gb_s = (x.numel() * x.element_size() + codes.numel() + 4 * scale.numel()) / ms / 1e6
            compile_ms = ms if name.startswith("torch.compile") else compile_ms
            ratio = compile_ms / ms if compile_ms else float("nan")
            rows.append({"form": form, "provider": name, "ms": ms, "gb_s": gb_s, "of_copy": gb_s / copy_gbps,
                         "vs_compile": ratio, "bits_equal_definition": same})  # fmt: skip
            print(f"{form:12} {name:40} {ms * 1e3:8.1f} {gb_s:7.0f} {100 * gb_s / copy_gbps:6.0f}% {ratio:10.2f} "
                  f"{'yes' if same else 'no':>5}", flush=True)  # fmt: skip
    record = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "shape": SHAPE, "block": BLOCK, "copy_gb_s": copy_gbps, "rows": rows}  # fmt: skip
    from tritonkit.bench import report  # after --dry-run has set the interpreter up

    report.write_record(args.out, "quantize-speed", record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
