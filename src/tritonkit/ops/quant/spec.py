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
from tritonkit._core.fourbit import NESTED_BLOCK, int4_weight, nf4_tables, nf4_weight
from tritonkit._core.ints import cdiv
from tritonkit._core.scales import expand_scale, granularity_of, quantize_reference
from tritonkit.ops.quant.launch import scale_shape
from tritonkit.ops.quant.op import (
    NF4State,
    dequantize,
    int4_dequantize,
    int4_quantize,
    nf4_dequantize,
    nf4_quantize,
    quantize,
)
from tritonkit.registry import TOLERANCES, Case, Inputs, KernelSpec, Tolerance, register

FORMATS = {"int8": torch.int8, "e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


@dataclass(frozen=True)
class QuantCase(Case):
    shape: tuple  # x's shape (block: 2-D)
    fmt: str  # "int8", "e4m3" or "e5m2"
    granularity: str = "row"
    block_size: int = 128
    zeros: bool = False  # the first row (or the whole x, when 1-D) is zeros: scale 1, no NaN
    # x is the transpose of a row-major tensor (2-D; unit stride down its columns), as a backward pass quantizes
    # dy^T and x^T along the tokens: read where it lies, not copied
    transposed: bool = False


def _x(case, device, dtype, generator):
    if case.transposed:
        x = torch.randn(case.shape[::-1], device=device, generator=generator, dtype=torch.float32).t()
    else:
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
    {"shape": (2, 4100), "fmt": "e4m3", "granularity": "row"},  # rows past 2048 columns: one 8192-wide tile on sm90
    {"shape": (1, 8300), "fmt": "int8", "granularity": "row"},  # a row past 8192 columns: read twice, in chunks
    {"shape": (0, 16), "fmt": "int8"},
    {"shape": (), "fmt": "e4m3", "granularity": "tensor"},
    # transposed operands: row scales over 600 stored rows (three column-amax programs), a tensor scale, groups
    {"shape": (70, 600), "fmt": "e4m3", "granularity": "row", "transposed": True},
    {"shape": (50, 40), "fmt": "int8", "granularity": "tensor", "transposed": True, "zeros": True},
    {"shape": (20, 300), "fmt": "int8", "granularity": "group", "transposed": True},
)
_GPU = (
    {"shape": (8192, 7168), "fmt": "e4m3", "granularity": "group"},
    {"shape": (7168, 2112), "fmt": "e4m3", "granularity": "block"},
    {"shape": (4097, 4096), "fmt": "int8"},
    {"shape": (16, 14336), "fmt": "int8", "granularity": "tensor"},
    {"shape": (3000, 5000), "fmt": "e5m2", "granularity": "row", "zeros": True},
    {"shape": (1000, 1000), "fmt": "int8", "granularity": "block", "block_size": 64},
    {"shape": (14336, 8192), "fmt": "e4m3", "granularity": "row", "transposed": True},  # dy^T of a Llama MLP
)
# Activations of 4096 to 65536 tokens x 4096 (per row, per 1 x 128 group) and 8192 x 8192 weights (per block).
_BENCH = (
    *({"shape": (m, 4096), "fmt": fmt, "granularity": granularity}
      for fmt, granularity in (("e4m3", "row"), ("e4m3", "group"), ("int8", "row"), ("e4m3", "tensor"))
      for m in (4096, 16384, 65536)),
    *({"shape": (n, 8192), "fmt": "e4m3", "granularity": "block"} for n in (2048, 8192, 28672)),
    *({"shape": (14336, 8192), "fmt": "e4m3", "granularity": granularity, "transposed": True}
      for granularity in ("row", "tensor")),  # float8 training's dy^T
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
    reference=quantize_reference,
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
    codes, scale = quantize_reference(x, FORMATS[case.fmt], granularity=case.granularity,
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


# ---------------------------------------------------------------- NF4


@dataclass(frozen=True)
class NF4Case(Case):
    shape: tuple  # the weight's shape
    blocksize: int = 64
    double_quant: bool = False


def _nf4_inputs(case, device, dtype, generator):
    w = torch.randn(case.shape, device=device, generator=generator, dtype=torch.float32) * 0.02  # a weight's scale
    return Inputs((w.to(dtype),), {"blocksize": case.blocksize, "double_quant": case.double_quant})


def _nf4_tensors(packed, state: NF4State) -> tuple:
    if state.nested:
        return packed, state.absmax_codes, state.absmax_scales, state.offset
    return packed, state.absmax


def _nf4_quantized(w, *, blocksize=64, double_quant=False):
    """nf4_quantize's tensors: (packed, absmax), or (packed, absmax codes, absmax scales, offset)."""
    return _nf4_tensors(*nf4_quantize(w, blocksize=blocksize, double_quant=double_quant))


def _nearest(values: torch.Tensor, code: torch.Tensor) -> torch.Tensor:
    """The index of the nearest code value (a value on a midpoint takes the lower one)."""
    return torch.bucketize(values, (code[:-1] + code[1:]) / 2).to(torch.uint8)


def _scaled_blocks(flat: torch.Tensor, blocksize: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(the values times the reciprocal of their block's absmax, clamped to [-1, 1]; the absmax per block)."""
    blocks = cdiv(flat.numel(), blocksize)
    padded = torch.nn.functional.pad(flat, (0, blocks * blocksize - flat.numel())).view(blocks, blocksize)
    absmax = padded.abs().amax(-1)
    inverse = torch.ones_like(absmax) / absmax.clamp(min=1e-38)
    return (padded * inverse[:, None]).clamp(-1, 1).reshape(-1)[: flat.numel()], absmax


def _nf4_quantize_reference(w, *, blocksize=64, double_quant=False):
    """bitsandbytes' NF4 format from its definition, in fp32 (every input dtype is exact in it)."""
    scaled, absmax = _scaled_blocks(w.reshape(-1).float(), blocksize)
    nf4_code, _, nested_code = nf4_tables(w.device)  # on the device once, so that a CUDA graph can capture this
    codes = _nearest(torch.nn.functional.pad(scaled, (0, scaled.numel() % 2)), nf4_code)
    packed = (codes[0::2] << 4) | codes[1::2]
    if not double_quant:
        return packed, absmax
    offset = absmax.mean()
    centered, scales = _scaled_blocks(absmax - offset, NESTED_BLOCK)
    return packed, _nearest(centered, nested_code), scales, offset


def _nf4_bytes(case, dtype) -> int:
    """The weight read, its codes (half a byte a value) and absmax values written."""
    n = math.prod(case.shape)
    return n * dtype.itemsize + (n + 1) // 2 + 4 * cdiv(n, case.blocksize)


_NF4_TESTS = (
    {"shape": (37, 50)},
    {"shape": (129,), "blocksize": 32},  # an odd count: the last byte's low nibble is padding
    {"shape": (64, 96), "blocksize": 256, "double_quant": True},
    {"shape": (3, 5, 77), "blocksize": 128},
    {"shape": (96, 100), "blocksize": 32, "double_quant": True},  # 300 blocks: two nested blocks, one partial
    {"shape": (0, 8)},
)
_NF4_GPU = (
    {"shape": (14336, 4096), "double_quant": True},
    {"shape": (4096, 4096)},
    {"shape": (4097, 1023), "blocksize": 128, "double_quant": True},
)
_NF4_BENCH = tuple({"shape": (n, 4096), "double_quant": True} for n in (4096, 14336, 28672))

register(KernelSpec(
    name="nf4_quantize",
    family="quant",
    sweep="shape",
    case_type=NF4Case,
    summary="Weights to bitsandbytes' NF4 (4-bit NormalFloat, blocks of 64), with its double quantization.",
    description="One program per block: the absmax, the values times its reciprocal, the nearest of the 16 NF4 "
                "values by comparison with their midpoints, two codes a byte (first in the high nibble); the "
                "double quantization of the absmax values in torch. Bit for bit bitsandbytes' quantize_4bit.",
    usage="packed, state = tk.ops.nf4_quantize(weight, double_quant=True)",
    tags=("quantization", "nf4", "4-bit", "qlora", "memory-bound"),
    limits="blocksize 32 to 4096, a power of two; forward only.",
    fn=_nf4_quantized,
    reference=_nf4_quantize_reference,
    make_inputs=_nf4_inputs,
    test_cases=_NF4_TESTS,
    gpu_cases=_NF4_GPU,
    bench_cases=_NF4_BENCH,
    bytes_moved=_nf4_bytes,
    flops=lambda case, dtype: 0,
    dtypes=FLOAT_DTYPES,
    tolerance=_exact,
    notes="Checked as its tensors: the packed codes and the absmax values (or their double quantization).",
    covers=(nf4_quantize,),
    status="experimental",
))  # fmt: skip


def _nf4_dequantize_inputs(case, device, dtype, generator):
    """The reference's NF4 tensors of a weight; the output in ``dtype``."""
    (w,) = _nf4_inputs(case, device, torch.float32, generator).args
    tensors = _nf4_quantize_reference(w, blocksize=case.blocksize, double_quant=case.double_quant)
    return Inputs(tensors, {"shape": case.shape, "blocksize": case.blocksize, "dtype": dtype})


def _nf4_dequantized(packed, *tensors, shape, blocksize, dtype):
    """nf4_dequantize of the tensors nf4_quantize's state holds."""
    if len(tensors) == 1:
        state = NF4State(tuple(shape), dtype, blocksize, absmax=tensors[0])
    else:
        codes, scales, offset = tensors
        state = NF4State(tuple(shape), dtype, blocksize, absmax_codes=codes, absmax_scales=scales, offset=offset)
    return nf4_dequantize(packed, state, dtype=dtype)


def _nf4_dequantize_reference(packed, *tensors, shape, blocksize, dtype):
    """code[q] * absmax in fp32 (the double-quantized absmax decoded first: its code times its scale, plus the
    offset, two fp32 roundings), as bitsandbytes computes it; the checker rounds nothing further."""
    return nf4_weight(packed, *tensors, shape=shape, blocksize=blocksize).double()


register(KernelSpec(
    name="nf4_dequantize",
    family="quant",
    sweep="shape",
    case_type=NF4Case,
    summary="bitsandbytes' NF4 weights back to bf16/fp16/fp32 in one launch, double-quantized absmax included.",
    description="One program per 1024 bytes: each byte's two codes looked up in the 16-value table, times the "
                "block's absmax (decoded from its 8-bit code, scale and offset when double-quantized, without fused "
                "multiply-adds so the roundings are bitsandbytes'), in fp32, cast once.",
    usage="w = tk.ops.nf4_dequantize(packed, state, dtype=torch.bfloat16)",
    tags=("quantization", "nf4", "4-bit", "qlora", "memory-bound"),
    limits="an NF4State from nf4_quantize or NF4State.from_bitsandbytes.",
    fn=_nf4_dequantized,
    reference=_nf4_dequantize_reference,
    make_inputs=_nf4_dequantize_inputs,
    test_cases=_NF4_TESTS,
    gpu_cases=_NF4_GPU,
    bench_cases=_NF4_BENCH,
    bytes_moved=lambda case, dtype: _nf4_bytes(case, dtype),  # the same bytes, read and written the other way
    flops=lambda case, dtype: 0,
    dtypes=FLOAT_DTYPES,
    notes="Checked through an NF4State built from the reference's tensors.",
    covers=(nf4_dequantize,),
    status="experimental",
))  # fmt: skip


# ---------------------------------------------------------------- INT4 weights


@dataclass(frozen=True)
class Int4Case(Case):
    n: int  # output features
    k: int  # input features (even)
    group_size: int = 128
    symmetric: bool = False


def _int4_inputs(case, device, dtype, generator):
    w = torch.randn((case.n, case.k), device=device, generator=generator, dtype=torch.float32) * 0.02
    return Inputs((w.to(dtype),), {"group_size": case.group_size, "symmetric": case.symmetric})


def _int4_quantize_reference(w, *, group_size=128, symmetric=False):
    """The definition (int4_quantize's docstring) in fp32, group by group (a short last group padded with zeros,
    which the asymmetric range holds anyway and the absmax ignores)."""
    w = w.float()
    n, k = w.shape
    groups = cdiv(k, group_size)
    padded = torch.nn.functional.pad(w, (0, groups * group_size - k)).view(n, groups, group_size)
    if symmetric:
        amax = padded.abs().amax(-1)
        scale = amax.clamp(min=1e-5) / torch.full_like(amax, 7.0)
        zero = torch.full_like(scale, 8.0)
    else:
        high, low = padded.amax(-1).clamp(min=0), padded.amin(-1).clamp(max=0)
        scale = (high - low).clamp(min=1e-5) / torch.full_like(high, 15.0)
        zero = torch.round(-low / scale).clamp(0, 15)
    codes = (torch.round(padded / scale[..., None]) + zero[..., None]).clamp(0, 15).reshape(n, groups * group_size)
    codes = codes[:, :k]
    codes = codes.to(torch.uint8)
    return codes[:, 0::2] | (codes[:, 1::2] << 4), scale, zero.to(torch.uint8)


def _int4_bytes(case, dtype) -> int:
    """The weight read, its codes (half a byte a value), fp32 scales and uint8 zeros written."""
    groups = case.n * cdiv(case.k, case.group_size)
    return case.n * case.k * dtype.itemsize + case.n * case.k // 2 + 5 * groups


_INT4_TESTS = (
    {"n": 33, "k": 256},
    {"n": 17, "k": 200, "group_size": 64},  # K not a multiple of the group
    {"n": 40, "k": 96, "group_size": 32, "symmetric": True},
    {"n": 3, "k": 18, "group_size": 16},
    {"n": 0, "k": 64},
)
_INT4_GPU = ({"n": 14336, "k": 4096}, {"n": 4096, "k": 14336, "symmetric": True}, {"n": 1000, "k": 4100})
_INT4_BENCH = tuple({"n": n, "k": 4096} for n in (4096, 14336, 28672))

register(KernelSpec(
    name="int4_quantize",
    family="quant",
    sweep="n",
    case_type=Int4Case,
    summary="Weights to 4-bit codes with a scale and zero point per group along K (AWQ/GPTQ style), and back.",
    description="One program per tile of rows and one group: the group's min and max (or absmax), its scale and "
                "zero point, the codes two a byte; IEEE divisions and ties-to-even rounding, so the codes follow "
                "the definition exactly.",
    usage="qweight, scales, zeros = tk.ops.int4_quantize(w, group_size=128)  # w (N, K)",
    tags=("quantization", "int4", "4-bit", "memory-bound"),
    limits="w 2-D with an even K; group_size a power of two >= 16; forward only.",
    fn=int4_quantize,
    reference=_int4_quantize_reference,
    make_inputs=_int4_inputs,
    test_cases=_INT4_TESTS,
    gpu_cases=_INT4_GPU,
    bench_cases=_INT4_BENCH,
    bytes_moved=_int4_bytes,
    flops=lambda case, dtype: 0,
    dtypes=FLOAT_DTYPES,
    tolerance=_exact,
    status="experimental",
))  # fmt: skip


def _int4_dequantize_inputs(case, device, dtype, generator):
    (w,) = _int4_inputs(case, device, torch.float32, generator).args
    tensors = _int4_quantize_reference(w, group_size=case.group_size, symmetric=case.symmetric)
    return Inputs(tensors, {"group_size": case.group_size, "dtype": dtype})


def _int4_dequantize_reference(qweight, scales, zeros, *, group_size=128, dtype=torch.bfloat16):
    return int4_weight(qweight, scales, zeros, group_size=group_size).double()


register(KernelSpec(
    name="int4_dequantize",
    family="quant",
    sweep="n",
    case_type=Int4Case,
    summary="4-bit grouped weights back to bf16/fp16/fp32: (code - zero) * scale.",
    description="An elementwise kernel over the weight: each value's byte, nibble, group scale and zero point.",
    usage="w = tk.ops.int4_dequantize(qweight, scales, zeros, group_size=128)",
    tags=("quantization", "int4", "4-bit", "memory-bound"),
    limits="int4_quantize's layout (or a converted AWQ/GPTQ checkpoint's).",
    fn=int4_dequantize,
    reference=_int4_dequantize_reference,
    make_inputs=_int4_dequantize_inputs,
    test_cases=_INT4_TESTS,
    gpu_cases=_INT4_GPU,
    bench_cases=_INT4_BENCH,
    bytes_moved=_int4_bytes,
    flops=lambda case, dtype: 0,
    dtypes=FLOAT_DTYPES,
    status="experimental",
))  # fmt: skip
