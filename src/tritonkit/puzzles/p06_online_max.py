"""Puzzle 6: row maximum in one pass (the running maximum of online softmax).

    out[r] = max over c of x[r, c]        for 0 <= r < n_rows

Shapes: x is (n_rows, n_cols), float32 or bfloat16, rows contiguous (row r at p_x + r * stride_x_row);
out is (n_rows,) float32. Many rows hold only negative values.

Blocks: one program per row; BLOCK_N = 64 columns per step, in a loop over the row. The program keeps
a running maximum and updates it with each block, reading the row once.

The trap: lanes past the end of the row must not win the maximum, so they must load as -inf, not 0.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def row_max_kernel(p_x, p_out, n_cols, stride_x_row, BLOCK_N: tl.constexpr):
    """out[row] = max(x[row, :]) with a running maximum over blocks of BLOCK_N columns."""
    i_row = tl.program_id(0)
    p_row = p_x + i_row * stride_x_row
    b_max = tl.full([BLOCK_N], float("-inf"), dtype=tl.float32)
    for start in range(0, n_cols, BLOCK_N):
        o_c = start + tl.arange(0, BLOCK_N)
        b_x = tl.load(p_row + o_c, mask=o_c < n_cols, other=float("-inf")).to(tl.float32)  # [BLOCK_N]
        b_max = tl.maximum(b_max, b_x)
    tl.store(p_out + i_row, tl.max(b_max, axis=0))


def row_max(x: torch.Tensor, out: torch.Tensor) -> None:
    """The launcher (given)."""
    n_rows, n_cols = x.shape
    row_max_kernel[(n_rows,)](x, out, n_cols, x.stride(0), BLOCK_N=64)


# ===== checker data: not part of the learner's file =====
from tritonkit.puzzles._base import Puzzle, draw  # noqa: E402


def _rows(case, dtype, device, gen):
    # Every other row lies well below zero, so that masked lanes loaded as 0 win the maximum.
    x = draw((case["rows"], case["cols"]), dtype, device, gen)
    x[::2] -= 10
    return (x,)


PUZZLE = Puzzle(
    title="online maximum (running max over long rows)",
    kernel="row_max_kernel",
    launcher="row_max",
    make_inputs=_rows,
    reference=lambda x: x.amax(dim=1),
    out_shape=lambda case: (case["rows"],),
    out_dtype=lambda dtype: torch.float32,
    cases=({"rows": 1, "cols": 1}, {"rows": 4, "cols": 100}, {"rows": 5, "cols": 1000}),
    gpu_cases=({"rows": 4096, "cols": 4096}, {"rows": 1000, "cols": 30_001}),
    dtypes=(torch.float32, torch.bfloat16),
    hints=(
        "The loop is the one of puzzle 5; the accumulator holds a maximum instead of a sum.",
        "Start the running maximum at -inf: tl.full([BLOCK_N], float('-inf'), dtype=tl.float32).",
        "Update it with tl.maximum(running, block) and reduce once at the end with tl.max(running, axis=0).",
        "Lanes past the end of the row: tl.load(..., mask=cols < n_cols, other=float('-inf')). With other=0 "
        "a row of negative numbers reports 0.",
    ),
)
