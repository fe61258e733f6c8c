"""Launch plans of the cross-entropy kernel.

The row kernel steps over a row's vocabulary in blocks of at most MAX_BLOCK_N; no block or warp count was swept on a
GPU yet (docs/kernels/loss.md), so every architecture takes the same plan: whole short rows in one step, 4 warps up to
1024 elements, 8 beyond.

The fused op's chunks (tokens per chunk) follow the rule it shares with the vocabulary-parallel op:
_core/loss_chunks.py (FusedChunkPlan, fused_chunk_plan).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from tritonkit._core.ints import next_power_of_2

MAX_BLOCK_N = 4096  # vocabulary elements per loop step: 16 per thread at 8 warps


@dataclass(frozen=True)
class CrossEntropyPlan:
    block_n: int  # vocabulary elements per loop step
    warps: int
    stages: int = 1  # > 1: each pass's loads issued that many blocks ahead


@functools.lru_cache(maxsize=256)
def cross_entropy_plan(n_cols: int, arch: str) -> CrossEntropyPlan:
    """Whole short rows in one step, MAX_BLOCK_N-wide steps over long ones (the same on every architecture)."""
    block_n = min(next_power_of_2(n_cols), MAX_BLOCK_N)
    return CrossEntropyPlan(block_n=block_n, warps=4 if block_n <= 1024 else 8)
