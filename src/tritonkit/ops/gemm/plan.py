"""Launch plans of the scaled GEMMs: output tile, K step, warps and pipeline depth, by architecture and by how many
rows x has (a decode step's few rows take narrow tiles, or most of each tile would be padding).

No table has been measured yet: every architecture takes FALLBACK, tiles that fit the 99 KB of shared memory of
sm86/sm89 at three stages with one-byte operands (two 128 x 64 tiles: 16 KB a stage).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GemmTiles:
    block_m: int
    block_n: int
    block_k: int  # at most the scale group along K, when a scale varies along K
    warps: int
    stages: int
    group: int  # tile-rows walked together (grouped order), for L2 reuse of w


# Rows of x (M) -> tiles: the first entry whose bound is >= M.
FALLBACK = (
    (16, GemmTiles(16, 64, 128, 4, 3, 1)),  # decoding: tl.dot's smallest M; no grouping with one tile-row
    (64, GemmTiles(64, 64, 128, 4, 3, 8)),
    (1 << 62, GemmTiles(128, 128, 64, 8, 3, 8)),
)
MEASURED: dict[str, tuple] = {}


def gemm_tiles(arch: str, m: int) -> GemmTiles:
    """The tiles for ``m`` rows of x."""
    table = MEASURED.get(arch, FALLBACK)
    return next((tiles for bound, tiles in table if m <= bound), table[-1][1])
