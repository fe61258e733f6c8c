"""Launch plans of the 4-bit linear layers: the tile by the weight's format and how many rows x has, and how many
splits of the contraction.

Few rows (decoding, M <= 16) split the contraction across programs (split-K): the output has too few tiles to occupy
the GPU, so there are about SPLIT_TARGET_WAVES programs per multiprocessor, and a second kernel adds the splits' fp32
partial sums in order. The forward takes, by format (GEMV_FALLBACK below; the timings that chose it in
docs/kernels/fourbit.md, Measured):

    rows      INT4                                    NF4
    1         Gemv4Tiles, products on the CUDA cores  Gemv4Tiles, products on the CUDA cores
              (codes read as words, 128 x 128)        (32 x 256)
    2 to 8    Gemv4Tiles, products on tensor cores    Linear4Tiles (the 16-row dot tile)
    9 to 16   Gemv4Tiles, products on tensor cores    Gemv4Tiles, products on tensor cores
    from 17   DequantizeFirst                         DequantizeFirst

Gemv4Tiles is a kernel of its own (kernels._linear4_gemv_kernel); Linear4Tiles' schedules share one kernel per
direction: few rows, a BLOCK_M of 16 (tl.dot's smallest) and wide K steps; many rows (through plan= only), GEMM tiles
in grouped order, one split. The input gradient, whose contraction runs over N, takes Linear4Tiles up to 16 rows.

MEASURED holds sm90's table (FALLBACK's tiles, NF4 decoded by byte permutes); every other architecture takes
FALLBACK. Its many-rows tile takes two stages: at three, the gathered per-value absmax and code lookups, pipelined
beside the operands, overflow an H100's shared memory (docs/kernels/fourbit.md, Launch plans).

NF4's codes become values one of three ways (NF4_DECODES), a field of each plan: "gather" loads them from the
16-entry table in global memory; "select" picks them in registers by a tree of 15 selects on the code's bits;
"prmt" builds them with byte permutes from the table held in registers, about 6 instructions a value (PTX: the
interpreter and other GPUs take the select tree). In the fused few-row layer the gather was bound by the L1 cache
and "prmt" was the fastest, so sm90's fused tiles and GEMV take "prmt" and FALLBACK's the select tree; the
dequantize-first kernel, with no products to feed, runs fastest gathering, so DequantizeFirst gathers
(docs/kernels/fourbit.md, Design: Codes to values, and Measured).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tritonkit._core.ints import cdiv

MIN_DOT = 16  # tl.dot's smallest side
NF4_DECODES = ("gather", "select", "prmt")  # NF4's code lookups (module docstring)
GEMV_PRODUCTS = ("fma", "dot")  # where the GEMV multiplies: CUDA cores, or tensor cores (Gemv4Tiles)


def _check_decode(plan) -> None:
    if plan.nf4_decode not in NF4_DECODES:
        raise ValueError(f"{type(plan).__name__}: nf4_decode must be one of {NF4_DECODES}, got {plan.nf4_decode!r}")


@dataclass(frozen=True)
class Linear4Tiles:
    block_m: int
    block_n: int  # output columns (forward) or rows of W per step (input gradient)
    block_k: int  # columns of W per step (forward) or output columns (input gradient); even: whole bytes
    warps: int
    stages: int
    group: int  # tile-rows walked together (grouped order), for L2 reuse of the weight
    splits: int = 0  # splits of the contraction; 0: chosen by choose_splits
    nf4_decode: str = "select"  # NF4's code lookup (NF4_DECODES)

    def __post_init__(self) -> None:
        # tl.dot takes no side below 16, and a K step of block_k columns is two dots of block_k / 2.
        if min(self.block_m, self.block_n, self.block_k // 2) < MIN_DOT:
            raise ValueError(f"Linear4Tiles: block_m, block_n and block_k / 2 must be >= {MIN_DOT}, got {self}")
        _check_decode(self)


@dataclass(frozen=True)
class Gemv4Tiles:
    """One to a few rows (up to 16; GEMV_FALLBACK says where), forward only: _linear4_gemv_kernel on a grid of
    (N / block_n output columns, splits of K), every row of x in each program, the products on the CUDA cores or the
    tensor cores (``products``). The input gradient at those rows takes linear4_tiles' tiles."""

    block_n: int = 32  # rows of W (output columns) a program
    block_k: int = 256  # columns of W a step: block_k / 2 contiguous bytes of each of the block_n rows
    warps: int = 4
    stages: int = 3  # the K loop's software pipeline (asked of the loop: loads by asynchronous copies ahead)
    splits: int = 0  # splits of K; 0: chosen by choose_splits
    nf4_decode: str = "select"  # NF4's code lookup (NF4_DECODES)
    products: str = "fma"  # "fma": on the CUDA cores; "dot": the tensor cores, x's rows padded to 16 (GEMV_PRODUCTS)

    def __post_init__(self) -> None:
        if self.products not in GEMV_PRODUCTS:
            raise ValueError(f"Gemv4Tiles: products must be one of {GEMV_PRODUCTS}, got {self.products!r}")
        smallest = MIN_DOT if self.products == "dot" else 2  # tl.dot's sides; else tl.arange's, and whole bytes
        for name in ("block_n", "block_k"):
            value = getattr(self, name)
            if value < smallest or value & (value - 1):
                raise ValueError(f"Gemv4Tiles: {name} must be a power of two >= {smallest}, got {value}")
        _check_decode(self)


