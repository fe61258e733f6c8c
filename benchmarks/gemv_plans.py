"""The weight-only split-K GEMV's plans: each candidate GemvPlan forced through scaled_linear's plan=, beside the plan
the GPU takes and cuBLAS's bf16 F.linear on the dequantized weight, at the GEMV's decode shapes of
benchmarks/gemm_table.py (M 1, 4, 16 against N 4096/14336/28672 x K 4096/8192, int8 weights with row scales).
CUDA-graph GPU time through tritonkit.bench.harness.measure_case (inputs rotated past L2 as every bench run).

    python benchmarks/gemv_plans.py --out DIR [--rows 1 16] [--dry-run]

Writes ``<date>-gemv-plans.json`` (the harness's rows) and ``.md``: per M the geometric mean over (N, K) of each
plan's share of the calibrated copy bandwidth on the bytes it moves (x, the int8 weight and its scales, the output),
and each shape's best plan against cuBLAS. ``--dry-run`` runs every candidate once on a small ragged shape under the
CPU interpreter against the spec's float64 reference, no times.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gemm_table import GEMV_M, GEMV_NK  # the benchmarks folder is no package: its own path

# name -> GemvPlan's (block_m, block_n, block_k, warps, stages, programs_per_sm[, options]); min_split_k stays the
# fallback's; options: GemvPlan's words (int8 codes read as int32 words; else byte by byte), last_split_sums (the
# tile's last split sums the partials; else a second launch) and splits (forced; else splits_to_fill). One row
# multiplies in fp32 lanes (block_m 1; its K loop pipelined where stages > 1, asked of the loop); more rows go through
# tl.dot on rows padded to 16, pipelined through shared memory. The candidates swept before (tiles, depths, programs
# a multiprocessor, more splits, words at 16 rows, codes read by halves of K in fp16 products at 1-16 rows (removed
# after 2026-11-30-gemv-plans-halves.md), and the kept counters against a zeroing launch: commit 23d1ccc's
# "tritonkit zeroed counters", which cleared the kept ones before each call) are in the committed results
# (2026-11-28/29/30-gemv-plans*.md; K unsplit with deep pipelines at one row: 2026-11-29-gemv-plans-unsplit.md, whose
# 16 x 512 tile sm90 now takes at N 4096: plan.GEMV_NARROW; tl.dot tiles, depths and programs a multiprocessor at 4
# and 16 rows: 2026-11-30-gemv-plans-rows-tiles.md). Now: more splits at 4 and 16 rows, forced. Nsight Compute at 4
# rows, N 4096 (2026-11-30-ncu-gemv.txt): 512 programs, 0.55 waves, DRAM 35%; at 16 rows splits_to_fill keeps each
# split >= PARTIAL_K_PER_ROW x 16 = 1024 K values, 4 splits of K 4096: 256 programs for 132 multiprocessors.
SUMS = {"last_split_sums": True}
WORDS_SUMS = {"words": True, **SUMS}
CANDIDATES = {
    "r1 32x256 w4 s4 p2 words sums": (1, 32, 256, 4, 4, 2, WORDS_SUMS),  # the split plan, one stage deeper
    "r16 64x128 w4 s3 x4 sums": (16, 64, 128, 4, 3, 4, {"splits": 4, **SUMS}),
    "r16 64x128 w4 s3 x8 sums": (16, 64, 128, 4, 3, 4, {"splits": 8, **SUMS}),
    "r16 64x128 w4 s3 x12 sums": (16, 64, 128, 4, 3, 4, {"splits": 12, **SUMS}),
    "r16 64x128 w4 s3 x16 sums": (16, 64, 128, 4, 3, 4, {"splits": 16, **SUMS}),
    "r16 64x128 w4 s2 x16 sums": (16, 64, 128, 4, 2, 4, {"splits": 16, **SUMS}),
}
MIN_SPLIT_K = 512  # the fewest K values of a split (plan.GEMV_FALLBACK's)


def candidates_for(m: int) -> list[str]:
    """One-row plans for one row; tl.dot plans (16 rows a program) for more."""
    return [name for name, plan in CANDIDATES.items() if (plan[0] == 1) == (m == 1)]


def _plan(name: str):
    from tritonkit.ops.gemm.plan import GemvPlan

    block_m, block_n, block_k, warps, stages, per_sm, *options = CANDIDATES[name]
    return GemvPlan(block_m, block_n, block_k, warps, stages, per_sm, MIN_SPLIT_K, **(options[0] if options else {}))


def _forced(plan):
    import torch

    from tritonkit.ops.gemm.launch import scaled_linear_fwd

    def gemv(x_q, w_q, x_scale, w_scale, *, bias=None, out_dtype=torch.bfloat16, check_inputs=None):
        return scaled_linear_fwd(x_q, w_q, x_scale, w_scale, bias, out_dtype, False, plan=plan)

    return gemv


def _providers(spec, case) -> list:
    from tritonkit.bench.providers import Provider, select_providers

    return [*select_providers(spec, ("tritonkit", "cublas")),
            *(Provider(name, _forced(_plan(name))) for name in candidates_for(case.m))]  # fmt: skip


def cases(rows: tuple[int, ...]) -> list[dict]:
    return [{"m": m, "n": n, "k": k, "w": "int8"} for m in rows for n, k in GEMV_NK]


def dry() -> int:
    import torch

    from tritonkit import catalog

    spec = catalog.get("scaled_linear")
    worst = 0.0
    for m in (1, 5):  # one row, and rows padded to 16
        case = spec.parse_case({"m": m, "n": 72, "k": 1040, "w": "int8"})  # ragged: columns and the last K step
        inputs = spec.make_inputs(case, torch.device("cpu"), torch.float32, torch.Generator().manual_seed(0))
        as64 = [a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in inputs.args]
        expected = spec.reference(*as64, **inputs.kwargs)
        for name in candidates_for(m):
            out = _forced(_plan(name))(*inputs.args, **inputs.kwargs)
            error = ((out.double() - expected).abs().max() / expected.abs().max()).item()
            print(f"M {m} {name:22} max abs error over max |out| {error:.1e}")
            worst = max(worst, error)
    return 0 if worst <= 1e-5 else 1  # fp32 sums of products of exact values


def summary(record: dict) -> str:
    """Per M, the geometric mean over (N, K) of each provider's GB/s on its bytes as a share of the copy bandwidth
    (cuBLAS moves a bf16 weight), and each shape's best plan with cuBLAS's time over its."""
    import torch

    from tritonkit import catalog
    from tritonkit.bench.plan_sweep import fastest, geomean, times

    spec = catalog.get("scaled_linear")
    by = times(record)
    ceiling = record["copy_gbps"] or float("nan")

    def gbps(m, n, k, provider):
        codes = spec.bytes_moved(spec.parse_case({"m": m, "n": n, "k": k, "w": "int8"}), torch.bfloat16)
        n_bytes = 2 * (m * k + n * k + m * n) if provider == "cublas" else codes
        return n_bytes / (by[(m, n, k, provider)] * 1e-3) / 1e9

    lines = [f"Shares of the calibrated copy bandwidth ({ceiling:.0f} GB/s) on each provider's bytes.", "",
             "| M | provider | geomean % of copy | shapes |", "|---|---|---|---|"]  # fmt: skip
    best_lines = [
        "| M | N | K | best | its % of copy | cuBLAS / best | cuBLAS / plan's |",
        "|---|---|---|---|---|---|---|",
    ]
    for m in sorted({key[0] for key in by}):
        for name in sorted({key[3] for key in by if key[0] == m}):
            shares = [gbps(m, n, k, name) / ceiling for n, k in GEMV_NK if (m, n, k, name) in by]
            if shares:
                lines.append(f"| {m} | {name} | {100 * geomean(shares):.0f}% | {len(shares)} |")
        for n, k in GEMV_NK:
            if (found := fastest(by, m, n, k, "cublas")) is None:
                continue
            best, here = found
            plan = f"{here['cublas'] / here['tritonkit']:.2f}x" if "tritonkit" in here else "—"
            share = 100 * gbps(m, n, k, best) / ceiling
            best_lines.append(
                f"| {m} | {n} | {k} | {best} | {share:.0f}% | {here['cublas'] / here[best]:.2f}x | {plan} |"
            )
    return "\n".join(lines) + "\n\n" + "\n".join(best_lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from tritonkit.bench import plan_sweep

    return plan_sweep.main(argv, doc=__doc__, name="gemv-plans", title="W8A16 split-K GEMV plans",
                           spec_name="scaled_linear", default_rows=GEMV_M, cases=cases, providers_for=_providers,
                           candidates=CANDIDATES, summary=summary, dry=dry)  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
