"""nf4_linear and int4_linear: validate, allocate, launch (tensors in, tensors out; ``plan=``).

x is read as rows (M, K) with any strides; the weight (N, K) in NF4 (flat codes and their state's tensors) or INT4
(codes (N, K / 2), scales and zero points (N, ceil(K / G))). The forward gives y (M, N) in x's dtype; the backward,
the weight being frozen, dx (M, K) and dbias.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tritonkit._core.checks import FLOAT_DTYPES, check_device, check_tensor
from tritonkit._core.cublas import mm_rounded
from tritonkit._core.device import arch, sm_count
from tritonkit._core.env import upcast_bf16_dots
from tritonkit._core.fourbit import NESTED_BLOCK, NF4State, check_int4_weight, check_nf4_state, nf4_tables
from tritonkit._core.gemm_plan import input_precision
from tritonkit._core.ints import cdiv, next_power_of_2
from tritonkit.ops.fourbit.kernels import (
    _dequantize_kernel,
    _int4_gemv_words_kernel,
    _linear4_dx_kernel,
    _linear4_fwd_kernel,
    _linear4_gemv_kernel,
    _split_sum_kernel,
)
from tritonkit.ops.fourbit.plan import (
    MIN_DOT,
    DequantizeFirst,
    Gemv4Tiles,
    Linear4Tiles,
    choose_splits,
    linear4_plan,
    linear4_tiles,
)

MAX_GEMV_ROWS = 16  # rows of x a _linear4_gemv_kernel program holds: one multiply-add pass over the weight tile each
_WORD_COLUMNS = 8  # INT4 codes an int32 word holds: the word GEMV's K steps take whole words
_SUM_TILE = (16, 256)  # rows x columns per program of the split sum: 4096 fp32 partials a split, 4 warps


def _check_x_and_bias(name: str, x, bias, n: int, k: int, weight_names: str) -> None:
    check_tensor(f"{name}: x", x, dtypes=FLOAT_DTYPES)
    if x.dim() == 0:
        raise ValueError(f"{name}: x must have a last dimension (..., in_features), got a 0-d tensor")
    if x.shape[-1] != k:
        raise ValueError(f"{name}: x's last dimension must equal the weight's in_features {k} ({weight_names} "
                         f"describe a weight ({n}, {k})), got x of shape {tuple(x.shape)}")  # fmt: skip
    if bias is not None:
        check_tensor(f"{name}: bias", bias, ndim=1)
        if bias.shape[0] != n:
            raise ValueError(f"{name}: bias must have shape ({n},), got {tuple(bias.shape)}")
        if bias.dtype != x.dtype:
            raise TypeError(f"{name}: bias must have x's dtype {x.dtype}, got {bias.dtype}")


def _refuse_trainable(name: str, tensors: dict) -> None:
    """The weight is frozen: a gradient for it would be silently dropped, so one that asks for it is refused."""
    if not torch.is_grad_enabled():
        return
    for arg, tensor in tensors.items():
        if isinstance(tensor, torch.Tensor) and tensor.requires_grad:
            raise ValueError(f"{name}: the 4-bit weight is frozen (no gradient reaches it), but {arg} requires grad; "
                             "pass it detached (train an adapter beside it, as tk.nn.LoRALinear does)")  # fmt: skip


def _check_nf4_weight(name: str, packed, state) -> None:
    n_values = check_nf4_state(name, packed, state)
    if packed.dim() > 1 and packed.shape[-1] != 1:
        raise ValueError(f"{name}: packed must hold NF4's flat codes, ({(n_values + 1) // 2},) or bitsandbytes' "
                         f"({(n_values + 1) // 2}, 1), got shape {tuple(packed.shape)}; a 2-D (N, K / 2) qweight is "
                         "int4_quantize's layout, for int4_linear")  # fmt: skip
    if len(state.shape) != 2:
        raise ValueError(f"{name}: state.shape must be a linear layer's weight (N, K), got {state.shape}")


def check_nf4_linear(x, packed, state, bias) -> None:
    name = "nf4_linear"
    _check_nf4_weight(name, packed, state)
    n, k = state.shape
    _check_x_and_bias(name, x, bias, n, k, "packed and state")
    _refuse_trainable(name, {"packed": packed, **{f"state.{key}": t for key, t in state.tensors().items()}})
    check_device(x=x, packed=packed, **state.tensors(), **({"bias": bias} if bias is not None else {}))


def _check_int4_x(name: str, x) -> None:
    if isinstance(x, torch.Tensor) and x.dim() and x.shape[-1] % 2:
        raise ValueError(f"{name}: x's last dimension K must be even (INT4 packs two codes a byte along K), got x of "
                         f"shape {tuple(x.shape)}")  # fmt: skip


def check_int4_linear(x, qweight, scales, zeros, group_size, bias) -> None:
    name = "int4_linear"
    check_int4_weight(name, qweight, scales, zeros, group_size)
    n, k = qweight.shape[0], 2 * qweight.shape[1]
    _check_int4_x(name, x)
    _check_x_and_bias(name, x, bias, n, k, "qweight, scales and zeros")
    _refuse_trainable(name, {"scales": scales})
    check_device(x=x, qweight=qweight, scales=scales, zeros=zeros, **({"bias": bias} if bias is not None else {}))


_WEIGHT_NAMES = {"nf4": "packed and state", "int4": "qweight, scales and zeros"}  # for the messages


@dataclass(frozen=True)
class CheckedWeight:
    """A 4-bit weight checked once (codes, state, device), for a layer that multiplies by it every step: what is left
    to check per call is x and the bias (check_x_with_weight). ``arguments``: the custom op's weight arguments."""

    format: str  # "nf4" or "int4"
    arguments: tuple
    shape: tuple[int, int]  # (N, K)
    device: torch.device
    tensors: dict  # the weight's tensors by argument name, for the per-call check that none requires grad


