"""Fused add + RMSNorm / LayerNorm beyond the registry sweep: compile without graph breaks,
determinism, every launch plan kind through the launchers, the checker's power to catch wrong kernels,
drop-in modules, bad input."""

import pytest
import torch

import tritonkit as tk
from helpers import RecordingKernel, assert_compiled_matches_eager, assert_graph_replay_matches_eager
from tritonkit import catalog, testing
from tritonkit._core.device import arch, sm_count
from tritonkit._core.ints import cdiv
from tritonkit.ops.norm import launch
from tritonkit.ops.norm.launch import norm_bwd, norm_fwd
from tritonkit.ops.norm.plan import (
    MANY_ROWS,
    MAX_SINGLE_PASS,
    BwdGivenPlan,
    BwdRowsPlan,
    BwdSharedPlan,
    FwdSplitRowPlan,
    fallback_bwd_plan,
    fallback_fwd_plan,
    given_plan,
    norm_bwd_plan,
)
from tritonkit.registry import KernelSpec

NORMS = ["rms_norm", "layer_norm"]
GRAD_TOL = dict(rtol=1e-4, atol=1e-4)  # fp32 against float64: the norms' fp32 tolerance (spec._norm_tolerance)
COLUMNS_BWD = "_norm_bwd_columns_kernel"  # the wide backward by column blocks, the row terms SHARED or given
ROW_SUMS_BWD = "_norm_bwd_row_sums_kernel"  # the two-phase form's first phase
TWO_PHASE_BWD = [(ROW_SUMS_BWD, None), (COLUMNS_BWD, False)]  # (kernel, SHARED) of each launch
FORWARD_OUTPUTS, GRADIENTS = ("y", "h", "mean", "rstd"), ("dx", "dweight", "dbias")


def _inputs(device, dtype=torch.float32, rows=6, n=32):
    x = torch.randn(rows, n, device=device, dtype=dtype)
    residual = torch.randn(rows, n, device=device, dtype=dtype)
    weight = torch.randn(n, device=device, dtype=dtype)
    bias = torch.randn(n, device=device, dtype=dtype)
    return x, residual, weight, bias


def _spy_on_kernels(monkeypatch, *names):
    """The list each launch of the kernels ``names`` (in norm.launch) is recorded in: (name, grid, kwargs)."""
    log = []
    for name in names:

        def note(grid, kwargs, name=name):
            return name, grid, kwargs

        monkeypatch.setattr(launch, name, RecordingKernel(getattr(launch, name), log, note))
    return log


def _forward(norm, inputs, plan=None, eps=1e-5):
    """y, h (stored), mean (empty for RMSNorm) and rstd through norm_fwd."""
    x, residual, weight, bias = inputs
    return norm_fwd(x, weight, bias, residual, eps, 0.0, norm == "rms_norm", True, False, plan=plan)


def _backward(norm, inputs, forward, upstream, plan=None):
    """d(x + residual) (one tensor: the residual has x's dtype), dweight and dbias (empty without a bias) through
    norm_bwd, from the forward's statistics as the op passes them (no mean for RMSNorm)."""
    x, residual, weight, bias = inputs
    _, _, mean, rstd = forward
    is_rms = norm == "rms_norm"
    dx, dres, dw, db = norm_bwd(upstream, None, x, weight, residual, None if is_rms else mean, rstd, 0.0, is_rms,
                                bias is not None, plan=plan)  # fmt: skip
    assert dres.numel() == 0  # shared with dx
    return dx, dw, db


def _float64(norm, inputs, upstream, eps=1e-5):
    """What _forward and _backward return, in float64 from the registry's reference (h, mean and rstd from h)."""
    x, residual, weight, bias = (t.detach().double().requires_grad_() if t is not None else None for t in inputs)
    y, h = catalog.get(norm).reference(x, weight, bias, residual=residual, eps=eps, prenorm=True)
    leaves = [t for t in (x, residual, weight, bias) if t is not None]
    dx, dres, dw, *db = torch.autograd.grad(y, leaves, upstream.double())
    assert torch.equal(dx, dres)
    h = h.detach()
    if norm == "rms_norm":
        mean, var = h.new_empty(0), h.pow(2).mean(-1)
    else:
        mean = h.mean(-1)
        var = (h - mean[:, None]).pow(2).mean(-1)
    return (y.detach(), h, mean, torch.rsqrt(var + eps)), (dx, dw, db[0] if db else h.new_empty(0))


