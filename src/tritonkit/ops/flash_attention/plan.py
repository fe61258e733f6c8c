"""Launch plans of flash attention: the tiles, warps and pipeline depth of each kernel, by architecture and head dim.

Three kernels read a plan: the forward (query rows per program x keys per step), dK/dV (keys per program x query rows
per step) and dQ (query rows per program x keys per step).
A head dim is padded to a power of two of at least 16 (tl.dot's smallest K), and the plan is looked up by that padded
width. fp32 (for checking, not speed) halves the row tiles and keeps at most two stages: its tiles take twice the
registers and shared memory.

Hopper (sm90): measured on the H100 at d64, d128 and d256 (docs/kernels/attention.md).
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
    # Read the tiles the loop streams (K and V in the forward and dQ, Q and dO in dK/dV) through tensor descriptors
    # (TMA) where the GPU has them and the inputs allow (dense, strides positive multiples of 16 bytes); else
    # pointer loads.
    descriptors: bool = False


@dataclass(frozen=True)
class AttentionPlan:
    forward: Tiles
    dkdv: Tiles
    dq: Tiles
    # dK/dV tiles where dkdv's would give the GPU fewer than FEW_DKDV_PROGRAMS_PER_SM programs per multiprocessor
    # (one batch row, few key heads, short sequences): narrower key blocks, more programs. None: dkdv always.
    dkdv_few: Tiles | None = None


# Padded head dim -> plan, on sm90, each width swept on the H100 (benchmarks/attention_configs.py): d128 at B4 H32
# N4096, d64 at B2 H16 N8192 (the narrower widths follow it), d256 at B2 H16 N4096 causal, where only 64-row tiles
# with 4 warps fit the shared memory in the forward. Tensor descriptors timed against pointer loads on the H200
# (--tiles descriptors): d128's and d256's forwards (d128: faster in 11 of 12 tile and mask pairs; d256 1.45x), d128's
# and d256's dQ (3-6%) and d256's dK/dV (2%) take them; d128's and d64's dK/dV moved by under 2% either way and keep
# pointer loads, as does d64's dQ (1%). d64's forward gained 2% of its GPU time but a launch with two descriptors
# costs the host 108 us more (176 against 68 us at B1 H32:8 N4096, the 1B training step's attention, whose forward
# the host cannot keep fed; Triton encodes each descriptor at every launch): pointer loads.
_SM90_D64 = AttentionPlan(Tiles(128, 64, 4, 3), Tiles(32, 128, 4, 3), Tiles(64, 64, 4, 3), dkdv_few=Tiles(64, 64, 4, 3))
_SM90_D128 = AttentionPlan(
    Tiles(128, 128, 8, 3, descriptors=True), Tiles(64, 128, 8, 3), Tiles(128, 64, 8, 3, descriptors=True)
)
_SM90_D256 = AttentionPlan(
    Tiles(64, 64, 4, 3, descriptors=True), Tiles(32, 64, 8, 2, descriptors=True), Tiles(64, 32, 4, 3, descriptors=True)
)
# Between the 2 programs per multiprocessor of B1 H32:8 N4096 d64 causal (the 1B training step's attention), where
# 64-key blocks made the backward 27% faster (0.781 -> 0.566 ms on the H200), and the 16 of B2 H16 N8192, where the
# 128-key blocks stay 4% faster.
FEW_DKDV_PROGRAMS_PER_SM = 4
SM90 = {16: _SM90_D64, 32: _SM90_D64, 64: _SM90_D64, 128: _SM90_D128, 256: _SM90_D256}
MEASURED = {"sm90": SM90}
FALLBACK = {width: AttentionPlan(Tiles(64, 64, 4, 2), Tiles(32, 64, 4, 2), Tiles(64, 32, 4, 2)) for width in SM90}


def _fp32(tiles: Tiles, rows: str) -> Tiles:
    """Half the rows (``rows``: the field that holds them) and at most two stages: fp32 tiles take twice the bytes,
    and the q (or k and v) tile that stays resident beside the pipeline's buffers took the H100's fp32 d128 forward
    past its 227 KB of shared memory at three stages. Pointer loads: fp32 is for checking, and the descriptors were
    measured in 16-bit only."""
    return replace(tiles, **{rows: max(16, getattr(tiles, rows) // 2)}, stages=min(tiles.stages, 2),
                   descriptors=False)  # fmt: skip


def attention_plan(arch: str, block_d: int, itemsize: int) -> AttentionPlan:
    """The plan for a padded head dim ``block_d`` (16 to 256) of ``itemsize``-byte elements."""
    plan = MEASURED.get(arch, FALLBACK)[block_d]
    if itemsize == 4:
        few = plan.dkdv_few and _fp32(plan.dkdv_few, "block_n")
        plan = replace(plan, forward=_fp32(plan.forward, "block_m"), dkdv=_fp32(plan.dkdv, "block_n"),
                       dq=_fp32(plan.dq, "block_m"), dkdv_few=few)  # fmt: skip
    return plan
