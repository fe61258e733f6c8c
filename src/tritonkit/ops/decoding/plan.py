"""Launch plans of flash decoding: the key block, warps and pipeline depth of the split kernel, the rows one program
takes, and the heuristic that picks the number of splits.

Decoding reads the whole cache for a few queries, so its only measure is bandwidth: a plan wants enough programs in
flight to keep every multiprocessor's loads streaming, and no more splits than that (each split writes a partial
that the reduction reads back).

Plans are looked up by padded head dim and cache format. MEASURED holds what a sweep settled on the H200
(benchmarks/decode_splits.py, docs/kernels/decoding.md): at d128, three stages and splits down to one key block, the
key loop unpipelined where a split is at most 2 key blocks; for 8-bit caches 2 warps, 4 programs per multiprocessor
and at least two splits, two stages for splits of 3 to 8 key blocks, int8 with its codes converted straight to bf16;
for int4 2 warps at 4 programs per multiprocessor and three stages; the 2-warp plans take 4 where the grid is one
wave of lone programs. Every other head dim and format, and any GPU never measured, take FALLBACK: key blocks of 64
(32 at d256) with two stages, which fit the 99 KB of shared memory of sm86/sm89 at every head dim and format.
"""

from __future__ import annotations

from dataclasses import dataclass

from tritonkit._core.ints import cdiv


@dataclass(frozen=True)
class DecodePlan:
    block_n: int  # keys per step of the split kernel
    warps: int
    stages: int  # software pipeline depth of the key loop
    max_rows: int  # query rows (query heads of one key head x new tokens) per program; more take several programs
    # How int8 and fp8 codes become the products' operand: straight to its 16-bit dtype (one conversion, exact for
    # both formats) instead of through fp32. On the H200, timed before the loads zero-filled the codes: int8 faster
    # by 5-15%, fp8 slower by 5-25%.
    direct_codes: bool = False
    # int8 and fp8 caches read as int16 halfwords of two codes, taken by halves of the head dim (the even and the
    # odd columns), each converted where its product's operand layout holds it (the value tiles by the transposing
    # ldmatrix), in fp16 products, instead of the value codes gathered a byte at a time along the keys: 3.5 sm_90
    # instructions a value in int8's unmasked loop against 5.4 (docs/kernels/decoding.md). Needs sm_89 or newer for
    # fp8 (its conversion of two codes at once), a 16-bit q and an even head dim; other calls read whole tiles.
    code_halves: bool = False
    # The fewest key blocks a split spans (of the cache's capacity) for code_halves to apply; shorter splits read
    # whole tiles, where the halves' fixed costs (q's rows scaled into fp16, the value scales' largest a block) weigh.
    code_halves_min_blocks: int = 0
    # The split heuristic (choose_splits): programs per multiprocessor wanted, the shortest split in keys, and the
    # fewest splits.
    programs_per_sm: int = 2  # two programs per multiprocessor keep loads in flight while the other computes
    min_keys_per_split: int = 512  # a shorter split costs more in its partial's write and read-back than it gains
    min_splits: int = 1
    # (most key blocks a split, stages) pairs, shortest first: splits of at most that many key blocks (of the
    # cache's capacity) run that many stages deep instead of `stages` (empty: no such rule). A pipeline deeper than
    # the loop's few steps only delays its first product.
    short_split_stages: tuple[tuple[int, int], ...] = ()
    # Warps a program when the whole grid is at most one program per multiprocessor (0: `warps`): a lone program has
    # no other on its multiprocessor to hide its loads behind, so it takes more warps of its own.
    one_wave_warps: int = 0
    # Programmatic dependent launch (sm_90 and newer): the decode kernel and the reduction each launched so that it
    # starts while its predecessor drains, waiting for it in the kernel (griddepcontrol), to take the launches' gaps
    # off short caches. Off in FALLBACK, which must run below sm_90 too.
    pdl: bool = False
    # Registers a thread may take (ptxas' maxnreg; 0: the compiler's choice): fewer registers let more programs share
    # a multiprocessor (sm_90: 64K registers, so 2-warp programs of 239 to 254 registers fit four at a time).
    max_registers: int = 0

    def warps_for(self, programs: int, sm_count: int) -> int:
        """The split kernel's warps a program for a grid of ``programs`` on ``sm_count`` multiprocessors."""
        return self.one_wave_warps if self.one_wave_warps and programs <= sm_count else self.warps

    def split_blocks(self, max_keys: int, n_splits: int) -> int:
        """Key blocks a split spans of ``max_keys`` (the cache's capacity) cut into ``n_splits`` splits."""
        return cdiv(cdiv(max_keys, max(n_splits, 1)), self.block_n)

    def stages_for(self, max_keys: int, n_splits: int) -> int:
        """The key loop's pipeline depth for ``max_keys`` (the cache's capacity) cut into ``n_splits`` splits."""
        split_blocks = self.split_blocks(max_keys, n_splits)
        if split_blocks > 0:
            for most_blocks, stages in self.short_split_stages:
                if split_blocks <= most_blocks:
                    return stages
        return self.stages


