"""Puzzle 17: split-K matmul, deterministic: the parts to a buffer, then a reduction kernel.

    c[i, j] = sum over k of a[i, k] * b[k, j]

Puzzle 16's atomics add the SPLIT_K parts of an element in whatever order the programs get there,
and float addition is not associative: c changes in its last bits from run to run. Training runs
that must replay exactly, and tests that compare bits, want the same result every time. So here
each part goes to its own place, and a second kernel adds the parts up in a fixed order: no
atomics, no zeroing, the same bits on every run, for one more pass over SPLIT_K * M * N floats.

  pass 1, splitk_partial_kernel: puzzle 16's program (pm, pn, pk), which stores its partial tile
    with tl.store to partials[pk], a (SPLIT_K, M, N) contiguous float32 buffer;
  pass 2, splitk_reduce_kernel: c[e] = partials[0, e] + partials[1, e] + ... + partials[SPLIT_K - 1, e],
    in that order, for BLOCK elements e of c per program (c and each partials[s] are contiguous,
    so an element is one flat index e = i * N + j).

Shapes: a is (M, K) and b (K, N), float32 or float16, any strides (passed); c is (M, N) float32,
contiguous.

Blocks: pass 1 as puzzle 16 (BLOCK_M = BLOCK_N = BLOCK_K = 16, SPLIT_K = 4); pass 2 has
cdiv(M * N, BLOCK) programs, BLOCK = 256.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def splitk_partial_kernel(
    p_a, p_b, p_partials, M, N, K, k_split, stride_am, stride_ak, stride_bk, stride_bn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """The part of one [BLOCK_M, BLOCK_N] tile of a @ b from one range of K, stored to that range's partials."""
    o_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    o_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    i_k = tl.program_id(2)
    b_acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for start in range(i_k * k_split, (i_k + 1) * k_split, BLOCK_K):
        o_k = start + tl.arange(0, BLOCK_K)
        m_a = (o_m[:, None] < M) & (o_k[None, :] < K)
        m_b = (o_k[:, None] < K) & (o_n[None, :] < N)
        b_a = tl.load(p_a + o_m[:, None] * stride_am + o_k[None, :] * stride_ak, mask=m_a, other=0.0)
        b_b = tl.load(p_b + o_k[:, None] * stride_bk + o_n[None, :] * stride_bn, mask=m_b, other=0.0)
        b_acc = tl.dot(b_a, b_b, b_acc)  # [BLOCK_M, BLOCK_N]
    m_c = (o_m[:, None] < M) & (o_n[None, :] < N)
    tl.store(p_partials + i_k * M * N + o_m[:, None] * N + o_n[None, :], b_acc, mask=m_c)


@triton.jit
def splitk_reduce_kernel(p_partials, p_c, n_elements, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr):
    """c = the sum of the SPLIT_K partials, added in the order of the splits, for BLOCK elements."""
    o_e = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m_e = o_e < n_elements
    b_sum = tl.zeros([BLOCK], dtype=tl.float32)
    for split in tl.static_range(SPLIT_K):
        b_sum += tl.load(p_partials + split * n_elements + o_e, mask=m_e, other=0.0)  # [BLOCK]
    tl.store(p_c + o_e, b_sum, mask=m_e)


def splitk_matmul_two_pass(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> None:
    """The launcher (given): the partials, then their sum."""
    M, K = a.shape
    N = b.shape[1]
    BLOCK, SPLIT_K, BLOCK_SUM = 16, 4, 256
    k_split = triton.cdiv(triton.cdiv(K, SPLIT_K), BLOCK) * BLOCK  # whole K blocks per split
    partials = torch.empty((SPLIT_K, M, N), dtype=torch.float32, device=a.device)
    grid = (triton.cdiv(M, BLOCK), triton.cdiv(N, BLOCK), SPLIT_K)
    splitk_partial_kernel[grid](
        a, b, partials, M, N, K, k_split, *a.stride(), *b.stride(), BLOCK_M=BLOCK, BLOCK_N=BLOCK, BLOCK_K=BLOCK
    )
    splitk_reduce_kernel[(triton.cdiv(M * N, BLOCK_SUM),)](partials, c, M * N, SPLIT_K=SPLIT_K, BLOCK=BLOCK_SUM)


# ===== checker data: not part of the learner's file =====
import dataclasses  # noqa: E402

from tritonkit.puzzles.p16_splitk_atomic import PUZZLE as SPLIT_K  # noqa: E402 - its inputs, cases and tolerance

PUZZLE = dataclasses.replace(
    SPLIT_K,
    title="split-K matmul in two passes, deterministic",
    kernel="splitk_reduce_kernel",
    helper_kernels=("splitk_partial_kernel",),
    launcher="splitk_matmul_two_pass",
    accumulates=False,
    deterministic=True,
    hints=(
        "splitk_partial_kernel is puzzle 16's kernel with one change at the end: no atomic, a tl.store of the "
        "tile to the split's own slice of the buffer.",
        "The slice of split pk starts at p_partials + pk * M * N; inside it, element (i, j) is at i * N + j.",
        "splitk_reduce_kernel: offsets and mask over the M * N elements as in puzzle 1; a float32 sum, and for "
        "split in tl.static_range(SPLIT_K), add tl.load(p_partials + split * n_elements + offsets, mask=..., "
        "other=0.0).",
        "Store the sum to c with the mask. The order of the additions is fixed by the loop, so the result is the "
        "same on every run.",
    ),
)
