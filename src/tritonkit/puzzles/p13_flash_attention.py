"""Puzzle 13: flash-attention forward, the final one.

    S = Q K^T * scale,   P = softmax(S) over the keys,   out = P V,    scale = 1 / sqrt(D)

for each head separately, without ever holding S in memory: the online softmax of puzzle 7 on
tiles, with the matmul of puzzle 11.

Shapes: q, k, v and out are (H, L, D) contiguous tensors, float32 or float16: H heads, sequence
length L (1, 37, 50, ...), head dimension D (16 or 32, a power of two). Some cases have scores in
the hundreds, where exp(s) overflows float32: only exp(s - max) survives them.

Causal (the last cases, launched with causal=True, the kernel's CAUSAL): query i attends to the
keys j <= i only, so S[i, j] = -inf for j > i. Key blocks that start after a program's last query,
(pm + 1) * BLOCK_M on, are masked whole: the loop can end before them.

Blocks: a grid of cdiv(L, BLOCK_M) x H programs, BLOCK_M = BLOCK_N = 16. Program (pm, h) owns
BLOCK_M queries of head h. It loops over the keys BLOCK_N at a time, and for each key block:
  s = tl.dot(q, k^T) * scale                         [BLOCK_M, BLOCK_N]; keys past L (and, causal,
                                                     keys after their query) get -inf
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
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
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
    end = seq_len
    if CAUSAL:  # keys from (i_m + 1) * BLOCK_M on come after every query of the block: all masked, so skipped
        end = tl.minimum(seq_len, (i_m + 1) * BLOCK_M)
    for start in range(0, end, BLOCK_N):
        o_n = start + tl.arange(0, BLOCK_N)
        m_kv = o_n[:, None] < seq_len
        b_k = tl.load(p_k + p_head + o_n[:, None] * stride_l + o_d[None, :], mask=m_kv, other=0.0)  # [BLOCK_N, D]
        b_v = tl.load(p_v + p_head + o_n[:, None] * stride_l + o_d[None, :], mask=m_kv, other=0.0)  # [BLOCK_N, D]
        b_s = tl.dot(b_q, tl.trans(b_k)) * scale  # [BLOCK_M, BLOCK_N]
        m_keys = o_n[None, :] < seq_len
        if CAUSAL:
            m_keys = m_keys & (o_n[None, :] <= o_m[:, None])
        b_s = tl.where(m_keys, b_s, float("-inf"))
        # Key 0 is in the first block and every query sees it, so m_new is finite from the first block on.
        m_new = tl.maximum(m_i, tl.max(b_s, axis=1))
        alpha = tl.exp(m_i - m_new)
        b_p = tl.exp(b_s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(b_p, axis=1)
        b_acc = b_acc * alpha[:, None] + tl.dot(b_p.to(b_v.dtype), b_v)
        m_i = m_new
    tl.store(p_out + p_head + o_m[:, None] * stride_l + o_d[None, :], b_acc / l_i[:, None], mask=m_q)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, causal: bool = False) -> None:
    """The launcher (given)."""
    heads, seq_len, head_dim = q.shape
    BLOCK = 16
    grid = (triton.cdiv(seq_len, BLOCK), heads)
    attention_kernel[grid](
        q, k, v, out, seq_len, q.stride(0), q.stride(1), 1.0 / math.sqrt(head_dim),
        HEAD_DIM=head_dim, BLOCK_M=BLOCK, BLOCK_N=BLOCK, CAUSAL=causal,
    )  # fmt: skip


# ===== checker data: not part of the learner's file =====
from tritonkit.puzzles._base import Mistake, Probe, Puzzle, draw, scaled_tolerance  # noqa: E402
from tritonkit.registry import Tolerance  # noqa: E402

_BLOCK = 16  # the launcher's block sizes, for a mistake's reference when the learner's launch does not say
_SUMS = scaled_tolerance(lambda case: case["d"], dot=True)


def _tolerance(case, dtype, device):
    """The sums' bound, plus the scores' own fp32 rounding, which exp carries into every weight: a score sums d
    products of size about q_scale, so it is off by up to about 2**-24 * q_scale * d, and the output, a weighted mean
    of unit values, moves by as much (a correct kernel was 5.1e-5 off at q_scale 60, past the sums' 4e-5)."""
    base = _SUMS(case, dtype, device)
    return Tolerance(atol=base.atol + 2**-24 * case.get("q_scale", 1.0) * case["d"], rtol=base.rtol)


def _qkv(case, dtype, device, gen):
    """q, k, v ~ N(0, 1), q times the case's q_scale: at 60 the scores reach the hundreds."""
    shape = (case["h"], case["l"], case["d"])
    q = draw(shape, dtype, device, gen, scale=case.get("q_scale", 1.0))
    return q, draw(shape, dtype, device, gen), draw(shape, dtype, device, gen)


def _scores(q, k):
    return q @ k.transpose(1, 2) / math.sqrt(q.shape[-1])


def _attend(q, k, v, visible):
    """softmax over the keys each query sees (visible: [L, L] bool, query by key), times v. A query that sees no key
    gets NaN, as the kernel's 0 / 0 does."""
    return torch.softmax(_scores(q, k).masked_fill(~visible, float("-inf")), dim=-1) @ v


def _positions(q):
    """Query and key positions, [L, 1] and [1, L]."""
    positions = torch.arange(q.shape[1], device=q.device)
    return positions[:, None], positions[None, :]


def _reference(q, k, v, case):
    i, j = _positions(q)
    return _attend(q, k, v, (j <= i) if case.get("causal") else (j >= 0))


def _block(launch, name):
    value = launch.get(name)
    return value if isinstance(value, int) and value > 0 else _BLOCK


# What a kernel making each mistake outputs (float64, from the learner's block sizes).
def _streamed(q, k, v, launch, *, rescale_l=True, rescale_acc=True, update_m=True):
    """The kernel's loop key block by key block, with the rescale of l or of acc, or the update of m, left out."""
    block_n = _block(launch, "BLOCK_N")
    scores = _scores(q, k)
    m = scores.new_full(scores.shape[:-1], float("-inf"))
    l = torch.zeros_like(m)  # noqa: E741 - the kernel's name
    acc = torch.zeros_like(q)
    for start in range(0, scores.shape[-1], block_n):
        s = scores[..., start : start + block_n]
        m_new = torch.maximum(m, s.amax(dim=-1))
        alpha = torch.exp(m - m_new)
        p = torch.exp(s - m_new[..., None])
        l = (l * alpha if rescale_l else l) + p.sum(dim=-1)  # noqa: E741
        acc = (acc * alpha[..., None] if rescale_acc else acc) + p @ v[:, start : start + block_n]
        m = m_new if update_m else m
    return acc / l[..., None]


def _without_max(q, k, v, case, launch):
    """exp(s) with no maximum subtracted, in float32 as the kernel computes it: inf past s = 88.7, then inf / inf."""
    e = torch.exp(_scores(q, k).float())
    return ((e @ v.float()) / e.sum(dim=-1, keepdim=True)).double()


def _causal_variant(visible):
    """A causal mistake's output: visible(i, j, first key of the query's diagonal block, BLOCK_M) -> [L, L] bool."""

    def reference(q, k, v, case, launch):
        block_m = _block(launch, "BLOCK_M")
        i, j = _positions(q)
        return _attend(q, k, v, visible(i, j, i // block_m * block_m, block_m))

    return reference


_RESCALE = "multiply it by alpha = exp(m - m_new) before adding the block's terms"


def _large_scores(case, dtype, device, gen):
    """Random q, k, v with every other query scaled by 100: its scores reach the hundreds, the others stay near 1."""
    q, k, v = _qkv(case, torch.float32, device, gen)
    q[:, ::2] *= 100
    return q.to(dtype), k.to(dtype), v.to(dtype)


_OVERFLOW = Probe(
    case={"h": 1, "l": 40, "d": 16},
    make_inputs=_large_scores,
    description="inputs where every other query has scores in the hundreds",
    mistakes=(
        Mistake(
            "no-max-subtraction",
            "exp overflows: subtract the running maximum before exp. exp(s) is inf in float32 past s = 88.7, and "
            "inf / inf is NaN; p = exp(s - m_new[:, None]) and alpha = exp(m - m_new) are at most 1 whatever the "
            "scores",
            _without_max,
        ),
    ),
    applies=lambda case: not case.get("causal"),
)


def _rising_scores(case, dtype, device, gen):
    """Scores that grow along the keys, about 1.6 per block of 16 keys, so that the running maximum rises at every
    key block and each rescale changes the output: q[:, i, 0] = 4 (0.5 + i / L), k[:, j, 0] = 0.1 j (+ noise)."""
    shape = (case["h"], case["l"], case["d"])
    q, k, v = (draw(shape, torch.float32, device, gen, scale=scale) for scale in (0.3, 0.3, 1.0))
    positions = torch.arange(case["l"], device=device, dtype=torch.float32)
    q[..., 0] = 4 * (0.5 + positions / case["l"])
    k[..., 0] += 0.1 * positions
    return q.to(dtype), k.to(dtype), v.to(dtype)


_RISING = Probe(
    case={"h": 1, "l": 64, "d": 16},
    make_inputs=_rising_scores,
    description="inputs whose running maximum rises at every key block",
    mistakes=(
        Mistake(
            "no-rescale-sum",
            f"the running sum l is not rescaled when the maximum changes: {_RESCALE}, l = l * alpha + rowsum(p) "
            "(the accumulator is rescaled)",
            lambda q, k, v, case, launch: _streamed(q, k, v, launch, rescale_l=False),
        ),
        Mistake(
            "no-rescale-acc",
            f"the accumulator acc is not rescaled when the maximum changes: {_RESCALE}, "
            "acc = acc * alpha[:, None] + tl.dot(p, v) (the running sum l is rescaled)",
            lambda q, k, v, case, launch: _streamed(q, k, v, launch, rescale_acc=False),
        ),
        Mistake(
            "no-rescale-sum-and-acc",
            "neither the running sum l nor the accumulator acc is rescaled when the maximum changes: multiply both "
            "by alpha = exp(m - m_new) before adding the block's terms",
            lambda q, k, v, case, launch: _streamed(q, k, v, launch, rescale_l=False, rescale_acc=False),
        ),
        Mistake(
            "max-not-updated",
            "the running maximum is never updated (m = m_new after each block): m stays -inf, alpha = exp(m - m_new) "
            "is 0 at every block, and only the last key block counts",
            lambda q, k, v, case, launch: _streamed(q, k, v, launch, update_m=False),
        ),
    ),
    applies=lambda case: not case.get("causal"),
)

_CAUSAL = Probe(
    case={"h": 1, "l": 40, "d": 16, "causal": 1},
    make_inputs=_qkv,
    description="random causal inputs",
    mistakes=(
        Mistake(
            "causal-diagonal-excluded",
            "the causal mask leaves out the diagonal: query i sees keys j <= i, its own key included (keys <= "
            "queries, not <); query 0 then sees no key at all and gets 0 / 0",
            _causal_variant(lambda i, j, diagonal, block: j < i),
        ),
        Mistake(
            "causal-one-key-too-many",
            "the causal mask lets each query see one key too many: query i sees keys j <= i, and key i + 1 comes "
            "after it (keys <= queries, not <= queries + 1)",
            _causal_variant(lambda i, j, diagonal, block: j <= i + 1),
        ),
        Mistake(
            "causal-diagonal-block-unmasked",
            "the loop ends at the diagonal block but that block is not masked: inside it, keys after their query "
            "need -inf (tl.where(keys[None, :] <= queries[:, None], s, float('-inf')))",
            _causal_variant(lambda i, j, diagonal, block: j < diagonal + block),
        ),
        Mistake(
            "causal-later-blocks-attended",
            "the key blocks after the diagonal block are attended unmasked: end the loop at min(L, (pid + 1) * "
            "BLOCK_M), or mask every block",
            _causal_variant(lambda i, j, diagonal, block: (j <= i) | (j >= diagonal + block)),
        ),
        Mistake(
            "causal-diagonal-block-skipped",
            "the loop stops before the diagonal block: the block where keys meet queries must be visited (masked), "
            "so the loop ends at min(L, (pid + 1) * BLOCK_M), not pid * BLOCK_M",
            _causal_variant(lambda i, j, diagonal, block: j < diagonal),
        ),
        Mistake(
            "causal-ignored",
            "causal=True changed nothing: every query sees every key. Mask keys after their query with -inf and "
            "end the loop at the diagonal block when CAUSAL",
            _causal_variant(lambda i, j, diagonal, block: j >= 0),
        ),
    ),
    applies=lambda case: bool(case.get("causal")),
)

PUZZLE = Puzzle(
    title="flash-attention forward",
    kernel="attention_kernel",
    launcher="attention",
    make_inputs=_qkv,
    reference=_reference,
    reference_takes_case=True,
    out_shape=lambda case: (case["h"], case["l"], case["d"]),
    cases=(
        {"h": 1, "l": 1, "d": 16},
        {"h": 2, "l": 37, "d": 16},
        {"h": 2, "l": 50, "d": 32},
        {"h": 2, "l": 45, "d": 16, "q_scale": 60},  # scores in the hundreds: exp(s) without the max overflows
        {"h": 1, "l": 1, "d": 16, "causal": 1},
        {"h": 2, "l": 50, "d": 16, "causal": 1},
    ),
    gpu_cases=({"h": 16, "l": 2048, "d": 64}, {"h": 8, "l": 1000, "d": 128}, {"h": 8, "l": 1000, "d": 64, "causal": 1}),
    dtypes=(torch.float32, torch.float16),
    # Scores sum D products and each output a softmax-weighted mean over L values: the error grows with
    # sqrt(D) in the scores (a 16-bit p in the second dot adds one rounding per term).
    tolerance=_tolerance,
    launcher_kwargs=lambda case: {"causal": True} if case.get("causal") else {},
    probes=(_OVERFLOW, _RISING, _CAUSAL),
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
        "Causal (if CAUSAL:, a constexpr): keys after their query must not count either, so also mask with "
        "keys[None, :] <= queries[:, None] (a query sees its own key), and end the loop at "
        "tl.minimum(L, (pid + 1) * BLOCK_M): the key blocks after that are masked whole.",
    ),
)
