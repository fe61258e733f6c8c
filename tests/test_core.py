"""Shared internals: the spin-wait setting, device architecture keys, the autograd factory's path per call."""

import os
import subprocess
import sys

import pytest
import torch

import tritonkit as tk
from tritonkit._core import device as device_facts
from tritonkit._core import row_sync


def test_spin_waits_setting_gates_the_one_launch_path(device):
    """Allowed by default (on a GPU a row of a few programs may wait), forbidden by set_spin_waits(False) until the
    `with` block ends; the interpreter never waits."""
    target = torch.device(device)
    assert row_sync.spin_waits_enabled()
    assert row_sync.waits_safely(2, target) == (device == "cuda")
    with tk.set_spin_waits(False):
        assert not row_sync.spin_waits_enabled() and not row_sync.waits_safely(2, target)
    assert row_sync.spin_waits_enabled() and row_sync.waits_safely(2, target) == (device == "cuda")
    tk.set_spin_waits(False)  # a plain call holds until changed back
    try:
        assert not row_sync.waits_safely(2, target)
    finally:
        tk.set_spin_waits(True)
    with pytest.raises(TypeError, match="set_spin_waits: enabled must be a bool, got int"):
        tk.set_spin_waits(0)


def test_spin_waits_off_from_the_environment():
    script = "from tritonkit._core import row_sync; print(row_sync.spin_waits_enabled())"
    env = {**os.environ, "TRITONKIT_SPIN_WAITS": "0"}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert result.stdout.strip() == "False", result.stderr


def test_plans_are_keyed_by_architecture(device):
    """The interpreter walks the Hopper tables; a GPU reports its own compute capability."""
    arch = device_facts.arch(torch.device(device))
    if device == "cpu":
        assert arch == device_facts.INTERPRETER_ARCH == "sm90"
    else:
        major, minor = torch.cuda.get_device_capability()
        assert arch == f"sm{major}{minor}"


def test_each_call_takes_the_cheapest_equivalent_path(device, monkeypatch):
    """No gradient needed: the inference launcher (softmax without its lse); an input requiring grad: the eager
    autograd Function; under torch.compile: the custom op (test_softmax and the other families compile it)."""
    from tritonkit.ops.row_softmax.op import softmax_op

    calls = []
    monkeypatch.setattr(softmax_op.function, "apply", lambda *args: calls.append("function") or (args[0], None))
    x = torch.randn(3, 5, device=device)
    y = tk.ops.softmax(x)
    assert calls == [] and y.grad_fn is None
    tk.ops.softmax(x.clone().requires_grad_())
    with torch.no_grad():
        tk.ops.softmax(x.clone().requires_grad_())
    assert calls == ["function"]


@pytest.mark.parametrize(
    ("triton", "numpy", "refused"),
    [("3.6.0", "2.4.1", True), ("3.6.0", "2.3.5", False), ("3.7.1", "2.4.1", False), ("3.9.0", "2.5.5", False)],
)
def test_the_interpreter_is_refused_where_its_packages_clash(triton, numpy, refused, monkeypatch):
    """Triton 3.6's interpreter with NumPy 2.4 or newer fails inside every kernel with a runtime loop bound; the CLI
    and the test suite stop first with what to install (docs/interpreter.md, "Versions")."""
    import importlib.metadata

    from tritonkit._core import env

    versions = {"triton": triton, "numpy": numpy}
    monkeypatch.setattr(importlib.metadata, "version", lambda package: versions[package])
    problem = env.interpreter_problem()
    assert (problem is not None) == refused
    if refused:
        assert problem.startswith(f"Triton {triton}'s interpreter does not run with NumPy {numpy}: install numpy<2.4")


def test_launchers_keep_the_interpreter_mode_the_kernels_were_defined_in(monkeypatch):
    """Triton fixes a kernel's mode when @triton.jit runs: a later change of TRITON_INTERPRET changes interpreting()
    but not what the launchers ask (kernels_interpreted), which would otherwise disagree with the kernels."""
    from tritonkit._core import env

    tk.ops.add  # noqa: B018 (the kernels are defined, and the mode recorded, when tritonkit.ops is imported)
    recorded = env.kernels_interpreted()
    assert recorded == env.interpreting()
    monkeypatch.setenv("TRITON_INTERPRET", "0" if recorded else "1")
    assert env.interpreting() is not recorded
    assert env.kernels_interpreted() is recorded


def test_a_trace_takes_the_custom_op_not_a_kernel_launch(device):
    """tracing() sees what torch.compile hands an op besides dynamo: tensors without data (fake, as AOTAutograd's
    trace of a custom op's backward passes them, where torch 2.11's is_compiling() is False) and make_fx's proxy
    mode over real tensors; an InferenceOp called there records its custom op instead of launching on them."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    from tritonkit._core.autograd import tracing
    from tritonkit._core.losses import scaled

    real = torch.randn(5, device=device)
    assert not tracing((real, 3))
    with FakeTensorMode():
        fake = torch.ones(2)
    assert tracing((real, fake))
    seen = []
    graph = make_fx(lambda g, factor: seen.append(tracing((g,))) or scaled(g, factor, torch.bfloat16))(
        real, torch.tensor(2.0, device=device)
    )
    assert seen == [True]
    assert "tritonkit.scale_cast" in graph.code
