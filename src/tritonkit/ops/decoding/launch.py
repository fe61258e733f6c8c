"""Flash decoding's launchers: validate, allocate, launch (tensors in, tensors out; ``plan=``).

A cache is a pair of tensors (k_cache, v_cache) of one shape: contiguous (B, S_max, Hk, D) or paged
(num_pages, page_size, Hk, D) with a block table (B, max_pages) int32. Its format follows from its dtype: q's dtype
("plain"), int8, float8_e4m3fn ("fp8") or uint8 ("int4", two values per byte: the last dim is D / 2). Quantized
caches carry scales: fp32 (..., Hk) per token and head (int8, fp8), or fp16 (..., Hk, D / G, 2) holding a
(scale, zero) pair per group of G values (int4). kernels.py's docstring defines the formats.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from tritonkit._core.checks import FLOAT_DTYPES, check_device, check_tensor, debug_checks
from tritonkit._core.device import arch, arch_number, converts_e4m3_pairs, converts_to_float8_rounding, sm_count
from tritonkit._core.env import kernels_interpreted, upcast_bf16_dots
from tritonkit._core.ints import cdiv, next_power_of_2
from tritonkit.ops.decoding.kernels import (
    _decode_kernel,
    _decode_reduce_kernel,
    _dequantize_kv_kernel,
    _kv_append_kernel,
    _quantize_kv_kernel,
)
from tritonkit.ops.decoding.plan import APPEND_TOKENS, MAX_SPLITS, PDL_ARCH, DecodePlan, choose_splits, decode_plan

# Storage dtype of each quantized format, and of its scales.
FORMATS = {"int8": torch.int8, "fp8": torch.float8_e4m3fn, "int4": torch.uint8}
SCALE_DTYPES = {"int8": torch.float32, "fp8": torch.float32, "int4": torch.float16}
MAX_HEAD_DIM = 256  # the widest q and cache tiles the plans hold in registers
MAX_NEW_TOKENS = 16  # queries per sequence: decoding and speculative verification; longer prompts take attention
INT4_GROUP = 32  # int4's default group along D: 16 bytes of codes and 4 of fp16 scale and zero per 32 values
UNBOUNDED = 1 << 30  # a window no position reaches (positions stay below 2**30)
LOG2_E = math.log2(math.e)
_QUANTIZE_ROWS = 16  # rows per program of quantize_kv and dequantize_kv: a 16 x 256 fp32 tile per program at most


@dataclass(frozen=True)
class Cache:
    """What the kernels need to know of a validated cache."""

    format: str  # "plain", "int8", "fp8" or "int4"
    paged: bool
    page_size: int  # paged: tokens per page; contiguous: 1 (unused)
    capacity: int  # tokens one sequence can hold
    n_pages: int  # paged: pages in the pool; contiguous: the batch
    n_heads: int
    group: int  # int4: values per (scale, zero) group; else 0


def _format(name: str, arg: str, cache: torch.Tensor, dtype: torch.dtype) -> str:
    if cache.dtype == dtype:
        return "plain"
    for fmt, storage in FORMATS.items():
        if cache.dtype == storage:
            return fmt
    raise TypeError(f"{name}: {arg} must have dtype {dtype} (the new keys' and values'), int8, float8_e4m3fn or uint8 "
                    f"(int4 pairs), got {cache.dtype}")  # fmt: skip


def _check_scales(name: str, fmt: str, cache_shape, head_dim: int, k_scales, v_scales) -> None:
    """Validate the scales of a cache of format ``fmt``."""
    if fmt == "plain":
        for arg, scales in (("k_scales", k_scales), ("v_scales", v_scales)):
            if scales is not None:
                raise ValueError(f"{name}: {arg} was given for a cache that is not quantized; pass None")
        return
    for arg, scales in (("k_scales", k_scales), ("v_scales", v_scales)):
        if scales is None:
            raise ValueError(f"{name}: a {fmt} cache needs {arg} (quantize_kv's scales), got None")
        check_tensor(f"{name}: {arg}", scales, dtypes=(SCALE_DTYPES[fmt],))
        if fmt == "int4":
            groups = scales.shape[3] if scales.dim() == 5 else 0
            expected = (*cache_shape[:3], "D / group", 2)
            if scales.dim() != 5 or tuple(scales.shape[:3]) != tuple(cache_shape[:3]) or scales.shape[4] != 2:
                raise ValueError(
                    f"{name}: {arg} of an int4 cache must have shape {expected}, got {tuple(scales.shape)}"
                )
            if groups == 0 or head_dim % groups or not _valid_group(head_dim // groups):
                raise ValueError(f"{name}: {arg} holds {groups} groups for head_dim {head_dim}; the group size "
                                 "head_dim / groups must be an even power of two")  # fmt: skip
        elif tuple(scales.shape) != tuple(cache_shape[:3]):
            raise ValueError(f"{name}: {arg} of a {fmt} cache must have shape {tuple(cache_shape[:3])} (one scale "
                             f"per token and head), got {tuple(scales.shape)}")  # fmt: skip
    if k_scales.shape != v_scales.shape:
        raise ValueError(f"{name}: k_scales and v_scales must have the same shape, got {tuple(k_scales.shape)} and "
                         f"{tuple(v_scales.shape)}")  # fmt: skip


def _valid_group(group: int) -> bool:
    return group >= 2 and group & (group - 1) == 0


def check_cache(name: str, batch: int, heads_q: int | None, head_dim: int, dtype: torch.dtype, k_cache, v_cache,
                block_table, k_scales, v_scales) -> Cache:  # fmt: skip
    """Validate a cache for ``batch`` sequences of ``head_dim`` values whose plain format is ``dtype``; ``heads_q``:
    the query heads it serves (None: the new keys' heads must equal the cache's, checked by the caller)."""
    for arg, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        check_tensor(f"{name}: {arg}", cache, ndim=4)
    if k_cache.shape != v_cache.shape or k_cache.dtype != v_cache.dtype:
        raise ValueError(f"{name}: k_cache and v_cache must have one shape and dtype, got {tuple(k_cache.shape)} "
                         f"{k_cache.dtype} and {tuple(v_cache.shape)} {v_cache.dtype}")  # fmt: skip
    fmt = _format(name, "k_cache", k_cache, dtype)
    width = head_dim // 2 if fmt == "int4" else head_dim
    if fmt == "int4" and head_dim % 2:
        raise ValueError(f"{name}: an int4 cache holds two values per byte, so head_dim must be even, got {head_dim}")
    if k_cache.shape[3] != width:
        raise ValueError(f"{name}: the cache's last dim must be {width} (head_dim {head_dim}"
                         f"{' / 2 for int4' if fmt == 'int4' else ''}), got shape {tuple(k_cache.shape)}")  # fmt: skip
    for arg, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        if cache.stride(3) != 1 and width > 1:
            raise ValueError(f"{name}: {arg} must have unit stride along its last dim (it is written in place, so it "
                             f"is never copied), got strides {cache.stride()}")  # fmt: skip
    n_heads = k_cache.shape[2]
    if n_heads == 0 or (heads_q is not None and heads_q % n_heads):
        raise ValueError(f"{name}: the number of q heads must be a multiple of the cache's heads (GQA), got {heads_q} "
                         f"and {n_heads}")  # fmt: skip
    _check_scales(name, fmt, k_cache.shape, head_dim, k_scales, v_scales)
    tensors = {"k_cache": k_cache, "v_cache": v_cache}
    if fmt != "plain":
        tensors.update(k_scales=k_scales, v_scales=v_scales)
    if block_table is None:
        if k_cache.shape[0] != batch:
            raise ValueError(f"{name}: a contiguous cache (B, S_max, Hk, D) must have the batch's {batch} rows, got "
                             f"shape {tuple(k_cache.shape)} (pass block_table for a paged cache)")  # fmt: skip
        check_device(**tensors)
    else:
        check_tensor(f"{name}: block_table", block_table, ndim=2, dtypes=(torch.int32,))
        if block_table.shape[0] != batch:
            raise ValueError(f"{name}: block_table must have one row per sequence ({batch}), got shape "
                             f"{tuple(block_table.shape)}")  # fmt: skip
        page_size = k_cache.shape[1]
        if page_size != 1 and page_size % 16:
            raise ValueError(f"{name}: page_size (the paged cache's dim 1) must be 1 or a multiple of 16, got "
                             f"{page_size}")  # fmt: skip
        check_device(**tensors, block_table=block_table)
    return describe_cache(k_cache, block_table, k_scales, dtype, head_dim)


def describe_cache(k_cache, block_table, k_scales, dtype: torch.dtype, head_dim: int) -> Cache:
    """The Cache of validated tensors (no checks: the launchers' path)."""
    fmt = "plain" if k_cache.dtype == dtype else {storage: f for f, storage in FORMATS.items()}[k_cache.dtype]
    group = head_dim // k_scales.shape[3] if fmt == "int4" else 0
    if block_table is None:
        return Cache(fmt, False, 1, k_cache.shape[1], k_cache.shape[0], k_cache.shape[2], group)
    return Cache(fmt, True, k_cache.shape[1], block_table.shape[1] * k_cache.shape[1], k_cache.shape[0],
                 k_cache.shape[2], group)  # fmt: skip


def check_values(name: str, cache: Cache, cache_seqlens, block_table, new_tokens: int) -> None:
    """The checks that read device values (a host synchronisation): every length in [0, capacity - new_tokens],
    every page a sequence uses inside the pool."""
    lengths = cache_seqlens.tolist()
    room = cache.capacity - new_tokens
    for b, length in enumerate(lengths):
        if not 0 <= length <= room:
            what = "cache_seqlens" if new_tokens == 0 else "cache_seqlens + the new tokens"
            raise ValueError(f"{name}: {what} of sequence {b} must be in [0, {cache.capacity}] (the cache's "
                             f"capacity), got {length + new_tokens}")  # fmt: skip
    if block_table is not None:
        for b, length in enumerate(lengths):
            pages = block_table[b, : cdiv(length + new_tokens, cache.page_size)].tolist()
            bad = [page for page in pages if not 0 <= page < cache.n_pages]
            if bad:
                raise ValueError(f"{name}: block_table row {b} points at page {bad[0]}, outside the pool of "
                                 f"{cache.n_pages} pages")  # fmt: skip


def check_seqlens(name: str, cache_seqlens, batch: int, device) -> None:
    check_tensor(f"{name}: cache_seqlens", cache_seqlens, ndim=1, dtypes=(torch.int32,))
    if cache_seqlens.shape[0] != batch:
        raise ValueError(f"{name}: cache_seqlens must hold one length per sequence ({batch}), got shape "
                         f"{tuple(cache_seqlens.shape)}")  # fmt: skip
    if cache_seqlens.device != device:
        raise ValueError(f"{name}: cache_seqlens must be on {device}, got {cache_seqlens.device}")


def wants_value_checks(name: str, requested, cache_seqlens) -> bool:
    """Value checks on request, with TRITONKIT_DEBUG=1, and always for CPU tensors (no synchronisation to save);
    never while torch.compile traces, which has no values to read."""
    wanted = debug_checks(f"{name}: check_inputs", requested) or cache_seqlens.device.type == "cpu"
    return wanted and not torch.compiler.is_compiling()


def _code_parts(cache: Cache, k_cache, v_cache, k_scales, v_scales, dtype, block_d: int, plan: DecodePlan,
                device_arch: str, n_splits: int = 1) -> tuple:  # fmt: skip
    """(parts, k, v, k_scales, v_scales): how the kernel reads a quantized cache by parts of the head dim (4: int4
    by quarters, 2: int8 or fp8 by halves with ``plan.code_halves`` where each of ``n_splits`` splits of the
    capacity spans at least ``plan.code_halves_min_blocks`` key blocks; 0: whole tiles, the tensors as given) and the
    tensors it then takes: the data as int16 halfwords, int4's scales one (scale, zero) pair an int32 word (the pair
    dim dropped). Parts need a 16-bit q, every halfword (and pair) aligned, parts of at least 16 values (a product's
    depth); int4 groups of at least 4 values; e4m3's conversion of two codes at once, sm_89 or newer."""
    as_given = (0, k_cache, v_cache, k_scales, v_scales)
    if dtype == torch.float32:
        return as_given  # products in fp32
    if cache.format == "int4":
        parts = 4 if cache.group >= 4 and block_d >= 64 else 0
    elif cache.format in ("int8", "fp8") and plan.code_halves:
        long_splits = plan.split_blocks(cache.capacity, n_splits) >= plan.code_halves_min_blocks
        fp8_ok = cache.format == "int8" or converts_e4m3_pairs(device_arch)  # the interpreter's arch is sm90
        parts = 2 if block_d >= 32 and fp8_ok and long_splits else 0
    else:
        parts = 0
    for data in (k_cache, v_cache):
        aligned = data.storage_offset() % 2 == 0 and all(data.stride(d) % 2 == 0 for d in range(3))
        if data.stride(3) != 1 or data.shape[3] % 2 or not aligned:
            parts = 0
    if parts == 4:
        for scales in (k_scales, v_scales):
            if scales.stride(4) != 1 or scales.storage_offset() % 2 or any(scales.stride(d) % 2 for d in range(4)):
                parts = 0
    if parts == 0:
        return as_given
    halves = (x.view(torch.int16) for x in (k_cache, v_cache))
    if parts == 4:
        return (parts, *halves, *(x.view(torch.int32).squeeze(4) for x in (k_scales, v_scales)))
    return (parts, *halves, k_scales, v_scales)


def _cache_strides(cache: torch.Tensor) -> tuple[int, int, int]:
    return cache.stride(0), cache.stride(1), cache.stride(2)


def _scale_strides(scales: torch.Tensor | None) -> tuple[int, int, int, int, int]:
    """(page, slot, head, group, zero) strides of a cache's scales; zeros where the format has no such dim."""
    if scales is None:
        return 0, 0, 0, 0, 0
    strides = tuple(scales.stride())
    return strides + (0,) * (5 - len(strides))


def _table_args(block_table: torch.Tensor | None, k_cache: torch.Tensor):
    """(the table with unit stride along its rows, or a stand-in pointer when contiguous, and its row stride)."""
    if block_table is None:
        return k_cache, 0
    block_table = block_table if block_table.stride(1) == 1 else block_table.contiguous()
    return block_table, block_table.stride(0)


def _unit_stride(x: torch.Tensor) -> torch.Tensor:
    """x, or a copy with unit stride along its last dim (the kernels read it so; an expanded tensor lands here)."""
    return x if x.stride(-1) == 1 or x.shape[-1] <= 1 else x.contiguous()


def _block_d(head_dim: int) -> int:
    return max(16, next_power_of_2(head_dim))


def _check_float(name: str, arg: str, value, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TypeError(f"{name}: {arg} must be a finite float, got {value!r}")


def _check_int(name: str, arg: str, value, lowest: int, highest: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: {arg} must be an int, got {type(value).__name__}")
    if not lowest <= value <= highest:
        raise ValueError(f"{name}: {arg} must be in [{lowest}, {highest}], got {value}")


def check_decode(q, k_cache, v_cache, cache_seqlens, block_table, k_scales, v_scales, scale, causal, window, softcap,
                 num_splits, check_inputs) -> float:  # fmt: skip
    """Validate decode_attention's arguments; return the scale (1/sqrt(D) when None)."""
    name = "decode_attention"
    check_tensor(f"{name}: q", q, ndim=4, dtypes=FLOAT_DTYPES)
    n_batch, n_queries, n_heads_q, head_dim = q.shape
    if n_queries > MAX_NEW_TOKENS:
        raise ValueError(f"{name}: q holds {n_queries} new tokens per sequence (dim 1 of (B, Sq, Hq, D)); decoding "
                         f"takes at most {MAX_NEW_TOKENS} (attention_varlen takes prompts)")  # fmt: skip
    if not 1 <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(f"{name}: head_dim must be in [1, {MAX_HEAD_DIM}], got {head_dim}")
    cache = check_cache(name, n_batch, n_heads_q, head_dim, q.dtype, k_cache, v_cache, block_table, k_scales, v_scales)
    check_device(q=q, k_cache=k_cache)
    check_seqlens(name, cache_seqlens, n_batch, q.device)
    if not isinstance(causal, bool):
        raise TypeError(f"{name}: causal must be a bool, got {type(causal).__name__}")
    _check_float(name, "scale", scale, allow_none=True)
    _check_float(name, "softcap", softcap)
    if softcap < 0:
        raise ValueError(f"{name}: softcap must be >= 0 (0: no cap), got {softcap}")
    _check_int(name, "window", window, -1, UNBOUNDED - 1)
    _check_int(name, "num_splits", num_splits, 0, MAX_SPLITS)
    if wants_value_checks(name, check_inputs, cache_seqlens):
        check_values(name, cache, cache_seqlens, block_table, 0)
    return 1.0 / math.sqrt(head_dim) if scale is None else float(scale)


def check_append(k_new, v_new, k_cache, v_cache, cache_seqlens, block_table, k_scales, v_scales, check_inputs) -> None:
    name = "kv_cache_append"
    for arg, x in (("k_new", k_new), ("v_new", v_new)):
        check_tensor(f"{name}: {arg}", x, ndim=4, dtypes=FLOAT_DTYPES)
    if k_new.shape != v_new.shape or k_new.dtype != v_new.dtype:
        raise ValueError(f"{name}: k_new and v_new must have one shape (B, Sq, Hk, D) and dtype, got "
                         f"{tuple(k_new.shape)} {k_new.dtype} and {tuple(v_new.shape)} {v_new.dtype}")  # fmt: skip
    n_batch, n_new, n_heads, head_dim = k_new.shape
    if not 1 <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(f"{name}: head_dim must be in [1, {MAX_HEAD_DIM}], got {head_dim}")
    cache = check_cache(name, n_batch, None, head_dim, k_new.dtype, k_cache, v_cache, block_table, k_scales, v_scales)
    if cache.n_heads != n_heads:
        raise ValueError(f"{name}: k_new has {n_heads} heads (dim 2 of (B, Sq, Hk, D)) and the cache {cache.n_heads}")
    check_device(k_new=k_new, v_new=v_new, k_cache=k_cache)
    check_seqlens(name, cache_seqlens, n_batch, k_new.device)
    if wants_value_checks(name, check_inputs, cache_seqlens):
        check_values(name, cache, cache_seqlens, block_table, n_new)


def decode_attention_fwd(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
    block_table: torch.Tensor | None,
    k_scales: torch.Tensor | None,
    v_scales: torch.Tensor | None,
    scale: float,
    causal: bool,
    window: int,
    softcap: float,
    num_splits: int,
    *,
    plan: DecodePlan | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out (B, Sq, Hq, D) in q's dtype, lse (B, Hq, Sq) fp32) of validated arguments; ``window`` -1 is unbounded,
    ``num_splits`` 0 picks the split (plan.choose_splits)."""
    n_batch, n_queries, n_heads_q, head_dim = q.shape
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((n_batch, n_heads_q, n_queries), dtype=torch.float32, device=q.device)
    if out.numel() == 0:
        return out, lse
    cache = describe_cache(k_cache, block_table, k_scales, q.dtype, head_dim)
    q, cache_seqlens = _unit_stride(q), _unit_stride(cache_seqlens)
    block_d = _block_d(head_dim)
    device_arch = arch(q.device)
    plan = plan or decode_plan(device_arch, block_d, cache.format)
    pdl = plan.pdl and not kernels_interpreted()  # the interpreter has no launches to overlap
    if pdl and arch_number(device_arch) < PDL_ARCH:
        raise ValueError(f"decode_attention: DecodePlan.pdl needs sm_{PDL_ARCH} or newer, got {device_arch}")
    group = n_heads_q // cache.n_heads
    rows = group * n_queries
    block_m = max(16, min(next_power_of_2(rows), plan.max_rows))
    row_blocks = cdiv(rows, block_m)
    sms = sm_count(q.device)
    if num_splits == 0:
        num_splits = choose_splits(n_batch * cache.n_heads * row_blocks, cache.capacity, sms, plan)
    part_o = part_lse = out  # stand-ins: one split writes out and lse itself
    if num_splits > 1:
        part_o = torch.empty((n_batch, n_queries, n_heads_q, num_splits, head_dim), dtype=torch.float32,
                             device=q.device)  # fmt: skip
        part_lse = torch.empty(part_o.shape[:4], dtype=torch.float32, device=q.device)
    table, stride_table = _table_args(block_table, k_cache)
    if softcap:
        qk_scale, softcap_log2 = scale / softcap, softcap * LOG2_E
    else:
        qk_scale, softcap_log2 = scale * LOG2_E, 0.0
    grid = (num_splits * row_blocks, n_batch * cache.n_heads)
    warps = plan.warps_for(grid[0] * grid[1], sms)
    parts, k_cache, v_cache, k_scales, v_scales = _code_parts(cache, k_cache, v_cache, k_scales, v_scales, q.dtype,
                                                              block_d, plan, device_arch, num_splits)  # fmt: skip
    _decode_kernel[grid](
        q, k_cache, v_cache, k_scales, v_scales, cache_seqlens, table, out, lse, part_o, part_lse,
        n_queries, n_heads_q, cache.n_heads, group, head_dim, UNBOUNDED if window < 0 else window, cache.capacity,
        cache.n_pages, qk_scale, softcap_log2,
        q.stride(0), q.stride(1), q.stride(2), *_cache_strides(k_cache), *_cache_strides(v_cache),
        *_scale_strides(k_scales), *_scale_strides(v_scales), stride_table,
        out.stride(0), out.stride(1), out.stride(2), lse.stride(0), lse.stride(1),
        KV=cache.format, PAGED=cache.paged, PAGE_SIZE=cache.page_size, CAUSAL=causal, SOFTCAP=softcap != 0.0,
        n_splits=num_splits, SPLIT=num_splits > 1, DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        UPCAST=upcast_bf16_dots(q.dtype) and not parts,  # caches read by parts: fp16 products, whatever q's dtype
        DIRECT_CODES=plan.direct_codes and cache.format in ("int8", "fp8"),
        BLOCK_M=block_m, BLOCK_N=plan.block_n, BLOCK_D=block_d, GROUP=max(cache.group, 2),
        CODE_PARTS=parts, PDL=pdl,
        num_warps=warps, num_stages=plan.stages_for(cache.capacity, num_splits), launch_pdl=pdl,
        **({"maxnreg": plan.max_registers} if plan.max_registers else {}),
    )  # fmt: skip
    if num_splits > 1:
        _decode_reduce_kernel[(n_batch * n_queries * n_heads_q,)](
            part_o, part_lse, out, lse, n_queries, n_heads_q, head_dim,
            out.stride(0), out.stride(1), out.stride(2), lse.stride(0), lse.stride(1), num_splits,
            BLOCK_S=next_power_of_2(num_splits), BLOCK_D=block_d, PDL=pdl, num_warps=4, launch_pdl=pdl,
        )  # fmt: skip
    return out, lse


def decode_attention_fake(q, k_cache, v_cache, cache_seqlens, block_table, k_scales, v_scales, scale, causal, window,
                          softcap, num_splits):  # fmt: skip
    n_batch, n_queries, n_heads_q, _ = q.shape
    return q.new_empty(q.shape), q.new_empty((n_batch, n_heads_q, n_queries), dtype=torch.float32)


def kv_cache_append_(
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
    block_table: torch.Tensor | None,
    k_scales: torch.Tensor | None,
    v_scales: torch.Tensor | None,
) -> None:
    """Write k_new and v_new (B, Sq, Hk, D) into the cache at cache_seqlens[b] + t, in place (validated arguments)."""
    append_tokens(k_new, v_new, k_cache, v_cache, cache_seqlens, block_table, k_scales, v_scales, APPEND_TOKENS)


def append_tokens(k_new, v_new, k_cache, v_cache, cache_seqlens, block_table, k_scales, v_scales,
                  tokens_per_program: int) -> None:  # fmt: skip
    """kv_cache_append_ with programs of up to ``tokens_per_program`` new tokens (a power of two; the op's:
    plan.APPEND_TOKENS), for sweeps of that count."""
    n_batch, n_new, n_heads, head_dim = k_new.shape
    if k_new.numel() == 0:
        return
    cache = describe_cache(k_cache, block_table, k_scales, k_new.dtype, head_dim)
    k_new, v_new, cache_seqlens = _unit_stride(k_new), _unit_stride(v_new), _unit_stride(cache_seqlens)
    table, stride_table = _table_args(block_table, k_cache)
    tokens = min(tokens_per_program, next_power_of_2(n_new))
    _kv_append_kernel[(n_batch * cdiv(n_new, tokens),)](
        k_new, v_new, k_cache, v_cache, k_scales, v_scales, cache_seqlens, table,
        n_new, n_heads, head_dim, cache.capacity, cache.n_pages,
        k_new.stride(0), k_new.stride(1), k_new.stride(2), v_new.stride(0), v_new.stride(1), v_new.stride(2),
        *_cache_strides(k_cache), *_cache_strides(v_cache), *_scale_strides(k_scales), *_scale_strides(v_scales),
        stride_table,
        KV=cache.format, PAGED=cache.paged, PAGE_SIZE=cache.page_size, BLOCK_T=tokens,
        BLOCK_H=next_power_of_2(n_heads), BLOCK_D=_block_d(head_dim), GROUP=max(cache.group, 2),
        HARDWARE_ROUNDING=_float8_conversion_rounds(k_new.device), num_warps=4,
    )  # fmt: skip


def _float8_conversion_rounds(device: torch.device) -> bool:
    """Whether fp8 codes round in their conversion (a GPU of sm_89 or newer), not in fp32 arithmetic first (the
    interpreter, whose conversion rounds wrongly, and older GPUs); the same codes either way."""
    return not kernels_interpreted() and converts_to_float8_rounding(arch(device))


def kv_cache_append_fake(k_new, v_new, k_cache, v_cache, cache_seqlens, block_table, k_scales, v_scales) -> None:
    return None


def check_quantize(name: str, x, kv_format, group_size) -> int:
    """Validate quantize_kv's arguments; return the int4 group size (0 for the other formats)."""
    check_tensor(f"{name}: x", x, dtypes=FLOAT_DTYPES)
    if kv_format not in FORMATS:
        raise ValueError(f"{name}: dtype must be one of {tuple(FORMATS)}, got {kv_format!r}")
    if x.dim() == 0 or x.shape[-1] == 0:
        raise ValueError(f"{name}: x must have a last dim (head_dim) of at least 1, got shape {tuple(x.shape)}")
    check_device(x=x)
    head_dim = x.shape[-1]
    if kv_format != "int4":
        if group_size is not None:
            raise ValueError(f"{name}: group_size applies to int4 only (int8 and fp8 scale whole rows), got "
                             f"{group_size}")  # fmt: skip
        return 0
    if head_dim % 2:
        raise ValueError(f"{name}: int4 holds two values per byte, so head_dim must be even, got {head_dim}")
    if group_size is None:
        return math.gcd(head_dim, INT4_GROUP)
    if isinstance(group_size, bool) or not isinstance(group_size, int):
        raise TypeError(f"{name}: group_size must be an int or None, got {type(group_size).__name__}")
    if not _valid_group(group_size) or head_dim % group_size:
        raise ValueError(f"{name}: group_size must be an even power of two dividing head_dim {head_dim}, got "
                         f"{group_size}")  # fmt: skip
    return group_size


def quantize_kv_fwd(x: torch.Tensor, kv_format: str, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(data, scales) of x (..., D) in ``kv_format`` (validated; group_size for int4)."""
    head_dim = x.shape[-1]
    lead = tuple(x.shape[:-1])
    if kv_format == "int4":
        data = torch.empty((*lead, head_dim // 2), dtype=torch.uint8, device=x.device)
        scales = torch.empty((*lead, head_dim // group_size, 2), dtype=torch.float16, device=x.device)
    else:
        data = torch.empty(x.shape, dtype=FORMATS[kv_format], device=x.device)
        scales = torch.empty(lead, dtype=torch.float32, device=x.device)
    n_rows = data.numel() // data.shape[-1] if data.numel() else 0
    if n_rows == 0:
        return data, scales
    rows = x.reshape(n_rows, head_dim)
    rows = rows if rows.stride(1) == 1 else rows.contiguous()
    scale_rows = scales.view(n_rows, -1)
    _quantize_kv_kernel[(cdiv(n_rows, _QUANTIZE_ROWS),)](
        rows, data, scales, n_rows, head_dim, rows.stride(0), data.shape[-1], scale_rows.stride(0),
        *((2, 1) if kv_format == "int4" else (0, 0)),  # int4: (scale, zero) pairs, groups 2 apart
        KV=kv_format, BLOCK_R=_QUANTIZE_ROWS, BLOCK_D=_block_d(head_dim), GROUP=max(group_size, 2),
        HARDWARE_ROUNDING=_float8_conversion_rounds(x.device), num_warps=4,
    )  # fmt: skip
    return data, scales


def quantize_kv_fake(x, kv_format, group_size):
    head_dim, lead = x.shape[-1], tuple(x.shape[:-1])
    if kv_format == "int4":
        return (x.new_empty((*lead, head_dim // 2), dtype=torch.uint8),
                x.new_empty((*lead, head_dim // group_size, 2), dtype=torch.float16))  # fmt: skip
    return x.new_empty(x.shape, dtype=FORMATS[kv_format]), x.new_empty(lead, dtype=torch.float32)


def check_dequantize(name: str, data, scales, dtype) -> tuple[str, int, int]:
    """Validate dequantize_kv's arguments; return (format, head_dim, int4 group size or 0)."""
    check_tensor(f"{name}: data", data)
    formats = {storage: fmt for fmt, storage in FORMATS.items()}
    if data.dtype not in formats:
        raise TypeError(f"{name}: data must be quantize_kv's: int8, float8_e4m3fn or uint8 (int4), got {data.dtype}")
    if dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name}: dtype must be one of float32, float16, bfloat16, got {dtype}")
    if data.dim() == 0:
        raise ValueError(f"{name}: data must have a last dim, got a scalar")
    fmt = formats[data.dtype]
    head_dim = data.shape[-1] * (2 if fmt == "int4" else 1)
    group = 0
    check_tensor(f"{name}: scales", scales, dtypes=(SCALE_DTYPES[fmt],))
    lead = tuple(data.shape[:-1])
    if fmt == "int4":
        groups = scales.shape[-2] if scales.dim() == data.dim() + 1 else 0
        if tuple(scales.shape[:-2]) != lead or scales.shape[-1] != 2 or not groups or head_dim % groups \
                or not _valid_group(head_dim // groups):  # fmt: skip
            raise ValueError(f"{name}: scales of int4 data {tuple(data.shape)} must have shape "
                             f"{(*lead, 'D / group', 2)}, got {tuple(scales.shape)}")  # fmt: skip
        group = head_dim // groups
    elif tuple(scales.shape) != lead:
        raise ValueError(f"{name}: scales of {fmt} data {tuple(data.shape)} must have shape {lead}, got "
                         f"{tuple(scales.shape)}")  # fmt: skip
    check_device(data=data, scales=scales)
    return fmt, head_dim, group


def dequantize_kv_fwd(data: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x' (..., D) in ``dtype`` of quantize_kv's (data, scales) (validated)."""
    formats = {storage: fmt for fmt, storage in FORMATS.items()}
    fmt = formats[data.dtype]
    head_dim = data.shape[-1] * (2 if fmt == "int4" else 1)
    out = torch.empty((*data.shape[:-1], head_dim), dtype=dtype, device=data.device)
    n_rows = out.numel() // head_dim if out.numel() else 0
    if n_rows == 0:
        return out
    data_rows = data.reshape(n_rows, data.shape[-1])
    data_rows = data_rows if data_rows.stride(1) == 1 else data_rows.contiguous()
    scale_rows = scales.reshape(n_rows, -1)
    if fmt == "int4":
        scale_rows = scale_rows.contiguous()
        group, group_strides = head_dim // (scale_rows.shape[1] // 2), (2, 1)
    else:
        group, group_strides = 2, (0, 0)
    _dequantize_kv_kernel[(cdiv(n_rows, _QUANTIZE_ROWS),)](
        data_rows, scale_rows, out, n_rows, head_dim, data_rows.stride(0), scale_rows.stride(0), *group_strides,
        head_dim,
        KV=fmt, BLOCK_R=_QUANTIZE_ROWS, BLOCK_D=_block_d(head_dim), GROUP=group, num_warps=4,
    )  # fmt: skip
    return out


def dequantize_kv_fake(data, scales, dtype):
    head_dim = data.shape[-1] * (2 if data.dtype == torch.uint8 else 1)
    return data.new_empty((*data.shape[:-1], head_dim), dtype=dtype)
