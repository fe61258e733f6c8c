"""tk.nn.Float8Linear / float8_linear: the three GEMMs of a linear layer on e4m3 codes (torchao's float8 training
recipes). Each GEMM against the float64 product of the codes it must have used (so only the kernel's error is
measured), then the whole layer against the float64 layer (the quantization's error), the modules, compile and bad
input."""

import pytest
import torch

import tritonkit as tk
from helpers import assert_compiled_matches_eager, replay_on_new_inputs
from tritonkit.nn.float8 import RECIPES, Float8Linear, convert_to_float8_training, float8_linear
from tritonkit.ops.gemm.spec import FLOAT8_SUM_ERROR

E4M3 = torch.float8_e4m3fn


def _fp32_bound(device) -> float:
    """fp32 outputs: fp32 sums on the CPU; a GPU's tensor cores sum float8 products in a shortened format first
    (the gemm spec's FLOAT8_SUM_ERROR; seen on an H200: 0.8-1.6e-4 of the largest value at K 100)."""
    return 1e-5 if torch.device(device).type == "cpu" else FLOAT8_SUM_ERROR


def _dequantized(t: torch.Tensor, recipe: str) -> torch.Tensor:
    """t's e4m3 codes along its last dimension, dequantized in float64: the operand a GEMM multiplies."""
    codes, scale = tk.ops.quantize(t.detach(), E4M3, granularity=RECIPES[recipe])
    return codes.double() * scale.double()


def _layer(device, dtype, m=(3, 13), k=100, n=45, bias=True):
    """x (*m, k), W (n, k), b (n): odd sizes, K off a multiple of 16."""
    generator = torch.Generator(device).manual_seed(0)
    x = torch.randn(*m, k, device=device, generator=generator).to(dtype).requires_grad_()
    weight = (torch.randn(n, k, device=device, generator=generator) / k**0.5).to(dtype).requires_grad_()
    b = torch.randn(n, device=device, generator=generator).to(dtype).requires_grad_() if bias else None
    return x, weight, b


def _relative(ours: torch.Tensor, reference: torch.Tensor) -> float:
    return ((ours.double() - reference).abs().max() / reference.abs().max()).item()


@pytest.mark.parametrize("recipe", list(RECIPES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_each_gemm_is_the_product_of_its_codes(recipe, dtype, device):
    """y = q(x) q(W)^T + b, dx = q(dy) q(W^T)^T, dW = q(dy^T) q(x^T)^T, db = sum dy, with q() the e4m3 codes
    along each GEMM's contraction, dequantized: within fp32 sums (fp32) or one bf16 rounding of the result."""
    x, weight, bias = _layer(device, dtype)
    y = float8_linear(x, weight, bias, recipe=recipe)
    dy = torch.randn_like(y)
    dx, dweight, dbias = torch.autograd.grad(y, (x, weight, bias), dy)
    rows, dy_rows = x.detach().reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])
    expected = {
        "y": _dequantized(rows, recipe) @ _dequantized(weight, recipe).T + bias.double(),
        "dx": _dequantized(dy_rows, recipe) @ _dequantized(weight.detach().t(), recipe).T,
        "dW": _dequantized(dy_rows.t(), recipe) @ _dequantized(rows.t(), recipe).T,
        "db": dy_rows.double().sum(0),
    }
    ours = {"y": y.reshape(-1, y.shape[-1]), "dx": dx.reshape(-1, dx.shape[-1]), "dW": dweight, "db": dbias}
    bound = _fp32_bound(device) if dtype == torch.float32 else 2**-7
    for name, reference in expected.items():
        assert ours[name].dtype == dtype, name
        assert _relative(ours[name], reference) <= bound, (name, _relative(ours[name], reference))


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_the_layer_is_within_float8s_error_of_the_float64_layer(recipe, device):
    """Against x W^T + b in float64 and its gradients: within e4m3's quantization error (up to about 5% of the
    largest value at K 256: values rounded by up to 2^-4 of themselves), far inside what a transposed or mis-scaled
    operand would give (errors of the order of the values)."""
    x, weight, bias = _layer(device, torch.float32, k=256)
    y = float8_linear(x, weight, bias, recipe=recipe)
    dy = torch.randn_like(y)
    grads = torch.autograd.grad(y, (x, weight, bias), dy)
    x64, w64, b64 = (t.detach().double().requires_grad_() for t in (x, weight, bias))
    y64 = torch.nn.functional.linear(x64, w64, b64)
    grads64 = torch.autograd.grad(y64, (x64, w64, b64), dy.double())
    assert _relative(y, y64) < 0.1
    for name, ours, reference in zip(("dx", "dW", "db"), grads, grads64, strict=True):
        assert _relative(ours, reference) < 0.1, name


