"""Flash attention's launchers: validate the public arguments, allocate, launch (tensors in, tensors out; ``plan=``).

One forward and one backward launcher serve the dense layouts and packed sequences: q, k, v arrive as
(B, H, S, D) with ``heads_dim=1``, (B, S, H, D) with ``heads_dim=2``, or packed (total, H, D) with cu_seqlens; the
kernels see (batch, head, row) strides and a unit-stride head dim (a tensor whose last dim is strided is copied once).
"""

from __future__ import annotations

import itertools
import math

import torch

from tritonkit._core.checks import FLOAT_DTYPES, check_device, check_same_dtype, check_tensor
from tritonkit._core.device import arch, l2_bytes, pipeline_depth, sm_count
from tritonkit._core.env import upcast_bf16_dots
from tritonkit._core.ints import cdiv, next_power_of_2
from tritonkit._core.tma import descriptor, has_tma, tma_readable
from tritonkit.ops.flash_attention.kernels import (
    _attention_bwd_delta_kernel,
    _attention_bwd_dkdv_kernel,
    _attention_bwd_dq_kernel,
    _attention_fwd_kernel,
)
from tritonkit.ops.flash_attention.plan import FEW_DKDV_PROGRAMS_PER_SM, AttentionPlan, Tiles, attention_plan

LAYOUTS = {"bhsd": 1, "bshd": 2}  # layout -> the dimension of q, k and v that indexes heads
MAX_HEAD_DIM = 256  # the widest tile the plans hold: q, k and v blocks of 256 columns in registers and shared memory
# A window side no position reaches: positions stay below 2**30, so that position +- bound fits int32.
UNBOUNDED = 1 << 30
LOG2_E = math.log2(math.e)


def _check_window(name: str, window, causal: bool) -> tuple[int, int]:
    """(left, right) as the kernels take them: -1 becomes UNBOUNDED; causal is right = 0."""
    if not isinstance(window, (tuple, list)) or len(window) != 2:
        raise TypeError(f"{name}: window must be a pair (left, right) of ints, got {window!r}")
    for side, value in zip(("left", "right"), window, strict=True):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name}: window's {side} must be an int (-1: unbounded), got {type(value).__name__}")
        if value < -1:
            raise ValueError(f"{name}: window's {side} must be -1 (unbounded) or >= 0, got {value}")
    left, right = window
    if causal and right > 0:
        raise ValueError(f"{name}: causal=True means window right = 0 (no key after the query), got window={window!r};"
                         " pass causal=False with window=(left, right) for a window that looks ahead")  # fmt: skip
    left = UNBOUNDED if left < 0 else min(left, UNBOUNDED)
    right = 0 if causal else (UNBOUNDED if right < 0 else min(right, UNBOUNDED))
    return left, right


def check_options(name: str, head_dim: int, causal, scale, window, softcap,
                  deterministic) -> tuple[float, int, int, float]:  # fmt: skip
    """Validate the options shared by the dense and packed ops; return (scale, left, right, softcap)."""
    for arg, flag in (("causal", causal), ("deterministic", deterministic)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name}: {arg} must be a bool, got {type(flag).__name__}")
    if scale is None:
        scale = 1.0 / math.sqrt(head_dim) if head_dim else 1.0
    elif isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise TypeError(f"{name}: scale must be a finite float or None (1/sqrt(head_dim)), got {scale!r}")
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)) or not math.isfinite(softcap):
        raise TypeError(f"{name}: softcap must be a finite float (0: no cap), got {softcap!r}")
    if softcap < 0:
        raise ValueError(f"{name}: softcap must be >= 0 (0: no cap), got {softcap}")
    left, right = _check_window(name, window, causal)
    return float(scale), left, right, float(softcap)


def _check_qkv(name: str, q, k, v, ndim: int, dims: str) -> None:
    for arg, x in (("q", q), ("k", k), ("v", v)):
        check_tensor(f"{name}: {arg}", x, ndim=ndim, dtypes=FLOAT_DTYPES)
    check_same_dtype(f"{name}: q", q, "k", k)
    check_same_dtype(f"{name}: q", q, "v", v)
    if k.shape != v.shape:
        raise ValueError(f"{name}: k and v must have the same shape {dims}, got {tuple(k.shape)} and {tuple(v.shape)}")
    check_device(q=q, k=k, v=v)


