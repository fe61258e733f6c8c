"""Quantization kernels: x (M, K) to int8 or float8 codes with fp32 scales per tensor, row, 1 x G group or G x G
block, and back; weights to NF4 (bitsandbytes' 4-bit NormalFloat) and to grouped INT4 (AWQ/GPTQ style), and back.

For a region R of x (the whole tensor, a row, G consecutive columns of a row, or a G x G block), with qmax the format's
largest value (int8 127, float8 e4m3 448, e5m2 57344):

    amax_R = max |x| over the finite values of R,   scale_R = amax_R / qmax   (1 when amax_R = 0),
    q = saturate(round(x / scale_R)),               x' = q * scale_R   (dequantize)

round: to the nearest integer (int8) or float8 value, ties to even; saturate: clamp to [-qmax, qmax], so +-inf
becomes +-qmax; NaN becomes 0 in int8 and stays NaN in float8. Divisions are IEEE (div_rn), as torch's of a tensor by
a tensor, so the codes follow the definition exactly. HARDWARE_ROUNDING: float8 values rounded by the conversion
instruction (sm_89 and newer) instead of in fp32 arithmetic first (_core/jit/quantize.py); the same codes.

A region that fits one tile (ONE_PASS) is read once: its amax and its codes come from the same registers. A wider one
is read twice, chunk by chunk (the second read mostly from L2). A transposed operand is not copied first: for row
and tensor scales, _column_amax_kernel (or _amax_kernel) and _quantize_columns_kernel read the tensor it transposes
along that tensor's own rows and transpose the codes in registers before they are written; for group scales the
group kernel reads it where it lies (COLUMN_STRIDED: its columns strided), the codes written row-major.
"""

import triton
import triton.language as tl

from tritonkit._core.jit.nf4 import nf4_absmax
from tritonkit._core.jit.quantize import amax_scale, codes, finite_abs, finite_row_amax
from tritonkit._core.jit.rounding import round_half_even


@triton.jit
def _column_offsets(o_c, stride_c, COLUMN_STRIDED: tl.constexpr):
    """Element offsets of columns o_c: o_c itself for unit-stride rows, else o_c * stride_c in int64 (a transposed
    operand's column stride is its row count, whose products pass int32 in large tensors)."""
    if COLUMN_STRIDED:
        return o_c.to(tl.int64) * stride_c
    else:
        return o_c


