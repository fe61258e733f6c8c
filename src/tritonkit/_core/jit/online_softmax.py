"""Steps of softmax over a row held in pieces: the safe maximum, and pieces' (max, sum) pairs combined."""

import triton
import triton.language as tl

from tritonkit._core.jit.fastmath import exp_via_exp2


@triton.jit
def finite_or_zero(m):
    """A row maximum usable in exponents: -inf (a fully masked row) becomes 0, so exp(x - m) stays exact (0) for
    the row's -inf entries instead of NaN."""
    return tl.where(m == float("-inf"), 0.0, m)


@triton.jit
def combined_max_and_sum(b_maxes, b_sums):
    """The maximum m of a row and its s = sum(exp(x - m)) from pieces' maxima m_b and sums s_b = sum(exp(x - m_b)):
    s = sum_b s_b exp(m_b - m), m through finite_or_zero. Summed in the pieces' order (deterministic)."""
    m_safe = finite_or_zero(tl.max(b_maxes, axis=0))
    return m_safe, tl.sum(b_sums * exp_via_exp2(b_maxes - m_safe), axis=0)


@triton.jit
def online_update(m, s, b_y):
    """One step of softmax over a row read in blocks: from the running maximum m and sum s = sum(exp(y - m)) so far
    and a new block b_y (masked entries -inf), the new (m, s), the old sum rescaled by exp(m - m_new)."""
    m_new = tl.maximum(m, tl.max(b_y, axis=0))
    m_safe = finite_or_zero(m_new)
    return m_new, s * tl.exp(m - m_safe) + tl.sum(tl.exp(b_y - m_safe), axis=0)
