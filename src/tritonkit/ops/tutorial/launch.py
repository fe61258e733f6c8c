"""Launchers of the guide's kernels: validate, allocate, launch (tensors in, tensors out), and their backwards.

The backwards are the ladder's own matmul (op.py) or a line of torch arithmetic (a relu mask, rgb_to_grey's three
weights): the lessons are the forward kernels, and the gradients only have to be exact.
"""

from __future__ import annotations

import torch

from tritonkit._core.checks import (
    FLOAT_DTYPES,
    check_choice,
    check_device,
    check_positive_int,
    check_same_dtype,
    check_same_shape,
    check_tensor,
)
from tritonkit._core.device import arch, sm_count
from tritonkit._core.elementwise import ElementwisePlan, launch_elementwise
from tritonkit._core.env import upcast_bf16_dots
from tritonkit._core.gemm_plan import FIXED_TILE, FIXED_TILE_STAGES, FIXED_TILE_WARPS, input_precision
from tritonkit._core.ints import cdiv, next_power_of_2
from tritonkit._core.tma import descriptor, tma_readable
from tritonkit.ops.tutorial.kernels import (
    _add_kernel,
    _copy_kernel,
    _matmul_autotuned,
    _matmul_kernel,
    _matmul_persistent_kernel,
    _rgb_to_grey_kernel,
)
from tritonkit.ops.tutorial.plan import (
    DEFAULT_GROUP_SIZE,
    IMAGE_TILE,
    MATMUL_VARIANTS,
    MAX_COPY_BLOCK,
    ImageTile,
    PersistentTile,
    add_plan,
    choose_matmul_variant,
    persistent_tile,
)


def _dense(x: torch.Tensor) -> torch.Tensor:
    """``x`` itself when contiguous (the kernels index its elements linearly); a non-contiguous or
    expanded input costs one torch copy first."""
    return x if x.is_contiguous() else x.contiguous()


_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}  # an integer dtype of each element width
_WIDEST = 8  # bytes: Triton's widest scalar; a wider element (complex128) is copied as several of them


