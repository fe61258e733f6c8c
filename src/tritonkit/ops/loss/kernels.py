"""The cross-entropy row kernel: loss and log-sum-exp, and the logits' gradient, of one row of logits per program.

One kernel serves every use, with two switches: ``COMPUTE_LOSS`` (one online-softmax pass over the row: lse and the
loss terms) and ``WRITE_GRAD`` (one more pass writing d(loss)/d(logits), scaled per row, possibly over the logits
themselves). Options of LLM training: ``softcap`` (logits become softcap * tanh(logits / softcap) first, as in Gemma
2), ``z_loss`` (z * lse^2 per token, as in PaLM), label smoothing as torch defines it; class weights as torch's,
the z-term stored on its own and each row's argmax checked against its target (Liger-Kernel's return_z_loss and
return_token_accuracy), each behind a switch that is off by default.
"""

import triton
import triton.language as tl

from tritonkit._core.jit.cross_entropy import softcapped, write_logit_grads
from tritonkit._core.jit.online_softmax import finite_or_zero, online_update


@triton.jit
def _class_weight(p_weight, target, valid):
    """w_t in fp32, 0 where the target is ignored or out of range (never dereferenced there)."""
    return tl.load(p_weight + target, mask=valid, other=0.0).to(tl.float32)


@triton.jit
def _first_argmax(best, best_index, b_x, o_n, n_cols):
    """The running (largest value, its first index) after block b_x at columns o_n (masked columns -inf): a later
    block takes over only when strictly larger, so ties keep the first index, as torch.argmax."""
    block_best = tl.max(b_x, axis=0)
    block_index = tl.min(tl.where(b_x == block_best, o_n, n_cols), axis=0)
    return tl.maximum(best, block_best), tl.where(block_best > best, block_index, best_index)