def checked_nf4_weight(packed, state) -> CheckedWeight:
    """NF4 codes and their state checked as nf4_linear checks them, and its op arguments."""
    _check_nf4_weight("nf4_linear", packed, state)
    tensors = {"packed": packed, **{f"state.{key}": t for key, t in state.tensors().items()}}
    device = check_device(**tensors)
    return CheckedWeight("nf4", nf4_arguments(packed, state), tuple(state.shape), device, tensors)


def checked_int4_weight(qweight, scales, zeros, group_size) -> CheckedWeight:
    """INT4 codes, scales and zero points checked as int4_linear checks them, and its op arguments."""
    check_int4_weight("int4_linear", qweight, scales, zeros, group_size)
    device = check_device(qweight=qweight, scales=scales, zeros=zeros)
    shape = (qweight.shape[0], 2 * qweight.shape[1])
    return CheckedWeight("int4", (qweight, scales, zeros, group_size), shape, device, {"scales": scales})


def check_x_with_weight(x, weight: CheckedWeight, bias) -> None:
    """nf4_linear's or int4_linear's checks of x and the bias, the weight checked before."""
    name = f"{weight.format}_linear"
    if weight.format == "int4":
        _check_int4_x(name, x)
    _check_x_and_bias(name, x, bias, *weight.shape, _WEIGHT_NAMES[weight.format])
    _refuse_trainable(name, weight.tensors)
    if x.device != weight.device or (bias is not None and bias.device != weight.device):
        check_device(x=x, weight=weight.arguments[0], **({"bias": bias} if bias is not None else {}))


@dataclass(frozen=True)
class _Weight:
    """A 4-bit weight as the kernels take it: pointers, row strides, and the format's constexprs."""

    pointers: tuple  # p_q, p_absmax, p_absmax_codes, p_absmax_scales, p_offset, p_code, p_nested_code, p_scales,
    # p_zeros
    stride_q_n: int
    stride_s_n: int
    flags: dict


def _flat(t: torch.Tensor | None) -> torch.Tensor | None:
    if t is None or (t.dim() == 1 and t.is_contiguous()):  # as the op's arguments come: no new tensor each call
        return t
    return t.reshape(-1).contiguous()


