"""What differs between the Triton and NumPy versions pyproject.toml allows, under the interpreter (docs/interpreter.md,
"Versions"). Each test names the versions it was checked on; if an upgrade changes a point, the test fails and the
page must change with it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from packaging.version import Version

TRITON = Version(triton.__version__).release[:2]
NUMPY = Version(np.__version__).release[:2]

_mask_dtypes: list = []


@triton.jit
def _loop_sum_kernel(p_x, p_out, n, BLOCK: tl.constexpr):
    b_acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n, BLOCK):  # the loop bound is a runtime argument
        o = start + tl.arange(0, BLOCK)
        b_acc += tl.load(p_x + o, mask=o < n, other=0.0)
    tl.store(p_out, tl.sum(b_acc, axis=0))


def test_a_loop_over_a_runtime_bound_runs():
    """Triton 3.6's interpreter turns `n` into an int with int() on a 1-element array, an error from NumPy 2.4 on
    (3.7 takes .squeeze() first). Every interpreted kernel with such a loop then fails on its `range(...)` line."""
    x = torch.arange(100, dtype=torch.float32)
    out = torch.empty(1)
    try:
        _loop_sum_kernel[(1,)](x, out, x.numel(), BLOCK=32)
    except Exception as error:  # the interpreter wraps it in InterpreterError
        pytest.fail(f"triton {triton.__version__} with numpy {np.__version__}: {error!r}; triton 3.6 needs numpy<2.4")
    assert float(out) == float(x.sum())


@triton.jit
def _block_and_scalar_mask_kernel(p_pos, p_x, p_out, n_positions, half, CLAMP: tl.constexpr, BLOCK: tl.constexpr):
    o = tl.arange(0, BLOCK)
    i_row = tl.load(p_pos).to(tl.int64)
    if CLAMP:
        # rope's form: a comparison of blocks.
        m = o < tl.where((i_row >= 0) & (i_row < n_positions), half, 0)
    else:
        m = (o < half) & (i_row >= 0) & (i_row < n_positions)
    _mask_dtypes.append(m.handle.data.dtype)
    tl.store(p_out + o, tl.load(p_x + o, mask=m, other=float("nan")), mask=o < BLOCK)


def _run_mask_kernel(position: int, clamp: bool) -> torch.Tensor:
    x = torch.arange(8, dtype=torch.float32)
    out = torch.empty(8)
    _block_and_scalar_mask_kernel[(1,)](torch.tensor([position]), x, out, 4, 5, CLAMP=clamp, BLOCK=8)
    return out


def test_a_block_mask_and_a_scalar_condition_is_an_int32_mask():
    """`block_mask & scalar_condition` gives an int32 mask under the interpreter (checked on triton 3.6 to 3.9).
    Triton 3.6 to 3.8 load through it; 3.9's tl.load refuses it ("mask has unsupported dtype")."""
    _mask_dtypes.clear()
    if TRITON >= (3, 9):
        with pytest.raises(Exception, match="mask has unsupported dtype"):
            _run_mask_kernel(1, clamp=False)
    else:
        out = _run_mask_kernel(1, clamp=False)
        assert out[:5].tolist() == [0, 1, 2, 3, 4] and out[5:].isnan().all()
    assert _mask_dtypes == [np.dtype(np.int32)]


@pytest.mark.parametrize("position", [1, -1, 4])
def test_a_mask_compared_as_blocks_loads_on_every_version(position):
    _mask_dtypes.clear()
    out = _run_mask_kernel(position, clamp=True)
    assert _mask_dtypes == [np.dtype(bool)]
    if 0 <= position < 4:
        assert out[:5].tolist() == [0, 1, 2, 3, 4] and out[5:].isnan().all()
    else:
        assert out.isnan().all()
