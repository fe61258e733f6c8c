"""A linear layer with a LoRA adapter, ``y = x W^T + scale * (x A^T) B^T + bias``, forward and backward.

The forward is one Triton GEMM: per (BLOCK_M, BLOCK_N) output tile the K loop accumulates both
``x W^T`` and the low-rank ``x A^T`` from the same loaded tile of x, then adds ``scale * (x A^T) B^T``
and the bias before the one store. x is read once per tile, as a plain GEMM reads it, instead of once
more for ``x A^T`` and the output once more for the adapter's add (what PEFT's eager LoRA does). The
extra tensor-core work is r_pad / BLOCK_N of the GEMM's, r_pad being r padded to a power of two of at
least 16 (tl.dot's smallest inner size). ``x A^T`` (tokens x r, fp32) is saved for the backward.

The input gradient has the same shape of computation, ``dx = dy W + scale * (dy B) A``, and runs the
same kernel, reading dy once and rounding dx once; it saves ``dy B`` for ``dA``. The weight gradients
are thin or plain GEMMs with nothing to fuse, so they run in torch (cuBLAS on a GPU):
``dA = scale (dy B)^T x``, ``dB = scale dy^T (x A^T)``, ``dW = dy^T x`` (only when the weight
requires grad: a frozen base weight costs nothing), ``dbias = sum(dy)``.

Precision: the rank-r intermediates (x A^T, dy B) stay fp32. Where they meet 16-bit operands in a
tensor-core dot they are split in two 16-bit parts, hi = t.to(dtype) and lo = (t - hi).to(dtype), and
both are multiplied: t is carried to about twice the dtype's precision (the split costs 2 r_pad / K
of the GEMM), where torch's eager LoRA rounds it to the 16-bit dtype. y, dx and dbias are rounded once
from fp32. dA, dB and dW are cuBLAS GEMMs with an fp32 result on CUDA (``_core.gemm.mm_fp32``), also
rounded once: with a 16-bit result cuBLAS may sum split-K partials in 16 bits, which put bf16 dW off by
2.8e-2 of its rms on the H200. On the CPU the 16-bit product is rounded once more before the fp32 sum.

Where the fusion pays. The unfused path (torch's eager LoRA, this spec's "torch" provider) is a cuBLAS
GEMM plus ``x A^T`` (one more read of x) and an add of the adapter's product (one more read and write
of y): 2 * tokens * (K + 2N) bytes beyond the GEMM. For few tokens (decoding, small batches) the GEMM is
bound by reading W, and those extras and two more launches are the difference the fused kernel saves.
For many tokens the GEMM is compute-bound and the extras are 10 to 15% of its time, less than this
Triton GEMM loses to cuBLAS: measured on the H200 at 8192 tokens (bf16, fwd+bwd), the fused path took
3.10 ms against 2.63 for torch eager (4096 -> 11008, r 16). So above FUSED_MAX_TOKENS the same products
run as cuBLAS GEMMs (``_cublas_lora_matmul``): x A^T in fp32, then one GEMM whose inner dimension is
extended by the adapter (x and W copied once, side by side with the split x A^T and B), rounded once.

No ``from __future__ import annotations`` here: torch.library reads the launchers' type hints at runtime.
"""

# ruff: noqa: UP045 - torch.library's schema inference (torch 2.6 and up) is built on typing.Optional

import math
from typing import Optional

import torch
import triton
import triton.language as tl

from tritonkit._core import alloc
from tritonkit._core.checks import FLOAT_DTYPES, check_device, check_tensor
from tritonkit._core.dispatch import cheapest_path
from tritonkit._core.env import interpreting
from tritonkit._core.gemm import mm_fp32, mm_rounded
from tritonkit._core.ints import cdiv, next_power_of_2
from tritonkit.debug import mask_2d, offsets_2d
from tritonkit.ops.matmul import _FIXED_TILE, _input_precision, grouped_tile, matmul_autotune_configs
from tritonkit.registry import Inputs, KernelSpec, Tolerance, register
from tritonkit.testing import TOLERANCES

__all__ = ["MAX_RANK", "lora_linear"]

MAX_RANK = 128  # widest adapter the fused kernels hold in registers (an fp32 BLOCK_M x r_pad tile)


