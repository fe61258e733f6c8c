"""Cross-entropy's pieces, for the loss kernels: the final-logit softcap and a row's pass writing d(loss)/d(logits)."""

import triton
import triton.language as tl


@triton.jit
def softcapped(b_x, softcap, HAS_SOFTCAP: tl.constexpr):
    """y = softcap * tanh(x / softcap) (Gemma 2's final-logit softcap), or x. tanh(u) = 1 - 2 / (exp(2u) + 1):
    exact at +-inf (exp overflowing to inf gives 1) and within a few fp32 ulp of 1 elsewhere, which is all y needs."""
    if HAS_SOFTCAP:
        b_x = softcap * (1.0 - 2.0 / (tl.exp(2.0 * b_x / softcap) + 1.0))
    return b_x


@triton.jit
def write_logit_grads(p_x_row, p_dx_row, n_cols, lse, grad_factor, target, target_weight, scale, ignored,
                      label_smoothing, n_classes, softcap, p_weight, BLOCK_N: tl.constexpr, HAS_SMOOTHING: tl.constexpr,
                      HAS_SOFTCAP: tl.constexpr, HAS_WEIGHT: tl.constexpr, STAGES: tl.constexpr = 1):  # fmt: skip
    """One row's gradient pass: dx_j = scale d(loss)/dx_j over the row's n_cols logits x_j (classes j, compared with
    ``target`` in the same numbering), 0 where ``ignored``; the row's lse given. dx may be x itself: each block is
    read before it is written.

    d(loss)/dx_j = (exp(y_j - lse) g - w [j == t] - s_j) (1 - (y_j / c)^2), y = softcapped(x), the last factor with
    the softcap c. For loss = lse - (1 - e) y_t - (e / V) sum_j y_j + z lse^2 over V = n_classes: the row's factor
    g = 1 + 2 z lse, the target's weight w = 1 - e (``target_weight`` is not read) and s_j = e / V. HAS_WEIGHT, class
    weights w_j at p_weight as torch's weighted cross-entropy (W = sum_j w_j): g = (1 - e) w_t + e W / V + 2 z lse r
    (r the z-term's scale over the rest's, for a weighted mean), w = ``target_weight`` = (1 - e) w_t and
    s_j = (e / V) w_j. STAGES > 1: the blocks' loads are issued that many steps ahead (asynchronous copies).
    """
    for start in tl.range(0, n_cols, BLOCK_N, num_stages=STAGES):
        o_n = start + tl.arange(0, BLOCK_N)
        m_n = o_n < n_cols
        b_y = softcapped(tl.load(p_x_row + o_n, mask=m_n, other=0.0).to(tl.float32), softcap, HAS_SOFTCAP)
        if HAS_WEIGHT:
            b_dy = tl.exp(b_y - lse) * grad_factor - tl.where(o_n == target, target_weight, 0.0)
            if HAS_SMOOTHING:
                b_dy -= label_smoothing / n_classes * tl.load(p_weight + o_n, mask=m_n, other=0.0).to(tl.float32)
        else:
            b_dy = tl.exp(b_y - lse) * grad_factor - tl.where(o_n == target, 1.0 - label_smoothing, 0.0)
            if HAS_SMOOTHING:
                b_dy -= label_smoothing / n_classes
        if HAS_SOFTCAP:
            b_dy *= 1.0 - (b_y / softcap) * (b_y / softcap)
        b_dx = tl.where(ignored, 0.0, b_dy * scale)  # [BLOCK_N]
        tl.store(p_dx_row + o_n, b_dx.to(p_dx_row.dtype.element_ty), mask=m_n)
