"""Other implementations of :func:`tritonkit.ops.decode_attention` for benchmarks: PyTorch's
scaled_dot_product_attention with GQA over a contiguous cache, FlexAttention (compiled) over a paged cache
through a block mask, and xFormers' Triton split-K kernel over either.

Each factory returns a callable with decode_attention's signature (q (B, Sq, Hq, D), k_cache, v_cache,
cache_seqlens and its keyword options), returning (B, Sq, Hq, D), so that the decode_attention spec can name them as
peers and a benchmark can time them. A case a peer cannot compute as tritonkit defines it raises
:class:`~tritonkit.bench.attention_peers.Unsupported` on the call, before any work.

- SDPA has no paged or quantized cache and no per-sequence lengths (a mask would send it to its slow path): it
  takes a contiguous cache whose every sequence is full (cache_seqlens == S_max), one new token, or Sq tokens with
  causal=False. Lengths on the GPU are not read (that would synchronise inside the timed call): a benchmark gives it
  full caches; lengths on the CPU are checked.
- FlexAttention reads a paged cache as one sequence of all the pool's slots, (1, Hk, pages x page_size, D), shared by
  the batch (its KV batch broadcasts): a block mask keeps, for each sequence, the slots of its own pages below its
  length (causal and a window on top), and a score_mod applies a softcap. The block mask is built on the first call
  for a given (lengths, table) pair of tensors and kept (building it evaluates the mask over every slot, far more
  work than the attention): lengths or a table changed in place afterwards leave it stale, which benchmarks, whose
  inputs stay fixed, never do.

- xFormers' Triton split-K kernel (``xformers.ops.fmha.triton_splitk.FwOp``, "Flash-Decoding") over a contiguous
  or paged bf16/fp16 cache: the queries as its (1, B x Sq, Hk, Hq / Hk, D) layout, the cache's key heads expanded
  (stride 0) over their query heads, the lengths as its padded-keys block-diagonal bias (causal from the bottom
  right), paged through its block tables. Its quantized caches are formats of its own (int4 with the coefficients
  inside each row, fp8 with separate row scales), not tritonkit's, and it has no softcap, lse or window here: those
  cases are refused. The bias is built from the lengths on the host, so it is built on the first call for a given
  (lengths, table) pair and kept, as FlexAttention's block mask is. Runs on a CUDA GPU only (carry its wheel); a
  wheel whose C++ extension does not load for this torch still runs it (the kernel is Triton alone).

This module is imported only by the decoding spec's peer factories and benchmark scripts, never by an op.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from tritonkit.bench.attention_peers import Unsupported, _compiled_flex_attention, flex_shapes, softcap_score_mod


def _refuse_quantized(name: str, k_scales, v_scales) -> None:
    if k_scales is not None or v_scales is not None:
        raise Unsupported(f"{name}: no quantized KV cache")


def sdpa_decode() -> Callable:
    """SDPA with ``enable_gqa`` over a full contiguous cache (see the module docstring)."""
    from torch.nn.functional import scaled_dot_product_attention

    def run(q, k_cache, v_cache, cache_seqlens, *, block_table=None, k_scales=None, v_scales=None, scale=None,
            causal=True, window=-1, softcap=0.0, num_splits=0, return_lse=False, check_inputs=None):  # fmt: skip
        if block_table is not None:
            raise Unsupported("sdpa: no paged KV cache")
        _refuse_quantized("sdpa", k_scales, v_scales)
        if window >= 0 or softcap:
            raise Unsupported("sdpa: no sliding window or softcap")
        if return_lse:
            raise Unsupported("sdpa: returns no log-sum-exp")
        if causal and q.shape[1] > 1:
            raise Unsupported("sdpa: its causal diagonal is top-left, the new tokens' is bottom-right")
        if cache_seqlens.device.type == "cpu" and not bool(torch.all(cache_seqlens == k_cache.shape[1])):
            raise Unsupported("sdpa: no per-sequence lengths (every sequence must fill the cache)")
        q_heads, k_heads = q.transpose(1, 2), k_cache.transpose(1, 2)  # views: (B, H, S, D)
        out = scaled_dot_product_attention(q_heads, k_heads, v_cache.transpose(1, 2), scale=scale,
                                           enable_gqa=q.shape[2] != k_cache.shape[2])  # fmt: skip
        return out.transpose(1, 2)

    run.__name__ = "sdpa_decode"
    return run


# Block masks by (lengths, table, shapes, options): see the module docstring.
_BLOCK_MASKS: dict[tuple, object] = {}


def _slot_owners(block_table, n_pages: int, page_size: int):
    """For every slot of the pool: the sequence whose table holds its page (-1: none) and its position in that
    sequence, from the table alone (no synchronisation; entries outside the pool are ignored)."""
    batch, max_pages = block_table.shape
    device = block_table.device
    valid = (block_table >= 0) & (block_table < n_pages)
    target = torch.where(valid, block_table, n_pages).long().flatten()  # page n_pages: a bin for the invalid ones
    owner = torch.full((n_pages + 1,), -1, dtype=torch.int64, device=device)
    first = torch.zeros(n_pages + 1, dtype=torch.int64, device=device)
    owner.scatter_(0, target, torch.arange(batch, device=device).repeat_interleave(max_pages))
    first.scatter_(0, target, torch.arange(max_pages, device=device).repeat(batch) * page_size)
    slot = torch.arange(n_pages * page_size, device=device)
    return owner[slot // page_size], first[slot // page_size] + slot % page_size


def _decode_block_mask(q, k_cache, cache_seqlens, block_table, causal: bool, window: int):
    from torch.nn.attention.flex_attention import create_block_mask

    batch, n_queries = q.shape[0], q.shape[1]
    paged = block_table is not None
    keys = k_cache.shape[0] * k_cache.shape[1] if paged else k_cache.shape[1]
    # The tensors themselves (hashed by identity, and kept alive, so that no other tensor takes their id).
    key = (cache_seqlens, block_table, tuple(q.shape), tuple(k_cache.shape), causal, window)
    if key in _BLOCK_MASKS:
        return _BLOCK_MASKS[key]
    lengths = cache_seqlens.long()
    if paged:
        owner, position = _slot_owners(block_table, k_cache.shape[0], k_cache.shape[1])
    else:
        owner = position = None

    def mask_mod(b, h, q_idx, kv_idx):
        at = position[kv_idx] if paged else kv_idx
        query_at = lengths[b] - n_queries + q_idx
        seen = at < lengths[b]
        if paged:
            seen = seen & (owner[kv_idx] == b)
        if causal:
            seen = seen & (at <= query_at)
        if window >= 0:
            seen = seen & (at >= query_at - window)
        return seen

    mask = create_block_mask(mask_mod, batch, None, n_queries, keys, device=q.device)
    _BLOCK_MASKS[key] = mask
    return mask


def flex_decode(compiled: bool = True) -> Callable:
    """FlexAttention over a paged (or contiguous) cache through a block mask (see the module docstring).
    ``compiled=False`` runs the eager implementation, for checking on a CPU."""
    from torch.nn.attention import flex_attention as flex_module

    def run(q, k_cache, v_cache, cache_seqlens, *, block_table=None, k_scales=None, v_scales=None, scale=None,
            causal=True, window=-1, softcap=0.0, num_splits=0, return_lse=False, check_inputs=None):  # fmt: skip
        _refuse_quantized("flex", k_scales, v_scales)
        if return_lse:
            raise Unsupported("flex: the lse of decoding is not compared")
        fn = _compiled_flex_attention() if compiled else flex_module.flex_attention
        n_heads_k, head_dim = k_cache.shape[2], k_cache.shape[3]
        if block_table is not None:  # the pool as one sequence of slots, shared by the batch
            k = k_cache.view(-1, n_heads_k, head_dim).transpose(0, 1)[None]
            v = v_cache.view(-1, n_heads_k, head_dim).transpose(0, 1)[None]
        else:
            k, v = k_cache.transpose(1, 2), v_cache.transpose(1, 2)
        mask = _decode_block_mask(q, k_cache, cache_seqlens, block_table, causal, window)
        with flex_shapes(compiled):
            out = fn(q.transpose(1, 2), k, v, block_mask=mask,
                     score_mod=softcap_score_mod(float(softcap)) if softcap else None,
                     scale=1.0 / math.sqrt(head_dim) if scale is None else scale,
                     enable_gqa=q.shape[2] != n_heads_k)  # fmt: skip
        return out.transpose(1, 2)

    run.__name__ = "flex_decode" if compiled else "flex_decode_eager"
    return run


# xFormers' biases by (lengths, table, shapes, causal): see the module docstring.
_XFORMERS_BIASES: dict[tuple, object] = {}


def _xformers_bias(fmha, q, k_cache, cache_seqlens, block_table, causal: bool):
    batch, n_queries = q.shape[0], q.shape[1]
    key = (cache_seqlens, block_table, tuple(q.shape), tuple(k_cache.shape), causal)
    if key in _XFORMERS_BIASES:
        return _XFORMERS_BIASES[key]
    kinds = fmha.attn_bias
    padded = kinds.BlockDiagonalCausalWithOffsetPaddedKeysMask if causal else kinds.BlockDiagonalPaddedKeysMask
    lengths = [int(length) for length in cache_seqlens.tolist()]
    slots = k_cache.shape[1]  # a contiguous cache's S_max, or a page's slots
    padding = slots if block_table is None else block_table.shape[1] * slots  # the keys a sequence can hold
    bias = padded.from_seqlens(q_seqlen=[n_queries] * batch, kv_padding=padding, kv_seqlen=lengths)
    if block_table is not None:
        paged = (kinds.PagedBlockDiagonalCausalWithOffsetPaddedKeysMask if causal
                 else kinds.PagedBlockDiagonalPaddedKeysMask)  # fmt: skip
        bias = bias.make_paged(block_tables=block_table, page_size=slots, paged_type=paged)
    _XFORMERS_BIASES[key] = bias
    return bias


# xFormers' dispatcher refuses every CUDA operator when its C++ extension did not load (a wheel built for another
# torch), though the split-K operator is Triton alone and needs none of it: that one reason is set aside, every
# other refusal (shape, dtype, capability) still raises.
_XFORMERS_EXTENSION_REASON = "build with CUDA support"


def _xformers_split_k_forward(fmha, query, key, value, bias, scale):
    """memory_efficient_attention_forward(..., op=triton_splitk.FwOp) without the extension-build refusal."""
    operator = fmha.triton_splitk.FwOp
    inputs = fmha.Inputs(query=query, key=key, value=value, attn_bias=bias, scale=scale)
    inputs.validate_inputs()
    output_shape = inputs.normalize_bmhk()
    reasons = [reason for reason in operator.not_supported_reasons(inputs) if _XFORMERS_EXTENSION_REASON not in reason]
    if reasons:
        raise Unsupported(f"xformers: its split-K kernel refuses these inputs: {'; '.join(reasons)}")
    out, *_ = operator.apply(inputs, needs_gradient=False)
    return out.reshape(output_shape)


def xformers_decode() -> Callable:
    """xFormers' Triton split-K decoding kernel over a contiguous or paged 16-bit cache (see the module docstring)."""

    def run(q, k_cache, v_cache, cache_seqlens, *, block_table=None, k_scales=None, v_scales=None, scale=None,
            causal=True, window=-1, softcap=0.0, num_splits=0, return_lse=False, check_inputs=None):  # fmt: skip
        _refuse_quantized("xformers", k_scales, v_scales)
        if window >= 0 or softcap:
            raise Unsupported("xformers: no sliding window or softcap here")
        if return_lse:
            raise Unsupported("xformers: the lse of decoding is not compared")
        if q.dtype not in (torch.float16, torch.bfloat16):
            raise Unsupported(f"xformers: its split-K kernel takes fp16 or bf16 queries, got {q.dtype}")
        from xformers.ops import fmha  # here, after the refusals: a CPU run has no xFormers

        batch, n_queries, n_heads_q, head_dim = q.shape
        n_heads_k = k_cache.shape[2]
        group = n_heads_q // n_heads_k
        slots = k_cache.shape[0] * k_cache.shape[1]  # B x S_max, or pages x page_size
        q5 = q.reshape(1, batch * n_queries, n_heads_k, group, head_dim)
        k5 = k_cache.view(1, slots, n_heads_k, 1, head_dim).expand(1, slots, n_heads_k, group, head_dim)
        v5 = v_cache.view(1, slots, n_heads_k, 1, head_dim).expand(1, slots, n_heads_k, group, head_dim)
        bias = _xformers_bias(fmha, q, k_cache, cache_seqlens, block_table, causal)
        out = _xformers_split_k_forward(fmha, q5, k5, v5, bias, scale)
        return out.reshape(batch, n_queries, n_heads_q, head_dim)

    run.__name__ = "xformers_decode"
    return run
