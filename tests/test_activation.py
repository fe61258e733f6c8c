"""GELU / SiLU and the shared elementwise launcher beyond the registry sweep."""

import pytest
import torch

import tritonkit as tk
from helpers import assert_compiled_matches_eager, assert_graph_replay_matches_eager
from tritonkit._core.elementwise import _is_dense

OPS = [("gelu", {}), ("gelu", {"approximate": "tanh"}), ("silu", {})]


@pytest.mark.parametrize(("name", "options"), OPS)
def test_dense_layouts_are_kept(name, options, device):
    x = torch.randn(6, 4, 5, device=device).permute(2, 0, 1)  # dense, not contiguous
    y = getattr(tk.ops, name)(x, **options)
    assert y.stride() == x.stride()  # read in place, written in the same layout
    torch.testing.assert_close(y, getattr(torch.nn.functional, name)(x, **options), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("name", "options"), OPS)
def test_expanded_input_and_gradient(name, options, device):
    x = torch.randn(5, 1, device=device).expand(5, 7).requires_grad_()  # stride 0
    ours = getattr(tk.ops, name)(x, **options)
    theirs = getattr(torch.nn.functional, name)(x, **options)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(torch.autograd.grad(ours.sum(), x)[0], torch.autograd.grad(theirs.sum(), x)[0],
                               rtol=1e-5, atol=1e-5)  # fmt: skip


def test_density_rule():
    base = torch.empty(4, 6)
    assert _is_dense(base) and _is_dense(base.t()) and _is_dense(torch.empty(2, 3, 4).permute(1, 2, 0))
    assert not _is_dense(base[:, ::2]) and not _is_dense(torch.empty(4, 1).expand(4, 3))


@pytest.mark.parametrize(("name", "options"), OPS)
def test_compiles_fullgraph_with_backward(name, options, device):
    op = getattr(tk.ops, name)

    def block(x):
        return (op(x * 1.5, **options) ** 2).sum()

    assert_compiled_matches_eager(block, [torch.randn(7, 9, device=device, requires_grad=True)], device)


def test_bad_input(device):
    with pytest.raises(ValueError, match=r"approximate must be one of \('none', 'tanh'\), got 'fast'"):
        tk.ops.gelu(torch.randn(3, device=device), approximate="fast")
    with pytest.raises(TypeError, match=r"x must have dtype in .* got torch\.int32"):
        tk.ops.silu(torch.ones(3, dtype=torch.int32, device=device))
    with pytest.raises(TypeError, match=r"x must be a torch\.Tensor, got list"):
        tk.ops.gelu([1.0])


def test_swiglu_mlp_matches_the_llama_mlp(device):
    mlp = tk.nn.SwiGLUMLP(16, 40, device=device)
    assert list(mlp.state_dict()) == ["gate_proj.weight", "up_proj.weight", "down_proj.weight"]
    x = torch.randn(3, 5, 16, device=device, requires_grad=True)
    expected = mlp.down_proj(torch.nn.functional.silu(mlp.gate_proj(x)) * mlp.up_proj(x))
    torch.testing.assert_close(mlp(x), expected, rtol=1e-5, atol=1e-5)
    params = [x, *mlp.parameters()]
    for ours, theirs in zip(torch.autograd.grad(mlp(x).sum(), params), torch.autograd.grad(expected.sum(), params),
                            strict=True):  # fmt: skip
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("op", ["swiglu", "geglu"])
def test_gated_compiles_fullgraph_with_backward(op, device):
    fn = getattr(tk.ops, op)

    def block(gate, up):
        return (fn(gate * 2, up) ** 2).sum()

    inputs = [torch.randn(7, 9, device=device, requires_grad=True) for _ in range(2)]
    assert_compiled_matches_eager(block, inputs, device)


def test_gelu_tanh_gradient_in_the_saturated_tail(device):
    # Written from tanh(u), 1 - tanh(u)^2 rounds to 0 in fp32 for x < -4.5 while f' is still ~1e-6.
    x = torch.linspace(-9, -4, 50, device=device, requires_grad=True)
    (ours,) = torch.autograd.grad(tk.ops.gelu(x, approximate="tanh").sum(), x)
    x64 = x.detach().double().requires_grad_()
    (exact,) = torch.autograd.grad(torch.nn.functional.gelu(x64, approximate="tanh").sum(), x64)
    torch.testing.assert_close(ours.double(), exact, rtol=1e-4, atol=1e-12)


def test_gelu_erf_fit_accuracy(device):
    # The erf GELU evaluates Phi from a Chebyshev fit of erfc: the bounds its docstring states, which a
    # wrong coefficient would break (the registry's fp32 tolerance, 1e-5, is looser). The exact values come
    # from erfc in float64: torch's float64 GELU, 1 + erf, cancels to 0 below x = -8.
    x = torch.linspace(-12, 12, 48001, device=device).requires_grad_()
    y = tk.ops.gelu(x)
    (dx,) = torch.autograd.grad(y.sum(), x)
    x64 = x.detach().double()
    cdf = 0.5 * torch.special.erfc(-x64 * 0.5**0.5)
    exact, exact_dx = x64 * cdf, cdf + x64 * torch.exp(-0.5 * x64 * x64) / (2 * torch.pi) ** 0.5
    assert (y.double() - exact).abs().max().item() < 4e-7
    tail = x64 < -1
    assert ((y.double() - exact).abs() / exact.abs())[tail].max().item() < 2e-5
    assert (dx.double() - exact_dx).abs().max().item() < 1e-6


def test_gated_bad_input(device):
    with pytest.raises(ValueError, match=r"swiglu: gate and up must have the same shape, got \(3,\) and \(4,\)"):
        tk.ops.swiglu(torch.randn(3, device=device), torch.randn(4, device=device))
    with pytest.raises(TypeError, match="geglu: gate and up must have the same dtype"):
        tk.ops.geglu(torch.randn(3, device=device), torch.randn(3, device=device, dtype=torch.float16))
    with pytest.raises(ValueError, match=r"approximate must be one of \('none', 'tanh'\), got 'erf'"):
        tk.ops.geglu(torch.randn(3, device=device), torch.randn(3, device=device), approximate="erf")


@pytest.mark.gpu
@pytest.mark.parametrize(("name", "options"), OPS)
def test_cuda_graph_capture_forward_and_backward(name, options):
    def step(x, upstream):
        y = getattr(tk.ops, name)(x.requires_grad_(), **options)
        return (y, *torch.autograd.grad(y, x, upstream))

    x = torch.randn(300, 1000, device="cuda", dtype=torch.bfloat16)
    assert_graph_replay_matches_eager(step, [x, torch.randn_like(x)])
