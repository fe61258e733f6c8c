"""attention and attention_varlen in the registry: float64 references, typed cases, cost models, peers."""

from __future__ import annotations

import importlib
import itertools
import math
from dataclasses import dataclass

import torch

from tritonkit._core.checks import FLOAT_DTYPES
from tritonkit.ops.flash_attention.op import attention, attention_varlen
from tritonkit.registry import TOLERANCES, Case, Inputs, KernelSpec, Tolerance, register


@dataclass(frozen=True)
class AttentionCase(Case):
    b: int  # batch
    hq: int  # query heads
    hk: int  # key/value heads (GQA: hq is a multiple)
    sq: int  # query rows
    sk: int  # keys
    d: int  # head dim
    causal: bool = False
    left: int = -1  # window=(left, right); -1 unbounded
    right: int = -1
    softcap: float = 0.0
    layout: str = "bhsd"  # or "bshd"
    storage: str = "contiguous"  # "qkv": views of one fused projection (bshd memory); "transposed": the other layout's
    lse: bool = False  # also compare the log-sum-exp (return_lse=True)


@dataclass(frozen=True)
class VarlenCase(Case):
    lens_q: tuple  # the packed sequences' query lengths
    hq: int
    hk: int
    d: int
    lens_k: tuple | None = None  # their key lengths (None: the query lengths)
    causal: bool = False
    left: int = -1
    right: int = -1
    softcap: float = 0.0
    lse: bool = False


def _visible(sq: int, sk: int, causal: bool, window: tuple[int, int], device) -> torch.Tensor:
    """[Sq, Sk] True where query i sees key j: i + Sk - Sq - left <= j <= i + Sk - Sq + right."""
    left, right = window
    right = 0 if causal else right
    position = torch.arange(sq, device=device)[:, None] + (sk - sq)
    key = torch.arange(sk, device=device)[None, :]
    visible = torch.ones(sq, sk, dtype=torch.bool, device=device)
    if left >= 0:
        visible &= key >= position - left
    if right >= 0:
        visible &= key <= position + right
    return visible


def _heads_first(q, k, v, causal, scale, window, softcap):
    """Attention of q (B, Hq, Sq, D) over k, v (B, Hk, Sk, D), written as the definition: every score, masked,
    softmax, product. A row that sees no key gives 0 and lse -inf, with finite gradients (masked scores are -inf
    before the exponential; the row maximum is a constant shift)."""
    group = q.shape[1] // max(k.shape[1], 1)
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q @ k.transpose(-1, -2)) * scale
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    visible = _visible(q.shape[2], k.shape[2], causal, tuple(window), q.device)
    scores = scores.masked_fill(~visible, float("-inf"))
    peak = scores.amax(dim=-1, keepdim=True).detach()
    peak = torch.where(torch.isinf(peak), torch.zeros_like(peak), peak)
    weights = torch.exp(scores - peak)
    total = weights.sum(dim=-1, keepdim=True)
    seen = total > 0
    total = torch.where(seen, total, torch.ones_like(total))
    out = (weights / total) @ v
    lse = torch.where(seen, peak + torch.log(total), torch.full_like(total, float("-inf"))).squeeze(-1)
    return out, lse


def _attention_reference(q, k, v, *, causal=False, scale=None, window=(-1, -1), softcap=0.0, layout="bhsd",
                         return_lse=False):  # fmt: skip
    if layout == "bshd":
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    out, lse = _heads_first(q, k, v, causal, scale, window, softcap)
    out = out.transpose(1, 2) if layout == "bshd" else out
    return (out, lse) if return_lse else out