def _assert_matches(names, ours, theirs):
    """Each of ``ours`` (fp32) against float64 within GRAD_TOL; NaN (the conftest's poison) never passes."""
    for name, mine, exact in zip(names, ours, theirs, strict=True):
        assert mine.shape == exact.shape, f"{name}: shape {tuple(mine.shape)}, expected {tuple(exact.shape)}"
        torch.testing.assert_close(mine.double(), exact, **GRAD_TOL, msg=lambda m, name=name: f"{name}: {m}")


def _assert_launcher_matches_float64(norm, inputs, upstream, fwd_plan=None, bwd_plan=None):
    """Forward (y, h, mean, rstd) and backward (dx, dweight, dbias) through the launchers with these plans, against
    float64; returns what the launchers gave."""
    forward = _forward(norm, inputs, plan=fwd_plan)
    grads = _backward(norm, inputs, forward, upstream, plan=bwd_plan)
    expected_forward, expected_grads = _float64(norm, inputs, upstream)
    _assert_matches(FORWARD_OUTPUTS, forward, expected_forward)
    _assert_matches(GRADIENTS, grads, expected_grads)
    return (*forward, *grads)


@pytest.mark.parametrize("norm", NORMS)
def test_compiles_fullgraph_with_backward(norm, device):
    op = getattr(tk.ops, norm)

    def block(x, residual, weight, bias):
        y, h = op(x, weight, bias, residual=residual, prenorm=True, residual_in_fp32=True)
        return (y.float() * 2).sum() + h.sum()

    assert_compiled_matches_eager(block, [t.requires_grad_() for t in _inputs(device)], device)


@pytest.mark.parametrize("norm", NORMS)
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
    eps = 1e-6 if norm == "rms_norm" else 1e-5  # the ops' defaults
    y, h, mean, rstd = norm_fwd(x, weight, bias, residual, eps, 0.0, norm == "rms_norm", False, False,
                                store_stats=False)  # fmt: skip
    assert h.numel() == mean.numel() == rstd.numel() == 0 and torch.equal(y, y_inference)


