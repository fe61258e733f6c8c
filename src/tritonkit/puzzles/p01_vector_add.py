"""Puzzle 1: vector add.

    out[i] = x[i] + y[i]        for 0 <= i < n

Shapes: x, y and out are 1-D float32 tensors of n elements. n is any size, often not a multiple of
the block (the checker tries 1, 100, 384, 1000 and others).

Blocks: the launcher below runs cdiv(n, BLOCK) programs with BLOCK = 128. Program k handles elements
k * BLOCK to k * BLOCK + BLOCK - 1; the last program must not touch element n or beyond.

Names: the project writes p_ for pointers, o_ for offsets, m_ for masks and b_ for loaded blocks.

Check your kernel with `tritonkit puzzles check DIR 1`; `tritonkit puzzles hint 1` when stuck.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def vector_add_kernel(p_x, p_y, p_out, n, BLOCK: tl.constexpr):
    """out[i] = x[i] + y[i] for this program's BLOCK elements."""
    i_block = tl.program_id(0)
    o_x = i_block * BLOCK + tl.arange(0, BLOCK)
    m_x = o_x < n
    b_x = tl.load(p_x + o_x, mask=m_x)  # [BLOCK]
    b_y = tl.load(p_y + o_x, mask=m_x)  # [BLOCK]
    tl.store(p_out + o_x, b_x + b_y, mask=m_x)


def vector_add(x: torch.Tensor, y: torch.Tensor, out: torch.Tensor) -> None:
    """The launcher (given): one program per BLOCK elements. The checker calls it and reads ``out``."""
    n = out.numel()
    BLOCK = 128
    grid = (triton.cdiv(n, BLOCK),)
    vector_add_kernel[grid](x, y, out, n, BLOCK=BLOCK)


# ===== checker data: not part of the learner's file =====
from tritonkit.puzzles._base import Puzzle, draw  # noqa: E402

PUZZLE = Puzzle(
    title="vector add",
    kernel="vector_add_kernel",
    launcher="vector_add",
    make_inputs=lambda case, dtype, device, gen: (
        draw(case["n"], dtype, device, gen),
        draw(case["n"], dtype, device, gen),
    ),
    reference=lambda x, y: x + y,
    out_shape=lambda case: (case["n"],),
    cases=({"n": 1}, {"n": 100}, {"n": 384}, {"n": 1000}),
    gpu_cases=({"n": (1 << 20) + 3}, {"n": 98_765}),
    block_arg="BLOCK",
    hints=(
        "Program k handles elements k*BLOCK to k*BLOCK + BLOCK - 1, and tl.program_id(0) tells the program its k.",
        "tl.arange(0, BLOCK) is the vector [0, 1, ..., BLOCK-1]. Add k * BLOCK (not k * n) to get this "
        "program's offsets.",
        "p_x + offsets is a block of BLOCK pointers: tl.load(p_x + offsets, mask=...) reads them all at once, "
        "and tl.store(p_out + offsets, value, mask=...) writes them.",
        "The last program runs past n: mask = offsets < n, passed to both loads and to the store.",
        "offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK); mask = offsets < n; "
        "tl.store(p_out + offsets, tl.load(p_x + offsets, mask=mask) + tl.load(p_y + offsets, mask=mask), "
        "mask=mask)",
    ),
)
