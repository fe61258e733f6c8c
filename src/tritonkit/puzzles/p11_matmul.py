"""Puzzle 11: tiled matrix multiplication with tl.dot.

    c[i, j] = sum over k of a[i, k] * b[k, j]

Shapes: a is (M, K), b is (K, N), c is (M, N); float32 or float16, any strides (passed). M, N and K
are any sizes (1, 17, 20, 33, 50, ...), rarely multiples of the blocks.

Blocks: a 2-D grid of cdiv(M, BLOCK_M) x cdiv(N, BLOCK_N) programs, BLOCK_M = BLOCK_N = BLOCK_K = 16.
Program (pm, pn) computes the [BLOCK_M, BLOCK_N] tile of c: it walks K in steps of BLOCK_K, loads a
[BLOCK_M, BLOCK_K] tile of a and a [BLOCK_K, BLOCK_N] tile of b, and accumulates
tl.dot(a_tile, b_tile) in float32. The K loop needs a mask too: lanes past K must load 0.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def matmul_kernel(
    p_a, p_b, p_c, M, N, K,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """One [BLOCK_M, BLOCK_N] tile of c = a @ b, accumulated in float32 over K."""
    o_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    o_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    b_acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for start in range(0, K, BLOCK_K):
        o_k = start + tl.arange(0, BLOCK_K)
        m_a = (o_m[:, None] < M) & (o_k[None, :] < K)
        m_b = (o_k[:, None] < K) & (o_n[None, :] < N)
        b_a = tl.load(p_a + o_m[:, None] * stride_am + o_k[None, :] * stride_ak, mask=m_a, other=0.0)
        b_b = tl.load(p_b + o_k[:, None] * stride_bk + o_n[None, :] * stride_bn, mask=m_b, other=0.0)
        b_acc = tl.dot(b_a, b_b, b_acc)  # [BLOCK_M, BLOCK_N]
    m_c = (o_m[:, None] < M) & (o_n[None, :] < N)
    tl.store(p_c + o_m[:, None] * stride_cm + o_n[None, :] * stride_cn, b_acc, mask=m_c)


def matmul(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> None:
    """The launcher (given)."""
    M, K = a.shape
    N = b.shape[1]
    BLOCK = 16
    grid = (triton.cdiv(M, BLOCK), triton.cdiv(N, BLOCK))
    matmul_kernel[grid](
        a, b, c, M, N, K, *a.stride(), *b.stride(), *c.stride(), BLOCK_M=BLOCK, BLOCK_N=BLOCK, BLOCK_K=BLOCK
    )


# ===== checker data: not part of the learner's file =====
from tritonkit.puzzles._base import Puzzle, draw, scaled_tolerance  # noqa: E402


def _inputs(case, dtype, device, gen):
    a = draw((case["m"], case["k"]), dtype, device, gen)
    b = draw((case["n"], case["k"]), dtype, device, gen).t()  # b is read through its strides
    return (a, b)


PUZZLE = Puzzle(
    title="tiled matmul with tl.dot",
    kernel="matmul_kernel",
    launcher="matmul",
    make_inputs=_inputs,
    reference=lambda a, b: a @ b,
    out_shape=lambda case: (case["m"], case["n"]),
    cases=({"m": 1, "n": 1, "k": 1}, {"m": 20, "n": 33, "k": 17}, {"m": 40, "n": 24, "k": 50}),
    gpu_cases=({"m": 2048, "n": 2048, "k": 2048}, {"m": 1000, "n": 700, "k": 333}),
    dtypes=(torch.float32, torch.float16),
    # Each output sums K products: magnitude and rounding grow like sqrt(K).
    tolerance=scaled_tolerance(lambda case: case["k"], dot=True),
    hints=(
        "Row offsets from tl.program_id(0), column offsets from tl.program_id(1), as in puzzle 3.",
        "The a tile's addresses: p_a + rows[:, None] * stride_am + ks[None, :] * stride_ak; b's tile: "
        "p_b + ks[:, None] * stride_bk + cols[None, :] * stride_bn.",
        "Loop over K in steps of BLOCK_K with acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32) and "
        "acc = tl.dot(a_tile, b_tile, acc).",
        "Mask the loads with other=0.0 on both the M/N edge and the K edge: a garbage value past K, times a "
        "valid one, spoils the whole sum.",
    ),
)
