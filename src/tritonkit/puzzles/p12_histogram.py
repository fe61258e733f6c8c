"""Puzzle 12: histogram with tl.atomic_add.

    counts[v] = number of i with x[i] == v        for 0 <= v < n_bins

Shapes: x is (n,) int32 with values in [0, n_bins); counts is (n_bins,) int32, zeroed by the
launcher before the kernel runs.

Blocks: cdiv(n, BLOCK) programs, BLOCK = 128. Every program may add to any bin, and programs run
at the same time on a GPU, so the additions must be atomic: tl.atomic_add(pointers, values, mask=...)
adds each lane's value at its pointer without losing a concurrent update. (The interpreter runs one
program at a time, so a plain load + store would pass there and fail on a GPU.)
"""

import torch
import triton
import triton.language as tl


@triton.jit
def histogram_kernel(p_x, p_counts, n, BLOCK: tl.constexpr):
    """counts[x[i]] += 1 for this program's block of x, atomically."""
    o_x = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m_x = o_x < n
    b_bins = tl.load(p_x + o_x, mask=m_x, other=0)  # [BLOCK]
    tl.atomic_add(p_counts + b_bins, tl.full([BLOCK], 1, dtype=tl.int32), mask=m_x)


def histogram(x: torch.Tensor, counts: torch.Tensor) -> None:
    """The launcher (given): zero the counts, then one program per BLOCK values."""
    counts.zero_()
    n = x.numel()
    BLOCK = 128
    histogram_kernel[(triton.cdiv(n, BLOCK),)](x, counts, n, BLOCK=BLOCK)


# ===== checker data: not part of the learner's file =====
from tritonkit.puzzles._base import Puzzle  # noqa: E402


def _values(case, dtype, device, gen):
    return (torch.randint(0, case["bins"], (case["n"],), device=device, generator=gen, dtype=torch.int32),)


PUZZLE = Puzzle(
    title="histogram with tl.atomic_add",
    kernel="histogram_kernel",
    launcher="histogram",
    make_inputs=_values,
    reference=lambda x, case: torch.bincount(x, minlength=case["bins"]).to(torch.int32),
    reference_takes_case=True,  # the number of bins comes from the case, not from the inputs
    out_shape=lambda case: (case["bins"],),
    cases=({"n": 1, "bins": 4}, {"n": 300, "bins": 10}, {"n": 1000, "bins": 37}),
    gpu_cases=({"n": (1 << 20) + 3, "bins": 256}, {"n": 100_000, "bins": 1000}),
    dtypes=(torch.int32,),
    block_arg="BLOCK",
    accumulates=True,
    hints=(
        "The offsets and mask are those of puzzle 1; the loaded values are bin numbers.",
        "p_counts + bins is a block of pointers to the bins to increment.",
        "tl.atomic_add(p_counts + bins, tl.full([BLOCK], 1, dtype=tl.int32), mask=mask): the mask matters "
        "twice, since a lane past n would read a garbage bin number and add to memory anywhere.",
    ),
)
