"""quantize and dequantize in the registry: references written from the definition, typed cases, cost models.

The formats are defined in fp32 arithmetic (kernels.py): every input dtype is exact in fp32, so the reference casts
the float64 inputs it receives to fp32 and follows the definition step by step with torch's IEEE operations (tensor
by tensor divisions, round half to even, torch's own float8 conversions); the codes and scales must match exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from tritonkit._core.checks import FLOAT_DTYPES
from tritonkit._core.ints import cdiv
from tritonkit._core.scales import expand_scale, granularity_of
from tritonkit.ops.quant.launch import QMAX, scale_shape
from tritonkit.ops.quant.op import dequantize, quantize
from tritonkit.registry import TOLERANCES, Case, Inputs, KernelSpec, Tolerance, register

FORMATS = {"int8": torch.int8, "e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


@dataclass(frozen=True)
class QuantCase(Case):
    shape: tuple  # x's shape (block: 2-D)
    fmt: str  # "int8", "e4m3" or "e5m2"
    granularity: str = "row"
    block_size: int = 128
    zeros: bool = False  # the first row (or the whole x, when 1-D) is zeros: scale 1, no NaN


def _x(case, device, dtype, generator):
    x = torch.randn(case.shape, device=device, generator=generator, dtype=torch.float32)
    # Magnitudes from 1e-3 to 1e2 across the last dimension: float8's subnormals and its top binades both occur.
    if x.dim() and x.shape[-1] > 1:
        x = x * torch.logspace(-3, 2, x.shape[-1], device=device)
    if case.zeros and x.numel():
        x[0] = 0
    return x.to(dtype)


def _quantize_inputs(case, device, dtype, generator):
    return Inputs((_x(case, device, dtype, generator), FORMATS[case.fmt]),
                  {"granularity": case.granularity, "block_size": case.block_size})  # fmt: skip


def _regions(x: torch.Tensor, granularity: str, block_size: int) -> torch.Tensor:
    """x (fp32) viewed so that each region is one row of the last dim: (regions..., region elements)."""
    if granularity == "tensor":
        return x.reshape(1, -1)
    k = x.shape[-1]
    if granularity == "row":
        return x.reshape(*x.shape[:-1], 1, k)
    padded = torch.nn.functional.pad(x, (0, cdiv(k, block_size) * block_size - k), value=0.0)
    if granularity == "group":
        return padded.unflatten(-1, (-1, block_size))
    m = x.shape[0]
    padded = torch.nn.functional.pad(padded, (0, 0, 0, cdiv(m, block_size) * block_size - m), value=0.0)
    blocks = padded.unflatten(0, (-1, block_size)).unflatten(-1, (-1, block_size))  # (bm, bs, bk, bs)
    return blocks.transpose(1, 2).flatten(-2)  # (bm, bk, bs * bs)


def _quantize_reference(x, dtype, *, granularity="row", block_size=128):
    """The definition in fp32 (see the module docstring)."""
    x = x.float()
    top = QMAX[dtype]
    magnitude = x.abs()
    finite = torch.where(magnitude < math.inf, magnitude, torch.zeros_like(magnitude))
    amax = _regions(finite, granularity, block_size).amax(-1)
    if granularity == "row":
        amax = amax.reshape(*x.shape[:-1], 1)
    elif granularity == "tensor":
        amax = amax.reshape(())
    scale = torch.where(amax > 0, amax / torch.full_like(amax, top), torch.ones_like(amax))
    y = (x / expand_scale(scale, tuple(x.shape), granularity, block_size)).clamp(-top, top)
    if dtype == torch.int8:
        codes = torch.where(torch.isnan(x), torch.zeros_like(y), torch.round(y)).to(torch.int8)
    else:
        codes = torch.where(torch.isnan(x), x, y).to(dtype)
    return codes, scale


def _quantize_bytes(case, dtype) -> int:
    """x read, its codes (one byte each) and scales written."""
    n = math.prod(case.shape)
    return n * (dtype.itemsize + 1) + 4 * math.prod(scale_shape(case.shape, case.granularity, case.block_size))


def _exact(case, dtype):
    """Codes and scales follow the definition to the bit."""
    return Tolerance(atol=0.0, rtol=0.0)


_TESTS = (
    {"shape": (37, 300), "fmt": "int8"},
    {"shape": (5, 7, 64), "fmt": "e4m3", "zeros": True},
    {"shape": (300,), "fmt": "e5m2", "granularity": "tensor"},
    {"shape": (33, 200), "fmt": "int8", "granularity": "tensor", "zeros": True},
    {"shape": (9, 300), "fmt": "e4m3", "granularity": "group", "block_size": 128},  # K not a multiple of 128
    {"shape": (2, 3, 100), "fmt": "int8", "granularity": "group", "block_size": 16, "zeros": True},
    {"shape": (150, 300), "fmt": "e4m3", "granularity": "block", "block_size": 128, "zeros": True},
    {"shape": (40, 70), "fmt": "e5m2", "granularity": "block", "block_size": 32},
    {"shape": (1, 4100), "fmt": "e4m3", "granularity": "row"},  # a row read in chunks
    {"shape": (0, 16), "fmt": "int8"},
    {"shape": (), "fmt": "e4m3", "granularity": "tensor"},
)
_GPU = (
    {"shape": (8192, 7168), "fmt": "e4m3", "granularity": "group"},
    {"shape": (7168, 2112), "fmt": "e4m3", "granularity": "block"},
    {"shape": (4097, 4096), "fmt": "int8"},
    {"shape": (16, 14336), "fmt": "int8", "granularity": "tensor"},
    {"shape": (3000, 5000), "fmt": "e5m2", "granularity": "row", "zeros": True},
    {"shape": (1000, 1000), "fmt": "int8", "granularity": "block", "block_size": 64},
)
# Activations of 4096 to 65536 tokens x 4096 (per row, per 1 x 128 group) and 8192 x 8192 weights (per block).
_BENCH = (
    *({"shape": (m, 4096), "fmt": fmt, "granularity": granularity}
      for fmt, granularity in (("e4m3", "row"), ("e4m3", "group"), ("int8", "row"), ("e4m3", "tensor"))
      for m in (4096, 16384, 65536)),
    *({"shape": (n, 8192), "fmt": "e4m3", "granularity": "block"} for n in (2048, 8192, 28672)),
)  # fmt: skip

register(KernelSpec(
    name="quantize",
    family="quant",
    sweep="shape",
    case_type=QuantCase,
    summary="Quantize to int8, float8 e4m3 or e5m2 with per-tensor, per-row, 1 x G group or G x G block fp32 scales.",
    description="Each program owns whole scale regions: it reads its rows (or block) once for the amax, again to "
                "write the codes, so scales need no second pass over memory; a tensor scale takes one atomic-max "
                "pass first. Codes round to nearest, ties to even, saturating; zero regions get scale 1.",
    usage="xq, scale = tk.ops.quantize(x, torch.float8_e4m3fn, granularity='group')  # scale (M, ceil(K/128))",
    tags=("quantization", "fp8", "int8", "memory-bound", "inference"),
    limits="block granularity: a 2-D x; block_size a power of two >= 16; forward only.",
    fn=quantize,
    reference=_quantize_reference,
    make_inputs=_quantize_inputs,
    test_cases=_TESTS,
    gpu_cases=_GPU,
    bench_cases=_BENCH,
    bytes_moved=_quantize_bytes,
    flops=lambda case, dtype: 0,
    dtypes=FLOAT_DTYPES,
    tolerance=_exact,
    status="experimental",
))  # fmt: skip


# ---------------------------------------------------------------- dequantize


def _dequantize_inputs(case, device, dtype, generator):
    """Codes and scales of a case's x (quantized by the reference, so that the inputs do not depend on the op being
    checked); the output in ``dtype``."""
    x = _x(case, device, torch.float32, generator)
    codes, scale = _quantize_reference(x, FORMATS[case.fmt], granularity=case.granularity,
                                       block_size=case.block_size)  # fmt: skip
    return Inputs((codes, scale), {"dtype": dtype})


def _dequantize_reference(xq, scale, *, dtype=torch.bfloat16):
    found = granularity_of(tuple(xq.shape), tuple(scale.shape))
    granularity, size = found
    return xq.double() * expand_scale(scale.double(), tuple(xq.shape), granularity, size)


def _dequantize_bytes(case, dtype) -> int:
    n = math.prod(case.shape)
    return n * (1 + dtype.itemsize) + 4 * math.prod(scale_shape(case.shape, case.granularity, case.block_size))


register(KernelSpec(
    name="dequantize",
    family="quant",
    sweep="shape",
    case_type=QuantCase,
    summary="Codes times their scales, the granularity read from the scale's shape.",
    description="An elementwise kernel whose element (r, c) reads scale (r // rows per scale, c // columns per "
                "scale): the tensor, row, group and block granularities of quantize in one code path.",
    usage="x = tk.ops.dequantize(xq, scale, dtype=torch.bfloat16)",
    tags=("quantization", "fp8", "int8", "memory-bound", "inference"),
    limits="the scale's shape must name one granularity (group and block sizes: powers of two >= 16).",
    fn=dequantize,
    reference=_dequantize_reference,
    make_inputs=_dequantize_inputs,
    test_cases=_TESTS,
    gpu_cases=_GPU,
    bench_cases=_BENCH,
    bytes_moved=_dequantize_bytes,
    flops=lambda case, dtype: 0,
    dtypes=FLOAT_DTYPES,
    tolerance=lambda case, dtype: TOLERANCES[dtype],
    status="experimental",
))  # fmt: skip
