"""Launch plans of the scaled GEMMs: the tiled kernel's output tile, K step, warps and pipeline depth, by architecture
and by how many rows x has (a decode step's few rows take narrow tiles, or most of each tile would be padding); and
the split-K GEMV of weight-only layers at a few rows, with the heuristic that picks its number of K splits.

MEASURED holds the tiled kernel's tiles by rows on sm90 for x holding codes (WIDE for wide outputs at 65-128 rows),
STEP_SCALED its tile for codes with group or block scales, PERSISTENT the persistent TMA kernel's tile for large
products of codes on sm90, GEMV_MEASURED the GEMV's plans on sm90 and GEMV_NARROW its one-row plan for outputs
that fill the GPU unsplit; everything else takes FALLBACK and GEMV_FALLBACK, the documented fallback of an unknown
GPU. The tiled fallback fits the 99 KB of shared memory of sm86/sm89 at three stages with one-byte operands (two
128 x 64 tiles: 16 KB a stage); the GEMV's tiles are small enough for any GPU (its one-row form buffers nothing in
shared memory).
"""

from __future__ import annotations

from dataclasses import dataclass

from tritonkit._core.ints import cdiv


@dataclass(frozen=True)
class GemmTiles:
    block_m: int
    block_n: int
    block_k: int  # at most the scale group along K, when a scale varies along K
    warps: int
    stages: int
    group: int  # tile-rows walked together (grouped order), for L2 reuse of w
    # float8 x float8: products the tensor cores sum in their shortened format (about 14 bits, DeepSeek-V3) before
    # an fp32 promotion inside a K step (each step's sum is added in fp32 anyway); 0: Triton's sm_90 default (none).
    # Promotion buys accuracy at a cost in speed, so no plan asks for it (docs/kernels/gemm.md, Launch plans).
    fp8_promote: int = 0
    # The persistent TMA kernel (codes with tensor or row scales, operands a tensor descriptor can address, sm90 and
    # newer); elsewhere the tiled kernel runs with these tiles.
    persistent: bool = False
    split_store: bool = False  # persistent: out stored in two block_m x block_n / 2 halves (half the staging)


# Rows of x (M) -> tiles: the first entry whose bound is >= M.
FALLBACK = (
    (16, GemmTiles(16, 64, 128, 4, 3, 1)),  # decoding: tl.dot's smallest M; no grouping with one tile-row
    (64, GemmTiles(64, 64, 128, 4, 3, 8)),
    (1 << 62, GemmTiles(128, 128, 64, 8, 3, 8)),
)
# Timed with int8 and float8 codes in x; weight-only calls keep FALLBACK until they are timed too.
MEASURED: dict[str, tuple] = {
    # Many rows: a K step of 128, the fastest at 8192^3; 17 to 512 rows: narrower or deeper tiles, the fastest there,
    # where 128 x 128 tiles leave multiprocessors idle (docs/kernels/gemm.md, Launch plans and Open gaps).
    "sm90": (
        FALLBACK[0],
        (128, GemmTiles(64, 64, 256, 4, 3, 8)),  # a K step past the 1 x 128 group is cut to it (the launcher)
        (256, GemmTiles(128, 64, 128, 8, 4, 8)),
        (512, GemmTiles(128, 128, 128, 8, 4, 8)),
        (1 << 62, GemmTiles(128, 128, 128, 8, 3, 8)),
    ),
}


# 65 to 128 rows of a wide output take WIDE's tiles where the arch has them: at M 128 they beat MEASURED's
# 64 x 64 x 256 at N 14336 for both codes, and the narrow tiles stayed the faster at N 4096 and 7168, so WIDE_MIN_N
# lies between (docs/kernels/gemm.md, Open gaps).
WIDE_ROWS = range(65, 129)
WIDE_MIN_N = 12288
WIDE: dict[str, GemmTiles] = {"sm90": GemmTiles(128, 128, 128, 8, 4, 8)}


# Products of codes at least this large in M and N take the persistent kernel where PERSISTENT has the arch: with
# both below, the output is at most 64 tiles of 128 x 128, under one wave of an H100's 132 multiprocessors, so each
# program takes one tile and persistence has no next tile to overlap.
PERSISTENT_MIN_SIZE = 1024
# sm90: 128 x 256 x 128, 8 warps, 3 stages, split store: the fastest float8 tile or close to it at every size timed,
# and level with the tiled kernel for int8, where 128 x 128 tiles fell well behind; four stages gained nothing
# (docs/kernels/gemm.md, The persistent TMA kernel).
PERSISTENT: dict[str, GemmTiles] = {"sm90": GemmTiles(128, 256, 128, 8, 3, 8, persistent=True, split_store=True)}
# The persistent tiles benchmarks/fp8_persistent.py times on sm90 (and the GPU tests check): 128 or 256 outputs wide,
# three or four stages, 8 warps; 128 x 256 stores its output in halves, or 4 stages of 48 KB and the 64 KB bf16 tile
# it stages would pass the H100's 227 KB of shared memory.
PERSISTENT_CANDIDATES = (
    GemmTiles(128, 128, 128, 8, 4, 8, persistent=True),
    PERSISTENT["sm90"],
    GemmTiles(128, 256, 128, 8, 4, 8, persistent=True, split_store=True),
)


