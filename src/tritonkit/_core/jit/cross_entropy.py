"""Cross-entropy's per-element pieces, for the loss kernels: the final-logit softcap and d(loss)/d(logit)."""

import triton
import triton.language as tl

from tritonkit._core.jit.fastmath import tanh_via_exp2


@triton.jit
def softcapped(b_x, softcap, HAS_SOFTCAP: tl.constexpr):
    """y = softcap * tanh(x / softcap) (Gemma 2's final-logit softcap), or x."""
    if HAS_SOFTCAP:
        b_x = softcap * tanh_via_exp2(b_x / softcap)
    return b_x


@triton.jit
def logit_grad(b_y, lse, is_target, label_smoothing, z_loss, n_classes, softcap, HAS_SMOOTHING: tl.constexpr,
               HAS_SOFTCAP: tl.constexpr):  # fmt: skip
    """d(loss)/dx for a block of logits x whose (capped) values are b_y, with
    loss = lse - (1 - e) y_t - (e / V) sum_j y_j + z lse^2 over V = n_classes:
    (exp(y - lse) (1 + 2 z lse) - (1 - e) [j == t] - e / V) (1 - (y / c)^2), the last factor with the softcap c."""
    b_dy = tl.exp(b_y - lse) * (1.0 + 2.0 * z_loss * lse) - tl.where(is_target, 1.0 - label_smoothing, 0.0)
    if HAS_SMOOTHING:
        b_dy -= label_smoothing / n_classes
    if HAS_SOFTCAP:
        b_dy *= 1.0 - (b_y / softcap) * (b_y / softcap)
    return b_dy
