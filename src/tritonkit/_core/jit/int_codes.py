"""Small unsigned integer codes (quantized values) as fp32 by their bits, without the integer-to-float conversion."""

import triton
import triton.language as tl

from tritonkit._core.jit.dots import as_fp32
from tritonkit._core.jit.fastmath import PTX_MATH

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


# Each nibble j of a 32-bit word (bits 4 j ..) masked in place under 2^23's exponent by one LOP3, (w & mask) | 2^23's
# bits (LUT 0xEA); the three nibbles above bit 20 from the word shifted right by 20 once. ptxas left to itself gave
# two LOP3s a value (the AND, then the OR).
_WORD_NIBBLES = tl.constexpr("""{
.reg .b32 high;
lop3.b32 $0, $8, 0xF, 0x4B000000, 0xEA;
lop3.b32 $1, $8, 0xF0, 0x4B000000, 0xEA;
lop3.b32 $2, $8, 0xF00, 0x4B000000, 0xEA;
lop3.b32 $3, $8, 0xF000, 0x4B000000, 0xEA;
lop3.b32 $4, $8, 0xF0000, 0x4B000000, 0xEA;
shr.u32 high, $8, 20;
lop3.b32 $5, high, 0xF, 0x4B000000, 0xEA;
lop3.b32 $6, high, 0xF0, 0x4B000000, 0xEA;
lop3.b32 $7, high, 0xF00, 0x4B000000, 0xEA;
}""")


@triton.jit
def word_nibbles_as_floats(b_word):
    """The eight 4-bit codes q_j of int32 words (nibble j at bits 4 j ..) as eight fp32 tiles v_j = 2^23 + 2^e_j q_j,
    exactly, by their bits, e_j = 0, 4, 8, 12, 16, 0, 4, 8: the nibble masked in place (e_j <= 16 keeps it inside the
    23-bit mantissa), the top three from the word shifted by 20. Less 2^23 + 2^e_j z, a value is 2^e_j (q_j - z)
    exactly: nine instructions a word (PTX; the interpreter and other GPUs take the same operations in Triton)."""
    if PTX_MATH:
        v0, v1, v2, v3, v4, v5, v6, v7 = tl.inline_asm_elementwise(
            _WORD_NIBBLES, "=r,=r,=r,=r,=r,=r,=r,=r,r", [b_word], dtype=(tl.float32,) * 8, is_pure=True, pack=1
        )
    else:
        high = (b_word >> 20) & 0xFFF
        v0 = ((b_word & 0xF) | 0x4B000000).to(tl.float32, bitcast=True)
        v1 = ((b_word & 0xF0) | 0x4B000000).to(tl.float32, bitcast=True)
        v2 = ((b_word & 0xF00) | 0x4B000000).to(tl.float32, bitcast=True)
        v3 = ((b_word & 0xF000) | 0x4B000000).to(tl.float32, bitcast=True)
        v4 = ((b_word & 0xF0000) | 0x4B000000).to(tl.float32, bitcast=True)
        v5 = ((high & 0xF) | 0x4B000000).to(tl.float32, bitcast=True)
        v6 = ((high & 0xF0) | 0x4B000000).to(tl.float32, bitcast=True)
        v7 = ((high & 0xF00) | 0x4B000000).to(tl.float32, bitcast=True)
    return v0, v1, v2, v3, v4, v5, v6, v7


# Each signed byte j of a 32-bit word placed under 2^23's exponent by one PRMT (bytes: j from the word with its sign
# bits flipped, then 0x00, 0x00, 0x4B from 0x4B000000: selector 0x754j), after one XOR a word that adds 128 to every
# byte (-128 .. 127 to 0 .. 255).
_WORD_BYTES = tl.constexpr("""{
.reg .b32 flipped;
xor.b32 flipped, $4, 0x80808080;
prmt.b32 $0, flipped, 0x4B000000, 0x7540;
prmt.b32 $1, flipped, 0x4B000000, 0x7541;
prmt.b32 $2, flipped, 0x4B000000, 0x7542;
prmt.b32 $3, flipped, 0x4B000000, 0x7543;
}""")
# What word_bytes_as_floats' values carry besides their code: 2^23 + 128.
SIGNED_BYTE_BIAS = tl.constexpr(8388736.0)


