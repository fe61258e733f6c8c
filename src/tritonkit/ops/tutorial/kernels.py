"""The practitioner's guide kernels: copy, add / add_relu, rgb_to_grey, and the matmul ladder's one GEMM kernel.

They are small on purpose and show the patterns every later kernel uses: one program per block of elements, masks
on ragged edges, fp32 arithmetic with a cast on store, 2-D grids with 2-D masks, tiles in grouped order. Production
code never imports this family.
"""

import triton
import triton.language as tl

from tritonkit._core.gemm_plan import autotune_configs
from tritonkit._core.jit.gemm import grouped_tile
from tritonkit._core.jit.offsets import mask_2d, offsets_2d


@triton.jit
def _copy_kernel(p_x, p_out, n_elements, BLOCK_SIZE: tl.constexpr, BLOCK_POW2: tl.constexpr):
    """out[i] = x[i] for i < n_elements; program k copies [k*BLOCK_SIZE, (k+1)*BLOCK_SIZE).

    ``tl.arange`` needs a power of two, so a block of any size is covered by the next power of two
    with the lanes past BLOCK_SIZE masked off.
    """
    i_block = tl.program_id(0).to(tl.int64)  # int64: block * size can pass 2**31
    o_local = tl.arange(0, BLOCK_POW2)
    o_x = i_block * BLOCK_SIZE + o_local
    m_x = (o_local < BLOCK_SIZE) & (o_x < n_elements)
    b_x = tl.load(p_x + o_x, mask=m_x)  # [BLOCK_POW2]
    tl.store(p_out + o_x, b_x, mask=m_x)


