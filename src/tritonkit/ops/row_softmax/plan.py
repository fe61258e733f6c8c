"""Launch plans for softmax and log_softmax: which schedule, tile and warps a row width takes on a device.

Measured plans are keyed by device architecture (tritonkit._core.device.arch) and then by (the row's power-of-two
width, element size, backward); log_softmax shares softmax's plans, since their passes move the same bytes. A width
or an architecture without a measured plan takes the analytic fallback (:func:`fallback_plan`). How each entry was
measured, and what lost, is in docs/kernels/softmax.md.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from tritonkit._core.ints import next_power_of_2

# The widest row reduced in one program's registers (a 16-bit backward holds dy and x: 32768 of each at 32 warps
# is 64 fp32 registers a thread); wider rows are split across programs.
MAX_SINGLE_PASS = 32768


@dataclass(frozen=True)
class WholeRowPlan:
    """Whole rows in registers, ``rows`` at a time."""

    rows: int  # rows per program, or per loop step of a grid loop
    warps: int
    # A grid of this many programs per SM, each looping over row blocks with the next block's loads issued while
    # this one is reduced (0: one program per row block). Pays where one wide row per program leaves an SM's
    # memory idle while it computes.
    programs_per_sm: int = 0
    stages: int = 1  # software-pipeline depth of that loop


@dataclass(frozen=True)
class SplitRowPlan:
    """Rows wider than MAX_SINGLE_PASS: ``slice``-column slices, one program each, several programs a row."""

    slice: int
    warps: int


SoftmaxPlan = WholeRowPlan | SplitRowPlan

# sm90, measured on the H200 (an H100 runs them too): rows that fit one pass, keyed by (width, element size,
# backward); whole rows, but for the fp32 backward at 32768, whose split into 4096-column slices ran faster.
_SM90_WHOLE_ROW = {
    (1024, 2, False): WholeRowPlan(rows=2, warps=2),
    (2048, 2, False): WholeRowPlan(rows=1, warps=4),
    (4096, 2, False): WholeRowPlan(rows=1, warps=4),
    (8192, 2, False): WholeRowPlan(rows=1, warps=4),
    (32768, 2, False): WholeRowPlan(rows=1, warps=16, programs_per_sm=2, stages=3),
    (1024, 2, True): WholeRowPlan(rows=1, warps=4),
    (2048, 2, True): WholeRowPlan(rows=1, warps=4),
    (4096, 2, True): WholeRowPlan(rows=1, warps=4),
    (8192, 2, True): WholeRowPlan(rows=1, warps=8),
    (16384, 2, True): WholeRowPlan(rows=1, warps=16, programs_per_sm=1, stages=3),
    (32768, 2, True): WholeRowPlan(rows=1, warps=32),
    (1024, 4, False): WholeRowPlan(rows=1, warps=2),
    (2048, 4, False): WholeRowPlan(rows=1, warps=2),
    (4096, 4, False): WholeRowPlan(rows=1, warps=16),
    (8192, 4, False): WholeRowPlan(rows=1, warps=16),
    (1024, 4, True): WholeRowPlan(rows=1, warps=2),
    (2048, 4, True): WholeRowPlan(rows=1, warps=16),
    (4096, 4, True): WholeRowPlan(rows=1, warps=16),
    (8192, 4, True): WholeRowPlan(rows=1, warps=16),
    (16384, 4, True): WholeRowPlan(rows=1, warps=32),
    (32768, 4, True): SplitRowPlan(slice=4096, warps=4),
}
# sm90 split rows, keyed by (backward, element size).
_SM90_SPLIT_ROW = {
    (False, 2): SplitRowPlan(slice=8192, warps=4),
    (False, 4): SplitRowPlan(slice=8192, warps=8),
    (True, 2): SplitRowPlan(slice=8192, warps=8),
    (True, 4): SplitRowPlan(slice=8192, warps=8),
}
MEASURED = {"sm90": (_SM90_WHOLE_ROW, _SM90_SPLIT_ROW)}

FALLBACK_ROW_ELEMENTS = 4096  # elements a program reduces where no plan was measured: 16-32 a thread at 4-8 warps
FALLBACK_SLICE = 8192  # every measured split-row plan's slice


def fallback_plan(n_cols: int) -> SoftmaxPlan:
    """The plan of a width or device never measured: whole rows packed to about FALLBACK_ROW_ELEMENTS elements a
    program (at most 64 rows), 4 warps up to 2048 elements, 8 up to 8192, 16 beyond; rows wider than
    MAX_SINGLE_PASS split into FALLBACK_SLICE slices at 8 warps."""
    block_n = next_power_of_2(n_cols)
    if block_n > MAX_SINGLE_PASS:
        return SplitRowPlan(slice=FALLBACK_SLICE, warps=8)
    rows = max(1, min(64, FALLBACK_ROW_ELEMENTS // block_n))
    elements = rows * block_n
    return WholeRowPlan(rows=rows, warps=4 if elements <= 2048 else 8 if elements <= 8192 else 16)


@functools.lru_cache(maxsize=256)
def softmax_plan(n_cols: int, backward: bool, element_size: int, arch: str) -> SoftmaxPlan:
    """The measured plan for rows of ``n_cols`` elements of ``element_size`` bytes on ``arch``, else the fallback."""
    measured = MEASURED.get(arch)
    block_n = next_power_of_2(n_cols)
    plan = None
    if measured is not None:
        whole_row, split_row = measured
        plan = split_row.get((backward, element_size)) if block_n > MAX_SINGLE_PASS else whole_row.get(
            (block_n, element_size, backward))  # fmt: skip
    return plan or fallback_plan(n_cols)