# Codes with a scale that varies along K (1 x G groups, G x G blocks), from STEP_SCALED_MIN_ROWS rows: each K step's
# sum is scaled as it joins the accumulator, and the tiled kernel's 128 x 128 x 128 tiles four stages deep were the
# fastest timed at DeepSeek-V3's float8 shapes, ahead of three stages and of the persistent kernel's tiles
# (docs/kernels/gemm.md, Measured).
STEP_SCALED: dict[str, GemmTiles] = {"sm90": GemmTiles(128, 128, 128, 8, 4, 8)}
STEP_SCALED_MIN_ROWS = 65  # fewer rows keep MEASURED's 64-row tiles (most of a 128-row tile would be padding)


def gemm_tiles(arch: str, m: int, *, weight_only: bool = False, n: int = 0, per_step: bool = False) -> GemmTiles:
    """The tiles for ``m`` rows of x and ``n`` outputs (``weight_only``: x holds bf16/fp16/fp32 values, not codes;
    ``per_step``: codes with a scale that varies along K): STEP_SCALED's for such calls where ``arch`` has them, the
    persistent kernel's for other products of codes where ``arch`` has one and m and n are both at least
    PERSISTENT_MIN_SIZE, WIDE's for WIDE_ROWS rows of at least WIDE_MIN_N outputs, else the tiled kernel's by
    rows."""
    if per_step and not weight_only and m >= STEP_SCALED_MIN_ROWS and arch in STEP_SCALED:
        return STEP_SCALED[arch]
    if not weight_only and not per_step and min(m, n) >= PERSISTENT_MIN_SIZE and arch in PERSISTENT:
        return PERSISTENT[arch]
    if not weight_only and m in WIDE_ROWS and n >= WIDE_MIN_N and arch in WIDE:
        return WIDE[arch]
    table = FALLBACK if weight_only else MEASURED.get(arch, FALLBACK)
    return next((tiles for bound, tiles in table if m <= bound), table[-1][1])


@dataclass(frozen=True)
class GemvPlan:
    """The split-K GEMV of a weight-only layer: each program reads a block_n x (K / splits) slice of w once, for
    block_m rows of x. block_m 1 multiplies in fp32 lanes and sums along K once at the end; block_m >= 16 (a power of
    two) takes tl.dot, whose smallest M is 16."""

    block_m: int
    block_n: int
    block_k: int  # at most the scale group along K, when a scale varies along K
    warps: int
    stages: int
    programs_per_sm: int  # programs the splits aim for per multiprocessor (splits_to_fill)
    min_split_k: int  # the fewest K values of a split (splits_to_fill)
    splits: int = 0  # 0: splits_to_fill picks; else this many (at most one per block_k step of K)
    # block_m 1 with int8 codes and a tensor or row scale (K a multiple of 4): the codes read as int32 words of four
    # and made floats by their bits (_gemv_int8_words_kernel); other calls take the byte loop.
    words: bool = False
    # With K split: the last split to finish each output tile sums the partials (in split order, as the reduction
    # kernel does) and writes the output, counted in by an atomic, instead of a second launch (sm90's plans).
    last_split_sums: bool = False

    def __post_init__(self):
        if self.block_m != 1 and (self.block_m < 16 or self.block_m & (self.block_m - 1)):
            raise ValueError(f"GemvPlan: block_m must be 1 or a power of two >= 16 (tl.dot's smallest M), got "
                             f"{self.block_m}")  # fmt: skip
        if self.words and self.block_m != 1:
            # Words at 16 rows (four tl.dot a step) timed far slower than the byte loop, so that form was removed
            # (docs/kernels/gemm.md, What was tried and not kept).
            raise ValueError(f"GemvPlan: words reads one row a program (block_m 1), got block_m {self.block_m}")


