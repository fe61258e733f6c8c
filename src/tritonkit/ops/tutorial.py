"""Tutorial kernels from the practitioner's guide to Triton: copy, add, add_relu, rgb_to_grey.

They are small on purpose and show the patterns every later kernel uses: one program per block of
elements, masks on ragged edges, fp32 arithmetic with a cast on store, 2-D grids with 2-D masks.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tritonkit._core import alloc
from tritonkit._core.checks import (
    FLOAT_DTYPES,
    check_device,
    check_positive_int,
    check_same_dtype,
    check_same_shape,
    check_tensor,
)
from tritonkit._core.elementwise import launch_elementwise
from tritonkit.debug import mask_2d, offsets_2d
from tritonkit.registry import Inputs, KernelSpec, register

__all__ = ["add", "add_relu", "copy", "rgb_to_grey"]

_MAX_BLOCK = 65536


def _dense(x: torch.Tensor) -> torch.Tensor:
    """``x`` itself when contiguous (the kernels index its elements linearly); a non-contiguous or
    expanded input costs one torch copy first."""
    return x if x.is_contiguous() else x.contiguous()


# --------------------------------------------------------------------------------------------------
# copy
# --------------------------------------------------------------------------------------------------
@triton.jit
def _copy_kernel(p_x, p_out, n_elements, BLOCK_SIZE: tl.constexpr, BLOCK_POW2: tl.constexpr):
    """out[i] = x[i] for i < n_elements; program k copies [k*BLOCK_SIZE, (k+1)*BLOCK_SIZE).

    ``tl.arange`` needs a power of two, so a block of any size is covered by the next power of two
    with the lanes past BLOCK_SIZE masked off.
    """
    i_block = tl.program_id(0).to(tl.int64)  # int64: block * size can pass 2**31
    o_local = tl.arange(0, BLOCK_POW2)
    o_x = i_block * BLOCK_SIZE + o_local
    m_x = (o_local < BLOCK_SIZE) & (o_x < n_elements)
    b_x = tl.load(p_x + o_x, mask=m_x)  # [BLOCK_POW2]
    tl.store(p_out + o_x, b_x, mask=m_x)


def copy(x: torch.Tensor, *, block_size: int = 1024) -> torch.Tensor:
    """A contiguous copy of ``x`` (any shape, any dtype), ``block_size`` elements per program.

    Example: ``tk.ops.copy(torch.arange(10.0, device="cuda"), block_size=3)``.
    """
    check_tensor("x", x)
    check_positive_int("block_size", block_size)
    if block_size > _MAX_BLOCK:
        raise ValueError(f"block_size must be at most {_MAX_BLOCK}, got {block_size}")
    check_device(x=x)
    out = alloc.empty(x.shape, dtype=x.dtype, device=x.device)
    n = x.numel()
    if n == 0:
        return out
    grid = (triton.cdiv(n, block_size),)
    _copy_kernel[grid](_dense(x), out, n, BLOCK_SIZE=block_size, BLOCK_POW2=triton.next_power_of_2(block_size))
    return out


# --------------------------------------------------------------------------------------------------
# add, add_relu: one kernel, the activation a constexpr switch
# --------------------------------------------------------------------------------------------------
@triton.jit
def _add_kernel(p_x, p_y, p_out, n_elements, APPLY_RELU: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """out = x + y, or max(x + y, 0) with APPLY_RELU; computed in fp32, stored in the output dtype."""
    i_block = tl.program_id(0).to(tl.int64)
    o_x = i_block * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    m_x = o_x < n_elements
    b_x = tl.load(p_x + o_x, mask=m_x).to(tl.float32)  # [BLOCK_SIZE]
    b_y = tl.load(p_y + o_x, mask=m_x).to(tl.float32)  # [BLOCK_SIZE]
    b_out = b_x + b_y
    if APPLY_RELU:
        b_out = tl.maximum(b_out, 0.0)
    tl.store(p_out + o_x, b_out.to(p_out.dtype.element_ty), mask=m_x)


def _launch_add(x: torch.Tensor, y: torch.Tensor, apply_relu: bool) -> torch.Tensor:
    check_tensor("x", x, dtypes=FLOAT_DTYPES)
    check_tensor("y", y, dtypes=FLOAT_DTYPES)
    check_same_dtype("x", x, "y", y)
    check_same_shape("x", x, "y", y)
    check_device(x=x, y=y)
    return launch_elementwise(_add_kernel, [x, y], x.dtype, APPLY_RELU=apply_relu)


def add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``x + y`` for two floating tensors of one shape and dtype (no broadcasting)."""
    return _launch_add(x, y, apply_relu=False)


