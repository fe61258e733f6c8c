"""Fused add + RMSNorm / LayerNorm beyond the registry sweep: compile without graph breaks,
determinism, the checker's power to catch wrong kernels, drop-in modules, bad input."""

import dataclasses
import importlib

import pytest
import torch

import tritonkit as tk
from helpers import assert_compiled_matches_eager, assert_graph_replay_matches_eager
from tritonkit import registry, testing
from tritonkit.registry import KernelSpec

norm_module = importlib.import_module("tritonkit.ops.norm")  # the launchers


def _inputs(device, dtype=torch.float32, rows=6, n=32):
    x = torch.randn(rows, n, device=device, dtype=dtype)
    residual = torch.randn(rows, n, device=device, dtype=dtype)
    weight = torch.randn(n, device=device, dtype=dtype)
    bias = torch.randn(n, device=device, dtype=dtype)
    return x, residual, weight, bias


@pytest.mark.parametrize("norm", ["rms_norm", "layer_norm"])
def test_compiles_fullgraph_with_backward(norm, device):
    op = getattr(tk.ops, norm)

    def block(x, residual, weight, bias):
        y, h = op(x, weight, bias, residual=residual, prenorm=True, residual_in_fp32=True)
        return (y.float() * 2).sum() + h.sum()

    assert_compiled_matches_eager(block, [t.requires_grad_() for t in _inputs(device)], device)


@pytest.mark.parametrize("norm", ["rms_norm", "layer_norm"])
@pytest.mark.parametrize("n", [64, 20000], ids=["whole-rows", "split-rows"])
def test_forward_without_gradient_stores_no_statistics(norm, n, device):
    """Where no gradient is needed the forward skips the backward's mean and rstd, and gives the training
    forward's output bit for bit."""
    x, residual, weight, bias = _inputs(device, rows=5, n=n)
    op = getattr(tk.ops, norm)
    with torch.no_grad():
        y_inference = op(x, weight, bias, residual=residual)
    y_training = op(x, weight.requires_grad_(), bias, residual=residual)
    assert y_training.grad_fn is not None and torch.equal(y_inference, y_training.detach())
    y, _, mean, rstd = norm_module.norm_fwd_launch(x, weight, bias, residual, 1e-5, 0.0, norm == "rms_norm", False,
                                                   False, store_stats=False)  # fmt: skip
    assert mean is None and rstd is None and not y.isnan().any()


@pytest.mark.parametrize("n", [64, 20000])
def test_weight_and_bias_gradients_are_deterministic(n, device):
    x, residual, weight, bias = (t.requires_grad_() for t in _inputs(device, rows=37, n=n))
    grads = []
    for _ in range(2):
        y = tk.ops.layer_norm(x, weight, bias, residual=residual)
        grads.append(torch.autograd.grad(y, (weight, bias), torch.ones_like(y)))
    assert all(torch.equal(a, b) for a, b in zip(*grads, strict=True))


@pytest.mark.parametrize("norm", ["rms_norm", "layer_norm"])
@pytest.mark.parametrize("residual_dtype", [torch.float32, torch.float16])
def test_residual_gradient_of_its_own_dtype_or_shared_with_x(norm, residual_dtype, device):
    """d(residual) is d(x): a tensor of its own (written by the kernel) when the residual stream has
    another dtype than x (fp32 here, as mamba_ssm keeps it), the same tensor when the dtypes agree.
    Both against float64, through .backward() into leaves."""
    x, _, weight, bias = _inputs(device, dtype=torch.float16, rows=5, n=48)
    residual = torch.randn(5, 48, device=device, dtype=residual_dtype)
    leaves = [t.requires_grad_() for t in (x, residual, weight, bias)]
    op = getattr(tk.ops, norm)
    y, h = op(x, weight, bias, residual=residual, prenorm=True, residual_in_fp32=True)
    upstream_y, upstream_h = torch.randn_like(y), torch.randn_like(h)
    ((y.float() * upstream_y).sum() + (h * upstream_h).sum()).backward()
    exact = [t.detach().double().requires_grad_() for t in leaves]
    reference = registry.get(norm).reference
    y64, h64 = reference(exact[0], exact[2], exact[3], residual=exact[1], prenorm=True)
    ((y64 * upstream_y.double()).sum() + (h64 * upstream_h.double()).sum()).backward()
    assert x.grad.dtype == torch.float16 and residual.grad.dtype == residual_dtype
    for ours, theirs in zip(leaves, exact, strict=True):
        torch.testing.assert_close(ours.grad.double(), theirs.grad, rtol=1e-2, atol=2e-2)


