"""Puzzle 16: split-K matmul, the parts added with tl.atomic_add.

    c[i, j] = sum over k of a[i, k] * b[k, j]

When M and N are small and K is long (a decode step: a few rows times a weight), puzzle 11's grid
of M x N tiles has too few programs to fill a GPU. Split-K cuts K into SPLIT_K ranges, one program
each: SPLIT_K times more programs, each summing its range into a partial tile. The partial tiles
of one (pm, pn) must then be added up in c, and they arrive at the same time: tl.atomic_add adds
each without losing another's, where a plain tl.store (or a load, an add and a store) keeps only
one of them. The atomics add into c, so c must start at 0: the launcher zeroes it first.

Shapes: a is (M, K) and b (K, N), float32 or float16, any strides (passed); c is (M, N) float32.

Blocks: a grid of cdiv(M, BLOCK_M) x cdiv(N, BLOCK_N) x SPLIT_K programs, BLOCK_M = BLOCK_N =
BLOCK_K = 16, SPLIT_K = 4. Program (pm, pn, pk) sums k over [pk * k_split, (pk + 1) * k_split)
(k_split, from the launcher, is a multiple of BLOCK_K), with loads masked at K, accumulating
tl.dot in float32 as in puzzle 11, then adds its [BLOCK_M, BLOCK_N] tile into c.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def splitk_matmul_kernel(
    p_a, p_b, p_c, M, N, K, k_split,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """The part of one [BLOCK_M, BLOCK_N] tile of a @ b from one range of K, added into c atomically."""
    o_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    o_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    k_start = tl.program_id(2) * k_split
    b_acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for start in range(k_start, k_start + k_split, BLOCK_K):
        o_k = start + tl.arange(0, BLOCK_K)
        m_a = (o_m[:, None] < M) & (o_k[None, :] < K)
        m_b = (o_k[:, None] < K) & (o_n[None, :] < N)
        b_a = tl.load(p_a + o_m[:, None] * stride_am + o_k[None, :] * stride_ak, mask=m_a, other=0.0)
        b_b = tl.load(p_b + o_k[:, None] * stride_bk + o_n[None, :] * stride_bn, mask=m_b, other=0.0)
        b_acc = tl.dot(b_a, b_b, b_acc)  # [BLOCK_M, BLOCK_N]
    m_c = (o_m[:, None] < M) & (o_n[None, :] < N)
    tl.atomic_add(p_c + o_m[:, None] * stride_cm + o_n[None, :] * stride_cn, b_acc, mask=m_c)


def splitk_matmul(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> None:
    """The launcher (given): zero c, then SPLIT_K programs per tile of c."""
    c.zero_()
    M, K = a.shape
    N = b.shape[1]
    BLOCK, SPLIT_K = 16, 4
    k_split = triton.cdiv(triton.cdiv(K, SPLIT_K), BLOCK) * BLOCK  # whole K blocks per split
    grid = (triton.cdiv(M, BLOCK), triton.cdiv(N, BLOCK), SPLIT_K)
    splitk_matmul_kernel[grid](
        a, b, c, M, N, K, k_split, *a.stride(), *b.stride(), *c.stride(), BLOCK_M=BLOCK, BLOCK_N=BLOCK, BLOCK_K=BLOCK
    )


# ===== checker data: not part of the learner's file =====
from tritonkit.puzzles._base import Puzzle, scaled_tolerance  # noqa: E402
from tritonkit.puzzles.p11_matmul import PUZZLE as MATMUL  # noqa: E402 - the same inputs and product

PUZZLE = Puzzle(
    title="split-K matmul with tl.atomic_add",
    kernel="splitk_matmul_kernel",
    launcher="splitk_matmul",
    make_inputs=MATMUL.make_inputs,
    reference=MATMUL.reference,
    out_shape=MATMUL.out_shape,
    out_dtype=lambda dtype: torch.float32,
    # Few rows and columns, a long K: the shapes split-K is for.
    cases=({"m": 1, "n": 1, "k": 1}, {"m": 3, "n": 20, "k": 100}, {"m": 17, "n": 5, "k": 129}),
    gpu_cases=({"m": 16, "n": 4096, "k": 8192}, {"m": 5, "n": 1000, "k": 3333}),
    dtypes=(torch.float32, torch.float16),
    # Each output sums K products: magnitude and rounding grow like sqrt(K); 16-bit inputs round once more.
    tolerance=scaled_tolerance(lambda case: case["k"], dot=True),
    accumulates=True,
    hints=(
        "Start from puzzle 11's kernel: the tile's rows from tl.program_id(0), its columns from tl.program_id(1), "
        "a float32 accumulator and tl.dot over K.",
        "tl.program_id(2) picks the range of K: loop start from pid_k * k_split to pid_k * k_split + k_split in "
        "steps of BLOCK_K, and keep the mask o_k < K (the last range runs past K).",
        "Add the tile into c instead of storing it: tl.atomic_add(p_c + rows[:, None] * stride_cm + cols[None, :] "
        "* stride_cn, acc, mask=...). The launcher has zeroed c.",
    ),
)
