"""4-bit linear layers: y = x dequant(W)^T + bias for a weight W (N, K) held in NF4 or INT4 codes, dequantized in
registers, tile by tile, so that no full-precision copy of W is ever written.

The weight, per element (formats: tritonkit/_core/fourbit.py):

    NF4:  w[n, k] = code[q(f)] * absmax[f // BLOCKSIZE],  f = n K + k (the flattened index), q(f) the high nibble of
          byte f // 2 for an even f, the low one for an odd f; double-quantized: absmax[b] = nested_code[c[b]] *
          absmax_scales[b // NESTED_BLOCK] + offset, two fp32 roundings (the product by PTX's mul.rn, never fused).
    INT4: w[n, k] = (q[n, k] - zero[n, g]) * scale[n, g],  g = k // GROUP, q the low nibble of byte (n, k // 2) for
          an even k, the high one for an odd k.

w is computed in fp32 and rounded to nearest even in x's dtype: the weight nf4_dequantize / int4_dequantize give in
that dtype, so y equals F.linear(x, dequantize(W)) up to the order of the fp32 sums. Columns come in pairs (2p, 2p + 1)
because a byte holds a pair: a program's K step splits x into its even and odd columns and multiplies each by the
matching half of the weight tile, two tensor-core products over K / 2 each, so that no nibble is ever interleaved.

With one to a few rows of x (plan.Gemv4Tiles) _linear4_gemv_kernel streams the weight's rows and multiplies on the
CUDA cores (no dot, whose smallest side pads x to 16 rows, and no trip of the weight tile through shared memory), or,
as the plan says, on the tensor cores with the weight tile as the dot's first operand, straight from registers. On
the CUDA cores, where every group lies within a row, the weight is exact instead: y[m, n] = sum_g scale[n, g]
sum_{k in g} x[m, k] c[n, k] (c = q - zero, or NF4's code value; scale INT4's, or the block's absmax), each group's
sum scaled once and no value rounded to x's dtype; INT4 codes that can be read as int32 words take
_int4_gemv_words_kernel, the same sums.

With many rows of x (plan.DequantizeFirst) the weight is instead written once in x's dtype by _dequantize_kernel
and the products run on cuBLAS: the fused kernels dequantize every weight tile again for each block of rows.

Forward, per output tile (tiles in grouped order) and split s of K:  y[m, n] = sum_k x[m, k] w[n, k]  (fp32).
Backward (the weight is frozen, so only the input gradient): dx[m, k] = sum_n dy[m, n] w[n, k], the same pairs as
output columns. With one split the kernel adds the bias and stores the output in its dtype; with several, each split
stores its fp32 partial sum and _split_sum_kernel adds them in split order (deterministic), then the bias.
"""

import triton
import triton.language as tl

from tritonkit._core.jit.gemm import grouped_tile
from tritonkit._core.jit.int_codes import CODE_BIAS, biased_code_as_float, word_nibbles_as_floats
from tritonkit._core.jit.nf4 import nf4_absmax, nf4_value, nf4_values_of_bytes
from tritonkit._core.jit.rounding import to_dot_operand


@triton.jit
def _nf4_code(p_code, q, DECODE: tl.constexpr):
    """NF4_CODE[q] in fp32 for int32 codes q: gathered from the table at p_code (DECODE "gather") or selected in
    registers (nf4_value; "prmt" too, which needs whole bytes). The plans choose (plan.NF4_DECODES)."""
    if DECODE == "gather":
        return tl.load(p_code + q)
    return nf4_value(q)


@triton.jit
def _nf4_byte_values(p_code, b_byte, DECODE: tl.constexpr):
    """(NF4_CODE[high nibble], NF4_CODE[low nibble]) in fp32 for a uint8 tile of packed codes: gathered from the
    table at p_code, or in registers by DECODE "select" or "prmt" (nf4_values_of_bytes)."""
    if DECODE == "gather":
        b_code = b_byte.to(tl.int32)
        return tl.load(p_code + (b_code >> 4)), tl.load(p_code + (b_code & 15))
    return nf4_values_of_bytes(b_byte, DECODE)