# Padded head dim -> plan (the narrower widths share d64's).
_D64 = DecodePlan(64, 4, 2, 64)
FALLBACK = {16: _D64, 32: _D64, 64: _D64, 128: DecodePlan(64, 4, 2, 64), 256: DecodePlan(32, 4, 2, 32)}
# (padded head dim, cache format) -> plan, where a sweep measured one; the rest take FALLBACK by head dim.
# sm90, d128, from the tile sweep (decode_splits.py --part tiles, 2026-11-28-decode-tiles.json) at B1 S32k, B8 S32k
# and B64 S4k, pages of 64, where a block inside every row's view takes one page lookup and no masks:
# - plain: 3 stages (0.80/0.84/0.98x SDPA against 0.77/0.70/0.89x at 2);
# - int8 and fp8: key blocks of 64 (one page each) with 2 warps, 3 stages and 4 programs per multiprocessor: 1.00 to
#   1.27x of paged bf16's plan, where blocks of 128 with 4 warps ran at 0.86 to 1.02x;
# - int4: below.
# Their split heuristics from every split count at B 1 to 16 x S 1k to 32k, B64 S4k and B256 S1k (decode_splits.py
# --part splits, 2026-11-28-decode-split-counts.json): the fastest count fills about 2 (plain) or 4 (8-bit) programs
# per multiprocessor, with splits as short as one key block (B1 S1k: 16 splits of 64 keys); more programs than that
# start a second wave (8-bit at B16 S4k: 89 us at 5 splits, 58 at 4). Where the batch alone fills the GPU, 8-bit
# caches read by halves run fastest unsplit (B64 S4k 138.7 against 153.4 us at 2 splits, int8;
# 2026-11-30-decode-split-counts-halves.json), so they take no minimum of splits (whole tiles had wanted 2).
# Short splits run shallower (DecodePlan.short_split_stages), by the length of a split in key blocks of 64. The tile
# sweep (H200, decode_splits.py --part tiles --stages 1 2 3, 2026-11-29-decode-tiles-stages-short.json and
# -stages-long.json, CUDA-graph GPU time, one input set) found the key loop unpipelined (1 stage) fastest in every
# format up to 4 blocks (paged bf16 B1 S1k 8.2 -> 6.0 us, B8 S1k 13.6 -> 12.6, B1 S8k 14.6 -> 13.4) and 10-40% slower
# from 8 (B8 S4k, B1 S32k). The decode table, its inputs rotated past L2 (2026-11-29-decode-table-short-4-blocks.md,
# one stage up to 4 blocks, against 2026-11-29-decode-table-pdl.md), kept the gain where a split is 1 or 2 blocks
# (paged bf16 B1 S1k 8.7 -> 6.8 us, 0.87 -> 1.11x SDPA; int8 B1 S1k 10.3 -> 8.4, B1 S8k 17.3 -> 15.8, B8 S1k 16.1 ->
# 15.0) and lost it at 4 (paged bf16 B1 S8k 17.5 -> 17.6, B8 S1k 17.0 -> 16.9; contiguous B1 S8k 16.4 -> 17.2): one
# stage up to 2 blocks. 8-bit caches take two stages up to 8 blocks (2026-11-29-decode-tiles-short.json: 1.19-1.25x
# faster than three at 1 to 4 blocks, level at 8); plain three (within 5% of two there).
_SHORT_PLAIN = ((2, 1),)
_SHORT_8BIT = ((2, 1), (8, 2))
# The 2-warp plans (8-bit, int4) take 4 warps where the grid is one wave of lone programs (B1 S1k: 16 splits x 8 key
# heads = 128 programs for 132 multiprocessors), H200, inputs past L2 (2026-11-30-decode-tiles-cold.json): int8
# 8.7 -> 7.0 us, fp8 8.4 -> 6.9, int4 10.1 -> 8.1; with four programs a multiprocessor (B4 S1k) 2 warps stay faster
# (int8 10.8 against 12.7 at 4 warps).
ONE_WAVE_WARPS = 4
# Every sm90 plan launches as programmatic dependents (pdl): 0.1-0.9 us off each call of every format at B1 S1k to
# B64 S1k (H200, 2026-11-29-decode-pdl.json; paged bf16 B1 S1k 8.5 -> 7.7 us, B8 S1k 14.4 -> 13.5), level at B8 S32k.
# int8 and fp8 read by halves of the head dim (code_halves), H200, B8 S32k / B64 S4k against the whole tiles
# (2026-11-30-decode-quantized.json, bf16 products): int8 194.5 -> 155.9 / 207.0 -> 164.5 us, fp8 185.6 -> 145.6 /
# 200.7 -> 155.4; then in fp16 products (2026-11-30-decode-code-halves-fp16.md): int8 0.90-0.92x the time at long
# caches, fp8 0.94-0.99x, B1 S1k (splits of one key block) 1.08-1.10x. Splits of one block read whole tiles
# (code_halves_min_blocks 2): B1 S1k 7.3 -> 6.8 / 6.7 us; whole tiles up to 2 blocks lost at 2 (B8 S1k, B1 S8k:
# 1.05-1.11x the time; -code-halves-short-3.md, -short-2.md). A register cap (max_registers 168 or 128, for 6 or 8
# programs a multiprocessor) spills in the key loop: 1.1-4.5x slower in every format (-tiles-registers.json); caps of
# 192 and 200 did not pay either (docs/kernels/decoding.md, Launch plans' sweep table).
_SM90_INT8 = DecodePlan(64, 2, 3, 64, direct_codes=True, code_halves=True, code_halves_min_blocks=2,
                        programs_per_sm=4, min_keys_per_split=64, short_split_stages=_SHORT_8BIT,
                        one_wave_warps=ONE_WAVE_WARPS, pdl=True)  # fmt: skip
