"""Launch plans of flash decoding: the key block, warps and pipeline depth of the split kernel, the rows one program
takes, and the heuristic that picks the number of splits.

Decoding reads the whole cache for a few queries, so its only measure is bandwidth: a plan wants enough programs in
flight to keep every multiprocessor's loads streaming, and no more splits than that (each split writes a partial
that the reduction reads back).

Hopper (sm90) and any GPU never measured share one table until the H100's sweep replaces it; its key blocks of 64
(32 at d256) with two stages fit the 99 KB of shared memory of sm86/sm89 at every head dim and format.
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
    # both formats) instead of through fp32. Not yet measured on a GPU, so off by default.
    direct_codes: bool = False
    # int4 with groups of 32 or more: products of q and P with the codes themselves, each group's scale and zero
    # applied to the [rows, keys] scores and to P (kernels.py), in place of dequantizing every value. Not yet
    # measured on a GPU, so off by default.
    fold_int4: bool = False
    # The split heuristic (choose_splits): programs per multiprocessor wanted, and the shortest split in keys.
    programs_per_sm: int = 2  # two programs per multiprocessor keep loads in flight while the other computes
    min_keys_per_split: int = 512  # a shorter split costs more in its partial's write and read-back than it gains


# Padded head dim -> plan (the narrower widths share d64's).
_D64 = DecodePlan(64, 4, 2, 64)
FALLBACK = {16: _D64, 32: _D64, 64: _D64, 128: DecodePlan(64, 4, 2, 64), 256: DecodePlan(32, 4, 2, 32)}
MEASURED: dict[str, dict[int, DecodePlan]] = {}

MAX_SPLITS = 128  # the reduction reads every split's partial in one tile


def decode_plan(arch: str, block_d: int) -> DecodePlan:
    """The plan for a padded head dim ``block_d`` (16 to 256)."""
    return MEASURED.get(arch, FALLBACK)[block_d]


def choose_splits(programs: int, max_keys: int, sm_count: int, plan: DecodePlan = _D64) -> int:
    """The number of splits of the keys: enough for ``plan.programs_per_sm`` programs per multiprocessor when the
    batch, key heads and row blocks give ``programs`` fewer than that, and none shorter than
    ``plan.min_keys_per_split`` of the cache's ``max_keys`` (its capacity: the lengths themselves live on the GPU)."""
    wanted = cdiv(plan.programs_per_sm * sm_count, max(programs, 1))
    return max(1, min(wanted, cdiv(max_keys, plan.min_keys_per_split), MAX_SPLITS))
