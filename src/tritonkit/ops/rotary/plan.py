"""Launch plan of RoPE: how many heads a program rotates per step of its head loop, and its warps, by architecture.

One program per token loops over the token's heads, a [heads, rotary_dim / 2] tile at a time. On sm90
(benchmarks/rope_configs.py) tiles of 512 elements (8 heads of 128) with 4 warps were the fastest in both layouts,
far ahead of whole-token tiles of 32 heads (docs/kernels/rope.md). A GPU never measured falls back to the same plan.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RopePlan:
    half_tile: int  # elements of one [heads, rotary_dim / 2] tile: heads per step = half_tile // (rotary_dim / 2)
    warps: int


MEASURED = {"sm90": RopePlan(half_tile=512, warps=4)}
FALLBACK_PLAN = RopePlan(half_tile=512, warps=4)  # sm90's: no other GPU was measured


def rope_plan(arch: str) -> RopePlan:
    return MEASURED.get(arch, FALLBACK_PLAN)