def _attention_varlen_reference(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False,
                                scale=None, window=(-1, -1), softcap=0.0, return_lse=False):  # fmt: skip
    """Each packed sequence on its own through the dense reference."""
    starts_q, starts_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    outs, lses = [], []
    for b in range(len(starts_q) - 1):
        rows = slice(starts_q[b], starts_q[b + 1])
        keys = slice(starts_k[b], starts_k[b + 1])
        if rows.start == rows.stop:
            continue
        # (S, H, D) -> (1, H, S, D)
        out, lse = _heads_first(q[rows].transpose(0, 1)[None], k[keys].transpose(0, 1)[None],
                                v[keys].transpose(0, 1)[None], causal, scale, window, softcap)  # fmt: skip
        outs.append(out[0].transpose(0, 1))
        lses.append(lse[0])
    out = torch.cat(outs, dim=0) if outs else q.new_zeros(q.shape)
    lse = torch.cat(lses, dim=1) if lses else q.new_zeros(q.shape[1], 0)
    return (out, lse) if return_lse else out


def _randn(shape, device, dtype, generator):
    return torch.randn(shape, device=device, generator=generator, dtype=torch.float32).to(dtype)


def _options(case) -> dict:
    options = {"causal": case.causal, "window": (case.left, case.right), "softcap": case.softcap}
    if case.lse:
        options["return_lse"] = True
    return options


def _attention_inputs(case, device, dtype, generator):
    """q, k, v in the case's layout and storage; unit-variance entries (scores of order sqrt(d) * scale = 1)."""
    b, hq, hk, sq, sk, d = case.b, case.hq, case.hk, case.sq, case.sk, case.d
    if case.storage == "qkv":  # one fused projection (B, S, (Hq + 2 Hk) D) of equal lengths, viewed per head
        fused = _randn((b, sq, (hq + 2 * hk) * d), device, dtype, generator)
        q, k, v = fused.split((hq * d, hk * d, hk * d), dim=-1)
        q, k, v = q.unflatten(-1, (hq, d)), k.unflatten(-1, (hk, d)), v.unflatten(-1, (hk, d))
        if case.layout == "bhsd":
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    else:
        transposed = case.storage == "transposed"
        heads_first = (case.layout == "bhsd") != transposed

        def make(heads, rows):
            x = _randn((b, heads, rows, d) if heads_first else (b, rows, heads, d), device, dtype, generator)
            return x.transpose(1, 2) if transposed else x

        q, k, v = make(hq, sq), make(hk, sk), make(hk, sk)
    options = _options(case)
    options["layout"] = case.layout
    return Inputs((q, k, v), options)


def _cu_seqlens(lengths, device) -> torch.Tensor:
    return torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32, device=device)


def _varlen_inputs(case, device, dtype, generator):
    lens_q = tuple(case.lens_q)
    lens_k = tuple(_lens_k(case))
    q = _randn((sum(lens_q), case.hq, case.d), device, dtype, generator)
    k = _randn((sum(lens_k), case.hk, case.d), device, dtype, generator)
    v = _randn((sum(lens_k), case.hk, case.d), device, dtype, generator)
    args = (q, k, v, _cu_seqlens(lens_q, device), _cu_seqlens(lens_k, device), max(lens_q), max(lens_k))
    return Inputs(args, _options(case))


def _pairs(sq: int, sk: int, causal: bool, left: int, right: int) -> float:
    """Visible (query, key) pairs: Sq * Sk, half that when causal (the convention flash-attn's and FlexAttention's
    reports use), the exact count with a window."""
    if left < 0 and (right < 0 and not causal):
        return sq * sk
    if left < 0 and causal:
        return sq * sk / 2
    right = 0 if causal else right
    count = 0
    for i in range(sq):
        position = i + sk - sq
        lo = 0 if left < 0 else max(position - left, 0)
        hi = sk - 1 if right < 0 else min(position + right, sk - 1)
        count += max(hi - lo + 1, 0)
    return count


def _attention_flops(case, dtype):
    """Two products of 2 D flops per visible pair (Q K^T and P V)."""
    return 4 * case.b * case.hq * case.d * _pairs(case.sq, case.sk, case.causal, case.left, case.right)