@triton.jit
def word_bytes_as_floats(b_word):
    """The four int8 codes q_j of int32 words (byte j at bits 8 j ..) as four fp32 tiles v_j = 2^23 + 128 + q_j,
    exactly, by their bits: one XOR a word and one byte permute a value (PTX), where the int8 to float conversion is
    16 a clock per multiprocessor on sm_90. Less SIGNED_BYTE_BIAS a value is q_j exactly. The interpreter and other
    GPUs take the same bits from shifts and masks."""
    if PTX_MATH:
        v0, v1, v2, v3 = tl.inline_asm_elementwise(
            _WORD_BYTES, "=r,=r,=r,=r,r", [b_word], dtype=(tl.float32,) * 4, is_pure=True, pack=1
        )
    else:
        flipped = b_word.to(tl.uint32, bitcast=True) ^ 0x80808080
        v0 = ((flipped & 0xFF) | 0x4B000000).to(tl.float32, bitcast=True)
        v1 = (((flipped >> 8) & 0xFF) | 0x4B000000).to(tl.float32, bitcast=True)
        v2 = (((flipped >> 16) & 0xFF) | 0x4B000000).to(tl.float32, bitcast=True)
        v3 = ((flipped >> 24) | 0x4B000000).to(tl.float32, bitcast=True)
    return v0, v1, v2, v3


# Nibble j of each of two 16-bit halfwords (the first at bits 4 j, the second at 16 + 4 j) placed in the two fp16
# halves of a register as 1024 + q by one LOP3 after a shift by 4 j; less 1024, then q scale + zero in one packed
# FMA. $4 holds the two halfwords, $5 and $6 their (scale, zero) pairs (scale in the low half): the scales of both
# in one register and the zeros in another by two byte permutes.
_HALFWORD_PAIR_HALVES = tl.constexpr("""{
.reg .b32 s1, s2, s3, p0, p1, p2, p3, bias, scale, zero;
mov.b32 bias, 0x64006400;
prmt.b32 scale, $5, $6, 0x5410;
prmt.b32 zero, $5, $6, 0x7632;
shr.u32 s1, $4, 4;
shr.u32 s2, $4, 8;
shr.u32 s3, $4, 12;
lop3.b32 p0, $4, 0x000F000F, 0x64006400, 0xEA;
lop3.b32 p1, s1, 0x000F000F, 0x64006400, 0xEA;
lop3.b32 p2, s2, 0x000F000F, 0x64006400, 0xEA;
lop3.b32 p3, s3, 0x000F000F, 0x64006400, 0xEA;
sub.f16x2 p0, p0, bias;
sub.f16x2 p1, p1, bias;
sub.f16x2 p2, p2, bias;
sub.f16x2 p3, p3, bias;
fma.rn.f16x2 $0, p0, scale, zero;
fma.rn.f16x2 $1, p1, scale, zero;
fma.rn.f16x2 $2, p2, scale, zero;
fma.rn.f16x2 $3, p3, scale, zero;
}""")


