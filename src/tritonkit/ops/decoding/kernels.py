"""Flash decoding kernels: split-KV attention of a few new queries over a (paged, quantized) KV cache, the
reduction of the splits, the cache append, and the KV formats' quantize and dequantize.

Attention, for sequence b whose cache holds L = cache_seqlens[b] tokens (the new ones included): its Sq new queries
sit at positions r_t = L - Sq + t (t = 0 .. Sq - 1) and query t sees key j when j < L, j <= r_t (causal) and
j >= r_t - window (window >= 0). Query head h reads key head h // (Hq / Hk). With s_tj = scale * q_t . k_j, or with a
softcap c > 0, s_tj = c * tanh(scale * q_t . k_j / c):

    lse_t = log sum_j exp(s_tj),   o_t = sum_j exp(s_tj - lse_t) v_j        (o_t = 0, lse_t = -inf: no key seen)

Split-KV: the keys a program's rows see are cut into S equal splits (whole key blocks). Each (split, batch, key head,
block of rows) program walks its split with the online softmax in base 2 and writes its partial (o_s, lse_s) for the
rows of all the query heads of its key head (so each key and value is read once per key head, not per query head).
The reduction, in split order (deterministic): lse = log sum_s exp(lse_s), o = sum_s exp(lse_s - lse) o_s, where a
split that saw no key has lse_s = -inf and weight 0. With S = 1 the split kernel writes o and lse itself.

Cache formats: one row is one token of one key head, D values; each format x ~ x' as follows.
- "plain": x in q's dtype.
- "int8": a code c in [-127, 127] and one fp32 scale per row: x' = c * scale, scale = max|x| / 127,
  c = round(x / scale) (ties to even).
- "fp8": a float8_e4m3fn code and one fp32 scale per row: x' = c * scale, scale = max|x| / 448, c = e4m3(x / scale).
- "int4": groups of G consecutive values along D, each with an fp16 (scale, zero): zero = the group's minimum,
  scale = (max - min) / 15 (both rounded to fp16 first), c = round((x - zero) / scale) in [0, 15], x' = c scale +
  zero; two codes per byte, value 2i in the low nibble and 2i + 1 in the high one.
The int8 and fp8 row scales multiply the score columns (keys) and the probabilities (values), so the products read
the codes themselves, exact in 16-bit floats; int4 is dequantized element by element.

Paged caches: key j of sequence b is slot j % page_size of page block_table[b, j // page_size]; a contiguous cache
is read as pages of one sequence each (page b, slot j). A page number outside the pool, or a key beyond the cache's
capacity, counts as no key (read nowhere, written nowhere).
"""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from tritonkit._core.jit.dots import dot_fp32, interleaved_parts
from tritonkit._core.jit.fastmath import LOG2_E, tanh_via_exp2
from tritonkit._core.jit.int_codes import code_as_float, halfword_bytes_as_halves, halfword_nibbles_as_halves
from tritonkit._core.jit.rounding import round_to_float8, rounded_int32, rows_as_fp16, to_dot_operand