def _attention_flops_bwd(case, dtype):
    """Five products per visible pair (the scores again, dV, dP, dQ, dK): 2.5 times the forward."""
    return 2.5 * _attention_flops(case, dtype)


def _io_bytes(q_rows: int, k_rows: int, case, dtype, backward: bool) -> int:
    """q and o (and in the backward dO, dQ) per query row, k and v (and dK, dV) per key row, the fp32 lse (and
    delta)."""
    per_q, per_k = q_rows * case.hq * case.d, k_rows * case.hk * case.d
    factor = 2 if backward else 1
    return factor * ((2 * per_q + 2 * per_k) * dtype.itemsize + 4 * q_rows * case.hq)


def _attention_bytes(case, dtype, backward=False):
    return _io_bytes(case.b * case.sq, case.b * case.sk, case, dtype, backward)


def _lens_k(case) -> tuple:
    return case.lens_k if case.lens_k is not None else case.lens_q


def _varlen_flops(case, dtype):
    pairs = sum(_pairs(sq, sk, case.causal, case.left, case.right) for sq, sk in zip(case.lens_q, _lens_k(case),
                                                                                       strict=True))  # fmt: skip
    return 4 * case.hq * case.d * pairs


def _varlen_bytes(case, dtype, backward=False):
    return _io_bytes(sum(case.lens_q), sum(_lens_k(case)), case, dtype, backward)


