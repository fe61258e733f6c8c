"""GELU (exact and tanh), SiLU and the gated SwiGLU / GeGLU kernels, forward and backward.

The activation f and its derivative f' are jit helpers with an ``ACT`` switch (GELU_ERF, GELU_TANH, SILU); one kernel
pair serves the plain activations and one the gated ones. The backward recomputes f'(x) from x, so it reads x and
dy and writes dx: three passes over the data. Issue-bound arithmetic goes through PTX's approximate ex2 and
reciprocal (tritonkit._core.jit.fastmath.approx): the erf GELU forward compiled to 37 instructions an element with
libdevice's erf and tl.exp, 25 with these.
"""

import triton
import triton.language as tl

from tritonkit._core.jit.fastmath import LOG2_E, approx

GELU_ERF, GELU_TANH, SILU = 0, 1, 2  # the ACT switch


@triton.jit
def _sigmoid(v):
    """1 / (1 + exp(-v)); exp(-v) overflows to inf for v < -88, which gives 0."""
    return approx(1.0 + approx(v * -LOG2_E, "ex2"), "rcp")


@triton.jit
def _normal_cdf(x):
    """Phi(x) = erfc(-x / sqrt 2) / 2 from a Chebyshev fit of erfc on z = |x| / sqrt 2 >= 0 (Numerical
    Recipes' erfcc, relative error below 1.2e-7): erfc(z) = t exp(P(t) - z^2), t = 1 / (1 + z/2), with P of
    degree 9 in Horner form below (its coefficients times log2 e, for exp2; the constant term also takes
    the halving, as 2^-1); Phi = erfc(z) / 2 for x < 0 and 1 - erfc(z) / 2 for x >= 0.

    One exp2 and one reciprocal, where libdevice's erf held the bf16 GELU forward to 67% of bandwidth
    (docs/kernels/activation.md). Checked in fp32 over [-12, 12] against float64: GELU within 4e-7 (torch's fp32
    GELU: 1.2e-6), and within 2e-5 relative in the negative tail, where 1 + erf(x / sqrt 2) cancels."""
    t = approx(1.0 + 0.35355339059327373 * tl.abs(x), "rcp")
    p = t * (0.17087277 * LOG2_E) - 0.82215223 * LOG2_E
    p = p * t + 1.48851587 * LOG2_E
    p = p * t - 1.13520398 * LOG2_E
    p = p * t + 0.27886807 * LOG2_E
    p = p * t - 0.18628806 * LOG2_E
    p = p * t + 0.09678418 * LOG2_E
    p = p * t + 0.37409196 * LOG2_E
    p = p * t + 1.00002368 * LOG2_E
    p = p * t - (1.26551223 * LOG2_E + 1.0)
    half_erfc = t * approx(p - x * x * (0.5 * LOG2_E), "ex2")
    return tl.where(x >= 0, 1.0 - half_erfc, half_erfc)


@triton.jit
def _act(x, ACT: tl.constexpr):
    """GELU: f = x/2 (1 + erf(x / sqrt 2)) = x Phi(x);  GELU tanh: f = x/2 (1 + tanh(u)) = x sigmoid(2u)
    with u = sqrt(2/pi) (x + 0.044715 x^3);  SiLU: f = x sigmoid(x). x in fp32."""
    if ACT == 0:
        f = x * _normal_cdf(x)
    elif ACT == 1:
        f = x * _sigmoid(1.5957691216057308 * (x + 0.044715 * x * x * x))  # 2u
    else:
        f = x * _sigmoid(x)
    return f


@triton.jit
def _act_grad(x, ACT: tl.constexpr):
    """f'(x) for the activations of :func:`_act`:
    GELU:      f' = Phi(x) + x exp(-x^2 / 2) / sqrt(2 pi), Phi(x) = (1 + erf(x / sqrt 2)) / 2
    GELU tanh: f' = sigmoid(2u) + x/2 sech^2(u) sqrt(2/pi) (1 + 3 * 0.044715 x^2), with e = exp(-2|u|),
               r = 1 / (1 + e): sech^2(u) = 4 e r^2 and sigmoid(2u) = r for u >= 0, e r for u < 0. Written
               from tanh(u) instead, 1 - t^2 and 1 + t cancel to 0 in fp32 once |u| > ~8 (x < -4.5),
               where f' is still ~1e-6.
    SiLU:      f' = s (1 + x (1 - s)), s = sigmoid(x)."""
    if ACT == 0:
        g = _normal_cdf(x) + x * approx(x * x * (-0.5 * LOG2_E), "ex2") * 0.3989422804014327
    elif ACT == 1:
        u = 0.7978845608028654 * (x + 0.044715 * x * x * x)
        e = approx(tl.abs(u) * (-2.0 * LOG2_E), "ex2")
        r = approx(1.0 + e, "rcp")
        sigmoid_2u = tl.where(u >= 0, r, e * r)
        g = sigmoid_2u + 0.5 * x * (4.0 * e * r * r) * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * x * x)
    else:
        s = _sigmoid(x)
        g = s * (1.0 + x * (1.0 - s))
    return g


@triton.jit
def _activation_fwd_kernel(p_x, p_y, n_elements, ACT: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """y = f(x), computed in fp32."""
    o_x = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    m_x = o_x < n_elements
    b_x = tl.load(p_x + o_x, mask=m_x).to(tl.float32)
    tl.store(p_y + o_x, _act(b_x, ACT).to(p_y.dtype.element_ty), mask=m_x)


@triton.jit
def _activation_bwd_kernel(p_dy, p_x, p_dx, n_elements, ACT: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """dx = dy * f'(x)."""
    o_x = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    m_x = o_x < n_elements
    b_dy = tl.load(p_dy + o_x, mask=m_x).to(tl.float32)
    b_x = tl.load(p_x + o_x, mask=m_x).to(tl.float32)
    tl.store(p_dx + o_x, (b_dy * _act_grad(b_x, ACT)).to(p_dx.dtype.element_ty), mask=m_x)


@triton.jit
def _gated_fwd_kernel(p_gate, p_up, p_y, n_elements, ACT: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """y = f(gate) * up (SwiGLU with SiLU, GeGLU with GELU)."""
    o_x = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    m_x = o_x < n_elements
    b_gate = tl.load(p_gate + o_x, mask=m_x).to(tl.float32)
    b_up = tl.load(p_up + o_x, mask=m_x).to(tl.float32)
    tl.store(p_y + o_x, (_act(b_gate, ACT) * b_up).to(p_y.dtype.element_ty), mask=m_x)


@triton.jit
def _gated_bwd_kernel(p_dy, p_gate, p_up, p_dgate, p_dup, n_elements, ACT: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """dgate = dy * up * f'(gate);  dup = dy * f(gate)."""
    o_x = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    m_x = o_x < n_elements
    b_dy = tl.load(p_dy + o_x, mask=m_x).to(tl.float32)
    b_gate = tl.load(p_gate + o_x, mask=m_x).to(tl.float32)
    b_up = tl.load(p_up + o_x, mask=m_x).to(tl.float32)
    tl.store(p_dgate + o_x, (b_dy * b_up * _act_grad(b_gate, ACT)).to(p_dgate.dtype.element_ty), mask=m_x)
    tl.store(p_dup + o_x, (b_dy * _act(b_gate, ACT)).to(p_dup.dtype.element_ty), mask=m_x)