def _check_heads_and_dim(name: str, q, k, heads_dim: int, dims: str) -> None:
    n_heads_q, n_heads_k, head_dim = q.shape[heads_dim], k.shape[heads_dim], q.shape[-1]
    if k.shape[-1] != head_dim:
        raise ValueError(f"{name}: q and k must have the same head_dim {dims}, got shapes {tuple(q.shape)} and "
                         f"{tuple(k.shape)}")  # fmt: skip
    if not 1 <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(f"{name}: head_dim must be in [1, {MAX_HEAD_DIM}], got {head_dim}")
    if n_heads_k == 0 or n_heads_q % n_heads_k:
        raise ValueError(f"{name}: the number of q heads must be a multiple of the number of k and v heads (GQA), got "
                         f"{n_heads_q} and {n_heads_k}")  # fmt: skip


def check_dense(q, k, v, layout: str, causal: bool) -> int:
    """Validate dense q, k, v; return heads_dim."""
    name = "attention"
    if layout not in LAYOUTS:
        raise ValueError(f"{name}: layout must be one of {tuple(LAYOUTS)}, got {layout!r}")
    heads_dim = LAYOUTS[layout]
    dims = "(batch, heads, seq, head_dim)" if layout == "bhsd" else "(batch, seq, heads, head_dim)"
    _check_qkv(name, q, k, v, 4, dims)
    if q.shape[0] != k.shape[0]:
        raise ValueError(f"{name}: q and k must have the same batch size {dims}, got shapes {tuple(q.shape)} and "
                         f"{tuple(k.shape)}")  # fmt: skip
    _check_heads_and_dim(name, q, k, heads_dim, dims)
    n_keys = k.shape[3 - heads_dim]
    if n_keys == 0 and not causal and q.numel():
        raise ValueError(f"{name}: k and v hold no keys (seq length 0) and causal=False: every query would attend to "
                         "nothing; pass at least one key")  # fmt: skip
    return heads_dim


def check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, check_values: bool) -> None:
    """Validate packed q, k, v and their cu_seqlens; the values of cu_seqlens only when ``check_values`` (reading
    them synchronises with the GPU)."""
    name = "attention_varlen"
    dims = "(total_tokens, heads, head_dim)"
    _check_qkv(name, q, k, v, 3, dims)
    _check_heads_and_dim(name, q, k, 1, dims)
    for arg, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        check_tensor(f"{name}: {arg}", cu, ndim=1, dtypes=(torch.int32,))
        if cu.shape[0] < 2:
            raise ValueError(f"{name}: {arg} must hold batch + 1 >= 2 offsets, got shape {tuple(cu.shape)}")
    if cu_seqlens_q.shape != cu_seqlens_k.shape:
        raise ValueError(f"{name}: cu_seqlens_q and cu_seqlens_k must have the same length (batch + 1), got "
                         f"{cu_seqlens_q.shape[0]} and {cu_seqlens_k.shape[0]}")  # fmt: skip
    check_device(q=q, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)
    for arg, value in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name}: {arg} must be an int, got {type(value).__name__}")
        if not 0 <= value < UNBOUNDED:
            raise ValueError(f"{name}: {arg} must be in [0, 2**30), got {value}")
    if check_values:
        for arg, cu, total, longest in (("cu_seqlens_q", cu_seqlens_q, q.shape[0], max_seqlen_q),
                                        ("cu_seqlens_k", cu_seqlens_k, k.shape[0], max_seqlen_k)):  # fmt: skip
            values = cu.tolist()
            lengths = [b - a for a, b in itertools.pairwise(values)]
            if values[0] != 0 or values[-1] != total or min(lengths) < 0:
                raise ValueError(f"{name}: {arg} must rise from 0 to the packed length {total} without decreasing, "
                                 f"got {values}")  # fmt: skip
            if max(lengths) > longest:
                raise ValueError(f"{name}: {arg} holds a sequence of {max(lengths)} tokens, longer than its max "
                                 f"({longest})")  # fmt: skip


