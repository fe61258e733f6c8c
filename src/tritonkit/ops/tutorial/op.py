"""The guide's kernels as public functions: copy, add, add_relu, rgb_to_grey and matmul (forward only)."""

from __future__ import annotations

import torch

from tritonkit.ops.tutorial.launch import add_fwd, check_matmul_args, copy_fwd, matmul_fwd, rgb_to_grey_fwd


def copy(x: torch.Tensor, *, block_size: int = 1024) -> torch.Tensor:
    """A contiguous copy of ``x`` (any shape, any dtype), ``block_size`` elements per program.

    Example: ``tk.ops.copy(torch.arange(10.0, device="cuda"), block_size=3)``.
    """
    return copy_fwd(x, block_size)


def add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``x + y`` for two floating tensors of one shape and dtype (no broadcasting)."""
    return add_fwd(x, y, False)


def add_relu(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``relu(x + y)`` in one pass, for two floating tensors of one shape and dtype."""
    return add_fwd(x, y, True)


def rgb_to_grey(img: torch.Tensor) -> torch.Tensor:
    """Greyscale of a (3, H, W) RGB image: 0.2989 R + 0.5870 G + 0.1140 B, shape (H, W).

    Float images give the same float dtype; uint8 images give uint8 rounded to nearest and clamped to
    [0, 255]. Any strides. Example: ``tk.ops.rgb_to_grey(torch.rand(3, 480, 640, device="cuda"))``.
    """
    return rgb_to_grey_fwd(img)


def matmul(a: torch.Tensor, b: torch.Tensor, *, variant: str = "auto", group_size: int | None = None) -> torch.Tensor:
    """``a @ b`` for a (M, K) and b (K, N), any strides; fp32 accumulation, output in the input dtype.

    ``variant``: "naive" (one program per output tile, row-major), "grouped" (tiles swizzled in groups
    of ``group_size`` tile-rows for L2 reuse, default 8), "autotuned" (block sizes, warps and stages
    autotuned per (M, N, K)) or "auto" (see :func:`choose_matmul_variant`). fp32 inputs use TF32 only
    when ``torch.get_float32_matmul_precision()`` is not "highest", like torch.matmul.

    Example: ``tk.ops.matmul(a, b, variant="grouped", group_size=4)``.
    """
    check_matmul_args(a, b, variant, group_size)
    return matmul_fwd(a, b, variant, group_size)
