"""Launch plans of the guide's kernels, by device architecture where one was measured.

- add / add_relu: the shared elementwise launcher's block (sm90: 1024 elements a program, the copy's fastest on the
  H200; docs/kernels/tutorial.md); other GPUs fall back to the same block.
- rgb_to_grey: 32 x 32 pixel tiles everywhere (a lesson on 2-D grids; never tuned).
- matmul: the naive and grouped variants use the fixed tile of tritonkit._core.gemm_plan; the autotuned variant
  searches its space per shape; the persistent one has one Hopper tile per operand width (and runs the variant auto
  picks before Hopper, or where TMA cannot read the operands); ``variant="auto"`` takes the autotuned one on a GPU
  and the grouped one under the interpreter, where autotuning has nothing to measure.
"""

from __future__ import annotations

from dataclasses import dataclass

from tritonkit._core.elementwise import FALLBACK_PLAN, ElementwisePlan
from tritonkit._core.env import kernels_interpreted
from tritonkit._core.ints import cdiv
from tritonkit._core.tma import has_tma

MAX_COPY_BLOCK = 65536  # copy's block_size limit: a 64 K-element block is 256 KB of fp32 registers a program
DEFAULT_GROUP_SIZE = 8  # the grouped variant's tile-rows per group: enough programs to share A's rows in L2
MATMUL_VARIANTS = ("auto", "naive", "grouped", "autotuned", "persistent")

ADD_MEASURED = {"sm90": ElementwisePlan(block_size=1024, warps=4)}


@dataclass(frozen=True)
class ImageTile:
    block_h: int
    block_w: int


IMAGE_TILE = ImageTile(block_h=32, block_w=32)


def add_plan(arch: str) -> ElementwisePlan:
    return ADD_MEASURED.get(arch, FALLBACK_PLAN)


@dataclass(frozen=True)
class PersistentTile:
    block_m: int
    block_n: int
    block_k: int
    warps: int
    stages: int
    group: int
    # C^T = B^T A^T a tile: B's columns on the tensor cores' wide side (64 rows a warpgroup), A's few rows on the
    # narrow side (as few as 8), instead of a tile of A padded to 64 rows.
    swap_ab: bool = False


# The persistent TMA variant's many-rows tile on Hopper (sm90 and newer): 128 x 256 output tiles, K steps of 64, two
# warpgroups, three stages (48 KB a stage in bf16). Under the interpreter small tiles keep tests quick.
PERSISTENT_SM90 = PersistentTile(128, 256, 64, 8, 3, 8)
# fp32 (checking, not speed): the 16-bit tile's stages (96 KB each) and its 128 KB output tile in shared memory for
# the TMA store would pass the H100's 227 KB; 128 x 128 tiles with K steps of 32 take 32 KB a stage.
PERSISTENT_SM90_FP32 = PersistentTile(128, 128, 32, 8, 3, 8)
PERSISTENT_INTERPRETER = PersistentTile(32, 32, 32, 4, 1, 2)

# sm90, 16-bit operands: tile classes by rows of A (the first whose bound is >= M), each widest first. A product with
# few rows is bandwidth-bound on B, and one wide tile per 128 x 256 of the output leaves most multiprocessors idle (N
# 4096 at M 16: 16 tiles for 132), so the launcher takes the widest tile of the class that still gives at least
# PERSISTENT_MIN_WAVE of a tile per multiprocessor, else the narrowest. Measured on the H200 at M 16, 128 and 1024
# over the LLM sweep's (N, K) (benchmarks/matmul_tiles.py, docs/kernels/tutorial.md): the rule picks each shape's
# fastest of 13 tiles, or one within 2% of it.
PERSISTENT_SM90_BY_ROWS: tuple[tuple[int, tuple[PersistentTile, ...]], ...] = (
    # Up to 16 rows: swapped tiles (A's rows on the tensor cores' narrow side, no padding to 64), 128 to 32 of B's
    # columns; the narrower the tile, the longer its K step, to keep 64-128 KB of B in flight a multiprocessor.
    (16, (PersistentTile(16, 128, 128, 4, 4, 8, swap_ab=True), PersistentTile(16, 64, 256, 4, 3, 8, swap_ab=True),
          PersistentTile(16, 32, 256, 4, 4, 8, swap_ab=True))),
    # More rows: 128 x 256 (two warpgroups) down to 64 x 64 (one), 3-4 stages.
    (1 << 62, (PERSISTENT_SM90, PersistentTile(128, 128, 64, 8, 4, 8), PersistentTile(64, 128, 64, 4, 4, 8),
               PersistentTile(64, 64, 128, 4, 4, 8))),
)  # fmt: skip
PERSISTENT_MIN_WAVE = 0.5  # output tiles per multiprocessor below which a narrower tile of the class is taken


def persistent_tile(arch: str, itemsize: int, m: int = 1 << 62, n: int = 1 << 62,
                    multiprocessors: int = 1) -> PersistentTile | None:  # fmt: skip
    """The persistent variant's tile on ``arch`` for ``itemsize``-byte operands, an (``m``, ``n``) output and a GPU
    of ``multiprocessors``, or None where it has no TMA (before Hopper): another variant runs there instead."""
    if kernels_interpreted():
        return PERSISTENT_INTERPRETER
    if not has_tma(arch):
        return None
    if itemsize == 4:
        return PERSISTENT_SM90_FP32
    tiles = next(tiles for bound, tiles in PERSISTENT_SM90_BY_ROWS if m <= bound)
    enough = PERSISTENT_MIN_WAVE * multiprocessors
    return next((t for t in tiles if cdiv(m, t.block_m) * cdiv(n, t.block_n) >= enough), tiles[-1])


def choose_matmul_variant(arch: str, itemsize: int, tma_readable: bool) -> str:
    """The variant ``variant="auto"`` runs: grouped under the interpreter, where autotuning has nothing to time; the
    persistent TMA kernel on Hopper and newer for 16-bit operands that TMA can address (on the H200 at M 16, 128 and
    1024 over the LLM sweep, 0.85-1.0x cuBLAS in geometric mean against the autotuned kernel's 0.66-0.78x); the
    autotuned kernel elsewhere (fp32, whose persistent tile was never timed, and GPUs before Hopper)."""
    if kernels_interpreted():
        return "grouped"
    return "persistent" if tma_readable and itemsize == 2 and has_tma(arch) else "autotuned"
