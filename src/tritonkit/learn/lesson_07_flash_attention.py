"""Flash attention forward, built in four steps.

Attention for one head, with N queries and N keys of dimension D:

    S = Q K^T * scale  (N x N),   P = softmax(S) along each row,   O = P V  (N x D),   scale = 1/sqrt(D)

(a) Naive: three kernels, with S and P in memory between them (scores; row softmax; P V). Each
    N x N matrix is written once and read back once, so the memory and the traffic between the
    kernels grow as N^2 per head: at N = 16384 with 32 heads in fp16, S and P take 32 GiB. The
    softmax subtracts the row's maximum first. softmax(s) = softmax(s - c) for any c, and with
    c = max(s) every exponent is at most 0; without it exp overflows float32 past s = 88.7
    (float16 past 11.1) and the row turns into inf / inf = NaN.

(b) Online softmax over one row, read in blocks, once. Keep the running maximum m, the running
    sum l = sum exp(x - m) and, so that the weights are used without a second pass, a running
    weighted sum acc = sum exp(x - m) w. When a block raises the maximum from m to m', what was
    summed so far carries the factor exp(-m) where it now needs exp(-m'): multiply l and acc by
    alpha = exp(m - m') before adding the block. At the end acc / l = softmax(x) . w, and
    m + log(l) is the row's logsumexp. Every exponent stays at most 0, whatever the scores.

(c) Tiled: a program owns BLOCK_M queries and streams the keys BLOCK_N at a time. A [BLOCK_M,
    BLOCK_N] tile of scores comes from tl.dot and lives only in registers; m and l become vectors
    over the block's queries and acc a [BLOCK_M, D] tile, rescaled as in (b). S and P never reach
    memory: beyond Q, K, V and O the kernel needs O(N) numbers (m and l per query, the logsumexp
    that a backward pass would keep), not O(N^2), and its traffic is the inputs and the output,
    with K and V read once per query block (mostly from L2) instead of four N x N passes.
    exp2: the GPU computes 2^x in one instruction, and exp(x) = 2^(x log2 e) costs a multiply
    more. Folding log2(e) into the scale (qk_scale = scale * log2 e) makes the scores base-2
    logits t = s log2 e; then 2^(t - max t) = exp(s - max s): the softmax is unchanged, and the
    extra multiply is paid once per score, together with the scale, instead of once per exp.

(d) Causal: query i attends to the keys j <= i. With BLOCK_M = BLOCK_N a query block sees three
    kinds of key blocks: below the diagonal (every key before every query: no mask at all), the
    diagonal block (mask j <= i), and the blocks above it (every key after every query). Masking
    those would give the right answer but still pay for their dots and their loads; the kernel
    ends its loop at the diagonal and never touches them. Of the T x T pairs of blocks
    (T = cdiv(N, BLOCK)) it visits T(T + 1)/2, only T of them masked: half the work as T grows.

Each step runs its kernel on small shapes and prints what it checks against torch (float64) and
the largest error.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from tritonkit import debug

LOG2E = 1.4426950408889634  # log2(e): exp(x) = 2^(x * LOG2E)


# --------------------------------------------------------------------------------------------------
# (a) naive: S and P materialised
# --------------------------------------------------------------------------------------------------
@triton.jit
def naive_scores_kernel(p_q, p_k, p_s, seq_len, scale, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr):
    """S[h, i, j] = scale * sum_d Q[h, i, d] K[h, j, d]; one program per (query i, head h), all keys in one block."""
    i_q, i_h = tl.program_id(0), tl.program_id(1)
    o_n = tl.arange(0, BLOCK_N)
    o_d = tl.arange(0, HEAD_DIM)
    m_n = o_n < seq_len
    p_head = i_h * seq_len * HEAD_DIM
    b_q = tl.load(p_q + p_head + i_q * HEAD_DIM + o_d)  # [D]
    b_k = tl.load(p_k + p_head + o_n[:, None] * HEAD_DIM + o_d[None, :], mask=m_n[:, None], other=0.0)  # [BLOCK_N, D]
    b_s = tl.sum(b_k * b_q[None, :], axis=1) * scale  # [BLOCK_N]
    tl.store(p_s + (i_h * seq_len + i_q) * seq_len + o_n, b_s, mask=m_n)


@triton.jit
def naive_softmax_kernel(p_s, p_p, seq_len, BLOCK_N: tl.constexpr):
    """P[r, j] = exp(S[r, j] - max_k S[r, k]) / sum_k exp(S[r, k] - max S[r]); one program per row r of S."""
    i_r = tl.program_id(0)
    o_n = tl.arange(0, BLOCK_N)
    m_n = o_n < seq_len
    b_s = tl.load(p_s + i_r * seq_len + o_n, mask=m_n, other=float("-inf"))  # [BLOCK_N]; exp(-inf) = 0
    b_e = tl.exp(b_s - tl.max(b_s, axis=0))
    tl.store(p_p + i_r * seq_len + o_n, b_e / tl.sum(b_e, axis=0), mask=m_n)


@triton.jit
def naive_pv_kernel(p_p, p_v, p_o, seq_len, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr):
    """O[h, i, d] = sum_j P[h, i, j] V[h, j, d]; one program per (query i, head h)."""
    i_q, i_h = tl.program_id(0), tl.program_id(1)
    o_n = tl.arange(0, BLOCK_N)
    o_d = tl.arange(0, HEAD_DIM)
    m_n = o_n < seq_len
    p_head = i_h * seq_len * HEAD_DIM
    b_p = tl.load(p_p + (i_h * seq_len + i_q) * seq_len + o_n, mask=m_n, other=0.0)  # [BLOCK_N]
    b_v = tl.load(p_v + p_head + o_n[:, None] * HEAD_DIM + o_d[None, :], mask=m_n[:, None], other=0.0)  # [BLOCK_N, D]
    tl.store(p_o + p_head + i_q * HEAD_DIM + o_d, tl.sum(b_p[:, None] * b_v, axis=0))


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, int]:
    """O for contiguous (H, N, D) float32 q, k, v through three launches, and how many floats S and P took."""
    heads, seq_len, head_dim = q.shape
    block_n = triton.next_power_of_2(seq_len)  # a whole row of keys in one block: fine for a lesson's N
    s = torch.empty(heads, seq_len, seq_len, device=q.device)
    p = torch.empty_like(s)
    o = torch.empty_like(q)
    naive_scores_kernel[(seq_len, heads)](q, k, s, seq_len, 1 / math.sqrt(head_dim), HEAD_DIM=head_dim, BLOCK_N=block_n)
    naive_softmax_kernel[(heads * seq_len,)](s, p, seq_len, BLOCK_N=block_n)
    naive_pv_kernel[(seq_len, heads)](p, v, o, seq_len, HEAD_DIM=head_dim, BLOCK_N=block_n)
    return o, s.numel() + p.numel()


# --------------------------------------------------------------------------------------------------
# (b) online softmax over one row
# --------------------------------------------------------------------------------------------------
@triton.jit
def online_row_kernel(p_x, p_w, p_y, p_lse, n_cols, BLOCK: tl.constexpr):
    """y[r] = sum_j softmax(x[r])_j w[j] and lse[r] = log sum_j exp(x[r, j]), in one pass over row r in blocks:

        m' = max(m, max_j x_j),   alpha = exp(m - m'),
        l' = alpha l + sum_j exp(x_j - m'),   acc' = alpha acc + sum_j exp(x_j - m') w_j,

    from m = -inf, l = acc = 0; at the end y = acc / l and lse = m + log l.
    """
    i_r = tl.program_id(0)
    m = tl.full([], float("-inf"), dtype=tl.float32)
    l = tl.zeros([], dtype=tl.float32)  # noqa: E741 - the running sum's usual name
    acc = tl.zeros([], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        o_x = start + tl.arange(0, BLOCK)
        m_x = o_x < n_cols
        b_x = tl.load(p_x + i_r * n_cols + o_x, mask=m_x, other=float("-inf"))  # [BLOCK]; exp(-inf - m') = 0
        b_w = tl.load(p_w + o_x, mask=m_x, other=0.0)  # [BLOCK]
        m_new = tl.maximum(m, tl.max(b_x, axis=0))
        alpha = tl.exp(m - m_new)  # 0 on the first block (m = -inf): nothing summed yet
        b_e = tl.exp(b_x - m_new)
        l = l * alpha + tl.sum(b_e, axis=0)  # noqa: E741
        acc = acc * alpha + tl.sum(b_e * b_w, axis=0)
        m = m_new
    tl.store(p_y + i_r, acc / l)
    tl.store(p_lse + i_r, m + tl.log(l))


def online_row(x: torch.Tensor, w: torch.Tensor, block: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(x) @ w and logsumexp(x) along the rows of a float32 (R, N) x, with w of length N."""
    y = torch.empty(x.shape[0], device=x.device)
    lse = torch.empty_like(y)
    online_row_kernel[(x.shape[0],)](x, w, y, lse, x.shape[1], BLOCK=block)
    return y, lse