@triton.jit
def _amax_kernel(p_x, p_amax, n_rows, n_cols, stride_x_r, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """The tensor's amax (finite values), each program's block folded in with an atomic maximum (order-free, so
    deterministic); p_amax starts at 0. A transposed operand's is taken from the tensor it transposes."""
    o_r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    o_c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    m_x = (o_r < n_rows)[:, None] & (o_c < n_cols)[None, :]
    b_x = tl.load(p_x + o_r.to(tl.int64)[:, None] * stride_x_r + o_c[None, :], mask=m_x, other=0.0).to(tl.float32)
    tl.atomic_max(p_amax, tl.max(finite_row_amax(b_x), axis=0))


@triton.jit
def _column_amax_kernel(p_x, p_amax, n_rows, n_cols, rows_per_program, stride_x_r, BLOCK_R: tl.constexpr,
                        BLOCK_C: tl.constexpr):  # fmt: skip
    """max |x| over each column of a row-major x (M, N) among its finite values: rows_per_program rows of BLOCK_C
    columns a program, BLOCK_R at a time, folded into p_amax[column] (zeros at launch) with one atomic maximum a
    column (order-free, so deterministic). The row amax of x's transpose, read along x's rows."""
    o_c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    m_c = o_c < n_cols
    r_lo = tl.program_id(0) * rows_per_program
    r_hi = tl.minimum(r_lo + rows_per_program, n_rows)
    amax = tl.zeros([BLOCK_C], tl.float32)
    for r in range(r_lo, r_hi, BLOCK_R):
        o_r = r + tl.arange(0, BLOCK_R)
        m_x = (o_r < r_hi)[:, None] & m_c[None, :]
        b_x = tl.load(p_x + o_r.to(tl.int64)[:, None] * stride_x_r + o_c[None, :], mask=m_x, other=0.0)
        amax = tl.maximum(amax, tl.max(finite_abs(b_x.to(tl.float32)), axis=0))
    tl.atomic_max(p_amax + o_c, amax, mask=m_c)


@triton.jit
def _quantize_columns_kernel(
    p_x, p_q, p_scale, p_amax, n_rows, n_cols, stride_x_r, stride_q_r, stride_s_r,
    KIND: tl.constexpr, TENSOR: tl.constexpr, HARDWARE_ROUNDING: tl.constexpr, INF_IS_NAN: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    """The codes of x^T for a row-major x (M, N): row c of the codes (N, M) is column c of x at its column's scale,
    from p_amax[c] (_column_amax_kernel), or at the tensor's (TENSOR: p_amax[0]). A BLOCK_R x BLOCK_C tile of x is
    read along x's rows, and its codes are transposed in registers and written along the codes' rows. The first
    row of programs stores its columns' scales (TENSOR: program (0, 0) the one)."""
    o_r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    o_c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    m_r, m_c = o_r < n_rows, o_c < n_cols
    m_x = m_r[:, None] & m_c[None, :]
    b_x = tl.load(p_x + o_r.to(tl.int64)[:, None] * stride_x_r + o_c[None, :], mask=m_x, other=0.0).to(tl.float32)
    if TENSOR:
        scale = amax_scale(tl.load(p_amax) + tl.zeros([BLOCK_C], tl.float32), KIND)
        if (tl.program_id(0) == 0) & (tl.program_id(1) == 0):
            tl.store(p_scale, tl.max(scale, axis=0))
    else:
        scale = amax_scale(tl.load(p_amax + o_c, mask=m_c, other=0.0), KIND)
        if tl.program_id(0) == 0:
            tl.store(p_scale + o_c.to(tl.int64) * stride_s_r, scale, mask=m_c)
    b_q = codes(b_x, scale[None, :], KIND, HARDWARE_ROUNDING, INF_IS_NAN)  # [R, C]
    p_q_tile = p_q + o_c.to(tl.int64)[:, None] * stride_q_r + o_r[None, :]  # [C, R]
    tl.store(p_q_tile, tl.trans(b_q), mask=m_c[:, None] & m_r[None, :])


@triton.jit
def _quantize_groups_kernel(
    p_x, p_q, p_scale, p_amax, n_rows, n_cols, group, stride_x_r, stride_x_c, stride_q_r, stride_s_r,
    KIND: tl.constexpr, TENSOR: tl.constexpr, HARDWARE_ROUNDING: tl.constexpr, ONE_PASS: tl.constexpr,
    COLUMN_STRIDED: tl.constexpr, INF_IS_NAN: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    """BLOCK_R rows x the columns of group i_g = program_id(1), [i_g * group, (i_g + 1) * group) (row granularity: one
    group of all the columns). ONE_PASS (group <= BLOCK_C): the tile is read once; else the group is read twice, chunk
    by chunk: once for its amax, once to write the codes. TENSOR: the scale comes from the tensor's amax (p_amax),
    stored by program (0, 0), and one read suffices. INF_IS_NAN: float8 codes of +-inf are NaN (_core/jit/quantize)."""
    i_g = tl.program_id(1)
    o_r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    r64 = o_r.to(tl.int64)
    m_r = o_r < n_rows
    c_lo = i_g * group
    c_hi = tl.minimum(c_lo + group, n_cols)
    o_c = tl.arange(0, BLOCK_C)
    p_x_rows = p_x + r64[:, None] * stride_x_r
    p_q_rows = p_q + r64[:, None] * stride_q_r
    if ONE_PASS and not TENSOR:
        m_x = m_r[:, None] & (c_lo + o_c < c_hi)[None, :]
        o_x = _column_offsets(c_lo + o_c, stride_x_c, COLUMN_STRIDED)
        b_x = tl.load(p_x_rows + o_x[None, :], mask=m_x, other=0.0).to(tl.float32)  # [R, C]
        scale = amax_scale(finite_row_amax(b_x), KIND)
        tl.store(p_scale + r64 * stride_s_r + i_g, scale, mask=m_r)
        b_q = codes(b_x, scale[:, None], KIND, HARDWARE_ROUNDING, INF_IS_NAN)
        tl.store(p_q_rows + (c_lo + o_c)[None, :], b_q, mask=m_x)
    else:
        if TENSOR:
            scale = amax_scale(tl.load(p_amax), KIND) + tl.zeros([BLOCK_R], tl.float32)
            if (tl.program_id(0) == 0) & (i_g == 0):
                tl.store(p_scale, tl.max(scale, axis=0))
        else:
            amax = tl.zeros([BLOCK_R], tl.float32)
            for c in range(c_lo, c_hi, BLOCK_C):
                m_x = m_r[:, None] & (c + o_c < c_hi)[None, :]
                o_x = _column_offsets(c + o_c, stride_x_c, COLUMN_STRIDED)
                b_x = tl.load(p_x_rows + o_x[None, :], mask=m_x, other=0.0)  # [R, C]
                amax = tl.maximum(amax, finite_row_amax(b_x.to(tl.float32)))
            scale = amax_scale(amax, KIND)
            tl.store(p_scale + r64 * stride_s_r + i_g, scale, mask=m_r)
        for c in range(c_lo, c_hi, BLOCK_C):
            m_x = m_r[:, None] & (c + o_c < c_hi)[None, :]
            o_x = _column_offsets(c + o_c, stride_x_c, COLUMN_STRIDED)
            b_x = tl.load(p_x_rows + o_x[None, :], mask=m_x, other=0.0).to(tl.float32)
            b_q = codes(b_x, scale[:, None], KIND, HARDWARE_ROUNDING, INF_IS_NAN)
            tl.store(p_q_rows + (c + o_c)[None, :], b_q, mask=m_x)


@triton.jit
def _quantize_blocks_kernel(
    p_x, p_q, p_scale, n_rows, n_cols, stride_x_r, stride_q_r, stride_s_r,
    KIND: tl.constexpr, HARDWARE_ROUNDING: tl.constexpr, BLOCK: tl.constexpr, CHUNK_R: tl.constexpr,
):  # fmt: skip
    """One BLOCK x BLOCK block (program_id(0), program_id(1)) of a 2-D x: read once when CHUNK_R >= BLOCK, else in
    CHUNK_R-row chunks twice (its amax, then its codes)."""
    i_br, i_bc = tl.program_id(0), tl.program_id(1)
    o_c = i_bc * BLOCK + tl.arange(0, BLOCK)
    m_c = o_c < n_cols
    r_lo = i_br * BLOCK
    r_hi = tl.minimum(r_lo + BLOCK, n_rows)
    p_scale_block = p_scale + i_br.to(tl.int64) * stride_s_r + i_bc
    if CHUNK_R >= BLOCK:
        r64 = (r_lo + tl.arange(0, BLOCK)).to(tl.int64)
        m_x = (r64 < n_rows)[:, None] & m_c[None, :]
        b_x = tl.load(p_x + r64[:, None] * stride_x_r + o_c[None, :], mask=m_x, other=0.0).to(tl.float32)
        scale = amax_scale(tl.max(finite_row_amax(b_x), axis=0), KIND)
        tl.store(p_scale_block, scale)
        tl.store(p_q + r64[:, None] * stride_q_r + o_c[None, :], codes(b_x, scale, KIND, HARDWARE_ROUNDING), mask=m_x)
    else:
        o_r = tl.arange(0, CHUNK_R)
        amax = tl.zeros([CHUNK_R], tl.float32)
        for r in range(r_lo, r_hi, CHUNK_R):
            r64 = (r + o_r).to(tl.int64)
            m_x = (r + o_r < n_rows)[:, None] & m_c[None, :]
            b_x = tl.load(p_x + r64[:, None] * stride_x_r + o_c[None, :], mask=m_x, other=0.0).to(tl.float32)
            amax = tl.maximum(amax, finite_row_amax(b_x))
        scale = amax_scale(tl.max(amax, axis=0), KIND)
        tl.store(p_scale_block, scale)
        for r in range(r_lo, r_hi, CHUNK_R):
            r64 = (r + o_r).to(tl.int64)
            m_x = (r + o_r < n_rows)[:, None] & m_c[None, :]
            b_x = tl.load(p_x + r64[:, None] * stride_x_r + o_c[None, :], mask=m_x, other=0.0).to(tl.float32)
            b_q = codes(b_x, scale, KIND, HARDWARE_ROUNDING)
            tl.store(p_q + r64[:, None] * stride_q_r + o_c[None, :], b_q, mask=m_x)


@triton.jit
def _dequantize_kernel(
    p_q, p_scale, p_out, n_rows, n_cols, stride_q_r, stride_q_c, stride_s_r, stride_out_r,
    GRANULARITY: tl.constexpr, SIZE: tl.constexpr, COLUMN_STRIDED: tl.constexpr, BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
):  # fmt: skip
    """x' = q * scale for a BLOCK_R x BLOCK_C tile, the scale by GRANULARITY: "tensor" one scale, "row" scale[r],
    "group" scale[r, c // SIZE], "block" scale[r // SIZE, c // SIZE]. SIZE (a power of two) and the granularity are
    constants, so a group's index is a shift, and a tile holding whole groups (SIZE <= BLOCK_C) loads each group's
    scale once and spreads it over the group in registers instead of loading it for every value. COLUMN_STRIDED:
    the codes lie down their columns (unit stride along the rows, stride_q_c along the columns: a transposed
    view), read as a [C, R] tile along where they lie and transposed in registers; else along the rows (stride 1)."""
    o_r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    o_c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    r64 = o_r.to(tl.int64)
    m_r = o_r < n_rows
    m_c = o_c < n_cols
    m_x = m_r[:, None] & m_c[None, :]
    if COLUMN_STRIDED:
        p_q_tile = p_q + o_c.to(tl.int64)[:, None] * stride_q_c + o_r[None, :]  # [C, R]
        b_q = tl.trans(tl.load(p_q_tile, mask=m_c[:, None] & m_r[None, :])).to(tl.float32)  # [R, C]
    else:
        b_q = tl.load(p_q + r64[:, None] * stride_q_r + o_c[None, :], mask=m_x).to(tl.float32)  # [R, C]
    if GRANULARITY == "tensor":
        b_x = b_q * tl.load(p_scale)
    elif GRANULARITY == "row":
        b_x = b_q * tl.load(p_scale + r64 * stride_s_r, mask=m_r, other=0.0)[:, None]
    else:
        p_s_rows = p_scale + (r64 if GRANULARITY == "group" else r64 // SIZE) * stride_s_r  # [R]
        if SIZE <= BLOCK_C:  # whole groups: one scale load a group
            GROUPS: tl.constexpr = BLOCK_C // SIZE
            o_g = tl.program_id(1) * GROUPS + tl.arange(0, GROUPS)
            b_s = tl.load(p_s_rows[:, None] + o_g[None, :], mask=m_r[:, None] & (o_g * SIZE < n_cols)[None, :],
                          other=0.0)  # fmt: skip
            b_x = tl.reshape(tl.reshape(b_q, (BLOCK_R, GROUPS, SIZE)) * b_s[:, :, None], (BLOCK_R, BLOCK_C))
        else:  # the tile lies inside one group along the columns
            b_x = b_q * tl.load(p_s_rows + (tl.program_id(1) * BLOCK_C) // SIZE, mask=m_r, other=0.0)[:, None]
    tl.store(p_out + r64[:, None] * stride_out_r + o_c[None, :], b_x.to(p_out.dtype.element_ty), mask=m_x)


@triton.jit
def _nf4_codes(b_scaled, p_bounds):
    """The NF4 code of each value in [-1, 1]: the number of the 15 midpoints between neighbouring code values that
    lie below it (a value on a midpoint takes the lower code, as bitsandbytes' bucketize and decision tree do)."""
    b_code = tl.zeros(b_scaled.shape, tl.int32)
    for j in tl.static_range(15):
        b_code += (b_scaled > tl.load(p_bounds + j)).to(tl.int32)
    return b_code


@triton.jit
def _nf4_quantize_kernel(p_w, p_packed, p_absmax, p_bounds, n, n_blocks, BLOCKSIZE: tl.constexpr, BLOCKS: tl.constexpr):
    """BLOCKS blocks of BLOCKSIZE values of the flattened weight: per block, absmax = max |w| (fp32); the values
    scaled by its reciprocal and clamped to [-1, 1], each replaced by the nearest NF4 code, two codes a byte (the
    first value in the high nibble). Values past the end count as 0 (code 7), as bitsandbytes pads them."""
    o_block = tl.program_id(0).to(tl.int64) * BLOCKS + tl.arange(0, BLOCKS)
    o_pair = tl.arange(0, BLOCKSIZE // 2)
    o_even = o_block[:, None] * BLOCKSIZE + 2 * o_pair[None, :]  # [BLOCKS, BLOCKSIZE / 2]
    b_even = tl.load(p_w + o_even, mask=o_even < n, other=0.0).to(tl.float32)
    b_odd = tl.load(p_w + o_even + 1, mask=o_even + 1 < n, other=0.0).to(tl.float32)
    absmax = tl.maximum(tl.max(tl.abs(b_even), axis=1), tl.max(tl.abs(b_odd), axis=1))  # [BLOCKS]
    tl.store(p_absmax + o_block, absmax, mask=o_block < n_blocks)
    # bitsandbytes multiplies by the reciprocal of the absmax, floored at the fp32 value nearest 1e-38 (a subnormal,
    # so the literal would be taken as fp64): a block of zeros scales to zeros.
    inverse = tl.math.div_rn(1.0, tl.maximum(absmax, tl.full((), 1e-38, tl.float32)))[:, None]
    high = _nf4_codes(tl.minimum(tl.maximum(b_even * inverse, -1.0), 1.0), p_bounds)
    low = _nf4_codes(tl.minimum(tl.maximum(b_odd * inverse, -1.0), 1.0), p_bounds)
    o_byte = o_block[:, None] * (BLOCKSIZE // 2) + o_pair[None, :]
    tl.store(p_packed + o_byte, ((high << 4) | low).to(tl.uint8), mask=o_even < n)


@triton.jit
def _nf4_dequantize_kernel(
    p_packed, p_absmax, p_code, p_absmax_codes, p_absmax_scales, p_nested_code, p_offset, p_out, n, n_bytes,
    BLOCKSIZE: tl.constexpr, NESTED: tl.constexpr, NESTED_BLOCK: tl.constexpr, BLOCKS: tl.constexpr,
):  # fmt: skip
    """BLOCKS blocks of BLOCKSIZE values: value 2i = code[byte i >> 4] * absmax, value 2i + 1 = code[byte i & 15] *
    absmax, in fp32, cast to the output's dtype. NESTED (double quantization): absmax = nested_code[absmax_codes[b]] *
    absmax_scales[b // NESTED_BLOCK] + offset, as separate fp32 roundings (the launch turns off fused multiply-adds,
    so that the result is bitsandbytes' bit for bit).

    The bytes are read as [BLOCKS, BLOCKSIZE / 2] (the mask against n_bytes, an argument, so that a multiple of 16
    keeps the loads vectorized), each block's absmax once, and the two halves joined back into consecutive values
    and stored as one contiguous tile: stores of every other value compile to 2-byte stores."""
    o_block = tl.program_id(0).to(tl.int64) * BLOCKS + tl.arange(0, BLOCKS)
    o_byte = o_block[:, None] * (BLOCKSIZE // 2) + tl.arange(0, BLOCKSIZE // 2)[None, :]
    b_byte = tl.load(p_packed + o_byte, mask=o_byte < n_bytes, other=0).to(tl.int32)  # [BLOCKS, BLOCKSIZE / 2]
    m_block = o_block * BLOCKSIZE < n
    b_absmax = nf4_absmax(
        p_absmax, p_absmax_codes, p_absmax_scales, p_offset, p_nested_code, o_block, m_block, NESTED, NESTED_BLOCK
    )  # [BLOCKS]
    b_high = tl.load(p_code + (b_byte >> 4)) * b_absmax[:, None]
    b_low = tl.load(p_code + (b_byte & 15)) * b_absmax[:, None]
    b_w = tl.reshape(tl.join(b_high, b_low), (BLOCKS, BLOCKSIZE))
    o_value = o_block[:, None] * BLOCKSIZE + tl.arange(0, BLOCKSIZE)[None, :]
    tl.store(p_out + o_value, b_w.to(p_out.dtype.element_ty), mask=o_value < n)


@triton.jit
def _int4_quantize_kernel(
    p_w, p_q, p_scale, p_zero, n_rows, n_cols, stride_w_r, stride_q_r, stride_s_r,
    GROUP: tl.constexpr, SYMMETRIC: tl.constexpr, BLOCK_R: tl.constexpr,
):  # fmt: skip
    """BLOCK_R rows x group program_id(1) (GROUP columns; the last group may be partial) of w (N, K):

        asymmetric: scale = max(max - min, 1e-5) / 15, zero = round(-min / scale), with min <= 0 <= max (the
                    group's range widened to hold 0, as GPTQ's: the zero point is then a code)
        symmetric:  scale = max(max |w|, 1e-5) / 7,     zero = 8
        code = clamp(round(w / scale) + zero, 0, 15),   w' = (code - zero) * scale

    over the group's values (round: to nearest, ties to even); two codes a byte along K, the even column in the low
    nibble."""
    o_r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    r64 = o_r.to(tl.int64)
    i_g = tl.program_id(1)
    o_even = i_g * GROUP + 2 * tl.arange(0, GROUP // 2)
    m_even = (o_r < n_rows)[:, None] & (o_even < n_cols)[None, :]
    m_odd = (o_r < n_rows)[:, None] & (o_even + 1 < n_cols)[None, :]
    p_pairs = p_w + r64[:, None] * stride_w_r + o_even[None, :]
    b_even = tl.load(p_pairs, mask=m_even, other=0.0).to(tl.float32)  # [R, GROUP / 2]
    b_odd = tl.load(p_pairs + 1, mask=m_odd, other=0.0).to(tl.float32)
    if SYMMETRIC:
        amax = tl.maximum(tl.max(tl.abs(b_even), axis=1), tl.max(tl.abs(b_odd), axis=1))
        scale = tl.math.div_rn(tl.maximum(amax, 1e-5), 7.0)
        zero = tl.full(scale.shape, 8.0, tl.float32)
    else:
        # Lanes past K read 0, which the range holds anyway.
        high = tl.maximum(tl.maximum(tl.max(b_even, axis=1), tl.max(b_odd, axis=1)), 0.0)
        low = tl.minimum(tl.minimum(tl.min(b_even, axis=1), tl.min(b_odd, axis=1)), 0.0)
        scale = tl.math.div_rn(tl.maximum(high - low, 1e-5), 15.0)
        zero = tl.minimum(tl.maximum(round_half_even(tl.math.div_rn(-low, scale)), 0.0), 15.0)
    code_even = tl.minimum(tl.maximum(round_half_even(tl.math.div_rn(b_even, scale[:, None])) + zero[:, None], 0.0),
                           15.0)  # fmt: skip
    code_odd = tl.minimum(tl.maximum(round_half_even(tl.math.div_rn(b_odd, scale[:, None])) + zero[:, None], 0.0),
                          15.0)  # fmt: skip
    packed = (code_even.to(tl.int32) | (code_odd.to(tl.int32) << 4)).to(tl.uint8)
    p_bytes = p_q + r64[:, None] * stride_q_r + (i_g * (GROUP // 2) + tl.arange(0, GROUP // 2))[None, :]
    tl.store(p_bytes, packed, mask=m_even)
    tl.store(p_scale + r64 * stride_s_r + i_g, scale, mask=o_r < n_rows)
    tl.store(p_zero + r64 * stride_s_r + i_g, zero.to(tl.uint8), mask=o_r < n_rows)


@triton.jit
def _int4_dequantize_kernel(
    p_q, p_scale, p_zero, p_out, n_rows, n_cols, stride_q_r, stride_s_r, stride_out_r,
    GROUP: tl.constexpr, BLOCK_R: tl.constexpr, GROUPS: tl.constexpr,
):  # fmt: skip
    """w' = (code - zero) * scale for BLOCK_R rows x GROUPS groups of GROUP columns of w (N, K), in fp32, cast to the
    output's dtype. The bytes are read as [BLOCK_R, GROUPS, GROUP / 2] (each byte once), each group's scale and zero
    once, and the two nibbles joined back into consecutive columns and stored as one contiguous tile."""
    o_r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    r64 = o_r.to(tl.int64)
    m_r = o_r < n_rows
    o_g = tl.program_id(1) * GROUPS + tl.arange(0, GROUPS)
    o_pair = o_g[:, None] * (GROUP // 2) + tl.arange(0, GROUP // 2)[None, :]  # [GROUPS, GROUP / 2]
    m_pair = m_r[:, None, None] & (o_pair < n_cols // 2)[None, :, :]  # K is even: whole bytes
    b_byte = tl.load(p_q + r64[:, None, None] * stride_q_r + o_pair[None, :, :], mask=m_pair, other=0).to(tl.int32)
    o_group = r64[:, None] * stride_s_r + o_g[None, :]
    m_group = m_r[:, None] & (o_g * GROUP < n_cols)[None, :]
    b_scale = tl.load(p_scale + o_group, mask=m_group, other=0.0)[:, :, None]  # [R, GROUPS, 1]
    b_zero = tl.load(p_zero + o_group, mask=m_group, other=0).to(tl.float32)[:, :, None]
    b_even = ((b_byte & 15).to(tl.float32) - b_zero) * b_scale
    b_odd = ((b_byte >> 4).to(tl.float32) - b_zero) * b_scale
    b_w = tl.reshape(tl.join(b_even, b_odd), (BLOCK_R, GROUPS * GROUP))
    o_c = tl.program_id(1) * (GROUPS * GROUP) + tl.arange(0, GROUPS * GROUP)
    m_w = m_r[:, None] & (o_c < n_cols)[None, :]
    tl.store(p_out + r64[:, None] * stride_out_r + o_c[None, :], b_w.to(p_out.dtype.element_ty), mask=m_w)
