"""Launch plans of the 4-bit linear layers: the tile by how many rows x has, and how many splits of the contraction.

Two schedules share one kernel per direction. Few rows (decoding, M <= 16): a BLOCK_M of 16 (tl.dot's smallest) and
wide K steps; the output has too few tiles to occupy the GPU, so the contraction is split across programs (split-K)
until there are about SPLIT_TARGET_WAVES programs per multiprocessor, and a second kernel adds the splits' fp32
partial sums in order. Many rows: GEMM tiles in grouped order, one split. The same rule serves the input gradient,
whose contraction runs over N.

No table has been measured yet: every architecture takes FALLBACK (not yet run on a GPU), with tiles whose two
operands fit three pipeline stages in the 99 KB of shared memory of sm86/sm89.
"""

from __future__ import annotations

from dataclasses import dataclass

from tritonkit._core.ints import cdiv

MIN_DOT = 16  # tl.dot's smallest side


@dataclass(frozen=True)
class Linear4Tiles:
    block_m: int
    block_n: int  # output columns (forward) or rows of W per step (input gradient)
    block_k: int  # columns of W per step (forward) or output columns (input gradient); even: whole bytes
    warps: int
    stages: int
    group: int  # tile-rows walked together (grouped order), for L2 reuse of the weight
    splits: int = 0  # splits of the contraction; 0: chosen by choose_splits

    def __post_init__(self) -> None:
        # tl.dot takes no side below 16, and a K step of block_k columns is two dots of block_k / 2.
        if min(self.block_m, self.block_n, self.block_k // 2) < MIN_DOT:
            raise ValueError(f"Linear4Tiles: block_m, block_n and block_k / 2 must be >= {MIN_DOT}, got {self}")


# Rows of x (M) -> tiles: the first entry whose bound is >= M.
FALLBACK = (
    (16, Linear4Tiles(16, 64, 128, 4, 3, 1)),  # decoding: tl.dot's smallest M; wide K steps for the weight's bytes
    (64, Linear4Tiles(64, 64, 64, 4, 3, 8)),
    (1 << 62, Linear4Tiles(128, 128, 64, 8, 3, 8)),
)
MEASURED: dict[str, tuple] = {}

SPLIT_TARGET_WAVES = 2  # programs per multiprocessor the splits aim for: one wave hides too little latency
MAX_SPLITS = 16  # the partial sums are S x M x N fp32; beyond 16 their traffic outweighs the parallelism
MAX_PARTIAL_ELEMENTS = 1 << 28  # partial sums stay far below 2**31 elements (int32 offsets in the sum kernel)


def linear4_tiles(arch: str, m: int) -> Linear4Tiles:
    """The tiles for ``m`` rows of x."""
    table = MEASURED.get(arch, FALLBACK)
    return next((tiles for bound, tiles in table if m <= bound), table[-1][1])


def choose_splits(tiles: int, steps: int, outputs: int, sm_count: int) -> int:
    """Splits of a contraction of ``steps`` steps for ``tiles`` output tiles of ``outputs`` elements: enough for about
    SPLIT_TARGET_WAVES programs per multiprocessor, each split at least one step, none empty."""
    wanted = min(MAX_SPLITS, steps, max(1, cdiv(SPLIT_TARGET_WAVES * sm_count, max(tiles, 1))))
    while wanted > 1 and wanted * outputs > MAX_PARTIAL_ELEMENTS:
        wanted //= 2
    steps_per_split = cdiv(steps, max(wanted, 1))
    return cdiv(steps, steps_per_split) if steps else 1
