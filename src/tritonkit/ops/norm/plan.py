"""Launch plans of the norms: which schedule a row width takes, with which tile, warps and pipeline, on a device.

Plans are frozen dataclasses, one type per schedule (the kernel it runs). Measured plans are keyed by device
architecture (tritonkit._core.device.arch), then by (power-of-two row width, element size, norm); a width or a GPU
never measured takes the analytic fallback (:func:`fallback_fwd_plan`, :func:`fallback_bwd_plan`). The sm90 tables
were measured on the H200 by benchmarks/norm_configs.py; an H100 runs them too. How each entry was measured, and
what lost: docs/kernels/norm.md, Launch plans and What was tried and not kept.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from tritonkit._core.ints import next_power_of_2

MAX_SINGLE_PASS = 16384  # the widest row normalised in one program's registers; wider rows are split across programs
MANY_ROWS = 32768  # from this many rows the backward takes the many-rows table: fewer, longer row groups
# Backward inputs of at most this many elements run as one program that writes dweight/dbias itself: on one SM 8 x 4096
# takes less time than the reduction launch it saves.
ONE_PROGRAM_BACKWARD = 1 << 15
WEIGHT_FIRST_ELEMENTS = 32  # forward: at most this many row elements a thread load the weight and bias with x
ROW_SUMS_CHUNK = 4096  # the wide backward's row-sums phase: columns a step (16 a thread at 8 warps)
ROW_SUMS_WARPS = 8  # one program a row reads the whole row: 8 warps keep enough loads in flight for it alone
ROW_SUMS_STAGES = 3  # that phase's pipeline depth: the fastest measured (docs/kernels/norm.md, Backward, wide rows)


# ----------------------------------------------------------------------------------------------------------------
# Forward plans
# ----------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FwdRowsPlan:
    """Whole rows in registers, ``rows`` a program (_norm_fwd_kernel)."""

    rows: int
    warps: int


@dataclass(frozen=True)
class FwdLoopedPlan:
    """RMSNorm only: one row a program, read twice in ``chunk``-column steps (_rms_norm_fwd_looped_kernel)."""

    chunk: int
    warps: int
    stages: int  # software-pipeline depth of the chunk loops


@dataclass(frozen=True)
class FwdSplitRowPlan:
    """Rows wider than MAX_SINGLE_PASS: ``slice``-column slices, one program each (_norm_fwd_split_row_kernel);
    the output written in ``piece``-column pieces, so that h, the weight and the bias of a whole slice never take
    three slices' worth of registers at once."""

    slice: int
    warps: int
    piece: int


NormFwdPlan = FwdRowsPlan | FwdLoopedPlan | FwdSplitRowPlan

# sm90, keyed by (width, element size, RMSNorm?); forwards with and without the statistics stored share them (plans
# of their own gained too little to keep: docs/kernels/norm.md, Today's plans and the old tables).
_SM90_FWD = {
    (1024, 2, True): FwdRowsPlan(rows=2, warps=4),
    (2048, 2, True): FwdRowsPlan(rows=1, warps=4),
    (4096, 2, True): FwdLoopedPlan(chunk=2048, warps=8, stages=1),
    (8192, 2, True): FwdRowsPlan(rows=2, warps=4),
    (16384, 2, True): FwdRowsPlan(rows=1, warps=8),
    (1024, 4, True): FwdRowsPlan(rows=1, warps=1),
    (2048, 4, True): FwdRowsPlan(rows=1, warps=2),
    (4096, 4, True): FwdLoopedPlan(chunk=4096, warps=16, stages=1),
    (8192, 4, True): FwdLoopedPlan(chunk=2048, warps=16, stages=1),
    (16384, 4, True): FwdRowsPlan(rows=2, warps=16),
    (1024, 2, False): FwdRowsPlan(rows=2, warps=2),
    (2048, 2, False): FwdRowsPlan(rows=1, warps=2),
    (4096, 2, False): FwdRowsPlan(rows=2, warps=8),
    (8192, 2, False): FwdRowsPlan(rows=1, warps=4),
    (16384, 2, False): FwdRowsPlan(rows=1, warps=8),
    (1024, 4, False): FwdRowsPlan(rows=1, warps=1),
    (2048, 4, False): FwdRowsPlan(rows=1, warps=2),
    (4096, 4, False): FwdRowsPlan(rows=2, warps=16),
    (8192, 4, False): FwdRowsPlan(rows=1, warps=8),
    (16384, 4, False): FwdRowsPlan(rows=2, warps=16),
}
# sm90 split rows, keyed by (element size, RMSNorm?).
_SM90_FWD_SPLIT_ROW = {
    (2, True): FwdSplitRowPlan(slice=16384, warps=16, piece=4096),
    (2, False): FwdSplitRowPlan(slice=8192, warps=4, piece=2048),
    (4, True): FwdSplitRowPlan(slice=16384, warps=16, piece=16384),
    (4, False): FwdSplitRowPlan(slice=8192, warps=4, piece=4096),
}
FALLBACK_ROW_ELEMENTS = 4096  # fallback: elements a program normalises (32 a thread at 4 warps)


