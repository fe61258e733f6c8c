"""Puzzle 5: row-wise sum, a 2-D reduction over rows longer than the block.

    out[r] = sum over c of x[r, c]        for 0 <= r < n_rows

Shapes: x is (n_rows, n_cols), float32 or bfloat16, rows contiguous; row r starts at
p_x + r * stride_x_row. out is (n_rows,) float32. n_cols goes up to 1000, longer than the block.

Blocks: one program per row (grid = (n_rows,)). BLOCK_N = 64 columns at a time, so a program walks
its row in a loop of cdiv(n_cols, BLOCK_N) steps, adding each block into a float32 accumulator.

Precision: accumulate in float32 (cast bf16 loads with .to(tl.float32)).
"""

import torch
import triton
import triton.language as tl


@triton.jit
def row_sum_kernel(p_x, p_out, n_cols, stride_x_row, BLOCK_N: tl.constexpr):
    """out[row] = sum(x[row, :]), BLOCK_N columns per step."""
    i_row = tl.program_id(0)
    p_row = p_x + i_row * stride_x_row
    b_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK_N):
        o_c = start + tl.arange(0, BLOCK_N)
        b_acc += tl.load(p_row + o_c, mask=o_c < n_cols, other=0.0).to(tl.float32)  # [BLOCK_N]
    tl.store(p_out + i_row, tl.sum(b_acc, axis=0))


def row_sum(x: torch.Tensor, out: torch.Tensor) -> None:
    """The launcher (given)."""
    n_rows, n_cols = x.shape
    row_sum_kernel[(n_rows,)](x, out, n_cols, x.stride(0), BLOCK_N=64)


# ===== checker data: not part of the learner's file =====
from tritonkit.puzzles._base import Puzzle, draw, scaled_tolerance  # noqa: E402

PUZZLE = Puzzle(
    title="row-wise sum (2-D reduction, long rows)",
    kernel="row_sum_kernel",
    launcher="row_sum",
    make_inputs=lambda case, dtype, device, gen: (draw((case["rows"], case["cols"]), dtype, device, gen),),
    reference=lambda x: x.sum(dim=1),
    out_shape=lambda case: (case["rows"],),
    out_dtype=lambda dtype: torch.float32,
    cases=({"rows": 1, "cols": 1}, {"rows": 5, "cols": 64}, {"rows": 7, "cols": 200}, {"rows": 3, "cols": 1000}),
    gpu_cases=({"rows": 4096, "cols": 4096}, {"rows": 1000, "cols": 30_001}),
    dtypes=(torch.float32, torch.bfloat16),
    # float32 accumulation of n_cols terms: rounding error grows like sqrt(n_cols).
    tolerance=scaled_tolerance(lambda case: case["cols"], float32_output=True),
    hints=(
        "One program per row: tl.program_id(0) is the row, and the row starts at p_x + row * stride_x_row.",
        "A row is longer than the block: loop `for start in range(0, n_cols, BLOCK_N):` and load "
        "start + tl.arange(0, BLOCK_N) each time.",
        "Keep a float32 accumulator, tl.zeros([BLOCK_N], dtype=tl.float32), add each block into it, and "
        "tl.sum(acc, axis=0) at the end. The lanes past the end of the row must add 0: load with mask= and "
        "other=0.0.",
        "One value per row: tl.store(p_out + row, total).",
    ),
)