_SM90_FP8 = DecodePlan(64, 2, 3, 64, code_halves=True, code_halves_min_blocks=2, programs_per_sm=4,
                       min_keys_per_split=64, short_split_stages=_SHORT_8BIT,
                       one_wave_warps=ONE_WAVE_WARPS, pdl=True)  # fmt: skip
# int4's kernel is bound by its unpacking and latency, not by bytes: its fastest split counts follow the token count,
# as plain's do, with splits down to one key block, not FALLBACK's 512-key splits (2026-11-29-decode-split-counts
# .json, B1 to B16 x S1k to S32k: B1 S1k 9.2 against 30.0 us, B8 S1k 23.8 against 30.3). 2 warps at 4 programs
# a multiprocessor and 2 stages, against FALLBACK's 4 warps at 2 (2026-11-29-decode-tiles-stages-long.json):
# B8 S32k 557 -> 413 us, B64 S4k 560 -> 414, B1 S131k 283 -> 214, B1 S32k 79 -> 64; one stage up to 2
# blocks (B8 S1k 22.2 -> 19.8, B1 S8k 23.0 -> 20.3); B1 S1k 8.9 -> 10.0 us (the decode table),
# where 4 warps win: ONE_WAVE_WARPS. With the cache read in quarters of the head dim (halfwords converted in the
# products' operand layout, H200, 2026-11-30-decode-tiles-int4-quarters.json), 3 stages: B8 S32k 177.5 -> 155.3 us,
# B64 S4k 172.2 -> 148.6, B8 S4k (8-block splits) 31.1 -> 29.5; 4 warps 1.2-1.5x slower; key blocks of 32 slower
# than 64 at every depth (2026-11-30-decode-tiles-int4-key-quarters.json).
_SM90_INT4 = DecodePlan(64, 2, 3, 64, programs_per_sm=4, min_keys_per_split=64, short_split_stages=_SHORT_PLAIN,
                        one_wave_warps=ONE_WAVE_WARPS, pdl=True)  # fmt: skip
MEASURED: dict[str, dict[tuple[int, str], DecodePlan]] = {
    "sm90": {
        (128, "plain"): DecodePlan(64, 4, 3, 64, min_keys_per_split=64, short_split_stages=_SHORT_PLAIN, pdl=True),
        (128, "int8"): _SM90_INT8,
        (128, "fp8"): _SM90_FP8,
        (128, "int4"): _SM90_INT4,
    },
}

MAX_SPLITS = 128  # the reduction reads every split's partial in one tile
PDL_ARCH = 90  # griddepcontrol, which DecodePlan.pdl's launches wait with, is sm_90's and newer
# New tokens a kv_cache_append program writes (every key head of each): a program of one token spent about 37 sm_90
# instructions a value, most of them its own index and page arithmetic; four share it. On the H200 a prompt's append
# (8 x 2048 tokens) at 1 / 2 / 4 tokens a program: int8 32.2 / 29.4 / 27.9 us, int4 38.8 / 37.2 / 34.9, bf16 level
# (2026-11-29-decode-append-tokens.json).
APPEND_TOKENS = 4


def decode_plan(arch: str, block_d: int, kv_format: str = "plain") -> DecodePlan:
    """The plan for a padded head dim ``block_d`` (16 to 256) and a cache of ``kv_format`` ("plain": values in q's
    dtype; "int8", "fp8" or "int4": codes)."""
    return MEASURED.get(arch, {}).get((block_d, kv_format), FALLBACK[block_d])


def choose_splits(programs: int, max_keys: int, sm_count: int, plan: DecodePlan = _D64) -> int:
    """The number of splits of the keys: as many as keep the batch, key heads and row blocks' ``programs`` within
    ``plan.programs_per_sm`` per multiprocessor (rounded down: a program past them starts a second wave), at least
    ``plan.min_splits``, and none shorter than ``plan.min_keys_per_split`` of the cache's ``max_keys`` (its capacity:
    the lengths themselves live on the GPU)."""
    wanted = max(plan.programs_per_sm * sm_count // max(programs, 1), plan.min_splits)
    return max(1, min(wanted, cdiv(max_keys, plan.min_keys_per_split), MAX_SPLITS))