# --------------------------------------------------------------------------------------------------
# (c) tiled, and (d) causal with skipping: two loop structures over one step
# --------------------------------------------------------------------------------------------------
@triton.jit
def _attend_block(
    b_q, p_k, p_v, start, o_m, seq_len, stride_l, m_i, l_i, b_acc, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, CHECK_END: tl.constexpr, CAUSAL: tl.constexpr,
):  # fmt: skip
    """Fold the key block [start, start + BLOCK_N) into the running state of BLOCK_M queries, in base 2:

        t = (q k^T) * qk_scale        [BLOCK_M, BLOCK_N], qk_scale = scale * log2(e), so t = s * log2(e)
            -inf where a key is past seq_len (CHECK_END) or after its query (CAUSAL)
        m' = max(m, rowmax t),   alpha = 2^(m - m'),   p = 2^(t - m')
        l' = alpha l + rowsum p,   acc' = alpha acc + p v

    and return (m', l', acc'). 2^(t - m') = exp(s - max s): the base-e softmax, with exp2.
    """
    o_n = start + tl.arange(0, BLOCK_N)
    o_d = tl.arange(0, HEAD_DIM)
    p_kv = o_n[:, None] * stride_l + o_d[None, :]
    if CHECK_END:
        b_k = tl.load(p_k + p_kv, mask=o_n[:, None] < seq_len, other=0.0)  # [BLOCK_N, D]
        b_v = tl.load(p_v + p_kv, mask=o_n[:, None] < seq_len, other=0.0)  # [BLOCK_N, D]
    else:  # a block wholly inside the sequence needs no mask
        b_k = tl.load(p_k + p_kv)  # [BLOCK_N, D]
        b_v = tl.load(p_v + p_kv)  # [BLOCK_N, D]
    b_t = tl.dot(b_q, tl.trans(b_k)) * qk_scale  # [BLOCK_M, BLOCK_N]
    if CHECK_END:
        b_t = tl.where(o_n[None, :] < seq_len, b_t, float("-inf"))
    if CAUSAL:
        b_t = tl.where(o_n[None, :] <= o_m[:, None], b_t, float("-inf"))
    # Each query sees key 0 in the first block it visits, so m' is finite from then on.
    m_new = tl.maximum(m_i, tl.max(b_t, axis=1))
    alpha = tl.exp2(m_i - m_new)
    b_p = tl.exp2(b_t - m_new[:, None])
    l_i = l_i * alpha + tl.sum(b_p, axis=1)
    b_acc = b_acc * alpha[:, None] + tl.dot(b_p, b_v)
    return m_new, l_i, b_acc


