"""Launch plans of quantize and dequantize: tile shapes of memory-bound kernels that read x once (a region that
fits one tile) or twice (a wider one), and how float8 values are rounded.

Every architecture shares one table of tiles until a GPU sweep replaces it: tiles of about 4096 elements per program
(16 KB of fp32 in registers with 4 warps), which any CUDA GPU holds without spilling; a 128 x 128 block is read
twice in 32-row chunks (on an H200 one 16384-element tile at 8 warps, read once, measured slower:
docs/kernels/quant.md). Float8 rounding by the conversion instruction needs
sm_89 or newer; older GPUs (and the interpreter) round in fp32 arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass

from tritonkit._core.device import converts_to_float8_rounding
from tritonkit._core.ints import next_power_of_2

TILE_ELEMENTS = 4096  # elements per program tile: 32 fp32 registers a thread at 4 warps
MAX_COLUMNS = 2048  # a wider group (or row) is read in chunks of this many columns, twice


@dataclass(frozen=True)
class QuantPlan:
    block_r: int  # rows per tile
    block_c: int  # columns per tile (a group wider than this is read in chunks)
    warps: int
    # float8 codes rounded by the conversion (cvt.rn.satfinite, one instruction for two values) instead of in fp32
    # arithmetic first (about a dozen instructions a value): the same codes. The interpreter always takes the fp32
    # arithmetic (its own conversion rounds wrongly).
    hardware_rounding: bool = False


@dataclass(frozen=True)
class FourBitDequantizePlan:
    values: int  # output values per program: whole NF4 blocks (one when a block is larger), or int4 rows of `columns`
    columns: int  # int4: a tile's width (whole groups) before it takes more rows
    warps: int


# Every architecture: 4096 values a program, an 8 KB bf16 tile out at 4 warps, as the 4-bit layers' dequantize-first
# tile (32 x 128) whose size benchmarks/dequantize_speed.py sweeps beside these ops; int4 rows up to 1024 columns.
FOURBIT_DEQUANTIZE = FourBitDequantizePlan(values=4096, columns=1024, warps=4)


def hardware_rounding(arch: str) -> bool:
    """Whether GPUs of ``arch`` ("sm90") round to float8 in their conversion instruction."""
    return converts_to_float8_rounding(arch)


def groups_plan(arch: str, group: int) -> QuantPlan:
    """Tiles for groups of ``group`` columns (a row: all the columns): as wide as the group up to MAX_COLUMNS, as
    many rows as fill TILE_ELEMENTS."""
    block_c = min(next_power_of_2(max(group, 1)), MAX_COLUMNS)
    return QuantPlan(max(1, TILE_ELEMENTS // block_c), block_c, 4, hardware_rounding(arch))


def blocks_plan(arch: str, block: int) -> QuantPlan:
    """Row chunks of a block x block block, block columns wide: the whole block up to TILE_ELEMENTS (read once),
    else as many rows as fill TILE_ELEMENTS (read twice)."""
    if block * block <= TILE_ELEMENTS:
        return QuantPlan(block, block, 4, hardware_rounding(arch))
    return QuantPlan(max(1, TILE_ELEMENTS // block), block, 4, hardware_rounding(arch))


def elementwise_plan(arch: str, n_cols: int) -> QuantPlan:
    """Tiles of dequantize and of the tensor's amax."""
    block_c = min(next_power_of_2(max(n_cols, 1)), 1024)
    return QuantPlan(max(1, TILE_ELEMENTS // block_c), block_c, 4)