def test_gradients_only_where_needed(device, monkeypatch):
    """A frozen weight gets no dW GEMM, a frozen input no dx GEMM: one GEMM forward, one backward."""
    calls = []
    real = tk.ops.scaled_linear
    monkeypatch.setattr(tk.ops, "scaled_linear", lambda *args, **kwargs: calls.append(1) or real(*args, **kwargs))
    x, weight, _ = _layer(device, torch.float32, bias=False)
    weight.requires_grad_(False)
    y = float8_linear(x, weight)
    (dx,) = torch.autograd.grad(y, (x,), torch.ones_like(y))
    assert len(calls) == 2 and dx.shape == x.shape
    expected = _dequantized(torch.ones_like(y).reshape(-1, 45), "rowwise") @ _dequantized(weight.t(), "rowwise").T
    assert _relative(dx.reshape(-1, 100), expected) <= _fp32_bound(device)
    weight.requires_grad_(True)
    y = float8_linear(x.detach(), weight)
    (dweight,) = torch.autograd.grad(y, (weight,), torch.ones_like(y))
    assert len(calls) == 4 and dweight.shape == weight.shape and torch.isfinite(dweight).all()


@pytest.mark.parametrize("recipe", list(RECIPES))
@pytest.mark.parametrize("where", ["x", "weight", "dy"])
@pytest.mark.parametrize("value", [float("inf"), float("nan")], ids=["inf", "nan"])
def test_a_non_finite_operand_makes_what_reads_it_nan(where, value, recipe, device):
    """One inf or NaN in x, W or dy (its code NaN, not the saturated 448): exactly the outputs of each GEMM that
    read it are NaN (the rows or columns the bf16 layer's would make non-finite), the rest finite; db keeps dy's
    sum."""
    x, weight, bias = _layer(device, torch.bfloat16)
    with torch.no_grad():
        if where == "x":
            x[0, 0, 0] = value
        elif where == "weight":
            weight[0, 0] = value
    y = float8_linear(x, weight, bias, recipe=recipe)
    dy = torch.randn_like(y)
    if where == "dy":
        dy[1, 2, 3] = value  # token 1 * 13 + 2 = 15, output feature 3
    dx, dweight, dbias = torch.autograd.grad(y, (x, weight, bias), dy)
    outs = {"y": y.reshape(-1, 45), "dx": dx.reshape(-1, 100), "dW": dweight}
    expected = {name: torch.zeros(out.shape, dtype=torch.bool, device=device) for name, out in outs.items()}
    if where == "x":  # y's token 0, dW's input feature 0
        expected["y"][0, :], expected["dW"][:, 0] = True, True
    elif where == "weight":  # y's output feature 0, dx's input feature 0
        expected["y"][:, 0], expected["dx"][:, 0] = True, True
    else:  # dx's token 15, dW's output feature 3
        expected["dx"][15, :], expected["dW"][3, :] = True, True
    for name, out in outs.items():
        assert torch.equal(out.isnan(), expected[name]), name
        assert torch.isfinite(out[~expected[name]]).all(), name
    assert torch.isfinite(dbias).all() == (where != "dy")


def test_fp16_and_a_bias_of_another_dtype(device):
    """fp16 x and W; an fp32 bias gets its gradient unrounded (the fp32 sum of dy), not rounded to W's dtype."""
    x, weight, _ = _layer(device, torch.float16)
    bias = torch.randn(45, device=device, dtype=torch.float32, requires_grad=True)
    y = float8_linear(x, weight, bias)
    assert y.dtype == torch.float16
    dy = torch.randn_like(y)
    (dbias,) = torch.autograd.grad(y, (bias,), dy)
    assert dbias.dtype == torch.float32
    torch.testing.assert_close(dbias, dy.float().reshape(-1, 45).sum(0), rtol=1e-6, atol=1e-5)


def test_autocast_gives_the_autocast_dtype(device):
    x, weight, bias = _layer(device, torch.float32)
    with torch.autocast(device, dtype=torch.bfloat16):
        y = float8_linear(x, weight, bias)
    assert y.dtype == torch.bfloat16
    dx, dweight = torch.autograd.grad(y, (x, weight), torch.ones_like(y))
    assert dx.dtype == torch.float32 and dweight.dtype == torch.float32


