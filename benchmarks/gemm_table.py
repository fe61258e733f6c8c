"""GEMMs and quantization against their peers in one run, CUDA-graph GPU time (tritonkit.bench.harness.measure_case):

- the persistent TMA bf16 matmul (and the autotuned one) against cuBLAS (torch.matmul) at 8192^3 and over an LLM
  sweep: M from 16 to 16384 against (N, K) of Llama 3 8B and 70B and Qwen 2.5 layers, F.linear's layout (the weight
  row-major, read transposed), and odd sizes;
- scaled_linear in float8 with row scales and with tensor scales against torch._scaled_mm, with 1 x 128 by 128 x 128
  block scales on DeepSeek-V3 shapes (against _scaled_mm's blockwise mode where this torch has it, and torchao's
  Triton block-scaled GEMM, DeepSeek-V3's kernel, where its wheel is installed), int8 W8A8 against torch._int_mm
  plus its scaling and _int_mm alone (unscaled int32, the floor);
- weight-only (W8A16) at M 1, 4 and 16, the split-K GEMV's shapes (N 4096/14336/28672, K 4096/8192, int8 rows and
  float8 1 x 128 groups), against cuBLAS's bf16 F.linear on the dequantized weight and tritonkit's tiled kernel on the
  same call ("tiled"); these rows also get a table of the GB/s of the bytes each provider reads (the dense layer reads
  a bf16 weight) and its share of the calibrated copy bandwidth;
- quantize against torch.compile of the same expression (its reference).

    python benchmarks/gemm_table.py --out DIR [--quick] [--matmul-only] [--dry-run]

Writes into DIR ``<date>-gemm-table.json`` and ``.md`` (every measurement, with plots) and
``<date>-gemm-table-peers.md``: tritonkit's speed-up over each row's peer, the geometric mean of the LLM sweep, and the
W8A16 bandwidth table.
``--dry-run`` runs each provider once on tiny shapes on the CPU (TRITON_INTERPRET=1) and compares it with the
spec's reference; no times.
"""

from __future__ import annotations

import argparse
import datetime
import math
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Row:
    group: str  # the section of the comparison
    spec: str
    case: dict
    peer: str  # the provider tritonkit's ratio is taken against
    providers: tuple = ()

    def all_providers(self) -> tuple:
        return ("tritonkit", self.peer, *self.providers)


# (N, K) of LLM linear layers: Llama 3 8B (q/o, gate/up, down), Llama 3 70B (q/o, gate/up, down), Qwen 2.5 7B.
LLM_NK = ((4096, 4096), (14336, 4096), (4096, 14336), (8192, 8192), (28672, 8192), (8192, 28672), (3584, 3584),
          (18944, 3584))  # fmt: skip
LLM_M = (16, 128, 1024, 4096, 16384)
# The split-K GEMV's rows (weight-only at M <= 16): decode steps of Llama 3 8B and 70B layers.
GEMV_M = (1, 4, 16)
GEMV_NK = ((4096, 4096), (14336, 4096), (28672, 4096), (4096, 8192), (14336, 8192), (28672, 8192))
GEMV_INT8 = "W8A16 GEMV, int8 rows"
GEMV_FP8 = "W8A16 GEMV, e4m3 1x128 groups"


