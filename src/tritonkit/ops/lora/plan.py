"""Launch plans of the fused LoRA GEMM: where it runs at all (FUSED_MAX_TOKENS), the padded rank, and its tile.

On a GPU the fused kernel autotunes its tile per (M, N, D, rank) over tritonkit._core.gemm_plan's space, as the
matmul ladder does; under the interpreter it takes the ladder's fixed tile (timing means nothing there). How the
token threshold was measured: docs/kernels/lora.md.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tritonkit._core.gemm_plan import PersistentTile
from tritonkit._core.ints import next_power_of_2

MAX_RANK = 128  # widest adapter the fused kernels hold in registers (an fp32 BLOCK_M x r_pad tile)
MIN_DOT = 16  # tl.dot's smallest inner size: the rank is padded to it at least


def padded_rank(r: int) -> int:
    """The rank the kernel computes with: r rounded up to a power of two, at least MIN_DOT."""
    return max(MIN_DOT, next_power_of_2(r))


# Above this many tokens the products run as cuBLAS GEMMs instead of the fused kernel: once the GEMM is
# compute-bound, saving a read of x does not pay for a Triton GEMM below cuBLAS's speed; below it (decoding, small
# batches) the GEMM is bound by reading W and the launches, and the fused kernel saves two of them. Measured on the
# H200 (benchmarks/lora_paths.py, 4096 -> 4096, r 16, two runs): at 2048 tokens the fused kernels 305-307 us against
# the cuBLAS path's 328-331, at 4096 616 against 544-565 (docs/kernels/lora.md); the same on every architecture.
FUSED_MAX_TOKENS = 2048


# The thin weight gradients' Triton kernel (dA, dB up to fused_max_tokens tokens): a program owns THIN_GRAD_COLUMNS
# columns of dA (K) or dB^T (N), 64 programs at 4096, and walks the tokens THIN_GRAD_ROWS at a time (8 KB of bf16 a
# step); at these sizes the kernel is one launch where the cuBLAS form (split, concatenate, GEMM, add, cast) is six.
THIN_GRAD_COLUMNS = 64
THIN_GRAD_ROWS = 64
THIN_GRAD_WARPS = 4


# The persistent fused kernel's tile on Hopper: the matmul ladder's measured 16-bit tile (128 x 256 x 64, 8 warps, 3
# stages; docs/kernels/tutorial.md), with fewer stages where the adapter's tiles, which grow with the rank, leave no
# room for three (persistent_tile_for).
PERSISTENT_TILE = PersistentTile(128, 256, 64, 8, 3, 8)
# Stages of PERSISTENT_TILE by padded rank, from the sm_90 builds' shared memory (bytes of the 232,448 a block may
# have; compiled on the CPU): r_pad 16 asks 227,384 at 3 stages; 32 asks 241,720 at 3 and 188,448 at 2; 64 asks
# 270,392 at 3 and 213,024 at 2; 128 asks 262,176 even at 2, so rank 128 keeps the autotuned kernel.
PERSISTENT_STAGES_BY_RANK = {16: 3, 32: 2, 64: 2}
PERSISTENT_TILE_INTERPRETER = PersistentTile(32, 32, 32, 4, 1, 2)  # small, so that the CPU tests walk several tiles
# Fused products of more tokens than this take the persistent kernel where the GPU has TMA: from there the output is
# at least 8 tile-rows of 128 x 256 tiles at N 4096, a wave of an H100's 132 multiprocessors, where the ladder's
# persistent kernel runs at cuBLAS's speed and the autotuned one at 0.85-0.89x (the fused kernel here: 0.88x torch
# eager at 2048 tokens, 1.01x at 1024, where it stays). Not yet timed with the adapter.
PERSISTENT_MIN_TOKENS = 1024


def persistent_tile_for(r_pad: int) -> PersistentTile | None:
    """PERSISTENT_TILE with the stages that fit the adapter's tiles at padded rank ``r_pad``, or None where none fit
    (the fused product then runs the autotuned kernel)."""
    stages = PERSISTENT_STAGES_BY_RANK.get(r_pad)
    return None if stages is None else replace(PERSISTENT_TILE, stages=stages)


@dataclass(frozen=True)
class LoraPlan:
    """Which path the products take: the fused Triton kernel (forward and dx) and the thin-gradient kernel (dA, dB)
    up to ``fused_max_tokens`` rows, the cuBLAS GEMMs beyond (0: always cuBLAS). Fused products of more than
    ``persistent_min_tokens`` rows run in the persistent TMA kernel (tile ``persistent_tile``, or
    persistent_tile_for the rank) where the GPU has TMA, the operands are addressable and a tile fits, the autotuned
    kernel otherwise. The default plan (None at
    the launchers) is FUSED_MAX_TOKENS and PERSISTENT_MIN_TOKENS on every GPU; benchmarks/lora_paths.py forces each
    path."""

    fused_max_tokens: int = FUSED_MAX_TOKENS
    persistent_min_tokens: int = PERSISTENT_MIN_TOKENS
    persistent_tile: PersistentTile | None = None

    def __post_init__(self) -> None:
        for name in ("fused_max_tokens", "persistent_min_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"LoraPlan: {name} must be an int >= 0, got {value!r}")
        if self.persistent_tile is not None and (not isinstance(self.persistent_tile, PersistentTile)
                                                 or self.persistent_tile.swap_ab):  # fmt: skip
            raise TypeError(f"LoraPlan: persistent_tile must be a PersistentTile without swap_ab, or None, got "
                            f"{self.persistent_tile!r}")  # fmt: skip
