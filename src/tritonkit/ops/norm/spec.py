"""rms_norm and layer_norm in the registry: float64 references, typed cases, cost model, peers."""

import functools
import math
from dataclasses import dataclass

import torch

from tritonkit._core.checks import FLOAT_DTYPES
from tritonkit.ops.norm.op import layer_norm, rms_norm
from tritonkit.registry import Case, Inputs, KernelSpec, Tolerance, register


@dataclass(frozen=True)
class NormCase(Case):
    rows: int
    n: int  # the normalised (last) dimension
    lead: tuple[int, ...] | None = None  # x's leading shape (None: (rows,))
    layout: str = "contiguous"  # "sliced": a row of every other column band; "transposed": the last dim strided
    scale: float = 1.0  # x's standard deviation (1e-3: a variance near eps)
    trend: float = 0.0  # a ramp from -trend to trend along each row: the slices of a split row differ in mean
    eps: float = 1e-5
    residual: bool = False
    prenorm: bool = False
    residual_in_fp32: bool = False
    no_weight: bool = False
    bias: bool = True
    offset: float = 0.0  # RMSNorm's weight offset (Gemma: 1)


def _lead(case: NormCase) -> tuple[int, ...]:
    return case.lead if case.lead is not None else (case.rows,)


def _reference(is_rms, x, weight, bias=None, residual=None, eps=1e-6, prenorm=False, residual_in_fp32=False,
               offset=0.0):  # fmt: skip
    h = x + residual if residual is not None else x
    if is_rms:
        y = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    else:
        centered = h - h.mean(-1, keepdim=True)
        y = centered * torch.rsqrt(centered.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * (offset + weight)
    if bias is not None:
        y = y + bias
    return (y, h) if prenorm else y


def _rms_norm_reference(x, weight, bias=None, residual=None, eps=1e-6, prenorm=False, residual_in_fp32=False,
                        offset=0.0):  # fmt: skip
    return _reference(True, x, weight, bias, residual, eps, prenorm, residual_in_fp32, offset)


def _layer_norm_reference(x, weight, bias, residual=None, eps=1e-5, prenorm=False, residual_in_fp32=False):
    return _reference(False, x, weight, bias, residual, eps, prenorm, residual_in_fp32)


def _norm_inputs(case: NormCase, device, dtype, generator):
    n = case.n
    lead = _lead(case)

    def randn(*shape, scale=1.0):
        return (scale * torch.randn(shape, device=device, generator=generator, dtype=torch.float32)).to(dtype)

    if case.layout == "sliced":
        x = randn(*lead, n + 5, scale=case.scale)[..., 2 : n + 2]
    elif case.layout == "transposed":
        x = randn(n, *lead, scale=case.scale).movedim(0, -1)
    else:
        x = randn(*lead, n, scale=case.scale)
    if case.trend:  # a ramp along the row, so that parts of a row have different means
        x = (x.float() + torch.linspace(-case.trend, case.trend, n, device=device)).to(dtype)
    kwargs = {"eps": case.eps}
    if case.residual:
        kwargs["residual"] = randn(*x.shape)
    kwargs["prenorm"] = case.prenorm
    kwargs["residual_in_fp32"] = case.residual_in_fp32
    weight = None if case.no_weight else 1.0 + 0.1 * randn(n).float()
    weight = weight.to(dtype) if weight is not None else None
    bias = 0.1 * randn(n) if case.bias else None
    if case.offset:
        kwargs["offset"] = case.offset
    return Inputs((x, weight), {"bias": bias, **kwargs})


def _layer_norm_inputs(case, device, dtype, generator):
    inputs = _norm_inputs(case, device, dtype, generator)
    x, weight = inputs.args
    kwargs = dict(inputs.kwargs)
    bias = kwargs.pop("bias")
    kwargs.pop("offset", None)
    return Inputs((x, weight, bias), kwargs)


def _norm_bytes(case, dtype, backward=False):
    """Fewest bytes moved. Forward: x (and residual) in, y (and h) out. Backward: x (and residual)
    and dy (and dh) in, dx out (which is also dresidual). The weight and bias are counted once."""
    elements = math.prod(_lead(case)) * case.n
    tensors = (3 + case.residual + case.prenorm) if backward else (2 + case.residual + case.prenorm)
    return tensors * elements * dtype.itemsize + 2 * case.n * dtype.itemsize


def _liger_rms_norm():
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction

    def call(x, weight, bias=None, residual=None, eps=1e-6, prenorm=False, residual_in_fp32=False, offset=0.0):
        if bias is not None or residual is not None or prenorm:
            raise ValueError("liger-kernel's RMSNorm has no bias, residual or prenorm")
        return LigerRMSNormFunction.apply(x, weight, eps, offset)

    return call


def _liger_layer_norm():
    from liger_kernel.ops.layer_norm import LigerLayerNormFunction

    def call(x, weight, bias, residual=None, eps=1e-5, prenorm=False, residual_in_fp32=False):
        if residual is not None or prenorm:
            raise ValueError("liger-kernel's LayerNorm has no residual or prenorm")
        return LigerLayerNormFunction.apply(x, weight, bias, eps)

    return call


_NORM_TESTS = (
    {"rows": 3, "n": 1},
    {"rows": 5, "n": 7},
    {"rows": 33, "n": 128},
    {"rows": 4, "n": 1000, "residual": True},
    {"rows": 40, "n": 1000, "residual": True},  # above ONE_PROGRAM_BACKWARD: per-program partial sums
    {"rows": 6, "n": 96, "residual": True, "prenorm": True},
    {"rows": 6, "n": 96, "residual": True, "prenorm": True, "residual_in_fp32": True},
    {"rows": 0, "n": 64},
    {"rows": 6, "n": 48, "lead": (2, 3), "layout": "transposed"},
    {"rows": 7, "n": 50, "layout": "sliced", "residual": True},
    {"rows": 9, "n": 64, "scale": 1e-3, "eps": 1e-5},  # variance near eps: a wrong eps shows
    {"rows": 5, "n": 40, "no_weight": True, "bias": False},
    # The split-row forward, the wide backward; a ramp along the row gives LayerNorm's slices (three of 8192
    # in bf16) different means, which its between-slice term must account for.
    {"rows": 2, "n": 20000, "residual": True, "prenorm": True, "trend": 4.0},
    # the 16384 block: single pass both ways, the backward in saves_registers' order
    {"rows": 3, "n": 9000, "residual": True},
    {"rows": 3, "n": 3000, "residual": True, "prenorm": True},  # RMSNorm's looped forward within one block
)
_NORM_GPU = (
    {"rows": 4096, "n": 4096},
    {"rows": 1000, "n": 5120, "residual": True, "prenorm": True, "residual_in_fp32": True},
    {"rows": 333, "n": 131072, "residual": True},
    {"rows": 7, "n": 65537},
    {"rows": 8, "n": 4096},
    {"rows": 4097, "n": 123, "lead": (17, 241), "layout": "transposed"},
    {"rows": 1111, "n": 16000, "residual": True},  # the widest single-pass forward, with a residual
    {"rows": 64, "n": 40000, "trend": 4.0, "residual": True, "prenorm": True, "residual_in_fp32": True},
    {"rows": 1001, "n": 1024},  # the forward plans of two rows a block at 1024, with statistics and without, and
    {"rows": 999, "n": 2048},  # LayerNorm's own plan at 2048: odd rows
)
# The small case first (`--sizes small`), the sweep over widths, then the fused add + prenorm case.
_NORM_BENCH = (
    {"rows": 8, "n": 4096, "bias": False},
    *({"rows": 16384, "n": n, "bias": False} for n in (1024, 2048, 4096, 8192, 16384)),
    {"rows": 4096, "n": 65536, "bias": False},  # rows split across programs (the bytes of 16384 x 16384)
    {"rows": 16384, "n": 4096, "bias": False, "residual": True, "prenorm": True},
)

_RMS_TESTS = (*_NORM_TESTS, {"rows": 5, "n": 64, "offset": 1.0})


def _norm_tolerance(case, dtype):
    """fp32 gradients need 1e-4: the backward's g - mean(g) - xhat * mean(g * xhat) cancels, and rstd
    scales the remainder, so fp32 rounding reaches ~3e-5 relative on rows whose variance is near eps
    (seen in the scale=1e-3 case). A wrong eps or a dropped term is still off by orders more."""
    return Tolerance(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else None


_LAYER_NORM_BENCH = tuple({**case, "bias": True} for case in _NORM_BENCH)  # LayerNorm usually has a bias

for _name, _fn, _reference_fn, _inputs, _tests, _bench, _liger in (
    ("rms_norm", rms_norm, _rms_norm_reference, _norm_inputs, _RMS_TESTS, _NORM_BENCH, _liger_rms_norm),
    (
        "layer_norm",
        layer_norm,
        _layer_norm_reference,
        _layer_norm_inputs,
        _NORM_TESTS,
        _LAYER_NORM_BENCH,
        _liger_layer_norm,
    ),
):
    register(KernelSpec(
        name=_name,
        family="norm",
        sweep="n",
        case_type=NormCase,
        summary=f"Fused residual add + {'RMSNorm' if _name == 'rms_norm' else 'LayerNorm'}, forward and backward.",
        description="h = x + residual, y = normalize(h) * (offset + weight) + bias, with prenorm returning h "
                    "(optionally fp32), as mamba_ssm's fused add+norm. One pass in registers up to 16384 "
                    "columns; beyond, programs share each row (forward, and the backward where faster); fp32 "
                    "statistics; deterministic fp32 dweight/dbias.",
        usage=f"y, h = tk.ops.{_name}(x, weight{', bias' if _name == 'layer_norm' else ''}, residual=h, "
              "prenorm=True)",
        tags=("norm", "fused", "memory-bound", "backward"),
        limits="Normalises the last dimension; any leading shape; hidden sizes from 1 up (wide rows split).",
        fn=_fn,
        reference=_reference_fn,
        make_inputs=_inputs,
        test_cases=_tests,
        gpu_cases=_NORM_GPU,
        bench_cases=_bench,
        bytes_moved=_norm_bytes,
        bytes_moved_bwd=functools.partial(_norm_bytes, backward=True),
        flops=lambda case, dtype: 5 * math.prod(_lead(case)) * case.n,
        dtypes=FLOAT_DTYPES,
        has_backward=True,
        tolerance=_norm_tolerance,
        peers={"liger": _liger},
    ))  # fmt: skip
