"""nf4_linear and int4_linear in the registry: float64 references on the dequantized weights, typed cases, the cost
model, the peers.

The inputs draw the 4-bit tensors directly (every code, random block scales, double-quantized absmax values and zero
points), so the check does not depend on any quantizer. The reference dequantizes them as the formats define, in fp32
(the nested absmax with its two roundings), rounds each weight to the checked dtype as the op does, and multiplies in
float64: the kernels' error is then their fp32 sums and the output's rounding alone. (The one-row GEMVs multiply by
the exact weight instead; the rounding they skip stays within the bf16 output's bound.)
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass

import torch

from tritonkit._core.checks import FLOAT_DTYPES
from tritonkit._core.fourbit import NESTED_BLOCK, NF4State, int4_weight, nf4_weight
from tritonkit._core.ints import cdiv
from tritonkit.ops.fourbit.op import int4_linear, nf4_linear
from tritonkit.registry import TOLERANCES, Case, Inputs, KernelSpec, Tolerance, register


@dataclass(frozen=True)
class NF4LinearCase(Case):
    n: int  # output features
    k: int  # input features
    m: int = 1  # rows of x, unless lead gives x's leading shape
    lead: tuple[int, ...] | None = None
    bias: bool = False
    x_transposed: bool = False  # x stored (K, ...): strided rows
    blocksize: int = 64
    double_quant: bool = False


@dataclass(frozen=True)
class Int4LinearCase(Case):
    n: int
    k: int  # even
    m: int = 1
    lead: tuple[int, ...] | None = None
    bias: bool = False
    x_transposed: bool = False
    group_size: int = 128


def _lead(case) -> tuple[int, ...]:
    return case.lead if case.lead is not None else (case.m,)


def _x_and_bias(case, device, dtype, generator) -> tuple[torch.Tensor, torch.Tensor | None]:
    lead = _lead(case)

    def randn(*shape):
        return torch.randn(shape, device=device, generator=generator, dtype=torch.float32)

    x = randn(case.k, *lead).movedim(0, -1) if case.x_transposed else randn(*lead, case.k)
    bias = (0.1 * randn(case.n)).to(dtype) if case.bias else None
    return x.to(dtype), bias


def _uniform(shape, low, high, device, generator) -> torch.Tensor:
    return torch.rand(shape, device=device, generator=generator) * (high - low) + low


def _bytes_of(count: int, device, generator) -> torch.Tensor:
    return torch.randint(0, 256, (count,), device=device, generator=generator, dtype=torch.uint8)


# Weights whose values are about K^-1/2 (as nn.Linear's), so that every output is about 1: an NF4 value has an rms of
# about 0.5 over uniform codes, an INT4 code minus its zero point about 6.
_NF4_ABSMAX = 2.0
_INT4_SCALE = 1.0 / 6.0


def _nf4_inputs(case, device, dtype, generator):
    x, bias = _x_and_bias(case, device, dtype, generator)
    count = case.n * case.k
    blocks = cdiv(count, case.blocksize)
    packed = _bytes_of((count + 1) // 2, device, generator)
    absmax_size = _NF4_ABSMAX * max(case.k, 1) ** -0.5
    if case.double_quant:  # absmax = code[c] * scale + offset within [0.5, 1.5] of absmax_size
        tensors = (_bytes_of(blocks, device, generator),
                   _uniform((cdiv(blocks, NESTED_BLOCK),), 0.3, 0.5, device, generator) * absmax_size,
                   torch.tensor([absmax_size], device=device))  # fmt: skip
    else:
        tensors = (_uniform((blocks,), 0.5, 1.5, device, generator) * absmax_size,)
    frozen = frozenset(range(1, 2 + len(tensors)))  # the weight's tensors: no gradient
    return Inputs((x, packed, *tensors), {"shape": (case.n, case.k), "blocksize": case.blocksize, "dtype": dtype,
                                          "bias": bias}, frozen)  # fmt: skip


def _nf4_state(tensors: tuple, shape, blocksize, dtype) -> NF4State:
    if len(tensors) == 1:
        return NF4State(tuple(shape), dtype, blocksize, absmax=tensors[0])
    codes, scales, offset = tensors
    return NF4State(tuple(shape), dtype, blocksize, absmax_codes=codes, absmax_scales=scales, offset=offset)


def _nf4_linear(x, packed, *tensors, shape, blocksize, dtype, bias=None):
    """nf4_linear through an NF4State of the case's tensors (``dtype``: the checked dtype, for the reference)."""
    return nf4_linear(x, packed, _nf4_state(tensors, shape, blocksize, dtype), bias=bias)