def _nf4_weight(packed, absmax, absmax_codes, absmax_scales, offset, nested_code, k, blocksize) -> _Weight:
    code, _, dynamic = nf4_tables(packed.device)
    nested = absmax is None
    table = (nested_code if nested_code is not None else dynamic) if nested else None
    flat = [_flat(t) for t in (packed, absmax, absmax_codes, absmax_scales, offset)]
    pointers = (*flat, code, _flat(table), None, None)
    flags = {"FORMAT": "nf4", "NESTED": nested, "NESTED_BLOCK": NESTED_BLOCK, "EVEN_K": k % 2 == 0,
             "BY_GROUP": k % blocksize == 0, "GROUP": blocksize}  # fmt: skip
    return _Weight(pointers, 0, 0, flags)


def _int4_weight(qweight, scales, zeros, group_size) -> _Weight:
    qweight = qweight if qweight.stride(1) == 1 else qweight.contiguous()
    scales, zeros = scales.contiguous(), zeros.contiguous()
    pointers = (qweight, None, None, None, None, None, None, scales, zeros)
    flags = {"FORMAT": "int4", "NESTED": False, "NESTED_BLOCK": NESTED_BLOCK, "EVEN_K": True, "BY_GROUP": True,
             "GROUP": group_size}  # fmt: skip
    return _Weight(pointers, qweight.stride(0), scales.stride(0), flags)


def _int4_words(weight: _Weight) -> torch.Tensor | None:
    """INT4 codes as int32 words of 8 (N, K / 8), what _int4_gemv_words_kernel reads, where K is a multiple of 8 and
    rows start 4-byte aligned; None otherwise (NF4, or codes it cannot read so)."""
    qweight = weight.pointers[0]
    if weight.flags["FORMAT"] != "int4" or qweight.shape[0] == 0:
        return None
    aligned = qweight.shape[1] % 4 == 0 and qweight.stride(0) % 4 == 0 and qweight.data_ptr() % 4 == 0
    return qweight.view(torch.int32) if aligned else None


def _split(tiles, n_tiles: int, length: int, step: int, outputs: int, device) -> tuple[int, int]:
    """(splits, length per split, a multiple of step) of a contraction of ``length`` (tiles: Linear4Tiles or
    Gemv4Tiles, whose splits field forces the count)."""
    steps = cdiv(length, step)
    splits = tiles.splits or choose_splits(n_tiles, steps, outputs, sm_count(device))
    per_split = cdiv(steps, max(1, min(splits, steps))) * step
    return max(1, cdiv(length, per_split)), per_split


def _decode(weight: _Weight, plan: Linear4Tiles | Gemv4Tiles | DequantizeFirst) -> str:
    """The plan's NF4 lookup; INT4 has none, and takes one value so that plans differing in it share a compile."""
    return plan.nf4_decode if weight.flags["FORMAT"] == "nf4" else "select"


def _sum_splits(part, bias, out) -> None:
    splits, m, n = part.shape
    block_m, block_n = _SUM_TILE
    _split_sum_kernel[(cdiv(m, block_m), cdiv(n, block_n))](part, bias, out, m, n, splits, out.stride(0),
                                                            HAS_BIAS=bias is not None, BLOCK_M=block_m,
                                                            BLOCK_N=block_n, num_warps=4)  # fmt: skip


def _dequantized(weight: _Weight, n: int, k: int, dtype: torch.dtype, device, plan: DequantizeFirst) -> torch.Tensor:
    """The weight (N, K) in ``dtype``, as the fused kernels' operands hold it."""
    w = torch.empty((n, k), dtype=dtype, device=device)
    _dequantize_kernel[(cdiv(n, plan.block_n), cdiv(cdiv(k, plan.block_k), plan.k_tiles))](
        w, *weight.pointers, n, k, w.stride(0), weight.stride_q_n, weight.stride_s_n, **weight.flags,
        UPCAST=upcast_bf16_dots(dtype), NF4_DECODE=_decode(weight, plan), BLOCK_N=plan.block_n, BLOCK_K=plan.block_k,
        K_TILES=plan.k_tiles, num_warps=plan.warps,
        enable_fp_fusion=False,  # the nested absmax rounds twice, as in the fused kernels
    )  # fmt: skip
    return w


