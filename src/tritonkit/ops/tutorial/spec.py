"""The guide's kernels in the registry: float64 references, typed cases, cost models."""

import functools
import math
from dataclasses import dataclass

import torch

from tritonkit._core.checks import FLOAT_DTYPES
from tritonkit.ops.tutorial.op import add, add_relu, copy, matmul, rgb_to_grey
from tritonkit.ops.tutorial.plan import MATMUL_VARIANTS
from tritonkit.registry import TOLERANCES, Case, Inputs, KernelSpec, Tolerance, register


@dataclass(frozen=True)
class VectorCase(Case):
    n: int
    stride: int = 1  # every stride-th element of a longer vector: a strided input


@dataclass(frozen=True)
class CopyCase(Case):
    n: int
    block_size: int
    stride: int = 1


@dataclass(frozen=True)
class ImageCase(Case):
    h: int
    w: int
    channels_last: bool = False  # an HWC buffer seen as CHW


@dataclass(frozen=True)
class MatmulCase(Case):
    m: int
    n: int
    k: int
    a_transposed: bool = False
    b_transposed: bool = False


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


def _randn(shape, device, dtype, generator):
    return torch.randn(shape, device=device, generator=generator, dtype=torch.float32).to(dtype)


def _vector(case: VectorCase | CopyCase, device, dtype, generator):
    """A 1-D input of case.n elements, every case.stride-th of a longer one."""
    return _randn(case.n * case.stride, device, dtype, generator)[:: case.stride]


def _copy_inputs(case, device, dtype, generator):
    return Inputs((_vector(case, device, dtype, generator),), {"block_size": case.block_size})


def _binary_inputs(case, device, dtype, generator):
    return Inputs((_vector(case, device, dtype, generator), _vector(case, device, dtype, generator)))


def _image_inputs(case, device, dtype, generator):
    shape = (3, case.h, case.w)
    if dtype == torch.uint8:
        img = torch.randint(0, 256, shape, device=device, generator=generator, dtype=torch.uint8)
    else:
        img = torch.rand(shape, device=device, generator=generator, dtype=torch.float32).to(dtype)
    if case.channels_last:
        img = img.permute(1, 2, 0).contiguous().permute(2, 0, 1)  # an HWC buffer seen as CHW
    return Inputs((img,))


def _elementwise_bytes(n_tensors):
    return lambda case, dtype: n_tensors * case.n * dtype.itemsize


_VECTOR_TESTS = ({"n": 0}, {"n": 1}, {"n": 7}, {"n": 123, "stride": 3}, {"n": 4097})
_VECTOR_GPU = ({"n": 1}, {"n": 4097}, {"n": (1 << 24) + 3}, {"n": 1 << 20, "stride": 2})
_VECTOR_BENCH = tuple({"n": 1 << p} for p in range(12, 29, 2))
# What add and add_relu share: two same-shape vectors in, one out.
_BINARY_SPEC_FIELDS = dict(
    limits="x and y of one shape and one floating dtype; no broadcasting. Any strides: inputs sharing a "
    "dense layout (a transpose, say) are read in place, others are made contiguous first.",
    make_inputs=_binary_inputs,
    case_type=VectorCase,
    test_cases=_VECTOR_TESTS,
    gpu_cases=_VECTOR_GPU,
    bench_cases=_VECTOR_BENCH,
    bytes_moved=_elementwise_bytes(3),
    dtypes=FLOAT_DTYPES,
    has_backward=True,
)

register(
    KernelSpec(
        name="copy",
        family="tutorial",
        sweep="n",
        case_type=CopyCase,
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
        bytes_moved_bwd=_elementwise_bytes(2),  # dy in, dx out
        flops=lambda case, dtype: 0,
        dtypes=FLOAT_DTYPES,
        has_backward=True,
    )
)

register(
    KernelSpec(
        name="add",
        family="tutorial",
        sweep="n",
        summary="Elementwise x + y, computed in fp32.",
        description="Two loads, one store per element; the loads are cast to fp32 before the addition, "
        "which the interpreter needs for bf16 and the GPU rewards.",
        usage="z = tk.ops.add(x, y)",
        tags=("tutorial", "elementwise", "memory-bound"),
        fn=add,
        reference=_add_reference,
        flops=lambda case, dtype: case.n,
        bytes_moved_bwd=_elementwise_bytes(3),  # dy in, dx and dy out
        **_BINARY_SPEC_FIELDS,
    )
)

register(
    KernelSpec(
        name="add_relu",
        family="tutorial",
        sweep="n",
        summary="relu(x + y) fused into one pass.",
        description="The fusion lesson: eager torch writes x + y to memory and reads it back for the relu; "
        "the kernel keeps it in registers.",
        usage="z = tk.ops.add_relu(x, y)",
        tags=("tutorial", "elementwise", "fused", "memory-bound"),
        fn=add_relu,
        reference=_add_relu_reference,
        flops=lambda case, dtype: 2 * case.n,
        bytes_moved_bwd=_elementwise_bytes(4),  # dy and the output (its mask) in, dx and dy out
        **_BINARY_SPEC_FIELDS,
    )
)

register(
    KernelSpec(
        name="rgb_to_grey",
        family="tutorial",
        sweep="h",
        case_type=ImageCase,
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
        bytes_moved=lambda case, dtype: 4 * case.h * case.w * dtype.itemsize,
        bytes_moved_bwd=lambda case, dtype: 4 * case.h * case.w * dtype.itemsize,  # d(grey) in, d(img) out
        flops=lambda case, dtype: 5 * case.h * case.w,
        has_backward=True,  # float images; uint8 ones carry no gradient
        dtypes=(*FLOAT_DTYPES, torch.uint8),
    )
)


