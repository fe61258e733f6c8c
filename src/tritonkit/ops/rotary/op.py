"""rope: the public function, its autograd built by the one factory. The backward of RoPE is RoPE with the opposite
``backward`` flag (the rotation's transpose), so the op is its own backward and a double backward works."""

from __future__ import annotations

import torch

from tritonkit._core.autograd import differentiable_op
from tritonkit._core.distributed import local_shards
from tritonkit.ops.rotary.launch import HEADS_DIM, check_rope_args, rope_fake, rope_fwd


def _save(ctx, inputs, outputs):
    """Keep the tables; mark the embedding of q or k non-differentiable when that input needs no gradient, so that
    it does not require grad (one kernel computes both, and its backward returns both gradients). Per call, hence
    here and not in the factory's fixed ``non_differentiable`` (which rope does not use, so nothing overwrites it)."""
    q, k, cos, sin, position_ids, heads_dim, backward = inputs
    ctx.save_for_backward(cos, sin, position_ids)
    ctx.heads_dim, ctx.backward = heads_dim, backward
    ctx.q_meta, ctx.k_meta = (q.shape, q.dtype), (k.shape, k.dtype)
    constant = [out for out, needed in zip(outputs, ctx.needs_input_grad[:2], strict=True) if not needed]
    if constant:
        ctx.mark_non_differentiable(*constant)


def _zeros_if_none(grad: torch.Tensor | None, meta, like: torch.Tensor) -> torch.Tensor:
    """An unused output's gradient: zeros expanded from one element (stride 0, nothing allocated)."""
    shape, dtype = meta
    return grad if grad is not None else torch.zeros((), dtype=dtype, device=like.device).expand(shape)


def _gradients(ctx, grad_outputs, rope):
    """rope with the opposite flag on the output gradients (which may be expanded, stride 0)."""
    cos, sin, position_ids = ctx.saved_tensors
    dq, dk = _zeros_if_none(grad_outputs[0], ctx.q_meta, cos), _zeros_if_none(grad_outputs[1], ctx.k_meta, cos)
    return rope(dq, dk, cos, sin, position_ids, ctx.heads_dim, not ctx.backward)


rope_op = differentiable_op("rope", forward=rope_fwd, forward_fake=rope_fake, save=_save, gradients=_gradients)


def _axes(arguments) -> dict:
    """Each dimension's axis, for DTensor inputs: q and k split by batch, tokens or heads run shard by shard; the
    tables follow the tokens (or, gathered by position_ids, are whole), and head_dim is never split."""
    qk = ("batch", "tokens", "heads", "head_dim") if arguments["layout"] == "bthd" else ("batch", "heads", "tokens",
                                                                                       "head_dim")  # fmt: skip
    if arguments["position_ids"] is not None:
        table = ("positions", "head_dim")
    else:
        table = ("batch", "tokens", "head_dim")[-getattr(arguments["cos"], "ndim", 3) :]
    return {"q": qk, "k": qk, "cos": table, "sin": table, "position_ids": ("batch", "tokens")}


@local_shards("rope", axes=_axes, whole=("head_dim", "positions"), outputs=("q", "k"))
def rope(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    position_ids: torch.Tensor | None = None,
    layout: str = "bhtd",
    rotary_dim: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary position embedding of q and k, as Hugging Face's ``apply_rotary_pos_emb``.

    ``q_embed = q * cos + rotate_half(q) * sin`` on the first R = ``rotary_dim`` (default head_dim)
    columns of every head, ``rotate_half(x) = cat(-x[..., R/2:], x[..., :R/2])``; columns beyond R are
    copied. The same for k. Computed in fp32, stored in q's dtype; returns new ``(q_embed, k_embed)``.

    - ``layout="bhtd"``: q (B, Hq, T, D), k (B, Hk, T, D); ``"bthd"``: q (B, T, Hq, D), k (B, T, Hk, D).
      Hq and Hk may differ (GQA, MQA); any strides; fp32/fp16/bf16.
    - cos, sin: (T, R), (1, T, R) or (B, T, R), any float dtype; or, with ``position_ids`` of shape
      (B, T) or (1, T) (int32/int64), tables (max_position, R) whose rows are gathered per token.
      Positions outside [0, max_position) give NaN rows (no host check, so no synchronisation).
    - R must be even and at most head_dim. Differentiable in q and k (each embedding requires grad
      only when its input does); cos and sin are constants (no gradient: cos or sin requiring grad
      raises ValueError).
    - DTensor q and k split by batch, heads or tokens run on each rank's shard (the tables split like the
      tokens or, with position_ids, whole); head_dim cannot be split (docs/distributed.md).

    Example: ``q, k = tk.ops.rope(q, k, cos, sin)`` with cos, sin from a ``LlamaRotaryEmbedding``.
    """
    rotary_dim = check_rope_args(q, k, cos, sin, position_ids, layout, rotary_dim)
    cos3, sin3 = (cos, sin) if cos.dim() == 3 else (cos.unsqueeze(0), sin.unsqueeze(0))
    return rope_op(q, k, cos3, sin3, position_ids, HEADS_DIM[layout], False)
