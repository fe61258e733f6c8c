"""GEMM tiles shared by the matmul ladder and the fused LoRA GEMM: the autotuning space, the fixed tile, and the
dot precision that follows torch's float32 matmul setting."""

from __future__ import annotations

import os

import torch
import triton

from tritonkit._core.env import interpreting

# The fixed tile of the untuned variants (naive, grouped; LoRA under the interpreter): 64x64 output tiles, 32-wide K
# steps, small enough for every GPU's shared memory at three pipeline stages.
FIXED_TILE = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32}
FIXED_TILE_WARPS = 4  # a 64 x 64 fp32 accumulator is 32 registers a thread at 4 warps
FIXED_TILE_STAGES = 3  # two tiles of A and B in flight while the third is multiplied: 24 KB of shared memory in bf16


# Tiles of 16 rows (tl.dot's smallest M) for products of a few rows, as a LoRA layer's at decoding or small batches:
# there the work is reading the weight, and the 64-128-row tiles leave one tile-row of 32-64 programs at N 4096, a
# fraction of an H100's 132 multiprocessors; 16 x 32 and 16 x 64 tiles give 64-128 programs with 8 KB K steps each.
FEW_ROWS_SHAPES = ((16, 32, 128, 4, 2), (16, 64, 128, 4, 4))


def autotune_configs(few_rows: bool = False) -> list[triton.Config]:
    """Block shapes, warps and pipeline depths tried by autotuned GEMM kernels; ``few_rows`` adds FEW_ROWS_SHAPES.

    Under the interpreter timing means nothing, so a single config keeps tests fast. With
    ``TRITONKIT_AUTOTUNE=quick`` (set by scripts/gpu_verify.sh and `tritonkit check`) two configs remain,
    a middle tile and the smallest, so that the choice between configs still runs: every new shape compiles
    each config, and the checks cover hundreds of shapes, so ten configs made them compile-bound (LoRA:
    ~10 s a test), and the largest tile is the slowest to compile (fp32 above all).
    """
    if interpreting():
        return [triton.Config({"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_SIZE": 4})]
    shapes = [  # (BLOCK_M, BLOCK_N, BLOCK_K, num_stages, num_warps)
        (128, 256, 64, 3, 8),
        (256, 128, 64, 3, 8),
        (128, 128, 64, 4, 4),
        (128, 128, 32, 4, 4),
        (128, 64, 64, 4, 4),
        (64, 128, 64, 4, 4),
        (64, 64, 64, 4, 4),
        (128, 32, 32, 4, 4),
        (64, 32, 32, 5, 2),
        (32, 64, 32, 5, 2),
    ]
    if os.environ.get("TRITONKIT_AUTOTUNE") == "quick":
        shapes = [shapes[2], shapes[-1]]
    elif few_rows:
        shapes += FEW_ROWS_SHAPES
    return [
        triton.Config(
            {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_SIZE": 8}, num_stages=stages, num_warps=warps
        )
        for bm, bn, bk, stages, warps in shapes
    ]


def input_precision(dtype: torch.dtype) -> str:
    """tl.dot's input precision: fp32 inputs follow torch's own switch, so a kernel rounds like torch.matmul."""
    if dtype == torch.float32 and torch.get_float32_matmul_precision() == "highest":
        return "ieee"
    return "tf32"
