"""rms_norm and layer_norm in the registry: float64 references, typed cases, cost model, peers."""

import functools
import math
from dataclasses import dataclass

import torch

from tritonkit._core.checks import FLOAT_DTYPES
from tritonkit._core.dropout import keep_mask
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
    # flash-attention's options: a second input x1, a second output (weight1, and bias1 where bias), dropout of x and
    # x1, rowscale (a scale a row of x, no gradient), and the dropout masks returned
    x1: bool = False
    weight1: bool = False
    dropout_p: float = 0.0
    rowscale: bool = False
    masks: bool = False


def _lead(case: NormCase) -> tuple[int, ...]:
    return case.lead if case.lead is not None else (case.rows,)


def _reference(is_rms, x, weight, bias=None, residual=None, eps=1e-6, prenorm=False, residual_in_fp32=False,
               offset=0.0, *, x1=None, weight1=None, bias1=None, dropout_p=0.0, rowscale=None,
               return_dropout_mask=False, dropout_seed=None):  # fmt: skip
    """The fused add + norm with flash-attention's options, dropout's masks from tritonkit._core.dropout.keep_mask
    (so a case with dropout names its seed)."""
    masks = [None, None]
    if rowscale is not None:
        x = x * rowscale[..., None]
    if dropout_p > 0:
        counters = torch.arange(x.numel(), device=x.device).view(x.shape)
        masks[0] = keep_mask(dropout_seed, counters, dropout_p)
        x = torch.where(masks[0], x / (1 - dropout_p), 0.0)
        if x1 is not None:
            masks[1] = keep_mask(dropout_seed, counters + x.numel(), dropout_p)
            x1 = torch.where(masks[1], x1 / (1 - dropout_p), 0.0)
    h = x + x1 if x1 is not None else x
    h = h + residual if residual is not None else h
    if is_rms:
        normalized = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    else:
        centered = h - h.mean(-1, keepdim=True)
        normalized = centered * torch.rsqrt(centered.pow(2).mean(-1, keepdim=True) + eps)
    outputs = [_affine(normalized, weight, bias, offset)]
    if weight1 is not None:
        outputs.append(_affine(normalized, weight1, bias1, offset))
    if prenorm:
        outputs.append(h)
    if return_dropout_mask:
        outputs += masks
    return outputs[0] if len(outputs) == 1 else tuple(outputs)


def _affine(normalized, weight, bias, offset):
    y = normalized * (offset + weight) if weight is not None else normalized
    return y + bias if bias is not None else y


def _rms_norm_reference(x, weight, bias=None, residual=None, eps=1e-6, prenorm=False, residual_in_fp32=False,
                        offset=0.0, **options):  # fmt: skip
    return _reference(True, x, weight, bias, residual, eps, prenorm, residual_in_fp32, offset, **options)


def _layer_norm_reference(x, weight, bias, residual=None, eps=1e-5, prenorm=False, residual_in_fp32=False, **options):
    return _reference(False, x, weight, bias, residual, eps, prenorm, residual_in_fp32, **options)


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
    frozen = frozenset()
    if case.x1:
        kwargs["x1"] = randn(*x.shape)
    if case.weight1:
        kwargs["weight1"] = (1.0 + 0.1 * randn(n).float()).to(dtype)
        kwargs["bias1"] = 0.1 * randn(n) if case.bias else None
    if case.rowscale:
        kwargs["rowscale"], frozen = randn(*x.shape[:-1]), frozenset({"rowscale"})
    if case.dropout_p:
        seed = torch.randint(2**62, (1,), device=device, generator=generator)
        kwargs.update(dropout_p=case.dropout_p, dropout_seed=int(seed))
    if case.masks:
        kwargs["return_dropout_mask"] = True
    return Inputs((x, weight), {"bias": bias, **kwargs}, frozen)


