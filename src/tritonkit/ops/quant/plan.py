"""Launch plans of quantize and dequantize: tile shapes of memory-bound kernels that read x once (a region that
fits one tile) or twice (a wider one), and how float8 values are rounded.

The fallback for every architecture (and an unknown GPU): tiles of about 4096 elements per program (16 KB of fp32 in
registers with 4 warps), which any CUDA GPU holds without spilling; a group wider than 2048 columns and a 128 x 128
block are read twice in chunks. Hopper (sm90) reads them once, which measured faster than the chunks on the H200
(docs/kernels/quant.md, Launch plans): a group (a row) of up to 8192 columns in one tile at 1024 elements a warp,
a 128 x 128 block in one tile at 8 warps. Float8 rounding by the conversion instruction needs sm_89 or newer; older
GPUs (and the interpreter) round in fp32 arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass

from tritonkit._core.device import converts_to_float8_rounding
from tritonkit._core.ints import next_power_of_2

TILE_ELEMENTS = 4096  # elements per program tile: 32 fp32 registers a thread at 4 warps
MAX_COLUMNS = 2048  # a wider group (or row) is read in chunks of this many columns, twice
# sm90: the widest group one tile reads once, and the elements a warp holds there (32 fp32 registers a thread)
ONE_READ_COLUMNS = {"sm90": 8192}
ONE_READ_ELEMENTS_PER_WARP = 1024
ONE_READ_BLOCK_ELEMENTS = {"sm90": 128 * 128}  # sm90: a block read once at 8 warps (64 fp32 registers a thread)


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


def groups_plan(arch: str, group: int) -> QuantPlan:
    """Tiles for groups of ``group`` columns (a row: all the columns): as wide as the group up to MAX_COLUMNS, as
    many rows as fill TILE_ELEMENTS; on sm90 a group up to ONE_READ_COLUMNS wide in one row tile, read once."""
    width = next_power_of_2(max(group, 1))
    if MAX_COLUMNS < width <= ONE_READ_COLUMNS.get(arch, 0):
        return QuantPlan(1, width, width // ONE_READ_ELEMENTS_PER_WARP, converts_to_float8_rounding(arch))
    block_c = min(width, MAX_COLUMNS)
    return QuantPlan(max(1, TILE_ELEMENTS // block_c), block_c, 4, converts_to_float8_rounding(arch))


# Column-strided x (rows contiguous down its columns, as a transposed operand lies) read where it lies, which group
# scales still do: 16 x 128 tiles at 4 warps, the fastest of the tiles swept on the H200 and faster than copying x
# first (docs/kernels/quant.md, Launch plans); the same on every architecture until measured there.
COLUMNS_TILE = (16, 128)


# A transposed operand's row or tensor scales, from the tensor it transposes read along its own rows: its column
# amax over 256 rows of 128 columns a program, 32 rows a step (one atomic maximum a column every 256 rows), then its
# codes from 64 x 64 tiles transposed in registers (TRANSPOSED_TILE: _quantize_columns_kernel's plan), at or near
# the fastest of the tiles swept on the H200 and faster than reading down the columns or copying first
# (docs/kernels/quant.md, Launch plans).
COLUMN_AMAX_TILE = (32, 128)
COLUMN_AMAX_ROWS = 256
TRANSPOSED_TILE = (64, 64)


def transposed_plan(arch: str) -> QuantPlan:
    """Tiles of _quantize_columns_kernel (codes of a row-major tensor's transpose), and of _dequantize_kernel for
    codes that lie down their columns (a transposed view; the same transpose in registers), untimed there."""
    return QuantPlan(*TRANSPOSED_TILE, 4, converts_to_float8_rounding(arch))


def columns_plan(arch: str) -> QuantPlan:
    """Tiles for x whose columns are strided and rows contiguous (a transposed view), read where it lies."""
    return QuantPlan(*COLUMNS_TILE, 4, converts_to_float8_rounding(arch))


def blocks_plan(arch: str, block: int) -> QuantPlan:
    """Row chunks of a block x block block, block columns wide: the whole block up to TILE_ELEMENTS (read once),
    else as many rows as fill TILE_ELEMENTS (read twice); on sm90 the whole block up to ONE_READ_BLOCK_ELEMENTS."""
    if block * block <= TILE_ELEMENTS:
        return QuantPlan(block, block, 4, converts_to_float8_rounding(arch))
    if block * block <= ONE_READ_BLOCK_ELEMENTS.get(arch, 0):
        return QuantPlan(block, block, 8, converts_to_float8_rounding(arch))
    return QuantPlan(max(1, TILE_ELEMENTS // block), block, 4, converts_to_float8_rounding(arch))


def elementwise_plan(arch: str, n_cols: int) -> QuantPlan:
    """Tiles of dequantize and of the tensor's amax."""
    block_c = min(next_power_of_2(max(n_cols, 1)), 1024)
    return QuantPlan(max(1, TILE_ELEMENTS // block_c), block_c, 4)
