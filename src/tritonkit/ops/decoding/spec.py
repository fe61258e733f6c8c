"""decode_attention and kv_cache_append in the registry: float64 references (the KV formats written out again from
their definition), typed cases, cost models, peers."""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass

import torch

from tritonkit._core.checks import FLOAT_DTYPES
from tritonkit._core.ints import cdiv
from tritonkit.ops.decoding.op import decode_attention, dequantize_kv, kv_cache_append, quantize_kv
from tritonkit.registry import TOLERANCES, Case, Inputs, KernelSpec, Tolerance, register


@dataclass(frozen=True)
class DecodeCase(Case):
    hq: int  # query heads
    hk: int  # key/value heads of the cache
    d: int  # head dim
    b: int = 1  # sequences, each of s tokens in the cache (the new ones included)...
    s: int = 0
    lens: tuple | None = None  # ... or each sequence's own length (cache_seqlens); the batch is its length
    sq: int = 1  # new tokens per sequence
    capacity: int = 0  # tokens a sequence can hold (0: the longest length + 5)
    page_size: int = 0  # 0: a contiguous cache; else pages of this many tokens, scattered out of order
    kv: str = "plain"  # the cache's format: "plain" (q's dtype), "int8", "fp8", "int4"
    group_size: int = 0  # int4's group along D (0: quantize_kv's default)
    causal: bool = True
    window: int = -1
    softcap: float = 0.0
    splits: int = 0  # num_splits (0: the heuristic)
    lse: bool = False  # also compare the log-sum-exp


@dataclass(frozen=True)
class AppendCase(Case):
    hk: int
    d: int
    b: int = 1  # sequences, each holding s tokens before the append...
    s: int = 0
    lens: tuple | None = None  # ... or each sequence's own length (cache_seqlens); the batch is its length
    sq: int = 1  # new tokens per sequence
    capacity: int = 0  # 0: the longest length + sq + 3
    page_size: int = 0
    kv: str = "plain"
    group_size: int = 0


# ---------------------------------------------------------------- caches as a test or benchmark draws them


def _randn(shape, device, dtype, generator):
    return torch.randn(shape, device=device, generator=generator, dtype=torch.float32).to(dtype)


def _lengths(case) -> tuple:
    return case.lens if case.lens is not None else (case.s,) * case.b


def _capacity(case, extra: int) -> int:
    return case.capacity or max(_lengths(case), default=0) + extra


def _cache(case, capacity: int, live: tuple, device, dtype, generator) -> dict:
    """k_cache, v_cache (and block_table, k_scales, v_scales) of ``case``: unit-normal values in every slot (the ones
    past a sequence's length too, which must never be read), quantized by quantize_kv when the format asks.
    Paged: each sequence gets its pages from a random permutation of a pool two pages larger than needed; the
    table's entries past the page of a sequence's last ``live`` token are -1."""
    batch = len(live)
    if case.page_size:
        max_pages = cdiv(capacity, case.page_size)
        n_pages = batch * max_pages + 2
        shape = (n_pages, case.page_size, case.hk, case.d)
        order = torch.rand(n_pages, generator=generator, device=device).argsort()
        table = order[: batch * max_pages].reshape(batch, max_pages).to(torch.int32)
        for b, length in enumerate(live):
            table[b, cdiv(length, case.page_size) :] = -1
        extra = {"block_table": table.to(device)}
    else:
        shape = (batch, capacity, case.hk, case.d)
        extra = {}
    caches = {}
    for name in ("k", "v"):
        values = _randn(shape, device, dtype, generator)
        if case.kv == "plain":
            caches[f"{name}_cache"] = values
        else:
            data, scales = quantize_kv(values, case.kv, group_size=case.group_size or None)
            caches[f"{name}_cache"], caches[f"{name}_scales"] = data, scales
    return caches | extra


def _seqlens(lens, device) -> torch.Tensor:
    return torch.tensor(lens, dtype=torch.int32, device=device)