def add_relu(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``relu(x + y)`` in one pass, for two floating tensors of one shape and dtype."""
    return _launch_add(x, y, apply_relu=True)


# --------------------------------------------------------------------------------------------------
# rgb_to_grey
# --------------------------------------------------------------------------------------------------
@triton.jit
def _rgb_to_grey_kernel(
    p_img,
    p_out,
    height,
    width,
    stride_img_c,
    stride_img_h,
    stride_img_w,
    stride_out_h,
    stride_out_w,
    IS_UINT8: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_W: tl.constexpr,
):
    """grey = 0.2989 R + 0.5870 G + 0.1140 B on one [BLOCK_H, BLOCK_W] tile per program.

    For uint8 the sum is exact in integers, (2989 R + 5870 G + 1140 B + 5000) // 10000, which rounds
    the true value to nearest (ties up) with no floating-point doubt at .5; the result lies in
    [0, 255] by construction and is clamped anyway.
    """
    i_h = tl.program_id(0)
    i_w = tl.program_id(1)
    o_h = (i_h * BLOCK_H + tl.arange(0, BLOCK_H)).to(tl.int64)
    o_w = (i_w * BLOCK_W + tl.arange(0, BLOCK_W)).to(tl.int64)
    m_hw = mask_2d(o_h, o_w, height, width)
    o_img = offsets_2d(o_h, o_w, stride_img_h, stride_img_w)
    o_out = offsets_2d(o_h, o_w, stride_out_h, stride_out_w)
    if IS_UINT8:
        b_r = tl.load(p_img + o_img, mask=m_hw).to(tl.int32)  # [BLOCK_H, BLOCK_W]
        b_g = tl.load(p_img + stride_img_c + o_img, mask=m_hw).to(tl.int32)
        b_b = tl.load(p_img + 2 * stride_img_c + o_img, mask=m_hw).to(tl.int32)
        b_grey = (2989 * b_r + 5870 * b_g + 1140 * b_b + 5000) // 10000
        b_grey = tl.minimum(tl.maximum(b_grey, 0), 255)
    else:
        b_r = tl.load(p_img + o_img, mask=m_hw).to(tl.float32)  # [BLOCK_H, BLOCK_W]
        b_g = tl.load(p_img + stride_img_c + o_img, mask=m_hw).to(tl.float32)
        b_b = tl.load(p_img + 2 * stride_img_c + o_img, mask=m_hw).to(tl.float32)
        b_grey = 0.2989 * b_r + 0.5870 * b_g + 0.1140 * b_b
    tl.store(p_out + o_out, b_grey.to(p_out.dtype.element_ty), mask=m_hw)


def rgb_to_grey(img: torch.Tensor) -> torch.Tensor:
    """Greyscale of a (3, H, W) RGB image: 0.2989 R + 0.5870 G + 0.1140 B, shape (H, W).

    Float images give the same float dtype; uint8 images give uint8 rounded to nearest and clamped to
    [0, 255]. Any strides. Example: ``tk.ops.rgb_to_grey(torch.rand(3, 480, 640, device="cuda"))``.
    """
    check_tensor("img", img, ndim=3, dtypes=(*FLOAT_DTYPES, torch.uint8))
    if img.shape[0] != 3:
        raise ValueError(f"img must have shape (3, H, W), got {tuple(img.shape)}")
    check_device(img=img)
    height, width = img.shape[1], img.shape[2]
    out = alloc.empty((height, width), dtype=img.dtype, device=img.device)
    if out.numel() == 0:
        return out
    block_h, block_w = 32, 32
    grid = (triton.cdiv(height, block_h), triton.cdiv(width, block_w))
    _rgb_to_grey_kernel[grid](
        img,
        out,
        height,
        width,
        *img.stride(),
        *out.stride(),
        IS_UINT8=img.dtype == torch.uint8,
        BLOCK_H=block_h,
        BLOCK_W=block_w,
    )
    return out


# --------------------------------------------------------------------------------------------------
# References (pure torch, float64 in, float64 or uint8 out)
# --------------------------------------------------------------------------------------------------
def _copy_reference(x, *, block_size=1024):
    return x.clone()


def _add_reference(x, y):
    return x + y


def _add_relu_reference(x, y):
    return torch.relu(x + y)


def _rgb_to_grey_reference(img):
    if img.dtype == torch.uint8:
        r, g, b = img.to(torch.int64)
        return ((2989 * r + 5870 * g + 1140 * b + 5000) // 10000).clamp(0, 255).to(torch.uint8)
    r, g, b = img
    return 0.2989 * r + 0.5870 * g + 0.1140 * b


# --------------------------------------------------------------------------------------------------
# Registry specs
# --------------------------------------------------------------------------------------------------
def _randn(shape, device, dtype, generator):
    return torch.randn(shape, device=device, generator=generator, dtype=torch.float32).to(dtype)


def _vector(case, device, dtype, generator):
    """A 1-D input of case["n"] elements, every case["stride"]-th of a longer one when given."""
    stride = case.get("stride", 1)
    return _randn(case["n"] * stride, device, dtype, generator)[::stride]


def _copy_inputs(case, device, dtype, generator):
    return Inputs((_vector(case, device, dtype, generator),), {"block_size": case["block_size"]})


def _binary_inputs(case, device, dtype, generator):
    return Inputs((_vector(case, device, dtype, generator), _vector(case, device, dtype, generator)))


def _image_inputs(case, device, dtype, generator):
    shape = (3, case["h"], case["w"])
    if dtype == torch.uint8:
        img = torch.randint(0, 256, shape, device=device, generator=generator, dtype=torch.uint8)
    else:
        img = torch.rand(shape, device=device, generator=generator, dtype=torch.float32).to(dtype)
    if case.get("channels_last"):
        img = img.permute(1, 2, 0).contiguous().permute(2, 0, 1)  # an HWC buffer seen as CHW
    return Inputs((img,))


def _elementwise_bytes(n_tensors):
    return lambda case, dtype: n_tensors * case["n"] * dtype.itemsize


_VECTOR_TESTS = ({"n": 0}, {"n": 1}, {"n": 7}, {"n": 123, "stride": 3}, {"n": 4097})
_VECTOR_GPU = ({"n": 1}, {"n": 4097}, {"n": (1 << 24) + 3}, {"n": 1 << 20, "stride": 2})
_VECTOR_BENCH = tuple({"n": 1 << p} for p in range(12, 29, 2))
# What add and add_relu share: two same-shape vectors in, one out.
_BINARY_SPEC_FIELDS = dict(
    limits="x and y of one shape and one floating dtype; no broadcasting. Any strides: inputs sharing a "
    "dense layout (a transpose, say) are read in place, others are made contiguous first.",
    make_inputs=_binary_inputs,
    test_cases=_VECTOR_TESTS,
    gpu_cases=_VECTOR_GPU,
    bench_cases=_VECTOR_BENCH,
    bytes_moved=_elementwise_bytes(3),
    dtypes=FLOAT_DTYPES,
)

register(
    KernelSpec(
        name="copy",
        family="tutorial",
        summary="Copy a tensor, any length, any block size (including non-powers of two).",
        description="The first kernel of the guide: one program per block, a mask on the ragged last block. "
        "A block size that is not a power of two is covered by the next power of two with the "
        "extra lanes masked.",
        usage="y = tk.ops.copy(x, block_size=100)",
        tags=("tutorial", "elementwise", "memory-bound"),
        limits="block_size from 1 to 65536; a non-contiguous input is made contiguous by torch first.",
        fn=copy,
        reference=_copy_reference,
        make_inputs=_copy_inputs,
        test_cases=(
            {"n": 0, "block_size": 128},
            {"n": 1, "block_size": 1},
            {"n": 7, "block_size": 4},
            {"n": 123, "block_size": 100},
            {"n": 123, "block_size": 32, "stride": 2},
            {"n": 4097, "block_size": 1024},
        ),
        gpu_cases=(
            {"n": (1 << 24) + 3, "block_size": 1024},
            {"n": 100_003, "block_size": 1000},
            {"n": 1 << 20, "block_size": 4096, "stride": 3},
        ),
        bench_cases=tuple({**case, "block_size": 1024} for case in _VECTOR_BENCH),
        bytes_moved=_elementwise_bytes(2),
        flops=lambda case, dtype: 0,
        dtypes=FLOAT_DTYPES,
    )
)

register(
    KernelSpec(
        name="add",
        family="tutorial",
        summary="Elementwise x + y, computed in fp32.",
        description="Two loads, one store per element; the loads are cast to fp32 before the addition, "
        "which the interpreter needs for bf16 and the GPU rewards.",
        usage="z = tk.ops.add(x, y)",
        tags=("tutorial", "elementwise", "memory-bound"),
        fn=add,
        reference=_add_reference,
        flops=lambda case, dtype: case["n"],
        **_BINARY_SPEC_FIELDS,
    )
)

register(
    KernelSpec(
        name="add_relu",
        family="tutorial",
        summary="relu(x + y) fused into one pass.",
        description="The fusion lesson: eager torch writes x + y to memory and reads it back for the relu; "
        "the kernel keeps it in registers.",
        usage="z = tk.ops.add_relu(x, y)",
        tags=("tutorial", "elementwise", "fused", "memory-bound"),
        fn=add_relu,
        reference=_add_relu_reference,
        flops=lambda case, dtype: 2 * case["n"],
        **_BINARY_SPEC_FIELDS,
    )
)

register(
    KernelSpec(
        name="rgb_to_grey",
        family="tutorial",
        summary="RGB (3, H, W) to greyscale (H, W) on a 2-D grid with 2-D masks; float or uint8.",
        description="grey = 0.2989 R + 0.5870 G + 0.1140 B. Float images stay in their dtype; uint8 images "
        "are rounded to nearest and clamped, computed exactly in integers.",
        usage="grey = tk.ops.rgb_to_grey(img)  # img: (3, H, W), float or uint8",
        tags=("tutorial", "image", "2d-grid", "memory-bound"),
        limits="Channels first (3, H, W); any strides, so an HWC buffer permuted to CHW works.",
        fn=rgb_to_grey,
        reference=_rgb_to_grey_reference,
        make_inputs=_image_inputs,
        test_cases=(
            {"h": 1, "w": 1},
            {"h": 7, "w": 33},
            {"h": 0, "w": 5},
            {"h": 45, "w": 70},
            {"h": 20, "w": 33, "channels_last": True},
        ),
        gpu_cases=({"h": 1080, "w": 1920}, {"h": 4001, "w": 3001}, {"h": 513, "w": 1025, "channels_last": True}),
        bench_cases=tuple({"h": side, "w": side} for side in (256, 512, 1024, 2048, 4096, 8192)),
        bytes_moved=lambda case, dtype: 4 * case["h"] * case["w"] * dtype.itemsize,
        flops=lambda case, dtype: 5 * case["h"] * case["w"],
        dtypes=(*FLOAT_DTYPES, torch.uint8),
    )
)
