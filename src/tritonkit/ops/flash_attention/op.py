"""attention and attention_varlen: the public functions, their autograd built by the one factory.

Both go through one pair of launchers (dense tensors, or packed ones with cu_seqlens), so they share one custom op
pair, ``tritonkit::attention_fwd`` and ``tritonkit::attention_bwd``. The log-sum-exp is the forward's second output,
kept for the backward and returned on request; no gradient flows through it.
"""

from __future__ import annotations

import torch

from tritonkit._core.autograd import differentiable_op
from tritonkit._core.checks import debug_checks
from tritonkit.ops.flash_attention.launch import (
    attention_bwd,
    attention_bwd_fake,
    attention_fwd,
    attention_fwd_fake,
    check_dense,
    check_options,
    check_varlen,
)


def _save(ctx, inputs, outputs):
    q, k, v, cu_seqlens_q, cu_seqlens_k, *options = inputs
    ctx.save_for_backward(q, k, v, outputs[0], outputs[1], cu_seqlens_q, cu_seqlens_k)
    ctx.options = options


def _gradients(ctx, grad_outputs, backward):
    grad_out = grad_outputs[0]
    if grad_out is None:  # only the lse was used, and it carries no gradient
        return None, None, None
    q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k = ctx.saved_tensors
    return backward(grad_out, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, *ctx.options)


attention_op = differentiable_op(
    "attention",
    forward=attention_fwd,
    forward_fake=attention_fwd_fake,
    save=_save,
    gradients=_gradients,
    backward=attention_bwd,
    backward_fake=attention_bwd_fake,
    non_differentiable=(1,),
)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    scale: float | None = None,
    window: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    layout: str = "bhsd",
    return_lse: bool = False,
    deterministic: bool = True,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Flash attention: softmax(scale * q k^T, masked) v, never forming the score matrix.

    - ``layout="bhsd"``: q (B, Hq, Sq, D), k and v (B, Hk, Sk, D); ``"bshd"``: (B, S, H, D) as flash-attn. Any
      strides (a head dim that is not unit-stride is copied once). GQA/MQA: Hq a multiple of Hk. D from 1 to 256.
      fp16, bf16, and fp32 (products in full fp32, for checking).
    - ``scale`` defaults to 1/sqrt(D). ``causal``: query i sees keys j <= i + Sk - Sq (aligned bottom-right, as
      flash-attn 2). ``window=(left, right)``: query i, after that alignment, sees keys i - left <= j <= i + right;
      -1 is unbounded; causal is right = 0. ``softcap > 0``: scores become softcap * tanh(scores / softcap) before
      the softmax (Gemma 2).
    - Returns the output in q's layout and dtype (contiguous); with ``return_lse``, also the log-sum-exp of each
      query's scores, fp32 (B, Hq, Sq), which carries no gradient. A query that sees no key gets 0 and lse -inf.
    - Differentiable in q, k and v (fp32 accumulation). The backward is always deterministic: the same bits on
      every run (dK/dV by key block and dQ by query block, two kernels that each write their gradient once, no
      atomics). ``deterministic`` is accepted for flash-attn's signature, and both values give that same
      reproducible backward: a fused backward that added dQ atomically measured 17% slower on the H200.

    Example: ``o = tk.ops.attention(q, k, v, causal=True)``.
    """
    heads_dim = check_dense(q, k, v, layout, causal)
    scale, left, right, softcap = check_options("attention", q.shape[-1], causal, scale, window, softcap,
                                                deterministic)  # fmt: skip
    seq_dim = 3 - heads_dim
    out, lse = attention_op(q, k, v, None, None, q.shape[seq_dim], k.shape[seq_dim], heads_dim, scale, left, right,
                            softcap)  # fmt: skip
    return (out, lse) if return_lse else out


def attention_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    causal: bool = False,
    scale: float | None = None,
    window: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    return_lse: bool = False,
    check_inputs: bool | None = None,
    deterministic: bool = True,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Flash attention over packed sequences, as flash-attn's ``flash_attn_varlen_func``.

    q (total_q, Hq, D), k and v (total_k, Hk, D): sequence b holds rows cu_seqlens_q[b] to cu_seqlens_q[b + 1] of q
    and the same of cu_seqlens_k in k and v; ``cu_seqlens_*`` are int32 (B + 1,), rising from 0 to the total.
    ``max_seqlen_*`` are the longest sequences (plain ints: they size the launch grid). Options (``deterministic``
    included: the backward is always deterministic) and returns as :func:`attention`; the lse is (Hq, total_q).

    Reading cu_seqlens' values would synchronise with the GPU, so they are checked (0 first, the total last, no
    decrease, no sequence beyond its max) only with ``check_inputs=True`` or ``TRITONKIT_DEBUG=1``, and always when
    they are on the CPU. Unchecked, offsets that break those rules leave rows of the output unwritten.

    Example: ``o = tk.ops.attention_varlen(q, k, v, cu, cu, max_len, max_len, causal=True)``.
    """
    check_values = cu_seqlens_q.device.type == "cpu" if isinstance(cu_seqlens_q, torch.Tensor) else False
    check_values = debug_checks("attention_varlen: check_inputs", check_inputs) or check_values
    check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, check_values)
    scale, left, right, softcap = check_options("attention_varlen", q.shape[-1], causal, scale, window, softcap,
                                                deterministic)  # fmt: skip
    out, lse = attention_op(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, 1, scale, left, right,
                            softcap)  # fmt: skip
    return (out, lse) if return_lse else out
