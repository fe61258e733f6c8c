"""The one launcher for pointwise kernels: any shape, any strides, one program per block of elements.

Pointwise kernels take flat pointers and an element count. Inputs that share one dense layout
(contiguous, or a permutation of it such as a transpose) are walked in storage order, and the output
gets that same layout, so no copy is made. Any other layout (slices with gaps, expanded stride-0
views, inputs with different layouts) is made contiguous by torch first, once.
"""

from __future__ import annotations

import torch

from tritonkit._core import alloc
from tritonkit._core.ints import cdiv

BLOCK_SIZE = 1024


def _is_dense(t: torch.Tensor) -> bool:
    """Whether ``t`` covers its storage span exactly once: contiguous up to a permutation of dims."""
    if t.is_contiguous():
        return True
    order = sorted(range(t.dim()), key=lambda d: t.stride(d), reverse=True)
    return t.permute(order).is_contiguous()


def launch_elementwise(kernel, inputs: list[torch.Tensor], out_dtype: torch.dtype, n_outputs: int = 1,
                       **constexprs):  # fmt: skip
    """Run ``kernel[grid](*inputs, *outs, n_elements, BLOCK_SIZE=..., **constexprs)`` over every element;
    return the output, or a tuple of ``n_outputs`` outputs.

    All inputs must have one shape (callers check it) and one device.
    """
    first = inputs[0]
    shared_layout = all(t.stride() == first.stride() for t in inputs) and _is_dense(first)
    if not shared_layout:
        inputs = [t.contiguous() for t in inputs]
    outs = [alloc.empty_like(inputs[0], dtype=out_dtype) for _ in range(n_outputs)]
    n = outs[0].numel()
    if n:
        kernel[(cdiv(n, BLOCK_SIZE),)](*inputs, *outs, n, BLOCK_SIZE=BLOCK_SIZE, **constexprs)
    return outs[0] if n_outputs == 1 else tuple(outs)
