"""Float8Linear: a linear layer trained with its three GEMMs in float8, as torchao's float8 training runs them.

With W the layer's (bf16 or fp32) master weight, each GEMM quantizes its two operands to e4m3 on the fly, along that
GEMM's contraction, and multiplies the codes on the tensor cores (tk.ops.quantize, then tk.ops.scaled_linear, which
applies both scales and the bias in its epilogue):

    y  = x W^T + b        x along K,       W along K
    dx = dy W             dy along N,      W^T along N
    dW = dy^T x           dy^T along M,    x^T along M      (M: the tokens, every leading dimension of x)
    db = sum over the tokens of dy (fp32 sum)

``recipe`` is torchao's: ``"tensorwise"`` (one scale per operand) or ``"rowwise"`` (one scale per row of each
operand along the contraction: per token for x and dy in the first two GEMMs, per output feature for W, per input
feature for x^T and per output feature for dy^T in dW's). Scales are amax / 448 over finite values (tk.ops.quantize).
The backward re-quantizes what it needs from the saved x and W (the memory of a bf16 linear layer), as torchao does.
Quantization takes the amax over finite values and would saturate inf to 448, hiding an overflow; here an operand's
inf gets the NaN code instead (the quant launcher's inf_to_nan), as NaN keeps its own: every output of a GEMM that
reads one is NaN (the rows or columns of y, dx and dW that the bf16 layer's would make non-finite), so the loss and
the gradients show it and a loss scaler skips the step. No pass of its own reads the operands for that.

Each GEMM's result is exact for its codes up to fp32 sums; what float8 costs is the quantization of the operands
(about 2^-4 of each value's magnitude for e4m3), measured against the float64 layer in tests/test_float8_linear.py.
"""

from __future__ import annotations

import math

import torch

from tritonkit import ops
from tritonkit._core.autograd import differentiable_op, needed
from tritonkit.ops.quant.launch import quantize_fwd

RECIPES = {"tensorwise": "tensor", "rowwise": "row"}  # torchao's recipe -> tk.ops.quantize's granularity
CODES = torch.float8_e4m3fn  # torchao's recipes take e4m3 for every operand
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
BLOCK_SIZE_UNUSED = 128  # quantize's block size, which tensor and row scales do not read


def _product(a: torch.Tensor, b: torch.Tensor, granularity: str, out_dtype: torch.dtype,
             bias: torch.Tensor | None) -> torch.Tensor:  # fmt: skip
    """a b^T + bias for 2-D a (R, C) and b (S, C), each quantized to e4m3 along C (inf and NaN to the NaN code), in
    out_dtype."""
    a_codes, a_scale = quantize_fwd(a, CODES, granularity, BLOCK_SIZE_UNUSED, inf_to_nan=True)
    b_codes, b_scale = quantize_fwd(b, CODES, granularity, BLOCK_SIZE_UNUSED, inf_to_nan=True)
    return ops.scaled_linear(a_codes, b_codes, a_scale, b_scale, bias=bias, out_dtype=out_dtype)


def float8_linear_fwd(rows: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                      recipe: str) -> torch.Tensor:  # fmt: skip
    """y (M, N) = rows (M, K) W^T + bias in rows' dtype, both operands quantized along K (module docstring)."""
    bias = bias.detach() if bias is not None else None
    return _product(rows.detach(), weight.detach(), RECIPES[recipe], rows.dtype, bias)


def float8_linear_fwd_fake(rows, weight, bias, recipe):
    return rows.new_empty((rows.shape[0], weight.shape[0]))


def float8_linear_bwd(
    dy: torch.Tensor, rows: torch.Tensor, weight: torch.Tensor, recipe: str, needs_dx: bool, needs_dweight: bool,
    needs_dbias: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """(dx, dW, db), an empty tensor for each gradient not needed (module docstring). db is the fp32 sum (autograd
    casts it to the bias's dtype)."""
    granularity = RECIPES[recipe]
    dy, rows, weight = dy.detach(), rows.detach(), weight.detach()
    empty = dy.new_empty(0)
    dx = _product(dy, weight.t(), granularity, rows.dtype, None) if needs_dx else empty
    dweight = _product(dy.t(), rows.t(), granularity, weight.dtype, None) if needs_dweight else empty
    dbias = dy.sum(0, dtype=torch.float32) if needs_dbias else empty
    return dx, dweight, dbias


def float8_linear_bwd_fake(dy, rows, weight, recipe, needs_dx, needs_dweight, needs_dbias):
    empty = dy.new_empty(0)
    return (rows.new_empty(rows.shape) if needs_dx else empty,
            weight.new_empty(weight.shape) if needs_dweight else empty,
            dy.new_empty(weight.shape[:1], dtype=torch.float32) if needs_dbias else empty)  # fmt: skip


def _save(ctx, inputs, outputs):
    rows, weight, bias, recipe = inputs
    ctx.save_for_backward(rows, weight)
    ctx.recipe, ctx.has_bias = recipe, bias is not None


def _gradients(ctx, grad_outputs, backward):
    """(d rows, dW, db), None where not needed."""
    dy = grad_outputs[0]
    if dy is None:
        return ()
    rows, weight = ctx.saved_tensors
    needs = (ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[2] and ctx.has_bias)
    grads = backward(dy, rows, weight, ctx.recipe, *needs)
    return needed(grads, needs)


float8_linear_op = differentiable_op(
    "float8_linear",
    forward=float8_linear_fwd,
    forward_fake=float8_linear_fwd_fake,
    backward=float8_linear_bwd,
    backward_fake=float8_linear_bwd_fake,
    save=_save,
    gradients=_gradients,
)


def _check(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, recipe: str) -> None:
    if recipe not in RECIPES:
        raise ValueError(f"float8_linear: recipe must be one of {tuple(RECIPES)}, got {recipe!r}")
    for name, t in (("x", x), ("weight", weight), ("bias", bias)):
        if t is not None and (not isinstance(t, torch.Tensor) or t.dtype not in DTYPES):
            found = t.dtype if isinstance(t, torch.Tensor) else type(t).__name__
            raise TypeError(f"float8_linear: {name} must be a bf16, fp16 or fp32 tensor, got {found}")
    if weight.ndim != 2:
        raise ValueError(f"float8_linear: weight must be (out_features, in_features), got shape {tuple(weight.shape)}")
    if x.ndim < 1 or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"float8_linear: x's last dimension must be weight's {weight.shape[1]} in_features, got "
                         f"shape {tuple(x.shape)}")  # fmt: skip
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"float8_linear: bias must have shape ({weight.shape[0]},), got {tuple(bias.shape)}")
    devices = {t.device for t in (x, weight, bias) if t is not None}
    if len(devices) > 1:
        raise ValueError(f"float8_linear: x, weight and bias must be on one device, got {sorted(map(str, devices))}")