def _tolerance(case, dtype):
    """Outputs are weighted means of v: the table's bounds. Gradients are sums over keys (dQ) or queries (dK, dV) of
    products whose 16-bit rounding (P and dS are rounded to the input dtype for the tensor cores, and D = rowsum(dO O)
    reads the rounded O, as every flash attention does) adds an error of about one ulp of the result's rms per
    element, random in sign: an absolute term of 32 ulps of the rms covers the tail of tens of millions of elements
    (measured on the H100: 1 or 2 of 16.7 million gradient elements beyond 8 ulps, within 16).

    In fp32 nothing is rounded to 16 bits, and what is left is the fp32 sums (and exp2's approximation) over the
    longest sum: keys for O and dQ, the query group's rows for dK and dV. Their error grows as the square root of the
    terms: 4 ulps times sqrt(terms) of the rms, at least 16 (a fixed 16 ulps missed 1 of 2 million dV elements by
    2x, at the first key of a causal GQA 32:8 case of 1000 rows, which sums 4000 products)."""
    base = TOLERANCES[dtype]
    if dtype == torch.float32:
        rows, keys = (case.sq, case.sk) if hasattr(case, "sq") else (max(case.lens_q), max(_lens_k(case)))
        terms = max(rows * case.hq // case.hk, keys, 1)
        return Tolerance(atol=base.atol, rtol=base.rtol, rms_atol=2.0**-24 * max(16.0, 4 * math.sqrt(terms)))
    ulps = {torch.float16: 2.0**-6, torch.bfloat16: 2.0**-3}[dtype]
    return Tolerance(atol=base.atol, rtol=base.rtol, rms_atol=ulps)


def _peer(name: str):
    def factory():
        return getattr(importlib.import_module("tritonkit.bench.attention_peers"), name)()

    return factory


_TESTS = (
    {"b": 1, "hq": 2, "hk": 1, "sq": 17, "sk": 17, "d": 16},
    {"b": 2, "hq": 4, "hk": 2, "sq": 37, "sk": 45, "d": 24, "layout": "bshd"},
    {"b": 1, "hq": 2, "hk": 1, "sq": 40, "sk": 33, "d": 32, "causal": True},  # Sq > Sk: the top rows see nothing
    {"b": 1, "hq": 2, "hk": 2, "sq": 20, "sk": 150, "d": 16, "causal": True},  # Sq < Sk: aligned bottom-right
    {"b": 1, "hq": 2, "hk": 2, "sq": 140, "sk": 140, "d": 16, "left": 5, "right": 3},  # a window inside a block
    {"b": 1, "hq": 2, "hk": 1, "sq": 150, "sk": 150, "d": 40, "causal": True, "left": 70, "softcap": 5.0},
    {"b": 2, "hq": 4, "hk": 1, "sq": 1, "sk": 33, "d": 64, "causal": True, "lse": True},  # one query (decoding)
    {"b": 1, "hq": 16, "hk": 1, "sq": 9, "sk": 9, "d": 8, "causal": True, "left": 0},  # only the diagonal; MQA 16:1
    {"b": 1, "hq": 1, "hk": 1, "sq": 127, "sk": 127, "d": 256, "causal": True, "layout": "bshd"},
    {"b": 1, "hq": 2, "hk": 2, "sq": 30, "sk": 10, "d": 16, "causal": True, "softcap": 2.0, "lse": True},
    {"b": 2, "hq": 4, "hk": 2, "sq": 19, "sk": 19, "d": 16, "storage": "qkv", "layout": "bshd", "causal": True},
    {"b": 1, "hq": 2, "hk": 1, "sq": 13, "sk": 21, "d": 5, "storage": "transposed"},  # head dim 5: padded to 16
    # Seven 64-row blocks of the fallback plan (the interpreter's): the running max and sum carried across many
    {"b": 1, "hq": 1, "hk": 1, "sq": 400, "sk": 400, "d": 16, "causal": True},  # key blocks
    {"b": 0, "hq": 2, "hk": 1, "sq": 5, "sk": 5, "d": 16},
    {"b": 1, "hq": 2, "hk": 1, "sq": 0, "sk": 5, "d": 16},
)
_GPU = (
    {"b": 2, "hq": 16, "hk": 16, "sq": 1024, "sk": 1024, "d": 128},
    {"b": 2, "hq": 32, "hk": 8, "sq": 1000, "sk": 1000, "d": 128, "causal": True, "layout": "bshd"},
    {"b": 1, "hq": 8, "hk": 2, "sq": 777, "sk": 777, "d": 64, "causal": True, "left": 100, "softcap": 30.0},
    {"b": 1, "hq": 8, "hk": 8, "sq": 513, "sk": 513, "d": 256, "causal": True, "lse": True},
    {"b": 2, "hq": 8, "hk": 2, "sq": 300, "sk": 1100, "d": 64, "causal": True},
    {"b": 4, "hq": 32, "hk": 8, "sq": 1, "sk": 4097, "d": 128, "causal": True},
    {"b": 1, "hq": 12, "hk": 4, "sq": 777, "sk": 777, "d": 80, "storage": "qkv", "layout": "bshd"},
    {"b": 1, "hq": 4, "hk": 4, "sq": 2048, "sk": 2048, "d": 32, "left": 16, "right": 16},
)
# One line per setting of the others on the plots: sequence length swept at a fixed batch and heads.
_BENCH = tuple(
    {"b": 2, "hq": 32, "hk": 32, "sq": s, "sk": s, "d": 128, "causal": causal}
    for causal in (False, True)
    for s in (1024, 2048, 4096, 8192, 16384)
)

register(KernelSpec(
    name="attention",
    family="attention",
    sweep="sq",
    case_type=AttentionCase,
    summary="Flash attention, forward and backward: causal, GQA, sliding window, softcap, any head dim to 256.",
    description="One program per block of query rows walks the visible key blocks with the online softmax (base 2, "
                "fp32), never forming the score matrix; blocks no mask cuts skip the mask. The backward recomputes "
                "the scores: dK and dV per key block (over the group's query heads), dQ per query block; no "
                "atomics, so gradients are deterministic (deterministic=, kept for flash-attn's signature, changes "
                "nothing). Causal aligns bottom-right as flash-attn 2.",
    usage="o = tk.ops.attention(q, k, v, causal=True)  # q (B, Hq, S, D), k and v (B, Hk, S, D)",
    tags=("attention", "fused", "compute-bound", "backward"),
    limits="head_dim 1 to 256; Hq a multiple of Hk; fp16/bf16 (fp32 for checking); no dropout, no arbitrary "
           "masks (causal, window, softcap only); k with no keys needs causal=True.",
    fn=attention,
    reference=_attention_reference,
    make_inputs=_attention_inputs,
    test_cases=_TESTS,
    gpu_cases=_GPU,
    bench_cases=_BENCH,
    bytes_moved=_attention_bytes,
    bytes_moved_bwd=lambda case, dtype: _attention_bytes(case, dtype, backward=True),
    flops=_attention_flops,
    flops_bwd=_attention_flops_bwd,
    dtypes=FLOAT_DTYPES,
    has_backward=True,
    tolerance=_tolerance,
    peers={"sdpa-flash": _peer("sdpa_flash"), "sdpa-cudnn": _peer("sdpa_cudnn"), "flex": _peer("flex_attention")},
    status="experimental",
))  # fmt: skip

_VARLEN_TESTS = (
    {"lens_q": (5, 17, 1), "hq": 2, "hk": 1, "d": 16},
    {"lens_q": (33, 7, 20), "hq": 4, "hk": 2, "d": 24, "causal": True, "lse": True},
    {"lens_q": (3, 30), "lens_k": (40, 10), "hq": 2, "hk": 2, "d": 32, "causal": True},
    {"lens_q": (70, 0, 9), "hq": 2, "hk": 1, "d": 16, "causal": True, "left": 6, "softcap": 4.0},
    {"lens_q": (140,), "hq": 1, "hk": 1, "d": 64, "left": 20, "right": 20},
)
_VARLEN_GPU = (
    {"lens_q": (1000, 17, 2048, 1, 600), "hq": 32, "hk": 8, "d": 128, "causal": True},
    {"lens_q": (513, 255), "lens_k": (700, 300), "hq": 8, "hk": 8, "d": 64, "causal": True, "softcap": 30.0},
    {"lens_q": (4096, 4096), "hq": 16, "hk": 4, "d": 128, "causal": True, "left": 1024, "lse": True},
)
# Four sequences of the dense benchmark's total tokens: the cost of packing against the dense kernel.
_VARLEN_BENCH = tuple(
    {"lens_q": (s // 2,) * 4, "hq": 32, "hk": 32, "d": 128, "causal": causal}
    for causal in (False, True)
    for s in (1024, 2048, 4096, 8192, 16384)
)

register(KernelSpec(
    name="attention_varlen",
    family="attention",
    sweep="lens_q",
    case_type=VarlenCase,
    summary="Flash attention over packed sequences (cu_seqlens), forward and backward, as flash_attn_varlen_func.",
    description="The dense kernels with each program's rows and keys offset by cu_seqlens: sequences packed without "
                "padding attend only within themselves. Options as attention; the lse is (Hq, total_q).",
    usage="o = tk.ops.attention_varlen(q, k, v, cu, cu, max_len, max_len, causal=True)  # q (total, Hq, D)",
    tags=("attention", "fused", "compute-bound", "backward", "varlen"),
    limits="cu_seqlens int32 rising from 0 to the total (checked only on the CPU or with TRITONKIT_DEBUG=1); "
           "max_seqlen_* plain ints at least the longest sequence; as attention otherwise.",
    fn=attention_varlen,
    reference=_attention_varlen_reference,
    make_inputs=_varlen_inputs,
    test_cases=_VARLEN_TESTS,
    gpu_cases=_VARLEN_GPU,
    bench_cases=_VARLEN_BENCH,
    bytes_moved=_varlen_bytes,
    bytes_moved_bwd=lambda case, dtype: _varlen_bytes(case, dtype, backward=True),
    flops=_varlen_flops,
    flops_bwd=lambda case, dtype: 2.5 * _varlen_flops(case, dtype),
    dtypes=FLOAT_DTYPES,
    has_backward=True,
    tolerance=_tolerance,
    status="experimental",
))  # fmt: skip
