"""Debugging inside a kernel with breakpoint_if.

Under the interpreter a kernel is Python, so Python's debugger works inside it. Stopping in every
program is useless on a grid of thousands, so tritonkit.debug.breakpoint_if(rule) stops only in the
programs its rule selects: "=1" (program 1), ",>=2" (axis 1 at least 2), "!=0,<=3". In the debugger
the kernel's blocks are NumPy-backed values: `p b_x` prints one, `p b_x.handle.data.mean()` computes
on it. Compiled for a GPU, breakpoint_if compiles to nothing, so the line can stay while the kernel
moves to the GPU.

The kernel below scales each row by its maximum, and the lesson stops in program 1 (row 1). Run as
`tritonkit learn 6` it does not wait for you: it installs a breakpoint hook that prints what you
would see, the kernel's local blocks with their shapes and first values, and continues. Set
PYTHONBREAKPOINT=pdb.set_trace to get the real debugger (type `c` to continue).
"""

from __future__ import annotations

import os
import sys

import torch
import triton
import triton.language as tl

from tritonkit import debug


@triton.jit
def scale_rows_kernel(p_x, p_out, n_cols, BLOCK_N: tl.constexpr):
    """out[r] = x[r] / max(|x[r]|), one program per row."""
    i_row = tl.program_id(0)
    o_c = tl.arange(0, BLOCK_N)
    m_c = o_c < n_cols
    b_x = tl.load(p_x + i_row * n_cols + o_c, mask=m_c, other=0.0)  # [BLOCK_N]
    b_peak = tl.max(tl.abs(b_x), axis=0)
    debug.breakpoint_if("=1")
    tl.store(p_out + i_row * n_cols + o_c, b_x / b_peak, mask=m_c)


def _show_kernel_locals(*args, **kwargs) -> None:
    """A breakpoint hook for unattended runs: print the kernel frame's blocks instead of stopping."""
    frame = sys._getframe(1)
    while frame is not None and "b_x" not in frame.f_locals:  # climb from breakpoint_if to the kernel
        frame = frame.f_back
    if frame is None:
        return
    print(f"breakpoint_if('=1') stopped in {frame.f_code.co_name}; its locals:")
    for name, value in frame.f_locals.items():
        data = getattr(getattr(value, "handle", None), "data", None)
        if data is not None:
            print(f"  {name:<7} shape {tuple(data.shape)!s:<7} {data.reshape(-1)[:4]}")


def run(out_dir: str | None = None) -> None:
    device = "cpu" if debug.interpreting() else "cuda"
    x = torch.randn(3, 10, device=device)
    out = torch.empty_like(x)
    interactive = os.environ.get("PYTHONBREAKPOINT", "") not in ("", "0")
    previous = sys.breakpointhook
    if not interactive:
        sys.breakpointhook = _show_kernel_locals
    try:
        scale_rows_kernel[(x.shape[0],)](x, out, x.shape[1], BLOCK_N=16)
    finally:
        sys.breakpointhook = previous
    torch.testing.assert_close(out, x / x.abs().amax(dim=1, keepdim=True))
    print("the kernel's output matches torch:", out.shape)


if __name__ == "__main__":
    run()
