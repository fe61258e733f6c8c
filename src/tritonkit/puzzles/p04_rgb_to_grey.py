"""Puzzle 4: RGB to greyscale, with 2-D masks.

    grey[h, w] = 0.2989 * img[0, h, w] + 0.5870 * img[1, h, w] + 0.1140 * img[2, h, w]

Shapes: img is a contiguous (3, H, W) float32 image (channels first), grey is (H, W). Channel c of
pixel (h, w) is at p_img + c * H * W + h * W + w. H and W are any sizes (1, 17, 33, 40, 45, ...).

Blocks: a 2-D grid of cdiv(H, BLOCK_H) x cdiv(W, BLOCK_W) programs, BLOCK_H = BLOCK_W = 16. Each
program converts one tile; the tiles on the right and bottom edges stick out of the image, so the
mask needs both the row and the column condition.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def grey_kernel(p_img, p_grey, height, width, BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr):
    """One [BLOCK_H, BLOCK_W] tile of the greyscale image."""
    o_h = tl.program_id(0) * BLOCK_H + tl.arange(0, BLOCK_H)
    o_w = tl.program_id(1) * BLOCK_W + tl.arange(0, BLOCK_W)
    o_hw = o_h[:, None] * width + o_w[None, :]  # [BLOCK_H, BLOCK_W]
    m_hw = (o_h[:, None] < height) & (o_w[None, :] < width)
    plane = height * width
    b_r = tl.load(p_img + o_hw, mask=m_hw)
    b_g = tl.load(p_img + plane + o_hw, mask=m_hw)
    b_b = tl.load(p_img + 2 * plane + o_hw, mask=m_hw)
    tl.store(p_grey + o_hw, 0.2989 * b_r + 0.5870 * b_g + 0.1140 * b_b, mask=m_hw)


def rgb_to_grey(img: torch.Tensor, grey: torch.Tensor) -> None:
    """The launcher (given)."""
    height, width = grey.shape
    BLOCK_H = BLOCK_W = 16
    grid = (triton.cdiv(height, BLOCK_H), triton.cdiv(width, BLOCK_W))
    grey_kernel[grid](img, grey, height, width, BLOCK_H=BLOCK_H, BLOCK_W=BLOCK_W)


# ===== checker data: not part of the learner's file =====

from tritonkit.puzzles._base import Puzzle  # noqa: E402


def _image(case, dtype, device, gen):
    return (torch.rand((3, case["h"], case["w"]), device=device, generator=gen, dtype=torch.float32).to(dtype),)


PUZZLE = Puzzle(
    title="RGB to grey (2-D masks)",
    kernel="grey_kernel",
    launcher="rgb_to_grey",
    make_inputs=_image,
    reference=lambda img: 0.2989 * img[0] + 0.5870 * img[1] + 0.1140 * img[2],
    out_shape=lambda case: (case["h"], case["w"]),
    cases=({"h": 1, "w": 1}, {"h": 17, "w": 40}, {"h": 45, "w": 33}),
    gpu_cases=({"h": 1080, "w": 1920}, {"h": 4001, "w": 3001}),
    hints=(
        "Like puzzle 3: rows from tl.program_id(0), columns from tl.program_id(1), and a [BLOCK_H, BLOCK_W] "
        "block of offsets h[:, None] * W + w[None, :].",
        "The three channels are three planes of H * W values: add c * H * W to the offsets for channel c.",
        "Mask both ways: (h[:, None] < H) & (w[None, :] < W). A column mask alone lets the bottom tiles write "
        "past the last row; a row mask alone lets the right-hand tiles wrap into the next row.",
    ),
)