@triton.jit
def _codes_by_group(
    p_q, p_absmax, p_absmax_codes, p_absmax_scales, p_offset, p_code, p_nested_code, p_scales, p_zeros,
    o_n, pair_lo, m_n, K, stride_q_n, stride_s_n,
    FORMAT: tl.constexpr, NESTED: tl.constexpr, NESTED_BLOCK: tl.constexpr, GROUP: tl.constexpr, PAIRS: tl.constexpr,
    NF4_DECODE: tl.constexpr,
):  # fmt: skip
    """The weight of rows o_n before its groups' scales, for the PAIRS pairs p from pair_lo, where every group (INT4's,
    or an NF4 block) lies within one row: (c_even, c_odd, scale), the values of columns 2p and 2p + 1 as [R, groups,
    pairs of a group] fp32 tiles (INT4: q - zero, exactly; NF4: the code's value) and each group's scale (INT4's, or
    the NF4 block's absmax) [R, groups]: w = c scale. The bytes are read as [R, groups, pairs of a group], each
    group's scale, zero or absmax once. (Read per value, those loads had a warp's lanes on 32 rows, 32 cache lines an
    instruction, and held the 4-bit layers at 2% of the memory bandwidth.) pair_lo is a multiple of PAIRS, so a step
    of fewer columns than a group lies in one group."""
    N_GROUPS: tl.constexpr = (2 * PAIRS) // GROUP if 2 * PAIRS >= GROUP else 1
    GROUP_PAIRS: tl.constexpr = PAIRS // N_GROUPS
    n64 = o_n.to(tl.int64)
    o_g = tl.arange(0, N_GROUPS)
    o_pair = pair_lo + o_g[:, None] * GROUP_PAIRS + tl.arange(0, GROUP_PAIRS)[None, :]  # [G, GP]
    # K is even here: both columns of a pair, or none. (o_pair < K / 2, not 2 o_pair < K: a mask of contiguous lanes
    # against a multiple of 8 keeps the byte loads vectorized.)
    m_pair = m_n[:, None, None] & (o_pair < K // 2)[None, :, :]
    i_group = (2 * pair_lo) // GROUP + o_g
    m_group = m_n[:, None] & (i_group * GROUP < K)[None, :]  # [R, G]
    if FORMAT == "int4":
        b_byte = tl.load(p_q + n64[:, None, None] * stride_q_n + o_pair[None, :, :], mask=m_pair, other=0)
        b_byte = b_byte.to(tl.int32)  # [R, G, GP]
        o_group = n64[:, None] * stride_s_n + i_group[None, :]
        b_scale = tl.load(p_scales + o_group, mask=m_group, other=0.0).to(tl.float32)
        # The codes as 2^23 + q by their bits, less the zero plus the same 2^23: q - zero exactly, with no I2F (which
        # issues at 16 a clock against 128 FADDs) and one FADD a value.
        b_zero = tl.load(p_zeros + o_group, mask=m_group, other=0).to(tl.float32)[:, :, None] + CODE_BIAS
        c_even = biased_code_as_float(b_byte & 15) - b_zero
        c_odd = biased_code_as_float(b_byte >> 4) - b_zero
    else:
        b_byte = tl.load(p_q + n64[:, None, None] * (K // 2) + o_pair[None, :, :], mask=m_pair, other=0)
        i_block = n64[:, None] * (K // GROUP) + i_group[None, :]  # blocks run along the flattened weight
        b_scale = nf4_absmax(p_absmax, p_absmax_codes, p_absmax_scales, p_offset, p_nested_code, i_block, m_group,
                             NESTED, NESTED_BLOCK)  # fmt: skip
        c_even, c_odd = _nf4_byte_values(p_code, b_byte, NF4_DECODE)  # the high nibble is the even column
    return c_even, c_odd, b_scale


@triton.jit
def _weight_pairs_by_value(
    p_q, p_absmax, p_absmax_codes, p_absmax_scales, p_offset, p_code, p_nested_code,
    o_n, o_pair, m_even, m_odd, K, NESTED: tl.constexpr, NESTED_BLOCK: tl.constexpr, EVEN_K: tl.constexpr,
    GROUP: tl.constexpr, NF4_DECODE: tl.constexpr,
):  # fmt: skip
    """The weight's even and odd columns (w = code value times absmax, [R, P] each) for NF4 whose blocks cross rows
    (K not a multiple of the block size): the absmax looked up per value. EVEN_K: rows start on a byte, so a pair is
    one byte and both halves share a block; otherwise (an odd K) each half is gathered on its own."""
    n64 = o_n.to(tl.int64)[:, None]
    f_even = n64 * K + (2 * o_pair)[None, :]  # [R, P] flattened index of the even column
    if EVEN_K:
        b_byte = tl.load(p_q + n64 * (K // 2) + o_pair[None, :], mask=m_even, other=0)
        v_even, v_odd = _nf4_byte_values(p_code, b_byte, NF4_DECODE)
        a_even = nf4_absmax(p_absmax, p_absmax_codes, p_absmax_scales, p_offset, p_nested_code,
                            f_even // GROUP, m_even, NESTED, NESTED_BLOCK)  # fmt: skip
        a_odd = a_even
    else:  # a code a load, decoded one by one
        f_odd = f_even + 1
        q_even = (tl.load(p_q + f_even // 2, mask=m_even, other=0).to(tl.int32) >> (4 - 4 * (f_even % 2))) & 15
        q_odd = (tl.load(p_q + f_odd // 2, mask=m_odd, other=0).to(tl.int32) >> (4 - 4 * (f_odd % 2))) & 15
        a_even = nf4_absmax(p_absmax, p_absmax_codes, p_absmax_scales, p_offset, p_nested_code,
                            f_even // GROUP, m_even, NESTED, NESTED_BLOCK)  # fmt: skip
        a_odd = nf4_absmax(p_absmax, p_absmax_codes, p_absmax_scales, p_offset, p_nested_code,
                           f_odd // GROUP, m_odd, NESTED, NESTED_BLOCK)  # fmt: skip
        v_even, v_odd = _nf4_code(p_code, q_even, NF4_DECODE), _nf4_code(p_code, q_odd, NF4_DECODE)
    return v_even * a_even, v_odd * a_odd


@triton.jit
def _weight_operands(
    p_q, p_absmax, p_absmax_codes, p_absmax_scales, p_offset, p_code, p_nested_code, p_scales, p_zeros,
    o_n, pair_lo, m_n, K, stride_q_n, stride_s_n,
    FORMAT: tl.constexpr, NESTED: tl.constexpr, NESTED_BLOCK: tl.constexpr, EVEN_K: tl.constexpr,
    BY_GROUP: tl.constexpr, GROUP: tl.constexpr, PAIRS: tl.constexpr, DTYPE: tl.constexpr, UPCAST: tl.constexpr,
    NF4_DECODE: tl.constexpr,
):  # fmt: skip
    """The weight's even and odd columns of rows o_n (m_n: the rows in range), PAIRS pairs from pair_lo, as dot
    operands [R, PAIRS] each; masked values are finite (code 0 times a masked scale). BY_GROUP: every group lies in
    one row (INT4 always; NF4 when the block size divides K). NF4_DECODE: NF4's lookup (_nf4_byte_values)."""
    if BY_GROUP:  # _codes_by_group's values times their group's scale
        c_even, c_odd, b_scale = _codes_by_group(
            p_q, p_absmax, p_absmax_codes, p_absmax_scales, p_offset, p_code, p_nested_code, p_scales, p_zeros, o_n,
            pair_lo, m_n, K, stride_q_n, stride_s_n, FORMAT, NESTED, NESTED_BLOCK, GROUP, PAIRS, NF4_DECODE,
        )  # fmt: skip
        b_even = tl.reshape(c_even * b_scale[:, :, None], (o_n.shape[0], PAIRS))
        b_odd = tl.reshape(c_odd * b_scale[:, :, None], (o_n.shape[0], PAIRS))
    else:
        o_pair = pair_lo + tl.arange(0, PAIRS)
        b_even, b_odd = _weight_pairs_by_value(
            p_q, p_absmax, p_absmax_codes, p_absmax_scales, p_offset, p_code, p_nested_code, o_n, o_pair,
            m_n[:, None] & (2 * o_pair < K)[None, :], m_n[:, None] & (2 * o_pair + 1 < K)[None, :], K, NESTED,
            NESTED_BLOCK, EVEN_K, GROUP, NF4_DECODE,
        )  # fmt: skip
    return to_dot_operand(b_even, DTYPE, UPCAST), to_dot_operand(b_odd, DTYPE, UPCAST)


@triton.jit
def _linear4_fwd_kernel(
    p_x, p_out, p_part, p_bias,
    p_q, p_absmax, p_absmax_codes, p_absmax_scales, p_offset, p_code, p_nested_code, p_scales, p_zeros,
    M, N, K, pairs_per_split, stride_x_m, stride_x_k, stride_out_m, stride_q_n, stride_s_n,
    FORMAT: tl.constexpr, NESTED: tl.constexpr, NESTED_BLOCK: tl.constexpr, EVEN_K: tl.constexpr,
    BY_GROUP: tl.constexpr, GROUP: tl.constexpr, HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr, UPCAST: tl.constexpr,
    DOT_PRECISION: tl.constexpr, NF4_DECODE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    """y[m, n] = sum_k x[m, k] w[n, k] over split program_id(1)'s pairs of columns, for the output tile of
    program_id(0); BLOCK_K columns (BLOCK_K / 2 pairs) a step. SPLIT: store the fp32 partial sum to p_part (S, M, N);
    else add the bias and store y in x's dtype."""
    i_m, i_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    i_split = tl.program_id(1)
    o_m = i_m * BLOCK_M + tl.arange(0, BLOCK_M)
    o_n = i_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_m, m_n = o_m < M, o_n < N
    p_x_rows = p_x + o_m.to(tl.int64)[:, None] * stride_x_m
    pair_lo = i_split * pairs_per_split
    pair_hi = tl.minimum(pair_lo + pairs_per_split, (K + 1) // 2)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for pair in range(pair_lo, pair_hi, BLOCK_K // 2):
        o_pair = pair + tl.arange(0, BLOCK_K // 2)
        m_even_k, m_odd_k = 2 * o_pair < K, 2 * o_pair + 1 < K
        p_x_even = p_x_rows + (2 * o_pair).to(tl.int64)[None, :] * stride_x_k
        b_x_even = tl.load(p_x_even, mask=m_m[:, None] & m_even_k[None, :], other=0.0)  # [M, P]
        b_x_odd = tl.load(p_x_even + stride_x_k, mask=m_m[:, None] & m_odd_k[None, :], other=0.0)
        b_w_even, b_w_odd = _weight_operands(
            p_q, p_absmax, p_absmax_codes, p_absmax_scales, p_offset, p_code, p_nested_code, p_scales, p_zeros, o_n,
            pair, m_n, K, stride_q_n, stride_s_n, FORMAT, NESTED, NESTED_BLOCK, EVEN_K, BY_GROUP, GROUP,
            BLOCK_K // 2, p_x.dtype.element_ty, UPCAST, NF4_DECODE,
        )  # [N, P]  # fmt: skip
        if UPCAST:
            b_x_even, b_x_odd = b_x_even.to(tl.float32), b_x_odd.to(tl.float32)
        acc = tl.dot(b_x_even, tl.trans(b_w_even), acc, input_precision=DOT_PRECISION)
        acc = tl.dot(b_x_odd, tl.trans(b_w_odd), acc, input_precision=DOT_PRECISION)
    m_out = m_m[:, None] & m_n[None, :]
    if SPLIT:
        o_part = (i_split * M + o_m).to(tl.int64)[:, None] * N + o_n[None, :]
        tl.store(p_part + o_part, acc, mask=m_out)
    else:
        if HAS_BIAS:
            acc += tl.load(p_bias + o_n, mask=m_n, other=0.0).to(tl.float32)[None, :]
        p_y = p_out + o_m.to(tl.int64)[:, None] * stride_out_m + o_n[None, :]
        tl.store(p_y, acc.to(p_out.dtype.element_ty), mask=m_out)


@triton.jit
def _x_of_pairs(p_x_row, pair_lo, G: tl.constexpr, GP: tl.constexpr, K, m_row, stride_x_k):
    """x's even and odd columns 2p, 2p + 1 of the G GP pairs p from pair_lo (a group's pairs consecutive), two fp32
    tiles [G, GP]: one load of each pair's two values, split apart in registers."""
    o_pair = pair_lo + tl.arange(0, G)[:, None] * GP + tl.arange(0, GP)[None, :]
    o_k = 2 * o_pair[:, :, None] + tl.arange(0, 2)[None, None, :]
    b_x = tl.load(p_x_row + o_k.to(tl.int64) * stride_x_k, mask=(o_k < K) & m_row, other=0.0)
    return tl.split(b_x.to(tl.float32))


@triton.jit
def _add_to_column(acc, b_row, o_m, row: tl.constexpr):
    """The GEMVs' [BLOCK_N, BLOCK_M] accumulator plus row ``row`` of x's sums [BLOCK_N, 1] in its column (all of it
    when the accumulator has one column)."""
    if acc.shape[1] == 1:
        return acc + b_row
    return tl.where(o_m[None, :] == row, acc + b_row, acc)


@triton.jit
def _store_gemv_output(acc, p_out, p_part, p_bias, o_n, o_m, M, N, i_split, stride_out_m, HAS_BIAS: tl.constexpr,
                       SPLIT: tl.constexpr):  # fmt: skip
    """A GEMV program's [BLOCK_N, BLOCK_M] sums (columns o_n of rows o_m): SPLIT, the fp32 partial sum of split
    i_split to p_part (S, M, N); else plus the bias, stored as y in p_out's dtype."""
    m_n = o_n < N
    m_out = m_n[:, None] & (o_m < M)[None, :]
    if SPLIT:
        o_part = (i_split * M + o_m).to(tl.int64)[None, :] * N + o_n[:, None]
        tl.store(p_part + o_part, acc, mask=m_out)
    else:
        if HAS_BIAS:
            acc += tl.load(p_bias + o_n, mask=m_n, other=0.0).to(tl.float32)[:, None]
        p_y = p_out + o_m.to(tl.int64)[None, :] * stride_out_m + o_n[:, None]
        tl.store(p_y, acc.to(p_out.dtype.element_ty), mask=m_out)


@triton.jit
def _linear4_gemv_kernel(
    p_x, p_out, p_part, p_bias,
    p_q, p_absmax, p_absmax_codes, p_absmax_scales, p_offset, p_code, p_nested_code, p_scales, p_zeros,
    M, N, K, half_k, pairs_per_split, stride_x_m, stride_x_k, stride_out_m, stride_q_n, stride_s_n,
    FORMAT: tl.constexpr, NESTED: tl.constexpr, NESTED_BLOCK: tl.constexpr, EVEN_K: tl.constexpr,
    BY_GROUP: tl.constexpr, GROUP: tl.constexpr, HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr, UPCAST: tl.constexpr,
    NF4_DECODE: tl.constexpr, PRODUCTS: tl.constexpr, DOT_PRECISION: tl.constexpr, STAGES: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """The forward for a few rows of x (M <= BLOCK_M, all in one program): program (i, s)
    streams rows i BLOCK_N .. of W over split s of K, BLOCK_K columns a step (BLOCK_K / 2 contiguous bytes of each
    row), and for each row m of x

        y[m, n] = sum_k x[m, k] w[n, k]   (fp32 products and sums, w rounded to x's dtype first)

    or on the CUDA cores, where every group lies within a row (BY_GROUP), with the exact weight: y[m, n] =
    sum_g scale[n, g] sum_{k in g} x[m, k] c[n, k] (_codes_by_group's c and scale), x's even and odd columns
    multiplied by the bytes' two halves and each group's sum scaled once. Otherwise the halves of each byte are
    joined back into columns in registers, so x's row is read contiguously; each row of x is multiplied elementwise
    and summed along K, then added into column m of the [BLOCK_N, BLOCK_M] accumulator.
    A dot would pad x to 16 rows and move every dequantized tile through shared memory into the tensor cores'
    layout; here the packed bytes go from the load to the FMAs in registers. PRODUCTS "dot" instead multiplies on
    the tensor cores with the weight tile as the dot's first operand (its rows the output columns, from registers)
    and x's rows as the columns of the second, padded to BLOCK_M >= 16, acc = W_tile x_tile^T: no FMA a value, and
    no trip of the weight through shared memory where the compiler keeps it in registers. SPLIT: store the fp32
    partial sum to p_part (S, M, N) (summed in order by _split_sum_kernel); else add the bias and store y in x's
    dtype. STAGES: the K loop's software pipeline, asked of the loop (the compiler pipelines a plain range's loads
    only where they feed a dot)."""
    # K as 2 (K / 2) where K is even: the same value, but one the compiler knows to be a multiple of 32 when K / 2 (an
    # argument) is one of 16, so that the byte loads' mask is constant over 16 lanes and they load 16 bytes a thread.
    k_w = 2 * half_k if EVEN_K else K
    i_split = tl.program_id(1)
    o_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    o_m = tl.arange(0, BLOCK_M)
    m_n, m_m = o_n < N, o_m < M
    pair_lo = i_split * pairs_per_split
    pair_hi = tl.minimum(pair_lo + pairs_per_split, (k_w + 1) // 2)
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)  # transposed: a row's sums along K land as a column
    for pair in tl.range(pair_lo, pair_hi, BLOCK_K // 2, num_stages=STAGES):
        if PRODUCTS == "fma" and BY_GROUP:
            # The weight exact: each group's products summed, then times its scale once (no value scaled, nor
            # rounded to x's dtype, on its own).
            c_even, c_odd, b_scale = _codes_by_group(
                p_q, p_absmax, p_absmax_codes, p_absmax_scales, p_offset, p_code, p_nested_code, p_scales, p_zeros,
                o_n, pair, m_n, k_w, stride_q_n, stride_s_n, FORMAT, NESTED, NESTED_BLOCK, GROUP, BLOCK_K // 2,
                NF4_DECODE,
            )  # [R, G, GP] twice and [R, G]  # fmt: skip
            for row in tl.static_range(BLOCK_M):
                x_even, x_odd = _x_of_pairs(p_x + row * stride_x_m, pair, c_even.shape[1], c_even.shape[2], K,
                                            tl.full([1, 1, 1], row, tl.int32) < M, stride_x_k)  # fmt: skip
                part = tl.sum(c_even * x_even[None], axis=2) + tl.sum(c_odd * x_odd[None], axis=2)  # [R, G]
                b_row = tl.sum(part * b_scale, axis=1)[:, None]  # [R, 1]
                acc = _add_to_column(acc, b_row, o_m, row)
        else:
            b_even, b_odd = _weight_operands(
                p_q, p_absmax, p_absmax_codes, p_absmax_scales, p_offset, p_code, p_nested_code, p_scales, p_zeros, o_n,
                pair, m_n, k_w, stride_q_n, stride_s_n, FORMAT, NESTED, NESTED_BLOCK, EVEN_K, BY_GROUP, GROUP,
                BLOCK_K // 2, p_x.dtype.element_ty, UPCAST, NF4_DECODE,
            )  # [N, P] each, masked values finite  # fmt: skip
            b_w = tl.reshape(tl.join(b_even, b_odd), (BLOCK_N, BLOCK_K))  # columns 2p, 2p + 1 again
            o_k = 2 * pair + tl.arange(0, BLOCK_K)
            p_x_step = p_x + o_k.to(tl.int64) * stride_x_k
            if PRODUCTS == "dot":
                p_x_tile = p_x_step[:, None] + o_m.to(tl.int64)[None, :] * stride_x_m
                b_x_t = tl.load(p_x_tile, mask=(o_k < K)[:, None] & m_m[None, :], other=0.0)  # [K, M]
                if UPCAST:
                    b_x_t = b_x_t.to(tl.float32)
                acc = tl.dot(b_w, b_x_t, acc, input_precision=DOT_PRECISION)
            else:
                b_w = b_w.to(tl.float32)
                for row in tl.static_range(BLOCK_M):
                    # The row test as a tensor: Triton 3.9's interpreter refuses a mask of a tensor and a Python bool.
                    m_x = (o_k < K) & (tl.full([BLOCK_K], row, tl.int32) < M)
                    b_x = tl.load(p_x_step + row * stride_x_m, mask=m_x, other=0.0).to(tl.float32)
                    b_row = tl.sum(b_w * b_x[None, :], axis=1)[:, None]  # [N, 1]
                    acc = _add_to_column(acc, b_row, o_m, row)
    _store_gemv_output(acc, p_out, p_part, p_bias, o_n, o_m, M, N, i_split, stride_out_m, HAS_BIAS, SPLIT)


@triton.jit
def _x_of_words(p_x_row, o_word, m_row, word_hi, stride_x_k):
    """x's columns 8 w + j of the words o_word ([G, W]) below word_hi, [G, W, 8] in x's dtype: one load of 8
    consecutive values a word."""
    o_k = 8 * o_word[:, :, None] + tl.arange(0, 8)[None, None, :]
    return tl.load(p_x_row + o_k.to(tl.int64) * stride_x_k, mask=(o_word < word_hi)[:, :, None] & m_row, other=0.0)


@triton.jit
def _x_by_word_position(b_x):
    """x's values of words [G, W, 8] as eight fp32 tiles [G, W], j = 0 .. 7, each times 2^-e_j (e_j = 0, 4, 8, 12, 16,
    0, 4, 8: the weight of nibble j's bits in _int4_gemv_words_kernel's values), exactly for every |x| >= 2^-110:
    split apart in registers."""
    G: tl.constexpr = b_x.shape[0]
    W: tl.constexpr = b_x.shape[1]
    # Split by the column's bits, lowest first: [.., 8] -> even and odd columns -> their halves -> single columns.
    x_even, x_odd = tl.split(tl.reshape(b_x.to(tl.float32), (G, W, 4, 2)))
    x_0_4, x_2_6 = tl.split(tl.reshape(x_even, (G, W, 2, 2)))
    x_1_5, x_3_7 = tl.split(tl.reshape(x_odd, (G, W, 2, 2)))
    x0, x4 = tl.split(x_0_4)
    x2, x6 = tl.split(x_2_6)
    x1, x5 = tl.split(x_1_5)
    x3, x7 = tl.split(x_3_7)
    return (x0, x1 * 0.0625, x2 * 0.00390625, x3 * 0.000244140625, x4 * 0.0000152587890625, x5, x6 * 0.0625,
            x7 * 0.00390625)  # fmt: skip


@triton.jit
def _int4_gemv_words_kernel(
    p_x, p_out, p_part, p_bias, p_words, p_scales, p_zeros,
    M, N, K, words_per_split, stride_x_m, stride_x_k, stride_out_m, stride_w_n, stride_s_n,
    GROUP: tl.constexpr, HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr, STAGES: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """INT4's forward for a few rows of x on the CUDA cores (M <= BLOCK_M, all in one program), the weight read as
    int32 words of 8 codes (K a multiple of 8): program (i, s) streams rows i BLOCK_N .. of W over split s of K,
    BLOCK_K columns a step, and for each row m of x

        y[m, n] = sum_g scale[n, g] sum_{k in group g} x[m, k] (q[n, k] - zero[n, g])   (fp32)

    the weight exact, (q - zero) scale, never rounded to x's dtype: each group's products are summed first and
    multiplied by its scale once. Column 8 w + j is nibble j of word w (bits 4 j ..), so a word's eight values
    come from the word by masks alone: v_j = 2^23 + 2^e_j q_j by its bits (word_nibbles_as_floats; e_j = 4 j, and
    4 (j - 5) from a copy shifted by 20), v_j - (2^23 + 2^e_j zero) = 2^e_j (q_j - zero) exactly, and x's column j comes
    scaled by 2^-e_j (_x_by_word_position), so that each product is x (q - zero) exactly: per value one LOP3, one
    FADD and one FFMA, against the byte path's nine instructions (unpacking, the scale's FMUL, rounding to bf16
    and back). x's values, split from one load of each word's eight, serve the rows a thread holds (four at 128 x
    128 on 4 warps). STAGES: the K loop's software pipeline; from 2 the compiler issues the words', scales' and
    x's loads that many steps ahead by asynchronous copies into shared memory (it pipelines no load that feeds no dot
    unless the loop asks), at 1 each step waits for its own loads. SPLIT: store the fp32 partial sum to p_part
    (S, M, N) (summed in order by _split_sum_kernel); else add the bias and store y in x's dtype."""
    WORDS: tl.constexpr = BLOCK_K // 8
    N_GROUPS: tl.constexpr = BLOCK_K // GROUP if BLOCK_K >= GROUP else 1
    GROUP_WORDS: tl.constexpr = WORDS // N_GROUPS
    i_split = tl.program_id(1)
    o_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    m_n = o_n < N
    n64 = o_n.to(tl.int64)
    o_m = tl.arange(0, BLOCK_M)
    o_g = tl.arange(0, N_GROUPS)
    k_words = K // 8
    word_lo = i_split * words_per_split
    word_hi = tl.minimum(word_lo + words_per_split, k_words)
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)  # transposed: a row's sums land as a column
    for word in tl.range(word_lo, word_hi, WORDS, num_stages=STAGES):
        o_word = word + o_g[:, None] * GROUP_WORDS + tl.arange(0, GROUP_WORDS)[None, :]  # [G, W]
        m_word = m_n[:, None, None] & (o_word < word_hi)[None, :, :]
        b_word = tl.load(p_words + n64[:, None, None] * stride_w_n + o_word[None, :, :], mask=m_word, other=0)
        i_group = (8 * word) // GROUP + o_g
        m_group = m_n[:, None] & (i_group * GROUP < K)[None, :]
        o_group = n64[:, None] * stride_s_n + i_group[None, :]
        b_scale = tl.load(p_scales + o_group, mask=m_group, other=0.0)  # [R, G]
        b_zero = tl.load(p_zeros + o_group, mask=m_group, other=0).to(tl.float32)[:, :, None]
        # 2^e_j (q_j - zero) for the eight nibbles, [R, G, W] each (masked words: finite, and times x's zeros).
        v0, v1, v2, v3, v4, v5, v6, v7 = word_nibbles_as_floats(b_word)
        zero_0, zero_4, zero_8 = b_zero + CODE_BIAS, b_zero * 16.0 + CODE_BIAS, b_zero * 256.0 + CODE_BIAS
        d0, d1, d2, d3 = v0 - zero_0, v1 - zero_4, v2 - zero_8, v3 - (b_zero * 4096.0 + CODE_BIAS)
        d4, d5, d6, d7 = v4 - (b_zero * 65536.0 + CODE_BIAS), v5 - zero_0, v6 - zero_4, v7 - zero_8
        for row in tl.static_range(BLOCK_M):
            # The row test as a tensor: Triton 3.9's interpreter refuses a mask of a tensor and a Python bool.
            b_x = _x_of_words(p_x + row * stride_x_m, o_word, tl.full([1, 1, 1], row, tl.int32) < M, word_hi,
                              stride_x_k)  # fmt: skip
            x0, x1, x2, x3, x4, x5, x6, x7 = _x_by_word_position(b_x)
            part = (
                x0[None] * d0
                + x1[None] * d1
                + x2[None] * d2
                + x3[None] * d3
                + x4[None] * d4
                + x5[None] * d5
                + x6[None] * d6
                + x7[None] * d7
            )  # [R, G, W]: one multiply and seven fused multiply-adds a word
            b_row = tl.sum(tl.sum(part, axis=2) * b_scale, axis=1)[:, None]  # [R, 1]
            acc = _add_to_column(acc, b_row, o_m, row)
    _store_gemv_output(acc, p_out, p_part, p_bias, o_n, o_m, M, N, i_split, stride_out_m, HAS_BIAS, SPLIT)


@triton.jit
def _linear4_dx_kernel(
    p_dy, p_dx, p_part,
    p_q, p_absmax, p_absmax_codes, p_absmax_scales, p_offset, p_code, p_nested_code, p_scales, p_zeros,
    M, N, K, rows_per_split, stride_dy_m, stride_dy_n, stride_dx_m, stride_q_n, stride_s_n,
    FORMAT: tl.constexpr, NESTED: tl.constexpr, NESTED_BLOCK: tl.constexpr, EVEN_K: tl.constexpr,
    BY_GROUP: tl.constexpr, GROUP: tl.constexpr, SPLIT: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr,
    NF4_DECODE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):  # fmt: skip
    """dx[m, k] = sum_n dy[m, n] w[n, k] over split program_id(1)'s rows of W (BLOCK_N a step), for the tile of
    BLOCK_M rows and BLOCK_K columns (BLOCK_K / 2 pairs) of program_id(0): the even and odd columns in accumulators
    of their own, stored interleaved. SPLIT: the fp32 partial sum to p_part (S, M, K); else dx in dy's dtype."""
    i_m, i_k = grouped_tile(tl.program_id(0), M, K, BLOCK_M, BLOCK_K, GROUP_M)
    i_split = tl.program_id(1)
    o_m = i_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_m = o_m < M
    row_lo = i_split * rows_per_split
    row_hi = tl.minimum(row_lo + rows_per_split, N)
    acc_even = tl.zeros([BLOCK_M, BLOCK_K // 2], dtype=tl.float32)
    acc_odd = tl.zeros([BLOCK_M, BLOCK_K // 2], dtype=tl.float32)
    for row in range(row_lo, row_hi, BLOCK_N):
        o_n = row + tl.arange(0, BLOCK_N)
        m_n = o_n < row_hi
        p_dy_tile = p_dy + o_m.to(tl.int64)[:, None] * stride_dy_m + o_n.to(tl.int64)[None, :] * stride_dy_n
        b_dy = tl.load(p_dy_tile, mask=m_m[:, None] & m_n[None, :], other=0.0)  # [M, N]
        b_w_even, b_w_odd = _weight_operands(
            p_q, p_absmax, p_absmax_codes, p_absmax_scales, p_offset, p_code, p_nested_code, p_scales, p_zeros, o_n,
            i_k * (BLOCK_K // 2), m_n, K, stride_q_n, stride_s_n, FORMAT, NESTED, NESTED_BLOCK, EVEN_K, BY_GROUP,
            GROUP, BLOCK_K // 2, p_dy.dtype.element_ty, UPCAST, NF4_DECODE,
        )  # [N, P]  # fmt: skip
        if UPCAST:
            b_dy = b_dy.to(tl.float32)
        acc_even = tl.dot(b_dy, b_w_even, acc_even, input_precision=DOT_PRECISION)
        acc_odd = tl.dot(b_dy, b_w_odd, acc_odd, input_precision=DOT_PRECISION)
    # Interleaved back into columns and stored as one tile (as _dequantize_kernel's store, for the same reason).
    acc = tl.reshape(tl.join(acc_even, acc_odd), (BLOCK_M, BLOCK_K))
    o_k = i_k * BLOCK_K + tl.arange(0, BLOCK_K)
    m_dx = m_m[:, None] & (o_k < K)[None, :]
    if SPLIT:
        tl.store(p_part + (i_split * M + o_m).to(tl.int64)[:, None] * K + o_k[None, :], acc, mask=m_dx)
    else:
        p_rows = p_dx + o_m.to(tl.int64)[:, None] * stride_dx_m
        tl.store(p_rows + o_k[None, :], acc.to(p_dx.dtype.element_ty), mask=m_dx)


@triton.jit
def _dequantize_kernel(
    p_w, p_q, p_absmax, p_absmax_codes, p_absmax_scales, p_offset, p_code, p_nested_code, p_scales, p_zeros,
    N, K, stride_w_n, stride_q_n, stride_s_n,
    FORMAT: tl.constexpr, NESTED: tl.constexpr, NESTED_BLOCK: tl.constexpr, EVEN_K: tl.constexpr,
    BY_GROUP: tl.constexpr, GROUP: tl.constexpr, UPCAST: tl.constexpr, NF4_DECODE: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, K_TILES: tl.constexpr,
):  # fmt: skip
    """w[n, k] of K_TILES consecutive BLOCK_N x BLOCK_K tiles along K (tiles past K store nothing), in p_w's dtype:
    the operands the fused kernels multiply (the same _weight_operands, so the same rounding), written once for a
    cuBLAS product when x has many rows. K_TILES > 1 gives a program more bytes to move for the same setup (row
    offsets and masks); the values do not depend on it."""
    o_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    m_n = o_n < N
    p_w_rows = p_w + o_n.to(tl.int64)[:, None] * stride_w_n
    for i_tile in range(K_TILES):
        i_k = tl.program_id(1) * K_TILES + i_tile
        b_even, b_odd = _weight_operands(
            p_q, p_absmax, p_absmax_codes, p_absmax_scales, p_offset, p_code, p_nested_code, p_scales, p_zeros, o_n,
            i_k * (BLOCK_K // 2), m_n, K, stride_q_n, stride_s_n, FORMAT, NESTED, NESTED_BLOCK, EVEN_K, BY_GROUP,
            GROUP, BLOCK_K // 2, p_w.dtype.element_ty, UPCAST, NF4_DECODE,
        )  # fmt: skip
        # The halves interleaved back into columns 2p, 2p + 1 and stored as one contiguous tile: two stores of every
        # other element had the compiler lay lanes along rows, 32 rows a warp's store, and ran 10x below
        # nf4_dequantize's speed.
        b_w = tl.reshape(tl.join(b_even, b_odd), (BLOCK_N, BLOCK_K))
        o_k = i_k * BLOCK_K + tl.arange(0, BLOCK_K)
        tl.store(p_w_rows + o_k[None, :], b_w.to(p_w.dtype.element_ty), mask=m_n[:, None] & (o_k < K)[None, :])


@triton.jit
def _split_sum_kernel(p_part, p_bias, p_out, M, N, n_splits, stride_out_m, HAS_BIAS: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    """out[m, n] = sum_s part[s, m, n] (+ bias[n]), the splits added in order (deterministic), rounded once."""
    o_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    o_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    m_out = (o_m < M)[:, None] & (o_n < N)[None, :]
    o_part = o_m.to(tl.int64)[:, None] * N + o_n[None, :]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for s in range(n_splits):
        acc += tl.load(p_part + s * M * N + o_part, mask=m_out, other=0.0)
    if HAS_BIAS:
        acc += tl.load(p_bias + o_n, mask=o_n < N, other=0.0).to(tl.float32)[None, :]
    tl.store(p_out + o_m.to(tl.int64)[:, None] * stride_out_m + o_n[None, :], acc.to(p_out.dtype.element_ty),
             mask=m_out)  # fmt: skip
