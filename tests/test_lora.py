"""LoRA linear beyond the registry sweep: compile without graph breaks, the frozen weight's skipped
GEMM, strided parameters, the tolerance's power to reject rounded intermediates, the module, bad input."""

import pytest
import torch

import tritonkit as tk
from helpers import assert_compiled_matches_eager
from tritonkit import catalog, testing
from tritonkit.ops.lora import launch as lora_launch
from tritonkit.ops.lora.plan import FUSED_MAX_TOKENS, LoraPlan
from tritonkit.ops.lora.spec import _lora_reference
from tritonkit.registry import KernelSpec


def _inputs(device, dtype=torch.float32, lead=(2, 5), k=24, n=40, r=8):
    x = torch.randn(*lead, k, device=device, dtype=dtype)
    weight = (torch.randn(n, k, device=device) * k**-0.5).to(dtype)
    lora_a = (torch.randn(r, k, device=device) * k**-0.5).to(dtype)
    lora_b = (torch.randn(n, r, device=device) * r**-0.5).to(dtype)
    bias = torch.randn(n, device=device, dtype=dtype)
    return x, weight, lora_a, lora_b, bias


def _with_fn(name, fn):
    return KernelSpec(**{**catalog.get("lora_linear").__dict__, "name": name, "fn": fn})


@pytest.mark.parametrize("frozen", [True, False], ids=["frozen-weight", "trained-weight"])
def test_compiles_fullgraph_with_backward(frozen, device):
    x, weight, lora_a, lora_b, bias = _inputs(device)

    def block(x, lora_a, lora_b, bias, *maybe_weight):
        y = tk.ops.lora_linear(x, maybe_weight[0] if maybe_weight else weight, lora_a, lora_b, 0.5, bias)
        return (y.float() * 2).sum()

    inputs = [x, lora_a, lora_b, bias] + ([] if frozen else [weight])
    assert_compiled_matches_eager(block, [t.requires_grad_() for t in inputs], device)


def _spy_on(monkeypatch, name, calls):
    """Record the operand shapes of every call of lora.launch's ``name`` (looked up there at call time)."""
    real = getattr(lora_launch, name)

    def spy(*args, **kwargs):
        calls.append(tuple(tuple(a.shape) for a in args[:2]))
        return real(*args, **kwargs)

    monkeypatch.setattr(lora_launch, name, spy)


def test_frozen_weight_skips_its_gradient(device, monkeypatch):
    """Only lora_a and lora_b require grad: the backward runs neither the fused dx GEMM nor the dW GEMM, only
    dy B (for dA, a thin GEMM in place of the dx kernel) and dA's and dB's thin products."""
    fused, fp32_gemms, thin = [], [], []
    _spy_on(monkeypatch, "_launch_lora_matmul", fused)  # the forward's and dx's fused GEMM (p, q_t)
    _spy_on(monkeypatch, "mm_fp32", fp32_gemms)  # dy B without dx, and dW = dy^T x
    _spy_on(monkeypatch, "_thin_grad", thin)  # dA from (dy B, x), dB from (x A^T, dy)
    x, weight, lora_a, lora_b, bias = _inputs(device)  # 10 tokens, k 24, n 40, r 8
    lora_a.requires_grad_()
    lora_b.requires_grad_()
    y = tk.ops.lora_linear(x, weight, lora_a, lora_b, 2.0, bias)
    assert fused == [((10, 24), (40, 24))] and fp32_gemms == [] and thin == []  # the forward alone
    y.sum().backward()
    assert fused == [((10, 24), (40, 24))]  # no dx GEMM
    assert fp32_gemms == [((10, 40), (40, 8))]  # dy B only: no dW GEMM ((40, 10) x (10, 24))
    assert thin == [((10, 8), (10, 24)), ((10, 8), (10, 40))]
    assert weight.grad is None and x.grad is None and lora_a.grad is not None and lora_b.grad is not None


@pytest.mark.parametrize(("frozen", "checked"), [(True, 4), (False, 5)])
def test_run_case_leaves_a_frozen_weight_alone(frozen, checked):
    """Inputs.frozen: the frozen weight requires no grad, so neither its gradient nor its GEMM is checked."""
    case = {"lead": (2, 5), "k": 40, "n": 24, "r": 16, "frozen": frozen}
    result = testing.run_case(catalog.get("lora_linear"), case, torch.float32, "cpu", grad_mode="random")
    assert result.ok and len(result.comparisons) == checked  # y, dx, dA, dB (and dW)