@triton.jit
def _add_kernel(p_x, p_y, p_out, n_elements, APPLY_RELU: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """out = x + y, or max(x + y, 0) with APPLY_RELU; computed in fp32, stored in the output dtype."""
    i_block = tl.program_id(0).to(tl.int64)
    o_x = i_block * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    m_x = o_x < n_elements
    b_x = tl.load(p_x + o_x, mask=m_x).to(tl.float32)  # [BLOCK_SIZE]
    b_y = tl.load(p_y + o_x, mask=m_x).to(tl.float32)  # [BLOCK_SIZE]
    b_out = b_x + b_y
    if APPLY_RELU:
        b_out = tl.maximum(b_out, 0.0)
    tl.store(p_out + o_x, b_out.to(p_out.dtype.element_ty), mask=m_x)


@triton.jit
def _rgb_to_grey_kernel(
    p_img,
    p_out,
    height,
    width,
    stride_img_c,
    stride_img_h,
    stride_img_w,
    stride_out_h,
    stride_out_w,
    IS_UINT8: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_W: tl.constexpr,
):
    """grey = 0.2989 R + 0.5870 G + 0.1140 B on one [BLOCK_H, BLOCK_W] tile per program.

    For uint8 the sum is exact in integers, (2989 R + 5870 G + 1140 B + 5000) // 10000, which rounds
    the true value to nearest (ties up) with no floating-point doubt at .5; the result lies in
    [0, 255] by construction and is clamped anyway.
    """
    i_h = tl.program_id(0)
    i_w = tl.program_id(1)
    o_h = (i_h * BLOCK_H + tl.arange(0, BLOCK_H)).to(tl.int64)
    o_w = (i_w * BLOCK_W + tl.arange(0, BLOCK_W)).to(tl.int64)
    m_hw = mask_2d(o_h, o_w, height, width)
    o_img = offsets_2d(o_h, o_w, stride_img_h, stride_img_w)
    o_out = offsets_2d(o_h, o_w, stride_out_h, stride_out_w)
    if IS_UINT8:
        b_r = tl.load(p_img + o_img, mask=m_hw).to(tl.int32)  # [BLOCK_H, BLOCK_W]
        b_g = tl.load(p_img + stride_img_c + o_img, mask=m_hw).to(tl.int32)
        b_b = tl.load(p_img + 2 * stride_img_c + o_img, mask=m_hw).to(tl.int32)
        b_grey = (2989 * b_r + 5870 * b_g + 1140 * b_b + 5000) // 10000
        b_grey = tl.minimum(tl.maximum(b_grey, 0), 255)
    else:
        b_r = tl.load(p_img + o_img, mask=m_hw).to(tl.float32)  # [BLOCK_H, BLOCK_W]
        b_g = tl.load(p_img + stride_img_c + o_img, mask=m_hw).to(tl.float32)
        b_b = tl.load(p_img + 2 * stride_img_c + o_img, mask=m_hw).to(tl.float32)
        b_grey = 0.2989 * b_r + 0.5870 * b_g + 0.1140 * b_b
    tl.store(p_out + o_out, b_grey.to(p_out.dtype.element_ty), mask=m_hw)


@triton.jit
def _matmul_kernel(
    p_a,
    p_b,
    p_c,
    M,
    N,
    K,
    stride_a_m,
    stride_a_k,
    stride_b_k,
    stride_b_n,
    stride_c_m,
    stride_c_n,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_SIZE: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """C[M, N] = A[M, K] @ B[K, N], accumulated in fp32, stored in C's dtype.

    Tile (i_m, i_n) of C is sum over k-blocks of A[i_m, k] @ B[k, i_n]; elements past M, N or K are
    masked to zero on load and never stored. UPCAST casts the tiles to fp32 before the dot (the
    interpreter computes 16-bit dots wrongly otherwise).
    """
    i_m, i_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_SIZE)
    o_m = (i_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    o_n = (i_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    o_k = tl.arange(0, BLOCK_K)
    p_a_tile = p_a + offsets_2d(o_m, o_k, stride_a_m, stride_a_k)
    p_b_tile = p_b + offsets_2d(o_k, o_n, stride_b_k, stride_b_n)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for i_k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - i_k * BLOCK_K
        b_a = tl.load(p_a_tile, mask=mask_2d(o_m, o_k, M, k_left), other=0.0)  # [BLOCK_M, BLOCK_K]
        b_b = tl.load(p_b_tile, mask=mask_2d(o_k, o_n, k_left, N), other=0.0)  # [BLOCK_K, BLOCK_N]
        if UPCAST:
            b_a = b_a.to(tl.float32)
            b_b = b_b.to(tl.float32)
        acc = tl.dot(b_a, b_b, acc, input_precision=INPUT_PRECISION)
        p_a_tile += BLOCK_K * stride_a_k
        p_b_tile += BLOCK_K * stride_b_k
    p_c_tile = p_c + offsets_2d(o_m, o_n, stride_c_m, stride_c_n)
    tl.store(p_c_tile, acc.to(p_c.dtype.element_ty), mask=mask_2d(o_m, o_n, M, N))


# The ladder's last rung: the same kernel autotuned per (M, N, K) over the shared GEMM tile space.
_matmul_autotuned = triton.autotune(configs=autotune_configs(), key=["M", "N", "K"])(_matmul_kernel)


@triton.jit
def _matmul_persistent_kernel(
    a_desc, b_desc, c_desc, M, N, K, n_programs,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_SIZE: tl.constexpr,
    B_TRANSPOSED: tl.constexpr, SWAP_AB: tl.constexpr, INPUT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """C = A @ B as the ladder's kernel, with two Hopper changes. Persistent: n_programs programs (one per
    multiprocessor) walk the output tiles, program p taking tiles p, p + n_programs, ... in grouped order, so no
    program waits to be scheduled and the next tile's loads overlap this tile's epilogue. TMA: A, B and C are read and
    written through tensor descriptors (row-major, 16-byte aligned rows), whose copy engine fetches whole tiles into
    shared memory and fills the ragged edges with zeros, so the loop needs no masks or pointer arithmetic.
    B_TRANSPOSED: b_desc describes B^T (N x K, row-major: a weight in F.linear's layout), read in [BLOCK_N, BLOCK_K]
    tiles. SWAP_AB: each tile is computed transposed, C^T[BLOCK_N, BLOCK_M] = B^T @ A^T, and transposed back for the
    store: Hopper's tensor cores take 64 rows a warpgroup on their A side and as few as 8 on their B side, so a
    product with a few rows of A (a decode step's tokens) puts B's columns on the wide side instead of padding A."""
    n_tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    for tile in tl.range(tl.program_id(0), n_tiles, n_programs, flatten=True):
        i_m, i_n = grouped_tile(tile, M, N, BLOCK_M, BLOCK_N, GROUP_SIZE)
        acc = tl.zeros((BLOCK_N, BLOCK_M) if SWAP_AB else (BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, K, BLOCK_K):
            b_a = a_desc.load([i_m * BLOCK_M, k])  # [BLOCK_M, BLOCK_K]
            if B_TRANSPOSED:  # noqa: SIM108 (statements: only the layout's branch compiles)
                b_b = b_desc.load([i_n * BLOCK_N, k])  # B^T's tile, [BLOCK_N, BLOCK_K]
            else:
                b_b = b_desc.load([k, i_n * BLOCK_N])  # [BLOCK_K, BLOCK_N]
            if B_TRANSPOSED != SWAP_AB:
                b_b = tl.trans(b_b)  # the side the product takes: [BLOCK_K, BLOCK_N], or [BLOCK_N, BLOCK_K] swapped
            if UPCAST:
                b_a = b_a.to(tl.float32)
                b_b = b_b.to(tl.float32)
            if SWAP_AB:
                acc = tl.dot(b_b, tl.trans(b_a), acc, input_precision=INPUT_PRECISION)
            else:
                acc = tl.dot(b_a, b_b, acc, input_precision=INPUT_PRECISION)
        b_c = tl.trans(acc) if SWAP_AB else acc  # [BLOCK_M, BLOCK_N]
        c_desc.store([i_m * BLOCK_M, i_n * BLOCK_N], b_c.to(c_desc.dtype))
