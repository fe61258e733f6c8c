"""GELU (exact and tanh), SiLU and the gated SwiGLU / GeGLU, forward and backward, through the shared
elementwise launcher.

The activation and its derivative are shared jit helpers (an ``ACT`` switch); one kernel pair serves the
plain activations and one the gated ones. The backward recomputes the
activation's derivative from x, so it reads x and dy and writes dx: three passes over the data.

No ``from __future__ import annotations`` here: torch.library reads the launchers' type hints at runtime.
"""

import functools

import torch
import triton
import triton.language as tl

from tritonkit._core.checks import FLOAT_DTYPES, check_choice, check_device, check_tensor
from tritonkit._core.dispatch import cheapest_path
from tritonkit._core.elementwise import launch_elementwise
from tritonkit._core.env import interpreting
from tritonkit._core.fastmath import LOG2_E
from tritonkit.registry import Inputs, KernelSpec, register

__all__ = ["geglu", "gelu", "silu", "swiglu"]

GELU_ERF, GELU_TANH, SILU = 0, 1, 2


# PTX's approximate exp2 and reciprocal with denormals flushed, one MUFU instruction each. Triton's tl.exp
# and division add range fix-ups around them, and these elementwise kernels are issue-bound with them:
# the erf GELU forward compiled to 37 instructions per element, 25 with these (benchmarks/NOTES.md). The
# interpreter runs no PTX, so there the same math goes through tl.exp2 and a division.
_PTX_MATH = tl.constexpr(not interpreting() and torch.version.hip is None)


@triton.jit
def _approx(x, OP: tl.constexpr):
    """In fp32, 2^x for OP "ex2" (results below 2^-126 flush to 0) or 1 / x for OP "rcp" (within an ulp or
    two; 1 / inf = 0)."""
    if _PTX_MATH:
        y = tl.inline_asm_elementwise(OP + ".approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32, is_pure=True,
                                      pack=1)  # fmt: skip
    elif OP == "ex2":
        y = tl.exp2(x)
    else:
        y = 1.0 / x
    return y


@triton.jit
def _sigmoid(v):
    """1 / (1 + exp(-v)); exp(-v) overflows to inf for v < -88, which gives 0."""
    return _approx(1.0 + _approx(v * -LOG2_E, "ex2"), "rcp")


@triton.jit
def _normal_cdf(x):
    """Phi(x) = erfc(-x / sqrt 2) / 2 from a Chebyshev fit of erfc on z = |x| / sqrt 2 >= 0 (Numerical
    Recipes' erfcc, relative error below 1.2e-7): erfc(z) = t exp(P(t) - z^2), t = 1 / (1 + z/2), with P of
    degree 9 in Horner form below (its coefficients times log2 e, for exp2; the constant term also takes
    the halving, as 2^-1); Phi = erfc(z) / 2 for x < 0 and 1 - erfc(z) / 2 for x >= 0.

    One exp2 and one reciprocal, where libdevice's erf held the bf16 GELU forward to 67% of bandwidth
    (benchmarks/NOTES.md). Checked in fp32 over [-12, 12] against float64: GELU within 4e-7 (torch's fp32
    GELU: 1.2e-6), and within 2e-5 relative in the negative tail, where 1 + erf(x / sqrt 2) cancels."""
    t = _approx(1.0 + 0.35355339059327373 * tl.abs(x), "rcp")
    p = t * (0.17087277 * LOG2_E) - 0.82215223 * LOG2_E
    p = p * t + 1.48851587 * LOG2_E
    p = p * t - 1.13520398 * LOG2_E
    p = p * t + 0.27886807 * LOG2_E
    p = p * t - 0.18628806 * LOG2_E
    p = p * t + 0.09678418 * LOG2_E
    p = p * t + 0.37409196 * LOG2_E
    p = p * t + 1.00002368 * LOG2_E
    p = p * t - (1.26551223 * LOG2_E + 1.0)
    half_erfc = t * _approx(p - x * x * (0.5 * LOG2_E), "ex2")
    return tl.where(x >= 0, 1.0 - half_erfc, half_erfc)


@triton.jit
def _act(x, ACT: tl.constexpr):
    """GELU: f = x/2 (1 + erf(x / sqrt 2)) = x Phi(x);  GELU tanh: f = x/2 (1 + tanh(u)) = x sigmoid(2u)
    with u = sqrt(2/pi) (x + 0.044715 x^3);  SiLU: f = x sigmoid(x). x in fp32."""
    if ACT == 0:
        f = x * _normal_cdf(x)
    elif ACT == 1:
        f = x * _sigmoid(1.5957691216057308 * (x + 0.044715 * x * x * x))  # 2u
    else:
        f = x * _sigmoid(x)
    return f


