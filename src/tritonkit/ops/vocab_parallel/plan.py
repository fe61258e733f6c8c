"""Launch plans of the vocabulary-slice kernels.

Not yet swept on a GPU (docs/kernels/vocab_parallel.md): every architecture takes one plan, whole short slices in
one step and MAX_BLOCK_N-wide steps over long ones, as the single-GPU cross-entropy kernel does. The fused op's
token chunks follow the single-GPU fused op's rule (_core/loss_chunks.py), planned for the group's largest slice.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from tritonkit._core.ints import next_power_of_2

MAX_BLOCK_N = 4096  # slice elements per loop step: 16 per thread at 8 warps
MIN_BLOCK_N = 16  # an empty or tiny slice still gets a block Triton can lay out


@dataclass(frozen=True)
class SlicePlan:
    block_n: int  # slice elements per loop step
    warps: int


@functools.lru_cache(maxsize=256)
def slice_plan(n_cols: int, arch: str) -> SlicePlan:
    """The same on every architecture until measured: 4 warps up to 1024-wide steps, 8 beyond."""
    block_n = max(MIN_BLOCK_N, min(next_power_of_2(max(n_cols, 1)), MAX_BLOCK_N))
    return SlicePlan(block_n=block_n, warps=4 if block_n <= 1024 else 8)
