"""GELU / SiLU and the shared elementwise launcher beyond the registry sweep."""

import pytest
import torch

import tritonkit as tk
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
    backend = "inductor" if device == "cuda" else "aot_eager"
    op = getattr(tk.ops, name)

    def block(x):
        return (op(x * 1.5, **options) ** 2).sum()

    x = torch.randn(7, 9, device=device, requires_grad=True)
    eager_loss = block(x)
    (eager_grad,) = torch.autograd.grad(eager_loss, x)
    torch._dynamo.reset()
    compiled_loss = torch.compile(block, fullgraph=True, backend=backend)(x)
    (compiled_grad,) = torch.autograd.grad(compiled_loss, x)
    torch.testing.assert_close(compiled_loss, eager_loss, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(compiled_grad, eager_grad, rtol=1e-5, atol=1e-5)


def test_bad_input(device):
    with pytest.raises(ValueError, match=r"approximate must be one of \('none', 'tanh'\), got 'fast'"):
        tk.ops.gelu(torch.randn(3, device=device), approximate="fast")
    with pytest.raises(TypeError, match=r"x must have dtype in .* got torch\.int32"):
        tk.ops.silu(torch.ones(3, dtype=torch.int32, device=device))
    with pytest.raises(TypeError, match=r"x must be a torch\.Tensor, got list"):
        tk.ops.gelu([1.0])