# Rows of x per plan, for weight-only calls; more rows than the last bound take the tiled kernel.
GEMV_FALLBACK = (
    # One row: a 32 x 256 int8 tile is 8 KB a step, 16 B a lane per row; four programs a multiprocessor keep 32 KB of
    # loads in flight, past the ~20 KB per multiprocessor that covers HBM's latency at full bandwidth on an H100.
    # One stage: the loop unpipelined, occupancy hiding the loads (sm90 pipelines it three deep: GEMV_MEASURED;
    # unmeasured GPUs keep the plain loop). int8 codes with a tensor or row scale as int32 words (words): fewer
    # instructions a value than the byte loop in sm_90's code, with the same 16-byte loads, and faster
    # (docs/kernels/gemm.md, Open gaps).
    (1, GemvPlan(1, 32, 256, 4, 1, 4, 512, words=True)),
    # Up to 16 rows: tl.dot over rows padded to 16 (the tensor cores' work is free next to the weight's read); 64 x
    # 128 w tiles, pipelined three deep through shared memory.
    (16, GemvPlan(16, 64, 128, 4, 3, 4, 512)),
)
# sm90, one row: the fallback's 32 x 256 w tiles and int32 words, with the K loop pipelined three deep (asynchronous
# copies ahead) and 2 programs a multiprocessor (fewer K splits), the fastest one-row plan timed. 2 to 16 rows keep
# the fallback's tiles: no other single plan was clearly faster over the decode shapes. Both let each tile's last
# split sum the partials (no reduction launch), faster at 1, 4 and 16 rows (docs/kernels/gemm.md, Launch plans).
GEMV_MEASURED: dict[str, tuple] = {
    "sm90": (
        (1, GemvPlan(1, 32, 256, 4, 3, 2, 512, words=True, last_split_sums=True)),
        (16, GemvPlan(16, 64, 128, 4, 3, 4, 512, last_split_sums=True)),
    ),
}
# sm90, one row, where w's 16-column tiles alone give every multiprocessor one to two programs (gemv_plan): 16 x 512
# tiles, K unsplit (no partials), pipelined four deep, codes as words; faster there (N 4096: 256 tiles for 132
# multiprocessors) than the split plan above, which stayed faster at 7 and 14 such tiles a multiprocessor (N 14336,
# 28672). Timed with int8 codes and row scales; float8 codes and group scales take it untimed (docs/kernels/gemm.md,
# Open gaps).
GEMV_NARROW: dict[str, GemvPlan] = {"sm90": GemvPlan(1, 16, 512, 4, 4, 2, 512, splits=1, words=True)}

# Each split writes an fp32 partial (4 bytes per row of x and output) for the block_k-wide slices of w it reads (1
# byte per K value and output): K splits of at least PARTIAL_K_PER_ROW K values per row of x keep the partials'
# write and read-back below 2 x 4 / 64 = 1/8 of the weight's bytes.
PARTIAL_K_PER_ROW = 64

# The split-K reduction's tile: up to 16 rows x REDUCE_OUTPUTS / rows columns, 8 KB of each split's partial a program.
REDUCE_OUTPUTS = 2048
REDUCE_WARPS = 4


def gemv_plan(arch: str, m: int, n: int, sm_count: int) -> GemvPlan | None:
    """The GEMV plan for a weight-only call with ``m`` rows of x and ``n`` outputs on a GPU of ``sm_count``
    multiprocessors, or None where the tiled kernel takes it."""
    narrow = GEMV_NARROW.get(arch)
    if m == 1 and narrow and sm_count <= cdiv(n, narrow.block_n) <= 2 * sm_count:
        return narrow
    table = GEMV_MEASURED.get(arch, GEMV_FALLBACK)
    return next((plan for bound, plan in table if m <= bound), None)


def splits_to_fill(n: int, k: int, m: int, sm_count: int, plan: GemvPlan) -> int:
    """How many K splits: the output's blocks of block_m rows x block_n columns alone may leave multiprocessors idle
    (N 4096 in 32-column blocks is 128 programs for an H100's 132), and bandwidth needs every one streaming. So:
    enough splits for ``plan.programs_per_sm`` programs per multiprocessor, but none shorter than plan.min_split_k K
    values (a loop of a few steps) or PARTIAL_K_PER_ROW per row of a program (the partials' traffic). The launcher
    then rounds each split up to whole K steps, which may leave fewer. ``plan.splits`` overrides."""
    if plan.splits:
        return max(1, min(plan.splits, cdiv(k, plan.block_k)))
    blocks = cdiv(m, plan.block_m) * cdiv(n, plan.block_n)
    wanted = cdiv(plan.programs_per_sm * sm_count, blocks)
    shortest = max(plan.min_split_k, PARTIAL_K_PER_ROW * min(m, plan.block_m))
    return max(1, min(wanted, k // shortest))