def _forward(x: torch.Tensor, bias, weight: _Weight, n: int, k: int, plan) -> torch.Tensor:
    m = x.shape[0]
    tiles = plan or linear4_plan(arch(x.device), weight.flags["FORMAT"], m)
    if isinstance(tiles, DequantizeFirst) and m and n and k:
        # cuBLAS with fp32 split-K sums (torch lets it sum them in 16 bits: seen off by 0.02 at 513 x 1000 x 4100).
        return mm_rounded(x, _dequantized(weight, n, k, x.dtype, x.device, tiles).t(), bias)
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return out
    if k == 0:
        return out.copy_(bias.expand(m, n)) if bias is not None else out.zero_()
    if isinstance(tiles, Gemv4Tiles):
        if m > MAX_GEMV_ROWS:
            raise ValueError(f"Gemv4Tiles: x may have at most {MAX_GEMV_ROWS} rows, got {m}; take Linear4Tiles or "
                             "DequantizeFirst for more")  # fmt: skip
        block_m = max(next_power_of_2(m), MIN_DOT if tiles.products == "dot" else 1)  # x's rows, padded for a dot
        words = _int4_words(weight) if tiles.products == "fma" and tiles.block_k >= _WORD_COLUMNS else None
        if words is not None:
            _int4_forward_by_words(x, out, bias, weight, words, n, k, tiles, block_m)
            return out
        _forward_split_k(
            _linear4_gemv_kernel, cdiv(n, tiles.block_n), x, out, bias, weight, n, k, tiles, half_k=k // 2,
            PRODUCTS=tiles.products, STAGES=tiles.stages, BLOCK_M=block_m,  # FMAs on: the nested absmax's mul.rn
        )  # fmt: skip
    else:
        _forward_split_k(
            _linear4_fwd_kernel, cdiv(m, tiles.block_m) * cdiv(n, tiles.block_n), x, out, bias, weight, n, k, tiles,
            BLOCK_M=tiles.block_m, GROUP_M=tiles.group,
            enable_fp_fusion=False,  # the nested absmax rounds twice, as nf4_dequantize's
        )  # fmt: skip
    return out


