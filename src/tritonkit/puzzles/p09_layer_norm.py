"""Puzzle 9: layer norm over rows.

    mean_r = (1/N) sum_c x[r, c]
    var_r  = (1/N) sum_c (x[r, c] - mean_r)^2
    out[r, c] = (x[r, c] - mean_r) / sqrt(var_r + eps) * w[c] + b[c],      eps = 1e-5

Shapes: x and out are (n_rows, N), float32 or bfloat16, rows contiguous (strides passed); w and b
are (N,) in x's dtype. N goes up to 300.

Blocks: one program per row; BLOCK_N = next power of two >= N, so a whole row is one block.

The trap: masked lanes load as 0, which is harmless in the mean but not in the variance, where
(0 - mean)^2 would count once per padded lane. Zero them with tl.where before squaring.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def layer_norm_kernel(p_x, p_w, p_b, p_out, n_cols, stride_x_row, stride_out_row, eps, BLOCK_N: tl.constexpr):
    """One row of layer norm, the whole row in one block, statistics in float32."""
    i_row = tl.program_id(0)
    o_c = tl.arange(0, BLOCK_N)
    m_c = o_c < n_cols
    b_x = tl.load(p_x + i_row * stride_x_row + o_c, mask=m_c, other=0.0).to(tl.float32)  # [BLOCK_N]
    mean = tl.sum(b_x, axis=0) / n_cols
    b_centred = tl.where(m_c, b_x - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(b_centred * b_centred, axis=0) / n_cols + eps)
    b_w = tl.load(p_w + o_c, mask=m_c).to(tl.float32)
    b_b = tl.load(p_b + o_c, mask=m_c).to(tl.float32)
    tl.store(p_out + i_row * stride_out_row + o_c, b_centred * rstd * b_w + b_b, mask=m_c)


def layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
    """The launcher (given)."""
    n_rows, n_cols = x.shape
    BLOCK_N = triton.next_power_of_2(n_cols)
    layer_norm_kernel[(n_rows,)](x, w, b, out, n_cols, x.stride(0), out.stride(0), 1e-5, BLOCK_N=BLOCK_N)


# ===== checker data: not part of the learner's file =====
from tritonkit.puzzles._base import Puzzle, draw  # noqa: E402


def _inputs(case, dtype, device, gen):
    rows, cols = case["rows"], case["cols"]
    return (
        draw((rows, cols), dtype, device, gen, scale=2.0, shift=1.0),
        draw(cols, dtype, device, gen, scale=0.5, shift=1.0),
        draw(cols, dtype, device, gen, scale=0.5),
    )


PUZZLE = Puzzle(
    title="layer norm",
    kernel="layer_norm_kernel",
    launcher="layer_norm",
    make_inputs=_inputs,
    reference=lambda x, w, b: torch.nn.functional.layer_norm(x, (x.shape[1],), w, b, eps=1e-5),
    out_shape=lambda case: (case["rows"], case["cols"]),
    cases=({"rows": 1, "cols": 1}, {"rows": 3, "cols": 7}, {"rows": 5, "cols": 100}, {"rows": 4, "cols": 300}),
    gpu_cases=({"rows": 4096, "cols": 4096}, {"rows": 1000, "cols": 5000}),
    dtypes=(torch.float32, torch.bfloat16),
    hints=(
        "One program per row, and the row fits in one block: offsets tl.arange(0, BLOCK_N), mask cols < N.",
        "Load in float32 with other=0.0; mean = tl.sum(x, axis=0) / N.",
        "Centre with tl.where(mask, x - mean, 0.0): the padded lanes would otherwise add mean^2 each to the variance.",
        "rstd = 1.0 / tl.sqrt(tl.sum(c * c, axis=0) / N + eps); out = c * rstd * w + b, stored with the mask.",
    ),
)
