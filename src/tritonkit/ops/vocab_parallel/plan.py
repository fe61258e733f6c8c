"""Launch plans of the vocabulary-slice kernels and the fused op's token chunks.

Not yet swept on a GPU (docs/kernels/vocab_parallel.md): every architecture takes one plan, whole short slices in
one step and MAX_BLOCK_N-wide steps over long ones, as the single-GPU cross-entropy kernel does.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from tritonkit._core.ints import next_power_of_2

MAX_BLOCK_N = 4096  # slice elements per loop step: 16 per thread at 8 warps
MIN_BLOCK_N = 16  # an empty or tiny slice still gets a block Triton can lay out
TOKEN_CHUNKS = 10  # the fused op runs its tokens in about this many chunks: transient logits ~10% of the full
CHUNK_MULTIPLE = 128  # chunk rows rounded down to whole GEMM tiles once they are this many


@dataclass(frozen=True)
class SlicePlan:
    block_n: int  # slice elements per loop step
    warps: int


@functools.lru_cache(maxsize=256)
def slice_plan(n_cols: int, arch: str) -> SlicePlan:
    """The same on every architecture until measured: 4 warps up to 1024-wide steps, 8 beyond."""
    block_n = max(MIN_BLOCK_N, min(next_power_of_2(max(n_cols, 1)), MAX_BLOCK_N))
    return SlicePlan(block_n=block_n, warps=4 if block_n <= 1024 else 8)


def chunk_rows(n_tokens: int) -> int:
    """Tokens per chunk of the fused op: about 1/TOKEN_CHUNKS of them, whole GEMM tiles where that many, at least 1.
    Every rank of the group runs the same chunks (the same tokens), so their all-reduces pair up."""
    rows = max(1, n_tokens // TOKEN_CHUNKS)
    return rows if rows < CHUNK_MULTIPLE else rows // CHUNK_MULTIPLE * CHUNK_MULTIPLE
