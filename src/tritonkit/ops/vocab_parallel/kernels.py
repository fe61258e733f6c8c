"""Cross-entropy kernels over one rank's slice of the vocabulary: the slice's softmax statistics, and its gradient.

A row of logits split in P slices (rank r holds classes [start_r, start_r + n_r)) has its softmax from three numbers
per slice, which the launcher combines across ranks with two all-reduces: the slice's maximum m_r and sum
s_r = sum_j exp(y_j - m_r) give lse = m + log(sum_r s_r exp(m_r - m)), m = max_r m_r (an all-reduce of the maxima,
then one of the rescaled sums); the target's logit y_t, on the one rank whose slice holds it (0 on the others:
summed in the same all-reduce); with label smoothing, the slice's sum of y (summed too). The gradient needs only the
global lse: each rank writes d(loss)/d(logits) over its own slice, with no communication.
"""

import triton
import triton.language as tl

from tritonkit._core.jit.cross_entropy import softcapped, write_logit_grads
from tritonkit._core.jit.online_softmax import online_update


@triton.jit
def _vocab_slice_stats_kernel(
    p_x, p_target, p_stats,
    n_cols, stride_x_row, stride_target, stride_stats_row,
    vocab_start, softcap,
    HAS_SMOOTHING: tl.constexpr, HAS_SOFTCAP: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """One program per row of the slice x (n_cols logits of classes vocab_start + j), target t, y = capped x:

    stats[row] = (m = max_j y_j, s = sum_j exp(y_j - m), y_t if vocab_start <= t < vocab_start + n_cols else 0,
    sum_j y_j with HAS_SMOOTHING else 0), in fp32. An empty slice gives (-inf, 0, 0, 0), which the combination
    weighs by exp(-inf) = 0. No gradient: these are statistics, and the gradient kernel reads their combination.
    """
    i_row = tl.program_id(0).to(tl.int64)
    p_x_row = p_x + i_row * stride_x_row
    m = tl.full((), float("-inf"), tl.float32)
    s = tl.zeros((), tl.float32)
    sum_y = tl.zeros((), tl.float32)
    # Loads issued as the loop reaches them: a plain range is pipelined at the launch's depth, 15% slower in the
    # cross-entropy row kernel's same loop (docs/kernels/loss.md, Launch plans).
    for start in tl.range(0, n_cols, BLOCK_N, num_stages=1):
        o_n = start + tl.arange(0, BLOCK_N)
        m_n = o_n < n_cols
        b_y = softcapped(tl.load(p_x_row + o_n, mask=m_n, other=0.0).to(tl.float32), softcap, HAS_SOFTCAP)
        b_y = tl.where(m_n, b_y, float("-inf"))  # [BLOCK_N]
        m, s = online_update(m, s, b_y)
        if HAS_SMOOTHING:
            sum_y += tl.sum(tl.where(m_n, b_y, 0.0), axis=0)
    local_target = tl.load(p_target + i_row * stride_target).to(tl.int64) - vocab_start
    here = (local_target >= 0) & (local_target < n_cols)
    y_t = softcapped(tl.load(p_x_row + local_target, mask=here, other=0.0).to(tl.float32), softcap, HAS_SOFTCAP)
    p_stats_row = p_stats + i_row * stride_stats_row
    tl.store(p_stats_row, m)
    tl.store(p_stats_row + 1, s)
    tl.store(p_stats_row + 2, tl.where(here, y_t, 0.0))
    tl.store(p_stats_row + 3, sum_y)


@triton.jit
def _vocab_slice_grad_kernel(
    p_x, p_target, p_lse, p_scale, p_dx,
    n_cols, stride_x_row, stride_target, stride_scale, stride_dx_row,
    vocab_start, vocab_size, ignore_index, label_smoothing, z_loss, softcap,
    HAS_SMOOTHING: tl.constexpr, HAS_SOFTCAP: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """One program per row of the slice x, with the row's global lse (fp32), smoothing e, z-loss z, softcap c:

    loss = lse - (1 - e) y_t - (e / V) sum_j y_j + z lse^2 over all V = vocab_size classes, so over this slice
    d(loss)/dx_j = (exp(y_j - lse) (1 + 2 z lse) - (1 - e) [vocab_start + j == t] - e / V) (1 - (y_j / c)^2),
    stored times scale_row into dx (which may be x: each block is read before it is written). Rows whose target is
    ignore_index get 0; a target outside [0, V) that is not ignore_index gets NaN.
    """
    i_row = tl.program_id(0).to(tl.int64)
    p_x_row = p_x + i_row * stride_x_row
    target = tl.load(p_target + i_row * stride_target).to(tl.int64)
    ignored = target == ignore_index
    valid = (target >= 0) & (target < vocab_size)
    lse = tl.load(p_lse + i_row)
    scale = tl.load(p_scale + i_row * stride_scale).to(tl.float32)
    scale = tl.where(valid | ignored, scale, float("nan"))
    grad_factor = 1.0 + 2.0 * z_loss * lse
    write_logit_grads(p_x_row, p_dx + i_row * stride_dx_row, n_cols, lse, grad_factor, target - vocab_start, None,
                      scale, ignored, label_smoothing, vocab_size, softcap, None, BLOCK_N, HAS_SMOOTHING, HAS_SOFTCAP,
                      False)  # fmt: skip