@pytest.mark.parametrize("n", [64, 20000])
def test_weight_and_bias_gradients_are_deterministic(n, device):
    x, residual, weight, bias = (t.requires_grad_() for t in _inputs(device, rows=37, n=n))
    grads = []
    for _ in range(2):
        y = tk.ops.layer_norm(x, weight, bias, residual=residual)
        grads.append(torch.autograd.grad(y, (weight, bias), torch.ones_like(y)))
    assert all(torch.equal(a, b) for a, b in zip(*grads, strict=True))


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("residual_dtype", [torch.float32, torch.float16], ids=["fp32-residual", "fp16-residual"])
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
    reference = catalog.get(norm).reference
    y64, h64 = reference(exact[0], exact[2], exact[3], residual=exact[1], prenorm=True)
    ((y64 * upstream_y.double()).sum() + (h64 * upstream_h.double()).sum()).backward()
    assert x.grad.dtype == torch.float16 and residual.grad.dtype == residual_dtype
    for ours, theirs in zip(leaves, exact, strict=True):
        torch.testing.assert_close(ours.grad.double(), theirs.grad, rtol=1e-2, atol=2e-2)


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("ahead", [False, True], ids=["in-turn", "ahead"])
def test_shared_wide_backward_in_steps(norm, ahead, device, monkeypatch):
    """The one-launch wide backward (BwdSharedPlan: column blocks sharing each row's terms), each step's parts
    published in turn or one step ahead, over row groups of several steps, the last step partial: against float64.
    The interpreter runs programs one at a time, so there a row has one column block (whose wait is on itself) and
    the launcher is told that such a wait is safe; on the GPU three (on the H100 and H200, 301 rows in 44 groups of
    7 leave the last group empty), run with spin waits allowed (the column blocks sharing the terms) and with
    tk.set_spin_waits(False) (the two phases of given_plan instead), both right."""
    cpu = device == "cpu"
    n, block, rows = (96, 128, 23) if cpu else (3 * 64 - 5, 64, 301)
    if cpu:
        monkeypatch.setattr(launch, "waits_safely", lambda n_blocks, device: n_blocks == 1)
    plan = BwdSharedPlan(block_n=block, rows=2, warps=4, programs_per_sm=1, ahead=ahead)
    inputs = _inputs(device, rows=rows, n=n)
    upstream = torch.randn(rows, n, device=device)
    launches = _spy_on_kernels(monkeypatch, ROW_SUMS_BWD, COLUMNS_BWD)
    for spin_waits in (True,) if cpu else (True, False):
        launches.clear()
        with tk.set_spin_waits(spin_waits):
            _assert_launcher_matches_float64(norm, inputs, upstream, bwd_plan=plan)
        if spin_waits:  # one launch: a program per column block and row group (CPU: 4 groups of 6 rows)
            n_blocks = cdiv(n, block)
            groups = min(rows, sm_count(torch.device(device)) // n_blocks)
            assert [(name, grid, kw["SHARED"], kw["AHEAD"]) for name, grid, kw in launches] == [
                (COLUMNS_BWD, (n_blocks, groups), True, ahead)
            ]
        else:
            assert [(name, kw.get("SHARED")) for name, _, kw in launches] == TWO_PHASE_BWD


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("ahead", [False, True], ids=["in-turn", "ahead"])
def test_shared_wide_backward_takes_two_phases_where_programs_may_not_wait(norm, ahead, monkeypatch):
    """A shared plan whose rows span three column blocks, under the interpreter (which runs programs one at a time,
    so they may never wait for each other): the launcher runs given_plan's two phases instead (each row's terms,
    then column blocks with those terms given), never the shared form, and the gradients are right."""
    n, rows = 3 * 64 - 5, 23
    plan = BwdSharedPlan(block_n=64, rows=2, warps=4, programs_per_sm=1, ahead=ahead)
    inputs = _inputs("cpu", rows=rows, n=n)
    launches = _spy_on_kernels(monkeypatch, ROW_SUMS_BWD, COLUMNS_BWD)
    _assert_launcher_matches_float64(norm, inputs, torch.randn(rows, n), bwd_plan=plan)
    assert [(name, kw.get("SHARED")) for name, _, kw in launches] == TWO_PHASE_BWD
    fallback = given_plan(4, arch(torch.device("cpu")))
    assert launches[1][2]["BLOCK_N"] == fallback.block_n and launches[1][2]["ROWS"] == fallback.rows


@pytest.mark.parametrize("norm", NORMS)
def test_split_row_forward_in_one_or_two_launches(norm, device, monkeypatch):
    """Rows wider than MAX_SINGLE_PASS (FwdSplitRowPlan): three 8192-column slices, the last partial, written in
    2048-column pieces; a ramp along each row makes the slices differ in mean. One launch whose slices wait for each
    other (GPU, spin waits allowed), or two (statistics, then output) with tk.set_spin_waits(False) and always under
    the interpreter: y, h, mean and rstd against float64, and on the GPU bit for bit the same either way."""
    cpu = device == "cpu"
    rows, n = (5 if cpu else 301), 20000
    assert n > MAX_SINGLE_PASS
    plan = FwdSplitRowPlan(slice=8192, warps=4, piece=2048)
    x, residual, weight, bias = _inputs(device, rows=rows, n=n)
    inputs = (x + torch.linspace(-4.0, 4.0, n, device=device), residual, weight, bias)
    expected, _ = _float64(norm, inputs, torch.zeros(rows, n, device=device))
    launches = _spy_on_kernels(monkeypatch, "_norm_fwd_split_row_kernel")
    results = []
    for spin_waits in (True,) if cpu else (True, False):
        launches.clear()
        with tk.set_spin_waits(spin_waits):
            results.append(_forward(norm, inputs, plan=plan))
        _assert_matches(FORWARD_OUTPUTS, results[-1], expected)
        phases = [3] if spin_waits and not cpu else [1, 2]
        assert [(kw["PHASES"], kw["BLOCK_N"], kw["SUB_N"], grid) for _, grid, kw in launches] == [
            (phase, 8192, 2048, (3 * rows,)) for phase in phases
        ]
    if not cpu:
        for name, one_launch, two_launches in zip(FORWARD_OUTPUTS, *results, strict=True):
            assert torch.equal(one_launch, two_launches), name


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize(("n", "dtype"), [(1024, torch.bfloat16), (2048, torch.bfloat16), (1024, torch.float32),
                                         (2048, torch.float32)], ids=["1024-bf16", "2048-bf16", "1024-fp32",
                                                                      "2048-fp32"])  # fmt: skip
def test_backward_of_many_rows(norm, n, dtype, device, monkeypatch):
    """From MANY_ROWS rows the backward takes the plans of its own table (fewer programs, deeper pipelines), checked
    like any registry case: forward and every gradient against float64; the launches show that the launcher took
    norm_bwd_plan(..., many_rows=True). On the CPU MANY_ROWS is lowered to the case's rows so that the interpreter
    runs those plans too; on the GPU there are MANY_ROWS + 3 rows, so where a step holds several rows, the last of
    the interleaved steps is partly masked."""
    rows = 37 if device == "cpu" else MANY_ROWS + 3
    monkeypatch.setattr(launch, "MANY_ROWS", min(rows, MANY_ROWS))
    plan_args = (n, dtype.itemsize, norm == "rms_norm", norm == "layer_norm")
    device_arch = arch(torch.device(device))
    many, usual = (norm_bwd_plan(*plan_args, many_rows, device_arch) for many_rows in (True, False))

    def launch_of(plan):  # (grid, rows a step, warps, interleaved) of the backward's one launch with this plan
        groups = min(cdiv(rows, plan.rows), plan.programs_per_sm * sm_count(torch.device(device)))
        return ((groups,), plan.rows, plan.warps, plan.interleaved)

    assert isinstance(many, BwdRowsPlan) and (many == usual or launch_of(many) != launch_of(usual))
    launches = _spy_on_kernels(monkeypatch, "_norm_bwd_kernel")
    case = {"rows": rows, "n": n, "bias": norm == "layer_norm", "residual": True}
    result = testing.run_case(catalog.get(norm), case, dtype, device, grad_mode="random")
    assert result.ok, result.explain()
    recorded = [(grid, kw["ROWS"], kw["num_warps"], kw["INTERLEAVED"]) for _, grid, kw in launches]
    assert recorded == [launch_of(many)]  # the backward's plan was the many-rows one


@pytest.mark.parametrize("norm", NORMS)
def test_backward_in_blocks_of_rows(norm, device, monkeypatch):
    """The single-pass backward with a block of rows per program (BwdRowsPlan(interleaved=False), as bf16 LayerNorm
    with a bias at 16384 takes it), two rows a step. On the CPU's four programs 9 rows make blocks of three, each
    ending in a partial step, and leave the last program none; on the H100's and H200's 132 programs 4099 rows make
    blocks of 32, one of 3 (a partial step), and leave three programs none. Forward and gradients against float64."""
    rows, n = (9, 40) if device == "cpu" else (4099, 1000)
    plan = BwdRowsPlan(programs_per_sm=1, warps=4, rows=2, stages=1, interleaved=False)
    x, residual, weight, bias = _inputs(device, rows=rows, n=n)
    inputs = (x, residual, weight, bias if norm == "layer_norm" else None)
    launches = _spy_on_kernels(monkeypatch, "_norm_bwd_kernel")
    _assert_launcher_matches_float64(norm, inputs, torch.randn(rows, n, device=device), bwd_plan=plan)
    groups = min(cdiv(rows, 2), sm_count(torch.device(device)))
    assert [(grid, kw["INTERLEAVED"], kw["ROWS"]) for _, grid, kw in launches] == [((groups,), False, 2)]


def test_layer_norm_backward_plans_at_16384_depend_on_the_bias():
    """bf16 LayerNorm at 16384: with a bias one 8-warp program per SM over a block of rows, without one RMSNorm's
    16 warps and interleaved steps (sm90's measured tables); RMSNorm keeps interleaved steps either way."""
    with_bias = norm_bwd_plan(16384, 2, False, True, False, "sm90")
    without = norm_bwd_plan(16384, 2, False, False, False, "sm90")
    rms = [norm_bwd_plan(16384, 2, True, has_bias, False, "sm90") for has_bias in (True, False)]
    assert all(isinstance(plan, BwdRowsPlan) for plan in (with_bias, without, *rms))
    assert (with_bias.programs_per_sm, with_bias.warps, with_bias.interleaved) == (1, 8, False)
    assert (without.warps, without.interleaved) == (16, True)
    assert all((plan.warps, plan.interleaved) == (16, True) for plan in rms)


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("n", [7, 1000, 3000, 20000], ids=lambda n: f"{n}-cols")
def test_fallback_plans(norm, n, device, monkeypatch):
    """The analytic plans a GPU never measured takes (fallback_fwd_plan, fallback_bwd_plan; the interpreter follows
    sm90's tables, so only this test runs them there): many rows a program, one, and rows split across programs
    forward; row groups of whole rows, and the two wide phases backward. fp32 forward and gradients against
    float64, the backward over the plan's row groups (a plan given, few rows do not take one program)."""
    fwd_plan, bwd_plan = fallback_fwd_plan(n), fallback_bwd_plan(n)
    assert isinstance(fwd_plan, FwdSplitRowPlan) == isinstance(bwd_plan, BwdGivenPlan) == (n > MAX_SINGLE_PASS)
    rows = 9 if device == "cpu" else 1031
    inputs = _inputs(device, rows=rows, n=n)
    _assert_launcher_matches_float64(norm, inputs, torch.randn(rows, n, device=device), fwd_plan, bwd_plan)


def _broken(name, fn):
    return KernelSpec(**{**catalog.get(name).__dict__, "name": f"broken_{name}", "fn": fn})


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
    reference = (catalog.get(norm).reference)(x.double(), weight.double(), bias.double())
    torch.testing.assert_close(ours, reference.float(), rtol=1e-5, atol=1e-5)
    grads = torch.autograd.grad(ours.sum(), (x, weight, bias))
    expected = torch.autograd.grad(reference.sum(), (x, weight, bias))
    for a, b in zip(grads, expected, strict=True):
        torch.testing.assert_close(a, b.float(), rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize(("n", "bias"), [(64, False), (4096, True), (20000, True)])
def test_backward_allocates_its_outputs_and_one_workspace(n, bias):
    """The issue's budget, on each backward path (one program, per-program shares, the wide rows): the gradients and
    at most one fp32 workspace, nothing else (absent outputs are empty tensors, which hold no memory). On the GPU
    only: the interpreter makes tensors of its own while a kernel runs."""
    device = "cuda"
    from torch.utils._python_dispatch import TorchDispatchMode

    allocations = []

    class CountAllocations(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            allocating = func.__name__.split(".")[0] in ("empty", "empty_strided", "empty_like", "zeros", "zeros_like")
            if allocating and out.numel() > 0:
                allocations.append(func.__name__)
            return out

    x, _, weight, bias_tensor = _inputs(device, rows=40, n=n)
    bias_tensor = bias_tensor if bias else None
    _, _, mean, rstd = norm_fwd(x, weight, bias_tensor, None, 1e-5, 0.0, False, False, False)
    with CountAllocations():
        grads = norm_bwd(torch.randn_like(x), None, x, weight, None, mean, rstd, 0.0, False, bias)
    outputs = sum(g.numel() > 0 for g in grads)  # dx, dweight (and dbias)
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
