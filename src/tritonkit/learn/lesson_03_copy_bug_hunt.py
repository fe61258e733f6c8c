"""The copy-kernel bug hunt, with print_if and guard_bounds.

A copy kernel is the smallest kernel there is, and it still hides the two classic bugs. The first
version below forgets to shift its offsets by the program id: every program copies block 0. The
output is right in the first block and untouched everywhere else; print_if shows why, printing
the offsets of program 1, which are those of program 0.

The second version shifts the offsets but drops the mask. Its output is right, so a test comparing
values passes, yet the last program reads and writes past the end of both tensors, which on a GPU
corrupts a neighbour or crashes, and under the interpreter overwrites host memory silently. guard_bounds catches it:
it runs the launch on copies padded with sentinels and reports every sentinel that changed.

The third version has both, and passes both checks.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tritonkit import debug


@triton.jit
def copy_unshifted(p_x, p_out, n, BLOCK: tl.constexpr):
    o_x = tl.arange(0, BLOCK)  # bug: every program starts at element 0
    debug.print_if(o_x, "=1")
    tl.store(p_out + o_x, tl.load(p_x + o_x, mask=o_x < n), mask=o_x < n)


@triton.jit
def copy_unmasked(p_x, p_out, n, BLOCK: tl.constexpr):
    o_x = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(p_out + o_x, tl.load(p_x + o_x))  # bug: no mask, the last block runs past n


@triton.jit
def copy_fixed(p_x, p_out, n, BLOCK: tl.constexpr):
    o_x = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m_x = o_x < n
    tl.store(p_out + o_x, tl.load(p_x + o_x, mask=m_x), mask=m_x)


def _launch(kernel, x, out, block=8):
    kernel[(triton.cdiv(x.numel(), block),)](x, out, x.numel(), BLOCK=block)
    return out


def run(out_dir: str | None = None) -> None:
    device = "cpu" if debug.interpreting() else "cuda"
    x = torch.arange(20, dtype=torch.float32, device=device)

    print("1. Offsets not shifted by the program id. print_if prints program 1's offsets:")
    out = _launch(copy_unshifted, x, torch.full_like(x, float("nan")))
    print("   out =", out.tolist())
    print("   Elements 8 and on were never written (NaN): every program copied elements 0..7.")
    assert torch.equal(out[:8], x[:8]) and out[8:].isnan().all()

    print("2. Shifted, but no mask. Run only inside guard_bounds: unguarded, the stray stores land in")
    print("   whatever memory follows the tensor (here, the interpreter once aborted with a corrupted heap).")
    outputs = []
    report = debug.guard_bounds(lambda x, out: outputs.append(_launch(copy_unmasked, x, out)), x, torch.empty_like(x))
    print("   The values come out right, equal to x:", torch.equal(outputs[0], x))
    print("   but guard_bounds says:\n     " + str(report).replace("\n", "\n     "))
    assert torch.equal(outputs[0], x) and not report.ok

    print("3. Shifted and masked:")
    out = _launch(copy_fixed, x, torch.empty_like(x))
    report = debug.guard_bounds(lambda x, out: _launch(copy_fixed, x, out), x, torch.empty_like(x))
    print(f"   equal to x: {torch.equal(out, x)}; guard_bounds: {report}")
    assert torch.equal(out, x) and report.ok


if __name__ == "__main__":
    run()