def _unit_last(x: torch.Tensor) -> torch.Tensor:
    """x, or a copy of it whose head dim has unit stride (what the kernels read); an expanded gradient lands here."""
    return x if x.stride(-1) == 1 or x.shape[-1] == 1 else x.contiguous()


def _strides(x: torch.Tensor, heads_dim: int, packed: bool) -> tuple[int, int, int]:
    """x's (batch, head, row) strides: a packed tensor (total, H, D) has no batch stride (rows start at cu_seqlens)."""
    if packed:
        return 0, x.stride(1), x.stride(0)
    return x.stride(0), x.stride(heads_dim), x.stride(3 - heads_dim)


def _lse_shape(q: torch.Tensor, heads_dim: int, packed: bool) -> tuple[int, ...]:
    if packed:
        return q.shape[1], q.shape[0]
    return q.shape[0], q.shape[heads_dim], q.shape[3 - heads_dim]


def _lse_strides(lse: torch.Tensor, packed: bool) -> tuple[int, int]:
    return (0, lse.stride(0)) if packed else (lse.stride(0), lse.stride(1))


def _problem(q, k, cu_seqlens_q, max_seqlen_q, max_seqlen_k, heads_dim):
    """(batch, q heads, k heads, rows of q and k (dense) or their maxima (packed), head dim, packed)."""
    packed = cu_seqlens_q is not None
    if packed:
        return cu_seqlens_q.shape[0] - 1, q.shape[1], k.shape[1], max_seqlen_q, max_seqlen_k, q.shape[-1], True
    seq_dim = 3 - heads_dim
    return q.shape[0], q.shape[heads_dim], k.shape[heads_dim], q.shape[seq_dim], k.shape[seq_dim], q.shape[-1], False


def _scales(scale: float, softcap: float) -> tuple[float, float]:
    """(qk_scale, softcap_log2) as the kernels take them (kernels.py's _scores)."""
    if softcap:
        return scale / softcap, softcap * LOG2_E
    return scale * LOG2_E, 0.0


def _dot_flags(dtype: torch.dtype) -> dict:
    """fp32 inputs are for checking: their products in full fp32, not TF32. bf16 under the interpreter: products of
    the operands taken to fp32 (dot_fp32)."""
    return {"DOT_PRECISION": "ieee" if dtype == torch.float32 else "tf32", "UPCAST": upcast_bf16_dots(dtype)}


# CUDA's limit on a grid's second axis.
_MAX_GRID_Y = 65535