def _split_k(n_tiles: int, x, out, bias, n: int, k: int, tiles, launch) -> None:
    """y = x W^T + bias into out (m, n and k non-zero) on a grid of (n_tiles output tiles, splits of K): ``launch(grid,
    part, pairs_per_split, split)`` runs the kernel, whose programs store the fp32 partial sums to part (S, M, N) when
    split (else y to out), and the splits' partial sums are added in order."""
    m = x.shape[0]
    splits, pairs_per_split = _split(tiles, n_tiles, cdiv(k, 2), tiles.block_k // 2, m * n, x.device)
    part = torch.empty((splits, m, n), dtype=torch.float32, device=x.device) if splits > 1 else out
    launch((n_tiles, splits), part, pairs_per_split, splits > 1)
    if splits > 1:
        _sum_splits(part, bias, out)


def _forward_split_k(kernel, n_tiles: int, x, out, bias, weight: _Weight, n: int, k: int, tiles, **specific) -> None:
    """y = x W^T + bias by ``kernel`` (_linear4_fwd_kernel or _linear4_gemv_kernel, with its own arguments
    ``specific``) split over K (_split_k)."""

    def launch(grid, part, pairs_per_split, split):
        kernel[grid](
            x, out, part, bias, *weight.pointers, M=x.shape[0], N=n, K=k, pairs_per_split=pairs_per_split,
            stride_x_m=x.stride(0), stride_x_k=x.stride(1), stride_out_m=out.stride(0), stride_q_n=weight.stride_q_n,
            stride_s_n=weight.stride_s_n, **weight.flags, HAS_BIAS=bias is not None, SPLIT=split,
            UPCAST=upcast_bf16_dots(x.dtype), DOT_PRECISION=input_precision(x.dtype),
            NF4_DECODE=_decode(weight, tiles), BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k, num_warps=tiles.warps,
            num_stages=tiles.stages, **specific,
        )  # fmt: skip

    _split_k(n_tiles, x, out, bias, n, k, tiles, launch)


def _int4_forward_by_words(
    x, out, bias, weight: _Weight, words: torch.Tensor, n: int, k: int, tiles: Gemv4Tiles, block_m: int
) -> None:
    """y = x W^T + bias by _int4_gemv_words_kernel, INT4 codes read as words, split over K (_split_k)."""
    scales, zeros = weight.pointers[7], weight.pointers[8]

    def launch(grid, part, pairs_per_split, split):
        _int4_gemv_words_kernel[grid](
            x, out, part, bias, words, scales, zeros, M=x.shape[0], N=n, K=k,
            words_per_split=pairs_per_split // 4, stride_x_m=x.stride(0), stride_x_k=x.stride(1),
            stride_out_m=out.stride(0), stride_w_n=words.stride(0), stride_s_n=weight.stride_s_n,
            GROUP=weight.flags["GROUP"], HAS_BIAS=bias is not None, SPLIT=split, STAGES=tiles.stages, BLOCK_M=block_m,
            BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k, num_warps=tiles.warps, num_stages=tiles.stages,
        )  # fmt: skip

    _split_k(cdiv(n, tiles.block_n), x, out, bias, n, k, tiles, launch)


def _backward(dy, weight: _Weight, n: int, k: int, need_dx: bool, need_dbias: bool, plan) -> tuple:
    """(dx, dbias), each empty unless asked for."""
    m = dy.shape[0]
    dbias = dy.sum(0, dtype=torch.float32).to(dy.dtype) if need_dbias else dy.new_empty((0,))
    if not need_dx:
        return dy.new_empty((0,)), dbias
    tiles = plan or linear4_plan(arch(dy.device), weight.flags["FORMAT"], m, forward=False)
    if isinstance(tiles, Gemv4Tiles):  # a forward plan only: the input gradient at those rows takes the dot tiles
        tiles = linear4_tiles(arch(dy.device), m)
    if isinstance(tiles, DequantizeFirst) and m and n and k:
        return mm_rounded(dy, _dequantized(weight, n, k, dy.dtype, dy.device, tiles)), dbias
    dx = torch.empty((m, k), dtype=dy.dtype, device=dy.device)
    if m == 0 or k == 0:
        return dx, dbias
    if n == 0:
        return dx.zero_(), dbias
    n_tiles = cdiv(m, tiles.block_m) * cdiv(k, tiles.block_k)
    splits, rows_per_split = _split(tiles, n_tiles, n, tiles.block_n, m * k, dy.device)
    part = torch.empty((splits, m, k), dtype=torch.float32, device=dy.device) if splits > 1 else dx
    _linear4_dx_kernel[(n_tiles, splits)](
        dy, dx, part, *weight.pointers, m, n, k, rows_per_split, dy.stride(0), dy.stride(1), dx.stride(0),
        weight.stride_q_n, weight.stride_s_n, **weight.flags, SPLIT=splits > 1, UPCAST=upcast_bf16_dots(dy.dtype),
        DOT_PRECISION=input_precision(dy.dtype), NF4_DECODE=_decode(weight, tiles), BLOCK_M=tiles.block_m,
        BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k, GROUP_M=tiles.group, num_warps=tiles.warps,
        num_stages=tiles.stages, enable_fp_fusion=False,
    )  # fmt: skip
    if splits > 1:
        _sum_splits(part, None, dx)
    return dx, dbias


# ---------------------------------------------------------------- the custom ops' launchers


def nf4_linear_fwd(
    x: torch.Tensor,
    bias: torch.Tensor | None,
    packed: torch.Tensor,
    absmax: torch.Tensor | None,
    absmax_codes: torch.Tensor | None,
    absmax_scales: torch.Tensor | None,
    offset: torch.Tensor | None,
    nested_code: torch.Tensor | None,
    n: int,
    k: int,
    blocksize: int,
    *,
    plan: Linear4Tiles | Gemv4Tiles | DequantizeFirst | None = None,
) -> torch.Tensor:
    """y = x W^T + bias (M, N) for x (M, K) and NF4 codes of W (N, K) (validated arguments)."""
    weight = _nf4_weight(packed, absmax, absmax_codes, absmax_scales, offset, nested_code, k, blocksize)
    return _forward(x, bias, weight, n, k, plan)


def nf4_linear_fwd_fake(x, bias, packed, absmax, absmax_codes, absmax_scales, offset, nested_code, n, k, blocksize):
    return x.new_empty((x.shape[0], n))


def nf4_linear_bwd(
    dy: torch.Tensor,
    packed: torch.Tensor,
    absmax: torch.Tensor | None,
    absmax_codes: torch.Tensor | None,
    absmax_scales: torch.Tensor | None,
    offset: torch.Tensor | None,
    nested_code: torch.Tensor | None,
    n: int,
    k: int,
    blocksize: int,
    need_dx: bool,
    need_dbias: bool,
    *,
    plan: Linear4Tiles | Gemv4Tiles | DequantizeFirst | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx = dy W, dbias = sum of dy's rows), each empty unless asked for."""
    weight = _nf4_weight(packed, absmax, absmax_codes, absmax_scales, offset, nested_code, k, blocksize)
    return _backward(dy, weight, n, k, need_dx, need_dbias, plan)


def _bwd_fake(dy, k, need_dx, need_dbias):
    return dy.new_empty((dy.shape[0], k) if need_dx else (0,)), dy.new_empty((dy.shape[1],) if need_dbias else (0,))


def nf4_linear_bwd_fake(dy, packed, absmax, absmax_codes, absmax_scales, offset, nested_code, n, k, blocksize,
                        need_dx, need_dbias):  # fmt: skip
    return _bwd_fake(dy, k, need_dx, need_dbias)


def int4_linear_fwd(
    x: torch.Tensor,
    bias: torch.Tensor | None,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    group_size: int,
    *,
    plan: Linear4Tiles | Gemv4Tiles | DequantizeFirst | None = None,
) -> torch.Tensor:
    """y = x W^T + bias (M, N) for x (M, K) and INT4 codes of W (N, K) (validated arguments)."""
    return _forward(x, bias, _int4_weight(qweight, scales, zeros, group_size), qweight.shape[0], x.shape[1], plan)


def int4_linear_fwd_fake(x, bias, qweight, scales, zeros, group_size):
    return x.new_empty((x.shape[0], qweight.shape[0]))


def int4_linear_bwd(
    dy: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    group_size: int,
    need_dx: bool,
    need_dbias: bool,
    *,
    plan: Linear4Tiles | Gemv4Tiles | DequantizeFirst | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx = dy W, dbias = sum of dy's rows), each empty unless asked for."""
    weight = _int4_weight(qweight, scales, zeros, group_size)
    return _backward(dy, weight, qweight.shape[0], 2 * qweight.shape[1], need_dx, need_dbias, plan)


def int4_linear_bwd_fake(dy, qweight, scales, zeros, group_size, need_dx, need_dbias):
    return _bwd_fake(dy, 2 * qweight.shape[1], need_dx, need_dbias)


def nf4_arguments(packed: torch.Tensor, state: NF4State) -> tuple:
    """The custom ops' weight arguments of NF4 codes and their state: (packed, absmax, absmax_codes, absmax_scales,
    offset (1,), nested_code, n, k, blocksize)."""
    offset = None if state.offset is None else state.offset.reshape(1)
    n, k = state.shape
    return (packed.reshape(-1), state.absmax, state.absmax_codes, state.absmax_scales, offset, state.nested_code, n,
            k, state.blocksize)  # fmt: skip