@triton.jit
def _act_grad(x, ACT: tl.constexpr):
    """f'(x) for the activations of :func:`_act`:
    GELU:      f' = Phi(x) + x exp(-x^2 / 2) / sqrt(2 pi), Phi(x) = (1 + erf(x / sqrt 2)) / 2
    GELU tanh: f' = sigmoid(2u) + x/2 sech^2(u) sqrt(2/pi) (1 + 3 * 0.044715 x^2), with e = exp(-2|u|),
               r = 1 / (1 + e): sech^2(u) = 4 e r^2 and sigmoid(2u) = r for u >= 0, e r for u < 0. Written
               from tanh(u) instead, 1 - t^2 and 1 + t cancel to 0 in fp32 once |u| > ~8 (x < -4.5),
               where f' is still ~1e-6.
    SiLU:      f' = s (1 + x (1 - s)), s = sigmoid(x)."""
    if ACT == 0:
        g = _normal_cdf(x) + x * _approx(x * x * (-0.5 * LOG2_E), "ex2") * 0.3989422804014327
    elif ACT == 1:
        u = 0.7978845608028654 * (x + 0.044715 * x * x * x)
        e = _approx(tl.abs(u) * (-2.0 * LOG2_E), "ex2")
        r = _approx(1.0 + e, "rcp")
        sigmoid_2u = tl.where(u >= 0, r, e * r)
        g = sigmoid_2u + 0.5 * x * (4.0 * e * r * r) * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * x * x)
    else:
        s = _sigmoid(x)
        g = s * (1.0 + x * (1.0 - s))
    return g


