"""Launch plans of quantize and dequantize: tile shapes of memory-bound kernels that read x once or twice.

Every architecture shares one table until a GPU sweep replaces it: tiles of about 4096 elements per program (16 KB of
fp32 in registers with 4 warps), which any CUDA GPU holds without spilling.
"""

from __future__ import annotations

from dataclasses import dataclass

from tritonkit._core.ints import next_power_of_2

TILE_ELEMENTS = 4096  # elements per program tile: 32 fp32 registers a thread at 4 warps
MAX_COLUMNS = 2048  # a wider group (or row) is read in chunks of this many columns


@dataclass(frozen=True)
class QuantPlan:
    block_r: int  # rows per tile
    block_c: int  # columns per tile (a group wider than this is read in chunks)
    warps: int


def groups_plan(arch: str, group: int) -> QuantPlan:
    """Tiles for groups of ``group`` columns (a row: all the columns): as wide as the group up to MAX_COLUMNS, as
    many rows as fill TILE_ELEMENTS."""
    block_c = min(next_power_of_2(max(group, 1)), MAX_COLUMNS)
    return QuantPlan(max(1, TILE_ELEMENTS // block_c), block_c, 4)


def blocks_plan(arch: str, block: int) -> QuantPlan:
    """Row chunks of a block x block block: block columns, as many rows as fill TILE_ELEMENTS."""
    return QuantPlan(max(1, min(block, TILE_ELEMENTS // block)), block, 4)


def elementwise_plan(arch: str, n_cols: int) -> QuantPlan:
    """Tiles of dequantize and of the tensor's amax."""
    block_c = min(next_power_of_2(max(n_cols, 1)), 1024)
    return QuantPlan(max(1, TILE_ELEMENTS // block_c), block_c, 4)
