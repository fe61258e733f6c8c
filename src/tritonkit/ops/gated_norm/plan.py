"""Launch plans of the gated RMSNorm: whole groups in registers, forward and backward.

Never measured on a GPU: every architecture takes the analytic plans below (the norms' fallback rules, which
docs/kernels/norm.md derives), until a sweep gives a table keyed by architecture.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from tritonkit._core.ints import next_power_of_2

MAX_GROUP = 16384  # the widest group normalised in one program's registers (the norms' MAX_SINGLE_PASS)
FWD_ELEMENTS = 4096  # forward: elements a program normalises (32 a thread at 4 warps), as the norms' fallback
ONE_PROGRAM_BACKWARD = 1 << 15  # backward inputs of at most this many elements: one row group writes dweight itself


@dataclass(frozen=True)
class GatedFwdPlan:
    """``rows`` rows of one group a program (_rms_norm_gated_fwd_kernel)."""

    rows: int
    warps: int


@dataclass(frozen=True)
class GatedBwdPlan:
    """``programs_per_sm`` programs per SM over the row groups and groups, one row a step
    (_rms_norm_gated_bwd_kernel)."""

    programs_per_sm: int
    warps: int
    rows: int = 1


@functools.lru_cache(maxsize=256)
def gated_fwd_plan(group_size: int, arch: str) -> GatedFwdPlan:
    """About FWD_ELEMENTS elements a program (at most 64 rows), 4 warps; 8 from groups of 8192 (the same on every
    architecture)."""
    block_n = next_power_of_2(group_size)
    return GatedFwdPlan(rows=max(1, min(64, FWD_ELEMENTS // block_n)), warps=4 if block_n < 8192 else 8)


@functools.lru_cache(maxsize=256)
def gated_bwd_plan(group_size: int, arch: str) -> GatedBwdPlan:
    """The norms' fallback backward: 4 warps and eight programs per SM below 1024 columns, four up to 2048; beyond,
    one per SM at 8 warps (16 above 8192). The same on every architecture."""
    block_n = next_power_of_2(group_size)
    if block_n < 1024:
        return GatedBwdPlan(programs_per_sm=8, warps=4)
    if block_n <= 2048:
        return GatedBwdPlan(programs_per_sm=4, warps=4)
    return GatedBwdPlan(programs_per_sm=1, warps=8 if block_n <= 8192 else 16)
