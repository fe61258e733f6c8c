"""scaled_linear beyond the registry sweep: every scale combination through small tiles, exact int8 sums, the path
from quantize to scaled_linear, torch.compile, the checker's power to catch a wrong GEMM, bad input; on a GPU a
CUDA-graph capture."""

import pytest
import torch

import tritonkit as tk
from helpers import assert_graph_replay_matches_eager
from tritonkit import catalog, testing
from tritonkit.ops.gemm import launch
from tritonkit.ops.gemm.plan import GemmTiles
from tritonkit.registry import KernelSpec

SPEC = catalog.get("scaled_linear")
SMALL = GemmTiles(16, 16, 16, 4, 1, 2)  # many tiles and K steps (32 for 8-bit codes), grouped order, a ragged edge


def _inputs(case, device="cpu", dtype=torch.float32):
    parsed = SPEC.parse_case(case)
    return SPEC.make_inputs(parsed, torch.device(device), dtype, torch.Generator(device).manual_seed(0))


COMBINATIONS = [
    {"x": "int8", "w": "int8", "x_scale": "tensor", "w_scale": "row"},
    {"x": "int8", "w": "int8", "x_scale": "row", "w_scale": "tensor", "bias": True},
    {"x": "int8", "w": "int8", "x_scale": "group", "w_scale": "block", "block": 32},
    {"x": "e4m3", "w": "e4m3", "x_scale": "row", "w_scale": "group", "block": 32},
    {"x": "e4m3", "w": "e5m2", "x_scale": "group", "w_scale": "row", "block": 64},
    {"x": "e5m2", "w": "e5m2", "x_scale": "tensor", "w_scale": "block", "block": 32},
    {"w": "int8", "w_scale": "group", "block": 16},
    {"w": "e4m3", "w_scale": "tensor", "bias": True},
]


@pytest.mark.parametrize("combination", COMBINATIONS, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_every_scale_combination_with_small_tiles(combination):
    inputs = _inputs({"m": 37, "n": 45, "k": 100, **combination})
    x, w, x_scale, w_scale = inputs.args
    bias = inputs.kwargs["bias"]
    out = launch.scaled_linear_fwd(x, w, x_scale, w_scale, bias, torch.float32, plan=SMALL)
    expected = SPEC.reference(*(t.double() if t is not None and t.is_floating_point() else t for t in inputs.args),
                              bias=None if bias is None else bias.double())  # fmt: skip
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)


def test_int8_sums_are_exact(device):
    """Unit scales and integer codes: every output is an integer below 2^24, computed exactly."""
    x = torch.randint(-127, 128, (50, 300), dtype=torch.int8, device=device)
    w = torch.randint(-127, 128, (60, 300), dtype=torch.int8, device=device)
    one = torch.ones((), device=device)
    out = tk.ops.scaled_linear(x, w, one, one, out_dtype=torch.float32)
    assert torch.equal(out, (x.double() @ w.double().T).float())


def test_from_quantize_to_scaled_linear(device):
    """Activations quantized per 1 x 128 group and weights per 128 x 128 block in float8: the product is within the
    quantization's error of the bf16 one."""
    torch.manual_seed(0)
    x, w = torch.randn(64, 512, device=device), torch.randn(96, 512, device=device) / 20
    xq, x_scale = tk.ops.quantize(x, torch.float8_e4m3fn, granularity="group")
    wq, w_scale = tk.ops.quantize(w, torch.float8_e4m3fn, granularity="block")
    out = tk.ops.scaled_linear(xq, wq, x_scale, w_scale, out_dtype=torch.float32)
    exact = x @ w.T
    assert (out - exact).pow(2).mean().sqrt() < 0.05 * exact.pow(2).mean().sqrt()  # e4m3: 2^-4 per operand at worst
    dequantized = (
        tk.ops.dequantize(xq, x_scale, dtype=torch.float32) @ tk.ops.dequantize(wq, w_scale, dtype=torch.float32).T
    )
    torch.testing.assert_close(out, dequantized, rtol=1e-4, atol=1e-4)