@triton.jit
def _activation_fwd_kernel(p_x, p_y, n_elements, ACT: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """y = f(x), computed in fp32."""
    o_x = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    m_x = o_x < n_elements
    b_x = tl.load(p_x + o_x, mask=m_x).to(tl.float32)
    tl.store(p_y + o_x, _act(b_x, ACT).to(p_y.dtype.element_ty), mask=m_x)


@triton.jit
def _activation_bwd_kernel(p_dy, p_x, p_dx, n_elements, ACT: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """dx = dy * f'(x)."""
    o_x = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    m_x = o_x < n_elements
    b_dy = tl.load(p_dy + o_x, mask=m_x).to(tl.float32)
    b_x = tl.load(p_x + o_x, mask=m_x).to(tl.float32)
    tl.store(p_dx + o_x, (b_dy * _act_grad(b_x, ACT)).to(p_dx.dtype.element_ty), mask=m_x)


@triton.jit
def _gated_fwd_kernel(p_gate, p_up, p_y, n_elements, ACT: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """y = f(gate) * up (SwiGLU with SiLU, GeGLU with GELU)."""
    o_x = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    m_x = o_x < n_elements
    b_gate = tl.load(p_gate + o_x, mask=m_x).to(tl.float32)
    b_up = tl.load(p_up + o_x, mask=m_x).to(tl.float32)
    tl.store(p_y + o_x, (_act(b_gate, ACT) * b_up).to(p_y.dtype.element_ty), mask=m_x)


@triton.jit
def _gated_bwd_kernel(p_dy, p_gate, p_up, p_dgate, p_dup, n_elements, ACT: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """dgate = dy * up * f'(gate);  dup = dy * f(gate)."""
    o_x = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    m_x = o_x < n_elements
    b_dy = tl.load(p_dy + o_x, mask=m_x).to(tl.float32)
    b_gate = tl.load(p_gate + o_x, mask=m_x).to(tl.float32)
    b_up = tl.load(p_up + o_x, mask=m_x).to(tl.float32)
    tl.store(p_dgate + o_x, (b_dy * b_up * _act_grad(b_gate, ACT)).to(p_dgate.dtype.element_ty), mask=m_x)
    tl.store(p_dup + o_x, (b_dy * _act(b_gate, ACT)).to(p_dup.dtype.element_ty), mask=m_x)


def activation_fwd_launch(x: torch.Tensor, act: int) -> torch.Tensor:
    return launch_elementwise(_activation_fwd_kernel, [x], x.dtype, ACT=act)


def activation_bwd_launch(dy: torch.Tensor, x: torch.Tensor, act: int) -> torch.Tensor:
    return launch_elementwise(_activation_bwd_kernel, [dy, x], x.dtype, ACT=act)


def gated_fwd_launch(gate: torch.Tensor, up: torch.Tensor, act: int) -> torch.Tensor:
    return launch_elementwise(_gated_fwd_kernel, [gate, up], gate.dtype, ACT=act)


def gated_bwd_launch(dy: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, act: int):
    return launch_elementwise(_gated_bwd_kernel, [dy, gate, up], gate.dtype, n_outputs=2, ACT=act)


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


class _GatedFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate, up, act):
        ctx.save_for_backward(gate, up)
        ctx.act = act
        return gated_fwd_launch(gate, up, act)

    @staticmethod
    def backward(ctx, dy):
        gate, up = ctx.saved_tensors
        dgate, dup = gated_bwd_launch(dy, gate, up, ctx.act)
        return dgate, dup, None


@torch.library.custom_op("tritonkit::gated_fwd", mutates_args=())
def gated_fwd(gate: torch.Tensor, up: torch.Tensor, act: int) -> torch.Tensor:
    return gated_fwd_launch(gate, up, act)


@gated_fwd.register_fake
def _(gate, up, act):
    return torch.empty_like(gate, memory_format=torch.preserve_format)


@torch.library.custom_op("tritonkit::gated_bwd", mutates_args=())
def gated_bwd(dy: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, act: int) -> tuple[torch.Tensor, torch.Tensor]:
    return gated_bwd_launch(dy, gate, up, act)


@gated_bwd.register_fake
def _(dy, gate, up, act):
    like = torch.empty_like(gate, memory_format=torch.preserve_format)
    return like, torch.empty_like(like)


def _gated_setup_context(ctx, inputs, output):
    ctx.save_for_backward(inputs[0], inputs[1])
    ctx.act = inputs[2]


def _gated_custom_op_backward(ctx, dy):
    gate, up = ctx.saved_tensors
    dgate, dup = gated_bwd(dy, gate, up, ctx.act)
    return dgate, dup, None


gated_fwd.register_autograd(_gated_custom_op_backward, setup_context=_gated_setup_context)


def _activate(x: torch.Tensor, act: int) -> torch.Tensor:
    check_tensor("x", x, dtypes=FLOAT_DTYPES)
    check_device(x=x)
    return cheapest_path(activation_fwd, _ActivationFunction, activation_fwd_launch, (x,))(x, act)


def _gate(name: str, gate: torch.Tensor, up: torch.Tensor, act: int) -> torch.Tensor:
    check_tensor("gate", gate, dtypes=FLOAT_DTYPES)
    check_tensor("up", up, dtypes=FLOAT_DTYPES)
    if gate.shape != up.shape:
        raise ValueError(f"{name}: gate and up must have the same shape, got {tuple(gate.shape)} and {tuple(up.shape)}")
    if gate.dtype != up.dtype:
        raise TypeError(f"{name}: gate and up must have the same dtype, got {gate.dtype} and {up.dtype}")
    check_device(gate=gate, up=up)
    return cheapest_path(gated_fwd, _GatedFunction, gated_fwd_launch, (gate, up))(gate, up, act)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """SwiGLU: ``silu(gate) * up``, one pass. gate and up of one shape and floating dtype, any strides;
    differentiable in both. Example: ``h = tk.ops.swiglu(x @ w_gate.T, x @ w_up.T)``."""
    return _gate("swiglu", gate, up, SILU)


def geglu(gate: torch.Tensor, up: torch.Tensor, approximate: str = "tanh") -> torch.Tensor:
    """GeGLU: ``gelu(gate, approximate) * up``, one pass; approximate "tanh" (default) or "none"."""
    check_choice("approximate", approximate, ("none", "tanh"))
    return _gate("geglu", gate, up, GELU_TANH if approximate == "tanh" else GELU_ERF)


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


def _swiglu_reference(gate, up):
    return torch.nn.functional.silu(gate) * up


def _geglu_reference(gate, up, approximate="tanh"):
    return torch.nn.functional.gelu(gate, approximate=approximate) * up


def _gated_inputs(case, device, dtype, generator):
    first = _activation_inputs(case, device, dtype, generator)
    second = _activation_inputs({**case, "extreme": False}, device, dtype, generator)
    return Inputs((first.args[0], second.args[0]), first.kwargs)


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
