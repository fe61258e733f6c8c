"""scaled_linear's tiled kernel for float8 (or int8) codes with row scales at few to a few hundred rows (M 32 to 512,
where the plan's 128 x 128 tiles leave most multiprocessors idle: 56 programs at M 128, N 7168 on an H100's 132):
each candidate tile forced through the launcher's plan=, beside the plan's tiles and torch._scaled_mm (int8:
torch._int_mm alone, unscaled, and with its scaling op) on the same codes and scales in the same run. CUDA-graph GPU
time through tritonkit.bench.harness.measure_case (inputs rotated past L2).

    python benchmarks/code_tiles.py --out DIR [--codes e4m3|int8] [--rows 128 512] [--dry-run]

Writes ``<date>-code-tiles.json`` (int8: ``-code-tiles-int8``; the harness's rows) and ``.md``: per M the geometric
mean over (N, K) of the peer's time over each candidate's, and the best candidate per shape. ``--dry-run`` runs
every candidate once on a small ragged shape, float8 and int8, under the CPU interpreter against the float64 product
of the dequantized operands, no times.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

ROWS = (32, 64, 128, 256, 512)
NK = ((4096, 4096), (14336, 4096), (4096, 14336), (7168, 7168))  # (N, K): Llama 8B's MLP and DeepSeek-V3's square
# GemmTiles' (block_m, block_n, block_k, warps, stages), each named "MxNxK wW sS"; K steps of 128 (the float8 step
# measured best at 8192^3) unless said; float8 operands take 24-48 KB a stage.
TILES = (
    (128, 128, 128, 8, 3),
    (128, 128, 128, 8, 4),
    (128, 64, 128, 8, 4),
    (128, 64, 128, 4, 4),
    (64, 128, 128, 4, 4),
    (64, 128, 128, 8, 4),
    (64, 256, 128, 8, 3),
    (64, 64, 128, 4, 4),
    (32, 128, 128, 4, 4),
    # Narrower and deeper tiles for 32-64 rows, where 64 x 64 tiles give 64 programs at N 4096 for 132
    # multiprocessors.
    (64, 32, 128, 4, 4),
    (32, 64, 128, 4, 4),
    (64, 64, 256, 4, 3),
    (32, 64, 256, 4, 3),
)
CANDIDATES = {f"{m}x{n}x{k} w{warps} s{stages}": (m, n, k, warps, stages) for m, n, k, warps, stages in TILES}
GROUP = 8  # tile-rows walked together (the plan's)
# codes -> (the spec's peer, its name, other providers); int8's peer is _int_mm alone (unscaled: the floor), its
# scaled form beside it.
PEERS = {"e4m3": ("scaled_mm", "_scaled_mm", ()), "int8": ("int_mm_bare", "bare _int_mm", ("int_mm",))}


def candidates_for(m: int) -> list[str]:
    """The candidates worth timing at ``m`` rows: tiles at most four times as tall as the product."""
    return [name for name, tile in CANDIDATES.items() if tile[0] <= 4 * m]


def _tiles(name: str):
    from tritonkit.ops.gemm.plan import GemmTiles

    return GemmTiles(*CANDIDATES[name], GROUP)


def _forced(tiles):
    import torch

    from tritonkit.ops.gemm.launch import scaled_linear_fwd

    def tiled(x_q, w_q, x_scale, w_scale, *, bias=None, out_dtype=torch.bfloat16, check_inputs=None):
        return scaled_linear_fwd(x_q, w_q, x_scale, w_scale, bias, out_dtype, False, plan=tiles)

    return tiled


def _providers(spec, case) -> list:
    from tritonkit.bench.providers import Provider, select_providers

    peer, _, others = PEERS[case.x]
    return [*select_providers(spec, ("tritonkit", peer, *others)),
            *(Provider(name, _forced(_tiles(name))) for name in candidates_for(case.m))]  # fmt: skip


def _case(m: int, n: int, k: int, codes: str = "e4m3") -> dict:
    return {"m": m, "n": n, "k": k, "x": codes, "w": codes, "x_scale": "row", "w_scale": "row"}


def cases_of(codes: str):
    return lambda rows: [_case(m, n, k, codes) for m in rows for n, k in NK]


def dry() -> int:
    import torch

    from tritonkit import catalog

    spec = catalog.get("scaled_linear")
    worst = 0.0
    for codes in PEERS:
        case = spec.parse_case(_case(40, 200, 300, codes))  # ragged against every candidate: rows, columns, last K step
        inputs = spec.make_inputs(case, torch.device("cpu"), torch.float32, torch.Generator().manual_seed(0))
        as64 = [a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in inputs.args]
        expected = spec.reference(*as64, **inputs.kwargs)
        for name in CANDIDATES:
            out = _forced(_tiles(name))(*inputs.args, **inputs.kwargs)
            error = ((out.double() - expected).abs().max() / expected.abs().max()).item()
            print(f"{codes:5} {name:20} max abs error over max |out| {error:.1e}")
            worst = max(worst, error)
    return 0 if worst <= 1e-5 else 1  # fp32 sums of products of exact values


def summary_of(codes: str):
    """Per M, the geometric mean over (N, K) of the peer's time over each provider's; then each shape's best."""
    from tritonkit.bench.plan_sweep import peer_ratio_summary

    return lambda record: peer_ratio_summary(record, NK, *PEERS[codes][:2])


def main(argv: list[str] | None = None) -> int:
    import argparse

    from tritonkit.bench import plan_sweep

    # --codes is this sweep's own option; the rest is the frame's (its --help lists them).
    own = argparse.ArgumentParser(add_help=False)
    own.add_argument("--codes", choices=tuple(PEERS), default="e4m3", help="the codes of x and w (row scales)")
    args, rest = own.parse_known_args(argv)
    label = {"e4m3": "float8", "int8": "int8"}[args.codes]
    return plan_sweep.main(rest, doc=__doc__, name="code-tiles" + ("" if args.codes == "e4m3" else f"-{args.codes}"),
                           title=f"Tiles for {label} codes with row scales by rows", spec_name="scaled_linear",
                           default_rows=ROWS, cases=cases_of(args.codes), providers_for=_providers,
                           candidates=CANDIDATES, summary=summary_of(args.codes), dry=dry)  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
