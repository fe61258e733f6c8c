"""Puzzle 13: flash-attention forward, the final one.

    S = Q K^T * scale,   P = softmax(S) over the keys,   out = P V,    scale = 1 / sqrt(D)

for each head separately, without ever holding S in memory: the online softmax of puzzle 7 on
tiles, with the matmul of puzzle 11.

Shapes: q, k, v and out are (H, L, D) contiguous tensors, float32 or float16: H heads, sequence
length L (1, 37, 50, ...), head dimension D (16 or 32, a power of two). No causal mask.

Blocks: a grid of cdiv(L, BLOCK_M) x H programs, BLOCK_M = BLOCK_N = 16. Program (pm, h) owns
BLOCK_M queries of head h. It loops over the keys BLOCK_N at a time, and for each key block:
  s = tl.dot(q, k^T) * scale                         [BLOCK_M, BLOCK_N]; keys past L get -inf
  m_new = max(m, rowmax(s));  alpha = exp(m - m_new)
  p = exp(s - m_new[:, None])
  l = l * alpha + rowsum(p);  acc = acc * alpha[:, None] + tl.dot(p, v)
  m = m_new
and finally stores acc / l[:, None]. m starts at -inf, l and acc at 0, all float32.
"""

import math

import torch
import triton
import triton.language as tl


@triton.jit
def attention_kernel(
    p_q, p_k, p_v, p_out, seq_len, stride_h, stride_l, scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """out = softmax(q k^T * scale) v for BLOCK_M queries of one head, keys streamed in blocks."""
    i_m, i_h = tl.program_id(0), tl.program_id(1)
    o_m = i_m * BLOCK_M + tl.arange(0, BLOCK_M)
    o_d = tl.arange(0, HEAD_DIM)
    p_head = i_h * stride_h
    m_q = o_m[:, None] < seq_len
    b_q = tl.load(p_q + p_head + o_m[:, None] * stride_l + o_d[None, :], mask=m_q, other=0.0)  # [BLOCK_M, D]
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    b_acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    for start in range(0, seq_len, BLOCK_N):
        o_n = start + tl.arange(0, BLOCK_N)
        m_kv = o_n[:, None] < seq_len
        b_k = tl.load(p_k + p_head + o_n[:, None] * stride_l + o_d[None, :], mask=m_kv, other=0.0)  # [BLOCK_N, D]
        b_v = tl.load(p_v + p_head + o_n[:, None] * stride_l + o_d[None, :], mask=m_kv, other=0.0)  # [BLOCK_N, D]
        b_s = tl.dot(b_q, tl.trans(b_k)) * scale  # [BLOCK_M, BLOCK_N]
        b_s = tl.where(o_n[None, :] < seq_len, b_s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(b_s, axis=1))
        alpha = tl.exp(m_i - m_new)
        b_p = tl.exp(b_s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(b_p, axis=1)
        b_acc = b_acc * alpha[:, None] + tl.dot(b_p.to(b_v.dtype), b_v)
        m_i = m_new
    tl.store(p_out + p_head + o_m[:, None] * stride_l + o_d[None, :], b_acc / l_i[:, None], mask=m_q)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor) -> None:
    """The launcher (given)."""
    heads, seq_len, head_dim = q.shape
    BLOCK = 16
    grid = (triton.cdiv(seq_len, BLOCK), heads)
    attention_kernel[grid](
        q, k, v, out, seq_len, q.stride(0), q.stride(1), 1.0 / math.sqrt(head_dim),
        HEAD_DIM=head_dim, BLOCK_M=BLOCK, BLOCK_N=BLOCK,
    )  # fmt: skip


# ===== checker data: not part of the learner's file =====
from tritonkit.puzzles._base import Puzzle, draw, scaled_tolerance  # noqa: E402


def _qkv(case, dtype, device, gen):
    shape = (case["h"], case["l"], case["d"])
    return tuple(draw(shape, dtype, device, gen) for _ in range(3))


def _reference(q, k, v):
    scores = q @ k.transpose(1, 2) / math.sqrt(q.shape[-1])
    return torch.softmax(scores, dim=-1) @ v


PUZZLE = Puzzle(
    title="flash-attention forward",
    kernel="attention_kernel",
    launcher="attention",
    make_inputs=_qkv,
    reference=_reference,
    out_shape=lambda case: (case["h"], case["l"], case["d"]),
    cases=({"h": 1, "l": 1, "d": 16}, {"h": 2, "l": 37, "d": 16}, {"h": 2, "l": 50, "d": 32}),
    gpu_cases=({"h": 16, "l": 2048, "d": 64}, {"h": 8, "l": 1000, "d": 128}),
    dtypes=(torch.float32, torch.float16),
    # Scores sum D products and each output a softmax-weighted mean over L values: the error grows with
    # sqrt(D) in the scores (a 16-bit p in the second dot adds one rounding per term).
    tolerance=scaled_tolerance(lambda case: case["d"], dot=True),
    hints=(
        "Start from the grid: tl.program_id(0) picks BLOCK_M queries, tl.program_id(1) the head; the head's "
        "data starts at head * stride_h, query row i at i * stride_l.",
        "Load the q tile once, [BLOCK_M, HEAD_DIM]. Loop over the keys; per block load k and v tiles "
        "[BLOCK_N, HEAD_DIM] and compute s = tl.dot(q, tl.trans(k)) * scale.",
        "Keys past L must not count: s = tl.where(keys[None, :] < L, s, float('-inf')).",
        "The online softmax of puzzle 7, one per query row: m_new = tl.maximum(m, tl.max(s, axis=1)); "
        "alpha = tl.exp(m - m_new); p = tl.exp(s - m_new[:, None]); l = l * alpha + tl.sum(p, axis=1).",
        "acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v); after the loop store acc / l[:, None] with the "
        "query mask.",
    ),
)