def _decode_inputs(case, device, dtype, generator):
    lens = _lengths(case)
    cache = _cache(case, _capacity(case, 5), lens, device, dtype, generator)
    q = _randn((len(lens), case.sq, case.hq, case.d), device, dtype, generator)
    options = {key: cache[key] for key in ("block_table", "k_scales", "v_scales") if key in cache}
    options.update(causal=case.causal, window=case.window, softcap=case.softcap, num_splits=case.splits)
    if case.lse:
        options["return_lse"] = True
    return Inputs((q, cache["k_cache"], cache["v_cache"], _seqlens(lens, device)), options)


# ---------------------------------------------------------------- references


def _format_of(data: torch.Tensor, scales) -> str:
    """A cache's format as the reference receives it (floating tensors upcast to float64, so fp8 data arrives as
    float64 values with scales beside them)."""
    if scales is None:
        return "plain"
    return {torch.int8: "int8", torch.uint8: "int4"}.get(data.dtype, "fp8")


def _values(data: torch.Tensor, scales, fmt: str) -> torch.Tensor:
    """The cache's values in float64, from the formats' definitions (kernels.py's docstring)."""
    if fmt == "plain":
        return data.double()
    if fmt in ("int8", "fp8"):
        return data.double() * scales.double()[..., None]
    codes = torch.stack((data & 15, data >> 4), dim=-1).flatten(-2).double()  # (..., D): low nibble first
    group = codes.shape[-1] // scales.shape[-2]
    scale = scales[..., 0].double().repeat_interleave(group, dim=-1)
    zero = scales[..., 1].double().repeat_interleave(group, dim=-1)
    return codes * scale + zero


def _tokens(cache: torch.Tensor, b: int, length: int, block_table) -> torch.Tensor:
    """Tokens 0 .. length - 1 of sequence b: (length, Hk, D)."""
    if block_table is None:
        return cache[b, :length]
    page_size = cache.shape[1]
    pages = block_table[b, : cdiv(length, page_size)].long()
    return cache[pages].flatten(0, 1)[:length]


def _decode_reference(q, k_cache, v_cache, cache_seqlens, *, block_table=None, k_scales=None, v_scales=None,
                      scale=None, causal=True, window=-1, softcap=0.0, num_splits=0, return_lse=False,
                      check_inputs=None):  # fmt: skip
    """Each sequence's dequantized keys and values, every score, masked, softmax, product (float64)."""
    fmt = _format_of(k_cache, k_scales)
    keys, values = _values(k_cache, k_scales, fmt), _values(v_cache, v_scales, fmt)
    n_batch, n_queries, n_heads_q, head_dim = q.shape
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    out = torch.zeros(q.shape, dtype=torch.float64, device=q.device)
    lse = torch.full((n_batch, n_heads_q, n_queries), -math.inf, dtype=torch.float64, device=q.device)
    for b, length in enumerate(cache_seqlens.tolist()):
        k = _tokens(keys, b, length, block_table).transpose(0, 1)  # (Hk, L, D)
        v = _tokens(values, b, length, block_table).transpose(0, 1)
        group = n_heads_q // k.shape[0]
        k, v = k.repeat_interleave(group, dim=0), v.repeat_interleave(group, dim=0)
        scores = q[b].transpose(0, 1) @ k.transpose(-1, -2) * scale  # (Hq, Sq, L)
        if softcap:
            scores = softcap * torch.tanh(scores / softcap)
        position = torch.arange(n_queries, device=q.device)[:, None] + length - n_queries
        key = torch.arange(length, device=q.device)[None, :]
        visible = torch.ones(n_queries, length, dtype=torch.bool, device=q.device)
        if causal:
            visible &= key <= position
        if window >= 0:
            visible &= key >= position - window
        scores = scores.masked_fill(~visible, -math.inf)
        row_lse = torch.logsumexp(scores, dim=-1)  # -inf for a query that sees no key
        weights = torch.exp(scores - row_lse[..., None]).nan_to_num(0.0)
        out[b] = (weights @ v).transpose(0, 1)
        lse[b] = row_lse
    return (out, lse) if return_lse else out


# ---------------------------------------------------------------- cost model


def _row_bytes(case, dtype) -> int:
    """Bytes of one cache row (a token of one head): data and its scales."""
    if case.kv == "plain":
        return case.d * dtype.itemsize
    if case.kv == "int4":
        group = case.group_size or math.gcd(case.d, 32)
        return case.d // 2 + (case.d // group) * 4
    return case.d + 4