@triton.jit
def _cross_entropy_kernel(
    p_x, p_target, p_loss, p_lse, p_scale, p_dx,
    n_cols, stride_x_row, stride_target, stride_scale, stride_dx_row,
    ignore_index, label_smoothing, z_loss, softcap,
    COMPUTE_LOSS: tl.constexpr, WRITE_GRAD: tl.constexpr, HAS_SMOOTHING: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr, BLOCK_N: tl.constexpr,
    p_weight=None, p_weight_sum=None, p_z_ratio=None, p_z_rows=None, p_correct=None,
    HAS_WEIGHT: tl.constexpr = False, SPLIT_Z: tl.constexpr = False, STORE_CORRECT: tl.constexpr = False,
    STAGES: tl.constexpr = 1,
):  # fmt: skip
    """One program per row of x (n_cols logits), target t, smoothing e, z-loss z, softcap c.

    y = c * tanh(x / c) (or x), lse = log(sum_j exp(y_j)), p = exp(y - lse);
    loss = lse - (1 - e) * y_t - (e / n_cols) * sum_j y_j + z * lse^2  (0 where t == ignore_index);
    d(loss)/dy_j = p_j * (1 + 2 z lse) - (1 - e) [j == t] - e / n_cols,  dy/dx = 1 - (y / c)^2.
    COMPUTE_LOSS: one online pass (running max m, sum s of exp(y - m) rescaled when m grows) stores
    loss and lse (fp32); otherwise lse is loaded. WRITE_GRAD: a second pass stores
    scale_row * d(loss)/dx into dx (dx may be x itself: each block is read before it is written).
    A target outside [0, n_cols) other than ignore_index is never dereferenced; its row gets NaN.

    The options, absent by default (constexpr None and False: the plain kernel compiles without them):
    HAS_WEIGHT, class weights w (W = sum_j w_j at p_weight_sum) as torch's weighted cross-entropy:
      loss = (1 - e) w_t (lse - y_t) + (e / n_cols) (W lse - sum_j w_j y_j) + z * lse^2,
      d(loss)/dy_j = p_j ((1 - e) w_t + e W / n_cols + 2 z lse r) - (1 - e) w_t [j == t] - (e / n_cols) w_j,
    r (at p_z_ratio) the z-term's scale over the rest's (a weighted mean divides the two by different counts);
    SPLIT_Z: the z-term z * lse^2 stored on its own (p_z_rows), not in the loss; STORE_CORRECT: 1.0 where the first
    index of the row's largest logit is t, else 0.0 (p_correct). Ignored rows store 0, out-of-range ones NaN.
    STAGES > 1: each pass's loads are issued that many blocks ahead (asynchronous copies into shared memory).
    """
    i_row = tl.program_id(0).to(tl.int64)
    p_x_row = p_x + i_row * stride_x_row
    target = tl.load(p_target + i_row * stride_target).to(tl.int64)
    ignored = target == ignore_index
    in_range = (target >= 0) & (target < n_cols)
    if COMPUTE_LOSS:
        m = tl.full((), float("-inf"), tl.float32)
        s = tl.zeros((), tl.float32)
        sum_y = tl.zeros((), tl.float32)
        if STORE_CORRECT:  # the largest logit so far, and its index
            best = tl.full((), float("-inf"), tl.float32)
            best_index = tl.zeros((), tl.int32)
        for start in tl.range(0, n_cols, BLOCK_N, num_stages=STAGES):
            o_n = start + tl.arange(0, BLOCK_N)
            m_n = o_n < n_cols
            b_x = tl.load(p_x_row + o_n, mask=m_n, other=0.0).to(tl.float32)
            b_y = tl.where(m_n, softcapped(b_x, softcap, HAS_SOFTCAP), float("-inf"))  # [BLOCK_N]
            m, s = online_update(m, s, b_y)
            if HAS_SMOOTHING:  # sum_j y_j, or sum_j w_j y_j
                b_wy = b_y * tl.load(p_weight + o_n, mask=m_n, other=0.0).to(tl.float32) if HAS_WEIGHT else b_y
                sum_y += tl.sum(tl.where(m_n, b_wy, 0.0), axis=0)
            if STORE_CORRECT:
                best, best_index = _first_argmax(best, best_index, tl.where(m_n, b_x, float("-inf")), o_n, n_cols)
        lse = finite_or_zero(m) + tl.log(s)
        x_t = tl.load(p_x_row + target, mask=in_range & ~ignored, other=0.0).to(tl.float32)
        if HAS_WEIGHT:
            w_t = _class_weight(p_weight, target, in_range & ~ignored)
            loss = (1.0 - label_smoothing) * w_t * (lse - softcapped(x_t, softcap, HAS_SOFTCAP))
        else:
            loss = lse - (1.0 - label_smoothing) * softcapped(x_t, softcap, HAS_SOFTCAP)
        if not SPLIT_Z:
            loss += z_loss * lse * lse
        if HAS_SMOOTHING:
            if HAS_WEIGHT:
                loss += label_smoothing / n_cols * (tl.load(p_weight_sum) * lse - sum_y)
            else:
                loss -= label_smoothing / n_cols * sum_y
        loss = tl.where(ignored, 0.0, tl.where(in_range, loss, float("nan")))
        tl.store(p_loss + i_row, loss)
        tl.store(p_lse + i_row, lse)
        if SPLIT_Z:
            tl.store(p_z_rows + i_row, tl.where(ignored, 0.0, tl.where(in_range, z_loss * lse * lse, float("nan"))))
        if STORE_CORRECT:
            correct = tl.where(best_index == target, 1.0, 0.0)
            tl.store(p_correct + i_row, tl.where(ignored, 0.0, tl.where(in_range, correct, float("nan"))))
    else:
        lse = tl.load(p_lse + i_row)
    if WRITE_GRAD:
        scale = tl.load(p_scale + i_row * stride_scale).to(tl.float32)
        scale = tl.where(in_range | ignored, scale, float("nan"))
        if HAS_WEIGHT:
            target_weight = (1.0 - label_smoothing) * _class_weight(p_weight, target, in_range & ~ignored)
            grad_factor = target_weight + 2.0 * z_loss * lse * tl.load(p_z_ratio)
            if HAS_SMOOTHING:
                grad_factor += label_smoothing / n_cols * tl.load(p_weight_sum)
        else:
            target_weight = None  # write_logit_grads' unweighted form: 1 - label_smoothing
            grad_factor = 1.0 + 2.0 * z_loss * lse
        write_logit_grads(p_x_row, p_dx + i_row * stride_dx_row, n_cols, lse, grad_factor, target, target_weight,
                          scale, ignored, label_smoothing, n_cols, softcap, p_weight, BLOCK_N, HAS_SMOOTHING,
                          HAS_SOFTCAP, HAS_WEIGHT, STAGES)  # fmt: skip