def fallback_fwd_plan(n_cols: int) -> NormFwdPlan:
    """A forward never measured: whole rows packed to about FALLBACK_ROW_ELEMENTS elements a program (at most 64
    rows) at 4 warps; rows wider than MAX_SINGLE_PASS in 8192-column slices at 4 warps, output pieces of 2048."""
    block_n = next_power_of_2(n_cols)
    if block_n > MAX_SINGLE_PASS:
        return FwdSplitRowPlan(slice=8192, warps=4, piece=2048)
    return FwdRowsPlan(rows=max(1, min(64, FALLBACK_ROW_ELEMENTS // block_n)), warps=4)


@functools.lru_cache(maxsize=512)
def norm_fwd_plan(n_cols: int, element_size: int, is_rms: bool, arch: str) -> NormFwdPlan:
    """The forward's measured plan for rows of ``n_cols`` elements of ``element_size`` bytes, else the fallback."""
    block_n = next_power_of_2(n_cols)
    plan = None
    if arch == "sm90":
        if block_n > MAX_SINGLE_PASS:
            plan = _SM90_FWD_SPLIT_ROW.get((element_size, is_rms))
        else:
            plan = _SM90_FWD.get((block_n, element_size, is_rms))
    return plan or fallback_fwd_plan(n_cols)


def options_fwd_plan(n_cols: int, element_size: int, is_rms: bool, arch: str) -> FwdRowsPlan:
    """The forward of the options (dropout, rowscale, x1, weight1), which runs whole rows only (_norm_fwd_kernel, rows
    up to MAX_SINGLE_PASS): the measured plan where it is a whole-row one, else the fallback's (never measured with
    the options on)."""
    plan = norm_fwd_plan(n_cols, element_size, is_rms, arch)
    return plan if isinstance(plan, FwdRowsPlan) else fallback_fwd_plan(n_cols)


def loads_weight_first(rows: int, block_n: int, warps: int) -> bool:
    """Whether the whole-row forward loads the weight and bias with x: where at most WEIGHT_FIRST_ELEMENTS row
    elements a thread leave registers for them."""
    return rows * block_n <= WEIGHT_FIRST_ELEMENTS * 32 * warps


# ----------------------------------------------------------------------------------------------------------------
# Backward plans
# ----------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BwdRowsPlan:
    """Whole rows in registers (_norm_bwd_kernel): ``programs_per_sm`` row groups per SM, ``rows`` rows a loop step,
    the next step's loads issued ``stages`` deep; ``interleaved``: each group takes every G-th step of rows (the
    groups sweep the rows together), else a block of rows of its own."""

    programs_per_sm: int
    warps: int
    rows: int
    stages: int
    interleaved: bool = True


@dataclass(frozen=True)
class BwdGivenPlan:
    """Rows too wide for registers in two phases: each row's terms first (_norm_bwd_row_sums_kernel), then
    ``block_n``-column blocks of row groups with those terms given (_norm_bwd_columns_kernel). Five passes over the
    rows' data; no program waits for another."""

    block_n: int
    rows: int
    warps: int
    programs_per_sm: int
    stages: int


@dataclass(frozen=True)
class BwdSharedPlan:
    """``block_n``-column blocks in one launch, sharing each step's row terms through memory and waiting for each
    other (_norm_bwd_columns_kernel, SHARED): three passes. ``ahead``: each step's parts published a step before the
    wait. Taken only where the programs may wait (tritonkit._core.row_sync.waits_safely); elsewhere the launcher runs
    the two phases (``given_plan``)."""

    block_n: int
    rows: int
    warps: int
    programs_per_sm: int
    ahead: bool = False


NormBwdPlan = BwdRowsPlan | BwdGivenPlan | BwdSharedPlan

_SM90_BWD_GIVEN = {  # keyed by element size
    2: BwdGivenPlan(block_n=1024, rows=4, warps=4, programs_per_sm=4, stages=1),
    4: BwdGivenPlan(block_n=1024, rows=4, warps=4, programs_per_sm=8, stages=1),
}
# sm90, keyed by (width, element size, RMSNorm?); RMSNorm's plans hold with or without a bias.
_SM90_BWD = {
    (1024, 2, True): BwdRowsPlan(programs_per_sm=4, warps=4, rows=2, stages=3),
    (2048, 2, True): BwdRowsPlan(programs_per_sm=4, warps=4, rows=1, stages=3),
    (4096, 2, True): BwdRowsPlan(programs_per_sm=1, warps=8, rows=2, stages=3),
    (8192, 2, True): BwdRowsPlan(programs_per_sm=1, warps=8, rows=1, stages=3),
    (16384, 2, True): BwdRowsPlan(programs_per_sm=1, warps=16, rows=1, stages=1),
    (1024, 4, True): BwdRowsPlan(programs_per_sm=4, warps=4, rows=1, stages=3),
    (2048, 4, True): BwdRowsPlan(programs_per_sm=1, warps=8, rows=2, stages=3),
    (4096, 4, True): BwdRowsPlan(programs_per_sm=1, warps=16, rows=1, stages=3),
    (8192, 4, True): BwdRowsPlan(programs_per_sm=1, warps=16, rows=1, stages=1),
    (16384, 4, True): BwdRowsPlan(programs_per_sm=1, warps=8, rows=1, stages=1),
    # LayerNorm, measured with a bias (its dbias accumulator takes registers too)
    (1024, 2, False): BwdRowsPlan(programs_per_sm=4, warps=4, rows=2, stages=3),
    (2048, 2, False): BwdRowsPlan(programs_per_sm=4, warps=4, rows=1, stages=3),
    (4096, 2, False): BwdRowsPlan(programs_per_sm=1, warps=16, rows=2, stages=4),
    (8192, 2, False): BwdRowsPlan(programs_per_sm=1, warps=8, rows=1, stages=3),
    (16384, 2, False): BwdRowsPlan(programs_per_sm=1, warps=8, rows=1, stages=1, interleaved=False),
    (1024, 4, False): BwdRowsPlan(programs_per_sm=4, warps=4, rows=1, stages=3),
    (2048, 4, False): BwdRowsPlan(programs_per_sm=1, warps=4, rows=2, stages=3),
    (4096, 4, False): BwdRowsPlan(programs_per_sm=1, warps=4, rows=1, stages=3),
    (8192, 4, False): BwdRowsPlan(programs_per_sm=2, warps=8, rows=1, stages=3),
    # fp32 LayerNorm at 16384: its single pass spills; column blocks sharing the row terms beat it
    (16384, 4, False): BwdSharedPlan(block_n=4096, rows=1, warps=4, programs_per_sm=2),
}
# sm90 LayerNorm without a bias, where one accumulator fewer changes the best plan.
_SM90_BWD_NO_BIAS = {(16384, 2, False): BwdRowsPlan(programs_per_sm=1, warps=16, rows=1, stages=1)}
# sm90 from MANY_ROWS rows: fewer programs (each with more rows, fewer dweight/dbias partial rows to sum) and
# deeper pipelines beat the entries above.
_SM90_BWD_MANY_ROWS = {
    (1024, 2, True): BwdRowsPlan(programs_per_sm=4, warps=2, rows=1, stages=4),
    (1024, 2, False): BwdRowsPlan(programs_per_sm=2, warps=4, rows=4, stages=3),
    (2048, 2, True): BwdRowsPlan(programs_per_sm=2, warps=4, rows=1, stages=4),
    (2048, 2, False): BwdRowsPlan(programs_per_sm=2, warps=4, rows=1, stages=6),
    (1024, 4, True): BwdRowsPlan(programs_per_sm=2, warps=2, rows=1, stages=4),
    (1024, 4, False): BwdRowsPlan(programs_per_sm=2, warps=2, rows=1, stages=4),
    (2048, 4, True): BwdRowsPlan(programs_per_sm=1, warps=16, rows=2, stages=3),
}
# sm90 rows wider than MAX_SINGLE_PASS, one launch sharing the row terms, keyed by (element size, RMSNorm?, bias?);
# the rest (bf16 with a bias or LayerNorm's two terms, whose accumulators double the registers) take the two phases.
_SM90_BWD_WIDE_SHARED = {
    (2, True, False): BwdSharedPlan(block_n=1024, rows=2, warps=2, programs_per_sm=8, ahead=True),
    (4, True, False): BwdSharedPlan(block_n=4096, rows=2, warps=4, programs_per_sm=2),
    (4, True, True): BwdSharedPlan(block_n=4096, rows=2, warps=4, programs_per_sm=2),
    (4, False, False): BwdSharedPlan(block_n=4096, rows=2, warps=4, programs_per_sm=2),
    (4, False, True): BwdSharedPlan(block_n=4096, rows=2, warps=4, programs_per_sm=2),
}
FALLBACK_BWD_GIVEN = BwdGivenPlan(block_n=1024, rows=4, warps=4, programs_per_sm=4, stages=1)  # sm90's bf16 tile


def fallback_bwd_plan(n_cols: int) -> NormBwdPlan:
    """A backward never measured: whole rows up to MAX_SINGLE_PASS, one row a step, 4 warps up to 2048 columns
    (eight row groups per SM below 1024, four up to 2048), 8 up to 8192, 16 beyond (one group per SM); wider rows
    in the two phases, which never wait across programs."""
    block_n = next_power_of_2(n_cols)
    if block_n > MAX_SINGLE_PASS:
        return FALLBACK_BWD_GIVEN
    if block_n < 1024:
        return BwdRowsPlan(programs_per_sm=8, warps=4, rows=1, stages=1)
    if block_n <= 2048:
        return BwdRowsPlan(programs_per_sm=4, warps=4, rows=1, stages=1)
    return BwdRowsPlan(programs_per_sm=1, warps=8 if block_n <= 8192 else 16, rows=1, stages=1)


@functools.lru_cache(maxsize=512)
def norm_bwd_plan(n_cols: int, element_size: int, is_rms: bool, has_bias: bool, many_rows: bool,
                  arch: str) -> NormBwdPlan:  # fmt: skip
    """The backward's measured plan for rows of ``n_cols`` elements of ``element_size`` bytes (``has_bias``: dbias is
    summed too; ``many_rows``: MANY_ROWS rows or more), else the fallback."""
    block_n = next_power_of_2(n_cols)
    if arch != "sm90":
        return fallback_bwd_plan(n_cols)
    if block_n > MAX_SINGLE_PASS:
        shared = _SM90_BWD_WIDE_SHARED.get((element_size, is_rms, has_bias))
        return shared or _SM90_BWD_GIVEN.get(element_size, FALLBACK_BWD_GIVEN)
    key = (block_n, element_size, is_rms)
    plan = _SM90_BWD.get(key)
    if not is_rms and not has_bias:
        plan = _SM90_BWD_NO_BIAS.get(key, plan)
    if many_rows:
        plan = _SM90_BWD_MANY_ROWS.get(key, plan)
    return plan or fallback_bwd_plan(n_cols)


def options_bwd_plan(n_cols: int, element_size: int, is_rms: bool, has_bias: bool, many_rows: bool,
                     arch: str) -> BwdRowsPlan:  # fmt: skip
    """The options' backward, whole rows only (_norm_bwd_options_kernel): the measured plan where it is a whole-row
    one, else the fallback's (never measured with the options on)."""
    plan = norm_bwd_plan(n_cols, element_size, is_rms, has_bias, many_rows, arch)
    return plan if isinstance(plan, BwdRowsPlan) else fallback_bwd_plan(n_cols)


def given_plan(element_size: int, arch: str) -> BwdGivenPlan:
    """The two-phase plan that replaces a shared one where programs may not wait for each other."""
    return _SM90_BWD_GIVEN.get(element_size, FALLBACK_BWD_GIVEN) if arch == "sm90" else FALLBACK_BWD_GIVEN


def saves_registers(rows: int, block_n: int, warps: int) -> bool:
    """Whether the backward takes its LOW_REGISTERS order: where a step's fp32 terms (xhat, dy, g and the dweight
    sum, a row's worth each per thread) and the weight would pass the registers a thread may have (there the usual
    order spills: docs/kernels/norm.md, Backward, single pass)."""
    per_thread = rows * block_n // (32 * warps)
    return 5 * per_thread > min(255, 65536 // (32 * warps))
