"""Puzzle 2: fused add + ReLU, in float32 and bfloat16.

    out[i] = max(x[i] + y[i], 0)        for 0 <= i < n

Shapes: x, y and out are 1-D tensors of n elements, float32 or bfloat16 (out has x's dtype).

Blocks: cdiv(n, BLOCK) programs, BLOCK = 256, as in puzzle 1.

Why fuse: torch computes x + y, writes it to memory, and reads it back for the ReLU; one kernel
keeps the sum in registers and moves 3n elements instead of 5n.

Precision: compute in float32 whatever the input dtype. Load, .to(tl.float32), compute; the store
casts back to out's dtype. Under the interpreter, bf16 arithmetic without the cast gives garbage.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def add_relu_kernel(p_x, p_y, p_out, n, BLOCK: tl.constexpr):
    """out = max(x + y, 0), computed in float32."""
    o_x = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m_x = o_x < n
    b_x = tl.load(p_x + o_x, mask=m_x).to(tl.float32)  # [BLOCK]
    b_y = tl.load(p_y + o_x, mask=m_x).to(tl.float32)  # [BLOCK]
    b_out = tl.maximum(b_x + b_y, 0.0)
    tl.store(p_out + o_x, b_out, mask=m_x)  # the store casts to out's dtype


def add_relu(x: torch.Tensor, y: torch.Tensor, out: torch.Tensor) -> None:
    """The launcher (given)."""
    n = out.numel()
    BLOCK = 256
    add_relu_kernel[(triton.cdiv(n, BLOCK),)](x, y, out, n, BLOCK=BLOCK)


# ===== checker data: not part of the learner's file =====

from tritonkit.puzzles._base import Puzzle, draw  # noqa: E402

PUZZLE = Puzzle(
    title="fused add + ReLU",
    kernel="add_relu_kernel",
    launcher="add_relu",
    make_inputs=lambda case, dtype, device, gen: (
        draw(case["n"], dtype, device, gen),
        draw(case["n"], dtype, device, gen),
    ),
    reference=lambda x, y: torch.relu(x + y),
    out_shape=lambda case: (case["n"],),
    cases=({"n": 1}, {"n": 300}, {"n": 1000}),
    gpu_cases=({"n": (1 << 20) + 3}, {"n": 98_765}),
    dtypes=(torch.float32, torch.bfloat16),
    block_arg="BLOCK",
    hints=(
        "Start from your puzzle 1: same offsets, same mask, one more operation before the store.",
        "tl.maximum(a, 0.0) is the ReLU of a block.",
        "bfloat16 fails under the interpreter unless you compute in float32: tl.load(...).to(tl.float32).",
        "b = tl.maximum(tl.load(p_x + o, mask=m).to(tl.float32) + tl.load(p_y + o, mask=m).to(tl.float32), 0.0); "
        "tl.store(p_out + o, b, mask=m)",
    ),
)