@triton.jit
def _query_block(p_q, p_k, p_v, p_o, seq_len, stride_h, stride_l, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    """A program's start: its query rows o_m of head i_h, the head's pointers, its q block, and the running max m,
    sum l and accumulator at their empty values (m = -inf: no key seen yet)."""
    i_m, i_h = tl.program_id(0), tl.program_id(1)
    o_m = i_m * BLOCK_M + tl.arange(0, BLOCK_M)
    o_d = tl.arange(0, HEAD_DIM)
    p_q, p_k, p_v, p_o = p_q + i_h * stride_h, p_k + i_h * stride_h, p_v + i_h * stride_h, p_o + i_h * stride_h
    p_rows = o_m[:, None] * stride_l + o_d[None, :]
    b_q = tl.load(p_q + p_rows, mask=o_m[:, None] < seq_len, other=0.0)  # [BLOCK_M, D]
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    b_acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    return i_m, i_h, o_m, p_k, p_v, p_o, p_rows, b_q, m_i, l_i, b_acc


@triton.jit
def flash_attention_kernel(
    p_q, p_k, p_v, p_o, seq_len, stride_h, stride_l, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """O = softmax(Q K^T * scale) V for BLOCK_M queries of one head, every key block streamed through
    :func:`_attend_block`, then O = acc / l."""
    _, _, o_m, p_k, p_v, p_o, p_rows, b_q, m_i, l_i, b_acc = _query_block(
        p_q, p_k, p_v, p_o, seq_len, stride_h, stride_l, HEAD_DIM, BLOCK_M
    )
    for start in range(0, seq_len, BLOCK_N):
        m_i, l_i, b_acc = _attend_block(
            b_q, p_k, p_v, start, o_m, seq_len, stride_l, m_i, l_i, b_acc, qk_scale,
            HEAD_DIM=HEAD_DIM, BLOCK_N=BLOCK_N, CHECK_END=True, CAUSAL=False,
        )  # fmt: skip
    tl.store(p_o + p_rows, b_acc / l_i[:, None], mask=o_m[:, None] < seq_len)


@triton.jit
def causal_flash_attention_kernel(
    p_q, p_k, p_v, p_o, p_visits, seq_len, stride_h, stride_l, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """O[i] = sum_{j <= i} softmax_j(S[i, :i+1]) V[j] for BLOCK_M queries of one head (BLOCK_M a multiple of
    BLOCK_N): the key blocks before the diagonal block unmasked, the diagonal block masked, the rest never
    visited. visits[h, pm] = the number of key blocks the program folded in."""
    i_m, i_h, o_m, p_k, p_v, p_o, p_rows, b_q, m_i, l_i, b_acc = _query_block(
        p_q, p_k, p_v, p_o, seq_len, stride_h, stride_l, HEAD_DIM, BLOCK_M
    )
    visits = 0
    diagonal = i_m * BLOCK_M  # the first key of the diagonal block; keys before it precede every query here
    for start in range(0, diagonal, BLOCK_N):
        m_i, l_i, b_acc = _attend_block(
            b_q, p_k, p_v, start, o_m, seq_len, stride_l, m_i, l_i, b_acc, qk_scale,
            HEAD_DIM=HEAD_DIM, BLOCK_N=BLOCK_N, CHECK_END=False, CAUSAL=False,
        )  # fmt: skip
        visits += 1
    # The diagonal block, the only one where some keys come after some queries (and the last may pass seq_len).
    # The loop ends here: keys from diagonal + BLOCK_M on come after every query of the block.
    for start in range(diagonal, tl.minimum(diagonal + BLOCK_M, seq_len), BLOCK_N):
        m_i, l_i, b_acc = _attend_block(
            b_q, p_k, p_v, start, o_m, seq_len, stride_l, m_i, l_i, b_acc, qk_scale,
            HEAD_DIM=HEAD_DIM, BLOCK_N=BLOCK_N, CHECK_END=True, CAUSAL=True,
        )  # fmt: skip
        visits += 1
    tl.store(p_o + p_rows, b_acc / l_i[:, None], mask=o_m[:, None] < seq_len)
    tl.store(p_visits + i_h * tl.num_programs(0) + i_m, visits)


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False, block: int = 16):
    """O for contiguous (H, N, D) float32 q, k, v (D a power of two, at least 16); with ``causal``, also the
    (H, cdiv(N, block)) count of key blocks each program visited."""
    heads, seq_len, head_dim = q.shape
    o = torch.empty_like(q)
    qk_scale = LOG2E / math.sqrt(head_dim)  # scale * log2(e): one multiply per score, and exp2 from then on
    grid = (triton.cdiv(seq_len, block), heads)
    common = {"HEAD_DIM": head_dim, "BLOCK_M": block, "BLOCK_N": block}
    if not causal:
        flash_attention_kernel[grid](q, k, v, o, seq_len, q.stride(0), q.stride(1), qk_scale, **common)
        return o
    visits = torch.zeros(heads, grid[0], dtype=torch.int32, device=q.device)
    causal_flash_attention_kernel[grid](q, k, v, o, visits, seq_len, q.stride(0), q.stride(1), qk_scale, **common)
    return o, visits


# --------------------------------------------------------------------------------------------------
# The lesson
# --------------------------------------------------------------------------------------------------
def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """softmax(Q K^T / sqrt(D)) V in float64, keys after their query masked out with ``causal``."""
    q, k, v = q.double(), k.double(), v.double()
    scores = q @ k.transpose(1, 2) / math.sqrt(q.shape[-1])
    if causal:
        n = q.shape[1]
        future = torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def _max_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    return (got.double() - expected).abs().max().item()


def run(out_dir: str | None = None) -> None:
    device = "cpu" if debug.interpreting() else "cuda"
    # The interpreter computes tl.dot in full float32; compiled, float32 dots use TF32 (10 mantissa bits).
    tolerance = 1e-4 if debug.interpreting() else 1e-2
    generator = torch.Generator(device=device).manual_seed(0)
    heads, seq_len, head_dim, block = 2, 100, 16, 16
    q, k, v = (torch.randn(heads, seq_len, head_dim, device=device, generator=generator) for _ in range(3))
    expected = reference(q, k, v)

    print(f"(a) naive, H = {heads}, N = {seq_len}, D = {head_dim}: S = QK^T * scale and P = softmax(S) written to")
    print("    memory by two kernels, then O = P V by a third")
    o, intermediates = naive_attention(q, k, v)
    error = _max_error(o, expected)
    print(f"    checks O against torch's float64 softmax(QK^T * scale) V: max abs error {error:.1e}")
    assert error < tolerance, error
    print(f"    S and P: {intermediates} floats ({intermediates * 4 / 1024:.0f} KiB) written, then read back")
    big = 2 * 32 * 16384**2 * 2 / 2**30
    print(f"    at N = 16384 with 32 heads in fp16 they would take {big:.0f} GiB: N^2 per head")

    print(f"\n(b) online softmax: rows of {seq_len} scores read {block} at a time, once")
    x = torch.randn(4, seq_len, device=device, generator=generator) * 3
    x[3] = torch.linspace(-1000, 1000, seq_len, device=device)  # rising scores: the maximum changes every block
    w = torch.randn(seq_len, device=device, generator=generator)
    y, lse = online_row(x, w, block)
    y_error = _max_error(y, torch.softmax(x.double(), dim=1) @ w.double())
    lse_error = _max_error(lse, torch.logsumexp(x.double(), dim=1))
    print(f"    checks y = softmax(x) @ w and logsumexp(x) against torch: max abs errors {y_error:.1e} and "
          f"{lse_error:.1e}")  # fmt: skip
    assert y_error < 1e-4 and lse_error < 1e-3, (y_error, lse_error)
    overflow = torch.exp(x[3]).sum().item()
    print(f"    row 3 runs from -1000 to 1000: torch.exp(x).sum() = {overflow} in float32, so exp(x) / sum")
    print(f"    would be NaN; with the running maximum subtracted the kernel's logsumexp is {lse[3].item():.4f}")
    assert math.isinf(overflow) and torch.isfinite(y).all()

    print(f"\n(c) tiled: BLOCK_M = BLOCK_N = {block}, scores scaled by scale * log2(e) and exponentiated with exp2")
    o = flash_attention(q, k, v, block=block)
    error = _max_error(o, expected)
    print(f"    checks O against torch: max abs error {error:.1e}")
    assert error < tolerance, error
    blocks = triton.cdiv(seq_len, block)
    print(f"    S and P never left the programs: each read its {block} queries once and K and V in {blocks} blocks,")
    print("    and wrote O alone (a training forward would add the logsumexp: N floats per head, not N^2)")

    print("\n(d) causal: key blocks above the diagonal skipped, only the diagonal block masked")
    o, visits = flash_attention(q, k, v, causal=True, block=block)
    error = _max_error(o, reference(q, k, v, causal=True))
    print(f"    checks O against torch with keys after their query masked out: max abs error {error:.1e}")
    assert error < tolerance, error
    visited = int(visits[0].sum())
    print(f"    key blocks visited by query blocks 0..{blocks - 1}: {visits[0].tolist()}")
    print(f"    {visited} of {blocks * blocks} block pairs per head, {blocks} of them masked: "
          f"{1 - visited / blocks**2:.0%} of the dots and K/V loads saved")  # fmt: skip
    assert visits[0].tolist() == list(range(1, blocks + 1)), visits


if __name__ == "__main__":
    run()
