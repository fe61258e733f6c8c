"""Launch plans of flash decoding: the key block, warps and pipeline depth of the split kernel, the rows one program
takes, and the heuristic that picks the number of splits.

Decoding reads the whole cache for a few queries, so its only measure is bandwidth: a plan wants enough programs in
flight to keep every multiprocessor's loads streaming, and no more splits than that (each split writes a partial
that the reduction reads back).

Plans are looked up by padded head dim and cache format. MEASURED holds what the H200 sweeps settled at d128
(benchmarks/decode_splits.py; their figures in docs/kernels/decoding.md, Launch plans): key blocks of 64, splits down
to one key block, short splits pipelined less deeply, programmatic launches; plain caches at 4 warps and 2 programs
per multiprocessor, the quantized ones at 2 warps and 4 (4 warps where the grid is one wave of lone programs), int8
and fp8 read by halves of the head dim. Every other head dim and format, and any GPU never measured, take FALLBACK:
key blocks of 64 (32 at d256) with two stages, which fit the 99 KB of shared memory of sm86/sm89 at every head dim
and format.
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
# (padded head dim, cache format) -> plan, where a sweep measured one; the rest take FALLBACK by head dim. The sweeps
# behind each choice (tile, split counts, stages, warps, register caps, programmatic launches) and their figures are
# in docs/kernels/decoding.md, Launch plans; the comments here keep the reasons.
# A pipeline deeper than a short split's few steps only delays its first product: unpipelined up to 2 key blocks,
# and the 8-bit caches 2 stages deep up to 8.
_SHORT_PLAIN = ((2, 1),)
_SHORT_8BIT = ((2, 1), (8, 2))
# A grid of at most one program per multiprocessor (B1 S1k) leaves a 2-warp program no other to hide its loads
# behind: it takes 4 warps.
ONE_WAVE_WARPS = 4
# int8 and fp8: 2 warps, 3 stages and 4 programs per multiprocessor (four small programs keep more loads in flight
# than blocks of 128 at 4 warps, which ran slower at every shape); read by halves of the head dim where a split
# spans 2 key blocks or more (fewer instructions a value; one-block splits read whole tiles, where the halves' fixed
# costs weigh); no minimum of splits (where the batch alone fills the GPU, one split is fastest).
_SM90_INT8 = DecodePlan(64, 2, 3, 64, direct_codes=True, code_halves=True, code_halves_min_blocks=2,
                        programs_per_sm=4, min_keys_per_split=64, short_split_stages=_SHORT_8BIT,
                        one_wave_warps=ONE_WAVE_WARPS, pdl=True)  # fmt: skip
_SM90_FP8 = DecodePlan(64, 2, 3, 64, code_halves=True, code_halves_min_blocks=2, programs_per_sm=4,
                       min_keys_per_split=64, short_split_stages=_SHORT_8BIT,
                       one_wave_warps=ONE_WAVE_WARPS, pdl=True)  # fmt: skip
# int4's loop is bound by unpacking and latency, not bytes: its split counts follow the token count as plain's do
# (splits down to one key block), at 2 warps and 4 programs per multiprocessor, 3 stages since its cache is read in
# quarters of the head dim.
_SM90_INT4 = DecodePlan(64, 2, 3, 64, programs_per_sm=4, min_keys_per_split=64, short_split_stages=_SHORT_PLAIN,
                        one_wave_warps=ONE_WAVE_WARPS, pdl=True)  # fmt: skip
MEASURED: dict[str, dict[tuple[int, str], DecodePlan]] = {
    "sm90": {
        # plain: 4 warps, 3 stages, 2 programs per multiprocessor (the split heuristic's default), splits down to
        # one key block
        (128, "plain"): DecodePlan(64, 4, 3, 64, min_keys_per_split=64, short_split_stages=_SHORT_PLAIN, pdl=True),
        (128, "int8"): _SM90_INT8,
        (128, "fp8"): _SM90_FP8,
        (128, "int4"): _SM90_INT4,
    },
}

MAX_SPLITS = 128  # the reduction reads every split's partial in one tile
PDL_ARCH = 90  # griddepcontrol, which DecodePlan.pdl's launches wait with, is sm_90's and newer
# New tokens a kv_cache_append program writes (every key head of each): most of a one-token program's instructions
# were its own index and page arithmetic, which four tokens share (docs/kernels/decoding.md, Open gaps).
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