def test_compiles_fullgraph(device):
    inputs = _inputs({"m": 20, "n": 30, "k": 64, "x": "e4m3", "w": "e4m3", "x_scale": "group", "w_scale": "block",
                      "block": 32, "bias": True}, device)  # fmt: skip

    def block(x, w, x_scale, w_scale, bias):
        return tk.ops.scaled_linear(x, w, x_scale * 2, w_scale, bias=bias, out_dtype=torch.float32) + 1

    args = (*inputs.args, inputs.kwargs["bias"])
    eager = block(*args)
    torch._dynamo.reset()
    backend = "inductor" if device == "cuda" else "aot_eager"
    torch.testing.assert_close(torch.compile(block, fullgraph=True, backend=backend)(*args), eager, rtol=0, atol=0)


# ---------------------------------------------------------------- the checker catches a wrong GEMM


def _broken(fn) -> KernelSpec:
    return KernelSpec(**{**SPEC.__dict__, "fn": fn, "name": f"broken-{SPEC.name}"})


def _first_group_scale_everywhere(x, w, x_scale, w_scale, **kw):
    return tk.ops.scaled_linear(x, w, x_scale[..., :1].contiguous(), w_scale, **kw)


@pytest.mark.parametrize(
    ("label", "fn", "case"),
    [
        ("bias dropped", lambda *a, bias=None, **kw: tk.ops.scaled_linear(*a, **kw),
         {"m": 9, "n": 20, "k": 64, "x": "int8", "w": "int8", "bias": True}),
        ("x's group scales read as row scales", _first_group_scale_everywhere,
         {"m": 9, "n": 20, "k": 256, "x": "e4m3", "w": "e4m3", "x_scale": "group", "block": 64}),
        ("the last K value dropped", lambda x, w, *a, **kw: tk.ops.scaled_linear(
            torch.cat((x[..., :-1], torch.zeros_like(x[..., -1:])), -1), w, *a, **kw),
         {"m": 9, "n": 20, "k": 64, "x": "int8", "w": "int8"}),
    ],
)  # fmt: skip
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_checker_catches_wrong_gemms(label, fn, case, dtype):
    result = testing.run_case(_broken(fn), case, dtype, "cpu")
    assert not result.ok, f"{label} passed the check"


# ---------------------------------------------------------------- bad input


def _good():
    inputs = _inputs({"m": 8, "n": 16, "k": 64, "x": "e4m3", "w": "e4m3", "x_scale": "group", "w_scale": "block",
                      "block": 32})  # fmt: skip
    return dict(zip(("x_q", "w_q", "x_scale", "w_scale"), inputs.args, strict=True))


BAD = [
    ({"w_q": lambda a: a["w_q"].bfloat16()}, TypeError, "w_q must have dtype"),
    ({"x_q": lambda a: a["x_q"].view(torch.int8)}, TypeError, "x_q and w_q must both be int8 or both float8"),
    ({"w_q": lambda a: a["w_q"][:, :32]}, ValueError, r"x_q's last dim and w_q's dim 1 \(K\) must match"),
    ({"x_scale": lambda a: a["x_scale"][:, :1].expand(8, 3).contiguous()}, ValueError,
     r"x_scale of shape \(8, 3\) is no tensor/row/group scale"),
    ({"x_scale": lambda a: torch.ones(1, 2)}, ValueError, "x_scale of shape"),
    ({"w_scale": lambda a: torch.ones(3, 3)}, ValueError, r"w_scale of shape \(3, 3\) is no"),
    ({"w_scale": lambda a: torch.ones(1, 1, dtype=torch.float64)}, TypeError, "w_scale must have dtype"),
    ({"x_scale": lambda a: None}, ValueError, "so x_scale is needed"),
    ({"w_scale": lambda a: torch.ones(1, 4)}, ValueError, r"groups \(32\) and w_scale's \(16\)"),
    ({"x_scale": lambda a: torch.ones(8, 4), "w_scale": lambda a: torch.ones(1, 4)}, ValueError,
     "groups and blocks of 16 K values are too short for 8-bit codes"),
    ({"x_scale": lambda a: a["x_scale"].masked_fill(a["x_scale"] > 0, float("inf"))}, ValueError,
     "x_scale holds a non-finite value"),
]  # fmt: skip


