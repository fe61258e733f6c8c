"""Puzzle 7: softmax over long rows, online.

    out[r, c] = exp(x[r, c] - m_r) / l_r,   m_r = max over c of x[r, c],   l_r = sum over c of exp(x[r, c] - m_r)

Shapes: x and out are (n_rows, n_cols), float32 or bfloat16, rows contiguous (strides passed).
n_cols goes up to 1000, longer than the block.

Blocks: one program per row, BLOCK_N = 64 columns per step. A row does not fit in one block, so
the program reads it twice:
  1. online pass: keep a running maximum m and a running sum l of exp(x - m). When a block raises
     the maximum from m to m', rescale the sum first: l = l * exp(m - m') + sum(exp(block - m')).
  2. write pass: out = exp(x - m) / l, block by block.
Subtracting the maximum keeps exp from overflowing; masked lanes load as -inf so that exp gives 0.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def softmax_kernel(p_x, p_out, n_cols, stride_x_row, stride_out_row, BLOCK_N: tl.constexpr):
    """softmax of one row: an online pass for (max, sum), then a pass that writes."""
    i_row = tl.program_id(0)
    p_row = p_x + i_row * stride_x_row
    m = tl.full([], float("-inf"), dtype=tl.float32)  # running maximum
    l = tl.zeros([], dtype=tl.float32)  # noqa: E741 - running sum of exp(x - m), the usual name
    for start in range(0, n_cols, BLOCK_N):
        o_c = start + tl.arange(0, BLOCK_N)
        b_x = tl.load(p_row + o_c, mask=o_c < n_cols, other=float("-inf")).to(tl.float32)  # [BLOCK_N]
        m_new = tl.maximum(m, tl.max(b_x, axis=0))  # finite from the first block on: a row has >= 1 element
        l = l * tl.exp(m - m_new) + tl.sum(tl.exp(b_x - m_new), axis=0)  # noqa: E741
        m = m_new
    for start in range(0, n_cols, BLOCK_N):
        o_c = start + tl.arange(0, BLOCK_N)
        b_x = tl.load(p_row + o_c, mask=o_c < n_cols, other=float("-inf")).to(tl.float32)
        tl.store(p_out + i_row * stride_out_row + o_c, tl.exp(b_x - m) / l, mask=o_c < n_cols)


def softmax(x: torch.Tensor, out: torch.Tensor) -> None:
    """The launcher (given)."""
    n_rows, n_cols = x.shape
    softmax_kernel[(n_rows,)](x, out, n_cols, x.stride(0), out.stride(0), BLOCK_N=64)


# ===== checker data: not part of the learner's file =====
from tritonkit.puzzles._base import Puzzle, draw  # noqa: E402

PUZZLE = Puzzle(
    title="softmax (online, long rows)",
    kernel="softmax_kernel",
    launcher="softmax",
    make_inputs=lambda case, dtype, device, gen: (draw((case["rows"], case["cols"]), dtype, device, gen, scale=4.0),),
    reference=lambda x: torch.softmax(x, dim=1),
    out_shape=lambda case: (case["rows"], case["cols"]),
    cases=({"rows": 1, "cols": 1}, {"rows": 4, "cols": 64}, {"rows": 5, "cols": 300}, {"rows": 2, "cols": 1000}),
    gpu_cases=({"rows": 4096, "cols": 4096}, {"rows": 1000, "cols": 30_001}),
    dtypes=(torch.float32, torch.bfloat16),
    hints=(
        "First write the non-online version in your head: pass 1 finds the row max m, pass 2 sums "
        "exp(x - m), pass 3 writes exp(x - m) / sum. The online trick merges passes 1 and 2.",
        "Start with m = tl.full([], float('-inf'), dtype=tl.float32) and l = tl.zeros([], dtype=tl.float32). "
        "For each block: m_new = tl.maximum(m, tl.max(x, axis=0)); l = l * tl.exp(m - m_new) + "
        "tl.sum(tl.exp(x - m_new), axis=0); m = m_new.",
        "Load masked lanes with other=float('-inf'): exp(-inf - m) is 0, so they add nothing to l.",
        "The second loop reloads each block and stores tl.exp(x - m) / l with the column mask.",
    ),
)
