"""LoRA launchers for a linear layer with an adapter, ``y = x W^T + scale * (x A^T) B^T + bias``, forward and backward.

The forward is one Triton GEMM: per (BLOCK_M, BLOCK_N) output tile the K loop accumulates both
``x W^T`` and the low-rank ``x A^T`` from the same loaded tile of x, then adds ``scale * (x A^T) B^T``
and the bias before the one store. x is read once per tile, as a plain GEMM reads it, instead of once
more for ``x A^T`` and the output once more for the adapter's add (what PEFT's eager LoRA does). The
extra tensor-core work is r_pad / BLOCK_N of the GEMM's, r_pad being r padded to a power of two of at
least 16 (tl.dot's smallest inner size). ``x A^T`` (tokens x r, fp32) is saved for the backward.

The input gradient has the same shape of computation, ``dx = dy W + scale * (dy B) A``, and runs the
same kernel, reading dy once and rounding dx once; it saves ``dy B`` for ``dA``. The weight gradients
are thin or plain GEMMs: ``dA = scale (dy B)^T x`` and ``dB = scale dy^T (x A^T)`` run as one Triton
kernel each up to the plan's token limit (where cuBLAS's form, split, concatenate, GEMM, add and cast,
was six launches of a few microseconds each for a few microseconds of work) and as cuBLAS GEMMs beyond;
``dW = dy^T x`` (only when the weight requires grad: a frozen base weight costs nothing) and
``dbias = sum(dy)`` in torch.

Precision: the rank-r intermediates (x A^T, dy B) stay fp32. Where they meet 16-bit operands in a
tensor-core dot they are split in two 16-bit parts, hi = t.to(dtype) and lo = (t - hi).to(dtype), and
both are multiplied: t is carried to about twice the dtype's precision (the split costs 2 r_pad / K
of the GEMM), where torch's eager LoRA rounds it to the 16-bit dtype. y, dx and dbias are rounded once
from fp32. dA, dB and dW are cuBLAS GEMMs with an fp32 result on CUDA (``_core.cublas.mm_fp32``), also
rounded once: with a 16-bit result cuBLAS may sum split-K partials in 16 bits, which put bf16 dW off by
2.8e-2 of its rms on the H200. On the CPU the 16-bit product is rounded once more before the fp32 sum.

Where the fusion pays. The unfused path (torch's eager LoRA, this spec's "torch" provider) is a cuBLAS
GEMM plus ``x A^T`` (one more read of x) and an add of the adapter's product (one more read and write
of y): 2 * tokens * (K + 2N) bytes beyond the GEMM. For few tokens (decoding, small batches) the GEMM is
bound by reading W, and those extras and two more launches are the difference the fused kernel saves.
For many tokens the GEMM is compute-bound and the extras are 10 to 15% of its time, less than this
Triton GEMM loses to cuBLAS (measured: docs/kernels/lora.md). So above FUSED_MAX_TOKENS the same products
run as cuBLAS GEMMs (``_cublas_lora_matmul``): x A^T in fp32, then one GEMM whose inner dimension is
extended by the adapter (x and W copied once, side by side with the split x A^T and B, W row by row as
stored also in the input gradient's GEMM, where it is read transposed), rounded once.
"""

from __future__ import annotations

import math

import torch

from tritonkit._core.checks import FLOAT_DTYPES, check_device, check_tensor
from tritonkit._core.cublas import mm_fp32, mm_rounded
from tritonkit._core.env import kernels_interpreted, upcast_bf16_dots
from tritonkit._core.gemm_plan import FIXED_TILE, input_precision
from tritonkit._core.ints import cdiv
from tritonkit.ops.lora.kernels import _lora_matmul_autotuned, _lora_matmul_kernel, _lora_thin_grad_kernel
from tritonkit.ops.lora.plan import (
    MAX_RANK,
    THIN_GRAD_COLUMNS,
    THIN_GRAD_ROWS,
    THIN_GRAD_WARPS,
    LoraPlan,
    padded_rank,
)


def check_lora_args(x, weight, lora_a, lora_b, scale, bias) -> None:
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


