"""scaled_linear and dynamic_scaled_linear in the registry: float64 references on the dequantized operands (so only
the kernel's error is measured; dynamic_scaled_linear's x codes from quantize's definition), typed cases, cost
models."""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass

import torch

from tritonkit._core.checks import FLOAT_DTYPES
from tritonkit._core.ints import cdiv
from tritonkit._core.scales import expand_scale, granularity_of, quantize_reference
from tritonkit.ops.gemm.op import dynamic_scaled_linear, scaled_linear
from tritonkit.registry import TOLERANCES, Case, Inputs, KernelSpec, Tolerance, register

CODES = {"int8": torch.int8, "e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


@dataclass(frozen=True)
class ScaledLinearCase(Case):
    m: int  # rows of x
    n: int  # output features
    k: int
    w: str  # w's codes: "int8", "e4m3", "e5m2"
    x: str = ""  # x's codes, or "" for x in the checked dtype (weight-only)
    x_scale: str = "row"  # "tensor", "row", "group" (ignored weight-only)
    w_scale: str = "row"  # "tensor", "row", "group", "block"
    block: int = 128  # G of groups and blocks
    bias: bool = False
    lead: tuple = ()  # leading dims of x before m (x is (*lead, m, k))
    fast_accum: bool = False  # use_fast_accum=True


def _codes(shape, fmt: str, device, generator) -> torch.Tensor:
    """Codes across the format's range: int8 uniform in [-127, 127], float8 from normal values times 64."""
    if fmt == "int8":
        return torch.randint(-127, 128, shape, device=device, generator=generator, dtype=torch.int8)
    values = torch.randn(shape, device=device, generator=generator) * 64
    return values.clamp(-448, 448).to(CODES[fmt])


def _scale(codes_shape: tuple, granularity: str, block: int, device, generator) -> torch.Tensor:
    """Positive scales of the granularity's shape, spread over two binades."""
    if granularity == "tensor":
        shape = ()
    elif granularity == "row":
        shape = (*codes_shape[:-1], 1)
    elif granularity == "group":
        shape = (*codes_shape[:-1], cdiv(codes_shape[-1], block))
    else:
        shape = (cdiv(codes_shape[0], block), cdiv(codes_shape[1], block))
    return torch.rand(shape, device=device, generator=generator) * 1.5e-2 + 5e-3


def _inputs(case, device, dtype, generator):
    x_shape = (*case.lead, case.m, case.k)
    w = _codes((case.n, case.k), case.w, device, generator)
    w_scale = _scale((case.n, case.k), case.w_scale, case.block, device, generator)
    if case.x:
        x = _codes(x_shape, case.x, device, generator)
        x_scale = _scale(x_shape, case.x_scale, case.block, device, generator)
    else:
        x, x_scale = torch.randn(x_shape, device=device, generator=generator).to(dtype), None
    bias = torch.randn(case.n, device=device, generator=generator).to(dtype) if case.bias else None
    fast = {"use_fast_accum": True} if case.fast_accum else {}
    return Inputs((x, w, x_scale, w_scale), {"bias": bias, "out_dtype": dtype, **fast})


def _dequantized(codes, scale):
    if scale is None:
        return codes.double()
    granularity, size = granularity_of(tuple(codes.shape), tuple(scale.shape))
    return codes.double() * expand_scale(scale.double(), tuple(codes.shape), granularity, size)


def _reference(x_q, w_q, x_scale, w_scale, *, bias=None, out_dtype=torch.bfloat16, use_fast_accum=False,
               check_inputs=None):  # fmt: skip
    out = _dequantized(x_q, x_scale) @ _dequantized(w_q, w_scale).T
    return out + bias.double() if bias is not None else out


def _flops(case, dtype) -> int:
    return 2 * math.prod(case.lead) * case.m * case.n * case.k


def _operand_dtype(case, dtype) -> torch.dtype:
    """The products' operands: x's codes, or weight-only x's own dtype (w's codes are converted to it)."""
    return CODES[case.x] if case.x else dtype


def _scale_count(rows: int, k: int, granularity: str, block: int) -> int:
    groups = cdiv(k, block)
    return {"tensor": 1, "row": rows, "group": rows * groups, "block": cdiv(rows, block) * groups}[granularity]


def _bytes(case, dtype) -> int:
    """x (codes or values), w's codes, their fp32 scales and the output (the bias is a rounding error)."""
    rows = math.prod(case.lead) * case.m
    x_bytes = 1 if case.x else dtype.itemsize
    scales = _scale_count(case.n, case.k, case.w_scale, case.block)
    if case.x:
        scales += _scale_count(rows, case.k, case.x_scale, case.block)
    return rows * case.k * x_bytes + case.n * case.k + 4 * scales + rows * case.n * dtype.itemsize


# Hopper's tensor cores sum float8 products in a shortened format (about 14 bits, DeepSeek-V3) before fp32 takes
# them. Measured on an H100 (benchmarks/fp8_tiles.py): the largest |error| over the output's rms was 1.6e-3 at
# K = 128, 8.5e-4 at K = 1024 and 5.9e-4 at K = 8192, cuBLAS's _scaled_mm's the same to two digits; 2^-8 bounds it.
FLOAT8_SUM_ERROR = 2.0**-8
# use_fast_accum: the shortened sums run over all of K, so their error grows with it. cuBLAS's fast accumulation
# reached a largest |error| of 5.6e-3 and 1.1e-2 of the rms at K = 1024 and 8192 on the H100; ours (the registry's GPU
# cases on the H200, 2026-11-29) 4.1e-2 at K = 4100 and 5.1-5.7e-2 at K = 8192, about 6.3e-4 sqrt(K). The bound is
# the larger of 2^-6 and 2^-10 sqrt(K) (3.1e-2 at K = 1024, 8.8e-2 at 8192): 1.5 times ours.
FLOAT8_FAST_SUM_ERROR = 2.0**-6
FLOAT8_FAST_SUM_ERROR_PER_ROOT_K = 2.0**-10


def _tolerance(case, dtype):
    """The output rounds to its dtype (the table's bounds). Its fp32 sums of K products err like eps32 * sqrt(K) of
    the output's rms; float8 products, as the tensor cores sum them, FLOAT8_SUM_ERROR of the rms."""
    base = TOLERANCES[dtype]
    accumulation = 4 * torch.finfo(torch.float32).eps * math.sqrt(max(case.k, 1))
    if case.x in ("e4m3", "e5m2"):
        if case.fast_accum:
            accumulation += max(FLOAT8_FAST_SUM_ERROR, FLOAT8_FAST_SUM_ERROR_PER_ROOT_K * math.sqrt(case.k))
        else:
            accumulation += FLOAT8_SUM_ERROR
    return Tolerance(atol=base.atol, rtol=base.rtol, rms_atol=accumulation)


def _peer(name: str):
    def factory():
        return getattr(importlib.import_module("tritonkit.bench.gemm_peers"), name)()

    return factory


_TESTS = (
    {"m": 33, "n": 40, "k": 70, "x": "int8", "w": "int8"},
    {"m": 7, "n": 24, "k": 64, "x": "int8", "w": "int8", "x_scale": "tensor", "w_scale": "tensor", "bias": True},
    {"m": 40, "n": 33, "k": 100, "x": "e4m3", "w": "e4m3"},
    {"m": 1, "n": 50, "k": 48, "x": "e5m2", "w": "e4m3", "x_scale": "tensor", "w_scale": "row"},
    {"m": 20, "n": 37, "k": 300, "x": "e4m3", "w": "e4m3", "x_scale": "group", "w_scale": "block"},  # K % 128 != 0
    {"m": 17, "n": 70, "k": 90, "x": "e4m3", "w": "e4m3", "x_scale": "group", "w_scale": "block", "block": 32},
    {"m": 9, "n": 20, "k": 96, "x": "int8", "w": "int8", "x_scale": "group", "w_scale": "group", "block": 32},
    {"m": 5, "n": 30, "k": 40, "x": "int8", "w": "int8", "x_scale": "row", "w_scale": "block", "block": 32,
     "bias": True},
    {"m": 6, "n": 18, "k": 50, "w": "int8", "w_scale": "group", "block": 16},  # weight-only: groups of 16
    {"m": 3, "n": 3, "k": 80, "x": "e4m3", "w": "e4m3", "lead": (2,)},  # x (2, 3, 80)
    {"m": 1, "n": 45, "k": 64, "w": "int8"},  # weight-only, one row (decoding)
    {"m": 12, "n": 33, "k": 200, "w": "e4m3", "w_scale": "block", "bias": True},
    {"m": 0, "n": 8, "k": 16, "x": "int8", "w": "int8"},
    # Weight-only at <= 16 rows takes the split-K GEMV: one row split along K, the partials reduced, with a bias
    {"m": 1, "n": 45, "k": 1100, "w": "int8", "bias": True},
    {"m": 1, "n": 33, "k": 1500, "w": "e4m3", "w_scale": "group", "block": 32},  # one row, group scales, split
    {"m": 3, "n": 37, "k": 333, "w": "e4m3", "w_scale": "group", "block": 64},  # K % 64 != 0, through tl.dot
    {"m": 16, "n": 50, "k": 2100, "w": "int8", "w_scale": "group", "block": 128, "bias": True},  # 16 rows, split
    {"m": 1, "n": 29, "k": 77, "w": "e5m2", "w_scale": "tensor", "lead": (4,)},  # x (4, 1, 77): a decode batch
    {"m": 24, "n": 20, "k": 70, "w": "e4m3"},  # weight-only beyond 16 rows: the tiled kernel
    # M and N >= 1024 take the persistent TMA kernel: float8 with a bias, int8 with a ragged tile-row and K step
    {"m": 1024, "n": 1024, "k": 64, "x": "e4m3", "w": "e4m3", "x_scale": "tensor", "w_scale": "row", "bias": True},
    {"m": 1025, "n": 1024, "k": 48, "x": "int8", "w": "int8"},
    # use_fast_accum: float8 with row scales in the tiled kernel, and tensor scales in the persistent one
    {"m": 40, "n": 33, "k": 100, "x": "e4m3", "w": "e4m3", "bias": True, "fast_accum": True},
    {"m": 1024, "n": 1024, "k": 64, "x": "e5m2", "w": "e4m3", "x_scale": "tensor", "w_scale": "tensor",
     "fast_accum": True},
)  # fmt: skip
_GPU = (
    {"m": 4096, "n": 7168, "k": 7168, "x": "e4m3", "w": "e4m3", "x_scale": "group", "w_scale": "block"},
    {"m": 2049, "n": 2112, "k": 7168, "x": "e4m3", "w": "e4m3", "x_scale": "group", "w_scale": "block"},
    {"m": 1000, "n": 4096, "k": 4100, "x": "e4m3", "w": "e4m3", "bias": True},
    {"m": 4097, "n": 4096, "k": 4096, "x": "int8", "w": "int8"},  # the persistent kernel, as the next three
    {"m": 2048, "n": 2560, "k": 4096, "x": "e4m3", "w": "e4m3", "x_scale": "tensor", "w_scale": "row", "bias": True},
    {"m": 1500, "n": 1032, "k": 1040, "x": "e5m2", "w": "e4m3", "x_scale": "row", "w_scale": "tensor"},
    {"m": 2048, "n": 2560, "k": 8192, "x": "e4m3", "w": "e4m3", "bias": True, "fast_accum": True},  # persistent
    {"m": 1000, "n": 4096, "k": 4100, "x": "e4m3", "w": "e4m3", "fast_accum": True},  # tiled
    {"m": 3000, "n": 1100, "k": 2000, "x": "int8", "w": "int8", "x_scale": "tensor", "w_scale": "tensor",
     "bias": True},
    {"m": 777, "n": 1000, "k": 1500, "x": "int8", "w": "int8", "x_scale": "tensor", "w_scale": "tensor"},
    {"m": 1, "n": 14336, "k": 4096, "w": "int8"},
    {"m": 16, "n": 14336, "k": 4096, "w": "e4m3", "w_scale": "block"},
    {"m": 1, "n": 4096, "k": 8192, "w": "int8", "w_scale": "group", "bias": True},
    {"m": 5, "n": 28672, "k": 8191, "w": "e4m3", "w_scale": "group"},
    {"m": 1, "n": 4097, "k": 4096, "w": "int8", "lead": (7,)},
)  # fmt: skip
_BENCH = (
    *({"m": m, "n": 7168, "k": 7168, "x": "e4m3", "w": "e4m3", "x_scale": "group", "w_scale": "block"}
      for m in (2048, 4096, 8192)),
    *({"m": m, "n": 8192, "k": 8192, "x": "e4m3", "w": "e4m3"} for m in (2048, 4096, 8192)),
    *({"m": m, "n": 8192, "k": 8192, "x": "int8", "w": "int8"} for m in (2048, 4096, 8192)),
    *({"m": m, "n": n, "k": k, "w": "int8"} for m in (1, 4, 16) for n, k in ((4096, 4096), (14336, 4096),
                                                                               (28672, 8192))),
    *({"m": m, "n": 14336, "k": 4096, "w": "e4m3", "w_scale": "group"} for m in (1, 16)),
)  # fmt: skip

register(KernelSpec(
    name="scaled_linear",
    family="gemm",
    sweep="m",
    case_type=ScaledLinearCase,
    summary="int8 and float8 linear layers with tensor, row, 1 x G group and G x G block scales, or weight-only.",
    description="One kernel from codes to output: products over the codes (int8 in int32, float8 in fp32), scales "
                "that do not vary along K applied once in the epilogue, group and block scales applied to each K "
                "step's partial sum (DeepSeek-V3's 1 x 128 and 128 x 128), bias and output cast fused; weight-only "
                "converts w's codes in registers, and at <= 16 rows of x runs as a split-K GEMV (K split across "
                "programs to fill every multiprocessor, the fp32 partials summed in a fixed order).",
    usage="y = tk.ops.scaled_linear(xq, wq, x_scale, w_scale, bias=b)  # x (..., K), w (N, K)",
    tags=("gemm", "quantization", "fp8", "int8", "compute-bound", "inference"),
    limits="int8 x int8 or float8 x float8 (or weight-only); groups and blocks of one size, a power of two >= 32 "
           "(16 weight-only); forward only.",
    fn=scaled_linear,
    reference=_reference,
    make_inputs=_inputs,
    test_cases=_TESTS,
    gpu_cases=_GPU,
    bench_cases=_BENCH,
    bytes_moved=_bytes,
    flops=_flops,
    operand_dtype=_operand_dtype,
    dtypes=FLOAT_DTYPES,
    tolerance=_tolerance,
    peers={"scaled_mm": _peer("scaled_mm"), "int_mm": _peer("int_mm"),
           "int_mm_bare": _peer("int_mm_bare"), "cublas": _peer("cublas"),
           "torchao": _peer("torchao_blockwise")},
    status="experimental",
))  # fmt: skip


@dataclass(frozen=True)
class DynamicLinearCase(Case):
    m: int  # rows of x
    n: int  # output features
    k: int
    w: str  # w's codes: "int8", "e4m3", "e5m2"
    x: str = ""  # the format x is quantized to, or "" for w's
    w_scale: str = "block"  # "tensor", "row", "group", "block"
    group: int = 128  # x's groups along K (and w's groups and blocks)
    bias: bool = False
    lead: tuple = ()  # leading dims of x before m


def _dynamic_inputs(case, device, dtype, generator):
    """x with magnitudes from 1e-2 to 1e1 along K (groups of different scales), w's codes and scales."""
    x = torch.randn((*case.lead, case.m, case.k), device=device, generator=generator)
    if case.k > 1:
        x = x * torch.logspace(-2, 1, case.k, device=device)
    w = _codes((case.n, case.k), case.w, device, generator)
    w_scale = _scale((case.n, case.k), case.w_scale, case.group, device, generator)
    bias = torch.randn(case.n, device=device, generator=generator).to(dtype) if case.bias else None
    kwargs = {"bias": bias, "out_dtype": dtype, "group_size": case.group, "x_dtype": CODES[case.x or case.w]}
    return Inputs((x.to(dtype), w, w_scale), kwargs)


def _dynamic_reference(x, w_q, w_scale, *, bias=None, out_dtype=None, group_size=128, x_dtype=None,
                       check_inputs=None):  # fmt: skip
    """x's codes from quantize's definition in x_dtype (always given by the cases: w_q reaches a reference upcast to
    float64, its float8 format gone), then scaled_linear's reference."""
    x_q, x_scale = quantize_reference(x, x_dtype, granularity="group", block_size=group_size)
    return _reference(x_q, w_q, x_scale, w_scale, bias=bias)


def _dynamic_bytes(case, dtype) -> int:
    rows = math.prod(case.lead) * case.m
    scales = _scale_count(case.n, case.k, case.w_scale, case.group)
    return rows * case.k * dtype.itemsize + case.n * case.k + 4 * scales + rows * case.n * dtype.itemsize


def _dynamic_tolerance(case, dtype):
    return _tolerance(ScaledLinearCase(m=case.m, n=case.n, k=case.k, w=case.w, x=case.x or case.w), dtype)


_DYNAMIC_TESTS = (
    {"m": 20, "n": 37, "k": 300, "w": "e4m3"},  # K % 128 != 0, block scales
    {"m": 9, "n": 24, "k": 96, "w": "int8", "w_scale": "group", "group": 32, "bias": True},
    {"m": 1, "n": 33, "k": 130, "w": "e5m2", "w_scale": "row"},  # one row, a group of 2 at the end
    {"m": 5, "n": 20, "k": 128, "w": "e4m3", "x": "e5m2", "w_scale": "group"},  # e5m2 activations, e4m3 weights
    {"m": 17, "n": 18, "k": 64, "w": "e4m3", "w_scale": "tensor", "group": 64, "lead": (2,)},
    {"m": 0, "n": 8, "k": 32, "w": "int8", "group": 32},
)  # fmt: skip
_DYNAMIC_GPU = (
    {"m": 4096, "n": 7168, "k": 7168, "w": "e4m3"},
    {"m": 2049, "n": 2112, "k": 7168, "w": "e4m3", "bias": True},
    {"m": 16, "n": 7168, "k": 7168, "w": "e4m3"},
    {"m": 1000, "n": 4096, "k": 4100, "w": "int8", "w_scale": "row"},
)  # fmt: skip
_DYNAMIC_BENCH = tuple({"m": m, "n": 7168, "k": 7168, "w": "e4m3"} for m in (16, 128, 2048, 4096, 8192))

register(KernelSpec(
    name="dynamic_scaled_linear",
    family="gemm",
    sweep="m",
    case_type=DynamicLinearCase,
    summary="W8A8 linear layers that quantize their activations inside the GEMM (1 x 128 groups, int8 or float8).",
    description="scaled_linear with x's quantization fused into it: each K step of the tiled kernel is one 1 x G "
                "group of every row of x, whose amax, scale and codes are computed in registers before the "
                "product, so x's codes and scales never reach memory; the codes are quantize's, bit for bit, and "
                "w takes tensor, row, group or G x G block scales (DeepSeek-V3's recipe).",
    usage="y = tk.ops.dynamic_scaled_linear(x, wq, w_scale)  # x (..., K) bf16, wq (N, K) float8 or int8",
    tags=("gemm", "quantization", "fp8", "int8", "compute-bound", "inference"),
    limits="groups of 32, 64 or 128 along K; x in bf16, fp16 or fp32; forward only; 0.18-0.43x the speed of quantize "
           "then scaled_linear on the H200 (benchmarks/dynamic_linear.py).",
    fn=dynamic_scaled_linear,
    reference=_dynamic_reference,
    make_inputs=_dynamic_inputs,
    test_cases=_DYNAMIC_TESTS,
    gpu_cases=_DYNAMIC_GPU,
    bench_cases=_DYNAMIC_BENCH,
    bytes_moved=_dynamic_bytes,
    flops=lambda case, dtype: 2 * math.prod(case.lead) * case.m * case.n * case.k,
    operand_dtype=lambda case, dtype: CODES[case.x or case.w],  # x quantized to its codes inside the kernel
    dtypes=FLOAT_DTYPES,
    tolerance=_dynamic_tolerance,
    peers={},
    status="experimental",
))  # fmt: skip
