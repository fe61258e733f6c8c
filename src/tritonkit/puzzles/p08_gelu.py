"""Puzzle 8: GELU, the exact (erf) form.

    out[i] = 0.5 * x[i] * (1 + erf(x[i] / sqrt(2)))

Shapes: x and out are 1-D tensors of n elements, float32 or bfloat16.

Blocks: cdiv(n, BLOCK) programs, BLOCK = 256.

Triton's math library has erf: tl.math.erf. Compute in float32.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def gelu_kernel(p_x, p_out, n, BLOCK: tl.constexpr):
    """out = x * Phi(x), Phi the standard normal CDF, in float32."""
    o_x = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m_x = o_x < n
    b_x = tl.load(p_x + o_x, mask=m_x).to(tl.float32)  # [BLOCK]
    b_out = 0.5 * b_x * (1.0 + tl.math.erf(b_x * 0.7071067811865476))
    tl.store(p_out + o_x, b_out, mask=m_x)


def gelu(x: torch.Tensor, out: torch.Tensor) -> None:
    """The launcher (given)."""
    n = out.numel()
    BLOCK = 256
    gelu_kernel[(triton.cdiv(n, BLOCK),)](x, out, n, BLOCK=BLOCK)


# ===== checker data: not part of the learner's file =====
from tritonkit.puzzles._base import Puzzle, draw  # noqa: E402

PUZZLE = Puzzle(
    title="GELU",
    kernel="gelu_kernel",
    launcher="gelu",
    make_inputs=lambda case, dtype, device, gen: (draw(case["n"], dtype, device, gen, scale=3.0),),
    reference=lambda x: torch.nn.functional.gelu(x),
    out_shape=lambda case: (case["n"],),
    cases=({"n": 1}, {"n": 300}, {"n": 1000}),
    gpu_cases=({"n": (1 << 20) + 3},),
    dtypes=(torch.float32, torch.bfloat16),
    block_arg="BLOCK",
    hints=(
        "The blocks, offsets and mask are those of puzzle 2.",
        "1 / sqrt(2) = 0.7071067811865476; tl.math.erf works elementwise on a block.",
        "Load, .to(tl.float32), then 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476)).",
    ),
)