@triton.jit
def _cache_rows(p_table, i_b, o_j, m_j, capacity, n_pages, stride_table_b, PAGED: tl.constexpr,
                PAGE_SIZE: tl.constexpr):  # fmt: skip
    """(page as int64, slot, valid) of tokens o_j of sequence i_b (o_j a scalar or a vector; m_j: which to consider).
    Paged: page block_table[b, j // PAGE_SIZE], valid when inside the pool; contiguous: page b, slot j."""
    m_j = m_j & (o_j >= 0) & (o_j < capacity)
    if PAGED:
        page = tl.load(p_table + i_b.to(tl.int64) * stride_table_b + o_j // PAGE_SIZE, mask=m_j, other=0)
        valid = m_j & (page >= 0) & (page < n_pages)
        slot = o_j % PAGE_SIZE
    else:
        page = i_b + o_j * 0
        valid = m_j
        slot = o_j
    return page.to(tl.int64), slot, valid


@triton.jit
def _row_codes(b_x, KV: tl.constexpr, HARDWARE_ROUNDING: tl.constexpr):
    """int8 or fp8 codes [R, D] and fp32 scales [R] of the rows b_x (fp32, padding 0); see the module docstring.
    HARDWARE_ROUNDING: fp8 values rounded by the conversion itself (sm_89 and newer), else to the e4m3 grid in fp32
    first (the interpreter's conversion rounds wrongly); the same codes. int8 codes are the rounded values' low
    bits (rounded_int32), not a float-to-int conversion (a quarter-rate instruction a value on sm_90)."""
    top: tl.constexpr = 127.0 if KV == "int8" else 448.0
    amax = tl.max(tl.abs(b_x), axis=1)
    # IEEE division (div_rn; Triton's `/` is approximate on a GPU), so that the codes follow the definition exactly.
    inv = tl.where(amax > 0.0, tl.math.div_rn(top, tl.where(amax > 0.0, amax, 1.0)), 0.0)  # zeros: codes 0, scale 0
    b_y = tl.minimum(tl.maximum(b_x * inv[:, None], -top), top)  # x * (top / amax) may pass top by an ulp
    if KV == "int8":
        b_code = rounded_int32(b_y).to(tl.int8)
    elif HARDWARE_ROUNDING:
        b_code = b_y.to(tl.float8e4nv, fp_downcast_rounding="rtne")
    else:
        b_code = round_to_float8(b_y, 3, -6).to(tl.float8e4nv)
    return b_code, tl.math.div_rn(amax, top)


@triton.jit
def _int4_codes(b_even, b_odd, BLOCK_D: tl.constexpr, GROUP: tl.constexpr):
    """int4 codes of rows given as their even and odd values ([R, BLOCK_D / 2] each, fp32): the packed bytes
    [R, BLOCK_D / 2] and the fp16 scales and zeros [R, BLOCK_D / GROUP]. Padding columns form whole groups of their
    own (GROUP divides D), which are never stored."""
    N_GROUPS: tl.constexpr = BLOCK_D // GROUP
    HALF: tl.constexpr = GROUP // 2
    rows: tl.constexpr = b_even.shape[0]
    b_even3 = tl.reshape(b_even, (rows, N_GROUPS, HALF))
    b_odd3 = tl.reshape(b_odd, (rows, N_GROUPS, HALF))
    lo = tl.minimum(tl.min(b_even3, axis=2), tl.min(b_odd3, axis=2))  # [R, G]
    hi = tl.maximum(tl.max(b_even3, axis=2), tl.max(b_odd3, axis=2))
    scale16 = tl.math.div_rn(hi - lo, 15.0).to(tl.float16)
    zero16 = lo.to(tl.float16)
    scale, zero = scale16.to(tl.float32), zero16.to(tl.float32)
    inv = tl.where(scale > 0.0, tl.math.div_rn(1.0, tl.where(scale > 0.0, scale, 1.0)), 0.0)[:, :, None]  # constant: 0
    # Clamped, then rounded to integers by their bits (the same codes as rounding first: the bounds are integers).
    c_even = rounded_int32(tl.minimum(tl.maximum((b_even3 - zero[:, :, None]) * inv, 0.0), 15.0))
    c_odd = rounded_int32(tl.minimum(tl.maximum((b_odd3 - zero[:, :, None]) * inv, 0.0), 15.0))
    packed = c_even | (c_odd << 4)
    return tl.reshape(packed, (rows, BLOCK_D // 2)).to(tl.uint8), scale16, zero16


@triton.jit
def _quantize_rows(p_x, off_x, p_data, off_data, p_scales, off_scales, m_r, head_dim, stride_s_g, stride_s_z,
                   KV: tl.constexpr, BLOCK_D: tl.constexpr, GROUP: tl.constexpr,
                   HARDWARE_ROUNDING: tl.constexpr):  # fmt: skip
    """Write rows of x (int64 row offsets off_x [R], unit stride along D; m_r: which rows) in format KV at the data
    rows off_data (unit stride) and their scales at off_scales (int4: groups stride_s_g apart, the zero stride_s_z
    after the scale). The one writer of every format: quantize_kv and kv_cache_append both call it."""
    if KV == "int4":
        # Whole rows in one contiguous load, split into even and odd values in registers: two loads of every other
        # value cannot be vectorised.
        o_d = tl.arange(0, BLOCK_D)
        m_x = m_r[:, None] & (o_d[None, :] < head_dim)
        b_x = tl.load(p_x + off_x[:, None] + o_d[None, :], mask=m_x, other=0.0).to(tl.float32)  # [R, D]
        b_even, b_odd = tl.split(tl.reshape(b_x, (m_r.shape[0], BLOCK_D // 2, 2)))  # [R, D / 2] each
        o_i = tl.arange(0, BLOCK_D // 2)
        m_i = m_r[:, None] & (o_i[None, :] < head_dim // 2)
        packed, scale16, zero16 = _int4_codes(b_even, b_odd, BLOCK_D, GROUP)
        tl.store(p_data + off_data[:, None] + o_i[None, :], packed, mask=m_i)
        o_g = tl.arange(0, BLOCK_D // GROUP)
        m_g = m_r[:, None] & (o_g[None, :] < head_dim // GROUP)
        p_s = p_scales + off_scales[:, None] + o_g[None, :] * stride_s_g
        tl.store(p_s, scale16, mask=m_g)
        tl.store(p_s + stride_s_z, zero16, mask=m_g)
    else:
        o_d = tl.arange(0, BLOCK_D)
        m_x = m_r[:, None] & (o_d[None, :] < head_dim)
        b_x = tl.load(p_x + off_x[:, None] + o_d[None, :], mask=m_x, other=0.0).to(tl.float32)  # [R, D]
        if KV == "plain":
            tl.store(p_data + off_data[:, None] + o_d[None, :], b_x.to(p_data.dtype.element_ty), mask=m_x)
        else:
            b_code, b_scale = _row_codes(b_x, KV, HARDWARE_ROUNDING)
            tl.store(p_data + off_data[:, None] + o_d[None, :], b_code, mask=m_x)
            tl.store(p_scales + off_scales, b_scale, mask=m_r)


@triton.jit
def _int4_values(p_data, off_data, p_scales, off_scales, m_r, head_dim, stride_s_g, stride_s_z,
                 BLOCK_D: tl.constexpr, GROUP: tl.constexpr):  # fmt: skip
    """fp32 values [R, BLOCK_D] of int4 rows (int64 offsets off_data and off_scales [R]; m_r: which rows): the
    packed bytes read as [R, D / G, G / 2], each byte's low nibble first, times their group's scale plus its zero
    ([R, D / G] each, read once a group). Padding columns form whole groups (G divides D), which read 0."""
    N_GROUPS: tl.constexpr = BLOCK_D // GROUP
    HALF: tl.constexpr = GROUP // 2
    rows: tl.constexpr = m_r.shape[0]
    o_g = tl.arange(0, N_GROUPS)
    o_b = tl.arange(0, HALF)
    m_g = m_r[:, None] & (o_g[None, :] < head_dim // GROUP)  # [R, D / G]
    p_bytes = p_data + off_data[:, None, None] + (o_g[:, None] * HALF + o_b[None, :])[None, :, :]
    b_byte = tl.load(p_bytes, mask=m_g[:, :, None], other=0).to(tl.int32)  # [R, D / G, G / 2]
    b_code = tl.reshape(tl.join(code_as_float(b_byte & 15), code_as_float(b_byte >> 4)),
                        (rows, N_GROUPS, GROUP))  # fmt: skip
    p_s = p_scales + off_scales[:, None] + o_g[None, :] * stride_s_g
    b_scale = tl.load(p_s, mask=m_g, other=0.0).to(tl.float32)
    b_zero = tl.load(p_s + stride_s_z, mask=m_g, other=0.0).to(tl.float32)
    return tl.reshape(b_code * b_scale[:, :, None] + b_zero[:, :, None], (rows, BLOCK_D))


@triton.jit
def _int4_quarters(p_halves, off_halves, p_pairs, off_pairs, m_r, head_dim, stride_pair_g, BLOCK_D: tl.constexpr,
                   GROUP: tl.constexpr):  # fmt: skip
    """fp16 values of int4 rows as four tiles x_j [R, BLOCK_D / 4], x_j[r, e] the value of head-dim index 4 e + j,
    each q scale + zero rounded once (halfword_nibbles_as_halves): the data read as int16 halfwords of four codes
    (p_halves: the data as int16, off_halves [R] in halfwords), the (scale, zero) pairs as int32 words (p_pairs,
    off_pairs [R] and stride_pair_g in words: 4-byte loads, which the key loop's pipeline copies ahead, where 2-byte
    ones it leaves to wait in each step). G >= 4, so that a halfword lies in one group. Each product takes a
    quarter at a time, keys against q's matching quarter (q . k = sum_j q_j . x_j), P against each quarter of the
    values for the same quarter of o: the halfwords reach the product's operand layout as they were loaded (for the
    values by the transposing ldmatrix) and convert there, where a tile of whole rows would need its fp16 values
    stored to shared memory and read back in that layout (docs/kernels/decoding.md). Padding columns and masked
    rows read 0."""
    HALFWORDS: tl.constexpr = BLOCK_D // 4
    GROUP_HALFWORDS: tl.constexpr = GROUP // 4
    N_GROUPS: tl.constexpr = BLOCK_D // GROUP
    rows: tl.constexpr = m_r.shape[0]
    o_e = tl.arange(0, HALFWORDS)
    # The mask is constant over a group's halfwords, so that a row's halfwords load as vectors.
    m_half = m_r[:, None] & (o_e[None, :] // GROUP_HALFWORDS < head_dim // GROUP)
    b_half = tl.load(p_halves + off_halves[:, None] + o_e[None, :], mask=m_half, other=0)
    o_g = tl.arange(0, N_GROUPS)
    m_g = m_r[:, None] & (o_g[None, :] < head_dim // GROUP)  # [R, D / G]
    b_pair = tl.load(p_pairs + off_pairs[:, None] + o_g[None, :] * stride_pair_g, mask=m_g, other=0)
    b_pair = tl.reshape(tl.broadcast_to(b_pair[:, :, None], (rows, N_GROUPS, GROUP_HALFWORDS)), (rows, HALFWORDS))
    return halfword_nibbles_as_halves(b_half, b_pair)


@triton.jit
def _code_halves(p_halves, off_halves, m_r, head_dim, BLOCK_D: tl.constexpr, KV: tl.constexpr):
    """int8 or fp8 rows as two fp16 tiles [R, BLOCK_D / 2] of their codes' values (exact), x_j[r, e] the code at
    head-dim index 2 e + j: the data read as int16 halfwords of two codes (p_halves: the data as int16,
    off_halves [R] in halfwords). As _int4_quarters: the halfwords reach the products' operand layout as loaded and
    convert there (halfword_bytes_as_halves), where whole 8-bit tiles are converted there too but their value tiles
    are gathered a byte at a time along the keys. Padding columns and masked rows read 0."""
    o_e = tl.arange(0, BLOCK_D // 2)
    m_half = m_r[:, None] & (o_e[None, :] < head_dim // 2)  # head_dim even; this form keeps vector loads
    b_half = tl.load(p_halves + off_halves[:, None] + o_e[None, :], mask=m_half, other=0)
    return halfword_bytes_as_halves(b_half, KV)


@triton.jit
def _quantize_kv_kernel(
    p_x, p_data, p_scales, n_rows, head_dim, stride_x_r, stride_data_r, stride_s_r, stride_s_g, stride_s_z,
    KV: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, GROUP: tl.constexpr,
    HARDWARE_ROUNDING: tl.constexpr,
):  # fmt: skip
    """BLOCK_R rows of x (n_rows x head_dim, unit stride along D) in format KV."""
    o_r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    r64 = o_r.to(tl.int64)
    _quantize_rows(p_x, r64 * stride_x_r, p_data, r64 * stride_data_r, p_scales, r64 * stride_s_r, o_r < n_rows,
                   head_dim, stride_s_g, stride_s_z, KV, BLOCK_D, GROUP, HARDWARE_ROUNDING)  # fmt: skip


@triton.jit
def _dequantize_kv_kernel(
    p_data, p_scales, p_out, n_rows, head_dim, stride_data_r, stride_s_r, stride_s_g, stride_s_z, stride_out_r,
    KV: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, GROUP: tl.constexpr,
):  # fmt: skip
    """x' of BLOCK_R rows in format KV (int8, fp8 or int4), in the output's dtype."""
    o_r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    r64 = o_r.to(tl.int64)
    o_d = tl.arange(0, BLOCK_D)
    m_x = (o_r < n_rows)[:, None] & (o_d[None, :] < head_dim)
    if KV == "int4":  # values not exact in bf16: the one format whose rounding to the operand matters
        b_x = _int4_values(p_data, r64 * stride_data_r, p_scales, r64 * stride_s_r, o_r < n_rows, head_dim,
                           stride_s_g, stride_s_z, BLOCK_D, GROUP)  # fmt: skip
    else:
        b_code = tl.load(p_data + r64[:, None] * stride_data_r + o_d[None, :], mask=m_x).to(tl.float32)  # [R, D]
        b_x = b_code * tl.load(p_scales + r64 * stride_s_r, mask=o_r < n_rows, other=0.0)[:, None]
    tl.store(p_out + r64[:, None] * stride_out_r + o_d[None, :], b_x.to(p_out.dtype.element_ty), mask=m_x)


@triton.jit
def _kv_append_kernel(
    p_k_new, p_v_new, p_k, p_v, p_k_scales, p_v_scales, p_seqlens, p_table,
    n_new, n_heads_k, head_dim, capacity, n_pages,
    stride_kn_b, stride_kn_s, stride_kn_h, stride_vn_b, stride_vn_s, stride_vn_h,
    stride_k_page, stride_k_slot, stride_k_h, stride_v_page, stride_v_slot, stride_v_h,
    stride_ks_page, stride_ks_slot, stride_ks_h, stride_ks_g, stride_ks_z,
    stride_vs_page, stride_vs_slot, stride_vs_h, stride_vs_g, stride_vs_z, stride_table_b,
    KV: tl.constexpr, PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr, GROUP: tl.constexpr, HARDWARE_ROUNDING: tl.constexpr,
):  # fmt: skip
    """Tokens t .. t + BLOCK_T of sequence b (program b * ceil(Sq / BLOCK_T) + t / BLOCK_T), every key head: k_new
    and v_new written at positions cache_seqlens[b] + t .. of the cache, in its format, each token's page looked up
    apart. A position beyond the capacity or on a page outside the pool is not written."""
    n_token_blocks = tl.cdiv(n_new, BLOCK_T)
    i_b, i_tb = tl.program_id(0) // n_token_blocks, tl.program_id(0) % n_token_blocks
    # Rows (token, head), head fastest, as one vector: _quantize_rows takes a vector of rows, and offsets built from a
    # flat arange keep their strides' divisibility (reshaped from [T, H] they lost it, and the loads their width).
    o_r = tl.arange(0, BLOCK_T * BLOCK_H)
    o_t = i_tb * BLOCK_T + o_r // BLOCK_H
    o_h = o_r % BLOCK_H
    position = tl.load(p_seqlens + i_b) + o_t  # [R]
    page, slot, valid = _cache_rows(p_table, i_b, position, o_t < n_new, capacity, n_pages, stride_table_b, PAGED,
                                    PAGE_SIZE)  # fmt: skip
    m_r = valid & (o_h < n_heads_k)
    b64, t64, h64, slot64 = i_b.to(tl.int64), o_t.to(tl.int64), o_h.to(tl.int64), slot.to(tl.int64)
    _quantize_rows(p_k_new, b64 * stride_kn_b + t64 * stride_kn_s + h64 * stride_kn_h,
                   p_k, page * stride_k_page + slot64 * stride_k_slot + h64 * stride_k_h,
                   p_k_scales, page * stride_ks_page + slot64 * stride_ks_slot + h64 * stride_ks_h,
                   m_r, head_dim, stride_ks_g, stride_ks_z, KV, BLOCK_D, GROUP, HARDWARE_ROUNDING)  # fmt: skip
    _quantize_rows(p_v_new, b64 * stride_vn_b + t64 * stride_vn_s + h64 * stride_vn_h,
                   p_v, page * stride_v_page + slot64 * stride_v_slot + h64 * stride_v_h,
                   p_v_scales, page * stride_vs_page + slot64 * stride_vs_slot + h64 * stride_vs_h,
                   m_r, head_dim, stride_vs_g, stride_vs_z, KV, BLOCK_D, GROUP, HARDWARE_ROUNDING)  # fmt: skip


@triton.jit
def _load_keys(p_data, off_data, p_scales, off_scales, m_x, m_n, head_dim, o_d, stride_s_g, stride_s_z,
               mma_dtype: tl.constexpr, KV: tl.constexpr, BLOCK_D: tl.constexpr, GROUP: tl.constexpr,
               UPCAST: tl.constexpr, DIRECT_CODES: tl.constexpr):  # fmt: skip
    """A [N, D] tile of cache rows as the products read it (mma_dtype) and the rows' scales [N] (1 where the format
    has none, or folds them into the values: plain, int4). Masked rows read 0 (a value row of NaN would poison the
    products even with weight 0). UPCAST: int4's values rounded to bf16 by their bits (and kept in fp32), because the
    interpreter's conversion truncates (a CPU test saw scores 0.02 off); the other formats' values are exact in bf16.
    DIRECT_CODES: int8 and fp8 codes converted to mma_dtype in one step (exact: |c| <= 127 in int8, and e4m3's four
    significant bits and exponents fit bf16 and fp16), not through fp32; under the interpreter (UPCAST) bf16 takes
    the fp32 step, its conversion from int8 gives NaN there. int8 and fp8 masked rows are filled with 0 by the load
    itself (_zero_filled_codes), so that the conversion is the tile's only operation, which the compiler then moves
    after the read of the tile in the layout of the product's operand (no round trip of the converted tile through
    shared memory)."""
    offsets = off_data[:, None] + o_d[None, :]
    if KV == "int4":  # values not exact in bf16: the one format whose rounding to the operand matters
        b_x = _int4_values(p_data, off_data, p_scales, off_scales, m_n, head_dim, stride_s_g, stride_s_z, BLOCK_D,
                           GROUP)  # fmt: skip
        b_x = to_dot_operand(b_x, mma_dtype, UPCAST)
        b_scale = tl.full(m_n.shape, 1.0, tl.float32)
    elif KV == "plain":
        b_x = tl.load(p_data + offsets, mask=m_x, other=0.0)
        b_scale = tl.full(m_n.shape, 1.0, tl.float32)
    else:
        # int8 and fp8 through the hardware conversions: the bit arithmetic of int4's values measured slower for
        # these (docs/kernels/decoding.md). Zero-filled by the load rather than zeroed after the conversion: faster
        # on the H200 (benchmarks/results/nvidia-h200/2026-11-28-decode-quantized-switches.md).
        code_dtype: tl.constexpr = mma_dtype if DIRECT_CODES and not UPCAST else tl.float32
        b_x = _zero_filled_codes(p_data, offsets, m_x).to(code_dtype)
        b_scale = tl.load(p_scales + off_scales, mask=m_n, other=0.0)
    return (b_x if KV == "int4" else b_x.to(mma_dtype)), b_scale


@triton.jit
def _zero_filled_codes(p_data, offsets, mask):
    """int8 or fp8 codes at p_data + offsets, 0 where mask is off: fp8 read as its bytes (the interpreter cannot
    fill fp8 with a constant) and reinterpreted, which costs no instruction."""
    if tl.float8e4nv == p_data.dtype.element_ty:
        b_byte = tl.load(p_data.to(tl.pointer_type(tl.uint8)) + offsets, mask=mask, other=0)
        b_code = b_byte.to(tl.float8e4nv, bitcast=True)
    else:
        b_code = tl.load(p_data + offsets, mask=mask, other=0)
    return b_code


@triton.jit
def _attend_keys(
    acc, m_i, l_i, b_q, start_n, p_k, p_v, p_k_scales, p_v_scales, p_table, i_b, hk64, end, capacity, n_pages,
    position, window, qk_scale, softcap_log2, head_dim, o_n, o_d, m_d,
    stride_k_page, stride_k_slot, stride_k_h, stride_v_page, stride_v_slot, stride_v_h,
    stride_ks_page, stride_ks_slot, stride_ks_h, stride_ks_g, stride_ks_z,
    stride_vs_page, stride_vs_slot, stride_vs_h, stride_vs_g, stride_vs_z, stride_table_b,
    KV: tl.constexpr, PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr, CAUSAL: tl.constexpr, SOFTCAP: tl.constexpr,
    DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr, DIRECT_CODES: tl.constexpr, CODE_PARTS: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, GROUP: tl.constexpr, MASKED: tl.constexpr,
):  # fmt: skip
    """One step of the online softmax (base 2) over the key block start_n .. + BLOCK_N: the running row maxima m_i,
    sums l_i and output acc, updated. MASKED: keys looked up one by one and hidden by the split's end, the capacity,
    the pool, the window and causality; unmasked (a block every row sees whole), with pages of at least a block, one
    page lookup for the block, and with smaller pages that divide it, one lookup a page (a page outside the pool
    still hides its keys). CODE_PARTS (4: int4, 2: int8 or fp8; 0: whole tiles): the cache's data as int16 halfwords
    taken in CODE_PARTS parts of the head dim (_int4_quarters with its scales as int32 pairs; _code_halves), fp16
    products, q in fp16 and qk_scale one factor a row (rows_as_fp16), acc CODE_PARTS tiles of o [M, D / CODE_PARTS]
    (acc_j[m, e]: o[m, CODE_PARTS e + j]), for halves in units of acc[2] (the largest value scale so far)."""
    o_j = start_n + o_n
    if not MASKED and (not PAGED or PAGE_SIZE % BLOCK_N == 0):
        if PAGED:
            page = tl.load(p_table + i_b.to(tl.int64) * stride_table_b + start_n // PAGE_SIZE)
            page_ok = (page >= 0) & (page < n_pages)
            page64 = tl.where(page_ok, page, 0).to(tl.int64)
            slot0 = tl.cast(start_n % PAGE_SIZE, tl.int64)
            # "!= 0": the interpreter gives a vector & a scalar integer data, which its masked loads refuse.
            m_n = ((o_n >= 0) & page_ok) != 0
        else:
            page64 = i_b.to(tl.int64)
            slot0 = tl.cast(start_n, tl.int64)
            m_n = o_n >= 0  # every key: the block is inside the capacity
        rows = o_n.to(tl.int64)
        off_k = (page64 * stride_k_page + slot0 * stride_k_slot + hk64 * stride_k_h) + rows * stride_k_slot
        off_v = (page64 * stride_v_page + slot0 * stride_v_slot + hk64 * stride_v_h) + rows * stride_v_slot
        off_ks = (page64 * stride_ks_page + slot0 * stride_ks_slot + hk64 * stride_ks_h) + rows * stride_ks_slot
        off_vs = (page64 * stride_vs_page + slot0 * stride_vs_slot + hk64 * stride_vs_h) + rows * stride_vs_slot
    else:
        if not MASKED and BLOCK_N % PAGE_SIZE == 0:
            # Pages smaller than a block: its pages' entries in one load, gathered to their rows in registers, where
            # the key-by-key path loads an entry a key and masks each against the split's end and the capacity.
            PAGES: tl.constexpr = BLOCK_N // PAGE_SIZE
            pages = tl.load(p_table + i_b.to(tl.int64) * stride_table_b + start_n // PAGE_SIZE + tl.arange(0, PAGES))
            page = tl.gather(pages, o_n // PAGE_SIZE, 0)  # [BLOCK_N]
            m_n = (page >= 0) & (page < n_pages)
            page = tl.where(m_n, page, 0).to(tl.int64)
            slot = o_n % PAGE_SIZE
        else:
            page, slot, m_n = _cache_rows(p_table, i_b, o_j, o_j < end, capacity, n_pages, stride_table_b, PAGED,
                                          PAGE_SIZE)  # fmt: skip
        slot64 = slot.to(tl.int64)
        off_k = page * stride_k_page + slot64 * stride_k_slot + hk64 * stride_k_h
        off_v = page * stride_v_page + slot64 * stride_v_slot + hk64 * stride_v_h
        off_ks = page * stride_ks_page + slot64 * stride_ks_slot + hk64 * stride_ks_h
        off_vs = page * stride_vs_page + slot64 * stride_vs_slot + hk64 * stride_vs_h
    m_x = m_n[:, None] & m_d[None, :]
    mma_dtype: tl.constexpr = b_q.dtype
    if CODE_PARTS:
        if CODE_PARTS == 4:
            k_parts = _int4_quarters(p_k, off_k, p_k_scales, off_ks, m_n, head_dim, stride_ks_g, BLOCK_D, GROUP)
            v_parts = _int4_quarters(p_v, off_v, p_v_scales, off_vs, m_n, head_dim, stride_vs_g, BLOCK_D, GROUP)
            score_scale = qk_scale[:, None]  # int4 keys: no scale; q's rows: one factor each
        else:
            k_parts = _code_halves(p_k, off_k, m_n, head_dim, BLOCK_D, KV)
            v_parts = _code_halves(p_v, off_v, m_n, head_dim, BLOCK_D, KV)
            k_scale = tl.load(p_k_scales + off_ks, mask=m_n, other=0.0)
            v_scale = tl.load(p_v_scales + off_vs, mask=m_n, other=0.0)
            score_scale = qk_scale[:, None] * k_scale[None, :]
        q_parts = interleaved_parts(b_q, CODE_PARTS)
        b_s = tl.dot(q_parts[0], tl.trans(k_parts[0]))
        for j in tl.static_range(1, CODE_PARTS):
            b_s = tl.dot(q_parts[j], tl.trans(k_parts[j]), b_s)
        b_s = b_s * score_scale  # [M, N]
    else:
        b_k, k_scale = _load_keys(p_k, off_k, p_k_scales, off_ks, m_x, m_n, head_dim, o_d, stride_ks_g,
                                  stride_ks_z, mma_dtype, KV, BLOCK_D, GROUP, UPCAST, DIRECT_CODES)  # fmt: skip
        b_v, v_scale = _load_keys(p_v, off_v, p_v_scales, off_vs, m_x, m_n, head_dim, o_d, stride_vs_g,
                                  stride_vs_z, mma_dtype, KV, BLOCK_D, GROUP, UPCAST, DIRECT_CODES)  # fmt: skip
        b_s = dot_fp32(b_q, tl.trans(b_k), DOT_PRECISION, UPCAST) * (qk_scale * k_scale)[None, :]  # [M, N]
    if SOFTCAP:
        b_s = tanh_via_exp2(b_s) * softcap_log2
    visible = m_n[None, :]
    if MASKED:
        visible = visible & (o_j[None, :] >= position[:, None] - window)
        if CAUSAL:
            visible = visible & (o_j[None, :] <= position[:, None])
    b_s = tl.where(visible, b_s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(b_s, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that saw no key yet: exp2(-inf - 0) = 0
    b_p = tl.exp2(b_s - m_safe[:, None])
    alpha = tl.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(b_p, axis=1)
    if CODE_PARTS == 4:
        b_pv = b_p.to(tl.float16)
        acc = (tl.dot(b_pv, v_parts[0], acc[0] * alpha[:, None]),
               tl.dot(b_pv, v_parts[1], acc[1] * alpha[:, None]),
               tl.dot(b_pv, v_parts[2], acc[2] * alpha[:, None]),
               tl.dot(b_pv, v_parts[3], acc[3] * alpha[:, None]))  # fmt: skip
    elif CODE_PARTS == 2:
        # fp16 takes p v_scale over the block's largest scale, in [0, 1] whatever the scales' range (products below
        # 2^-14 of it lose bits to subnormals); acc counts in units of that largest scale, v_unit, carried as acc[2].
        v_peak = tl.max(v_scale, axis=0)
        v_unit = tl.where(v_peak > 0.0, v_peak, acc[2])  # a block of masked keys or zero scales adds nothing
        b_pv = (b_p * (v_scale * (1.0 / v_unit))[None, :]).to(tl.float16)
        rescale = (alpha * (acc[2] / v_unit))[:, None]
        acc = (tl.dot(b_pv, v_parts[0], acc[0] * rescale), tl.dot(b_pv, v_parts[1], acc[1] * rescale), v_unit)
    else:
        b_pv = to_dot_operand(b_p * v_scale[None, :], mma_dtype, UPCAST)
        acc = acc * alpha[:, None] + dot_fp32(b_pv, b_v, DOT_PRECISION, UPCAST)
    return acc, m_new, l_i


@triton.jit
def _decode_kernel(
    p_q, p_k, p_v, p_k_scales, p_v_scales, p_seqlens, p_table, p_o, p_lse, p_part_o, p_part_lse,
    n_queries, n_heads_q, n_heads_k, group, head_dim, window, capacity, n_pages, qk_scale, softcap_log2,
    stride_q_b, stride_q_s, stride_q_h,
    stride_k_page, stride_k_slot, stride_k_h, stride_v_page, stride_v_slot, stride_v_h,
    stride_ks_page, stride_ks_slot, stride_ks_h, stride_ks_g, stride_ks_z,
    stride_vs_page, stride_vs_slot, stride_vs_h, stride_vs_g, stride_vs_z, stride_table_b,
    stride_o_b, stride_o_s, stride_o_h, stride_lse_b, stride_lse_h,
    KV: tl.constexpr, PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr, CAUSAL: tl.constexpr, SOFTCAP: tl.constexpr,
    n_splits, SPLIT: tl.constexpr, DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr, DIRECT_CODES: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, GROUP: tl.constexpr,
    CODE_PARTS: tl.constexpr = 0, PDL: tl.constexpr = False,
):  # fmt: skip
    """One of n_splits splits of the keys for BLOCK_M rows of one (batch, key head): rows r = t * group + g are query
    t of query head h_k * group + g. Writes the partial (o_s, lse_s in base 2) to the workspace (SPLIT), or with one
    split o and lse. ``window`` is a bound no position reaches when unbounded; qk_scale is scale * log2(e), or
    scale / c with a softcap c (softcap_log2 = c * log2(e)). PDL (launched as a programmatic dependent, sm_90 and
    newer): the program may start while the previous kernel drains and waits for it before reading anything; its
    keys read, it lets the reduction launch. CODE_PARTS: a quantized cache read as int16 halfwords (strides in
    halfwords; int4's scales as int32 (scale, zero) pairs) by quarters (int4) or halves (int8, fp8) of the head dim,
    in fp16 products, q's rows scaled into fp16 by rows_as_fp16 (_attend_keys)."""
    if PDL:
        gdc_wait()  # q, the cache and the lengths may be the previous kernel's writes
    i_split = tl.program_id(0) % n_splits
    i_rows = tl.program_id(0) // n_splits
    i_b, i_hk = tl.program_id(1) // n_heads_k, tl.program_id(1) % n_heads_k
    seqlen = tl.load(p_seqlens + i_b)
    n_rows = group * n_queries
    o_r = i_rows * BLOCK_M + tl.arange(0, BLOCK_M)
    m_r = o_r < n_rows
    o_t = o_r // group
    o_h = i_hk * group + o_r % group
    position = seqlen - n_queries + o_t  # [M]
    # The keys any of these rows sees, [lo, hi), cut into n_splits splits of whole blocks.
    t_first = (i_rows * BLOCK_M) // group
    t_last = (tl.minimum(i_rows * BLOCK_M + BLOCK_M, n_rows) - 1) // group
    # Blocks start at multiples of BLOCK_N, so that where pages hold whole blocks no block straddles two.
    lo = tl.maximum(seqlen - n_queries + t_first - window, 0) // BLOCK_N * BLOCK_N
    hi = seqlen
    if CAUSAL:
        hi = tl.minimum(seqlen - n_queries + t_last + 1, seqlen)
    per_split = tl.cdiv(tl.cdiv(tl.maximum(hi - lo, 0), n_splits), BLOCK_N) * BLOCK_N
    start = lo + i_split * per_split
    end = tl.minimum(hi, start + per_split)

    o_n = tl.arange(0, BLOCK_N)
    o_d = tl.arange(0, BLOCK_D)
    m_d = o_d < head_dim
    b64 = i_b.to(tl.int64)
    p_q_rows = p_q + b64 * stride_q_b + o_t.to(tl.int64)[:, None] * stride_q_s + o_h.to(tl.int64)[:, None] * stride_q_h
    b_q = tl.load(p_q_rows + o_d[None, :], mask=m_r[:, None] & m_d[None, :], other=0.0)  # [M, D]
    if CODE_PARTS:
        b_q, row_factor = rows_as_fp16(b_q)
        qk_rows = qk_scale * row_factor
        zeros = tl.zeros([BLOCK_M, BLOCK_D // CODE_PARTS], dtype=tl.float32)
        # o's quarters (acc_j[m, e]: o[m, 4 e + j]), or o's halves (o[m, 2 e + j]) in units of v_unit, acc[2]
        acc = (zeros, zeros, zeros, zeros) if CODE_PARTS == 4 else (zeros, zeros, tl.full([], 1.0, tl.float32))
    else:
        qk_rows = qk_scale
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    hk64 = i_hk.to(tl.int64)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    # Three runs of key blocks: the middle one's blocks hold only keys every row sees (inside the split, the cache's
    # capacity and the sequence, past every row's window, before every row's causal limit), so they skip the
    # visibility masks; there, with pages no smaller than a block (or a contiguous cache), a block's keys lie in one
    # page, found by one scalar lookup, and its rows' offsets are a scalar plus offsets computed once; smaller pages
    # that divide the block take one lookup a page. The other runs (a window's first blocks, the last blocks) look
    # up and mask key by key.
    pos_first = seqlen - n_queries + t_first
    pos_last = seqlen - n_queries + t_last
    full_start = tl.minimum(start + tl.cdiv(tl.maximum(pos_last - window - start, 0), BLOCK_N) * BLOCK_N, end)
    full_stop = tl.minimum(tl.minimum(end, capacity), seqlen)
    if CAUSAL:
        full_stop = tl.minimum(full_stop, pos_first + 1)
    full_end = full_start + tl.maximum(full_stop - full_start, 0) // BLOCK_N * BLOCK_N
    for run in tl.static_range(3):  # the masked first blocks, the unmasked middle, the masked last blocks
        if run == 0:
            run_start, run_end = start, full_start
        elif run == 1:
            run_start, run_end = full_start, full_end
        else:
            run_start, run_end = full_end, end
        for start_n in range(run_start, run_end, BLOCK_N):
            acc, m_i, l_i = _attend_keys(
                acc, m_i, l_i, b_q, start_n, p_k, p_v, p_k_scales, p_v_scales, p_table, i_b, hk64, end, capacity,
                n_pages, position, window, qk_rows, softcap_log2, head_dim, o_n, o_d, m_d,
                stride_k_page, stride_k_slot, stride_k_h, stride_v_page, stride_v_slot, stride_v_h,
                stride_ks_page, stride_ks_slot, stride_ks_h, stride_ks_g, stride_ks_z,
                stride_vs_page, stride_vs_slot, stride_vs_h, stride_vs_g, stride_vs_z, stride_table_b,
                KV, PAGED, PAGE_SIZE, CAUSAL, SOFTCAP, DOT_PRECISION, UPCAST, DIRECT_CODES, CODE_PARTS, BLOCK_N,
                BLOCK_D, GROUP, MASKED=run != 1)  # fmt: skip

    if PDL:
        gdc_launch_dependents()  # the reduction's programs may launch; they wait for this kernel's partials
    seen = l_i > 0.0
    l_safe = tl.where(seen, l_i, 1.0)
    lse_log2 = tl.where(seen, m_i + tl.log2(l_safe), float("-inf"))
    # Workspace rows ((b * Sq + t) * Hq + h) * n_splits + split, contiguous: o_s (..., D) and lse_s (...).
    part = ((b64 * n_queries + o_t) * n_heads_q + o_h) * n_splits + i_split  # [M]
    p_o_rows = p_o + b64 * stride_o_b + o_t.to(tl.int64)[:, None] * stride_o_s + o_h.to(tl.int64)[:, None] * stride_o_h
    if CODE_PARTS:
        o_e = CODE_PARTS * tl.arange(0, BLOCK_D // CODE_PARTS)  # part j holds head-dim indices CODE_PARTS e + j
        o_unit = acc[2] if CODE_PARTS == 2 else 1.0
        for j in tl.static_range(CODE_PARTS):
            _write_rows(acc[j] * (o_unit / l_safe)[:, None], p_o_rows, p_part_o, part, head_dim, o_e + j, m_r, SPLIT)
    else:
        _write_rows(acc / l_safe[:, None], p_o_rows, p_part_o, part, head_dim, o_d, m_r, SPLIT)
    if not SPLIT:
        tl.store(p_lse + b64 * stride_lse_b + o_h.to(tl.int64) * stride_lse_h + o_t, lse_log2 / LOG2_E, mask=m_r)
    else:
        tl.store(p_part_lse + part, lse_log2, mask=m_r)


@triton.jit
def _write_rows(b_o, p_o_rows, p_part_o, part, head_dim, o_cols, m_r, SPLIT: tl.constexpr):
    """Columns o_cols of the rows' output b_o [M, C] (fp32): into o at p_o_rows [M, 1] in its dtype, or (SPLIT) into
    the workspace's fp32 rows ``part`` [M]."""
    m_o = m_r[:, None] & (o_cols < head_dim)[None, :]
    if SPLIT:
        tl.store(p_part_o + part[:, None] * head_dim + o_cols[None, :], b_o, mask=m_o)
    else:
        tl.store(p_o_rows + o_cols[None, :], b_o.to(p_o_rows.dtype.element_ty), mask=m_o)


@triton.jit
def _decode_reduce_kernel(
    p_part_o, p_part_lse, p_o, p_lse, n_queries, n_heads_q, head_dim,
    stride_o_b, stride_o_s, stride_o_h, stride_lse_b, stride_lse_h, n_splits,
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr = False,
):  # fmt: skip
    """o and lse of one (batch, query, head) row from its n_splits partials (at most BLOCK_S): weights
    exp2(lse_s - max), summed in split order. Each partial is read once: .cg, through L2 only, not kept in L1.
    PDL: launched as a programmatic dependent of the split kernel, it waits for the partials first."""
    if PDL:
        gdc_wait()
    i_row = tl.program_id(0)  # (b * Sq + t) * Hq + h
    i_h = i_row % n_heads_q
    i_t = (i_row // n_heads_q) % n_queries
    i_b = i_row // (n_heads_q * n_queries)
    o_s = tl.arange(0, BLOCK_S)
    o_d = tl.arange(0, BLOCK_D)
    part = i_row.to(tl.int64) * n_splits + o_s
    lse_s = tl.load(p_part_lse + part, mask=o_s < n_splits, other=float("-inf"), cache_modifier=".cg")  # [S]
    peak = tl.max(lse_s, axis=0)
    peak_safe = tl.where(peak == float("-inf"), 0.0, peak)
    weight = tl.exp2(lse_s - peak_safe)
    total = tl.sum(weight, axis=0)
    m_part = (o_s < n_splits)[:, None] & (o_d < head_dim)[None, :]
    b_o = tl.load(p_part_o + part[:, None] * head_dim + o_d[None, :], mask=m_part, other=0.0,
                  cache_modifier=".cg")  # [S, D]  # fmt: skip
    seen = total > 0.0
    b_o = tl.sum(b_o * weight[:, None], axis=0) / tl.where(seen, total, 1.0)
    lse = tl.where(seen, (peak_safe + tl.log2(tl.where(seen, total, 1.0))) / LOG2_E, float("-inf"))
    b64, t64, h64 = i_b.to(tl.int64), i_t.to(tl.int64), i_h.to(tl.int64)
    p_o += b64 * stride_o_b + t64 * stride_o_s + h64 * stride_o_h
    tl.store(p_o + o_d, b_o.to(p_o.dtype.element_ty), mask=o_d < head_dim)
    tl.store(p_lse + b64 * stride_lse_b + h64 * stride_lse_h + t64, lse)
