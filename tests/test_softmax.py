"""Softmax / log-softmax beyond the registry sweep: masking as torch, any dim, compile, bad input."""

import pytest
import torch

import tritonkit as tk
from helpers import assert_compiled_matches_eager, assert_graph_replay_matches_eager
from tritonkit.ops.row_softmax.launch import softmax_bwd, softmax_fwd
from tritonkit.ops.row_softmax.plan import MAX_SINGLE_PASS, SplitRowPlan, WholeRowPlan, fallback_plan


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
@pytest.mark.parametrize("n", [100, 40000], ids=["whole-rows", "split-rows"])
def test_forward_without_gradient_stores_no_lse(op, n, device):
    """Where no gradient is needed the forward over whole rows skips the backward's lse, and each form gives the
    training forward's output bit for bit."""
    x = 3 * torch.randn(4, n, device=device)
    fn = getattr(tk.ops, op)
    with torch.no_grad():
        y_inference = fn(x)
    y_training = fn(x.clone().requires_grad_())
    assert y_training.grad_fn is not None and torch.equal(y_inference, y_training.detach())
    y, lse = softmax_fwd(x, op == "log_softmax", store_lse=False)
    assert torch.equal(y, y_inference)
    assert (lse.numel() == 0) == (n <= MAX_SINGLE_PASS)  # split rows store it regardless (one a row)


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


@pytest.mark.parametrize(
    "plan",
    [
        WholeRowPlan(rows=2, warps=4),  # whole rows, a block of two a program
        WholeRowPlan(rows=2, warps=4, programs_per_sm=1, stages=2),  # a grid looping over blocks, pipelined
        SplitRowPlan(slice=16, warps=4),  # rows split across programs, slices of 16
        fallback_plan(50),  # what a GPU never measured takes
    ],
    ids=["block", "grid-loop", "split-row", "fallback"],
)
@pytest.mark.parametrize("log", [False, True])
def test_every_plan_kind(plan, log, device):
    """Each launch plan the tables can choose gives torch's output and gradient: 37 rows (not a multiple
    of the blocks or the grid), 50 columns (a ragged last slice), a fully and a partly masked row (whose
    last slices are all -inf)."""
    x = 4 * torch.randn(37, 50, device=device)
    x[3] = float("-inf")
    x[5, 7:] = float("-inf")
    dy = torch.randn_like(x)
    y, lse = softmax_fwd(x, log, plan=plan)  # outputs poisoned (conftest): an element the kernels skip is caught
    dx = softmax_bwd(dy, x, lse, log, plan=plan)
    x64 = x.double().requires_grad_()
    expected = (torch.log_softmax if log else torch.softmax)(x64, -1)
    (expected_dx,) = torch.autograd.grad(expected, x64, dy.double())
    torch.testing.assert_close(y.double(), expected, rtol=1e-5, atol=1e-6, equal_nan=True)
    torch.testing.assert_close(lse.double(), torch.logsumexp(x64, -1).detach(), rtol=1e-5, atol=1e-6, equal_nan=True)
    ok_rows = torch.arange(37, device=device) != 3  # a fully masked row: NaN output and gradient, as torch
    torch.testing.assert_close(dx[ok_rows].double(), expected_dx[ok_rows], rtol=1e-5, atol=1e-5)
    assert y[3].isnan().all() and not y[ok_rows].isnan().any()


@pytest.mark.parametrize("plan", [WholeRowPlan(rows=2, warps=4), SplitRowPlan(slice=16, warps=4)],
                         ids=["whole-row", "split-row"])  # fmt: skip
@pytest.mark.parametrize("log", [False, True])
def test_near_one_hot_rows_of_large_logits_keep_the_gradient_exact(plan, log, device):
    """Rows of logits near 100 whose top value holds 1 - 4e-4 of the mass: lse's fp32 rounding (up to 4e-6) scales
    every recomputed p alike, and softmax's dy - sum(dy * p) cancels to 2e-3, so without the p renormalised the
    gradient there was 1.1e-5 off (CI saw it once in 300 seeds). Now within two fp32 ulps of dy's scale (4.8e-7 at
    4), the rounding of dy - c itself."""
    x = torch.linspace(-3.0, 1.0, 64, device=device).repeat(4, 1) * 25.0  # the top two logits 100 and 93.7 apart
    x[:, -1] = 100.0 + torch.arange(4, device=device) * 0.37  # different lse roundings row to row
    x[:, -2] = x[:, -1] - 7.7
    dy = torch.randn(4, 64, device=device, generator=torch.Generator(device).manual_seed(3)) + 4.0
    _, lse = softmax_fwd(x, log, plan=plan)
    dx = softmax_bwd(dy, x, lse, log, plan=plan)
    x64 = x.double().requires_grad_()
    (expected_dx,) = torch.autograd.grad((torch.log_softmax if log else torch.softmax)(x64, -1), x64, dy.double())
    torch.testing.assert_close(dx.double(), expected_dx, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("log", [False, True])
def test_split_row_slice_of_minus_inf_in_a_very_negative_row(log, device):
    """Rows split across programs, one slice all -inf in rows whose maximum is near -1000 (so exp(-maximum)
    overflows fp32): that slice gives zeros (softmax) or -inf (log_softmax), never 0 * inf = NaN, and the rest
    matches float64 within what fp32 inputs near -1000 carry (spacing 6e-5)."""
    plan = SplitRowPlan(slice=16, warps=4)
    x = torch.randn(3, 50, device=device) - 1000.0
    x[:, 16:32] = float("-inf")
    dy = torch.randn_like(x)
    y, lse = softmax_fwd(x, log, plan=plan)
    dx = softmax_bwd(dy, x, lse, log, plan=plan)
    x64 = x.double().requires_grad_()
    expected = (torch.log_softmax if log else torch.softmax)(x64, -1)
    (expected_dx,) = torch.autograd.grad(expected, x64, dy.double())
    assert not y.isnan().any() and not dx.isnan().any()
    torch.testing.assert_close(y.double(), expected, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(dx.double(), expected_dx, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("n", [1000, 70000], ids=["whole-rows", "split-rows"])
def test_cuda_graph_capture_forward_and_backward(op, n):
    """Whole rows, and rows split across programs (their counters zeroed in the graph), in bf16."""

    def step(x, upstream):
        y = getattr(tk.ops, op)(x.requires_grad_(), dim=-1)
        return (y, *torch.autograd.grad(y, x, upstream))

    x = torch.randn(64, n, device="cuda", dtype=torch.bfloat16)
    assert_graph_replay_matches_eager(step, [x, torch.randn_like(x)])


@pytest.mark.parametrize("spin_waits", [True, False], ids=["one-launch", "two-launches"])
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_split_rows_with_and_without_spin_waits(op, spin_waits, device):
    """Rows split across programs run as one launch whose programs wait for each other (on a GPU, where allowed) or,
    with tk.set_spin_waits(False) (and always under the interpreter), as two launches: both give torch's output and
    gradient."""
    x = (3 * torch.randn(5, 40000 if device == "cpu" else 70000, device=device)).requires_grad_()
    dy = torch.randn_like(x)
    with tk.set_spin_waits(spin_waits):
        y = getattr(tk.ops, op)(x)
        (dx,) = torch.autograd.grad(y, x, dy)
    x64 = x.detach().double().requires_grad_()
    expected = getattr(torch, op)(x64, -1)
    (expected_dx,) = torch.autograd.grad(expected, x64, dy.double())
    torch.testing.assert_close(y.double(), expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(dx.double(), expected_dx, rtol=1e-5, atol=2e-5)