def rows(quick: bool) -> list[Row]:
    out = [Row("matmul 8192^3", "matmul_persistent", {"m": 8192, "n": 8192, "k": 8192}, "torch",
               ("matmul_autotuned",))]  # fmt: skip
    sweep_m = (16, 4096) if quick else LLM_M
    sweep_nk = LLM_NK[:2] if quick else LLM_NK
    for m in sweep_m:
        for n, k in sweep_nk:
            out.append(Row("matmul LLM sweep", "matmul_persistent", {"m": m, "n": n, "k": k, "b_transposed": True},
                           "torch"))  # fmt: skip
    if not quick:
        for m, n, k in ((4097, 4095, 4096), (1000, 1001, 999), (8191, 8193, 4096)):
            out.append(Row("matmul odd sizes", "matmul_persistent", {"m": m, "n": n, "k": k}, "torch"))
    fp8 = {"x": "e4m3", "w": "e4m3"}
    for m in (2048, 8192) if not quick else (4096,):
        out.append(Row("fp8 row", "scaled_linear", {"m": m, "n": 8192, "k": 8192, **fp8}, "scaled_mm"))
        out.append(Row("fp8 tensor", "scaled_linear", {"m": m, "n": 8192, "k": 8192, **fp8, "x_scale": "tensor",
                                                        "w_scale": "tensor"}, "scaled_mm"))  # fmt: skip
        out.append(Row("int8 W8A8 row", "scaled_linear", {"m": m, "n": 8192, "k": 8192, "x": "int8", "w": "int8"},
                       "int_mm", ("int_mm_bare",)))  # fmt: skip
    for m in (2048, 4096) if not quick else (4096,):
        for n, k in ((7168, 7168), (2112, 7168), (24576, 1536)) if not quick else ((7168, 7168),):
            out.append(
                Row(
                    "fp8 1x128 / 128x128 blocks",
                    "scaled_linear",
                    {"m": m, "n": n, "k": k, **fp8, "x_scale": "group", "w_scale": "block"},
                    "scaled_mm",
                    ("torchao",),
                )
            )
    gemv_shapes = ((4096, 4096), (14336, 4096)) if quick else GEMV_NK
    for m in (1, 16) if quick else GEMV_M:
        for n, k in gemv_shapes:
            out.append(Row(GEMV_INT8, "scaled_linear", {"m": m, "n": n, "k": k, "w": "int8"}, "cublas", ("tiled",)))
        if not quick:
            out.append(Row(GEMV_FP8, "scaled_linear", {"m": m, "n": 14336, "k": 4096, "w": "e4m3", "w_scale": "group"},
                           "cublas", ("tiled",)))  # fmt: skip
    for shape, fmt, granularity in (((16384, 4096), "e4m3", "group"), ((16384, 4096), "int8", "row"),
                                    ((8192, 8192), "e4m3", "block")):  # fmt: skip
        out.append(Row("quantize", "quantize", {"shape": shape, "fmt": fmt, "granularity": granularity},
                       "torch.compile"))  # fmt: skip
    return out


def tiny(row: Row) -> Row:
    case = dict(row.case)
    if "shape" in case:
        case["shape"] = (40, 256)
    else:
        case.update(m=min(case["m"], 24), n=48, k=256)
    return Row(row.group, row.spec, case, row.peer, row.providers)


# ---------------------------------------------------------------- running


