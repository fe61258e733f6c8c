"""Codes of int8 and float8 quantization in fp32, the same on a GPU and under the interpreter: the quant family's
kernels and the GEMM that quantizes its activations as it reads them produce the same codes from the same values.

For a region R of values (a tensor, a row, a 1 x G group, a G x G block), with qmax the format's largest value (int8
127, float8 e4m3 448, e5m2 57344): amax_R = max |x| over R's finite values, scale_R = amax_R / qmax (1 when amax_R is
0), q = saturate(round(x / scale_R)); round to the nearest integer or float8 value, ties to even; saturate clamps to
[-qmax, qmax], so +-inf becomes +-qmax; NaN becomes 0 in int8 and stays NaN in float8. The divisions are IEEE
(div_rn), as torch's of a tensor by a tensor.

Float8 rounding takes one of two routes to the same codes: compiled for a GPU with float8 conversions (sm_89 and
newer), the conversion itself rounds (cvt.rn.satfinite: to nearest, ties to even, one instruction for two values);
under the interpreter, whose conversion rounds wrongly, rounding.round_to_float8 puts the value on the format's grid
in fp32 arithmetic first (about a dozen instructions a value), and the conversion is then exact.
"""

import triton
import triton.language as tl

from tritonkit._core.jit.rounding import round_half_even, round_to_float8


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
def amax_scale(amax, KIND: tl.constexpr):
    """amax / qmax, or 1 for a region of zeros."""
    return tl.where(amax > 0.0, tl.math.div_rn(amax, qmax(KIND)), 1.0)


@triton.jit
def codes(b_x, b_scale, KIND: tl.constexpr, HARDWARE_ROUNDING: tl.constexpr):
    """The codes of b_x (fp32) at b_scale (broadcast to it): see the module docstring. HARDWARE_ROUNDING: float8
    values rounded by the conversion (a GPU of sm_89 or newer), else in fp32 arithmetic first."""
    top = qmax(KIND)
    b_y = tl.minimum(tl.maximum(tl.math.div_rn(b_x, b_scale), -top), top)
    nan = b_x != b_x
    if KIND == "int8":
        b_q = tl.where(nan, 0.0, round_half_even(b_y)).to(tl.int8)
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
