"""Puzzle 3: outer product, broadcasting on a 2-D grid.

    out[i, j] = x[i] * y[j]        for 0 <= i < m, 0 <= j < n

Shapes: x is (m,), y is (n,), out is (m, n) and contiguous, so out[i, j] is at p_out + i * n + j
(the launcher passes stride_out_m = n). m and n are any sizes (1, 20, 33, 70, ...).

Blocks: a 2-D grid of cdiv(m, BLOCK_M) x cdiv(n, BLOCK_N) programs, BLOCK_M = 16, BLOCK_N = 32.
Program (a, b) = (tl.program_id(0), tl.program_id(1)) writes the tile of rows a*BLOCK_M ...
and columns b*BLOCK_N ...

Broadcasting: a column vector o_m[:, None] ([BLOCK_M, 1]) combined with a row vector o_n[None, :]
([1, BLOCK_N]) gives a [BLOCK_M, BLOCK_N] block, in arithmetic and in masks alike.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def outer_kernel(p_x, p_y, p_out, m, n, stride_out_m, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One [BLOCK_M, BLOCK_N] tile of out = x[:, None] * y[None, :]."""
    o_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    o_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    b_x = tl.load(p_x + o_m, mask=o_m < m)  # [BLOCK_M]
    b_y = tl.load(p_y + o_n, mask=o_n < n)  # [BLOCK_N]
    b_out = b_x[:, None] * b_y[None, :]  # [BLOCK_M, BLOCK_N]
    m_out = (o_m[:, None] < m) & (o_n[None, :] < n)
    tl.store(p_out + o_m[:, None] * stride_out_m + o_n[None, :], b_out, mask=m_out)


def outer(x: torch.Tensor, y: torch.Tensor, out: torch.Tensor) -> None:
    """The launcher (given)."""
    m, n = out.shape
    BLOCK_M, BLOCK_N = 16, 32
    grid = (triton.cdiv(m, BLOCK_M), triton.cdiv(n, BLOCK_N))
    outer_kernel[grid](x, y, out, m, n, out.stride(0), BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N)


# ===== checker data: not part of the learner's file =====
from tritonkit.puzzles._base import Puzzle, draw  # noqa: E402

PUZZLE = Puzzle(
    title="outer product (2-D grid, broadcasting)",
    kernel="outer_kernel",
    launcher="outer",
    make_inputs=lambda case, dtype, device, gen: (
        draw(case["m"], dtype, device, gen),
        draw(case["n"], dtype, device, gen),
    ),
    reference=lambda x, y: x[:, None] * y[None, :],
    out_shape=lambda case: (case["m"], case["n"]),
    cases=({"m": 1, "n": 1}, {"m": 20, "n": 45}, {"m": 33, "n": 70}),
    gpu_cases=({"m": 4097, "n": 3001}, {"m": 1, "n": 100_003}),
    hints=(
        "Two program ids now: rows come from tl.program_id(0), columns from tl.program_id(1).",
        "Load a block of x (BLOCK_M values) and a block of y (BLOCK_N values), each with its own 1-D mask.",
        "x_block[:, None] * y_block[None, :] broadcasts to a [BLOCK_M, BLOCK_N] tile.",
        "The tile's addresses are p_out + rows[:, None] * stride_out_m + cols[None, :]; its mask is "
        "(rows[:, None] < m) & (cols[None, :] < n).",
    ),
)
