"""Launch plans of the cross-entropy kernel and of the fused linear cross-entropy's chunks.

The row kernel steps over a row's vocabulary in blocks of at most MAX_BLOCK_N; no block or warp count was swept on a
GPU yet (docs/kernels/loss.md), so every architecture takes the same plan: whole short rows in one step, 4 warps up to
1024 elements, 8 beyond.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from tritonkit._core.ints import next_power_of_2

MAX_BLOCK_N = 4096  # vocabulary elements per loop step: 16 per thread at 8 warps
CHUNK_ROW_MULTIPLE = 128  # fused chunks: GEMM-tile-friendly row counts once they are this large
CHUNK_FRACTION = 10  # a fused chunk holds at most a tenth of the tokens: transient logits within 10% of the full


@dataclass(frozen=True)
class CrossEntropyPlan:
    block_n: int  # vocabulary elements per loop step
    warps: int


@functools.lru_cache(maxsize=256)
def cross_entropy_plan(n_cols: int, arch: str) -> CrossEntropyPlan:
    """Whole short rows in one step, MAX_BLOCK_N-wide steps over long ones (the same on every architecture)."""
    block_n = min(next_power_of_2(n_cols), MAX_BLOCK_N)
    return CrossEntropyPlan(block_n=block_n, warps=4 if block_n <= 1024 else 8)


def fused_chunk_rows(n_tokens: int) -> int:
    """Tokens per chunk of the fused op: a CHUNK_FRACTION of them, a multiple of CHUNK_ROW_MULTIPLE once that large
    (GEMM tiles), at least 1."""
    rows = max(1, n_tokens // CHUNK_FRACTION)
    return rows - rows % CHUNK_ROW_MULTIPLE if rows >= CHUNK_ROW_MULTIPLE else rows
