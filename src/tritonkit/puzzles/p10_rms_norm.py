"""Puzzle 10: RMSNorm over rows.

    rms_r = sqrt((1/N) sum_c x[r, c]^2 + eps)
    out[r, c] = x[r, c] / rms_r * w[c],      eps = 1e-6

Shapes: x and out are (n_rows, N), float32 or bfloat16, rows contiguous (strides passed); w is (N,)
in x's dtype. N goes up to 300.

Blocks: one program per row; BLOCK_N = next power of two >= N (the whole row in one block).

RMSNorm is layer norm without the mean and the bias: cheaper, and what Llama uses.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def rms_norm_kernel(p_x, p_w, p_out, n_cols, stride_x_row, stride_out_row, eps, BLOCK_N: tl.constexpr):
    """One row of RMSNorm in float32."""
    i_row = tl.program_id(0)
    o_c = tl.arange(0, BLOCK_N)
    m_c = o_c < n_cols
    b_x = tl.load(p_x + i_row * stride_x_row + o_c, mask=m_c, other=0.0).to(tl.float32)  # [BLOCK_N]
    rstd = 1.0 / tl.sqrt(tl.sum(b_x * b_x, axis=0) / n_cols + eps)
    b_w = tl.load(p_w + o_c, mask=m_c).to(tl.float32)
    tl.store(p_out + i_row * stride_out_row + o_c, b_x * rstd * b_w, mask=m_c)


def rms_norm(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor) -> None:
    """The launcher (given)."""
    n_rows, n_cols = x.shape
    BLOCK_N = triton.next_power_of_2(n_cols)
    rms_norm_kernel[(n_rows,)](x, w, out, n_cols, x.stride(0), out.stride(0), 1e-6, BLOCK_N=BLOCK_N)


# ===== checker data: not part of the learner's file =====
from tritonkit.puzzles._base import Puzzle, draw  # noqa: E402


def _inputs(case, dtype, device, gen):
    rows, cols = case["rows"], case["cols"]
    return (draw((rows, cols), dtype, device, gen, scale=2.0), draw(cols, dtype, device, gen, scale=0.5, shift=1.0))


def _reference(x, w):
    return x * torch.rsqrt(x.pow(2).mean(dim=1, keepdim=True) + 1e-6) * w


PUZZLE = Puzzle(
    title="RMSNorm",
    kernel="rms_norm_kernel",
    launcher="rms_norm",
    make_inputs=_inputs,
    reference=_reference,
    out_shape=lambda case: (case["rows"], case["cols"]),
    cases=({"rows": 1, "cols": 1}, {"rows": 3, "cols": 7}, {"rows": 5, "cols": 100}, {"rows": 4, "cols": 300}),
    gpu_cases=({"rows": 4096, "cols": 4096}, {"rows": 1000, "cols": 5000}),
    dtypes=(torch.float32, torch.bfloat16),
    hints=(
        "The row set-up is that of puzzle 9: one program per row, the whole row in one block.",
        "Masked lanes loaded with other=0.0 add nothing to the sum of squares, so no tl.where is needed here.",
        "rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / N + eps); out = x * rstd * w.",
    ),
)