def _decode_bytes(case, dtype) -> int:
    """The keys and values of every valid token, q, the output and the lse; the block table's used entries."""
    lens = _lengths(case)
    tokens = sum(lens)
    queries = len(lens) * case.sq * case.hq
    table = sum(cdiv(length, case.page_size) for length in lens) * 4 if case.page_size else 0
    return 2 * tokens * case.hk * _row_bytes(case, dtype) + 2 * queries * case.d * dtype.itemsize + 4 * queries + table


def _decode_flops(case, dtype) -> int:
    """Two products of 2 D flops per (query, key) pair a query may see (every key of its sequence)."""
    return 4 * case.hq * case.d * case.sq * sum(_lengths(case))


def _decode_tolerance(case, dtype):
    """Outputs are weighted means of values: the table's bounds. A quantized cache is compared with the reference
    run on its own dequantized values, so only the kernel's error counts."""
    return TOLERANCES[dtype]


def _peer(name: str):
    def factory():
        return getattr(importlib.import_module("tritonkit.bench.decoding_peers"), name)()

    return factory


_TESTS = (
    {"lens": (37, 5), "hq": 4, "hk": 2, "d": 16},
    {"lens": (40, 0, 1), "hq": 2, "hk": 1, "d": 16, "lse": True},  # an empty cache: 0 and -inf, no NaN
    {"lens": (29,), "hq": 8, "hk": 1, "d": 32, "sq": 4, "window": 6, "softcap": 5.0, "lse": True},  # MQA 8:1
    {"lens": (50, 17, 33), "hq": 4, "hk": 2, "d": 32, "sq": 2, "page_size": 16},
    {"lens": (7, 3), "hq": 2, "hk": 2, "d": 16, "page_size": 1},
    {"lens": (100, 3), "hq": 4, "hk": 2, "d": 16, "splits": 3},  # the short sequence leaves splits empty
    {"lens": (70, 41), "hq": 4, "hk": 1, "d": 16, "sq": 3, "splits": 5, "page_size": 16, "lse": True},
    {"lens": (45, 20), "hq": 4, "hk": 2, "d": 32, "kv": "int8", "splits": 2},
    {"lens": (45, 20), "hq": 4, "hk": 2, "d": 32, "kv": "fp8", "page_size": 16},
    {"lens": (33, 60), "hq": 4, "hk": 2, "d": 64, "kv": "int4", "page_size": 16, "sq": 2},
    {"lens": (21,), "hq": 2, "hk": 1, "d": 24, "kv": "int4", "splits": 2},  # groups of 8
    {"lens": (19,), "hq": 2, "hk": 1, "d": 256},
    {"lens": (40, 25), "hq": 16, "hk": 1, "d": 16, "sq": 8, "splits": 2},  # 128 rows: two row blocks
    {"lens": (30,), "hq": 4, "hk": 2, "d": 16, "sq": 4, "causal": False},
    {"lens": (23,), "hq": 2, "hk": 1, "d": 5},  # head dim 5: padded to 16
    {"lens": (), "hq": 2, "hk": 1, "d": 16},  # no sequence
)
_GPU = (
    {"lens": (4097, 1, 8000, 333), "hq": 32, "hk": 8, "d": 128, "page_size": 16},
    {"s": 32768, "hq": 32, "hk": 8, "d": 128, "page_size": 256, "lse": True},
    {"b": 8, "s": 3000, "hq": 32, "hk": 8, "d": 128, "sq": 16, "page_size": 64},
    {"lens": (5000, 77), "hq": 16, "hk": 2, "d": 256, "page_size": 32, "window": 1024, "softcap": 30.0},
    {"lens": (2049, 1000, 0, 1), "hq": 32, "hk": 8, "d": 128, "kv": "int8", "page_size": 16},
    {"lens": (6000, 129), "hq": 32, "hk": 8, "d": 128, "kv": "fp8", "page_size": 128, "sq": 4},
    {"lens": (4100, 900), "hq": 32, "hk": 8, "d": 128, "kv": "int4", "page_size": 16},
    {"b": 64, "s": 1000, "hq": 32, "hk": 8, "d": 128, "page_size": 16},
    {"lens": (777, 1500), "hq": 12, "hk": 4, "d": 80, "page_size": 1},
)
# Decoding one token per sequence, GQA 32:8 d128, paged 64: the cache length swept at batch 1, 8 and 64.
_BENCH = tuple(
    {"b": b, "s": s, "hq": 32, "hk": 8, "d": 128, "page_size": 64}
    for b in (1, 8, 64)
    for s in (1024, 4096, 16384, 65536)
    if b * s <= 1 << 20
)

