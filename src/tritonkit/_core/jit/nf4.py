"""NF4's 16 values in registers, the fused 4-bit layers' code lookups: a tree of selects (nf4_value), or byte
permutes over the table held in registers (nf4_values_of_bytes with "prmt"); and a block's absmax, plain or
double-quantized (nf4_absmax), which the 4-bit layers and nf4_dequantize share."""

import struct

import triton
import triton.language as tl

from tritonkit._core.fourbit import NF4_CODE
from tritonkit._core.jit.fastmath import PTX_MATH

# The code book as constexprs (a jit function reads globals only as constexprs), from the one table in _core.fourbit.
_V0, _V1, _V2, _V3 = (tl.constexpr(value) for value in NF4_CODE[0:4])
_V4, _V5, _V6, _V7 = (tl.constexpr(value) for value in NF4_CODE[4:8])
_V8, _V9, _V10, _V11 = (tl.constexpr(value) for value in NF4_CODE[8:12])
_V12, _V13, _V14, _V15 = (tl.constexpr(value) for value in NF4_CODE[12:16])


@triton.jit
def nf4_absmax(p_absmax, p_absmax_codes, p_absmax_scales, p_offset, p_nested_code, i_block, mask,
               NESTED: tl.constexpr, NESTED_BLOCK: tl.constexpr):  # fmt: skip
    """The absmax of blocks i_block: absmax[i_block], or with double quantization (NESTED)
    nested_code[absmax_codes[i_block]] * absmax_scales[i_block // NESTED_BLOCK] + offset, the product and the sum
    rounded apart (bitsandbytes' roundings): by PTX's mul.rn, which the compiler never fuses into an FMA, so that a
    launch may keep fused multiply-adds on for the rest of its kernel (the interpreter rounds each operation)."""
    if NESTED:
        b_code = tl.load(p_absmax_codes + i_block, mask=mask, other=0).to(tl.int32)
        b_scale = tl.load(p_absmax_scales + i_block // NESTED_BLOCK, mask=mask, other=0.0)
        b_nested = tl.load(p_nested_code + b_code)
        if PTX_MATH:
            b_product = tl.inline_asm_elementwise("mul.rn.f32 $0, $1, $2;", "=f,f,f", [b_nested, b_scale],
                                                  dtype=tl.float32, is_pure=True, pack=1)  # fmt: skip
        else:
            b_product = b_nested * b_scale
        b_absmax = b_product + tl.load(p_offset)
    else:
        b_absmax = tl.load(p_absmax + i_block, mask=mask, other=0.0)
    return b_absmax


@triton.jit
def nf4_value(q):
    """NF4_CODE[q] in fp32 for 4-bit codes q (integers 0 to 15), by a tree of selects on q's bits: 15 selects a value
    on the CUDA cores. (A gather from the table in global memory saturated the L1 cache: 94% of its throughput and
    1.4% of DRAM's for the NF4 linear layer at one row on an H200, ten times INT4's time. Kernels that only
    dequantize, with no products to feed, measured faster with the gather.)"""
    bit0 = (q & 1) != 0
    pair0 = tl.where(bit0, _V1, _V0)
    pair1 = tl.where(bit0, _V3, _V2)
    pair2 = tl.where(bit0, _V5, _V4)
    pair3 = tl.where(bit0, _V7, _V6)
    pair4 = tl.where(bit0, _V9, _V8)
    pair5 = tl.where(bit0, _V11, _V10)
    pair6 = tl.where(bit0, _V13, _V12)
    pair7 = tl.where(bit0, _V15, _V14)
    bit1 = (q & 2) != 0
    quad0 = tl.where(bit1, pair1, pair0)
    quad1 = tl.where(bit1, pair3, pair2)
    quad2 = tl.where(bit1, pair5, pair4)
    quad3 = tl.where(bit1, pair7, pair6)
    bit2 = (q & 4) != 0
    low = tl.where(bit2, quad1, quad0)
    high = tl.where(bit2, quad3, quad2)
    return tl.where((q & 8) != 0, high, low).to(tl.float32)


def _table_words() -> list[list[int]]:
    """words[p][g]: byte p of the fp32 bits of NF4_CODE[4g .. 4g + 3], one byte a value, as one 32-bit word (value
    4g + j in byte j): the tables prmt picks from."""
    bits = [struct.unpack("<I", struct.pack("<f", value))[0] for value in NF4_CODE]
    return [[sum(((bits[4 * g + j] >> (8 * p)) & 0xFF) << (8 * j) for j in range(4)) for g in range(4)]
            for p in range(4)]  # fmt: skip


def _prmt_lookup_asm() -> str:
    """PTX for 4 bytes of NF4 codes ($8, byte i the i-th element) to their 8 values: $0-$3 the high nibbles', $4-$7
    the low nibbles'. The word's nibbles, low first, are codes c0 .. c7 (c_2i the low nibble of byte i). For four
    codes at a time, and each byte p of an fp32 value: prmt picks byte p of NF4_CODE[c & 7] from the table of values
    0-7 (2 words, a 3-bit selector a code: the word's own nibbles masked with 0x7777), again from the table of values
    8-15, and a third prmt keeps one or the other by the code's bit 3; 8 more prmt a half put the bytes of each
    value together. About 6 instructions a value, against the select tree's 15 selects and 4 bit tests."""
    words = _table_words()
    lines = ["{", ".reg .b32 t<6>, s<2>, m<2>, w<16>, r<8>;"]
    lines += [f"mov.b32 w{4 * p + g}, {words[p][g]:#010x};" for p in range(4) for g in range(4)]
    for half in range(2):
        shift = 16 * half
        lines += [f"shr.b32 t0, $8, {shift};", f"and.b32 s{half}, t0, 0x7777;",  # the 3-bit selectors
                  f"shr.b32 t0, $8, {shift + 1};", "and.b32 t0, t0, 0x4444;",  # bit 3 of code i: 4 in nibble i
                  f"or.b32 m{half}, t0, 0x3210;"]  # fmt: skip
    for half in range(2):
        for p in range(4):  # r[4 half + p], byte i: byte p of the value of code 4 half + i
            lines += [f"prmt.b32 t0, w{4 * p}, w{4 * p + 1}, s{half};",
                      f"prmt.b32 t1, w{4 * p + 2}, w{4 * p + 3}, s{half};",
                      f"prmt.b32 r{4 * half + p}, t0, t1, m{half};"]  # fmt: skip
        r = [f"r{4 * half + p}" for p in range(4)]
        # bytes 0-1 of values 0, 1 (t2) and 2, 3 (t3); bytes 2-3 of the same (t4, t5); then each value's two halves
        lines += [f"prmt.b32 t2, {r[0]}, {r[1]}, 0x5140;", f"prmt.b32 t3, {r[0]}, {r[1]}, 0x7362;",
                  f"prmt.b32 t4, {r[2]}, {r[3]}, 0x5140;", f"prmt.b32 t5, {r[2]}, {r[3]}, 0x7362;"]  # fmt: skip
        # code 4 half + i is byte 2 half + i // 2's low (even i) or high (odd i) nibble
        low, high = 4 + 2 * half, 2 * half
        lines += [f"prmt.b32 ${low}, t2, t4, 0x5410;", f"prmt.b32 ${high}, t2, t4, 0x7632;",
                  f"prmt.b32 ${low + 1}, t3, t5, 0x5410;", f"prmt.b32 ${high + 1}, t3, t5, 0x7632;"]  # fmt: skip
    return "\n".join([*lines, "}"])


_PRMT_LOOKUP = tl.constexpr(_prmt_lookup_asm())


@triton.jit
def nf4_values_of_bytes(b_byte, DECODE: tl.constexpr):
    """(NF4_CODE[high nibble], NF4_CODE[low nibble]) in fp32 for a uint8 tile of packed codes. DECODE "select":
    nf4_value on each nibble; "prmt": byte permutes over the table held in registers (_prmt_lookup_asm), PTX, so
    the interpreter and other GPUs take the select tree. The same values either way."""
    if DECODE == "prmt" and PTX_MATH:
        high, low = tl.inline_asm_elementwise(_PRMT_LOOKUP, "=r,=r,=r,=r,=r,=r,=r,=r,r", [b_byte],
                                              dtype=(tl.float32, tl.float32), is_pure=True, pack=4)  # fmt: skip
    else:
        b_code = b_byte.to(tl.int32)
        high, low = nf4_value(b_code >> 4), nf4_value(b_code & 15)
    return high, low