def test_no_tokens_and_no_features(device):
    """No tokens: an empty output, dW and db of zeros; K = 0: y is the bias, dx and dW empty, db the tokens' count
    of ones."""
    x, weight, bias = _layer(device, torch.float32, m=(0,))
    y = float8_linear(x, weight, bias)
    assert y.shape == (0, 45)
    dx, dweight, dbias = torch.autograd.grad(y, (x, weight, bias), torch.randn_like(y))
    assert dx.shape == (0, 100)
    assert torch.equal(dweight, torch.zeros_like(weight)) and torch.equal(dbias, torch.zeros_like(bias))
    x, weight, bias = _layer(device, torch.float32, k=0)
    y = float8_linear(x, weight, bias)
    torch.testing.assert_close(y, bias.detach().expand(3, 13, 45), rtol=0, atol=0)
    dx, dweight, dbias = torch.autograd.grad(y, (x, weight, bias), torch.ones_like(y))
    assert dx.shape == (3, 13, 0) and dweight.shape == (45, 0)
    torch.testing.assert_close(dbias, torch.full_like(bias, 39.0), rtol=0, atol=0)


def test_module_shares_the_linear_parameters_and_converts_models():
    torch.manual_seed(0)
    inner = torch.nn.Sequential(torch.nn.Linear(48, 32, bias=False))
    model = torch.nn.Sequential(torch.nn.Linear(32, 48), torch.nn.GELU(), inner, torch.nn.Linear(32, 8))
    weights = [model[0].weight, model[2][0].weight, model[3].weight]
    convert_to_float8_training(model, recipe="tensorwise", module_filter_fn=lambda module, fqn: fqn != "3")
    assert isinstance(model[0], Float8Linear) and isinstance(model[2][0], Float8Linear)
    assert type(model[3]) is torch.nn.Linear  # kept by the filter (an LM head, say)
    assert model[0].weight is weights[0] and model[2][0].weight is weights[1] and model[2][0].bias is None
    assert model[0].recipe == "tensorwise" and "recipe=tensorwise" in repr(model[0])
    x = torch.randn(5, 32)
    model(x).sum().backward()
    assert all(w.grad is not None and torch.isfinite(w.grad).all() for w in weights)
    single = torch.nn.Linear(16, 16)
    assert isinstance(convert_to_float8_training(single), Float8Linear)


def test_compiles_fullgraph(device):
    layer = Float8Linear(64, 40).to(device)

    def block(x, weight, bias):
        return float8_linear(x, weight, bias).square().mean()

    inputs = [torch.randn(6, 64, device=device), layer.weight.detach().clone(), layer.bias.detach().clone()]
    assert_compiled_matches_eager(block, [t.requires_grad_() for t in inputs], device)


@pytest.mark.gpu
def test_training_step_captures_in_a_cuda_graph():
    """Forward and backward of a bf16 layer replayed from a CUDA graph on new inputs: the eager step's results."""
    x, weight, bias = _layer("cuda", torch.bfloat16)

    def step(x, weight, bias):
        y = float8_linear(x, weight, bias)
        return (y, *torch.autograd.grad(y, (x, weight, bias), torch.ones_like(y)))

    replayed = replay_on_new_inputs(step, (x, weight, bias))
    for ours, eager in zip(replayed, step(x, weight, bias), strict=True):
        torch.testing.assert_close(ours, eager, rtol=0, atol=0)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"recipe": "axiswise"}, ValueError, "recipe must be one of"),
        ({"x": torch.ones(2, 8, dtype=torch.int8)}, TypeError, "x must be a bf16, fp16 or fp32 tensor"),
        ({"weight": torch.ones(4, 9)}, ValueError, "x's last dimension must be weight's 9"),
        ({"bias": torch.ones(5)}, ValueError, r"bias must have shape \(4,\)"),
        ({"weight": torch.ones(8)}, ValueError, "weight must be"),
    ],
)
def test_bad_input(kwargs, error, match):
    args = {"x": torch.ones(2, 8), "weight": torch.ones(4, 8), "bias": None, "recipe": "rowwise", **kwargs}
    with pytest.raises(error, match=match):
        float8_linear(args["x"], args["weight"], args["bias"], recipe=args["recipe"])
    with pytest.raises(ValueError, match="recipe must be one of"):
        Float8Linear(8, 4, recipe="delayed")
    with pytest.raises(TypeError, match=r"must be a torch\.nn\.Linear"):
        Float8Linear.from_linear(torch.nn.Conv1d(1, 1, 1))


def test_benchmark_dry_run(capsys):
    """benchmarks/float8_training.py's CPU check: tritonkit's providers against the float64 layer."""
    from helpers import benchmark_script

    script = benchmark_script("float8_training")
    assert script.dry_run() == 0
    assert capsys.readouterr().out.count(" ok") == 3
    row = {"tokens": 8, "k": 4, "n": 2, "provider": "bf16 nn.Linear", "ms": 0.5, "tflops": 1.0, "bf16_over_this": 1.0}
    rows = [row]
    table = script.summary({"device": "GPU", "timing": "CUDA graph", "rows": rows})
    assert "| 8 x 4 -> 2 | bf16 nn.Linear | 500.0 | 1 | 1.00x |" in table
