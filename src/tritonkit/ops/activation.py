"""GELU (exact and tanh) and SiLU, forward and backward, through the shared elementwise launcher.

One kernel pair covers the three activations (an ``ACT`` switch). The backward recomputes the
activation's derivative from x, so it reads x and dy and writes dx: three passes over the data.

No ``from __future__ import annotations`` here: torch.library reads the launchers' type hints at runtime.
"""

import functools

import torch
import triton
import triton.language as tl

from tritonkit._core.checks import FLOAT_DTYPES, check_choice, check_device, check_tensor
from tritonkit._core.elementwise import launch_elementwise
from tritonkit.registry import Inputs, KernelSpec, register

__all__ = ["gelu", "silu"]

GELU_ERF, GELU_TANH, SILU = 0, 1, 2
_SQRT_2_OVER_PI = 0.7978845608028654  # sqrt(2 / pi)
_INV_SQRT_2 = 0.7071067811865476
_INV_SQRT_2PI = 0.3989422804014327  # 1 / sqrt(2 * pi)
_TANH_CUBIC = 0.044715


@triton.jit
def _tanh(u):
    """tanh(u) = 1 - 2 / (exp(2u) + 1): exact limits at +-inf, no libdevice needed (the interpreter has none)."""
    return 1.0 - 2.0 / (tl.exp(2.0 * u) + 1.0)


@triton.jit
def _activation_fwd_kernel(p_x, p_y, n_elements, ACT: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """GELU: y = x/2 (1 + erf(x / sqrt 2));  GELU tanh: y = x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)));
    SiLU: y = x sigmoid(x). Computed in fp32."""
    o_x = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    m_x = o_x < n_elements
    b_x = tl.load(p_x + o_x, mask=m_x).to(tl.float32)
    if ACT == 0:
        b_y = 0.5 * b_x * (1.0 + tl.erf(b_x * 0.7071067811865476))
    elif ACT == 1:
        b_y = 0.5 * b_x * (1.0 + _tanh(0.7978845608028654 * (b_x + 0.044715 * b_x * b_x * b_x)))
    else:
        b_y = b_x * tl.sigmoid(b_x)
    tl.store(p_y + o_x, b_y.to(p_y.dtype.element_ty), mask=m_x)


@triton.jit
def _activation_bwd_kernel(p_dy, p_x, p_dx, n_elements, ACT: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """dx = dy * f'(x) with
    GELU:      f' = (1 + erf(x / sqrt 2)) / 2 + x exp(-x^2 / 2) / sqrt(2 pi)
    GELU tanh: f' = (1 + t) / 2 + x/2 (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2), t the tanh above
    SiLU:      f' = s (1 + x (1 - s)), s = sigmoid(x)."""
    o_x = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    m_x = o_x < n_elements
    b_dy = tl.load(p_dy + o_x, mask=m_x).to(tl.float32)
    b_x = tl.load(p_x + o_x, mask=m_x).to(tl.float32)
    if ACT == 0:
        b_grad = 0.5 * (1.0 + tl.erf(b_x * 0.7071067811865476)) + b_x * tl.exp(-0.5 * b_x * b_x) * 0.3989422804014327
    elif ACT == 1:
        b_t = _tanh(0.7978845608028654 * (b_x + 0.044715 * b_x * b_x * b_x))
        b_grad = 0.5 * (1.0 + b_t) + 0.5 * b_x * (1.0 - b_t * b_t) * 0.7978845608028654 * (
            1.0 + 3.0 * 0.044715 * b_x * b_x
        )
    else:
        b_s = tl.sigmoid(b_x)
        b_grad = b_s * (1.0 + b_x * (1.0 - b_s))
    tl.store(p_dx + o_x, (b_dy * b_grad).to(p_dx.dtype.element_ty), mask=m_x)


def activation_fwd_launch(x: torch.Tensor, act: int) -> torch.Tensor:
    return launch_elementwise(_activation_fwd_kernel, [x], x.dtype, ACT=act)


def activation_bwd_launch(dy: torch.Tensor, x: torch.Tensor, act: int) -> torch.Tensor:
    return launch_elementwise(_activation_bwd_kernel, [dy, x], x.dtype, ACT=act)


class _ActivationFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, act):
        ctx.save_for_backward(x)
        ctx.act = act
        return activation_fwd_launch(x, act)

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        return activation_bwd_launch(dy, x, ctx.act), None


@torch.library.custom_op("tritonkit::activation_fwd", mutates_args=())
def activation_fwd(x: torch.Tensor, act: int) -> torch.Tensor:
    return activation_fwd_launch(x, act)


@activation_fwd.register_fake
def _(x, act):
    return torch.empty_like(x, memory_format=torch.preserve_format)


@torch.library.custom_op("tritonkit::activation_bwd", mutates_args=())
def activation_bwd(dy: torch.Tensor, x: torch.Tensor, act: int) -> torch.Tensor:
    return activation_bwd_launch(dy, x, act)


@activation_bwd.register_fake
def _(dy, x, act):
    return torch.empty_like(x, memory_format=torch.preserve_format)


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])
    ctx.act = inputs[1]