@pytest.mark.parametrize(("changes", "error", "match"), BAD)
def test_bad_input_names_the_argument(changes, error, match):
    arguments = _good()
    arguments.update({key: change(arguments) for key, change in changes.items()})
    with pytest.raises(error, match=match):
        tk.ops.scaled_linear(arguments.pop("x_q"), arguments.pop("w_q"), arguments.pop("x_scale"),
                             arguments.pop("w_scale"), **arguments)  # fmt: skip


def test_bad_options_name_the_argument():
    arguments = _good()
    args = (arguments["x_q"], arguments["w_q"], arguments["x_scale"], arguments["w_scale"])
    with pytest.raises(ValueError, match="bias must have w_q's 16 output features, got 3"):
        tk.ops.scaled_linear(*args, bias=torch.ones(3))
    with pytest.raises(TypeError, match="out_dtype must be one of"):
        tk.ops.scaled_linear(*args, out_dtype=torch.int8)
    with pytest.raises(ValueError, match="weight-only"):
        tk.ops.scaled_linear(torch.randn(8, 64), args[1], args[2], args[3])


# ---------------------------------------------------------------- GPU


@pytest.mark.gpu
def test_captures_in_a_cuda_graph():
    inputs = _inputs({"m": 512, "n": 1024, "k": 1024, "x": "e4m3", "w": "e4m3", "x_scale": "group",
                      "w_scale": "block"}, "cuda", torch.bfloat16)  # fmt: skip
    x, w, x_scale, w_scale = inputs.args

    def step(x_scale, activations):
        return [tk.ops.scaled_linear(x, w, x_scale, w_scale), tk.ops.scaled_linear(activations, w, None, w_scale)]

    assert_graph_replay_matches_eager(step, [x_scale, torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16)])


# ---------------------------------------------------------------- QuantizedLinear


@pytest.mark.parametrize(
    ("dtype", "granularity", "activations"),
    [(torch.int8, "row", "dynamic"), (torch.float8_e4m3fn, "block", "dynamic"), (torch.float8_e4m3fn, "tensor",
                                                                                 "dynamic"),
     (torch.int8, "row", "weight_only"), (torch.float8_e4m3fn, "block", "weight_only")],
)  # fmt: skip
def test_quantized_linear_follows_its_linear(device, dtype, granularity, activations):
    """The layer's output is the scaled GEMM of its quantized operands exactly, and close to the bf16 layer."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(256, 96, device=device)
    layer = tk.nn.QuantizedLinear.from_linear(linear, dtype, granularity=granularity, activations=activations)
    x = torch.randn(3, 7, 256, device=device)
    with torch.no_grad():
        out, exact = layer(x), linear(x)
    assert out.shape == (3, 7, 96) and out.dtype == x.dtype
    assert (out - exact).pow(2).mean().sqrt() < 0.05 * exact.pow(2).mean().sqrt()
    assert set(layer.state_dict()) == {"weight_codes", "weight_scale", "bias"}


def test_quantized_linear_refuses_training_and_bad_options():
    linear = torch.nn.Linear(64, 32)
    with pytest.raises(ValueError, match="granularity must be one of"):
        tk.nn.QuantizedLinear.from_linear(linear, torch.int8, granularity="group")
    with pytest.raises(ValueError, match="activations must be one of"):
        tk.nn.QuantizedLinear.from_linear(linear, torch.int8, activations="static")
    layer = tk.nn.QuantizedLinear.from_linear(linear, torch.int8)
    with pytest.raises(ValueError, match="QuantizedLinear is for inference"):
        layer(torch.randn(2, 64, requires_grad=True))