def _linear_reference(x, weight, dtype, bias):
    """x W^T + bias in float64 with W (fp32) rounded to the checked dtype, as the kernels round it."""
    y = x @ weight.to(dtype).to(x.dtype).t()  # float64 in the tests; x's own dtype as the benchmarks' torch row
    return y + bias if bias is not None else y


def _nf4_reference(x, packed, *tensors, shape, blocksize, dtype, bias=None):
    return _linear_reference(x, nf4_weight(packed, *tensors, shape=shape, blocksize=blocksize), dtype, bias)


def _int4_inputs(case, device, dtype, generator):
    x, bias = _x_and_bias(case, device, dtype, generator)
    groups = cdiv(case.k, case.group_size)
    qweight = _bytes_of(case.n * case.k // 2, device, generator).view(case.n, case.k // 2)
    scales = _uniform((case.n, groups), 0.5, 1.5, device, generator) * _INT4_SCALE * max(case.k, 1) ** -0.5
    zeros = torch.randint(0, 16, (case.n, groups), device=device, generator=generator, dtype=torch.uint8)
    return Inputs((x, qweight, scales, zeros), {"group_size": case.group_size, "dtype": dtype, "bias": bias},
                  frozenset({2}))  # fmt: skip


def _int4_linear(x, qweight, scales, zeros, *, group_size, dtype, bias=None):
    return int4_linear(x, qweight, scales, zeros, group_size=group_size, bias=bias)


def _int4_reference(x, qweight, scales, zeros, *, group_size, dtype, bias=None):
    return _linear_reference(x, int4_weight(qweight, scales, zeros, group_size=group_size), dtype, bias)


def _rows(case) -> int:
    return math.prod(_lead(case))


def _weight_bytes(case) -> int:
    """The packed codes and their scales: what the kernels must read of the weight."""
    n, k = case.n, case.k
    if isinstance(case, Int4LinearCase):
        return n * k // 2 + 5 * n * cdiv(k, case.group_size)
    blocks = cdiv(n * k, case.blocksize)
    scales = blocks + 4 * cdiv(blocks, NESTED_BLOCK) if case.double_quant else 4 * blocks
    return (n * k + 1) // 2 + scales


def _bytes(case, dtype) -> int:
    """Forward: the weight's bytes, x in and y out (and the bias)."""
    m = _rows(case)
    return _weight_bytes(case) + (m * (case.k + case.n) + case.n * case.bias) * dtype.itemsize


def _bytes_bwd(case, dtype) -> int:
    """Input gradient: the weight's bytes, dy in and dx out."""
    return _weight_bytes(case) + _rows(case) * (case.k + case.n) * dtype.itemsize


def _flops(case, dtype) -> int:
    return 2 * _rows(case) * case.n * case.k


def _tolerance(case, dtype):
    """The table's entry for the output's one rounding, plus the fp32 sums of K products (eps32 * sqrt(K) of the
    output's rms, four times over: the order of the sums differs from the reference's)."""
    base = TOLERANCES[dtype]
    return Tolerance(atol=base.atol, rtol=base.rtol,
                     rms_atol=4 * torch.finfo(torch.float32).eps * math.sqrt(max(case.k, case.n, 1)))  # fmt: skip


def _peer(name: str):
    def factory():
        return getattr(importlib.import_module("tritonkit.bench.fourbit_peers"), name)()

    return factory


_PEERS = {name: _peer(name.replace("-", "_"))
          for name in ("cublas", "dequantize-cublas", "compiled-dequantize", "bitsandbytes")}  # fmt: skip

_NF4_TESTS = (
    {"m": 1, "n": 33, "k": 64},  # one row: split K
    {"m": 5, "n": 40, "k": 77, "blocksize": 32, "bias": True},  # odd K: rows start mid-byte and blocks span rows
    {"lead": (2, 3), "n": 24, "k": 200, "double_quant": True, "blocksize": 32},  # K not a multiple of the block
    {"m": 40, "n": 70, "k": 96, "bias": True, "x_transposed": True},  # from 17 rows: dequantized first
    {"m": 130, "n": 17, "k": 72, "blocksize": 128, "double_quant": True},  # odd N
    {"m": 3, "n": 9, "k": 1},  # K = 1: half a byte a row
    {"m": 12, "n": 20, "k": 128, "double_quant": True, "blocksize": 32},  # past the GEMV's rows: the 16-row dot tile
    {"m": 0, "n": 8, "k": 64, "bias": True},
)
_INT4_TESTS = (
    {"m": 1, "n": 33, "k": 768},  # one row: K split in three (the GEMV's 256-column steps)
    {"m": 6, "n": 40, "k": 200, "group_size": 64, "bias": True},  # K not a multiple of the group
    {"lead": (2, 5), "n": 17, "k": 96, "group_size": 32, "x_transposed": True},
    {"m": 70, "n": 50, "k": 160, "group_size": 16, "bias": True},  # dequantized first
    {"m": 4, "n": 0, "k": 64},
)
_NF4_GPU = (
    {"m": 1, "n": 14336, "k": 4096, "double_quant": True},
    {"m": 16, "n": 4096, "k": 4096},
    {"m": 300, "n": 4097, "k": 1023, "blocksize": 128, "double_quant": True, "bias": True},
    {"m": 4096, "n": 4096, "k": 4096, "double_quant": True},
)
_INT4_GPU = (
    {"m": 1, "n": 14336, "k": 4096},
    {"m": 16, "n": 4096, "k": 14336, "bias": True},
    {"m": 513, "n": 1000, "k": 4100, "group_size": 64},
    {"m": 4096, "n": 4096, "k": 4096},
)
_NF4_BENCH = tuple({"m": m, "n": 14336, "k": 4096, "double_quant": True} for m in (1, 4, 16, 128, 1024, 4096))
_INT4_BENCH = tuple({"m": m, "n": 14336, "k": 4096} for m in (1, 4, 16, 128, 1024, 4096))
_COMMON = {
    "family": "fourbit",
    "sweep": "m",
    "tags": ("quantization", "4-bit", "gemm", "gemv", "qlora", "backward"),
    "bytes_moved": _bytes,
    "bytes_moved_bwd": _bytes_bwd,
    "flops": _flops,
    "flops_bwd": _flops,
    "dtypes": FLOAT_DTYPES,
    "has_backward": True,
    "tolerance": _tolerance,
    "peers": _PEERS,
    "status": "experimental",
}

register(KernelSpec(
    name="nf4_linear",
    case_type=NF4LinearCase,
    summary="x @ W.T + bias with W in bitsandbytes' NF4 (double quantization too), dequantized in registers.",
    description="At one row a GEMV kernel streams the weight's bytes, decodes them and multiplies on the CUDA "
                "cores. From 2 to 8 each K step loads the weight's bytes and block absmax values (decoding the "
                "double-quantized ones), looks the codes up in the 16 NF4 values and multiplies x's even and odd "
                "columns by the two halves on the tensor cores; from 9 to 16 the GEMV kernel runs again, its "
                "products on the tensor cores. All split K across programs with an ordered sum of "
                "the partials; from 17 rows the weight is dequantized once and multiplied on cuBLAS. The input "
                "gradient dx = dy W is a kernel of the dot's shape over N. Peers: cuBLAS on the bf16 weight, "
                "nf4_dequantize + cuBLAS, torch.compile of a plain dequantization + cuBLAS, bitsandbytes.",
    usage="y = tk.ops.nf4_linear(x, packed, state, bias=b)  # packed, state = tk.ops.nf4_quantize(w)",
    limits="state.shape 2-D (N, K), any K; the weight is frozen (gradients for x and bias).",
    fn=_nf4_linear,
    reference=_nf4_reference,
    make_inputs=_nf4_inputs,
    test_cases=_NF4_TESTS,
    gpu_cases=_NF4_GPU,
    bench_cases=_NF4_BENCH,
    notes="Checked through an NF4State built from random codes, absmax values and their double quantization.",
    covers=(nf4_linear,),
    **_COMMON,
))  # fmt: skip

register(KernelSpec(
    name="int4_linear",
    case_type=Int4LinearCase,
    summary="x @ W.T + bias with W in grouped INT4 codes (AWQ/GPTQ style), dequantized in registers.",
    description="As nf4_linear, with each value (code - zero) * scale of its row's group along K, except that from 2 "
                "to 8 rows the GEMV kernel runs too, its products on the tensor cores, as from 9. Peers: cuBLAS "
                "on the bf16 weight, int4_dequantize + cuBLAS, torch.compile of a plain dequantization + cuBLAS.",
    usage="y = tk.ops.int4_linear(x, qweight, scales, zeros, group_size=128)",
    limits="K even; group_size a power of two >= 16; the weight is frozen (gradients for x and bias).",
    fn=_int4_linear,
    reference=_int4_reference,
    make_inputs=_int4_inputs,
    test_cases=_INT4_TESTS,
    gpu_cases=_INT4_GPU,
    bench_cases=_INT4_BENCH,
    covers=(int4_linear,),
    **_COMMON,
))  # fmt: skip