def _as_bits(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """x's elements as integers of the same width (a complex128 as two int64s), flat and contiguous, and how many
    integers make one element. A copy moves bytes, so every dtype goes through the few Triton knows."""
    x = x.resolve_conj().resolve_neg()  # a lazily conjugated or negated view: its values, not its storage's
    lanes = max(1, x.element_size() // _WIDEST)
    bits = torch.view_as_real(x) if lanes > 1 else x  # complex128: float64 pairs, whatever the strides
    return _dense(bits.view(_BITS[min(x.element_size(), _WIDEST)])).reshape(-1), lanes


def check_copy_args(x, block_size) -> None:
    check_tensor("x", x)
    if x.is_quantized or x.layout != torch.strided:
        kind = "quantized" if x.is_quantized else f"{x.layout}"
        raise TypeError(f"copy: x must be a plain strided tensor, got a {kind} tensor of {x.dtype} (a byte copy "
                        "would drop its quantizer or its indices)")  # fmt: skip
    check_positive_int("block_size", block_size)
    if block_size > MAX_COPY_BLOCK:
        raise ValueError(f"block_size must be at most {MAX_COPY_BLOCK}, got {block_size}")
    check_device(x=x)


def copy_fwd(x: torch.Tensor, block_size: int) -> torch.Tensor:
    """A contiguous copy of ``x``, ``block_size`` elements per program (validated by check_copy_args: it is the
    lesson's knob). Any dtype: the kernel moves x's bytes as integers of the element's width."""
    src, lanes = _as_bits(x)
    out = torch.empty(src.shape, dtype=src.dtype, device=x.device)  # integers: the poisoned test run fills any dtype
    n = out.numel()
    if n:
        block = block_size * lanes
        _copy_kernel[(cdiv(n, block),)](src, out, n, BLOCK_SIZE=block, BLOCK_POW2=next_power_of_2(block))
    return out.view(x.dtype).view(x.shape)


def copy_fake(x, block_size):
    return x.new_empty(x.shape)


def check_add_args(x, y) -> None:
    check_tensor("x", x, dtypes=FLOAT_DTYPES)
    check_tensor("y", y, dtypes=FLOAT_DTYPES)
    check_same_dtype("x", x, "y", y)
    check_same_shape("x", x, "y", y)
    check_device(x=x, y=y)


def add_fwd(x: torch.Tensor, y: torch.Tensor, apply_relu: bool, *, plan: ElementwisePlan | None = None) -> torch.Tensor:
    """x + y, or relu(x + y): two floating tensors of one shape and dtype (validated by check_add_args)."""
    return launch_elementwise(_add_kernel, [x, y], x.dtype, plan or add_plan(arch(x.device)), APPLY_RELU=apply_relu)


def add_fake(x, y, apply_relu):
    return torch.empty_like(x, memory_format=torch.preserve_format)


def relu_bwd(grad: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """add_relu's gradient for x and y alike: ``grad`` where the output is positive, else 0 (relu's, as torch's).
    torch arithmetic: the lesson is the forward's fusion, its backward is one mask."""
    return torch.where(out > 0, grad, 0).to(out.dtype)


def relu_bwd_fake(grad, out):
    return torch.empty_like(out, memory_format=torch.preserve_format)


def check_rgb_to_grey_args(img) -> None:
    check_tensor("img", img, ndim=3, dtypes=(*FLOAT_DTYPES, torch.uint8))
    if img.shape[0] != 3:
        raise ValueError(f"img must have shape (3, H, W), got {tuple(img.shape)}")
    check_device(img=img)


def rgb_to_grey_fwd(img: torch.Tensor, *, plan: ImageTile = IMAGE_TILE) -> torch.Tensor:
    """The (H, W) greyscale of a (3, H, W) image, float or uint8, any strides (validated by
    check_rgb_to_grey_args)."""
    height, width = img.shape[1], img.shape[2]
    out = torch.empty((height, width), dtype=img.dtype, device=img.device)
    if out.numel() == 0:
        return out
    grid = (cdiv(height, plan.block_h), cdiv(width, plan.block_w))
    _rgb_to_grey_kernel[grid](img, out, height, width, *img.stride(), *out.stride(), IS_UINT8=img.dtype == torch.uint8,
                              BLOCK_H=plan.block_h, BLOCK_W=plan.block_w)  # fmt: skip
    return out


# The float kernel's weights (kernels.py, _rgb_to_grey_kernel), here for its linear backward.
GREY_WEIGHTS = (0.2989, 0.5870, 0.1140)


def rgb_to_grey_bwd(grad: torch.Tensor) -> torch.Tensor:
    """d(img) = (0.2989, 0.5870, 0.1140) * d(grey), (3, H, W) in grad's dtype: the float forward is linear. torch
    arithmetic in fp32, rounded once. (A uint8 image cannot require grad: its rounding has no gradient.)"""
    scaled = grad.float()
    return torch.stack([weight * scaled for weight in GREY_WEIGHTS]).to(grad.dtype)


def rgb_to_grey_fake(img):
    return img.new_empty(img.shape[1:])


def rgb_to_grey_bwd_fake(grad):
    return grad.new_empty((3, *grad.shape))


def check_matmul_args(a, b, variant, group_size) -> None:
    check_choice("variant", variant, MATMUL_VARIANTS)
    check_tensor("a", a, ndim=2, dtypes=FLOAT_DTYPES)
    check_tensor("b", b, ndim=2, dtypes=FLOAT_DTYPES)
    if a.dtype != b.dtype:
        raise TypeError(f"a and b must have the same dtype, got {a.dtype} and {b.dtype}")
    if a.shape[1] != b.shape[0]:
        raise ValueError(
            f"a's columns must equal b's rows, got a of shape {tuple(a.shape)} and b of shape {tuple(b.shape)}"
        )
    if group_size is not None:
        if variant != "grouped":
            raise ValueError(f"group_size applies to variant='grouped' only, got variant={variant!r}")
        check_positive_int("group_size", group_size)
    check_device(a=a, b=b)


def matmul_fwd(a: torch.Tensor, b: torch.Tensor, variant: str, group_size: int | None, *,
               plan: PersistentTile | None = None) -> torch.Tensor:  # fmt: skip
    """a @ b with one of the ladder's variants (validated by check_matmul_args). ``plan``: the persistent variant's
    tile instead of persistent_tile's (benchmarks and tests)."""
    m, k = a.shape
    n = b.shape[1]
    c = torch.empty((m, n), dtype=a.dtype, device=a.device)
    if c.numel() == 0:
        return c
    flags = {"INPUT_PRECISION": input_precision(a.dtype), "UPCAST": upcast_bf16_dots(a.dtype)}
    if variant in ("auto", "persistent"):  # the others need neither the GPU's architecture nor TMA's reach
        device_arch = arch(a.device)
        # TMA reads row-major operands with 16-byte aligned rows: B itself, or B^T for a weight in F.linear's layout.
        through_tma = all(tma_readable(t) for t in (a, b if b.stride(1) == 1 else b.t(), c))
        if variant == "auto":
            variant = choose_matmul_variant(device_arch, a.element_size(), through_tma)
        if variant == "persistent":
            tile = plan or persistent_tile(device_arch, a.element_size(), m, n, sm_count(a.device))
            if tile is not None and through_tma:
                _matmul_persistent(a, b, c, tile, flags)
                return c
            # No TMA on this GPU, or operands it cannot read: the variant auto picks without TMA.
            variant = choose_matmul_variant(device_arch, a.element_size(), False)
    args = (a, b, c, m, n, k, *a.stride(), *b.stride(), *c.stride())
    if variant == "autotuned":

        def grid(meta):
            return (cdiv(m, meta["BLOCK_M"]) * cdiv(n, meta["BLOCK_N"]),)

        _matmul_autotuned[grid](*args, **flags)
    else:
        group = 1 if variant == "naive" else (group_size or DEFAULT_GROUP_SIZE)
        grid = (cdiv(m, FIXED_TILE["BLOCK_M"]) * cdiv(n, FIXED_TILE["BLOCK_N"]),)
        _matmul_kernel[grid](*args, **FIXED_TILE, GROUP_SIZE=group, **flags, num_warps=FIXED_TILE_WARPS,
                             num_stages=FIXED_TILE_STAGES)  # fmt: skip
    return c


def _matmul_persistent(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, tile: PersistentTile, flags: dict) -> None:
    m, k = a.shape
    n = b.shape[1]
    a_desc = descriptor(a, [tile.block_m, tile.block_k])
    b_transposed = b.stride(1) != 1  # B^T row-major: a weight in F.linear's layout
    b_desc = (descriptor(b.t(), [tile.block_n, tile.block_k]) if b_transposed
              else descriptor(b, [tile.block_k, tile.block_n]))  # fmt: skip
    c_desc = descriptor(c, [tile.block_m, tile.block_n])
    n_programs = min(sm_count(a.device), cdiv(m, tile.block_m) * cdiv(n, tile.block_n))
    _matmul_persistent_kernel[(n_programs,)](
        a_desc, b_desc, c_desc, m, n, k, n_programs, BLOCK_M=tile.block_m, BLOCK_N=tile.block_n,
        BLOCK_K=tile.block_k, GROUP_SIZE=tile.group, B_TRANSPOSED=b_transposed, SWAP_AB=tile.swap_ab, **flags,
        num_warps=tile.warps,
        num_stages=tile.stages,
    )  # fmt: skip


def matmul_fake(a, b, variant, group_size):
    return a.new_empty((a.shape[0], b.shape[1]))
