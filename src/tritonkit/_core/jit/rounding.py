"""Rounding to integers and to float8 grids in fp32, the same on a GPU and under the interpreter (quantization), and
rows scaled by powers of two into fp16's range."""

import triton
import triton.language as tl

# 1.5 * 2**23: adding it to an fp32 of magnitude below 2**22 leaves no fraction bits, so the addition rounds to the
# nearest integer, ties to even, as torch.round does.
_ROUND_SHIFT = tl.constexpr(12582912.0)
_ROUND_SHIFT_BITS = tl.constexpr(0x4B400000)  # its fp32 bits: the sum's bits less these are the rounded integer


@triton.jit
def round_half_even(x):
    """x rounded to the nearest integer, ties to even (|x| < 2**22)."""
    return (x + _ROUND_SHIFT) - _ROUND_SHIFT


@triton.jit
def rounded_int32(x):
    """x rounded to the nearest integer, ties to even (|x| < 2**22), as an int32 without a float-to-int conversion
    (F2I: 16 a clock per multiprocessor on sm_90, a quarter of the fp32 rate): the integer is the low bits of
    x + 1.5 * 2**23, read as an int32 less those of 1.5 * 2**23."""
    return (x + _ROUND_SHIFT).to(tl.int32, bitcast=True) - _ROUND_SHIFT_BITS


@triton.jit
def round_to_float8(y, MANTISSA_BITS: tl.constexpr, MIN_EXPONENT: tl.constexpr):
    """y (within the format's range) rounded to the nearest value of a float8 format with MANTISSA_BITS fraction
    bits and smallest normal exponent MIN_EXPONENT (e4m3: 3, -6; e5m2: 2, -14), ties to even, in fp32: the
    conversion that follows is then exact, and gives the same codes on a GPU and under the interpreter (whose own
    rounding misses the carry into the exponent: 127.0 became 64 in e4m3). The step is 2^(e - MANTISSA_BITS) for
    2^e <= |y|, and 2^(MIN_EXPONENT - MANTISSA_BITS) among the subnormals. y's sign bit goes back on after the
    rounding, so that -0 and a tiny negative y give -0, as the hardware's conversion and torch's do. NaN stays NaN.
    The step is a power of two, so |y| is divided by it exactly as a product with its reciprocal, also a power of
    two (a division per value would cost a reciprocal on the special-function unit, a quarter of the FMA rate)."""
    biased = (y.to(tl.int32, bitcast=True) >> 23) & 0xFF  # fp32's biased exponent of y
    step_biased = tl.maximum(biased, 127 + MIN_EXPONENT) - MANTISSA_BITS  # the step's biased exponent
    step = (step_biased << 23).to(tl.float32, bitcast=True)
    inverse = ((254 - step_biased) << 23).to(tl.float32, bitcast=True)  # 2^(127 - s) for step 2^(s - 127)
    rounded = round_half_even(tl.abs(y) * inverse) * step
    sign = y.to(tl.int32, bitcast=True) & -2147483648  # 0x80000000: fp32's sign bit
    return (rounded.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)


@triton.jit
def round_to_bf16_grid(x):
    """x (fp32, finite) rounded to the nearest bf16 value, ties to even, kept in fp32: by its bits, the lower 16
    dropped after adding half their range (plus the kept part's last bit, for the ties). The conversion to bf16 that
    may follow is then exact, also under the interpreter, whose own conversion truncates."""
    bits = x.to(tl.int32, bitcast=True)
    bits = (bits + (0x7FFF + ((bits >> 16) & 1))) & -65536
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def to_dot_operand(x, DTYPE: tl.constexpr, UPCAST: tl.constexpr):
    """An fp32 tile as a 16-bit dot operand: rounded to nearest even in DTYPE. UPCAST (bf16 under the interpreter,
    whose bf16 dots and conversions are wrong): rounded by its bits and kept in fp32 (dots.dot_fp32 takes it so)."""
    return round_to_bf16_grid(x) if UPCAST else x.to(DTYPE)


@triton.jit
def rows_as_fp16(b_x):
    """(x', f): the rows of a 16-bit x [M, K] scaled by powers of two into fp16, x = x' f[:, None]: each row's largest
    |value| brought into [1, 2), so that bf16's range fits fp16's and its values stay exact (fp16 holds every bf16
    significand), except those below 2^-14 of their row's largest, which become fp16 subnormals."""
    x32 = b_x.to(tl.float32)
    amax = tl.max(tl.abs(x32), axis=1)
    biased = tl.minimum(tl.maximum((amax.to(tl.int32, bitcast=True) >> 23) & 0xFF, 1), 253)  # exponents kept normal
    down = ((254 - biased) << 23).to(tl.float32, bitcast=True)  # 2^(127 - biased)
    return (x32 * down[:, None]).to(tl.float16), (biased << 23).to(tl.float32, bitcast=True)
