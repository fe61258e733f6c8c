"""The persistent TMA bf16 matmul's tiles by rows of A: each candidate tile forced through the launcher's plan=, beside
the tile the plan picks, the autotuned variant and cuBLAS (torch.matmul) in the same run, over the LLM sweep's (N, K)
of benchmarks/gemm_table.py at few rows (M 16 to 512), F.linear's layout (the weight row-major, read transposed).
CUDA-graph GPU time through tritonkit.bench.harness.measure_case (inputs rotated past L2 as every bench run).

    python benchmarks/matmul_tiles.py --out DIR [--rows 16 128] [--dry-run]

Writes ``<date>-matmul-tiles.json`` (the harness's rows: ms, TFLOP/s, the speed-up over the best peer) and
``<date>-matmul-tiles.md``: per M the geometric mean over (N, K) of cuBLAS's time over each candidate's, and the best
candidate per shape. ``--dry-run`` runs every candidate once on a small ragged shape under the CPU interpreter against
the float64 product, no times.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gemm_table import LLM_NK  # the benchmarks folder is no package: its own path

ROWS = (16, 32, 64, 128, 256, 512)
# name -> (block_m, block_n, block_k, warps, stages, swap_ab). "s": C^T = B^T A^T a tile (A's rows on the tensor
# cores' narrow side), "p": plain. Stages fill about 80-170 KB of shared memory.
CANDIDATES = {
    "s16x64x128 w4 s4": (16, 64, 128, 4, 4, True),
    "s16x64x256 w4 s3": (16, 64, 256, 4, 3, True),
    "s16x128x128 w4 s4": (16, 128, 128, 4, 4, True),
    "s16x32x256 w4 s4": (16, 32, 256, 4, 4, True),
    "p16x64x128 w4 s4": (16, 64, 128, 4, 4, False),
    "s32x64x128 w4 s4": (32, 64, 128, 4, 4, True),
    "s32x128x128 w4 s3": (32, 128, 128, 4, 3, True),
    "s64x128x64 w4 s4": (64, 128, 64, 4, 4, True),
    "p64x64x128 w4 s4": (64, 64, 128, 4, 4, False),
    "p64x128x64 w4 s4": (64, 128, 64, 4, 4, False),
    "p64x256x64 w4 s3": (64, 256, 64, 4, 3, False),
    "p128x128x64 w8 s4": (128, 128, 64, 8, 4, False),
    "p128x256x64 w8 s3": (128, 256, 64, 8, 3, False),
}
GROUP = 8  # tile-rows walked together (the plan's)


def candidates_for(m: int) -> list[str]:
    """The candidates worth timing at ``m`` rows: tiles at most four times as tall as the product."""
    return [name for name, tile in CANDIDATES.items() if tile[0] <= 4 * max(m, 16)]


def _tile(name: str):
    from tritonkit.ops.tutorial.plan import PersistentTile

    block_m, block_n, block_k, warps, stages, swap = CANDIDATES[name]
    return PersistentTile(block_m, block_n, block_k, warps, stages, GROUP, swap_ab=swap)


def _forced(tile):
    from tritonkit.ops.tutorial.launch import matmul_fwd

    return lambda a, b: matmul_fwd(a, b, "persistent", None, plan=tile)


def _providers(spec, case) -> list:
    from tritonkit import catalog
    from tritonkit.bench.providers import Provider, select_providers

    return [*select_providers(spec, ("tritonkit", "torch")), Provider("autotuned", catalog.get("matmul_autotuned").fn),
            *(Provider(name, _forced(_tile(name))) for name in candidates_for(case.m))]  # fmt: skip


def cases(rows: tuple[int, ...]) -> list[dict]:
    return [{"m": m, "n": n, "k": k, "b_transposed": True} for m in rows for n, k in LLM_NK]


def dry() -> int:
    import torch

    torch.manual_seed(0)
    m, n, k = 40, 200, 96  # ragged against every candidate: rows, columns and the last K step
    a = torch.randn(m, k).to(torch.bfloat16)
    w = torch.randn(n, k).to(torch.bfloat16)
    expected = a.double() @ w.double().t()
    worst = 0.0
    for name in CANDIDATES:
        error = (_forced(_tile(name))(a, w.t()).double() - expected).abs().max().item() / expected.abs().max().item()
        print(f"{name:20} max abs error over max |C| {error:.1e}")
        worst = max(worst, error)
    return 0 if worst <= 2**-7 else 1  # one bf16 ulp: the interpreter truncates fp32 to bf16


def summary(record: dict) -> str:
    """Per M, the geometric mean over (N, K) of cuBLAS's time over each provider's; then each shape's best tile."""
    from tritonkit.bench.plan_sweep import peer_ratio_summary

    return peer_ratio_summary(record, LLM_NK, "torch", "cuBLAS")


def main(argv: list[str] | None = None) -> int:
    from tritonkit.bench import plan_sweep

    return plan_sweep.main(argv, doc=__doc__, name="matmul-tiles", title="Persistent matmul tiles by rows",
                           spec_name="matmul_persistent", default_rows=ROWS, cases=cases, providers_for=_providers,
                           candidates=CANDIDATES, summary=summary, dry=dry)  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