def test_strided_parameters_and_expanded_gradient(device):
    x, weight, lora_a, lora_b, bias = _inputs(device, k=33, n=70, r=4)
    # Transposed and sliced views of every parameter, and x sliced along its features.
    weight = weight.t().contiguous().t().requires_grad_()
    lora_a = torch.cat([lora_a, lora_a], dim=1)[:, ::2].requires_grad_()
    lora_b = lora_b.t().contiguous().t().requires_grad_()
    x = torch.cat([x, x], dim=-1)[..., 1::2].requires_grad_()
    bias = torch.cat([bias, bias])[::2].requires_grad_()
    leaves = (x, weight, lora_a, lora_b, bias)
    ours = tk.ops.lora_linear(x, weight, lora_a, lora_b, 2.0, bias)
    reference = catalog.get("lora_linear").reference(*(t.double() for t in leaves[:4]), 2.0, bias.double())
    torch.testing.assert_close(ours, reference.float(), rtol=1e-5, atol=1e-5)
    grads = torch.autograd.grad(ours.sum(), leaves)  # sum(): an expanded, stride-0 upstream gradient
    expected = torch.autograd.grad(reference.sum(), leaves)
    for a, b in zip(grads, expected, strict=True):
        torch.testing.assert_close(a, b.float(), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_tolerance_rejects_rounded_intermediates(dtype):
    """torch's eager LoRA in 16-bit rounds x A^T and dy B to the dtype; the kernels split them instead.
    The spec's tolerance must tell the two apart, or it would not catch a kernel that lost the split."""
    unfused = _with_fn("unfused", _lora_reference)
    case = {"m": 66, "k": 48, "n": 80, "r": 20, "bias": True}
    assert not testing.run_case(unfused, case, dtype, "cpu", seed=0, grad_mode="random").ok


def test_module_matches_linear_plus_adapter(device):
    linear = torch.nn.Linear(24, 40, device=device)
    layer = tk.nn.LoRALinear.from_linear(linear, r=4, lora_alpha=8)
    assert layer.weight is linear.weight and not linear.weight.requires_grad and layer.scaling == 2.0
    assert set(layer.state_dict()) == {"base_layer.weight", "base_layer.bias", "lora_A.default.weight",
                                       "lora_B.default.weight"}  # PEFT's names  # fmt: skip
    x = torch.randn(3, 24, device=device)
    torch.testing.assert_close(layer(x), linear(x), rtol=1e-5, atol=1e-5)  # B starts at zero
    lora_a, lora_b = layer.lora_A["default"].weight, layer.lora_B["default"].weight
    with torch.no_grad():
        lora_b.normal_()
    expected = linear(x) + 2.0 * (x @ lora_a.t()) @ lora_b.t()
    torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-5)
    layer(x).sum().backward()
    assert lora_a.grad is not None and lora_b.grad is not None and layer.weight.grad is None
    trained = tk.nn.LoRALinear(24, 40, r=2, bias=False, freeze_base=False, device=device)
    assert trained.weight.requires_grad and trained.bias is None and trained.lora_A["default"].weight.shape == (2, 24)


def _call(device, **changes):
    x, weight, lora_a, lora_b, bias = _inputs(device)
    args = {"x": x, "weight": weight, "lora_a": lora_a, "lora_b": lora_b, "scale": 2.0, "bias": bias, **changes}
    return tk.ops.lora_linear(**args)


