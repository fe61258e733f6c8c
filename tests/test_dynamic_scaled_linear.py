"""dynamic_scaled_linear beyond the registry sweep: the same output as quantize then scaled_linear (to the bit, with
the same K step), non-finite activations, every weight granularity through small tiles, torch.compile, QuantizedLinear's
block layers (two launches instead), bad input; on a GPU a CUDA-graph capture."""

import math

import pytest
import torch

import tritonkit as tk
from helpers import assert_graph_replay_matches_eager
from tritonkit.ops.gemm import launch
from tritonkit.ops.gemm.plan import GemmTiles
from tritonkit.ops.gemm.spec import FLOAT8_SUM_ERROR

FORMATS = [(torch.int8, torch.int8), (torch.float8_e4m3fn, torch.float8_e4m3fn),
           (torch.float8_e5m2, torch.float8_e4m3fn)]  # (x's format, w's)  # fmt: skip


def _tiles(group: int) -> GemmTiles:
    """Small tiles (many of them, a ragged edge, grouped order) whose K step is the group."""
    return GemmTiles(16, 16, group, 4, 1, 2)


def _two_kernels(x, wq, w_scale, bias, x_dtype, group):
    """quantize, then scaled_linear with the same tiles and K step."""
    xq, x_scale = tk.ops.quantize(x, x_dtype, granularity="group", block_size=group)
    return launch.scaled_linear_fwd(xq, wq, x_scale, w_scale, bias, torch.float32, False, plan=_tiles(group))


@pytest.mark.parametrize(("x_dtype", "w_dtype"), FORMATS, ids=["int8", "e4m3", "e5m2-e4m3"])
@pytest.mark.parametrize("w_granularity", ["tensor", "row", "group", "block"])
@pytest.mark.parametrize("group", [32, 64])
def test_equals_quantize_then_scaled_linear(x_dtype, w_dtype, w_granularity, group):
    """The codes and scales are quantize's and each step's partial sum is scaled as scaled_linear scales it: the
    same numbers, to the bit (K = 150: a short last group)."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(37, 150, generator=generator) * torch.logspace(-2, 1, 150)
    w = torch.randn(45, 150, generator=generator)
    wq, w_scale = tk.ops.quantize(w, w_dtype, granularity=w_granularity, block_size=group)
    bias = torch.randn(45, generator=generator)
    with torch.no_grad():
        fused = launch.dynamic_scaled_linear_fwd(x, wq, w_scale, bias, torch.float32, group, x_dtype,
                                                 plan=_tiles(group))  # fmt: skip
    assert torch.equal(fused, _two_kernels(x, wq, w_scale, bias, x_dtype, group))


@pytest.mark.parametrize(("x_dtype", "w_dtype"), FORMATS, ids=["int8", "e4m3", "e5m2-e4m3"])
def test_non_finite_activations_follow_quantize(x_dtype, w_dtype):
    """inf saturates to the largest code and NaN becomes 0 (int8) or float8's NaN code, as quantize documents, and a
    group holding an inf keeps the scale of its finite values: the two-kernel path's output, NaN for NaN. (How a
    float8 NaN code then multiplies is the hardware's: the interpreter reads it as a finite value.)"""
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(20, 96, generator=generator)
    x[3, 5], x[7, 40], x[11, 70] = math.inf, -math.inf, math.nan
    wq, w_scale = tk.ops.quantize(torch.randn(24, 96, generator=generator), w_dtype, granularity="row")
    with torch.no_grad():
        fused = launch.dynamic_scaled_linear_fwd(x, wq, w_scale, None, torch.float32, 32, x_dtype, plan=_tiles(32))
    expected = _two_kernels(x, wq, w_scale, None, x_dtype, 32)
    torch.testing.assert_close(fused, expected, rtol=0, atol=0, equal_nan=True)
    assert fused[[3, 7]].isfinite().all() and (x_dtype != torch.int8 or fused[11].isfinite().all())


def test_default_plan_against_float64(device):
    """The public op with its own plan: within the float8 sums' error of the float64 product of the dequantized
    operands, with x's codes and scales from quantize."""
    generator = torch.Generator(device).manual_seed(2)
    x = torch.randn(2, 33, 300, device=device, generator=generator, dtype=torch.bfloat16)
    wq, w_scale = tk.ops.quantize(torch.randn(70, 300, device=device, generator=generator), torch.float8_e4m3fn,
                                  granularity="block")  # fmt: skip
    with torch.no_grad():
        out = tk.ops.dynamic_scaled_linear(x, wq, w_scale, out_dtype=torch.float32)
    xq, x_scale = tk.ops.quantize(x, torch.float8_e4m3fn, granularity="group")
    exact = (tk.ops.dequantize(xq, x_scale, dtype=torch.float32).double()
             @ tk.ops.dequantize(wq, w_scale, dtype=torch.float32).double().T)  # fmt: skip
    assert out.shape == (2, 33, 70) and out.dtype == torch.float32
    # Within the tensor cores' float8 sums (FLOAT8_SUM_ERROR of the rms; under the interpreter fp32's).
    torch.testing.assert_close(out.double(), exact, rtol=0, atol=FLOAT8_SUM_ERROR * exact.pow(2).mean().sqrt().item())
    assert tk.ops.dynamic_scaled_linear(x, wq, w_scale).dtype == torch.bfloat16  # out_dtype defaults to x's


