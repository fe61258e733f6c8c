"""Launch plans of the fused LoRA GEMM: where it runs at all (FUSED_MAX_TOKENS), the padded rank, and its tile.

On a GPU the fused kernel autotunes its tile per (M, N, D, rank) over tritonkit._core.gemm_plan's space, as the
matmul ladder does; under the interpreter it takes the ladder's fixed tile (timing means nothing there). How the
token threshold was measured: docs/kernels/lora.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from tritonkit._core.ints import next_power_of_2

MAX_RANK = 128  # widest adapter the fused kernels hold in registers (an fp32 BLOCK_M x r_pad tile)
MIN_DOT = 16  # tl.dot's smallest inner size: the rank is padded to it at least


def padded_rank(r: int) -> int:
    """The rank the kernel computes with: r rounded up to a power of two, at least MIN_DOT."""
    return max(MIN_DOT, next_power_of_2(r))


# Above this many tokens the products run as cuBLAS GEMMs instead of the fused kernel: once the GEMM is
# compute-bound, saving a read of x does not pay for a Triton GEMM below cuBLAS's speed; below it (decoding, small
# batches) the GEMM is bound by reading W and the launches, and the fused kernel saves two of them. Measured on the
# H200 (benchmarks/lora_paths.py, 4096 -> 4096, r 16, three runs): at 2048 tokens the fused kernels 305-307 and 321
# us against the cuBLAS path's 328-331 and 322, at 4096 609-616 against 543-565 (docs/kernels/lora.md); the same on
# every architecture.
FUSED_MAX_TOKENS = 2048


# The thin weight gradients' Triton kernel (dA, dB up to fused_max_tokens tokens): a program owns THIN_GRAD_COLUMNS
# columns of dA (K) or dB^T (N), 64 programs at 4096, and walks the tokens THIN_GRAD_ROWS at a time (8 KB of bf16 a
# step); at these sizes the kernel is one launch where the cuBLAS form (split, concatenate, GEMM, add, cast) is six.
THIN_GRAD_COLUMNS = 64
THIN_GRAD_ROWS = 64
THIN_GRAD_WARPS = 4


@dataclass(frozen=True)
class LoraPlan:
    """Which path the products take: the fused Triton kernel (forward and dx) and the thin-gradient kernel (dA, dB)
    up to ``fused_max_tokens`` rows, the cuBLAS GEMMs beyond (0: always cuBLAS). The default plan (None at the
    launchers) is FUSED_MAX_TOKENS on every GPU; benchmarks/lora_paths.py forces either path to measure the
    crossover."""

    fused_max_tokens: int = FUSED_MAX_TOKENS

    def __post_init__(self) -> None:
        value = self.fused_max_tokens
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"LoraPlan: fused_max_tokens must be an int >= 0, got {value!r}")
