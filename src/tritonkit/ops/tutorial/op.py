"""The guide's kernels as public functions: copy, add, add_relu, rgb_to_grey and matmul, with their autograd.

Each is differentiable where its math is: copy's gradient is a copy, add's passes through, add_relu's is masked by
the output, float rgb_to_grey's is its three weights, and matmul's two products run on the ladder itself (so a
double backward works). They come from the one autograd factory, which also makes them torch custom ops that
torch.compile traces without a graph break. uint8 rgb_to_grey has no gradient (integers cannot require grad).
"""

from __future__ import annotations

import torch

from tritonkit._core.autograd import differentiable_op
from tritonkit.ops.tutorial.launch import (
    add_fake,
    add_fwd,
    check_add_args,
    check_copy_args,
    check_matmul_args,
    check_rgb_to_grey_args,
    copy_fake,
    copy_fwd,
    matmul_fake,
    matmul_fwd,
    relu_bwd,
    relu_bwd_fake,
    rgb_to_grey_bwd,
    rgb_to_grey_bwd_fake,
    rgb_to_grey_fake,
    rgb_to_grey_fwd,
)


def _save_nothing(ctx, inputs, outputs):
    ctx.options = inputs[1:]


def _copy_gradients(ctx, grad_outputs, copy):
    """copy is its own backward: the gradient is a copy of the output's."""
    return (copy(grad_outputs[0], *ctx.options),)


copy_op = differentiable_op("copy", forward=copy_fwd, forward_fake=copy_fake, save=_save_nothing,
                            gradients=_copy_gradients)  # fmt: skip


def _save_add(ctx, inputs, outputs):
    ctx.apply_relu = inputs[2]
    if ctx.apply_relu:
        ctx.save_for_backward(outputs[0])


def _add_gradients(ctx, grad_outputs, backward):
    """d(x) = d(y) = the output's gradient, masked where relu(x + y) is 0."""
    grad = grad_outputs[0]
    if ctx.apply_relu:
        (out,) = ctx.saved_tensors
        grad = backward(grad, out)
    return grad, grad


add_op = differentiable_op("add", forward=add_fwd, forward_fake=add_fake, backward=relu_bwd,
                           backward_fake=relu_bwd_fake, save=_save_add, gradients=_add_gradients)  # fmt: skip


def _rgb_to_grey_gradients(ctx, grad_outputs, backward):
    return (backward(grad_outputs[0]),)


rgb_to_grey_op = differentiable_op(
    "rgb_to_grey",
    forward=rgb_to_grey_fwd,
    forward_fake=rgb_to_grey_fake,
    backward=rgb_to_grey_bwd,
    backward_fake=rgb_to_grey_bwd_fake,
    save=lambda ctx, inputs, outputs: None,
    gradients=_rgb_to_grey_gradients,
)


def _save_matmul(ctx, inputs, outputs):
    a, b, *options = inputs
    ctx.save_for_backward(a, b)
    ctx.options = tuple(options)


def _matmul_gradients(ctx, grad_outputs, matmul):
    """d(a) = d(c) b^T and d(b) = a^T d(c), each by the same variant of the ladder (strides, not copies, for the
    transposes); only those asked for."""
    grad = grad_outputs[0]
    a, b = ctx.saved_tensors
    need_a, need_b = ctx.needs_input_grad[:2]
    return (
        matmul(grad, b.t(), *ctx.options) if need_a else None,
        matmul(a.t(), grad, *ctx.options) if need_b else None,
    )


matmul_op = differentiable_op("matmul", forward=matmul_fwd, forward_fake=matmul_fake, save=_save_matmul,
                              gradients=_matmul_gradients)  # fmt: skip


def copy(x: torch.Tensor, *, block_size: int = 1024) -> torch.Tensor:
    """A contiguous copy of ``x`` (any shape, strides and dtype), ``block_size`` elements per program.

    A byte copy: every dtype of a plain strided tensor, complex, float8, bool and unsigned included, moved as
    integers of its element's width (a complex128 as two int64s, still ``block_size`` elements a program). A
    conjugated view is copied as its values. Quantized and sparse tensors raise TypeError. Differentiable (the
    gradient is a copy of the output's). Example: ``tk.ops.copy(torch.arange(10.0, device="cuda"), block_size=3)``.
    """
    check_copy_args(x, block_size)
    return copy_op(x, block_size)


def add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``x + y`` for two floating tensors of one shape and dtype (no broadcasting). Differentiable in both."""
    check_add_args(x, y)
    return add_op(x, y, False)


def add_relu(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``relu(x + y)`` in one pass, for two floating tensors of one shape and dtype. Differentiable in both: the
    gradient passes where the output is positive, as torch's relu."""
    check_add_args(x, y)
    return add_op(x, y, True)


def rgb_to_grey(img: torch.Tensor) -> torch.Tensor:
    """Greyscale of a (3, H, W) RGB image: 0.2989 R + 0.5870 G + 0.1140 B, shape (H, W).

    Float images give the same float dtype, differentiable (the gradient of each channel is its weight times the
    output's); uint8 images give uint8 rounded to nearest and clamped to [0, 255], with no gradient. Any strides.
    Example: ``tk.ops.rgb_to_grey(torch.rand(3, 480, 640, device="cuda"))``.
    """
    check_rgb_to_grey_args(img)
    return rgb_to_grey_op(img)


def matmul(a: torch.Tensor, b: torch.Tensor, *, variant: str = "auto", group_size: int | None = None) -> torch.Tensor:
    """``a @ b`` for a (M, K) and b (K, N), any strides; fp32 accumulation, output in the input dtype.

    ``variant``: "naive" (one program per output tile, row-major), "grouped" (tiles swizzled in groups
    of ``group_size`` tile-rows for L2 reuse, default 8), "autotuned" (block sizes, warps and stages
    autotuned per (M, N, K)), "persistent" (one program per multiprocessor, tiles through TMA, on Hopper and
    newer; tiles chosen by M and N) or "auto" (the persistent kernel on Hopper for 16-bit operands TMA can read,
    else autotuned; grouped under the interpreter: see :func:`choose_matmul_variant`). fp32 inputs use TF32 only
    when ``torch.get_float32_matmul_precision()`` is not "highest", like torch.matmul.

    Differentiable in a and b: d(a) = d(c) b^T and d(b) = a^T d(c) run on the same variant (twice the forward's
    work), and are themselves differentiable.

    Example: ``tk.ops.matmul(a, b, variant="grouped", group_size=4)``.
    """
    check_matmul_args(a, b, variant, group_size)
    return matmul_op(a, b, variant, group_size)