def _tiled_scaled_linear():
    """scaled_linear through its tiled kernel whatever the rows (a weight-only call of <= 16 rows takes the GEMV)."""
    import torch

    from tritonkit._core.device import arch
    from tritonkit.ops.gemm.launch import scaled_linear_fwd
    from tritonkit.ops.gemm.plan import gemm_tiles

    def tiled(x_q, w_q, x_scale, w_scale, *, bias=None, out_dtype=torch.bfloat16, check_inputs=None):
        tiles = gemm_tiles(arch(x_q.device), x_q.numel() // x_q.shape[-1])
        return scaled_linear_fwd(x_q, w_q, x_scale, w_scale, bias, out_dtype, False, plan=tiles)

    return tiled


def _providers(spec, names):
    from tritonkit import catalog
    from tritonkit.bench.providers import Provider, select_providers

    chosen = []
    for name in names:
        if name.startswith("matmul_"):  # another variant of the ladder, as a provider of this row
            chosen.append(Provider(name, catalog.get(name).fn))
        elif name == "tiled":
            chosen.append(Provider(name, _tiled_scaled_linear()))
        else:
            chosen += select_providers(spec, (name,))
    return chosen


def timed(table: list[Row]) -> tuple[list, object]:
    import torch

    from tritonkit import catalog
    from tritonkit.bench import calibrate
    from tritonkit.bench.harness import measure_case

    ceilings = calibrate.load_or_calibrate()
    results = []
    for index, row in enumerate(table, 1):
        print(f"[{index}/{len(table)}] {row.group}: {row.case}", file=sys.stderr, flush=True)
        spec = catalog.get(row.spec)
        results += measure_case(spec, spec.parse_case(row.case), torch.bfloat16, "fwd",
                                _providers(spec, row.all_providers()), ceilings, cuda_graph=True)  # fmt: skip
    return results, ceilings


def dry(table: list[Row]) -> list:
    import torch

    from tritonkit import catalog
    from tritonkit.bench.harness import Measurement

    results = []
    for row in map(tiny, table):
        spec = catalog.get(row.spec)
        case = spec.parse_case(row.case)
        for provider in _providers(spec, row.all_providers()):
            measurement = Measurement(spec.name, spec.family, dict(case), spec.case_id(case), "bfloat16", "fwd",
                                      provider.name)  # fmt: skip
            results.append(measurement)
            if provider.fn is None:
                measurement.skipped = provider.skip_reason
                continue
            inputs = spec.make_inputs(case, "cpu", torch.bfloat16, torch.Generator().manual_seed(0))
            try:
                out = provider.fn(*inputs.args, **inputs.kwargs)
            except Exception as error:  # recorded as the GPU run records it
                measurement.skipped = f"failed: {type(error).__name__}: {str(error).splitlines()[0][:160]}"
                continue
            out = out[0] if isinstance(out, tuple) else out
            as64 = [a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in inputs.args]
            expected = spec.reference(*as64, **inputs.kwargs)
            expected = expected[0] if isinstance(expected, tuple) else expected
            error = (out.double() - expected.double()).abs().max().item()
            measurement.skipped = f"dry run: ran; max abs error {error:.1e} against the reference"
    return results


# ---------------------------------------------------------------- the comparison


def comparison(results: list[dict], table: list[Row]) -> str:
    from tritonkit import catalog

    by = {(r["spec"], r["case_id"], r["provider"]): r for r in results}
    lines = ["| group | case | tritonkit | peer | peer's time / tritonkit's |", "|---|---|---|---|---|"]
    sweep = []
    for row in table:
        spec = catalog.get(row.spec)
        case_id = spec.case_id(spec.parse_case(row.case))
        ours, theirs = by.get((row.spec, case_id, "tritonkit")), by.get((row.spec, case_id, row.peer))

        def cell(found):
            if not found:
                return "—"
            if found.get("ms") is None:
                return f"({found.get('skipped') or 'not timed'})"
            rate = found.get("tflops") if found.get("unit") == "TFLOP/s" else found.get("gbps")
            return f"{rate:.0f} {found.get('unit')}" if rate else f"{found['ms']:.3f} ms"

        ratio = "—"
        if ours and theirs and ours.get("ms") and theirs.get("ms"):
            ratio = f"{theirs['ms'] / ours['ms']:.2f}x"
            if row.group == "matmul LLM sweep":
                sweep.append(theirs["ms"] / ours["ms"])
        lines.append(f"| {row.group} | {case_id} | {cell(ours)} | {row.peer}: {cell(theirs)} | {ratio} |")
    if sweep:
        geomean = math.exp(sum(math.log(r) for r in sweep) / len(sweep))
        lines += ["", f"LLM sweep, geometric mean of cuBLAS's time over the persistent kernel's: {geomean:.2f}x "
                      f"({len(sweep)} shapes)."]  # fmt: skip
    return "\n".join(lines) + "\n"


def gemv_bandwidth(results: list[dict], table: list[Row], copy_gbps: float | None) -> str:
    """The W8A16 rows in GB/s of the bytes each provider reads and writes (the spec's model: x, the weight's codes and
    scales, the output; for the dense peer x, a bf16 weight and the output) and as a share of the copy bandwidth."""
    import torch

    from tritonkit import catalog

    by = {(r["spec"], r["case_id"], r["provider"]): r for r in results}
    names = {"tritonkit": "GEMV", "tiled": "tiled", "cublas": "cuBLAS bf16"}
    lines = ["| weight | M | N x K | " + " | ".join(names.values()) + " | cuBLAS's time / GEMV's |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for row in (r for r in table if r.group in (GEMV_INT8, GEMV_FP8)):
        spec = catalog.get(row.spec)
        case = spec.parse_case(row.case)
        case_id = spec.case_id(case)
        codes = spec.bytes_moved(case, torch.bfloat16)
        rows = math.prod(case.lead) * case.m
        cells = []
        for provider in names:
            found = by.get((row.spec, case_id, provider)) or {}
            if found.get("ms") is None:
                cells.append(f"({found.get('skipped') or 'not timed'})" if found else "—")
                continue
            n_bytes = codes if provider != "cublas" else 2 * (rows * case.k + case.n * case.k + rows * case.n)
            gbps = n_bytes / (found["ms"] * 1e-3) / 1e9
            cells.append(f"{gbps:.0f} GB/s" + (f" ({100 * gbps / copy_gbps:.0f}%)" if copy_gbps else ""))
        ours, dense = by.get((row.spec, case_id, "tritonkit")), by.get((row.spec, case_id, "cublas"))
        ratio = f"{dense['ms'] / ours['ms']:.2f}x" if ours and dense and ours.get("ms") and dense.get("ms") else "—"
        lines.append(f"| {case.w} {case.w_scale} | {case.m} | {case.n} x {case.k} | {' | '.join(cells)} | {ratio} |")
    share = f"% of the calibrated copy bandwidth, {copy_gbps:.0f} GB/s" if copy_gbps else "no calibrated ceiling"
    return "\n".join(lines) + f"\n\nGB/s of the bytes each provider moves; {share}.\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--quick", action="store_true", help="a few rows of each group")
    parser.add_argument("--matmul-only", action="store_true", help="the persistent bf16 matmul's rows alone")
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU, each provider once")
    args = parser.parse_args(argv)
    table = rows(args.quick or args.dry_run)
    if args.matmul_only:
        table = [row for row in table if row.spec.startswith("matmul")]
    date = datetime.date.today().isoformat()
    stem = f"{date}-gemm-table"
    from tritonkit.bench import report

    if args.dry_run:
        results, ceilings = dry(table), None
        table = [tiny(row) for row in table]
    else:
        import torch

        if not torch.cuda.is_available():
            parser.error("timing needs a CUDA GPU (--dry-run checks the script on the CPU)")
        results, ceilings = timed(table)
    meta = {"what": "gemm-table", "date": date, **report.environment(args.dry_run),
            "command": report.script_command(argv), "dtype": "bfloat16", "cuda_graph": not args.dry_run,
            "sizes": "given cases", "dry_run": args.dry_run}  # fmt: skip
    paths = report.write_all(args.out, stem, results, meta, ceilings)
    peers = args.out / f"{stem}-peers.md"
    timing = "dry run" if args.dry_run else "CUDA-graph GPU time"
    as_dicts = [r.to_dict() for r in results]
    copy_gbps = ceilings.bandwidth_gbps if ceilings is not None else None
    bandwidth = gemv_bandwidth(as_dicts, table, copy_gbps)
    peers.write_text(f"# GEMMs and quantization against their peers ({timing})\n\n" + comparison(as_dicts, table)
                     + f"\n## W8A16 at decode sizes: bandwidth\n\n{bandwidth}")  # fmt: skip
    print("\n".join(str(p) for p in [*paths, peers]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