@pytest.mark.parametrize("norm", ["rms_norm", "layer_norm"])
@pytest.mark.parametrize("ahead", [False, True])
def test_shared_wide_backward_in_steps(norm, ahead, device, monkeypatch):
    """The one-launch wide backward (column blocks sharing each row's terms), each step's parts published in
    turn or one step ahead, over row groups of several steps, the last step partial: against float64. The
    interpreter runs programs one at a time, so there a row has one column block (whose wait is on itself); on
    the GPU three (on the H200, 301 rows in 44 groups of 7 leave the last group empty)."""
    cpu = device == "cpu"
    n, block, rows = (96, 128, 23) if cpu else (3 * 64 - 5, 64, 301)
    plan = norm_module.norm_launch_plan
    monkeypatch.setattr(
        norm_module, "norm_launch_plan", lambda *a, **k: dataclasses.replace(plan(*a, **k), bwd_single_pass=False)
    )
    monkeypatch.setattr(norm_module, "shared_wide_tile", lambda *args: (block, 2, 4, 1, ahead))
    monkeypatch.setattr(norm_module, "waits_safely", lambda n_blocks, device: True)
    x, residual, weight, bias = (t.requires_grad_() for t in _inputs(device, rows=rows, n=n))
    op = getattr(tk.ops, norm)
    upstream = torch.randn(rows, n, device=device)
    y = op(x, weight, bias, residual=residual)
    grads = torch.autograd.grad(y, (x, residual, weight, bias), upstream)
    exact = [t.detach().double().requires_grad_() for t in (x, residual, weight, bias)]
    y64 = registry.get(norm).reference(exact[0], exact[2], exact[3], residual=exact[1])
    expected = torch.autograd.grad(y64, exact, upstream.double())
    for ours, theirs in zip(grads, expected, strict=True):
        torch.testing.assert_close(ours.double(), theirs, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("norm", ["rms_norm", "layer_norm"])
@pytest.mark.parametrize(("n", "dtype"), [(1024, torch.bfloat16), (2048, torch.bfloat16), (1024, torch.float32),
                                         (2048, torch.float32)])  # fmt: skip
def test_backward_of_many_rows(norm, n, dtype, device, monkeypatch):
    """From MANY_ROWS rows the backward takes configurations of its own (fewer programs, deeper pipelines), checked
    like any registry case: forward and every gradient against float64. On the CPU MANY_ROWS is lowered to the
    case's rows so that the interpreter runs those configurations too; on the GPU there are MANY_ROWS + 3 rows, so
    where a step holds several rows, the last of the interleaved steps is partly masked."""
    rows = 37 if device == "cpu" else norm_module.MANY_ROWS + 3
    monkeypatch.setattr(norm_module, "MANY_ROWS", min(rows, norm_module.MANY_ROWS))
    plan, chosen = norm_module.norm_launch_plan, []

    def recording_plan(*args, many_rows=False, **kwargs):
        chosen.append(many_rows)
        return plan(*args, many_rows=many_rows, **kwargs)

    monkeypatch.setattr(norm_module, "norm_launch_plan", recording_plan)
    case = {"rows": rows, "n": n, "bias": norm == "layer_norm", "residual": True}
    result = testing.run_case(registry.get(norm), case, dtype, device, grad_mode="random")
    assert result.ok, result.explain()
    assert chosen[-1] is True  # the backward's plan was the many-rows one


@pytest.mark.parametrize("norm", ["rms_norm", "layer_norm"])
def test_backward_in_blocks_of_rows(norm, device, monkeypatch):
    """The single-pass backward with a block of rows per program (bwd_interleaved=False, as bf16 LayerNorm at 16384
    takes it), two rows a step. On the CPU's four programs 9 rows make blocks of three, each ending in a partial
    step, and leave the last program none; on the H200's 132 programs 4099 rows make blocks of 32, one of 3 (a
    partial step), and leave three programs none. Against float64."""
    rows, n = (9, 40) if device == "cpu" else (4099, 1000)
    plan = norm_module.norm_launch_plan
    blocks = dict(bwd_interleaved=False, bwd_programs_per_sm=1, bwd_warps=4, bwd_rows=2, bwd_stages=1)
    monkeypatch.setattr(norm_module, "norm_launch_plan", lambda *a, **k: dataclasses.replace(plan(*a, **k), **blocks))
    monkeypatch.setattr(norm_module, "ONE_PROGRAM_BACKWARD", 0)  # else the CPU's few rows take one program
    case = {"rows": rows, "n": n, "bias": norm == "layer_norm", "residual": True}
    result = testing.run_case(registry.get(norm), case, torch.float32, device, grad_mode="random")
    assert result.ok, result.explain()


def test_layer_norm_backward_plans_at_16384_depend_on_the_bias():
    """bf16 LayerNorm at 16384: with a bias one 8-warp program per SM over a block of rows, without one RMSNorm's
    16 warps and interleaved steps (the measured tables); RMSNorm keeps interleaved steps either way."""
    with_bias = norm_module.norm_launch_plan(16384, 2, is_rms=False, has_bias=True)
    without = norm_module.norm_launch_plan(16384, 2, is_rms=False, has_bias=False)
    rms = norm_module.norm_launch_plan(16384, 2, is_rms=True, has_bias=True)
    assert (with_bias.bwd_warps, with_bias.bwd_interleaved) == (8, False)
    assert (without.bwd_warps, without.bwd_interleaved) == (16, True)
    assert (rms.bwd_warps, rms.bwd_interleaved) == (16, True)


def _broken(name, fn):
    return KernelSpec(**{**registry.get(name).__dict__, "name": f"broken_{name}", "fn": fn})


@pytest.mark.parametrize(
    ("label", "fn", "case"),
    [
        ("eps ten times too large",
         lambda x, w, bias=None, eps=1e-6, **kw: tk.ops.rms_norm(x, w, bias, eps=10 * eps, **kw),
         {"rows": 9, "n": 64, "scale": 1e-3, "eps": 1e-5}),
        ("residual dropped",
         lambda x, w, bias=None, residual=None, **kw: tk.ops.rms_norm(x, w, bias, **kw),
         {"rows": 4, "n": 100, "residual": True}),
        ("offset ignored",
         lambda x, w, bias=None, offset=0.0, **kw: tk.ops.rms_norm(x, w, bias, **kw),
         {"rows": 5, "n": 64, "offset": 1.0}),
    ],
)  # fmt: skip
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_checker_catches_wrong_norms(label, fn, case, dtype):
    assert not testing.run_case(_broken("rms_norm", fn), case, dtype, "cpu").ok, label


@pytest.mark.parametrize(("ours", "theirs"), [(tk.nn.RMSNorm, torch.nn.RMSNorm), (tk.nn.LayerNorm, torch.nn.LayerNorm)])
@pytest.mark.parametrize("shape", [8, (4, 8)])
def test_modules_are_drop_in(ours, theirs, shape, device):
    reference = theirs(shape, device=device)
    with torch.no_grad():
        for parameter in reference.parameters():
            parameter.normal_()
    module = ours(shape, device=device)
    module.load_state_dict(reference.state_dict())
    assert list(module.state_dict()) == list(reference.state_dict())
    x = torch.randn(3, 5, *((shape,) if isinstance(shape, int) else shape), device=device, requires_grad=True)
    torch.testing.assert_close(module(x), reference(x), rtol=1e-5, atol=1e-5)
    grad = torch.randn_like(x)
    ours_grads = torch.autograd.grad(module(x), [x, *module.parameters()], grad)
    theirs_grads = torch.autograd.grad(reference(x), [x, *reference.parameters()], grad)
    for a, b in zip(ours_grads, theirs_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_module_rejects_wrong_trailing_shape(device):
    with pytest.raises(ValueError, match=r"trailing dimensions must be \(4, 8\), got shape \(3, 8, 4\)"):
        tk.nn.RMSNorm((4, 8), device=device)(torch.randn(3, 8, 4, device=device))


def _call(norm, device, **changes):
    x, residual, weight, bias = _inputs(device)
    args = {"x": x, "weight": weight, "bias": bias, "residual": residual, **changes}
    return getattr(tk.ops, norm)(**args)


BAD = [
    (
        {"weight": torch.ones(31)},
        ValueError,
        r"weight must have shape \(32,\) to match x's last dimension, got \(31,\)",
    ),
    ({"bias": torch.ones(2, 16)}, ValueError, r"bias must have shape \(32,\) .* got \(2, 16\)"),
    ({"residual": torch.ones(6, 31)}, ValueError, r"residual must have x's shape \(6, 32\), got \(6, 31\)"),
    ({"x": torch.ones(6, 32, dtype=torch.int32)}, TypeError, "x must have dtype in .* got torch.int32"),
    ({"weight": torch.ones(32, dtype=torch.int64)}, TypeError, "weight must have dtype in .* got torch.int64"),
    ({"eps": 0.0}, ValueError, "eps must be a positive number, got 0.0"),
    ({"eps": -1e-5}, ValueError, "eps must be a positive number, got -1e-05"),
    ({"x": torch.ones(6, 0)}, ValueError, "x's last dimension .* must be non-empty"),
    ({"x": torch.tensor(1.0)}, ValueError, "x must have at least one dimension"),
]


@pytest.mark.parametrize("norm", ["rms_norm", "layer_norm"])
@pytest.mark.parametrize(("changes", "error", "match"), BAD, ids=[m[:25] for _, _, m in BAD])
def test_bad_input_names_the_argument(norm, changes, error, match, device):
    changes = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in changes.items()}
    with pytest.raises(error, match=f"{norm}: {match}" if error is ValueError else match):
        _call(norm, device, **changes)


def test_offset_needs_a_weight(device):
    with pytest.raises(ValueError, match=r"rms_norm: offset=1.0 scales the weight, but weight is None"):
        tk.ops.rms_norm(torch.randn(2, 8, device=device), None, offset=1.0)


@pytest.mark.parametrize("norm", ["rms_norm", "layer_norm"])
def test_strided_weight_and_bias(norm, device):
    x = torch.randn(5, 32, device=device, requires_grad=True)
    weight = torch.randn(64, device=device)[::2].requires_grad_()  # stride 2
    bias = torch.randn(32, 2, device=device)[:, 0].requires_grad_()  # stride 2
    ours = getattr(tk.ops, norm)(x, weight, bias)
    reference = (registry.get(norm).reference)(x.double(), weight.double(), bias.double())
    torch.testing.assert_close(ours, reference.float(), rtol=1e-5, atol=1e-5)
    grads = torch.autograd.grad(ours.sum(), (x, weight, bias))
    expected = torch.autograd.grad(reference.sum(), (x, weight, bias))
    for a, b in zip(grads, expected, strict=True):
        torch.testing.assert_close(a, b.float(), rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize(("n", "bias"), [(64, False), (4096, True), (20000, True)])
def test_backward_allocates_its_outputs_and_one_workspace(n, bias):
    """The issue's budget, on each backward path (one program, per-program shares, the wide two
    phases): the gradients and at most one fp32 workspace, nothing else. On the GPU only: the
    interpreter makes tensors of its own while a kernel runs."""
    device = "cuda"
    from torch.utils._python_dispatch import TorchDispatchMode

    allocations = []

    class CountAllocations(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.__name__.split(".")[0] in ("empty", "empty_strided", "empty_like", "zeros", "zeros_like"):
                allocations.append(func.__name__)
            return func(*args, **(kwargs or {}))

    x, _, weight, bias_tensor = _inputs(device, rows=40, n=n)
    bias_tensor = bias_tensor if bias else None
    _, _, mean, rstd = norm_module.norm_fwd_launch(x, weight, bias_tensor, None, 1e-5, 0.0, False, False, False)
    with CountAllocations():
        grads = norm_module.norm_bwd_launch(torch.randn_like(x), None, x, weight, None, mean, rstd, 0.0, False, bias)
    outputs = sum(g is not None for g in grads)  # dx, dweight (and dbias)
    assert outputs == 2 + bias and len(allocations) <= outputs + 1, allocations


@pytest.mark.gpu
@pytest.mark.parametrize("norm", ["rms_norm", "layer_norm"])
@pytest.mark.parametrize(
    ("n", "with_bias"),
    [(64, True), (1024, True), (20000, True), (20000, False)],
    ids=["one-program", "per-program-sums", "wide", "wide-rmsnorm-one-launch"],
)
def test_cuda_graph_capture_forward_and_backward(norm, n, with_bias):
    """Every backward path in bf16 with a residual: one program; per-program shares and their sum; wide rows in two
    phases, or (RMSNorm without a bias) in one launch whose column blocks wait on counters zeroed in the graph."""
    op = getattr(tk.ops, norm)

    def step(x, residual, weight, *bias_and_upstream):
        *bias, upstream = bias_and_upstream
        leaves = [t.requires_grad_() for t in (x, residual, weight, *bias)]
        y = op(x, weight, *(bias or [None]), residual=residual)
        return (y, *torch.autograd.grad(y, leaves, upstream))

    x, residual, weight, bias = _inputs("cuda", dtype=torch.bfloat16, rows=300, n=n)
    inputs = [x, residual, weight, *([bias] if with_bias else []), torch.randn_like(x)]
    assert_graph_replay_matches_eager(step, inputs)
