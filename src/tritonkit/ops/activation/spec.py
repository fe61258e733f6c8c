"""gelu, silu, swiglu and geglu in the registry: float64 references, typed cases, cost model."""

import dataclasses
import functools
import math
from dataclasses import dataclass

import torch

from tritonkit._core.checks import FLOAT_DTYPES
from tritonkit.ops.activation.op import geglu, gelu, silu, swiglu
from tritonkit.registry import Case, Inputs, KernelSpec, register


@dataclass(frozen=True)
class ActivationCase(Case):
    shape: tuple[int, ...]
    layout: str = "contiguous"  # "transposed": a dense permuted layout read in place; "sliced": gaps, copied first
    extreme: bool = False  # saturated tails: +-1e4 and +-60 among the inputs
    approximate: str | None = None  # GELU's and GeGLU's approximate= argument


def _gelu_reference(x, approximate="none"):
    return torch.nn.functional.gelu(x, approximate=approximate)


def _silu_reference(x):
    return torch.nn.functional.silu(x)


def _swiglu_reference(gate, up):
    return torch.nn.functional.silu(gate) * up


def _geglu_reference(gate, up, approximate="tanh"):
    return torch.nn.functional.gelu(gate, approximate=approximate) * up


def _gated_inputs(case, device, dtype, generator):
    first = _activation_inputs(case, device, dtype, generator)
    second = _activation_inputs(dataclasses.replace(case, extreme=False), device, dtype, generator)
    return Inputs((first.args[0], second.args[0]), first.kwargs)


def _activation_inputs(case: ActivationCase, device, dtype, generator):
    x = 3 * torch.randn(case.shape, device=device, generator=generator)
    if case.extreme:
        x.view(-1)[:4] = torch.tensor([1e4, -1e4, 60.0, -60.0])  # saturated tails
    x = x.to(dtype)
    if case.layout == "transposed":
        x = x.t()  # a dense permuted layout: read in place, output keeps it
    elif case.layout == "sliced":
        x = x[..., ::2]  # gaps: made contiguous first
    kwargs = {"approximate": case.approximate} if case.approximate is not None else {}
    return Inputs((x,), kwargs)


def _elements(case):
    """Elements the op touches: the shape's, halved for the every-other-column slice."""
    elements = math.prod(case.shape)
    return elements // 2 if case.layout == "sliced" else elements


def _activation_bytes(case, dtype, backward=False):
    return (3 if backward else 2) * _elements(case) * dtype.itemsize


def _gated_bytes(case, dtype, backward=False):
    """Forward: gate and up in, y out. Backward: dy, gate and up in, dgate and dup out."""
    return (5 if backward else 3) * _elements(case) * dtype.itemsize


_SHAPES = ({"shape": (0,)}, {"shape": (1,)}, {"shape": (7, 13)}, {"shape": (2, 3, 1000)},
           {"shape": (40, 30), "layout": "transposed"}, {"shape": (5, 64), "layout": "sliced"},
           {"shape": (4, 32), "extreme": True})  # fmt: skip
_GPU = ({"shape": (4096, 4096)}, {"shape": ((1 << 24) + 3,)}, {"shape": (3000, 2000), "layout": "transposed"})
_BENCH = tuple({"shape": (16384, n)} for n in (1024, 4096, 16384))

_ACTIVATIONS = (
    ("gelu", gelu, _gelu_reference, ("none", "tanh"), "GELU (erf or tanh), forward and backward.",
     "h = tk.ops.gelu(x, approximate='tanh')", _activation_inputs, _activation_bytes),
    ("silu", silu, _silu_reference, (None,), "SiLU, forward and backward.", "h = tk.ops.silu(x)",
     _activation_inputs, _activation_bytes),
    ("swiglu", swiglu, _swiglu_reference, (None,), "SwiGLU, silu(gate) * up, forward and backward.",
     "h = tk.ops.swiglu(gate, up)", _gated_inputs, _gated_bytes),
    ("geglu", geglu, _geglu_reference, ("tanh", "none"), "GeGLU, gelu(gate) * up, forward and backward.",
     "h = tk.ops.geglu(gate, up, approximate='tanh')", _gated_inputs, _gated_bytes),
)  # fmt: skip

for _name, _fn, _ref, _modes, _summary, _usage, _inputs, _bytes in _ACTIVATIONS:

    def _cases(cases, modes=_modes):
        return tuple({**case, **({"approximate": m} if m else {})} for case in cases for m in modes)

    register(KernelSpec(
        name=_name,
        family="activation",
        sweep="shape",
        case_type=ActivationCase,
        summary=_summary,
        description="One pass in fp32 through the shared elementwise launcher; the backward recomputes f'(x).",
        usage=_usage,
        tags=("activation", "elementwise", "memory-bound", "backward") + (("gated",) if _name.endswith("glu") else ()),
        limits="Any shape and strides; dense layouts (transposes) are read in place, others copied once.",
        fn=_fn,
        reference=_ref,
        make_inputs=_inputs,
        test_cases=_cases(_SHAPES),
        gpu_cases=_cases(_GPU),
        bench_cases=_cases(_BENCH),
        bytes_moved=_bytes,
        bytes_moved_bwd=functools.partial(_bytes, backward=True),
        flops=lambda case, dtype: 8 * _elements(case),
        dtypes=FLOAT_DTYPES,
        has_backward=True,
        status="experimental",
    ))  # fmt: skip
