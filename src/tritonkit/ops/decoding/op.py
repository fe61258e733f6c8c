"""decode_attention, kv_cache_append, quantize_kv and dequantize_kv: the public functions of flash decoding.

All four are forward only (inference): each is one torch custom op (``tritonkit::decode_attention``,
``tritonkit::kv_cache_append`` which writes the cache in place, ``tritonkit::quantize_kv``,
``tritonkit::dequantize_kv``) that torch.compile traces and CUDA graphs capture; eager calls go to the launchers.
"""

from __future__ import annotations

import torch

from tritonkit._core.autograd import inference_op
from tritonkit.ops.decoding.launch import (
    check_append,
    check_decode,
    check_dequantize,
    check_quantize,
    decode_attention_fake,
    decode_attention_fwd,
    dequantize_kv_fake,
    dequantize_kv_fwd,
    kv_cache_append_,
    kv_cache_append_fake,
    quantize_kv_fake,
    quantize_kv_fwd,
)

decode_attention_op = inference_op("decode_attention", launcher=decode_attention_fwd, fake=decode_attention_fake)
kv_cache_append_op = inference_op("kv_cache_append", launcher=kv_cache_append_, fake=kv_cache_append_fake,
                                  mutates=("k_cache", "v_cache", "k_scales", "v_scales"))  # fmt: skip
quantize_kv_op = inference_op("quantize_kv", launcher=quantize_kv_fwd, fake=quantize_kv_fake)
dequantize_kv_op = inference_op("dequantize_kv", launcher=dequantize_kv_fwd, fake=dequantize_kv_fake)


