"""Launch plans of flash attention: the tiles, warps and pipeline depth of each kernel, by architecture and head dim.

Three kernels read a plan: the forward (query rows per program x keys per step), dK/dV (keys per program x query rows
per step) and dQ (query rows per program x keys per step). A head dim is padded to a power of two of at least 16
(tl.dot's smallest K), and the plan is looked up by that padded width. fp32 (for checking, not speed) halves the
row tiles: its tiles take twice the registers and shared memory.

Hopper (sm90): d128 measured on the H100, the other widths following it until measured (docs/kernels/attention.md).
A GPU never measured (FALLBACK) takes 64-row tiles with 4 warps and two stages, which fit the 99 KB of shared memory
of sm86/sm89 and the 164 KB of sm80 at every head dim.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Tiles:
    block_m: int  # query rows: per program (forward, dQ) or per step (dK/dV)
    block_n: int  # keys: per step (forward, dQ) or per program (dK/dV)
    warps: int
    stages: int  # software pipeline depth of the inner loop (shrunk where shared memory is short)


@dataclass(frozen=True)
class AttentionPlan:
    forward: Tiles
    dkdv: Tiles
    dq: Tiles


# Padded head dim -> plan, on sm90. d128 was swept on the H100 (benchmarks/attention_configs.py); the narrower
# widths take its tiles, and d256 halves the rows to keep its q, k and v tiles within the registers.
_SM90_D128 = AttentionPlan(Tiles(128, 64, 8, 4), Tiles(64, 128, 8, 3), Tiles(128, 64, 8, 3))
SM90 = {
    16: _SM90_D128,
    32: _SM90_D128,
    64: _SM90_D128,
    128: _SM90_D128,
    256: AttentionPlan(Tiles(64, 64, 8, 2), Tiles(32, 64, 8, 2), Tiles(64, 32, 8, 2)),
}
MEASURED = {"sm90": SM90}
FALLBACK = {width: AttentionPlan(Tiles(64, 64, 4, 2), Tiles(32, 64, 4, 2), Tiles(64, 32, 4, 2)) for width in SM90}


def _halve_rows(tiles: Tiles) -> Tiles:
    return replace(tiles, block_m=max(16, tiles.block_m // 2))


def attention_plan(arch: str, block_d: int, itemsize: int) -> AttentionPlan:
    """The plan for a padded head dim ``block_d`` (16 to 256) of ``itemsize``-byte elements."""
    plan = MEASURED.get(arch, FALLBACK)[block_d]
    if itemsize == 4:
        plan = AttentionPlan(_halve_rows(plan.forward), replace(plan.dkdv, block_n=max(16, plan.dkdv.block_n // 2)),
                             _halve_rows(plan.dq))  # fmt: skip
    return plan