def _layer_norm_inputs(case, device, dtype, generator):
    inputs = _norm_inputs(case, device, dtype, generator)
    x, weight = inputs.args
    kwargs = dict(inputs.kwargs)
    bias = kwargs.pop("bias")
    kwargs.pop("offset", None)
    return Inputs((x, weight, bias), kwargs, inputs.frozen)


def _norm_bytes(case, dtype, backward=False):
    """Fewest bytes moved. Forward: x (and residual, x1) in, y (and h, y1) out. Backward: x (and residual, x1)
    and dy (and dh, dy1) in, dx out (which is also dresidual, and dx1 without dropout). The weights and biases are
    counted once; dropout's masks are recomputed, not moved."""
    elements = math.prod(_lead(case)) * case.n
    inputs = 1 + case.residual + case.x1
    outputs = 1 + case.prenorm + case.weight1  # forward; the backward reads their gradients
    tensors = inputs + outputs + 1 if backward else inputs + outputs
    return tensors * elements * dtype.itemsize + 2 * (1 + case.weight1) * case.n * dtype.itemsize


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

# flash-attention's options (whole rows only): dropout of x and x1 with the masks returned and the parallel output;
# rowscale with dropout; x1 alone (its gradient is dx's); the parallel output with rowscale; row groups' partial sums.
_OPTION_TESTS = (
    {"rows": 5, "n": 40, "residual": True, "x1": True, "weight1": True, "dropout_p": 0.27, "prenorm": True,
     "masks": True},
    {"rows": 6, "n": 33, "residual": True, "rowscale": True, "dropout_p": 0.1},
    {"rows": 4, "n": 24, "residual": True, "x1": True, "prenorm": True, "residual_in_fp32": True},
    {"rows": 7, "n": 50, "weight1": True, "rowscale": True, "layout": "sliced"},
    {"rows": 40, "n": 1000, "residual": True, "x1": True, "dropout_p": 0.27},
)  # fmt: skip
_OPTION_GPU = (
    {"rows": 4096, "n": 4096, "residual": True, "x1": True, "weight1": True, "dropout_p": 0.1, "prenorm": True},
    {"rows": 1000, "n": 5120, "residual": True, "rowscale": True, "dropout_p": 0.27, "residual_in_fp32": True,
     "prenorm": True},
    {"rows": 333, "n": 16384, "residual": True, "x1": True, "weight1": True, "masks": True, "dropout_p": 0.5},
)  # fmt: skip
_RMS_TESTS = (*_NORM_TESTS, {"rows": 5, "n": 64, "offset": 1.0}, *_OPTION_TESTS,
              {"rows": 5, "n": 64, "offset": 1.0, "weight1": True, "dropout_p": 0.1})  # fmt: skip


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
        (*_NORM_TESTS, *_OPTION_TESTS),
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
                    "statistics; deterministic fp32 dweight/dbias. flash-attention's layer_norm_fn options: "
                    "dropout of x (seeded, recomputed in the backward), rowscale, a second input x1 and a second "
                    "output from weight1/bias1.",
        usage=f"y, h = tk.ops.{_name}(x, weight{', bias' if _name == 'layer_norm' else ''}, residual=h, "
              "prenorm=True)",
        tags=("norm", "fused", "memory-bound", "backward"),
        limits="Normalises the last dimension; any leading shape; hidden sizes from 1 up (wide rows split); with "
               "dropout_p, rowscale, x1 or weight1 up to 16384.",
        fn=_fn,
        reference=_reference_fn,
        make_inputs=_inputs,
        test_cases=_tests,
        gpu_cases=(*_NORM_GPU, *_OPTION_GPU),
        bench_cases=_bench,
        bytes_moved=_norm_bytes,
        bytes_moved_bwd=functools.partial(_norm_bytes, backward=True),
        flops=lambda case, dtype: 5 * math.prod(_lead(case)) * case.n,
        dtypes=FLOAT_DTYPES,
        has_backward=True,
        tolerance=_norm_tolerance,
        peers={"liger": _liger},
    ))  # fmt: skip
