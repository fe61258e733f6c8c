"""Codes of int8 and float8 quantization in fp32, the same on a GPU and under the interpreter: the quant family's
kernels and the GEMM that quantizes its activations as it reads them produce the same codes from the same values.

For a region R of values (a tensor, a row, a 1 x G group, a G x G block), with qmax the format's largest value (int8
127, float8 e4m3 448, e5m2 57344): amax_R = max |x| over R's finite values, scale_R = amax_R / qmax (1 when amax_R is
0), q = saturate(round(x / scale_R)); round to the nearest integer or float8 value, ties to even; saturate clamps to
[-qmax, qmax], so +-inf becomes +-qmax; NaN becomes 0 in int8 and stays NaN in float8. The divisions are IEEE
(div_rn's value), as torch's of a tensor by a tensor; :func:`quotient` takes them from each scale's reciprocal and a
correction, which gives the same values with no reciprocal a value, and int8 codes come from the rounded value's
bits (:func:`rounding.rounded_int32`), not a float-to-int conversion: on sm_90 both are 16 a clock per
multiprocessor, a quarter of the fp32 rate, and took two of them a value from a kernel that should move bytes.

Float8 rounding takes one of two routes to the same codes: compiled for a GPU with float8 conversions (sm_89 and
newer), the conversion itself rounds (cvt.rn.satfinite: to nearest, ties to even, one instruction for two values);
under the interpreter, whose conversion rounds wrongly, rounding.round_to_float8 puts the value on the format's grid
in fp32 arithmetic first (about a dozen instructions a value), and the conversion is then exact.
"""

import triton
import triton.language as tl

from tritonkit._core.env import interpreting
from tritonkit._core.jit.rounding import round_to_float8, rounded_int32

# Whether these kernels run through the interpreter (fixed as they are defined, as Triton fixes it): its fused
# multiply-add rounds the product before the sum, so there the residual below is taken in fp64, exactly.
_INTERPRETED = tl.constexpr(interpreting())
# Scales whose reciprocal, and the residual of every value that can round to a nonzero code (x >= scale 2^-17),
# stay normal fp32 numbers, so that the quotient from the reciprocal is the correctly rounded one: the residual is
# about 2^-24 x >= 2^-101 from scale >= 2^-60. A region with a scale outside them divides (amax from about 1e-12 to
# 1e30 falls inside for every format).
_QUOTIENT_MIN_SCALE = tl.constexpr(2.0**-60)
_QUOTIENT_MAX_SCALE = tl.constexpr(2.0**100)


@triton.jit
def qmax(KIND: tl.constexpr):
    """The format's largest value: int8 127, e4m3 448, e5m2 57344."""
    top: tl.constexpr = 127.0 if KIND == "int8" else (448.0 if KIND == "e4m3" else 57344.0)
    return top


@triton.jit
def finite_abs(b_x):
    """|x| where x is finite, 0 elsewhere (inf and NaN set no scale)."""
    b_abs = tl.abs(b_x)
    return tl.where(b_abs < float("inf"), b_abs, 0.0)


@triton.jit
def finite_row_amax(b_x):
    """max |x| over each row of b_x ([R, C] fp32) among its finite values (0 for a row with none), one maximum a value:
    on a GPU tl.max passes NaN over (max.f32 returns the other operand) and |x| is a free operand modifier, so only
    an infinity can win wrongly; where a row's maximum is not finite (an infinity, or a NaN under the interpreter,
    whose maximum propagates it) the tile takes the finite-only maximum (finite_abs: a compare and a select a value)
    instead."""
    amax = tl.max(tl.abs(b_x), axis=1)
    worst = tl.max(amax, axis=0)
    if (worst == float("inf")) | (worst != worst):
        amax = tl.max(finite_abs(b_x), axis=1)
    return amax


@triton.jit
def amax_scale(amax, KIND: tl.constexpr):
    """amax / qmax, or 1 for a region of zeros."""
    return tl.where(amax > 0.0, tl.math.div_rn(amax, qmax(KIND)), 1.0)


@triton.jit
def quotient(b_x, b_scale):
    """x / scale rounded to the nearest fp32, ties to even: div_rn's value, without a reciprocal a value (MUFU.RCP,
    16 a clock per multiprocessor on sm_90) and its refinement. With r = div_rn(1, scale) once a scale,
    q = x r is within an ulp of x / scale, the residual e = x - q scale is exact in one fused multiply-add, and
    q + e r rounds to x / scale correctly (Markstein's division) wherever nothing under- or overflows: for scales in
    [_QUOTIENT_MIN_SCALE, _QUOTIENT_MAX_SCALE] (a region with another takes div_rn throughout) and finite x
    (+-inf and NaN keep x r: +-inf and NaN, as div_rn gives; so does an exact q, e = 0, and with it -0's sign)."""
    in_range = (b_scale >= _QUOTIENT_MIN_SCALE) & (b_scale <= _QUOTIENT_MAX_SCALE)
    # A block's scale is a scalar, a row's or group's a column: as a tensor of at least one element either way.
    if tl.min(tl.zeros([1], tl.int32) + tl.where(in_range, 1, 0)) == 1:
        b_r = tl.math.div_rn(1.0, b_scale)
        b_q = b_x * b_r
        if _INTERPRETED:  # -q scale is exact in fp64, and so is its sum with x (they nearly cancel)
            b_e = (b_x.to(tl.float64) - b_q.to(tl.float64) * b_scale.to(tl.float64)).to(tl.float32)
        else:
            b_e = tl.fma(-b_q, b_scale, b_x)
        # An exact q keeps its own value: adding e = +0 would turn -0 (x = -0) into +0, which -0 / scale is not.
        b_q = tl.where((tl.abs(b_q) < float("inf")) & (b_e != 0.0), tl.fma(b_e, b_r, b_q), b_q)
    else:
        b_q = tl.math.div_rn(b_x, b_scale)
    return b_q


@triton.jit
def codes(b_x, b_scale, KIND: tl.constexpr, HARDWARE_ROUNDING: tl.constexpr, INF_IS_NAN: tl.constexpr = False):
    """The codes of b_x (fp32) at b_scale (broadcast to it): see the module docstring. HARDWARE_ROUNDING: float8
    values rounded by the conversion (a GPU of sm_89 or newer), else in fp32 arithmetic first. int8 codes are the
    rounded quotient's low bits (rounded_int32), not a float-to-int conversion. INF_IS_NAN (float8 only): +-inf
    becomes NaN instead of +-qmax, so that a product of the codes shows the overflow (float8 training's GEMMs)."""
    top = qmax(KIND)
    b_y = tl.minimum(tl.maximum(quotient(b_x, b_scale), -top), top)
    nan = b_x != b_x
    if INF_IS_NAN:
        nan = nan | (tl.abs(b_x) == float("inf"))
    if KIND == "int8":
        b_q = tl.where(nan, 0, rounded_int32(b_y)).to(tl.int8)
    else:
        if HARDWARE_ROUNDING:
            b_q = b_y.to(tl.float8e4nv if KIND == "e4m3" else tl.float8e5, fp_downcast_rounding="rtne")
        elif KIND == "e4m3":
            b_q = round_to_float8(b_y, 3, -6).to(tl.float8e4nv)
        else:
            b_q = round_to_float8(b_y, 2, -14).to(tl.float8e5)
        # NaN by its bits, 0x7F in both formats: the interpreter converts an fp32 NaN to e4m3 as 384.
        b_q = tl.where(nan, tl.full(b_q.shape, 0x7F, tl.uint8).to(b_q.dtype, bitcast=True), b_q)
    return b_q
