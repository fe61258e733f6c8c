"""The interpreter shortcut (tritonkit._core.interpreter): helper calls inside a launch skip repatching
triton.language when the launch has patched it already, and kernels compute the same values."""

import types

import pytest
import torch
import triton
import triton.language as tl
from triton.runtime import interpreter
from triton.runtime.errors import InterpreterError

import tritonkit.ops  # noqa: F401  (importing the ops installs the shortcut under the interpreter)
from tritonkit._core import interpreter as shortcut


@triton.jit
def _twice_plus_one(b_x):
    return b_x * 2.0 + 1.0


@triton.jit
def _repeat_helper_kernel(p_x, p_out, n, STEPS: tl.constexpr, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = o < n
    b = tl.load(p_x + o, mask=m, other=0.0).to(tl.float32)
    for _ in range(STEPS):
        b = _twice_plus_one(b)
    tl.store(p_out + o, b, mask=m)


def _run(steps: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The kernel's output, the expected one, and how often triton.language's builtins were repatched."""
    x = torch.randn(37)
    out = torch.full_like(x, float("nan"))
    repatches = 0
    original = interpreter._patch_builtin

    def counting(*args, **kwargs):
        nonlocal repatches
        repatches += 1
        return original(*args, **kwargs)

    interpreter._patch_builtin = counting
    try:
        _repeat_helper_kernel[(3,)](x, out, x.numel(), STEPS=steps, BLOCK=16)
    finally:
        interpreter._patch_builtin = original
    expected = x.double()
    for _ in range(steps):
        expected = expected * 2 + 1
    return out, expected.float(), repatches


def test_the_shortcut_is_installed_under_the_interpreter():
    assert shortcut.skip_redundant_patches()
    assert getattr(interpreter, shortcut._INSTALLED)


def test_helper_calls_no_longer_repatch_the_language():
    """Without the shortcut each of the 3 programs' helper calls repatches triton.language: 3 x steps more."""
    out_one, expected_one, patches_one = _run(steps=1)
    out_many, expected_many, patches_many = _run(steps=8)
    torch.testing.assert_close(out_one, expected_one)
    torch.testing.assert_close(out_many, expected_many)
    assert patches_one == patches_many > 0


def test_two_launches_in_a_row_each_patch_and_restore():
    """A launch's patches are undone when it ends (the next launch patches again), also after a failing launch."""
    _run(steps=2)
    with pytest.raises(InterpreterError, match="power of 2"):
        _repeat_helper_kernel[(1,)](torch.ones(4), torch.ones(4), 4, STEPS=1, BLOCK=3)  # arange of 3: refused
    out, expected, patches = _run(steps=2)
    torch.testing.assert_close(out, expected)
    assert patches > 0


def test_an_interpreter_of_another_shape_is_left_alone():
    unknown = types.SimpleNamespace(InterpretedFunction=type("F", (), {"__call__": lambda self: None}))
    assert not shortcut._can_install(unknown)
