"""The one launcher for pointwise kernels: any shape, any strides, one program per block of elements.

Pointwise kernels take flat pointers and an element count. Inputs that share one dense layout
(contiguous, or a permutation of it such as a transpose) are walked in storage order, and the output
gets that same layout, so no copy is made. Any other layout (slices with gaps, expanded stride-0
views, inputs with different layouts) is made contiguous by torch first, once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tritonkit._core.ints import cdiv


@dataclass(frozen=True)
class ElementwisePlan:
    """One pointwise launch: ``block_size`` elements a program."""

    block_size: int
    warps: int = 4


# The block a family's plan falls back to where it measured none: 1024 elements a program (8 a thread at 4 warps), the
# block that moved a 64 MB bf16 copy fastest (4096-element programs were 4 points slower; docs/kernels/tutorial.md).
FALLBACK_PLAN = ElementwisePlan(block_size=1024)


def _is_dense(t: torch.Tensor) -> bool:
    """Whether ``t`` covers its storage span exactly once: contiguous up to a permutation of dims."""
    if t.is_contiguous():
        return True
    order = sorted(range(t.dim()), key=lambda d: t.stride(d), reverse=True)
    return t.permute(order).is_contiguous()


def launch_elementwise(kernel, inputs: list[torch.Tensor], out_dtype: torch.dtype, plan: ElementwisePlan,
                       n_outputs: int = 1, **constexprs):  # fmt: skip
    """Run ``kernel[grid](*inputs, *outs, n_elements, BLOCK_SIZE=plan.block_size, **constexprs)`` over every
    element; return the output, or a tuple of ``n_outputs`` outputs.

    All inputs must have one shape (callers check it) and one device.
    """
    first = inputs[0]
    shared_layout = all(t.stride() == first.stride() for t in inputs) and _is_dense(first)
    if not shared_layout:
        inputs = [t.contiguous() for t in inputs]
    outs = [torch.empty_like(inputs[0], dtype=out_dtype, memory_format=torch.preserve_format) for _ in range(n_outputs)]
    n = outs[0].numel()
    if n:
        kernel[(cdiv(n, plan.block_size),)](*inputs, *outs, n, BLOCK_SIZE=plan.block_size, **constexprs,
                                            num_warps=plan.warps)  # fmt: skip
    return outs[0] if n_outputs == 1 else tuple(outs)