@dataclass(frozen=True)
class DequantizeFirst:
    """Many rows: the weight dequantized once into x's dtype (N x K, freed after the call) by a tiled kernel of
    block_n x block_k (k_tiles of them a program, consecutive along K), then y = F.linear(x, W) and dx = dy W on
    cuBLAS, as bitsandbytes does for more than one row. The fused tiles dequantize each weight tile again for every
    block_m rows, several times slower at many rows (docs/kernels/fourbit.md, Measured; What was tried and not
    kept)."""

    block_n: int = 32
    block_k: int = 128  # even: whole bytes
    warps: int = 4
    nf4_decode: str = "gather"  # NF4's code lookup (NF4_DECODES)
    k_tiles: int = 1  # block_n x block_k tiles a program writes, consecutive along K (a loop)

    def __post_init__(self) -> None:
        _check_decode(self)
        for name in ("block_n", "block_k"):
            value = getattr(self, name)
            if value < 2 or value & (value - 1):  # tl.arange's sides; block_k also whole bytes
                raise ValueError(f"DequantizeFirst: {name} must be a power of two >= 2, got {value}")
        if isinstance(self.k_tiles, bool) or not isinstance(self.k_tiles, int) or self.k_tiles < 1:
            raise ValueError(f"DequantizeFirst: k_tiles must be an int >= 1, got {self.k_tiles!r}")


def _by_byte_permutes(table: tuple) -> tuple:
    """A table of (bound, tiles) with NF4's codes decoded by byte permutes ("prmt")."""
    return tuple((bound, tiles and replace(tiles, nf4_decode="prmt")) for bound, tiles in table)


# Rows of x from which the weight is dequantized first: past the few-row split-K kernels' 16, where the fused tiles,
# dequantizing again per block of rows, are slower than dequantize + cuBLAS (docs/kernels/fourbit.md, Measured).
DEQUANTIZE_FIRST_ROWS = 17

# Rows of x (M) -> tiles: the first entry whose bound is >= M.
FALLBACK = (
    (16, Linear4Tiles(16, 64, 128, 4, 3, 1)),  # decoding: tl.dot's smallest M; wide K steps for the weight's bytes
    (64, Linear4Tiles(64, 64, 64, 4, 3, 8)),
    (1 << 62, Linear4Tiles(128, 128, 64, 8, 2, 8)),  # two stages: three overflowed an H100 (docstring)
)
# sm90: FALLBACK's tiles with NF4's codes by byte permutes, faster there than the select tree at 1 and 16 rows
# (docs/kernels/fourbit.md, Measured: the three NF4 lookups).
MEASURED: dict[str, tuple] = {"sm90": _by_byte_permutes(FALLBACK)}

SPLIT_TARGET_WAVES = 6  # programs per multiprocessor the splits aim for (docs/kernels/fourbit.md: 4 splits at one row)
MAX_SPLITS = 16  # the partial sums are S x M x N fp32; beyond 16 their traffic outweighs the parallelism
MAX_PARTIAL_ELEMENTS = 1 << 28  # partial sums stay far below 2**31 elements (int32 offsets in the sum kernel)


