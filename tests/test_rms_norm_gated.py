"""The gated RMSNorm (tk.ops.rms_norm_gated, tk.nn.RMSNormGated) beyond the registry sweep: mamba_ssm's
test_layernorm_gated parametrizations for the RMSNorm against a float64 reference, the module as mamba2's, compile,
the launchers' plans, bad input."""

import pytest
import torch
import torch.nn.functional as F

import tritonkit as tk
from helpers import assert_compiled_matches_eager
from tritonkit import catalog
from tritonkit.ops.gated_norm.launch import rms_norm_gated_bwd, rms_norm_gated_fwd
from tritonkit.ops.gated_norm.plan import GatedBwdPlan, GatedFwdPlan


def _reference(*args, **kwargs):
    return catalog.get("rms_norm_gated").reference(*args, **kwargs)


# mamba's flags, less its skip (without z norm_before_gate changes nothing), by the inputs' dtype
_MAMBA_FLAGS = [(before, group, has_z) for before in (True, False) for group in (False, True) for has_z in (False, True)
                if has_z or before]  # fmt: skip


@pytest.mark.parametrize(("norm_before_gate", "has_group", "has_z"), _MAMBA_FLAGS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_mamba_layernorm_gated_checks(norm_before_gate, has_group, has_z, dtype, device):
    """mamba_ssm's test for the RMSNorm (a float32 weight, fp16 inputs; here every dtype): output and every gradient
    no further from the float64 reference than twice torch's own computation in the inputs' dtypes, plus mamba's
    atol (for bf16 the one flash-attention uses), under a random upstream gradient."""
    atol = {torch.float32: 1e-5, torch.float16: 8e-3, torch.bfloat16: 5e-2}[dtype]
    d, group_size = 64, 16 if has_group else None
    x = torch.randn(2, 3, d, dtype=dtype, device=device)
    z = torch.randn(2, 3, d, dtype=dtype, device=device) if has_z else None
    weight = torch.randn(d, dtype=torch.float32, device=device)
    leaves = [(t.detach().clone().requires_grad_() if t is not None else None) for t in (x, weight, z)]
    pts = [(t.detach().clone().requires_grad_() if t is not None else None) for t in (x, weight, z)]
    refs = [(t.detach().double().requires_grad_() if t is not None else None) for t in (x, weight, z)]
    options = dict(group_size=group_size, norm_before_gate=norm_before_gate, eps=1e-5)
    out = tk.ops.rms_norm_gated(*leaves, **options)
    out_pt = _reference(*pts, **options).to(dtype)
    out_ref = _reference(*refs, **options)
    assert out.dtype == dtype

    def bound(pt, ref):  # the bf16 store: the interpreter truncates where the GPU rounds (docs/interpreter.md)
        truncation = torch.finfo(torch.bfloat16).eps * ref.abs().max() if dtype == torch.bfloat16 else 0.0
        return 2 * (pt.double() - ref).abs().max() + atol + truncation

    assert (out.double() - out_ref).abs().max() <= bound(out_pt, out_ref)
    g = torch.randn_like(out)
    for o in (out, out_pt, out_ref):
        o.backward(g.to(o.dtype))
    for name, ours, pt, ref in zip(("x", "weight", "z"), leaves, pts, refs, strict=True):
        if ours is not None:
            assert (ours.grad.double() - ref.grad).abs().max() <= bound(pt.grad, ref.grad), name


def test_module_is_mamba2s_rmsnormgated():
    """tk.nn.RMSNormGated: mamba's constructor arguments and state_dict keys (weight, no bias), ones at start, the
    forward the function's."""
    norm = tk.nn.RMSNormGated(64, eps=1e-5, group_size=16, norm_before_gate=False, dtype=torch.float32)
    assert list(norm.state_dict()) == ["weight"] and norm.bias is None
    assert torch.equal(norm.weight, torch.ones(64))
    with torch.no_grad():
        norm.weight.normal_()
    x, z = torch.randn(4, 64), torch.randn(4, 64)
    expected = tk.ops.rms_norm_gated(x, norm.weight, z, group_size=16, norm_before_gate=False, eps=1e-5)
    assert torch.equal(norm(x, z), expected)
    torch.testing.assert_close(norm(x), _reference(x, norm.weight.detach(), group_size=16, eps=1e-5))
    assert "group_size=16" in repr(norm)


def test_forward_without_gradient_matches_training_forward():
    x, z, weight = torch.randn(5, 48), torch.randn(5, 48), torch.randn(48)
    with torch.no_grad():
        inference = tk.ops.rms_norm_gated(x, weight, z, group_size=12, norm_before_gate=False)
    training = tk.ops.rms_norm_gated(x.requires_grad_(), weight, z, group_size=12, norm_before_gate=False)
    assert torch.equal(inference, training.detach())


@pytest.mark.parametrize("norm_before_gate", [True, False])
def test_plans_through_the_launchers(norm_before_gate):
    """Several rows a program and a step, and row groups with partial sums, against the op's own plans."""
    x, z, w = torch.randn(9, 48), torch.randn(9, 48), torch.randn(48)
    y, rstd = rms_norm_gated_fwd(x, w, z, 12, norm_before_gate, 1e-6)
    y_plan, rstd_plan = rms_norm_gated_fwd(x, w, z, 12, norm_before_gate, 1e-6, plan=GatedFwdPlan(rows=4, warps=2))
    torch.testing.assert_close(y_plan, y, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(rstd_plan, rstd, rtol=1e-6, atol=1e-6)
    dy = torch.randn(9, 48)
    expected = rms_norm_gated_bwd(dy, x, w, z, rstd, 12, norm_before_gate)
    for plan in (GatedBwdPlan(programs_per_sm=1, warps=2, rows=2), GatedBwdPlan(programs_per_sm=2, warps=2, rows=4)):
        for ours, theirs in zip(rms_norm_gated_bwd(dy, x, w, z, rstd, 12, norm_before_gate, plan=plan), expected,
                                strict=True):  # fmt: skip
            torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


def test_compiles_fullgraph_with_backward(device):
    def block(x, weight, z):
        return (tk.ops.rms_norm_gated(x, weight, z, group_size=8, norm_before_gate=False) * 2).sum()

    inputs = [torch.randn(4, 32, device=device), torch.randn(32, device=device), torch.randn(4, 32, device=device)]
    assert_compiled_matches_eager(block, [t.requires_grad_() for t in inputs], device)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"weight": torch.randn(15)}, ValueError, r"weight must have shape \(16,\)"),
        ({"z": torch.randn(4, 8)}, ValueError, "z must have x's shape"),
        ({"z": torch.ones(4, 16, dtype=torch.int64)}, TypeError, "z must have dtype"),
        ({"group_size": 5}, ValueError, "group_size must be None or a positive int dividing x's last dimension 16"),
        ({"group_size": 0}, ValueError, "group_size must be"),
        ({"group_size": 4.0}, ValueError, "group_size must be"),
        ({"norm_before_gate": 1}, TypeError, "norm_before_gate must be a bool"),
        ({"eps": 0.0}, ValueError, "eps must be a positive number"),
    ],
    ids=lambda value: value if isinstance(value, str) else None,
)
def test_bad_input(kwargs, error, match):
    args = {"weight": torch.randn(16), "z": torch.randn(4, 16), **kwargs}
    weight, z = args.pop("weight"), args.pop("z")
    with pytest.raises(error, match=match):
        tk.ops.rms_norm_gated(torch.randn(4, 16), weight, z, **args)


def test_groups_wider_than_one_program_are_refused():
    with pytest.raises(ValueError, match=r"rms_norm_gated: group_size .* at most 16384"):
        tk.ops.rms_norm_gated(torch.randn(1, 16400), torch.randn(16400), group_size=None)


def test_silu_gate_is_the_one_torch_computes():
    """The gate is silu (not sigmoid): a case where they differ by far more than the tolerance."""
    x, z, w = torch.ones(1, 8), torch.full((1, 8), -3.0), torch.ones(8)
    torch.testing.assert_close(tk.ops.rms_norm_gated(x, w, z), F.silu(z), rtol=1e-5, atol=1e-6)
