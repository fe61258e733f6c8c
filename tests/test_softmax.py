"""Softmax / log-softmax beyond the registry sweep: masking as torch, any dim, compile, bad input."""

import pytest
import torch

import tritonkit as tk
from helpers import assert_compiled_matches_eager


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("n", [5, 40000])
def test_masking_matches_torch(op, n, device):
    x = torch.randn(4, n, device=device)
    x[0] = float("-inf")  # fully masked row: NaN, as torch
    x[1, : n // 2] = float("-inf")  # partly masked: exact zeros (softmax) and -inf (log_softmax)
    x[2, -1] = float("-inf")
    ours, theirs = getattr(tk.ops, op)(x), getattr(torch, op)(x, -1)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6, equal_nan=True)
    assert ours[0].isnan().all()


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("dim", [0, 1, -1, -3])
def test_any_dim(op, dim, device):
    x = torch.randn(3, 5, 7, device=device, requires_grad=True)
    ours, theirs = getattr(tk.ops, op)(x, dim=dim), getattr(torch, op)(x, dim)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    grad = torch.randn_like(ours)
    torch.testing.assert_close(torch.autograd.grad(ours, x, grad)[0], torch.autograd.grad(theirs, x, grad)[0],
                               rtol=1e-5, atol=1e-5)  # fmt: skip


def test_zero_dim_tensor(device):
    x = torch.tensor(2.5, device=device)
    assert tk.ops.softmax(x).item() == 1.0 and tk.ops.log_softmax(x).item() == 0.0


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_compiles_fullgraph_with_backward(op, device):
    fn = getattr(tk.ops, op)

    def block(x):
        return (fn(x * 2, dim=-1) * torch.arange(x.shape[-1], device=x.device)).sum()

    assert_compiled_matches_eager(block, [torch.randn(6, 33, device=device, requires_grad=True)], device)


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_bad_input(op, device):
    fn = getattr(tk.ops, op)
    with pytest.raises(ValueError, match=rf"{op}: dim must be in \[-2, 1\] for x of shape \(3, 4\), got 2"):
        fn(torch.randn(3, 4, device=device), dim=2)
    with pytest.raises(ValueError, match=rf"{op}: dim must be in \[-2, 1\] .* got -3"):
        fn(torch.randn(3, 4, device=device), dim=-3)
    with pytest.raises(TypeError, match=f"{op}: dim must be an int, got float"):
        fn(torch.randn(3, 4, device=device), dim=1.0)
    with pytest.raises(TypeError, match=r"x must have dtype in .* got torch\.int64"):
        fn(torch.ones(3, 4, dtype=torch.int64, device=device))