def _hi_lo(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """t (M, r) fp32 as [hi, lo] (M, 2r) in a 16-bit dtype: hi = t rounded, lo = the rest rounded, so that
    hi + lo carries t to about twice the dtype's precision (the kernels' split, for cuBLAS)."""
    hi = t.to(dtype)
    return torch.cat([hi, (t - hi.float()).to(dtype)], dim=1)


def _side_by_side_t(q_t: torch.Tensor, l2_t: torch.Tensor, copies: int) -> torch.Tensor:
    """[q_t, l2_t, ... (``copies`` times)]^T, (D + copies R, N), for cuBLAS. Built from q_t's storage rows: the
    backward's q_t is W^T, a transposed view, and concatenating it as it reads would transpose all of W in the copy;
    its rows W stacked over the adapter's rows are the same matrix, a plain copy."""
    if q_t.stride(1) != 1 and q_t.stride(0) == 1:
        return torch.cat([q_t.t(), *(l2_t.t(),) * copies], dim=0)
    return torch.cat([q_t, *(l2_t,) * copies], dim=1).t()


def _cublas_lora_matmul(p, q_t, l1_t, l2_t, bias, scale):
    """What the fused kernel computes, as cuBLAS GEMMs: p @ l1_t.T in fp32 (a thin GEMM), then one GEMM
    over the inner dimension extended by the adapter, [p, hi, lo] @ [q_t, l2_t, l2_t]^T with hi + lo =
    scale * p @ l1_t.T, the bias added in its epilogue. One fp32 accumulation and one rounding, as in
    the kernel; a separately rounded 16-bit adapter product would add its rounding error to y."""
    pl1 = mm_fp32(p, l1_t.t())  # (M, R)
    if p.dtype == torch.float32:
        left, right_t = torch.cat([p, pl1 * scale], dim=1), _side_by_side_t(q_t, l2_t, 1)
    else:
        left, right_t = torch.cat([p, _hi_lo(pl1 * scale, p.dtype)], dim=1), _side_by_side_t(q_t, l2_t, 2)
    return mm_rounded(left, right_t, bias), pl1


def _launch_lora_matmul(p, q_t, l1_t, l2_t, bias, scale, plan: LoraPlan, tile=None):
    """out = p @ q_t.T + scale * (p @ l1_t.T) @ l2_t.T (+ bias), and p @ l1_t.T in fp32.

    p: (M, D); q_t: (N, D); l1_t: (R, D); l2_t: (N, R): the operands as stored (the forward's W, A, B),
    or transposed views of them (the backward's W^T, B^T, A^T). Any strides. The fused Triton kernel
    up to ``plan.fused_max_tokens`` rows, cuBLAS beyond. ``tile``: a fixed tile
    (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_SIZE) in place of autotuning, as under the interpreter.
    """
    m, d = p.shape
    n, r = q_t.shape[0], l1_t.shape[0]
    if m > plan.fused_max_tokens:
        return _cublas_lora_matmul(p, q_t, l1_t, l2_t, bias, scale)
    out = torch.empty((m, n), dtype=p.dtype, device=p.device)
    pl1 = torch.empty((m, r), dtype=torch.float32, device=p.device)
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
        "INPUT_PRECISION": input_precision(p.dtype),
        "UPCAST": upcast_bf16_dots(p.dtype),
    }
    if tile is None and kernels_interpreted():  # timing means nothing under the interpreter: the ladder's fixed tile
        tile = {**FIXED_TILE, "GROUP_SIZE": 8}
    if tile is not None:
        grid = (cdiv(m, tile["BLOCK_M"]) * cdiv(n, tile["BLOCK_N"]),)
        _lora_matmul_kernel[grid](*args, **tile, **flags)
    else:

        def grid(meta):
            return (cdiv(m, meta["BLOCK_M"]) * cdiv(n, meta["BLOCK_N"]),)

        _lora_matmul_autotuned[grid](*args, **flags)
    return out, pl1


