"""Scaled GEMMs: out = dequantize(x_q) @ dequantize(w_q)^T (+ bias) in one kernel, in F.linear's layout.

x (M, K) holds int8 or float8 codes with a scale per tensor, row or 1 x G group, or bf16/fp16 values with no scale
(weight-only); w (N, K) holds codes with a scale per tensor, output row, 1 x G group or G x G block. With s_x(m, k)
and s_w(n, k) the scale of each element (1 for unscaled x),

    out[m, n] = sum_k s_x(m, k) x[m, k] s_w(n, k) w[n, k] + bias[n].

When no scale varies along K the products run over the codes themselves (int8 x int8 exact in int32, float8 in fp32)
and the scales multiply once per output in the epilogue: out = s_x(m) s_w(n) sum_k x w. When one does, K steps
through whole groups (BLOCK_K divides G) and each step's partial sum is scaled before it is added,
acc += (sum_{k in step} x w) s_x(m, step) s_w(n, step), in fp32, which also keeps float8's tensor-core sums short (as
DeepSeek-V3's promotion to fp32 every 128 values does). Weight-only: w's codes are converted to x's dtype (exact for
int8 and float8 in bf16 and fp16) for the product.

Persistent (codes, large M and N on Hopper): the same sums, scaled in the epilogue or per K step as above, with each
program walking many output tiles and x, w and out moved by TMA (_scaled_linear_persistent_kernel).

Split-K GEMV (weight-only, a few rows of x): K is cut into S splits of whole K steps, [k_s, k_{s+1}); the program of
a block of rows and outputs and split s writes the fp32 partial P_s[m, n] = sum_{k_s <= k < k_{s+1}} x[m, k] s_w(n, k)
w[n, k], and a second kernel sums them in split order, out[m, n] = (sum_{s=0}^{S-1} P_s[m, n]) s_w(n) + bias[n]
(s_w(n) for scales that do not vary along K; those that do are inside P_s): the same sums in the same order on every
run. With S = 1 the split kernel writes out itself.

Dynamic activations (X_SCALE "dynamic", dynamic_scaled_linear): x holds bf16/fp16/fp32 values and is quantized to
w's format as it is read, one 1 x G group per K step (BLOCK_K = G): s_x(m, step) = amax over the step's finite
|x[m, k]| / qmax and the codes round(x / s_x) (_core/jit/quantize.py, the codes quantize writes), then the step
proceeds as with group scales. Neither the codes nor the scales go to memory.

Codes whose K is not a multiple of 16 are first copied into rows padded with zeros (_pad_codes_kernel), which add
nothing to any sum.
"""

import triton
import triton.language as tl

from tritonkit._core.jit.dots import dot_fp32
from tritonkit._core.jit.gemm import grouped_tile
from tritonkit._core.jit.int_codes import SIGNED_BYTE_BIAS, word_bytes_as_floats
from tritonkit._core.jit.quantize import amax_scale, codes, finite_row_amax
from tritonkit._core.jit.row_sync import arrive


@triton.jit
def _load_zero_padded(p_tile, mask, EVICTION: tl.constexpr, INTERPRETED: tl.constexpr):
    """A tile whose masked lanes read 0 (they enter the product). EVICTION: tl.load's eviction_policy ("evict_first"
    for data read once, "" for the default). INTERPRETED: float8 tiles load their bits as uint8 and view them back,
    as the interpreter cannot fill a float8 load with a constant (bits 0 are +0 in both formats). Compiled, they load
    as float8: the view of the bits would stay in the pipeline after its shared-memory copy, and on sm_90 x's tile
    would go through registers to the tensor cores and w's tile through registers back to shared memory, every K
    step."""
    is_float8: tl.constexpr = p_tile.dtype.element_ty == tl.float8e4nv or p_tile.dtype.element_ty == tl.float8e5
    if is_float8 and INTERPRETED:
        bits = tl.load(p_tile.to(tl.pointer_type(tl.uint8)), mask=mask, other=0, eviction_policy=EVICTION)
        tile = bits.to(p_tile.dtype.element_ty, bitcast=True)
    elif is_float8:
        tile = tl.load(p_tile, mask=mask, other=0.0, eviction_policy=EVICTION)
    else:
        tile = tl.load(p_tile, mask=mask, other=0, eviction_policy=EVICTION)
    return tile