def _heads_fastest(k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether the grid runs the heads fastest (the same blocks of many heads at once, so that under a causal mask a
    wave starts the longest programs of every head): where every head's K and V fit in L2. Larger ones run a head's
    blocks together, which read its K and V from L2. Heads-fastest against blocks-fastest on the H200 (forward /
    backward): 1.20x / 1.33x at 8 MB of K and V (B1 H32:8 N4096 d64 causal), 1.02x / 1.12x at 32 MB (B2 H32:8
    d128 causal), 0.97-1.08x at 64 MB, 0.85x / 0.91x at 256 MB (B4 H32 N4096 d128)."""
    return k.numel() * k.element_size() + v.numel() * v.element_size() <= l2_bytes(k.device)


def _grid(heads: int, seqlen: int, block: int, heads_fastest: bool) -> tuple[int, int]:
    """The (heads, blocks) grid in the order _program_blocks reads (see _heads_fastest)."""
    blocks = cdiv(seqlen, block)
    second = blocks if heads_fastest else heads
    if second > _MAX_GRID_Y:
        raise ValueError(
            f"attention: the launch grid's second axis would hold {second} programs ({blocks} blocks of {block} "
            f"tokens x {heads} batch-heads), more than CUDA's {_MAX_GRID_Y}; split the batch or the sequences"
        )
    return (heads, blocks) if heads_fastest else (blocks, heads)


def attention_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor | None,
    cu_seqlens_k: torch.Tensor | None,
    max_seqlen_q: int,
    max_seqlen_k: int,
    heads_dim: int,
    scale: float,
    window_left: int,
    window_right: int,
    softcap: float,
    *,
    plan: AttentionPlan | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(O, lse): O in q's shape and dtype (contiguous), lse fp32 (B, Hq, Sq), or (Hq, total_q) when packed.
    ``plan``: the measured plan unless a sweep or a test gives one."""
    n_batch, n_heads_q, n_heads_k, seqlen_q, seqlen_k, head_dim, packed = _problem(
        q, k, cu_seqlens_q, max_seqlen_q, max_seqlen_k, heads_dim)  # fmt: skip
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(_lse_shape(q, heads_dim, packed), dtype=torch.float32, device=q.device)
    if out.numel() == 0:
        return out, lse
    q, k, v = _unit_last(q), _unit_last(k), _unit_last(v)
    block_d = max(16, next_power_of_2(head_dim))
    tiles = (plan or attention_plan(arch(q.device), block_d, q.element_size())).forward
    stages = pipeline_depth(tiles.stages, 2 * tiles.block_n * block_d * q.element_size(), q.device)
    qk_scale, softcap_log2 = _scales(scale, softcap)
    heads_fastest = _heads_fastest(k, v)
    grid = _grid(n_batch * n_heads_q, seqlen_q, tiles.block_m, heads_fastest)
    desc_k, desc_v = _descriptors((k, v), heads_dim, packed, tiles, tiles.block_n, block_d)
    _attention_fwd_kernel[grid](
        q, k, v, desc_k, desc_v, out, lse, cu_seqlens_q, cu_seqlens_k,
        seqlen_q, seqlen_k, n_heads_q, n_heads_q // n_heads_k, head_dim, window_left, window_right, qk_scale,
        softcap_log2,
        *_strides(q, heads_dim, packed), *_strides(k, heads_dim, packed), *_strides(v, heads_dim, packed),
        *_strides(out, heads_dim, packed), *_lse_strides(lse, packed),
        IS_VARLEN=packed, SOFTCAP=softcap != 0.0, RAW_MAX=softcap == 0.0 and scale > 0.0, **_dot_flags(q.dtype),
        BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, BLOCK_D=block_d, EVEN_D=block_d == head_dim,
        DESCRIPTORS=desc_k is not None, SEQ_FIRST=heads_dim == 2, HEADS_FASTEST=heads_fastest, num_warps=tiles.warps,
        num_stages=stages,
    )  # fmt: skip
    return out, lse


def _descriptors(operands, heads_dim: int, packed: bool, tiles: Tiles, rows: int, block_d: int) -> tuple:
    """Tensor descriptors of the dense tensors ``operands`` that a kernel streams (4-D, in their own dimension order,
    one head's rows x block_d a box) where its ``tiles`` ask for them, the GPU has TMA and every stride but the head
    dim's is a positive multiple of 16 bytes (an expanded head or gradient, stride 0, is not); else Nones: pointer
    loads."""
    if not tiles.descriptors or packed or not has_tma(arch(operands[0].device)):
        return (None,) * len(operands)
    if not all(tma_readable(x) for x in operands):
        return (None,) * len(operands)
    box = [1, rows, 1, block_d] if heads_dim == 2 else [1, 1, rows, block_d]
    return tuple(descriptor(x, box) for x in operands)


def _dkdv_tiles(plan: AttentionPlan, heads: int, seqlen_k: int, device: torch.device) -> Tiles:
    """The plan's dK/dV tiles, or its dkdv_few where those would launch too few programs to fill the GPU."""
    if plan.dkdv_few is None:
        return plan.dkdv
    programs = heads * cdiv(seqlen_k, plan.dkdv.block_n)
    return plan.dkdv_few if programs < FEW_DKDV_PROGRAMS_PER_SM * sm_count(device) else plan.dkdv


def attention_bwd(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    cu_seqlens_q: torch.Tensor | None,
    cu_seqlens_k: torch.Tensor | None,
    max_seqlen_q: int,
    max_seqlen_k: int,
    heads_dim: int,
    scale: float,
    window_left: int,
    window_right: int,
    softcap: float,
    *,
    plan: AttentionPlan | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dQ, dK, dV) in q's, k's and v's shapes and dtype, for the upstream gradient ``grad_out`` (any strides,
    expanded included) of the forward's ``out`` and ``lse``. Each gradient is written once, by one program, so
    every run gives the same bits."""
    n_batch, n_heads_q, n_heads_k, seqlen_q, seqlen_k, head_dim, packed = _problem(
        q, k, cu_seqlens_q, max_seqlen_q, max_seqlen_k, heads_dim)  # fmt: skip
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    if dk.numel() == 0 or q.numel() == 0:  # no keys, or no queries: every gradient is zero
        return torch.zeros(q.shape, dtype=q.dtype, device=q.device), dk.zero_(), dv.zero_()
    q, k, v, grad_out = _unit_last(q), _unit_last(k), _unit_last(v), _unit_last(grad_out)
    block_d = max(16, next_power_of_2(head_dim))
    plan = plan or attention_plan(arch(q.device), block_d, q.element_size())
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    qk_scale, softcap_log2 = _scales(scale, softcap)
    shared = dict(IS_VARLEN=packed, SOFTCAP=softcap != 0.0, BLOCK_D=block_d, EVEN_D=block_d == head_dim,
                  **_dot_flags(q.dtype))  # fmt: skip
    delta = torch.empty_like(lse)
    lse_strides = _lse_strides(lse, packed)
    rows = plan.dq.block_m
    _attention_bwd_delta_kernel[(cdiv(seqlen_q, rows), n_batch * n_heads_q)](
        out, grad_out, delta, cu_seqlens_q, seqlen_q, n_heads_q, head_dim,
        *_strides(out, heads_dim, packed), *_strides(grad_out, heads_dim, packed), *lse_strides,
        IS_VARLEN=packed, BLOCK_M=rows, BLOCK_D=block_d, num_warps=4,
    )  # fmt: skip
    operands = (q, k, v, grad_out, lse, delta)
    operand_strides = tuple(stride for x in (q, k, v, grad_out) for stride in _strides(x, heads_dim, packed))
    operand_strides += lse_strides
    options = (head_dim, window_left, window_right, qk_scale, softcap_log2, scale)
    tiles = _dkdv_tiles(plan, n_batch * n_heads_k, seqlen_k, q.device)
    stages = pipeline_depth(tiles.stages, 2 * tiles.block_m * block_d * q.element_size(), q.device)
    desc_q, desc_do = _descriptors((q, grad_out), heads_dim, packed, tiles, tiles.block_m, block_d)
    heads_fastest = _heads_fastest(k, v)
    _attention_bwd_dkdv_kernel[_grid(n_batch * n_heads_k, seqlen_k, tiles.block_n, heads_fastest)](
        *operands, desc_q, desc_do, dk, dv, cu_seqlens_q, cu_seqlens_k, seqlen_q, seqlen_k, n_heads_k,
        n_heads_q // n_heads_k, *options, *operand_strides, *_strides(dk, heads_dim, packed),
        *_strides(dv, heads_dim, packed), BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n,
        DESCRIPTORS=desc_q is not None, SEQ_FIRST=heads_dim == 2, HEADS_FASTEST=heads_fastest, num_warps=tiles.warps,
        num_stages=stages, **shared,
    )  # fmt: skip
    tiles = plan.dq
    stages = pipeline_depth(tiles.stages, 2 * tiles.block_n * block_d * q.element_size(), q.device)
    desc_k, desc_v = _descriptors((k, v), heads_dim, packed, tiles, tiles.block_n, block_d)
    _attention_bwd_dq_kernel[_grid(n_batch * n_heads_q, seqlen_q, tiles.block_m, heads_fastest)](
        *operands, desc_k, desc_v, dq, cu_seqlens_q, cu_seqlens_k, seqlen_q, seqlen_k, n_heads_q,
        n_heads_q // n_heads_k, *options, *operand_strides, *_strides(dq, heads_dim, packed),
        BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, DESCRIPTORS=desc_k is not None, SEQ_FIRST=heads_dim == 2,
        HEADS_FASTEST=heads_fastest, num_warps=tiles.warps, num_stages=stages, **shared,
    )  # fmt: skip
    return dq, dk, dv


def attention_fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, heads_dim, scale,
                       window_left, window_right, softcap):  # fmt: skip
    packed = cu_seqlens_q is not None
    return q.new_empty(q.shape), q.new_empty(_lse_shape(q, heads_dim, packed), dtype=torch.float32)


def attention_bwd_fake(grad_out, q, k, v, out, lse, *options):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)
