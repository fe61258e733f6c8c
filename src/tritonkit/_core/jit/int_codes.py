"""Small unsigned integer codes (quantized values) as fp32 by their bits, without the integer-to-float conversion."""

import triton
import triton.language as tl

# 2^23: the fp32 of bits 0x4B000000 | n (exponent 23, n in the mantissa) is exactly 2^23 + n for 0 <= n < 2^23.
CODE_BIAS = tl.constexpr(8388608.0)


@triton.jit
def biased_code_as_float(b_n):
    """2^23 + n in fp32 for int32 0 <= n < 2^23, exactly, by its bits: one OR. A caller that subtracts an offset
    carrying the same 2^23 (a zero point plus CODE_BIAS) gets n minus the offset exactly, in one FADD."""
    return (b_n | 0x4B000000).to(tl.float32, bitcast=True)


@triton.jit
def code_as_float(b_n):
    """n as exact fp32 for int32 0 <= n < 2^23, by its bits: 2^23 + n less 2^23. Integer operations and one FADD in
    place of the I2F conversion, which a multiprocessor issues at 16 a clock against 128 FADDs (flash decoding's int4
    values: 0.05x of paged bf16's speed through I2F and per-value scale loads, 0.7x through this and per-group
    loads, H100)."""
    return biased_code_as_float(b_n) - CODE_BIAS