@triton.jit
def _row_scales(p_scale, o_r, m_r, stride_r, k_block, GRANULARITY: tl.constexpr, G: tl.constexpr):
    """The scales [R] of rows o_r at K block k_block: one for the tensor, one per row, per (row, group), or per
    (G rows, group), rows stride_r apart; unscaled ("none"): 1."""
    if GRANULARITY == "none":
        scale = tl.full(o_r.shape, 1.0, tl.float32)
    elif GRANULARITY == "tensor":
        scale = tl.load(p_scale) + tl.zeros(o_r.shape, tl.float32)
    elif GRANULARITY == "row":
        scale = tl.load(p_scale + o_r.to(tl.int64) * stride_r, mask=m_r, other=0.0)
    elif GRANULARITY == "group":
        scale = tl.load(p_scale + o_r.to(tl.int64) * stride_r + k_block, mask=m_r, other=0.0)
    else:  # block
        scale = tl.load(p_scale + (o_r // G).to(tl.int64) * stride_r + k_block, mask=m_r, other=0.0)
    return scale


@triton.jit
def _codes_as(b_w, DTYPE: tl.constexpr, UPCAST: tl.constexpr):
    """w's codes as DTYPE values, exactly (int8 and float8 values fit bf16, fp16 and fp32), through the conversions
    Triton builds from byte permutes and packed arithmetic: int8 through bf16, float8 through fp16. The direct ones
    from int8 to fp16 or fp32 and from e4m3 to bf16 take I2F or F2F (sm_90), 16 a clock per multiprocessor against 128
    fp32 multiply-adds: one per weight byte would cap a GEMV near HBM's byte rate. UPCAST (the interpreter, which
    converts integers to bf16 wrongly): to fp32 directly."""
    if UPCAST:
        return b_w.to(tl.float32)
    b_w = b_w.to(tl.bfloat16) if b_w.dtype == tl.int8 else b_w.to(tl.float16)
    return b_w.to(DTYPE)


@triton.jit
def _epilogue(b_out, p_x_scale, p_w_scale, p_bias, o_m, o_n, M, N, stride_xs_m, stride_ws_n, X_SCALE: tl.constexpr,
              W_SCALE: tl.constexpr, G: tl.constexpr, SCALE: tl.constexpr, HAS_BIAS: tl.constexpr):  # fmt: skip
    """b_out (fp32 sums [M, N] of outputs o_m, o_n) times the scales that do not vary along K (SCALE), plus bias, in
    fp32."""
    m_m, m_n = o_m < M, o_n < N
    if SCALE:
        x_scale = _row_scales(p_x_scale, o_m, m_m, stride_xs_m, 0, X_SCALE, G)
        w_scale = _row_scales(p_w_scale, o_n, m_n, stride_ws_n, 0, W_SCALE, G)
        b_out = b_out * x_scale[:, None] * w_scale[None, :]
    if HAS_BIAS:
        b_out += tl.load(p_bias + o_n, mask=m_n, other=0.0).to(tl.float32)[None, :]
    return b_out


@triton.jit
def _store_output(b_out, p_x_scale, p_w_scale, p_bias, p_out, o_m, o_n, M, N, stride_xs_m, stride_ws_n, stride_out_m,
                  X_SCALE: tl.constexpr, W_SCALE: tl.constexpr, G: tl.constexpr, SCALE: tl.constexpr,
                  HAS_BIAS: tl.constexpr):  # fmt: skip
    """out[o_m, o_n] = _epilogue(b_out), in out's dtype."""
    b_out = _epilogue(b_out, p_x_scale, p_w_scale, p_bias, o_m, o_n, M, N, stride_xs_m, stride_ws_n, X_SCALE, W_SCALE,
                      G, SCALE, HAS_BIAS)  # fmt: skip
    p_out_tile = p_out + o_m.to(tl.int64)[:, None] * stride_out_m + o_n[None, :]
    tl.store(p_out_tile, b_out.to(p_out.dtype.element_ty), mask=(o_m < M)[:, None] & (o_n < N)[None, :])


@triton.jit
def _scaled_linear_kernel(
    p_x, p_w, p_x_scale, p_w_scale, p_bias, p_out, M, N, K,
    stride_x_m, stride_w_n, stride_xs_m, stride_ws_n, stride_out_m,
    X_SCALE: tl.constexpr, W_SCALE: tl.constexpr, G: tl.constexpr, HAS_BIAS: tl.constexpr, INT_ACC: tl.constexpr,
    DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_SIZE: tl.constexpr,
    KIND: tl.constexpr = "", FP8_PROMOTE: tl.constexpr = None, FP8_FAST_ACC: tl.constexpr = False,
):  # fmt: skip
    """One BLOCK_M x BLOCK_N tile of out (tiles in grouped order); x and w have unit stride along K. INT_ACC: int8
    codes summed in int32 (no scale varies along K). KIND: w's format ("int8", "e4m3", "e5m2") when X_SCALE is
    "dynamic" (BLOCK_K = G). FP8_PROMOTE: float8 products summed by the tensor cores before an fp32 promotion
    (dot_fp32's MAX_IMPRECISE)."""
    i_m, i_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_SIZE)
    o_m = i_m * BLOCK_M + tl.arange(0, BLOCK_M)
    o_n = i_n * BLOCK_N + tl.arange(0, BLOCK_N)
    o_k = tl.arange(0, BLOCK_K)
    m_m, m_n = o_m < M, o_n < N
    p_x_tile = p_x + o_m.to(tl.int64)[:, None] * stride_x_m + o_k[None, :]
    p_w_tile = p_w + o_n.to(tl.int64)[:, None] * stride_w_n + o_k[None, :]
    DYNAMIC: tl.constexpr = X_SCALE == "dynamic"
    PER_STEP: tl.constexpr = DYNAMIC or X_SCALE == "group" or W_SCALE == "group" or W_SCALE == "block"
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.int32 if INT_ACC else tl.float32)
    for k in range(0, K, BLOCK_K):
        m_k = o_k < K - k
        b_x = _load_zero_padded(p_x_tile, m_m[:, None] & m_k[None, :], "", UPCAST)  # [M, K]
        b_w = _load_zero_padded(p_w_tile, m_n[:, None] & m_k[None, :], "", UPCAST)  # [N, K]
        if X_SCALE == "none":  # weight-only: the codes in x's dtype
            b_w = _codes_as(b_w, b_x.dtype, UPCAST)
        if DYNAMIC:  # this step is one group of each row: its scale, then its codes (the padding's are 0)
            b_x = b_x.to(tl.float32)
            x_scale = amax_scale(finite_row_amax(b_x), KIND)
            # Compiled, float8 codes round in the conversion (float8 products need sm_89 or newer, which has it);
            # the interpreter's conversion rounds wrongly, so it rounds in fp32 first. The same codes either way.
            b_x = codes(b_x, x_scale[:, None], KIND, not UPCAST)
        if INT_ACC:
            acc = tl.dot(b_x, tl.trans(b_w), acc, out_dtype=tl.int32)
        elif PER_STEP:
            k_block = k // G
            if not DYNAMIC:
                x_scale = _row_scales(p_x_scale, o_m, m_m, stride_xs_m, k_block, X_SCALE, G)
            w_scale = _row_scales(p_w_scale, o_n, m_n, stride_ws_n, k_block, W_SCALE, G)
            acc += (
                dot_fp32(b_x, tl.trans(b_w), DOT_PRECISION, UPCAST, FP8_PROMOTE) * x_scale[:, None] * w_scale[None, :]
            )
        elif FP8_FAST_ACC:
            acc = dot_fp32(b_x, tl.trans(b_w), DOT_PRECISION, UPCAST, FP8_PROMOTE, acc)
        else:
            acc += dot_fp32(b_x, tl.trans(b_w), DOT_PRECISION, UPCAST, FP8_PROMOTE)
        p_x_tile += BLOCK_K
        p_w_tile += BLOCK_K
    _store_output(acc.to(tl.float32), p_x_scale, p_w_scale, p_bias, p_out, o_m, o_n, M, N, stride_xs_m,
                  stride_ws_n, stride_out_m, X_SCALE, W_SCALE, G, not PER_STEP, HAS_BIAS)  # fmt: skip