@triton.jit
def _split_dot(b_t, b_right, acc, SPLIT: tl.constexpr, INPUT_PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """acc + t @ right for an fp32 tile t and a tile ``right`` of the input dtype.

    SPLIT (16-bit inputs): t = hi + lo with hi = t rounded to the input dtype and lo the rest, also
    rounded; two tensor-core dots keep t to about twice the dtype's precision. Without SPLIT (fp32
    inputs) one dot at the TF32 policy's precision.
    """
    if SPLIT:
        b_hi = b_t.to(b_right.dtype)
        b_lo = (b_t - b_hi.to(tl.float32)).to(b_right.dtype)
        if UPCAST:
            b_hi = b_hi.to(tl.float32)
            b_lo = b_lo.to(tl.float32)
            b_right = b_right.to(tl.float32)
        acc = tl.dot(b_hi, b_right, acc, input_precision=INPUT_PRECISION)
        acc = tl.dot(b_lo, b_right, acc, input_precision=INPUT_PRECISION)
    else:
        acc = tl.dot(b_t, b_right, acc, input_precision=INPUT_PRECISION)
    return acc


@triton.jit
def _lora_matmul_kernel(
    p_p, p_q, p_l1, p_l2, p_bias, p_out, p_pl1,
    M, N, D, R, scale,
    stride_p_m, stride_p_d, stride_q_d, stride_q_n, stride_l1_d, stride_l1_r, stride_l2_r, stride_l2_n,
    stride_out_m, stride_out_n, stride_pl1_m,
    HAS_BIAS: tl.constexpr, R_PAD: tl.constexpr, SPLIT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_SIZE: tl.constexpr,
    INPUT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """out[M, N] = P[M, D] @ Q[D, N] + scale * (P @ L1[D, R]) @ L2[R, N] (+ bias[N]); PL1 = P @ L1 (fp32).

    Forward:  P = x, Q = W^T, L1 = A^T, L2 = B^T, D = K: out = y, PL1 = x A^T.
    Backward: P = dy, Q = W, L1 = B, L2 = A, D = N:     out = dx = dy W + scale (dy B) A, PL1 = dy B.
    The D loop feeds one loaded P tile to both dots; the rank R is padded to R_PAD with zeros. Every
    program of tile-column 0 stores its rows of PL1 (the others computed the same values). Tiles are
    visited in groups of GROUP_SIZE tile-rows, as tk.ops.matmul does.
    """
    i_m, i_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_SIZE)
    o_m = (i_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    o_n = (i_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    o_k = tl.arange(0, BLOCK_K)
    o_r = tl.arange(0, R_PAD)
    p_p_tile = p_p + offsets_2d(o_m, o_k, stride_p_m, stride_p_d)
    p_q_tile = p_q + offsets_2d(o_k, o_n, stride_q_d, stride_q_n)
    p_l1_tile = p_l1 + offsets_2d(o_k, o_r, stride_l1_d, stride_l1_r)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_pl1 = tl.zeros((BLOCK_M, R_PAD), dtype=tl.float32)
    for i_k in range(0, tl.cdiv(D, BLOCK_K)):
        k_left = D - i_k * BLOCK_K
        b_p = tl.load(p_p_tile, mask=mask_2d(o_m, o_k, M, k_left), other=0.0)  # [BLOCK_M, BLOCK_K]
        b_q = tl.load(p_q_tile, mask=mask_2d(o_k, o_n, k_left, N), other=0.0)  # [BLOCK_K, BLOCK_N]
        b_l1 = tl.load(p_l1_tile, mask=mask_2d(o_k, o_r, k_left, R), other=0.0)  # [BLOCK_K, R_PAD]
        if UPCAST:
            b_p = b_p.to(tl.float32)
            b_q = b_q.to(tl.float32)
            b_l1 = b_l1.to(tl.float32)
        acc = tl.dot(b_p, b_q, acc, input_precision=INPUT_PRECISION)
        acc_pl1 = tl.dot(b_p, b_l1, acc_pl1, input_precision=INPUT_PRECISION)
        p_p_tile += BLOCK_K * stride_p_d
        p_q_tile += BLOCK_K * stride_q_d
        p_l1_tile += BLOCK_K * stride_l1_d
    if i_n == 0:
        tl.store(p_pl1 + offsets_2d(o_m, o_r, stride_pl1_m, 1), acc_pl1, mask=mask_2d(o_m, o_r, M, R))
    b_l2 = tl.load(p_l2 + offsets_2d(o_r, o_n, stride_l2_r, stride_l2_n), mask=mask_2d(o_r, o_n, R, N), other=0.0)
    acc = _split_dot(acc_pl1 * scale, b_l2, acc, SPLIT, INPUT_PRECISION, UPCAST)  # [BLOCK_M, BLOCK_N]
    if HAS_BIAS:
        acc += tl.load(p_bias + o_n, mask=o_n < N, other=0.0).to(tl.float32)[None, :]
    p_out_tile = p_out + offsets_2d(o_m, o_n, stride_out_m, stride_out_n)
    tl.store(p_out_tile, acc.to(p_out.dtype.element_ty), mask=mask_2d(o_m, o_n, M, N))


_lora_matmul_autotuned = triton.autotune(configs=matmul_autotune_configs(), key=["M", "N", "D", "R_PAD"])(
    _lora_matmul_kernel
)


def padded_rank(r: int) -> int:
    """The rank the kernel computes with: r rounded up to a power of two, at least 16 (tl.dot's minimum)."""
    return max(16, next_power_of_2(r))


# Above this many tokens the products run as cuBLAS GEMMs instead of the fused kernel. Measured on the
# H200 in bf16 at 8192 tokens (fwd+bwd, 2026-11-22-lora-fwd-bwd.md): the fused Triton GEMM took 3.10 ms
# against 2.63 for torch's unfused eager LoRA at 4096 -> 11008 (r 16), and 1.48 against 1.06 at
# 4096 -> 4096 (r 64): saving a read of x does not pay for a Triton GEMM below cuBLAS's speed once the GEMM
# is compute-bound. Below it (decoding, small batches) the GEMM is bound by reading W and the launches, and
# the fused kernel saves two of them. The crossover between the two measured points is an estimate.
FUSED_MAX_TOKENS = 1024


def _hi_lo(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """t (M, r) fp32 as [hi, lo] (M, 2r) in a 16-bit dtype: hi = t rounded, lo = the rest rounded, so that
    hi + lo carries t to about twice the dtype's precision (the kernels' split, for cuBLAS)."""
    hi = t.to(dtype)
    return torch.cat([hi, (t - hi.float()).to(dtype)], dim=1)


def _cublas_lora_matmul(p, q_t, l1_t, l2_t, bias, scale):
    """What the fused kernel computes, as cuBLAS GEMMs: p @ l1_t.T in fp32 (a thin GEMM), then one GEMM
    over the inner dimension extended by the adapter, [p, hi, lo] @ [q_t, l2_t, l2_t]^T with hi + lo =
    scale * p @ l1_t.T, the bias added in its epilogue. One fp32 accumulation and one rounding, as in
    the kernel; a separately rounded 16-bit adapter product would add its rounding error to y."""
    pl1 = mm_fp32(p, l1_t.t())  # (M, R)
    if p.dtype == torch.float32:
        left, right = torch.cat([p, pl1 * scale], dim=1), torch.cat([q_t, l2_t], dim=1)
    else:
        left, right = torch.cat([p, _hi_lo(pl1 * scale, p.dtype)], dim=1), torch.cat([q_t, l2_t, l2_t], dim=1)
    return mm_rounded(left, right.t(), bias), pl1


def _launch_lora_matmul(p, q_t, l1_t, l2_t, bias, scale):
    """out = p @ q_t.T + scale * (p @ l1_t.T) @ l2_t.T (+ bias), and p @ l1_t.T in fp32.

    p: (M, D); q_t: (N, D); l1_t: (R, D); l2_t: (N, R): the operands as stored (the forward's W, A, B),
    or transposed views of them (the backward's W^T, B^T, A^T). Any strides. The fused Triton kernel
    up to FUSED_MAX_TOKENS rows, cuBLAS beyond.
    """
    m, d = p.shape
    n, r = q_t.shape[0], l1_t.shape[0]
    if m > FUSED_MAX_TOKENS:
        return _cublas_lora_matmul(p, q_t, l1_t, l2_t, bias, scale)
    out = alloc.empty((m, n), dtype=p.dtype, device=p.device)
    pl1 = alloc.empty((m, r), dtype=torch.float32, device=p.device)
    if m == 0 or n == 0:
        # No output, so no program runs; p @ l1_t.T is then zero (dy B with N = 0) or read by nothing
        # (x A^T with N = 0 only feeds dB, of shape (0, r)).
        return out, pl1.zero_()
    args = (
        p, q_t, l1_t, l2_t, bias if bias is not None else out, out, pl1, m, n, d, r, scale,
        p.stride(0), p.stride(1), q_t.stride(1), q_t.stride(0), l1_t.stride(1), l1_t.stride(0),
        l2_t.stride(1), l2_t.stride(0), out.stride(0), out.stride(1), pl1.stride(0),
    )  # fmt: skip
    flags = {
        "HAS_BIAS": bias is not None,
        "R_PAD": padded_rank(r),
        "SPLIT": p.dtype != torch.float32,
        "INPUT_PRECISION": _input_precision(p.dtype),
        "UPCAST": interpreting() and p.dtype == torch.bfloat16,
    }
    if interpreting():
        # Timing means nothing under the interpreter: the fixed tile of tk.ops.matmul's grouped variant.
        grid = (cdiv(m, _FIXED_TILE["BLOCK_M"]) * cdiv(n, _FIXED_TILE["BLOCK_N"]),)
        _lora_matmul_kernel[grid](*args, **_FIXED_TILE, GROUP_SIZE=8, **flags)
    else:

        def grid(meta):
            return (cdiv(m, meta["BLOCK_M"]) * cdiv(n, meta["BLOCK_N"]),)

        _lora_matmul_autotuned[grid](*args, **flags)
    return out, pl1


# --------------------------------------------------------------------------------------------------
# Launchers (tensors in, tensors out): x and dy are (tokens, features) matrices
# --------------------------------------------------------------------------------------------------
def lora_fwd_launch(x, weight, lora_a, lora_b, bias, scale):
    """y = x W^T + scale (x A^T) B^T + bias and x A^T (fp32, saved for the backward)."""
    return _launch_lora_matmul(x, weight, lora_a, lora_b, bias, scale)


def _times_fp32(small: torch.Tensor, big: torch.Tensor) -> torch.Tensor:
    """small^T @ big in fp32, for small (M, r) fp32 and big (M, C) of a 16-bit or fp32 dtype.

    16-bit: small split in hi + lo (``_hi_lo``), both halves multiplied in one cuBLAS call (big is read
    once) with an fp32 result (``_core.gemm.mm_fp32``), the two products summed in fp32.
    """
    if big.dtype == torch.float32:
        return small.t() @ big
    product = mm_fp32(_hi_lo(small, big.dtype).t(), big)
    r = small.shape[1]
    return product[:r] + product[r:]


def lora_bwd_launch(dy, x, weight, lora_a, lora_b, xa, scale, need_dx, need_dw, need_da, need_db, need_dbias):
    """Gradients (dx, dweight, dlora_a, dlora_b, dbias), each None unless asked for.

    dx = dy W + scale (dy B) A by ``_launch_lora_matmul`` (which also gives dy B in fp32); the rest in torch.
    """
    dx = dyb = None
    if need_dx:
        dx, dyb = _launch_lora_matmul(dy, weight.t(), lora_b.t(), lora_a.t(), None, scale)
    elif need_da:  # x needs no gradient (a first layer): dy B alone, a thin GEMM, not the dx GEMM
        dyb = mm_fp32(dy, lora_b)
    dw = mm_fp32(dy.t(), x).to(weight.dtype) if need_dw else None  # a 16-bit result lets cuBLAS sum in 16 bits
    da = (scale * _times_fp32(dyb, x)).to(lora_a.dtype) if need_da else None
    # (dy^T (x A^T)) computed as its transpose; made dense, as the custom op's fake promises (inductor
    # asserts output strides).
    db = (scale * _times_fp32(xa, dy)).t().to(lora_b.dtype).contiguous() if need_db else None
    dbias = dy.sum(0, dtype=torch.float32).to(dy.dtype) if need_dbias else None
    return (dx if need_dx else None), dw, da, db, dbias


# --------------------------------------------------------------------------------------------------
# Autograd, shared by the eager path (an autograd.Function) and the compiled path (a torch custom op);
# _core.dispatch.cheapest_path picks one per call
# --------------------------------------------------------------------------------------------------
def _save(ctx, x, weight, lora_a, lora_b, bias, scale, xa):
    ctx.save_for_backward(x, weight, lora_a, lora_b, xa)
    ctx.scale, ctx.has_bias = scale, bias is not None


def _grads(ctx, dy, backward_launch):
    x, weight, lora_a, lora_b, xa = ctx.saved_tensors
    need_dx, need_dw, need_da, need_db, need_dbias = ctx.needs_input_grad[:5]
    return backward_launch(dy, x, weight, lora_a, lora_b, xa, ctx.scale, need_dx, need_dw, need_da, need_db,
                           need_dbias and ctx.has_bias)  # fmt: skip


class _LoRAFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, lora_a, lora_b, bias, scale):
        y, xa = lora_fwd_launch(x, weight, lora_a, lora_b, bias, scale)
        _save(ctx, x, weight, lora_a, lora_b, bias, scale, xa)
        ctx.mark_non_differentiable(xa)
        # No zero gradient for xa, which is internal (a fill per step; with it, the profiled host time of a
        # 16-token step on the H200 included a 0.28 ms aten::zeros).
        ctx.set_materialize_grads(False)
        return y, xa

    @staticmethod
    def backward(ctx, dy, dxa):
        if dy is None:  # y was not used: no gradient flows
            return (None,) * 6
        return (*_grads(ctx, dy, lora_bwd_launch), None)


def _or_empty(t: Optional[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    """Custom ops cannot return None: an absent gradient is an empty tensor."""
    return t if t is not None else like.new_empty((0,))


def _or_none(t: torch.Tensor, present: bool) -> Optional[torch.Tensor]:
    return t if present else None


@torch.library.custom_op("tritonkit::lora_fwd", mutates_args=())
def lora_fwd(
    x: torch.Tensor, weight: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, bias: Optional[torch.Tensor],
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """:func:`lora_fwd_launch` as a custom op."""
    return lora_fwd_launch(x, weight, lora_a, lora_b, bias, scale)


@lora_fwd.register_fake
def _(x, weight, lora_a, lora_b, bias, scale):
    return x.new_empty((x.shape[0], weight.shape[0])), x.new_empty((x.shape[0], lora_a.shape[0]), dtype=torch.float32)


@torch.library.custom_op("tritonkit::lora_bwd", mutates_args=())
def lora_bwd(
    dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor,
    xa: torch.Tensor, scale: float, need_dx: bool, need_dw: bool, need_da: bool, need_db: bool, need_dbias: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """:func:`lora_bwd_launch` as a custom op (absent gradients empty)."""
    grads = lora_bwd_launch(dy, x, weight, lora_a, lora_b, xa, scale, need_dx, need_dw, need_da, need_db, need_dbias)
    return tuple(_or_empty(g, x) for g in grads)


@lora_bwd.register_fake
def _(dy, x, weight, lora_a, lora_b, xa, scale, need_dx, need_dw, need_da, need_db, need_dbias):
    likes = (x, weight, lora_a, lora_b, dy)  # each gradient's shape and dtype (dbias: dy's dtype, (N,))
    shapes = (x.shape, weight.shape, lora_a.shape, lora_b.shape, weight.shape[:1])
    needs = (need_dx, need_dw, need_da, need_db, need_dbias)
    return tuple(
        like.new_empty(shape if need else (0,)) for like, shape, need in zip(likes, shapes, needs, strict=True)
    )


def _setup_context(ctx, inputs, output):
    x, weight, lora_a, lora_b, bias, scale = inputs
    _save(ctx, x, weight, lora_a, lora_b, bias, scale, output[1])


def _custom_op_backward(ctx, dy, dxa):
    grads = _grads(ctx, dy, lora_bwd)
    needs = (*ctx.needs_input_grad[:4], ctx.needs_input_grad[4] and ctx.has_bias)
    return (*(_or_none(g, need) for g, need in zip(grads, needs, strict=True)), None)


lora_fwd.register_autograd(_custom_op_backward, setup_context=_setup_context)


# --------------------------------------------------------------------------------------------------
# Public function
# --------------------------------------------------------------------------------------------------
def _check_lora_args(x, weight, lora_a, lora_b, scale, bias) -> None:
    check_tensor("x", x, dtypes=FLOAT_DTYPES)
    if x.dim() == 0:
        raise ValueError("lora_linear: x must have at least one dimension (..., in_features), got a scalar")
    check_tensor("weight", weight, ndim=2)
    check_tensor("lora_a", lora_a, ndim=2)
    check_tensor("lora_b", lora_b, ndim=2)
    (n, k), r = weight.shape, lora_a.shape[0]
    if x.shape[-1] != k:
        raise ValueError(f"lora_linear: x's last dimension must equal weight's in_features {k} (weight "
                         f"{tuple(weight.shape)} is (out, in)), got x of shape {tuple(x.shape)}")  # fmt: skip
    if lora_a.shape[1] != k:
        raise ValueError(f"lora_linear: lora_a must have shape (r, {k}), got {tuple(lora_a.shape)}")
    if not 1 <= r <= MAX_RANK:
        raise ValueError(f"lora_linear: the rank r = lora_a.shape[0] must be in [1, {MAX_RANK}], got {r}")
    if tuple(lora_b.shape) != (n, r):
        raise ValueError(f"lora_linear: lora_b must have shape ({n}, {r}) (out_features, r), "
                         f"got {tuple(lora_b.shape)}")  # fmt: skip
    if bias is not None:
        check_tensor("bias", bias, ndim=1)
        if bias.shape[0] != n:
            raise ValueError(f"lora_linear: bias must have shape ({n},), got {tuple(bias.shape)}")
    for name, t in (("weight", weight), ("lora_a", lora_a), ("lora_b", lora_b), ("bias", bias)):
        if t is not None and t.dtype != x.dtype:
            raise TypeError(f"lora_linear: {name} must have x's dtype {x.dtype}, got {t.dtype}; cast the adapter "
                            "(or the input) first, as torch.autocast would")  # fmt: skip
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise TypeError(f"lora_linear: scale must be a finite Python number, got {scale!r}")
    tensors = {"x": x, "weight": weight, "lora_a": lora_a, "lora_b": lora_b, "bias": bias}
    check_device(**{name: t for name, t in tensors.items() if t is not None})


def lora_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    lora_a: torch.Tensor,
    lora_b: torch.Tensor,
    scale: float,
    bias: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """``x W^T + scale * (x A^T) B^T + bias``: a linear layer with a LoRA adapter, fused.

    x: (..., K), any leading shape and strides; weight: (N, K) as nn.Linear's; lora_a: (r, K) and
    lora_b: (N, r) as PEFT's lora_A / lora_B weights, 1 <= r <= 128; bias: (N,) or None; scale: a
    Python number (PEFT's lora_alpha / r). Returns (..., N) in x's dtype.

    Dtypes: fp32, fp16 or bf16, and every tensor must have x's dtype (TypeError naming the one that
    differs). Adapters kept in fp32 over a 16-bit model are cast to the compute dtype first, as
    torch.autocast does for nn.Linear; their fp32 master copies stay with the optimizer.

    Differentiable in x, weight, lora_a, lora_b and bias; a weight that does not require grad (a
    frozen base model) gets no dW GEMM. The forward and dx are fused Triton kernels; dA, dB, dW and
    dbias are torch matmuls (cuBLAS), see the module docstring. fp32 inputs use TF32 only when
    ``torch.get_float32_matmul_precision()`` allows it, like torch.matmul.

    Example: ``y = tk.ops.lora_linear(x, base.weight, lora_A.weight, lora_B.weight, alpha / r, base.bias)``.
    """
    _check_lora_args(x, weight, lora_a, lora_b, scale, bias)
    rows = x.reshape(math.prod(x.shape[:-1]), x.shape[-1])  # not -1: K may be 0
    bias = bias.contiguous() if bias is not None else None  # read with unit stride; W, A, B take strides
    call = cheapest_path(lora_fwd, _LoRAFunction, lora_fwd_launch, (rows, weight, lora_a, lora_b, bias))
    y, _ = call(rows, weight, lora_a, lora_b, bias, float(scale))
    return y.view(*x.shape[:-1], weight.shape[0])


# --------------------------------------------------------------------------------------------------
# Reference (float64) and registry spec
# --------------------------------------------------------------------------------------------------
def _lora_reference(x, weight, lora_a, lora_b, scale, bias=None):
    """What PEFT's eager LoRA computes: two GEMMs and a low-rank product, unfused."""
    y = x @ weight.t() + scale * ((x @ lora_a.t()) @ lora_b.t())
    return y + bias if bias is not None else y


def _lora_inputs(case, device, dtype, generator):
    k, n, r = case["k"], case["n"], case["r"]
    lead = case.get("lead", (case.get("m", 1),))

    def randn(*shape, std=1.0):
        return (std * torch.randn(shape, device=device, generator=generator, dtype=torch.float32)).to(dtype)

    # Initialisations that keep every output near unit size: W and A ~ 1/sqrt(K) (as nn.Linear's),
    # B ~ 1/sqrt(r) (a trained adapter; PEFT starts it at zero, which would test nothing).
    x = randn(k, *lead).movedim(0, -1) if case.get("x_transposed") else randn(*lead, k)
    weight = randn(n, k, std=max(k, 1) ** -0.5)
    lora_a = randn(r, k, std=max(k, 1) ** -0.5)
    lora_b = randn(n, r, std=r**-0.5)
    bias = randn(n, std=0.1) if case.get("bias") else None
    # "frozen": the base weight is not trained; "frozen_x": nor is the input (a first layer).
    frozen = frozenset(i for i, flag in ((0, "frozen_x"), (1, "frozen")) if case.get(flag))
    return Inputs((x, weight, lora_a, lora_b, case.get("scale", 2.0)), {"bias": bias}, frozen)


def _tokens(case) -> int:
    return math.prod(case.get("lead", (case.get("m", 1),)))


def _lora_bytes(case, dtype, backward=False):
    """Fewest bytes moved. Forward: x, W, A, B (and bias) in, y out. Backward: dy, x, W, A, B in, dx,
    dA, dB (and dW unless frozen) out."""
    m, k, n, r = _tokens(case), case["k"], case["n"], case["r"]
    forward = m * k + n * k + r * (k + n) + m * n
    if not backward:
        return forward * dtype.itemsize
    dw = 0 if case.get("frozen") else n * k
    return (m * n + m * k + n * k + 2 * r * (k + n) + m * k + dw) * dtype.itemsize


def _lora_flops(case, dtype):
    m, k, n, r = _tokens(case), case["k"], case["n"], case["r"]
    return 2 * m * (n * k + r * (k + n))


def _lora_flops_bwd(case, dtype):
    """dx and, unless frozen, dW (each the forward's GEMM), plus the rank-r products of dA and dB."""
    m, k, n, r = _tokens(case), case["k"], case["n"], case["r"]
    base_gemms = 1 if case.get("frozen") else 2
    return 2 * m * (base_gemms * n * k + 2 * r * (k + n))


LORA_RMS_ATOL = 1e-4


def _lora_tolerance(case, dtype):
    """The table's entry for the dtype, plus 1e-4 of each output's rms (``Tolerance.rms_atol``).

    Every output is a long sum (over K, or over every token for dA, dB, dW), and its rounding error
    scales with the partial sums, not with the result: measured on the H200 at 4096 tokens x 4096 x 4096
    (r 16), an exactly summed fp32 dA was off by 5.7e-6 of its rms where an element cancels to near
    zero, and the 16-bit hi + lo split of dy B adds about as much (6e-6). Per element, the outputs
    are rounded once from fp32 (0.88 of the bf16 entry and 0.47 of the fp16 entry at most, interpreter,
    30 seeds). What the bound still rejects: a 16-bit result or 16-bit split-K partial sums in a
    weight gradient (measured 2.8e-2 of the rms for cuBLAS's bf16 dW = dy^T x), TF32 (about 5e-4) and
    torch's eager LoRA, which rounds x A^T and dy B to the dtype (tests/test_lora.py checks it).
    """
    base = TOLERANCES[dtype]
    return Tolerance(atol=base.atol, rtol=base.rtol, rms_atol=LORA_RMS_ATOL)


_LORA_TESTS = (
    {"m": 1, "k": 1, "n": 1, "r": 1},
    {"m": 7, "k": 33, "n": 70, "r": 8, "bias": True},
    {"lead": (2, 5), "k": 40, "n": 24, "r": 16, "frozen": True},
    {"lead": (3, 4), "k": 70, "n": 33, "r": 1, "bias": True, "frozen": True},
    {"m": 66, "k": 48, "n": 80, "r": 20, "scale": 0.5},  # r padded to 32; two tile-rows
    {"lead": (4, 6), "k": 36, "n": 20, "r": 8, "x_transposed": True, "bias": True},
    {"m": 9, "k": 20, "n": 30, "r": 4, "frozen": True, "frozen_x": True},  # dA without the dx kernel
    {"m": 0, "k": 16, "n": 8, "r": 4, "bias": True},
    {"m": 5, "k": 0, "n": 9, "r": 2, "bias": True},
    # More tokens than FUSED_MAX_TOKENS: the cuBLAS path, forward and dx.
    {"m": 1030, "k": 40, "n": 24, "r": 8, "bias": True},
    {"lead": (2, 600), "k": 33, "n": 70, "r": 20, "x_transposed": True, "frozen": True},
)
_LORA_GPU = (
    {"m": 4096, "k": 4096, "n": 4096, "r": 16, "frozen": True},
    {"lead": (3, 1000), "k": 1000, "n": 3001, "r": 8, "bias": True},
    {"m": 2048, "k": 2048, "n": 1024, "r": 64, "x_transposed": True},
    {"m": 127, "k": 4095, "n": 257, "r": 1, "bias": True, "frozen": True},
    {"m": 513, "k": 513, "n": 513, "r": 128},
)
# The small cases first (`--sizes small`: decoding, and the fused kernel's largest), then Llama-7B
# projections over 8192 tokens.
_LORA_BENCH = (
    {"m": 16, "k": 4096, "n": 4096, "r": 16, "frozen": True},
    {"m": 1024, "k": 4096, "n": 4096, "r": 16, "frozen": True},  # the most tokens the fused kernel takes
    {"m": 8192, "k": 4096, "n": 4096, "r": 16, "frozen": True},
    {"m": 8192, "k": 4096, "n": 11008, "r": 16, "frozen": True},
    {"m": 8192, "k": 4096, "n": 4096, "r": 64, "frozen": True},
)

register(
    KernelSpec(
        name="lora_linear",
        family="lora",
        summary="Linear layer with a LoRA adapter, x W^T + scale (x A^T) B^T + bias, fused; forward and backward.",
        description=f"Up to {FUSED_MAX_TOKENS} tokens, one Triton GEMM accumulates x W^T and x A^T from the "
        "same tiles of x and adds the adapter's product and the bias before its single store; "
        "dx = dy W + scale (dy B) A is the same kernel. Beyond, where the GEMM is compute-bound, one cuBLAS "
        "GEMM over the inner dimension extended by the adapter. dA, dB, dW (only for a weight that requires "
        "grad) and dbias are cuBLAS matmuls with fp32 results. Benchmarked against torch eager (the unfused "
        "path PEFT runs) and torch.compile.",
        usage="y = tk.ops.lora_linear(x, weight, lora_a, lora_b, scale=alpha / r, bias=bias)",
        tags=("lora", "gemm", "fused", "compute-bound", "backward"),
        limits="One dtype for all tensors (fp32, fp16, bf16); rank 1 to 128; any leading shape and strides.",
        notes="H200, 8192 tokens, bf16 fwd+bwd: the fused kernel lost to cuBLAS (3.10 against 2.63 ms for "
        f"torch eager), so many tokens take cuBLAS; the {FUSED_MAX_TOKENS}-token crossover is estimated "
        "between measured points. The fused GEMM autotunes per (M, N, K) on first use, like tk.ops.matmul.",
        status="experimental",
        fn=lora_linear,
        reference=_lora_reference,
        make_inputs=_lora_inputs,
        test_cases=_LORA_TESTS,
        gpu_cases=_LORA_GPU,
        bench_cases=_LORA_BENCH,
        bytes_moved=_lora_bytes,
        bytes_moved_bwd=lambda case, dtype: _lora_bytes(case, dtype, backward=True),
        flops=_lora_flops,
        flops_bwd=_lora_flops_bwd,
        dtypes=FLOAT_DTYPES,
        has_backward=True,
        tolerance=_lora_tolerance,
    )
)
