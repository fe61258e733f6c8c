"""Matrix multiplication, the guide's ladder: naive -> grouped (swizzled) -> autotuned.

All three variants run one kernel. Program ids are mapped to output tiles in groups of GROUP_SIZE
tile-rows, so neighbouring programs share the same rows of A and columns of B while those sit in
L2; GROUP_SIZE = 1 is exactly the naive row-major order. The K loop is masked (the classic tutorial
reads past K and wraps rows past M with a modulo), so any M, N, K and any strides are correct.
"""

from __future__ import annotations

import functools
import math
import os

import torch
import triton
import triton.language as tl

from tritonkit._core import alloc
from tritonkit._core.checks import FLOAT_DTYPES, check_choice, check_device, check_positive_int, check_tensor
from tritonkit._core.env import interpreting
from tritonkit._core.ints import cdiv
from tritonkit.debug import mask_2d, offsets_2d
from tritonkit.registry import Inputs, KernelSpec, Tolerance, register
from tritonkit.testing import TOLERANCES

__all__ = ["MATMUL_VARIANTS", "choose_matmul_variant", "matmul", "matmul_autotune_configs"]

MATMUL_VARIANTS = ("auto", "naive", "grouped", "autotuned")


@triton.jit
def grouped_tile(i_pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_SIZE: tl.constexpr):
    """(i_m, i_n), the output tile of program i_pid: programs walk GROUP_SIZE tile-rows column by
    column before moving to the next group (GROUP_SIZE = 1 is row-major order)."""
    n_tiles_m = tl.cdiv(M, BLOCK_M)
    n_tiles_n = tl.cdiv(N, BLOCK_N)
    n_pids_in_group = GROUP_SIZE * n_tiles_n
    first_m = (i_pid // n_pids_in_group) * GROUP_SIZE
    rows_in_group = tl.minimum(n_tiles_m - first_m, GROUP_SIZE)
    i_m = first_m + (i_pid % n_pids_in_group) % rows_in_group
    i_n = (i_pid % n_pids_in_group) // rows_in_group
    return i_m, i_n


@triton.jit
def _matmul_kernel(
    p_a,
    p_b,
    p_c,
    M,
    N,
    K,
    stride_a_m,
    stride_a_k,
    stride_b_k,
    stride_b_n,
    stride_c_m,
    stride_c_n,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_SIZE: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """C[M, N] = A[M, K] @ B[K, N], accumulated in fp32, stored in C's dtype.

    Tile (i_m, i_n) of C is sum over k-blocks of A[i_m, k] @ B[k, i_n]; elements past M, N or K are
    masked to zero on load and never stored. UPCAST casts the tiles to fp32 before the dot (the
    interpreter computes 16-bit dots wrongly otherwise).
    """
    i_m, i_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_SIZE)
    o_m = (i_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    o_n = (i_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    o_k = tl.arange(0, BLOCK_K)
    p_a_tile = p_a + offsets_2d(o_m, o_k, stride_a_m, stride_a_k)
    p_b_tile = p_b + offsets_2d(o_k, o_n, stride_b_k, stride_b_n)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for i_k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - i_k * BLOCK_K
        b_a = tl.load(p_a_tile, mask=mask_2d(o_m, o_k, M, k_left), other=0.0)  # [BLOCK_M, BLOCK_K]
        b_b = tl.load(p_b_tile, mask=mask_2d(o_k, o_n, k_left, N), other=0.0)  # [BLOCK_K, BLOCK_N]
        if UPCAST:
            b_a = b_a.to(tl.float32)
            b_b = b_b.to(tl.float32)
        acc = tl.dot(b_a, b_b, acc, input_precision=INPUT_PRECISION)
        p_a_tile += BLOCK_K * stride_a_k
        p_b_tile += BLOCK_K * stride_b_k
    p_c_tile = p_c + offsets_2d(o_m, o_n, stride_c_m, stride_c_n)
    tl.store(p_c_tile, acc.to(p_c.dtype.element_ty), mask=mask_2d(o_m, o_n, M, N))


def matmul_autotune_configs() -> list[triton.Config]:
    """Block shapes, warps and pipeline depths tried by the autotuned variant.

    Under the interpreter timing means nothing, so a single config keeps tests fast. With
    ``TRITONKIT_AUTOTUNE=quick`` (set by scripts/gpu_verify.sh) three configs remain, the largest tile,
    a middle one and the smallest: every new shape compiles each config, and the GPU test suite checks
    hundreds of shapes, so ten configs made it compile-bound (LoRA: ~10 s a test).
    """
    if interpreting():
        return [triton.Config({"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_SIZE": 4})]
    shapes = [  # (BLOCK_M, BLOCK_N, BLOCK_K, num_stages, num_warps)
        (128, 256, 64, 3, 8),
        (256, 128, 64, 3, 8),
        (128, 128, 64, 4, 4),
        (128, 128, 32, 4, 4),
        (128, 64, 64, 4, 4),
        (64, 128, 64, 4, 4),
        (64, 64, 64, 4, 4),
        (128, 32, 32, 4, 4),
        (64, 32, 32, 5, 2),
        (32, 64, 32, 5, 2),
    ]
    if os.environ.get("TRITONKIT_AUTOTUNE") == "quick":
        shapes = [shapes[0], shapes[2], shapes[-1]]
    return [
        triton.Config(
            {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_SIZE": 8}, num_stages=stages, num_warps=warps
        )
        for bm, bn, bk, stages, warps in shapes
    ]


_matmul_autotuned = triton.autotune(configs=matmul_autotune_configs(), key=["M", "N", "K"])(_matmul_kernel)

# The fixed tile of the naive and grouped variants: 64x64 output tiles, 32-wide K steps.
_FIXED_TILE = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32}


def choose_matmul_variant(m: int, n: int, k: int) -> str:
    """The variant ``variant="auto"`` runs: the autotuned one on a GPU, grouped under the interpreter.

    Autotuning times every config on first use of a shape; under the interpreter it has nothing to
    measure, so the grouped kernel with its fixed tile runs there.
    """
    return "grouped" if interpreting() else "autotuned"


def _input_precision(dtype: torch.dtype) -> str:
    # fp32 inputs follow torch's own switch, so tk.ops.matmul rounds like torch.matmul does.
    if dtype == torch.float32 and torch.get_float32_matmul_precision() == "highest":
        return "ieee"
    return "tf32"


def matmul(a: torch.Tensor, b: torch.Tensor, *, variant: str = "auto", group_size: int | None = None):
    """``a @ b`` for a (M, K) and b (K, N), any strides; fp32 accumulation, output in the input dtype.

    ``variant``: "naive" (one program per output tile, row-major), "grouped" (tiles swizzled in groups
    of ``group_size`` tile-rows for L2 reuse, default 8), "autotuned" (block sizes, warps and stages
    autotuned per (M, N, K)) or "auto" (see :func:`choose_matmul_variant`). fp32 inputs use TF32 only
    when ``torch.get_float32_matmul_precision()`` is not "highest", like torch.matmul.

    Example: ``tk.ops.matmul(a, b, variant="grouped", group_size=4)``.
    """
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
    m, k = a.shape
    n = b.shape[1]
    c = alloc.empty((m, n), dtype=a.dtype, device=a.device)
    if c.numel() == 0:
        return c
    if variant == "auto":
        variant = choose_matmul_variant(m, n, k)
    args = (a, b, c, m, n, k, *a.stride(), *b.stride(), *c.stride())
    flags = {"INPUT_PRECISION": _input_precision(a.dtype), "UPCAST": interpreting() and a.dtype == torch.bfloat16}
    if variant == "autotuned":

        def grid(meta):
            return (cdiv(m, meta["BLOCK_M"]) * cdiv(n, meta["BLOCK_N"]),)

        _matmul_autotuned[grid](*args, **flags)
    else:
        group = 1 if variant == "naive" else (group_size or 8)
        grid = (cdiv(m, _FIXED_TILE["BLOCK_M"]) * cdiv(n, _FIXED_TILE["BLOCK_N"]),)
        _matmul_kernel[grid](*args, **_FIXED_TILE, GROUP_SIZE=group, **flags, num_warps=4, num_stages=3)
    return c


# --------------------------------------------------------------------------------------------------
# Reference and registry specs
# --------------------------------------------------------------------------------------------------
def _matmul_reference(a, b, **options):
    return a @ b


def _matmul_inputs(case, device, dtype, generator):
    m, n, k = case["m"], case["n"], case["k"]

    def randn(*shape):
        return torch.randn(shape, device=device, generator=generator, dtype=torch.float32).to(dtype)

    a = randn(k, m).t() if case.get("a_transposed") else randn(m, k)
    b = randn(n, k).t() if case.get("b_transposed") else randn(k, n)
    return Inputs((a, b))


def _matmul_tolerance(case, dtype):
    # Each output sums K products of unit-variance inputs, so its magnitude and the fp32
    # accumulation error both grow like sqrt(K); the output rounding is covered by rtol.
    base = TOLERANCES[dtype]
    return Tolerance(atol=base.atol * math.sqrt(max(case["k"], 1)), rtol=base.rtol)


_MATMUL_TESTS = (
    {"m": 1, "n": 1, "k": 1},
    {"m": 7, "n": 13, "k": 5},
    {"m": 100, "n": 70, "k": 50},
    {"m": 33, "n": 17, "k": 130},
    {"m": 40, "n": 24, "k": 48, "a_transposed": True},
    {"m": 24, "n": 40, "k": 36, "b_transposed": True},
    {"m": 0, "n": 8, "k": 8},
    {"m": 9, "n": 5, "k": 0},
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
    "auto": "The best variant for the shape: autotuned on a GPU, grouped under the interpreter. "
    "Benchmarked against torch.matmul (the eager reference, cuBLAS) and torch.compile.",
    "naive": "One program per output tile in row-major order, a masked loop over K.",
    "grouped": "Output tiles swizzled in groups of tile-rows so that programs running together share "
    "A rows and B columns in L2.",
    "autotuned": "Block sizes, warps and pipeline stages autotuned per (M, N, K) over a named config list.",
}

for _variant in MATMUL_VARIANTS:
    _name = "matmul" if _variant == "auto" else f"matmul_{_variant}"
    _call = "tk.ops.matmul(a, b)" if _variant == "auto" else f"tk.ops.matmul(a, b, variant={_variant!r})"
    register(
        KernelSpec(
            name=_name,
            family="matmul",
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
            bytes_moved=lambda case, dtype: (
                (case["m"] * case["k"] + case["k"] * case["n"] + case["m"] * case["n"]) * dtype.itemsize
            ),
            flops=lambda case, dtype: 2 * case["m"] * case["n"] * case["k"],
            dtypes=FLOAT_DTYPES,
            tolerance=_matmul_tolerance,
        )
    )