def lora_fwd(
    x: torch.Tensor,
    weight: torch.Tensor,
    lora_a: torch.Tensor,
    lora_b: torch.Tensor,
    bias: torch.Tensor | None,
    scale: float,
    *,
    tile: dict | None = None,
    plan: LoraPlan | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """y = x W^T + scale (x A^T) B^T + bias and x A^T (fp32, saved for the backward). x: (tokens, K). ``plan``: which
    path runs (LoraPlan; None: FUSED_MAX_TOKENS)."""
    return _launch_lora_matmul(x, weight, lora_a, lora_b, bias, scale, _plan(plan), tile)


def _plan(plan) -> LoraPlan:
    """``plan``, checked, or the default LoraPlan (FUSED_MAX_TOKENS)."""
    if plan is not None and not isinstance(plan, LoraPlan):
        raise TypeError(f"lora_linear: plan must be a LoraPlan, got {type(plan).__name__}")
    return plan or LoraPlan()


def lora_fwd_fake(x, weight, lora_a, lora_b, bias, scale):
    return x.new_empty((x.shape[0], weight.shape[0])), x.new_empty((x.shape[0], lora_a.shape[0]), dtype=torch.float32)


def _times_fp32(small: torch.Tensor, big: torch.Tensor, transposed: bool = False) -> torch.Tensor:
    """small^T @ big (r, C) in fp32, or with ``transposed`` big^T @ small (C, r), dense, for small (M, r) fp32 and big
    (M, C) of a 16-bit or fp32 dtype.

    16-bit: small split in hi + lo (``_hi_lo``), both halves multiplied in one cuBLAS call (big is read
    once) with an fp32 result (``_core.cublas.mm_fp32``), the two products summed in fp32.
    """
    r = small.shape[1]
    if big.dtype == torch.float32:
        return big.t() @ small if transposed else small.t() @ big
    if transposed:
        product = mm_fp32(big.t(), _hi_lo(small, big.dtype))
        return product[:, :r] + product[:, r:]
    product = mm_fp32(_hi_lo(small, big.dtype).t(), big)
    return product[:r] + product[r:]


def _thin_grad(small: torch.Tensor, big: torch.Tensor, scale: float, dtype: torch.dtype, transposed: bool,
               plan: LoraPlan) -> torch.Tensor:  # fmt: skip
    """scale * small^T @ big (r, C) in ``dtype``, or with ``transposed`` its transpose (C, r), dense, for small (M, r)
    fp32 and big (M, C): the Triton kernel up to ``plan.fused_max_tokens`` tokens, cuBLAS (_times_fp32) beyond."""
    m, r = small.shape
    if m > plan.fused_max_tokens:
        return _times_fp32(small * scale, big, transposed).to(dtype)
    c = big.shape[1]
    out = torch.empty((c, r) if transposed else (r, c), dtype=dtype, device=big.device)
    stride_r, stride_c = (out.stride(1), out.stride(0)) if transposed else out.stride()
    small = small.contiguous()
    _lora_thin_grad_kernel[(cdiv(c, THIN_GRAD_COLUMNS),)](
        small, big, out, m, c, r, scale, small.stride(0), big.stride(0), big.stride(1), stride_r, stride_c,
        R_PAD=padded_rank(r), SPLIT=big.dtype != torch.float32, BLOCK_M=THIN_GRAD_ROWS, BLOCK_C=THIN_GRAD_COLUMNS,
        INPUT_PRECISION=input_precision(big.dtype), UPCAST=upcast_bf16_dots(big.dtype), num_warps=THIN_GRAD_WARPS,
    )  # fmt: skip
    return out


def lora_bwd(
    dy: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    lora_a: torch.Tensor,
    lora_b: torch.Tensor,
    xa: torch.Tensor,
    scale: float,
    need_dx: bool,
    need_dw: bool,
    need_da: bool,
    need_db: bool,
    need_dbias: bool,
    *,
    plan: LoraPlan | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients (dx, dweight, dlora_a, dlora_b, dbias), each empty unless asked for.

    dx = dy W + scale (dy B) A by ``_launch_lora_matmul`` (which also gives dy B in fp32; ``plan`` as lora_fwd's);
    dA and dB by ``_thin_grad`` (the same ``plan``); dW and dbias in torch.
    """
    plan = _plan(plan)
    dx = dyb = None
    if need_dx:
        dx, dyb = _launch_lora_matmul(dy, weight.t(), lora_b.t(), lora_a.t(), None, scale, plan)
    elif need_da:  # x needs no gradient (a first layer): dy B alone, a thin GEMM, not the dx GEMM
        dyb = mm_fp32(dy, lora_b)
    dw = mm_fp32(dy.t(), x).to(weight.dtype) if need_dw else None  # a 16-bit result lets cuBLAS sum in 16 bits
    # The scale multiplies the thin (tokens, r) factor, before its split; dB comes out (N, r) and dense, as the
    # custom op's fake promises (inductor asserts output strides).
    da = _thin_grad(dyb, x, scale, lora_a.dtype, False, plan) if need_da else None
    db = _thin_grad(xa, dy, scale, lora_b.dtype, True, plan) if need_db else None
    dbias = dy.sum(0, dtype=torch.float32).to(dy.dtype) if need_dbias else None
    grads = ((dx if need_dx else None), dw, da, db, dbias)
    return tuple(g if g is not None else x.new_empty((0,)) for g in grads)


def lora_bwd_fake(dy, x, weight, lora_a, lora_b, xa, scale, need_dx, need_dw, need_da, need_db, need_dbias):
    likes = (x, weight, lora_a, lora_b, dy)  # each gradient's shape and dtype (dbias: dy's dtype, (N,))
    shapes = (x.shape, weight.shape, lora_a.shape, lora_b.shape, weight.shape[:1])
    needs = (need_dx, need_dw, need_da, need_db, need_dbias)
    return tuple(
        like.new_empty(shape if need else (0,)) for like, shape, need in zip(likes, shapes, needs, strict=True)
    )