def _matmul_reference(a, b, **options):
    return a @ b


def _matmul_inputs(case: MatmulCase, device, dtype, generator):
    m, n, k = case.m, case.n, case.k

    def randn(*shape):
        return torch.randn(shape, device=device, generator=generator, dtype=torch.float32).to(dtype)

    a = randn(k, m).t() if case.a_transposed else randn(m, k)
    b = randn(n, k).t() if case.b_transposed else randn(k, n)
    return Inputs((a, b))


def _matmul_tolerance(case, dtype):
    # The output sums K products of unit-variance inputs, dA = dC B^T sums N, dB = A^T dC sums M: one
    # tolerance covers all three, so it follows the longest sum L. A sum's size grows like sqrt(L) and its
    # fp32 accumulation error like eps32 * sqrt(L) * rms(result) (rms_atol, a few times that for the tail);
    # the rounding of the output to its dtype is covered by rtol.
    longest = max(case.m, case.n, case.k, 1)
    base = TOLERANCES[dtype]
    accumulation = 4 * torch.finfo(torch.float32).eps * math.sqrt(longest)
    return Tolerance(atol=base.atol * math.sqrt(longest), rtol=base.rtol, rms_atol=accumulation)


_MATMUL_TESTS = (
    {"m": 1, "n": 1, "k": 1},
    {"m": 7, "n": 13, "k": 5},
    {"m": 100, "n": 70, "k": 50},
    {"m": 33, "n": 17, "k": 130},
    {"m": 40, "n": 24, "k": 48, "a_transposed": True},
    {"m": 24, "n": 40, "k": 36, "b_transposed": True},
    {"m": 0, "n": 8, "k": 8},
    {"m": 9, "n": 5, "k": 0},
    {"m": 70, "n": 48, "k": 64},  # rows 16-byte aligned in every dtype: the persistent variant's TMA path
    {"m": 100, "n": 72, "k": 40},  # aligned in 16-bit dtypes only
    {"m": 12, "n": 40, "k": 32, "b_transposed": True},  # a few rows through TMA: Hopper's swapped tiles (C^T = B^T A^T)
)
_MATMUL_GPU = (
    {"m": 1024, "n": 1024, "k": 1024},
    {"m": 1000, "n": 1001, "k": 999},
    {"m": 4096, "n": 4096, "k": 4096},
    {"m": 513, "n": 257, "k": 2049, "a_transposed": True},
    {"m": 127, "n": 4095, "k": 64, "b_transposed": True},
)
_MATMUL_BENCH = tuple({"m": s, "n": s, "k": s} for s in (256, 512, 1024, 2048, 4096, 8192))

_VARIANT_TEXT = {
    "auto": "The fastest measured variant: the persistent TMA kernel on Hopper and newer for 16-bit operands TMA "
    "can read, the autotuned one elsewhere, grouped under the interpreter. Benchmarked against torch.matmul (the "
    "eager reference, cuBLAS) and torch.compile.",
    "naive": "One program per output tile in row-major order, a masked loop over K.",
    "grouped": "Output tiles swizzled in groups of tile-rows so that programs running together share "
    "A rows and B columns in L2.",
    "autotuned": "Block sizes, warps and pipeline stages autotuned per (M, N, K) over a named config list.",
    "persistent": "One program per multiprocessor walks the output tiles; A, B and C move through TMA tensor "
    "descriptors (Hopper); tiles chosen by M and N, a few rows of A computed as C^T = B^T A^T; before Hopper, or "
    "for operands TMA cannot read, the autotuned variant runs.",
}

for _variant in MATMUL_VARIANTS:
    _name = "matmul" if _variant == "auto" else f"matmul_{_variant}"
    _call = "tk.ops.matmul(a, b)" if _variant == "auto" else f"tk.ops.matmul(a, b, variant={_variant!r})"
    register(
        KernelSpec(
            name=_name,
            family="tutorial",
            sweep="m",
            case_type=MatmulCase,
            summary=f"Matrix product a @ b, {_variant} variant; fp32 accumulation.",
            description=_VARIANT_TEXT[_variant],
            usage=f"c = {_call}  # a: (M, K), b: (K, N)",
            tags=("tutorial", "matmul", "compute-bound"),
            limits="2-D inputs of one floating dtype; any M, N, K and strides; no batching.",
            fn=functools.partial(matmul, variant=_variant),
            reference=_matmul_reference,
            make_inputs=_matmul_inputs,
            test_cases=_MATMUL_TESTS,
            gpu_cases=_MATMUL_GPU,
            bench_cases=_MATMUL_BENCH,
            bytes_moved=lambda case, dtype: (case.m * case.k + case.k * case.n + case.m * case.n) * dtype.itemsize,
            bytes_moved_bwd=lambda case, dtype: (
                2 * (case.m * case.k + case.k * case.n + case.m * case.n) * dtype.itemsize
            ),  # dC, A and B in; dA and dB out (dC read by both products)
            flops=lambda case, dtype: 2 * case.m * case.n * case.k,
            flops_bwd=lambda case, dtype: 4 * case.m * case.n * case.k,  # dA = dC B^T and dB = A^T dC
            dtypes=FLOAT_DTYPES,
            has_backward=True,
            tolerance=_matmul_tolerance,
        )
    )