BAD = [
    ({"weight": torch.ones(40, 23)}, ValueError, r"x's last dimension must equal weight's in_features 23"),
    ({"lora_a": torch.ones(8, 23)}, ValueError, r"lora_a must have shape \(r, 24\), got \(8, 23\)"),
    ({"lora_b": torch.ones(40, 7)}, ValueError, r"lora_b must have shape \(40, 8\) \(out_features, r\), got \(40, 7\)"),
    ({"lora_b": torch.ones(39, 8)}, ValueError, r"lora_b must have shape \(40, 8\)"),
    ({"bias": torch.ones(41)}, ValueError, r"bias must have shape \(40,\), got \(41,\)"),
    ({"lora_a": torch.ones(0, 24), "lora_b": torch.ones(40, 0)}, ValueError,
     r"rank r = lora_a.shape\[0\] must be in \[1, 128\], got 0"),
    ({"lora_a": torch.ones(129, 24), "lora_b": torch.ones(40, 129)}, ValueError, r"must be in \[1, 128\], got 129"),
    ({"weight": torch.ones(40, 24, 1)}, ValueError, "weight must have 2 dimensions, got 3"),
    ({"x": torch.tensor(1.0)}, ValueError, "x must have at least one dimension"),
    ({"x": torch.ones(3, 24, dtype=torch.int32)}, TypeError, "x must have dtype in .* got torch.int32"),
    ({"lora_b": torch.ones(40, 8, dtype=torch.bfloat16)}, TypeError,
     "lora_b must have x's dtype torch.float32, got torch.bfloat16"),
    ({"weight": torch.ones(40, 24, dtype=torch.float16)}, TypeError, "weight must have x's dtype"),
    ({"scale": float("nan")}, TypeError, "scale must be a finite Python number, got nan"),
    ({"scale": torch.tensor(2.0)}, TypeError, "scale must be a finite Python number"),
]  # fmt: skip


@pytest.mark.parametrize(("changes", "error", "match"), BAD, ids=[m[:30] for _, _, m in BAD])
def test_bad_input_names_the_argument(changes, error, match, device):
    changes = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in changes.items()}
    with pytest.raises(error, match=match):
        _call(device, **changes)


def test_module_rejects_a_bad_rank():
    with pytest.raises(ValueError, match="r must be a positive int, got 0"):
        tk.nn.LoRALinear(4, 4, r=0)


@pytest.fixture
def rows_through_cublas(monkeypatch):
    """The row counts of the products that took the cuBLAS path, in call order."""
    rows = []
    cublas = lora_launch._cublas_lora_matmul

    def spy(p, *args):
        rows.append(p.shape[0])
        return cublas(p, *args)

    monkeypatch.setattr(lora_launch, "_cublas_lora_matmul", spy)
    return rows


def test_many_tokens_take_cublas_and_few_the_fused_kernel(rows_through_cublas):
    limit = FUSED_MAX_TOKENS
    for tokens in (limit, limit + 1):
        x = torch.randn(tokens, 8, requires_grad=True)
        y = tk.ops.lora_linear(x, torch.randn(4, 8), torch.randn(2, 8), torch.randn(4, 2), 1.0)
        y.backward(torch.randn_like(y))
    assert rows_through_cublas == [limit + 1, limit + 1]  # the forward and dx, only past the limit


def test_a_plan_forces_either_path_with_the_same_products(rows_through_cublas):
    """LoraPlan(fused_max_tokens=0) sends 5 rows through cuBLAS, a large limit through the fused kernel; both
    give the float64 reference's y, dx, dA and dB within fp32's rounding."""
    g = torch.Generator().manual_seed(0)
    x, w, a, b = (torch.randn(shape, generator=g) for shape in ((5, 24), (12, 24), (3, 24), (12, 3)))
    dy = torch.randn(5, 12, generator=g)
    expected = _lora_reference(x.double(), w.double(), a.double(), b.double(), 0.5)
    xa = x.double() @ a.double().t()
    expected_dx = dy.double() @ w.double() + 0.5 * (dy.double() @ b.double()) @ a.double()
    expected_da = 0.5 * (dy.double() @ b.double()).t() @ x.double()
    expected_db = 0.5 * dy.double().t() @ xa
    for plan, through_cublas in ((LoraPlan(fused_max_tokens=0), [5, 5]), (LoraPlan(fused_max_tokens=64), [])):
        rows_through_cublas.clear()
        y, saved = lora_launch.lora_fwd(x, w, a, b, None, 0.5, plan=plan)
        dx, _, da, db, _ = lora_launch.lora_bwd(dy, x, w, a, b, saved, 0.5, True, False, True, True, False,
                                                plan=plan)  # fmt: skip
        assert rows_through_cublas == through_cublas
        for got, want in ((y, expected), (dx, expected_dx), (da, expected_da), (db, expected_db)):
            torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(TypeError, match="plan must be a LoraPlan"):
        lora_launch.lora_fwd(x, w, a, b, None, 0.5, plan={"fused_max_tokens": 0})
    with pytest.raises(ValueError, match="fused_max_tokens must be an int >= 0"):
        LoraPlan(fused_max_tokens=-1)