@triton.jit
def halfword_nibbles_as_halves(b_half, b_pair):
    """The four 4-bit codes q_j of int16 halfwords (nibble j at bits 4 j ..) as four fp16 tiles of q_j scale + zero,
    each rounded once, the tiles of b_half's shape. b_pair: int32 words holding each halfword's fp16 scale in their
    low half and its zero in their high half (broadcast against the halfwords). Elementwise, so Triton converts the
    halfwords where a product's operand layout holds them (no trip of the values through shared memory): per two
    halfwords two byte permutes and three shifts, and for each of the four pairs of values one LOP3, one packed
    subtraction and one packed FMA (PTX). The interpreter and other GPUs compute q_j scale + zero in fp32 and round
    it to fp16."""
    if PTX_MATH:
        h0, h1, h2, h3 = tl.inline_asm_elementwise(
            _HALFWORD_PAIR_HALVES, "=r,=r,=r,=r,r,r,r", [b_half, b_pair], dtype=(tl.float16,) * 4, is_pure=True, pack=2
        )
    else:
        bits = b_half.to(tl.int32) & 0xFFFF
        scale = b_pair.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
        zero = (b_pair >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
        h0 = ((bits & 15).to(tl.float32) * scale + zero).to(tl.float16)
        h1 = (((bits >> 4) & 15).to(tl.float32) * scale + zero).to(tl.float16)
        h2 = (((bits >> 8) & 15).to(tl.float32) * scale + zero).to(tl.float16)
        h3 = ((bits >> 12).to(tl.float32) * scale + zero).to(tl.float16)
    return h0, h1, h2, h3


# The bytes of two 16-bit halfwords ($2: bytes 0, 1 the first, 2, 3 the second) as two registers of two fp16
# values: $0 the low bytes (0 and 2), $1 the high ones (1 and 3), exactly. int8: the code plus 128 (sign bit
# flipped) under 1024's exponent (0x64XX is 1024 + XX), less 1152. e4m3: the conversion of two codes at once (sm_89
# and newer). (To bf16 these took 9 and 11 instructions: the products read fp16 instead.)
_INT8_PAIRS_FP16 = tl.constexpr("""{
.reg .b32 f, lo, hi, bias;
mov.b32 bias, 0x64806480;
xor.b32 f, $2, 0x80808080;
prmt.b32 lo, f, 0x64646464, 0x4240;
prmt.b32 hi, f, 0x64646464, 0x4341;
sub.f16x2 $0, lo, bias;
sub.f16x2 $1, hi, bias;
}""")
_E4M3_PAIRS_FP16 = tl.constexpr("""{
.reg .b32 t;
.reg .b16 lo, hi;
prmt.b32 t, $2, 0, 0x3120;
mov.b32 {lo, hi}, t;
cvt.rn.f16x2.e4m3x2 $0, lo;
cvt.rn.f16x2.e4m3x2 $1, hi;
}""")


@triton.jit
def halfword_bytes_as_halves(b_half, FORMAT: tl.constexpr):
    """(low, high): the low and high bytes of int16 halfwords, int8 or e4m3 codes (FORMAT "int8" or "fp8"), as fp16
    tiles of b_half's shape, exactly: fp16 holds every int8 and e4m3 value. Elementwise, so Triton converts the
    halfwords where a product's operand layout holds them (PTX: per two halfwords 5 instructions for int8, 3 for
    e4m3, which needs sm_89 or newer). The interpreter and other GPUs take the bytes' values through fp32, e4m3's
    NaN codes (0x7F, 0xFF) as NaN."""
    if PTX_MATH:
        # (The dtypes as a literal tuple: Triton 3.9 does not unwrap a tuple held as a constexpr.)
        if FORMAT == "int8":
            low, high = tl.inline_asm_elementwise(_INT8_PAIRS_FP16, "=r,=r,r", [b_half], dtype=(tl.float16,) * 2,
                                                  is_pure=True, pack=2)  # fmt: skip
        else:
            low, high = tl.inline_asm_elementwise(_E4M3_PAIRS_FP16, "=r,=r,r", [b_half], dtype=(tl.float16,) * 2,
                                                  is_pure=True, pack=2)  # fmt: skip
    else:
        low_byte, high_byte = b_half.to(tl.int8), (b_half >> 8).to(tl.int8)
        if FORMAT == "int8":
            low, high = low_byte.to(tl.float32), high_byte.to(tl.float32)
        else:
            low = as_fp32(low_byte.to(tl.float8e4nv, bitcast=True))
            high = as_fp32(high_byte.to(tl.float8e4nv, bitcast=True))
        low, high = low.to(tl.float16), high.to(tl.float16)
    return low, high