register(KernelSpec(
    name="decode_attention",
    family="decoding",
    sweep="s",
    case_type=DecodeCase,
    summary="Flash decoding: split-KV attention of 1 to 16 new tokens over a paged, quantized (int8/fp8/int4) KV "
            "cache.",
    description="Each program takes one split of a sequence's keys for every query head of one key head, so the "
                "cache is read once per key head; the splits' partial softmaxes are combined in a fixed order "
                "(deterministic, no NaN from empty splits). Paged caches gather keys through the block table; int8 "
                "and fp8 scales multiply scores and probabilities, int4 is dequantized in registers.",
    usage="o = tk.ops.decode_attention(q, k_cache, v_cache, seqlens, block_table=table)  # q (B, 1, Hq, D)",
    tags=("attention", "decoding", "paged", "quantized", "memory-bound", "inference"),
    limits="forward only; q (B, Sq<=16, Hq, D<=256); page_size 1 or a multiple of 16; cache values checked "
           "(lengths, pages) only on the CPU or with TRITONKIT_DEBUG=1.",
    fn=decode_attention,
    reference=_decode_reference,
    make_inputs=_decode_inputs,
    test_cases=_TESTS,
    gpu_cases=_GPU,
    bench_cases=_BENCH,
    bytes_moved=_decode_bytes,
    flops=_decode_flops,
    dtypes=FLOAT_DTYPES,
    tolerance=_decode_tolerance,
    peers={"sdpa": _peer("sdpa_decode"), "flex": _peer("flex_decode"), "xformers": _peer("xformers_decode")},
    status="experimental",
))  # fmt: skip


# ---------------------------------------------------------------- kv_cache_append


def _append_inputs(case, device, dtype, generator):
    lens = _lengths(case)
    live = tuple(length + case.sq for length in lens)  # the pages the new tokens land on are mapped
    cache = _cache(case, _capacity(case, case.sq + 3), live, device, dtype, generator)
    batch = len(lens)
    k_new = _randn((batch, case.sq, case.hk, case.d), device, dtype, generator)
    v_new = _randn((batch, case.sq, case.hk, case.d), device, dtype, generator)
    options = {key: cache[key] for key in ("block_table", "k_scales", "v_scales") if key in cache}
    return Inputs((k_new, v_new, cache["k_cache"], cache["v_cache"], _seqlens(lens, device)), options)


def _appended(k_new, v_new, k_cache, v_cache, cache_seqlens, *, block_table=None, k_scales=None, v_scales=None):
    """kv_cache_append on copies of the cache; the caches' values after it (dequantized in fp32 when quantized)."""
    k_cache, v_cache = k_cache.clone(), v_cache.clone()
    k_scales = None if k_scales is None else k_scales.clone()
    v_scales = None if v_scales is None else v_scales.clone()
    kv_cache_append(k_new, v_new, k_cache, v_cache, cache_seqlens, block_table=block_table, k_scales=k_scales,
                    v_scales=v_scales)  # fmt: skip
    if k_scales is None:
        return k_cache, v_cache
    return dequantize_kv(k_cache, k_scales, torch.float32), dequantize_kv(v_cache, v_scales, torch.float32)