def float8_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                  recipe: str = "rowwise") -> torch.Tensor:  # fmt: skip
    """``x W^T + b`` with the forward's and both backward GEMMs on e4m3 codes (the module docstring).

    x: (..., K) in bf16, fp16 or fp32; weight: (N, K), the master weight (any of those dtypes; its gradient comes
    in its dtype); bias: (N,) or None. ``recipe``: ``"rowwise"`` or ``"tensorwise"`` (torchao's). Returns
    (..., N) in x's dtype, or under torch.autocast in the autocast dtype (x is cast to it first, as torchao does).
    An inf or NaN in an operand makes the outputs of each GEMM that reads it NaN (not the finite values saturated
    codes would give), so a loss scaler sees the overflow. Differentiable in x, weight and bias.

    Example: ``y = tk.nn.float8.float8_linear(x, layer.weight, layer.bias, recipe="tensorwise")``.
    """
    _check(x, weight, bias, recipe)
    if torch.is_autocast_enabled(x.device.type):  # as nn.Linear under autocast: the output in the autocast dtype
        x = x.to(torch.get_autocast_dtype(x.device.type))
    rows = x.reshape(math.prod(x.shape[:-1]), x.shape[-1])  # not -1: K may be 0
    return float8_linear_op(rows, weight, bias, recipe).view(*x.shape[:-1], weight.shape[0])


class Float8Linear(torch.nn.Linear):
    """A ``torch.nn.Linear`` whose forward and backward GEMMs run on e4m3 codes (:func:`float8_linear`); the weight
    and bias stay the master parameters the optimizer updates. torchao's ``Float8Linear`` for training.

    Example: ``layer = tk.nn.Float8Linear.from_linear(model.mlp.up_proj, recipe="rowwise")``.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None, *,
                 recipe: str = "rowwise"):  # fmt: skip
        if recipe not in RECIPES:
            raise ValueError(f"Float8Linear: recipe must be one of {tuple(RECIPES)}, got {recipe!r}")
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        self.recipe = recipe

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, *, recipe: str = "rowwise") -> Float8Linear:
        """A Float8Linear sharing ``linear``'s weight and bias parameters (no copy)."""
        if not isinstance(linear, torch.nn.Linear):
            raise TypeError(f"Float8Linear.from_linear: linear must be a torch.nn.Linear, got {type(linear).__name__}")
        with torch.device("meta"):
            layer = cls(linear.in_features, linear.out_features, linear.bias is not None, recipe=recipe)
        layer.weight, layer.bias = linear.weight, linear.bias
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return float8_linear(x, self.weight, self.bias, recipe=self.recipe)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, recipe={self.recipe}"


def convert_to_float8_training(module: torch.nn.Module, *, recipe: str = "rowwise",
                               module_filter_fn=None) -> torch.nn.Module:  # fmt: skip
    """Swap every ``torch.nn.Linear`` inside ``module`` (``module`` itself too) for a :class:`Float8Linear` sharing
    its parameters, in place, as torchao's ``convert_to_float8_training``; ``module_filter_fn(submodule, fqn)``
    returning False keeps a layer (e.g. the LM head). Returns the module (the new layer when ``module`` is a
    Linear)."""
    if recipe not in RECIPES:
        raise ValueError(f"convert_to_float8_training: recipe must be one of {tuple(RECIPES)}, got {recipe!r}")

    def keep(child: torch.nn.Module, fqn: str) -> bool:
        return (not isinstance(child, torch.nn.Linear) or isinstance(child, Float8Linear)
                or (module_filter_fn is not None and not module_filter_fn(child, fqn)))  # fmt: skip

    if not keep(module, ""):
        return Float8Linear.from_linear(module, recipe=recipe)
    for fqn, parent in list(module.named_modules()):
        for name, child in list(parent.named_children()):
            if not keep(child, f"{fqn}.{name}" if fqn else name):
                setattr(parent, name, Float8Linear.from_linear(child, recipe=recipe))
    return module
