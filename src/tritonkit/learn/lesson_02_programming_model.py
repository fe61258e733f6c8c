"""The programming model: programs, blocks, vectors, masks.

A Triton kernel is written for one *program*. The launch `kernel[grid](...)` runs one program per
grid point, on a GPU many at a time; `tl.program_id(axis)` tells a program where it is. Inside, you
work on *blocks*: `tl.arange(0, BLOCK)` is a vector of BLOCK offsets (BLOCK a power of two, known when
compiling: a `tl.constexpr`), and `tl.load(p + offsets)` reads BLOCK elements at once. There are no
threads to index: the compiler spreads the block over the threads of the program.

A tensor's length is rarely a multiple of BLOCK, so the last program's block sticks out. A *mask*,
`offsets < n`, switches those lanes off: masked loads return `other` (or garbage), masked stores
write nothing.

Below, each program writes its own id into its block of a 10-element output with BLOCK = 4: three
programs, the last one with two lanes masked off. print_if prints the offsets and the mask of
program 2 only (under the interpreter; compiled for a GPU it is a no-op).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tritonkit import debug


@triton.jit
def which_program_kernel(p_out, n, BLOCK: tl.constexpr):
    """out[i] = the id of the program that wrote element i."""
    i_block = tl.program_id(0)
    o_out = i_block * BLOCK + tl.arange(0, BLOCK)
    m_out = o_out < n
    debug.print_if(o_out, "=2")
    debug.print_if(m_out, "=2")
    tl.store(p_out + o_out, tl.full([BLOCK], 0, tl.int32) + i_block, mask=m_out)


def run(out_dir: str | None = None) -> None:
    device = "cpu" if debug.interpreting() else "cuda"
    n, block = 10, 4
    out = torch.full((n,), -1, dtype=torch.int32, device=device)
    grid = (triton.cdiv(n, block),)
    print(f"n = {n}, BLOCK = {block}: grid = cdiv(n, BLOCK) = {grid[0]} programs")
    which_program_kernel[grid](out, n, BLOCK=block)
    print("element:   ", list(range(n)))
    print("written by:", out.tolist())
    expected = [i // block for i in range(n)]
    assert out.tolist() == expected, out.tolist()
    print("Program k wrote elements k*BLOCK .. k*BLOCK+BLOCK-1; the mask kept program 2 inside the tensor.")


if __name__ == "__main__":
    run()