def _append_reference(k_new, v_new, k_cache, v_cache, cache_seqlens, *, block_table=None, k_scales=None,
                      v_scales=None):  # fmt: skip
    """The caches' values (float64) with token t of sequence b at position cache_seqlens[b] + t."""
    fmt = _format_of(k_cache, k_scales)
    outs = []
    for new, cache, scales in ((k_new, k_cache, k_scales), (v_new, v_cache, v_scales)):
        values = _values(cache, scales, fmt).clone()
        for b, length in enumerate(cache_seqlens.tolist()):
            for t in range(new.shape[1]):
                position = length + t
                if block_table is None:
                    values[b, position] = new[b, t]
                else:
                    page_size = values.shape[1]
                    values[int(block_table[b, position // page_size]), position % page_size] = new[b, t]
        outs.append(values)
    return tuple(outs)


def _format_tolerance(case, dtype):
    """A plain cache holds the new values exactly. A quantized one holds them within the format's rounding, relative
    to the rms of unit-normal values: int8 half a step, max|x| / 254 (max|x| < 7 rms: the GPU cases draw 2.6e7 values,
    whose largest is near 5.8 rms, and 7 is passed once in 4e11 draws); fp8 half a step, 2^-4 of the
    value (and 2^-10 of the row's step below e4m3's normal range); int4 half a step, (max - min) / 30 (a range < 11
    rms), plus the fp16 rounding of the zero."""
    if case.kv == "plain":
        return Tolerance(atol=0.0, rtol=0.0)
    if case.kv == "int8":
        return Tolerance(atol=0.0, rtol=1e-6, rms_atol=7.0 / 254)
    if case.kv == "fp8":
        return Tolerance(atol=0.0, rtol=2.0**-4 + 1e-6, rms_atol=1e-4)
    return Tolerance(atol=0.0, rtol=2.0**-11, rms_atol=11.0 / 30)


def _append_bytes(case, dtype) -> int:
    """The new keys and values read, and written in the cache's format."""
    batch = len(_lengths(case))
    rows = 2 * batch * case.sq * case.hk
    return rows * (case.d * dtype.itemsize + _row_bytes(case, dtype)) + 4 * batch


_APPEND_TESTS = (
    {"lens": (3, 10), "hk": 2, "d": 16, "sq": 3},
    {"lens": (0, 17, 31), "hk": 2, "d": 32, "page_size": 16, "sq": 2},
    {"lens": (5, 0), "hk": 3, "d": 24, "page_size": 1, "sq": 4},
    {"lens": (8, 2), "hk": 2, "d": 32, "kv": "int8", "sq": 16},
    {"lens": (15, 1), "hk": 2, "d": 40, "kv": "fp8", "page_size": 16},
    {"lens": (20, 4), "hk": 2, "d": 64, "kv": "int4", "page_size": 16, "sq": 2},
    {"lens": (9,), "hk": 1, "d": 12, "kv": "int4", "group_size": 4},
    {"lens": (), "hk": 2, "d": 16},
    # Programs of 4 tokens (plan.APPEND_TOKENS): blocks of 4 and 2 crossing a page, 5 tokens over three heads.
    {"lens": (14, 3), "hk": 2, "d": 32, "kv": "fp8", "page_size": 16, "sq": 6},
    {"lens": (30, 1), "hk": 3, "d": 64, "kv": "int4", "page_size": 16, "sq": 5},
)
_APPEND_GPU = (
    {"lens": (4095, 0, 17, 8000), "hk": 8, "d": 128, "page_size": 16},
    {"b": 64, "s": 100, "hk": 8, "d": 128, "kv": "int8", "page_size": 64, "sq": 4},
    {"lens": (1000, 3), "hk": 8, "d": 128, "kv": "fp8", "sq": 16},
    {"lens": (5000, 1), "hk": 4, "d": 256, "kv": "int4", "page_size": 16},
)
_APPEND_BENCH = tuple({"b": b, "s": 1000, "hk": 8, "d": 128, "page_size": 16} for b in (1, 8, 64, 256))

register(KernelSpec(
    name="kv_cache_append",
    family="decoding",
    sweep="b",
    case_type=AppendCase,
    summary="Write new keys and values into a contiguous or paged KV cache in place, quantizing to int8/fp8/int4.",
    description="A program writes up to 4 new tokens (every key head) at cache_seqlens[b] + t through the block "
                "table; a quantized cache gets codes and scales from the same code as quantize_kv (bit-exact). "
                "Lengths stay on the GPU: no host synchronisation, so a decode step captures in a CUDA graph.",
    usage="tk.ops.kv_cache_append(k, v, k_cache, v_cache, seqlens, block_table=table)  # k, v (B, 1, Hk, D)",
    tags=("decoding", "paged", "quantized", "memory-bound", "inference", "in-place"),
    limits="in place; lengths are not advanced (add Sq after the call); positions past the capacity are not "
           "written (checked only on the CPU or with TRITONKIT_DEBUG=1).",
    fn=_appended,
    timed=kv_cache_append,
    reference=_append_reference,
    make_inputs=_append_inputs,
    test_cases=_APPEND_TESTS,
    gpu_cases=_APPEND_GPU,
    bench_cases=_APPEND_BENCH,
    bytes_moved=_append_bytes,
    flops=lambda case, dtype: 0,
    dtypes=FLOAT_DTYPES,
    tolerance=_format_tolerance,
    notes="Checked on copies of the cache, read back (dequantized) after the append; benchmarked in place (the "
          "lengths are not advanced, so every call writes the same slots).",
    covers=(kv_cache_append,),
    status="experimental",
))  # fmt: skip


# ---------------------------------------------------------------- quantize_kv and dequantize_kv


@dataclass(frozen=True)
class QuantizeCase(Case):
    rows: int  # tokens x heads
    d: int  # head dim
    kv: str  # "int8", "fp8" or "int4"
    group_size: int = 0  # int4 (0: the default)


def _quantize_inputs(case, device, dtype, generator):
    x = _randn((case.rows, case.d), device, dtype, generator)
    return Inputs((x, case.kv), {"group_size": case.group_size or None})


def _round_trip(x, dtype, *, group_size=None):
    """quantize_kv then dequantize_kv (fp32): the format's values of x."""
    return dequantize_kv(*quantize_kv(x, dtype, group_size=group_size), torch.float32)


def _round_trip_reference(x, dtype, *, group_size=None):
    return x.double()


def _round_trip_bytes(case, dtype) -> int:
    """x read, its data and scales written, then read back, and fp32 values written."""
    return case.rows * (case.d * dtype.itemsize + 2 * _row_bytes(case, dtype) + 4 * case.d)


_QUANTIZE_TESTS = (
    {"rows": 37, "d": 64, "kv": "int8"},
    {"rows": 5, "d": 24, "kv": "fp8"},
    {"rows": 19, "d": 128, "kv": "int4"},
    {"rows": 7, "d": 6, "kv": "int4", "group_size": 2},
    {"rows": 0, "d": 16, "kv": "int8"},
)
_QUANTIZE_GPU = tuple({"rows": 100_003, "d": d, "kv": kv} for kv in ("int8", "fp8", "int4") for d in (64, 128, 256))
_QUANTIZE_BENCH = tuple({"rows": rows, "d": 128, "kv": kv} for kv in ("int8", "fp8", "int4")
                        for rows in (1 << 14, 1 << 17, 1 << 20))  # fmt: skip

register(KernelSpec(
    name="quantize_kv",
    family="decoding",
    sweep="rows",
    case_type=QuantizeCase,
    summary="Keys and values to the int8, fp8 or int4 KV-cache formats and back (quantize_kv, dequantize_kv).",
    description="int8 and fp8 take one fp32 scale per row of D (max|x| / 127 or / 448); int4 takes an fp16 "
                "(scale, zero) pair per group of G values and packs two codes per byte. Rounding to nearest, ties "
                "to even, in code that kv_cache_append shares, so a quantized cache holds exactly these codes.",
    usage='k_data, k_scales = tk.ops.quantize_kv(k, "int8"); k = tk.ops.dequantize_kv(k_data, k_scales)',
    tags=("decoding", "quantized", "memory-bound", "inference"),
    limits="int4: an even head dim and a power-of-two group dividing it.",
    fn=_round_trip,
    reference=_round_trip_reference,
    make_inputs=_quantize_inputs,
    test_cases=_QUANTIZE_TESTS,
    gpu_cases=_QUANTIZE_GPU,
    bench_cases=_QUANTIZE_BENCH,
    bytes_moved=_round_trip_bytes,
    flops=lambda case, dtype: 0,
    dtypes=FLOAT_DTYPES,
    tolerance=_format_tolerance,
    notes="Checked and benchmarked as a round trip: the values back against x, within the format's rounding.",
    covers=(quantize_kv, dequantize_kv),
    status="experimental",
))  # fmt: skip