FORMATS = ("nf4", "int4")  # the weight's formats (the launcher's FORMAT flag)
# The few-row forward's tiles (docs/kernels/fourbit.md, Launch plans; figures in Measured: the GEMV). One row:
# products on the CUDA cores, 32 x 256, 4 warps, splits chosen: faster than the dot tile, and within the noise of the
# best CUDA-core tile swept. One stage: pipelining the loop (asynchronous copies ahead, from 2) made it no faster.
GEMV_ONE_ROW = Gemv4Tiles(stages=1)
# INT4 at one row, its codes read as words (kernels._int4_gemv_words_kernel): 128 x 128, 4 warps, splits chosen, four
# rows a thread so that each of x's values is converted once for four rows; faster than 32 x 256 at both shapes
# timed. One stage: pipelining its loop made it no faster (docs/kernels/fourbit.md, Measured: INT4's one-row GEMV
# by words).
GEMV_INT4_ONE_ROW = Gemv4Tiles(128, 128, warps=4, stages=1)
# From 2 rows (INT4) and from 9 rows (NF4): on the tensor cores, 32 x 256 on 2 warps (mma.sync). INT4 runs as fast at
# 16 rows as at one, where the CUDA cores' products and the dot tile slow with the rows; NF4 at 16 rows beats the dot
# tile (docs/kernels/fourbit.md, Measured: the GEMV; wgmma's 64 x 256 on 4 warps in What was tried and not kept).
GEMV_ROWS_ON_TENSOR_CORES = Gemv4Tiles(32, 256, warps=2, products="dot")
GEMV_NF4_DOT_TILE_ROWS = 8  # NF4's dot tile up to here: faster than the GEMV at 4 rows, slower at 16; 5 to 15 not timed
# Format -> ((the most rows, tiles or None for the dot tiles), ...), the first bound >= M; rows past the last bound
# take the dot tiles (linear4_tiles). Measured on sm90 only; other architectures take the same rule, NF4 by the
# select tree.
GEMV_FALLBACK: dict[str, tuple] = {
    "int4": ((1, GEMV_INT4_ONE_ROW), (DEQUANTIZE_FIRST_ROWS - 1, GEMV_ROWS_ON_TENSOR_CORES)),
    "nf4": ((1, GEMV_ONE_ROW), (GEMV_NF4_DOT_TILE_ROWS, None), (DEQUANTIZE_FIRST_ROWS - 1, GEMV_ROWS_ON_TENSOR_CORES)),
}
# sm90: NF4's codes by byte permutes, as its dot tiles (measured there against the select tree).
GEMV_MEASURED: dict[str, dict] = {"sm90": {fmt: _by_byte_permutes(table) for fmt, table in GEMV_FALLBACK.items()}}


def gemv4_tiles(arch: str, fmt: str, m: int) -> Gemv4Tiles | None:
    """The few-row forward's GEMV tiles for ``m`` rows of x over a ``fmt`` weight on ``arch``, or None where the
    dot tiles run it."""
    if fmt not in FORMATS:
        raise ValueError(f"linear4_plan: fmt must be one of {FORMATS}, got {fmt!r}")
    table = GEMV_MEASURED.get(arch, GEMV_FALLBACK)[fmt]
    return next((tiles for bound, tiles in table if m <= bound), None)


def linear4_tiles(arch: str, m: int) -> Linear4Tiles:
    """The fused kernels' tiles for ``m`` rows of x."""
    table = MEASURED.get(arch, FALLBACK)
    return next((tiles for bound, tiles in table if m <= bound), table[-1][1])


def linear4_plan(arch: str, fmt: str, m: int, *, forward: bool = True) -> Linear4Tiles | Gemv4Tiles | DequantizeFirst:
    """The plan for ``m`` rows of x over a ``fmt`` ("nf4" or "int4") weight: DequantizeFirst from
    DEQUANTIZE_FIRST_ROWS rows; below, the forward's GEMV where GEMV_FALLBACK has one for the format and rows, else
    the fused tiles."""
    gemv = gemv4_tiles(arch, fmt, m)
    if m >= DEQUANTIZE_FIRST_ROWS:
        return DequantizeFirst()
    return gemv if forward and gemv is not None else linear4_tiles(arch, m)


def choose_splits(tiles: int, steps: int, outputs: int, sm_count: int) -> int:
    """Splits of a contraction of ``steps`` steps for ``tiles`` output tiles of ``outputs`` elements: enough for about
    SPLIT_TARGET_WAVES programs per multiprocessor, each split at least one step, none empty."""
    wanted = min(MAX_SPLITS, steps, max(1, cdiv(SPLIT_TARGET_WAVES * sm_count, max(tiles, 1))))
    while wanted > 1 and wanted * outputs > MAX_PARTIAL_ELEMENTS:
        wanted //= 2
    steps_per_split = cdiv(steps, max(wanted, 1))
    return cdiv(steps, steps_per_split) if steps else 1