@triton.jit
def _scaled_linear_persistent_kernel(
    x_desc, w_desc, out_desc, p_x_scale, p_w_scale, p_bias, M, N, K, stride_xs_m, stride_ws_n, n_programs,
    X_SCALE: tl.constexpr, W_SCALE: tl.constexpr, G: tl.constexpr, HAS_BIAS: tl.constexpr, INT_ACC: tl.constexpr,
    UPCAST: tl.constexpr, FP8_PROMOTE: tl.constexpr, FP8_FAST_ACC: tl.constexpr, SPLIT_STORE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_SIZE: tl.constexpr,
):  # fmt: skip
    """The tiled kernel's product for codes, in Hopper's form.
    Persistent: n_programs programs (at most one per multiprocessor) walk the output tiles, program p taking tiles p,
    p + n_programs, ... in grouped order, so the next tile's loads overlap this tile's epilogue. TMA: x (M, K) and w
    (N, K) are read and out (M, N) written through tensor descriptors, which fill the ragged edges' reads with zeros
    (so a padded K step adds 0) and clip their writes; the loop needs no masks. Scales that do not vary along K:
    out = s_x(m) s_w(n) (sum_k x w) + bias[n], the sums in int32 (INT_ACC) or fp32 (FP8_FAST_ACC as in the tiled
    kernel), the scales and bias in the epilogue. Group and block scales (1 x G, G x G; BLOCK_K divides G): each K
    step's sum is scaled as it joins the fp32 accumulator, acc += (sum_{k in step} x w) s_x(m, step) s_w(n, step), as
    in the tiled kernel. SPLIT_STORE: the tile is stored as two BLOCK_M x BLOCK_N / 2 halves (out_desc's block),
    halving the shared memory the store stages."""
    n_tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    # The epilogue's tile is counted apart from the loop's, so that the flattened loop's prologue (the next tile's
    # first loads) does not wait for this tile's index arithmetic.
    PER_STEP: tl.constexpr = X_SCALE == "group" or W_SCALE == "group" or W_SCALE == "block"
    tile_out = tl.program_id(0) - n_programs
    for tile in tl.range(tl.program_id(0), n_tiles, n_programs, flatten=True):
        i_m, i_n = grouped_tile(tile, M, N, BLOCK_M, BLOCK_N, GROUP_SIZE)
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.int32 if INT_ACC else tl.float32)
        if PER_STEP:  # the rows and outputs whose scales each K step reads
            o_m_step = i_m * BLOCK_M + tl.arange(0, BLOCK_M)
            o_n_step = i_n * BLOCK_N + tl.arange(0, BLOCK_N)
        for k in range(0, K, BLOCK_K):
            b_x = x_desc.load([i_m * BLOCK_M, k])  # [M, K]
            b_w = w_desc.load([i_n * BLOCK_N, k])  # [N, K]
            if INT_ACC:
                acc = tl.dot(b_x, tl.trans(b_w), acc, out_dtype=tl.int32)
            elif PER_STEP:
                x_scale = _row_scales(p_x_scale, o_m_step, o_m_step < M, stride_xs_m, k // G, X_SCALE, G)
                w_scale = _row_scales(p_w_scale, o_n_step, o_n_step < N, stride_ws_n, k // G, W_SCALE, G)
                acc += dot_fp32(b_x, tl.trans(b_w), "tf32", UPCAST, FP8_PROMOTE) * x_scale[:, None] * w_scale[None, :]
            elif FP8_FAST_ACC:
                acc = dot_fp32(b_x, tl.trans(b_w), "tf32", UPCAST, FP8_PROMOTE, acc)
            else:
                acc += dot_fp32(b_x, tl.trans(b_w), "tf32", UPCAST, FP8_PROMOTE)
        tile_out += n_programs
        i_m, i_n = grouped_tile(tile_out, M, N, BLOCK_M, BLOCK_N, GROUP_SIZE)
        o_m = i_m * BLOCK_M + tl.arange(0, BLOCK_M)
        o_n = i_n * BLOCK_N + tl.arange(0, BLOCK_N)
        b_out = _epilogue(acc.to(tl.float32), p_x_scale, p_w_scale, p_bias, o_m, o_n, M, N, stride_xs_m, stride_ws_n,
                          X_SCALE, W_SCALE, G, not PER_STEP, HAS_BIAS).to(out_desc.dtype)  # fmt: skip
        if SPLIT_STORE:
            b_left, b_right = tl.split(tl.permute(tl.reshape(b_out, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1)))
            out_desc.store([i_m * BLOCK_M, i_n * BLOCK_N], b_left)
            out_desc.store([i_m * BLOCK_M, i_n * BLOCK_N + BLOCK_N // 2], b_right)
        else:
            out_desc.store([i_m * BLOCK_M, i_n * BLOCK_N], b_out)


@triton.jit
def _store_sum_of_partials(acc, p_partial, p_w_scale, p_bias, p_out, o_m, o_n, M, N, n_splits, stride_ws_n,
                           stride_out_m, W_SCALE: tl.constexpr, G: tl.constexpr, HAS_BIAS: tl.constexpr):  # fmt: skip
    """out[o_m, o_n] = (acc, zeros, + P_0 + ... + P_{S-1} of the partials (S, M, N), in split order) x the scales
    that do not vary along K, plus bias. The partials are read past L1 (.cg): other programs wrote them."""
    m_mn = (o_m < M)[:, None] & (o_n < N)[None, :]
    for i_split in range(n_splits):
        p_part = p_partial + (i_split * M + o_m).to(tl.int64)[:, None] * N + o_n[None, :]
        acc += tl.load(p_part, mask=m_mn, other=0.0, cache_modifier=".cg")
    PER_STEP: tl.constexpr = W_SCALE == "group" or W_SCALE == "block"
    _store_output(acc, None, p_w_scale, p_bias, p_out, o_m, o_n, M, N, 0, stride_ws_n, stride_out_m, "none", W_SCALE,
                  G, not PER_STEP, HAS_BIAS)  # fmt: skip


@triton.jit
def _split_partial(b_sum, p_partial, p_arrivals, p_w_scale, p_bias, p_out, o_m, o_n, M, N, n_splits, stride_ws_n,
                   stride_out_m, W_SCALE: tl.constexpr, G: tl.constexpr, HAS_BIAS: tl.constexpr,
                   LAST_SPLIT_SUMS: tl.constexpr):  # fmt: skip
    """Store split program_id(1)'s partial P_s [M, N] of output tile program_id(0) to p_partial (S, M, N). With
    LAST_SPLIT_SUMS the tile's splits count themselves in at p_arrivals[tile] (zero at launch), and the last to
    arrive sums P_0 ... P_{S-1} in split order (the bits _split_k_reduce_kernel gives), writes the output and sets
    the count back to zero: the launcher's counters serve the stream's next call without a zeroing launch."""
    p_part = p_partial + (tl.program_id(1) * M + o_m).to(tl.int64)[:, None] * N + o_n[None, :]
    tl.store(p_part, b_sum, mask=(o_m < M)[:, None] & (o_n < N)[None, :])
    if LAST_SPLIT_SUMS:  # noqa: SIM102 (a constexpr branch: nothing counts in without it)
        # No program waits for another, so no residency is assumed: the last to arrive finds every partial stored.
        if arrive(p_arrivals + tl.program_id(0)) == n_splits - 1:
            _store_sum_of_partials(tl.zeros_like(b_sum), p_partial, p_w_scale, p_bias, p_out, o_m, o_n, M, N,
                                   n_splits, stride_ws_n, stride_out_m, W_SCALE, G, HAS_BIAS)  # fmt: skip
            tl.store(p_arrivals + tl.program_id(0), 0)  # every split has counted in: none reads it again


@triton.jit
def _gemv_split_k_kernel(
    p_x, p_w, p_w_scale, p_bias, p_out, p_partial, p_arrivals, M, N, K, k_per_split, n_splits,
    stride_x_m, stride_w_n, stride_ws_n, stride_out_m,
    W_SCALE: tl.constexpr, G: tl.constexpr, HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr,
    LAST_SPLIT_SUMS: tl.constexpr, DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr, STAGES: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """Split program_id(1) of K, [k_s, k_s + k_per_split) cut at K, for the BLOCK_M rows x BLOCK_N outputs of block
    program_id(0) (column blocks first) of a weight-only product (module docstring). k_per_split is a multiple of
    BLOCK_K, so every step but the last of the last split is whole, and with BLOCK_K dividing G each step lies in one
    scale group. BLOCK_M = 1: fp32 lanes accumulate x[k] s_w(n, k) w[n, k] over [BLOCK_N, BLOCK_K] and sum along K
    once at the end; else tl.dot. STAGES: the K loop's software pipeline (asked of the loop: the compiler pipelines
    a plain range's loads only where they feed a dot). SPLIT: store the fp32 partial P_s to p_partial (S, M, N)
    (_split_partial; LAST_SPLIT_SUMS: the tile's last split also sums them); else the output."""
    n_blocks_n = tl.cdiv(N, BLOCK_N)
    i_m, i_n, i_split = tl.program_id(0) // n_blocks_n, tl.program_id(0) % n_blocks_n, tl.program_id(1)
    o_m = i_m * BLOCK_M + tl.arange(0, BLOCK_M)
    o_n = i_n * BLOCK_N + tl.arange(0, BLOCK_N)
    o_k = tl.arange(0, BLOCK_K)
    m_m, m_n = o_m < M, o_n < N
    k_start = i_split * k_per_split
    p_x_tile = p_x + o_m.to(tl.int64)[:, None] * stride_x_m + (k_start + o_k)[None, :]
    p_w_tile = p_w + o_n.to(tl.int64)[:, None] * stride_w_n + (k_start + o_k)[None, :]
    PER_STEP: tl.constexpr = W_SCALE == "group" or W_SCALE == "block"
    if BLOCK_M == 1:
        acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in tl.range(k_start, tl.minimum(K, k_start + k_per_split), BLOCK_K, num_stages=STAGES):
        # Only the last step of all reaches past K; K - k keeps K's divisibility, so the masked loads stay vectors.
        m_k = o_k < K - k
        b_x = tl.load(p_x_tile, mask=m_m[:, None] & m_k[None, :], other=0.0)  # [M, K]
        b_w = _load_zero_padded(p_w_tile, m_n[:, None] & m_k[None, :], "evict_first", UPCAST)  # [N, K], read once
        if BLOCK_M == 1:
            b_w = _codes_as(b_w, tl.float32, UPCAST)
            if PER_STEP:
                b_w = b_w * _row_scales(p_w_scale, o_n, m_n, stride_ws_n, k // G, W_SCALE, G)[:, None]
            acc += b_w * b_x.to(tl.float32)
        else:
            b_part = dot_fp32(b_x, tl.trans(_codes_as(b_w, b_x.dtype, UPCAST)), DOT_PRECISION, UPCAST)
            if PER_STEP:
                b_part = b_part * _row_scales(p_w_scale, o_n, m_n, stride_ws_n, k // G, W_SCALE, G)[None, :]
            acc += b_part
        p_x_tile += BLOCK_K
        p_w_tile += BLOCK_K
    b_sum = tl.sum(acc, axis=1)[None, :] if BLOCK_M == 1 else acc  # [M, N]
    if SPLIT:
        _split_partial(b_sum, p_partial, p_arrivals, p_w_scale, p_bias, p_out, o_m, o_n, M, N, n_splits, stride_ws_n,
                       stride_out_m, W_SCALE, G, HAS_BIAS, LAST_SPLIT_SUMS)  # fmt: skip
    else:
        _store_output(b_sum, None, p_w_scale, p_bias, p_out, o_m, o_n, M, N, 0, stride_ws_n, stride_out_m, "none",
                      W_SCALE, G, not PER_STEP, HAS_BIAS)  # fmt: skip


@triton.jit
def _gemv_int8_words_kernel(
    p_x, p_words, p_w_scale, p_bias, p_out, p_partial, p_arrivals, M, N, k_words, words_per_split, n_splits,
    stride_x_m, stride_w_n, stride_ws_n, stride_out_m,
    W_SCALE: tl.constexpr, HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr, LAST_SPLIT_SUMS: tl.constexpr,
    STAGES: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """The one-row GEMV (_gemv_split_k_kernel at BLOCK_M 1) for int8 codes with a tensor or row scale, the codes read
    as int32 words of four (k_words = K / 4, an argument so that its divisibility keeps the loads 16 bytes wide):
    program (r * blocks + i, s) takes row r of x, outputs i BLOCK_N ..,
    and split s of K's words, BLOCK_K columns a step, and

        y[r, n] = s_w(n) sum_k x[r, k] q[n, k]   (fp32, the scale and bias in the epilogue)

    Column 4 w + j is byte j of word w, so the four values of a word come from it by bits alone: v_j = 2^23 + 128 + q_j
    (word_bytes_as_floats: one XOR a word, one byte permute a value), less SIGNED_BYTE_BIAS q_j exactly, then one FFMA
    in fp32 lanes, summed along K at the end, where the byte path takes the codes through bf16 to fp32 by permutes,
    masks, packed adds and a shift each (sm_90 code of the one-row tile: 4.6 instructions a value against 6.3). x's
    column j of each word is split from one load of its four values a word. STAGES: the K loop's software pipeline
    (asked of the loop). SPLIT and LAST_SPLIT_SUMS as _gemv_split_k_kernel's."""
    WORDS: tl.constexpr = BLOCK_K // 4
    n_blocks_n = tl.cdiv(N, BLOCK_N)
    i_m, i_n, i_split = tl.program_id(0) // n_blocks_n, tl.program_id(0) % n_blocks_n, tl.program_id(1)
    o_n = i_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_n = o_n < N
    n64 = o_n.to(tl.int64)
    o_w = tl.arange(0, WORDS)
    word_lo = i_split * words_per_split
    word_hi = tl.minimum(word_lo + words_per_split, k_words)
    p_x_row = p_x + i_m.to(tl.int64) * stride_x_m
    acc = tl.zeros([BLOCK_N, WORDS], dtype=tl.float32)
    for word in tl.range(word_lo, word_hi, WORDS, num_stages=STAGES):
        o_word = word + o_w
        m_word = o_word < word_hi
        # Masked words read 0: bytes 0, values 0 (against x's zeros there too).
        b_word = tl.load(p_words + n64[:, None] * stride_w_n + o_word[None, :], mask=m_n[:, None] & m_word[None, :],
                         other=0, eviction_policy="evict_first")  # [N, W], read once  # fmt: skip
        b_x = tl.load(p_x_row + (4 * o_word[:, None] + tl.arange(0, 4)[None, :]), mask=m_word[:, None], other=0.0)
        x_02, x_13 = tl.split(tl.reshape(b_x.to(tl.float32), (WORDS, 2, 2)))  # columns j % 2 == 0 and 1: [W, 2]
        x0, x2 = tl.split(x_02)
        x1, x3 = tl.split(x_13)
        v0, v1, v2, v3 = word_bytes_as_floats(b_word)
        acc += (x0[None, :] * (v0 - SIGNED_BYTE_BIAS) + x1[None, :] * (v1 - SIGNED_BYTE_BIAS)
                + x2[None, :] * (v2 - SIGNED_BYTE_BIAS) + x3[None, :] * (v3 - SIGNED_BYTE_BIAS))  # fmt: skip
    b_sum = tl.sum(acc, axis=1)[None, :]  # [1, N]
    o_m = i_m + tl.arange(0, 1)
    if SPLIT:
        _split_partial(b_sum, p_partial, p_arrivals, p_w_scale, p_bias, p_out, o_m, o_n, M, N, n_splits, stride_ws_n,
                       stride_out_m, W_SCALE, 1, HAS_BIAS, LAST_SPLIT_SUMS)  # fmt: skip
    else:
        _store_output(b_sum, None, p_w_scale, p_bias, p_out, o_m, o_n, M, N, 0, stride_ws_n, stride_out_m, "none",
                      W_SCALE, 1, True, HAS_BIAS)  # fmt: skip


@triton.jit
def _split_k_reduce_kernel(
    p_partial, p_w_scale, p_bias, p_out, M, N, n_splits, stride_ws_n, stride_out_m,
    W_SCALE: tl.constexpr, G: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """out = (sum of the partials P_0 ... P_{S-1} (S, M, N), in split order) x the scales that do not vary along K,
    plus bias: BLOCK_M x BLOCK_N outputs a program (column blocks first)."""
    n_blocks_n = tl.cdiv(N, BLOCK_N)
    o_m = (tl.program_id(0) // n_blocks_n) * BLOCK_M + tl.arange(0, BLOCK_M)
    o_n = (tl.program_id(0) % n_blocks_n) * BLOCK_N + tl.arange(0, BLOCK_N)
    _store_sum_of_partials(tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), p_partial, p_w_scale, p_bias, p_out, o_m,
                           o_n, M, N, n_splits, stride_ws_n, stride_out_m, W_SCALE, G, HAS_BIAS)  # fmt: skip


@triton.jit
def _pad_codes_kernel(p_in, p_out, rows, k_in, k_out, stride_in, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    """out[r, k] = in[r, k] for k < k_in, 0 for k_in <= k < k_out: one-byte codes (int8, or float8 viewed as int8)
    copied into rows of k_out bytes (out contiguous); program (i, j) takes rows i BLOCK_R .. and columns j BLOCK_K
    .. of out."""
    o_r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    o_k = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    r64 = o_r.to(tl.int64)[:, None]
    m_r = (o_r < rows)[:, None]
    b_codes = tl.load(p_in + r64 * stride_in + o_k[None, :], mask=m_r & (o_k < k_in)[None, :], other=0)
    tl.store(p_out + r64 * k_out + o_k[None, :], b_codes, mask=m_r & (o_k < k_out)[None, :])