def test_compiles_fullgraph(device):
    generator = torch.Generator(device).manual_seed(3)
    x = torch.randn(20, 128, device=device, generator=generator)
    wq, w_scale = tk.ops.quantize(torch.randn(30, 128, device=device, generator=generator), torch.int8,
                                  granularity="block", block_size=64)  # fmt: skip

    def block(x, w_scale):
        return tk.ops.dynamic_scaled_linear(x * 2, wq, w_scale, group_size=64) + 1

    with torch.no_grad():
        eager = block(x, w_scale)
        torch._dynamo.reset()
        backend = "inductor" if device == "cuda" else "aot_eager"
        compiled = torch.compile(block, fullgraph=True, backend=backend)(x, w_scale)
    torch.testing.assert_close(compiled, eager, rtol=0, atol=0)


def test_quantized_linear_quantizes_its_block_activations_first():
    """QuantizedLinear with block granularity and dynamic activations: quantize's 1 x 128 groups, then scaled_linear
    (two launches, faster than the fused kernel on the GPU), exactly; close to the float layer."""
    torch.manual_seed(4)
    linear = torch.nn.Linear(256, 48)
    layer = tk.nn.QuantizedLinear.from_linear(linear, torch.float8_e4m3fn, granularity="block")
    x = torch.randn(5, 256)
    with torch.no_grad():
        out, exact = layer(x), linear(x)
        x_q, x_scale = tk.ops.quantize(x, torch.float8_e4m3fn, granularity="group", block_size=128)
        two_launches = tk.ops.scaled_linear(x_q, layer.weight_codes, x_scale, layer.weight_scale, bias=layer.bias,
                                            out_dtype=x.dtype)  # fmt: skip
    assert torch.equal(out, two_launches)
    assert (out - exact).pow(2).mean().sqrt() < 0.05 * exact.pow(2).mean().sqrt()


def _args():
    x = torch.randn(8, 64)
    wq, w_scale = tk.ops.quantize(torch.randn(16, 64), torch.float8_e4m3fn, granularity="block", block_size=32)
    return {"x": x, "w_q": wq, "w_scale": w_scale, "group_size": 32}


BAD = [
    ({"x": lambda a: a["x"].to(torch.float8_e4m3fn)}, TypeError, "dynamic_scaled_linear: x must have dtype"),
    ({"group_size": lambda a: 16}, ValueError, "group_size must be one of 32, 64, 128, got 16"),
    ({"group_size": lambda a: 256}, ValueError, "group_size must be one of 32, 64, 128, got 256"),
    ({"group_size": lambda a: 64}, ValueError, "w_scale's blocks span 32 K values, but group_size is 64"),
    ({"x_dtype": lambda a: torch.int8}, TypeError, "x_dtype must be int8 with int8 w_q, or a float8"),
    ({"x": lambda a: a["x"][:, :32]}, ValueError, r"x's last dim and w_q's dim 1 \(K\) must match"),
    ({"w_scale": lambda a: torch.ones(3, 5)}, ValueError, r"w_scale of shape \(3, 5\) is no"),
    ({"w_scale": lambda a: a["w_scale"].clone().fill_(math.inf)}, ValueError, "w_scale holds a non-finite value"),
    ({"bias": lambda a: torch.zeros(15)}, ValueError, "bias must have w_q's 16 output features, got 15"),
]


@pytest.mark.parametrize(("changes", "error", "match"), BAD)
def test_bad_input_names_the_argument(changes, error, match):
    args = _args()
    args.update({name: change(args) for name, change in changes.items()})
    with torch.no_grad(), pytest.raises(error, match=match):
        tk.ops.dynamic_scaled_linear(args.pop("x"), args.pop("w_q"), args.pop("w_scale"), **args)


def test_refuses_training():
    args = _args()
    with pytest.raises(ValueError, match="dynamic_scaled_linear is forward only"):
        tk.ops.dynamic_scaled_linear(args["x"].requires_grad_(), args["w_q"], args["w_scale"], group_size=32)


@pytest.mark.gpu
def test_captures_in_a_cuda_graph():
    generator = torch.Generator("cuda").manual_seed(5)
    x = torch.randn(512, 1024, device="cuda", generator=generator, dtype=torch.bfloat16)
    wq, w_scale = tk.ops.quantize(torch.randn(768, 1024, device="cuda", generator=generator), torch.float8_e4m3fn,
                                  granularity="block")  # fmt: skip

    def step(x):
        return [tk.ops.dynamic_scaled_linear(x, wq, w_scale), tk.ops.dynamic_scaled_linear(x[:3], wq, w_scale)]

    with torch.no_grad():
        assert_graph_replay_matches_eager(step, [x])