def _custom_op_backward(ctx, dy):
    (x,) = ctx.saved_tensors
    return activation_bwd(dy, x, ctx.act), None


activation_fwd.register_autograd(_custom_op_backward, setup_context=_setup_context)


def _activate(x: torch.Tensor, act: int) -> torch.Tensor:
    check_tensor("x", x, dtypes=FLOAT_DTYPES)
    check_device(x=x)
    if torch.compiler.is_compiling():
        return activation_fwd(x, act)
    if torch.is_grad_enabled() and x.requires_grad:
        return _ActivationFunction.apply(x, act)
    return activation_fwd_launch(x, act)


def gelu(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """``torch.nn.functional.gelu(x, approximate=...)``, approximate "none" (erf) or "tanh".

    Any shape and strides, fp32/fp16/bf16, differentiable. Example: ``h = tk.ops.gelu(x, approximate="tanh")``.
    """
    check_choice("approximate", approximate, ("none", "tanh"))
    return _activate(x, GELU_ERF if approximate == "none" else GELU_TANH)


def silu(x: torch.Tensor) -> torch.Tensor:
    """``torch.nn.functional.silu(x)`` = x * sigmoid(x). Any shape and strides, differentiable."""
    return _activate(x, SILU)


# --------------------------------------------------------------------------------------------------
# References and registry specs
# --------------------------------------------------------------------------------------------------
def _gelu_reference(x, approximate="none"):
    return torch.nn.functional.gelu(x, approximate=approximate)


def _silu_reference(x):
    return torch.nn.functional.silu(x)


def _activation_inputs(case, device, dtype, generator):
    shape = case["shape"]
    x = 3 * torch.randn(shape, device=device, generator=generator)
    if case.get("extreme"):
        x.view(-1)[:4] = torch.tensor([1e4, -1e4, 60.0, -60.0])  # saturated tails
    x = x.to(dtype)
    if case.get("layout") == "transposed":
        x = x.t()  # a dense permuted layout: read in place, output keeps it
    elif case.get("layout") == "sliced":
        x = x[..., ::2]  # gaps: made contiguous first
    kwargs = {"approximate": case["approximate"]} if "approximate" in case else {}
    return Inputs((x,), kwargs)


def _elements(case):
    """Elements the op touches: the shape's, halved for the every-other-column slice."""
    elements = 1
    for size in case["shape"]:
        elements *= size
    return elements // 2 if case.get("layout") == "sliced" else elements


def _activation_bytes(case, dtype, backward=False):
    return (3 if backward else 2) * _elements(case) * dtype.itemsize


_SHAPES = ({"shape": (0,)}, {"shape": (1,)}, {"shape": (7, 13)}, {"shape": (2, 3, 1000)},
           {"shape": (40, 30), "layout": "transposed"}, {"shape": (5, 64), "layout": "sliced"},
           {"shape": (4, 32), "extreme": True})  # fmt: skip
_GPU = ({"shape": (4096, 4096)}, {"shape": ((1 << 24) + 3,)}, {"shape": (3000, 2000), "layout": "transposed"})
_BENCH = tuple({"shape": (16384, n)} for n in (1024, 4096, 16384))

for _name, _fn, _ref, _modes in (
    ("gelu", gelu, _gelu_reference, ("none", "tanh")),
    ("silu", silu, _silu_reference, (None,)),
):

    def _cases(cases, modes=_modes):
        return tuple({**case, **({"approximate": m} if m else {})} for case in cases for m in modes)

    register(KernelSpec(
        name=_name,
        family="activation",
        summary="GELU (erf or tanh), forward and backward." if _name == "gelu" else "SiLU, forward and backward.",
        description="One pass in fp32 through the shared elementwise launcher; the backward recomputes f'(x).",
        usage="h = tk.ops.gelu(x, approximate='tanh')" if _name == "gelu" else "h = tk.ops.silu(x)",
        tags=("activation", "elementwise", "memory-bound", "backward"),
        limits="Any shape and strides; dense layouts (transposes) are read in place, others copied once.",
        fn=_fn,
        reference=_ref,
        make_inputs=_activation_inputs,
        test_cases=_cases(_SHAPES),
        gpu_cases=_cases(_GPU),
        bench_cases=_cases(_BENCH),
        bytes_moved=_activation_bytes,
        bytes_moved_bwd=functools.partial(_activation_bytes, backward=True),
        flops=lambda case, dtype: 8 * _elements(case),
        dtypes=FLOAT_DTYPES,
        has_backward=True,
        status="experimental",
    ))  # fmt: skip