def _refuse_gradients(name: str, **tensors) -> None:
    if torch.is_grad_enabled():
        for arg, x in tensors.items():
            if isinstance(x, torch.Tensor) and x.requires_grad:
                raise ValueError(f"{name} is forward only (inference), but {arg} requires grad; call it "
                                 "under torch.no_grad() or torch.inference_mode()")  # fmt: skip


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
    *,
    block_table: torch.Tensor | None = None,
    k_scales: torch.Tensor | None = None,
    v_scales: torch.Tensor | None = None,
    scale: float | None = None,
    causal: bool = True,
    window: int = -1,
    softcap: float = 0.0,
    num_splits: int = 0,
    return_lse: bool = False,
    check_inputs: bool | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Flash decoding: attention of a few new tokens per sequence over a KV cache, split along the keys.

    - q (B, Sq, Hq, D): Sq from 1 to 16 new tokens per sequence, already written to the cache (kv_cache_append).
      GQA/MQA: Hq a multiple of the cache's Hk. D from 1 to 256. fp16, bf16 (fp32 for checking).
    - Contiguous cache: k_cache, v_cache (B, S_max, Hk, D). Paged: (num_pages, page_size, Hk, D) with
      ``block_table`` (B, max_pages) int32, page_size 1 or a multiple of 16.
    - ``cache_seqlens`` (B,) int32: each sequence's tokens in the cache, the new ones included (0: output 0, lse
      -inf). The new tokens sit at the end: query t is at position L - Sq + t.
    - Quantized caches: int8, float8_e4m3fn or uint8 (int4) data with ``k_scales``/``v_scales`` from
      :func:`quantize_kv` (or written by :func:`kv_cache_append`); dequantized inside the kernel.
    - ``causal``: query t sees keys up to its own position (the new tokens attend causally among themselves).
      ``window`` >= 0: only the ``window`` keys before the query's position, and its own. ``softcap > 0``:
      scores become softcap * tanh(scores / softcap). ``scale`` defaults to 1/sqrt(D).
    - ``num_splits``: how many parts the keys of each sequence are cut into (0: chosen from B, Hk and the cache's
      capacity, plan.choose_splits); the splits are combined in a fixed order, so results are deterministic.
    - Returns (B, Sq, Hq, D) in q's dtype; with ``return_lse``, also the log-sum-exp (B, Hq, Sq), fp32.

    Lengths and block tables live on the GPU: reading them would synchronise, so their values (lengths within the
    capacity, pages inside the pool) are checked with ``check_inputs=True`` or ``TRITONKIT_DEBUG=1``, and always for
    CPU tensors. Unchecked, a key past the capacity or on a page outside the pool counts as absent.

    Example: ``o = tk.ops.decode_attention(q, k_cache, v_cache, seqlens, block_table=table)``.
    """
    _refuse_gradients("decode_attention", q=q, k_cache=k_cache, v_cache=v_cache)
    scale = check_decode(q, k_cache, v_cache, cache_seqlens, block_table, k_scales, v_scales, scale, causal, window,
                         softcap, num_splits, check_inputs)  # fmt: skip
    out, lse = decode_attention_op(q, k_cache, v_cache, cache_seqlens, block_table, k_scales, v_scales, scale, causal,
                                   window, float(softcap), num_splits)  # fmt: skip
    return (out, lse) if return_lse else out


def kv_cache_append(
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
    *,
    block_table: torch.Tensor | None = None,
    k_scales: torch.Tensor | None = None,
    v_scales: torch.Tensor | None = None,
    check_inputs: bool | None = None,
) -> None:
    """Write new keys and values into a KV cache, in place, with no host synchronisation.

    k_new, v_new (B, Sq, Hk, D) go to positions cache_seqlens[b] .. cache_seqlens[b] + Sq - 1 of sequence b (the
    lengths before the append; add Sq to them afterwards). The cache is contiguous or paged, in any format of
    :func:`decode_attention`; a quantized cache gets codes and scales exactly as :func:`quantize_kv` makes them.
    A plain cache takes new values of its own dtype; a quantized one takes fp16, bf16 or fp32.

    Values are checked as in decode_attention (positions within the capacity, pages inside the pool); unchecked, a
    position past the capacity or on a page outside the pool is not written.

    Example: ``tk.ops.kv_cache_append(k, v, k_cache, v_cache, seqlens, block_table=table); seqlens += 1``.
    """
    _refuse_gradients("kv_cache_append", k_new=k_new, v_new=v_new)
    check_append(k_new, v_new, k_cache, v_cache, cache_seqlens, block_table, k_scales, v_scales, check_inputs)
    kv_cache_append_op(k_new, v_new, k_cache, v_cache, cache_seqlens, block_table, k_scales, v_scales)


def quantize_kv(x: torch.Tensor, dtype: str, *, group_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys or values (..., D) in a quantized KV-cache format: (data, scales).

    - ``"int8"``: data int8 (..., D), scales fp32 (...,): x' = code * scale, scale = max|x| / 127 per row of D.
    - ``"fp8"``: data float8_e4m3fn (..., D), scales fp32 (...,): scale = max|x| / 448 per row.
    - ``"int4"``: data uint8 (..., D / 2), two codes per byte (value 2i in the low nibble); scales fp16
      (..., D / G, 2), a (scale, zero) pair per group of G values: x' = code * scale + zero, zero the group's
      minimum, scale (max - min) / 15. ``group_size`` G: an even power of two dividing D (default gcd(D, 32)).

    Codes round to nearest (ties to even); the result is bit-exact with what kv_cache_append writes. A row (or
    group) of zeros gets scale 0 and dequantizes to zeros.

    Example: ``k_data, k_scales = tk.ops.quantize_kv(k_cache_bf16, "int8")``.
    """
    _refuse_gradients("quantize_kv", x=x)
    group = check_quantize("quantize_kv", x, dtype, group_size)
    return quantize_kv_op(x, dtype, group)


def dequantize_kv(data: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """The values (..., D) in ``dtype`` of :func:`quantize_kv`'s (data, scales); the format follows data's dtype.

    Example: ``k = tk.ops.dequantize_kv(k_data, k_scales)``.
    """
    check_dequantize("dequantize_kv", data, scales, dtype)
    return dequantize_kv_op(data, scales, dtype)