def test_fp32_reductions_switch_off_16_bit_split_k_and_restore_the_setting():
    from tritonkit._core import cublas

    matmul = torch.backends.cuda.matmul
    before = matmul.allow_bf16_reduced_precision_reduction, matmul.allow_fp16_reduced_precision_reduction
    with cublas._fp32_reductions():
        assert not matmul.allow_bf16_reduced_precision_reduction
        assert not matmul.allow_fp16_reduced_precision_reduction
    assert (matmul.allow_bf16_reduced_precision_reduction, matmul.allow_fp16_reduced_precision_reduction) == before


@pytest.mark.gpu
@pytest.mark.parametrize("frozen", [True, False], ids=["frozen-weight", "trained-weight"])
def test_bf16_large_compiled_matches_reference(frozen):
    """A Llama-sized projection in bf16 under inductor, forward and backward, against the float64
    reference with the spec's tolerance (eager runs the same shapes in the registry's gpu_cases)."""
    torch._dynamo.reset()
    compiled = _with_fn("lora_linear_compiled", torch.compile(tk.ops.lora_linear, fullgraph=True))
    case = {"lead": (4, 1024), "k": 4096, "n": 4096, "r": 16, "bias": True, "frozen": frozen}
    result = testing.run_case(compiled, case, torch.bfloat16, "cuda", grad_mode="random")
    assert result.ok, result.explain()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_backward_custom_op_outputs_match_its_fake_in_shape_stride_and_dtype(dtype):
    """Inductor asserts the strides the fake promises; a transposed dlora_b failed that on the GPU."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from tritonkit.ops.lora.op import lora_op

    lora_bwd = lora_op.backward_op  # the custom op tritonkit::lora_bwd: its real kernel, and its registered fake
    tokens, k, n, r = 10, 24, 40, 8
    args = [torch.randn(shape).to(dtype) for shape in ((tokens, n), (tokens, k), (n, k), (r, k), (n, r))]
    args.append(torch.randn(tokens, r))  # x A^T, fp32
    flags = (0.5, True, True, True, True, True)
    real = lora_bwd(*args, *flags)
    with FakeTensorMode() as mode:
        fake = lora_bwd(*(mode.from_tensor(t) for t in args), *flags)
    for got, promised in zip(real, fake, strict=True):
        assert (got.shape, got.stride(), got.dtype) == (promised.shape, promised.stride(), promised.dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("tokens", [0, 70], ids=["no-tokens", "70-tokens"])
def test_thin_gradients_match_the_reference_on_both_paths(tokens, dtype, device):
    """dA = s (dy B)^T x and dB = s dy^T (x A^T) from the Triton kernel (few tokens) and from cuBLAS (a plan with no
    fused tokens): 70 tokens are two 64-token steps, 100 columns two column blocks (one ragged), rank 3 padded to 16;
    no tokens give zeros. Rounded once from fp32 sums: within the dtype's rounding of the float64 values."""
    from tritonkit.ops.lora.plan import THIN_GRAD_COLUMNS, THIN_GRAD_ROWS

    assert THIN_GRAD_ROWS < 70 <= 2 * THIN_GRAD_ROWS and THIN_GRAD_COLUMNS < 100 <= 2 * THIN_GRAD_COLUMNS
    g = torch.Generator(device).manual_seed(tokens)
    small = torch.randn(tokens, 3, generator=g, device=device)  # dy B or x A^T, fp32
    big = torch.randn(tokens, 100, generator=g, device=device).to(dtype)  # x or dy
    expected = 0.5 * small.double().t() @ big.double()  # (3, 100)
    rounding = 2**-8 if dtype == torch.bfloat16 else 2**-20
    for plan in (LoraPlan(fused_max_tokens=128), LoraPlan(fused_max_tokens=0)):
        for transposed in (False, True):
            got = lora_launch._thin_grad(small, big, 0.5, dtype, transposed, plan)  # its output poisoned first
            assert got.dtype == dtype and got.is_contiguous()
            want = expected.t() if transposed else expected
            torch.testing.assert_close(got.double(), want, rtol=rounding, atol=rounding * max(want.abs().max(), 1))
