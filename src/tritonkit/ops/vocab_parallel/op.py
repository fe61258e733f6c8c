"""vocab_parallel_cross_entropy and vocab_parallel_fused_linear_cross_entropy: the public functions, their autograd
built by the one factory.

The vocabulary is split across the ranks of a tensor-parallel group, as Megatron-LM's ``VocabParallelEmbedding`` /
``ColumnParallelLinear`` LM head and torchtitan's ``ColwiseParallel`` head (``loss_parallel``) split it. The slice
comes one of two ways:

- plain tensors with ``process_group=`` (Megatron's convention): this rank's slice of an even split, rank r of the
  group holding classes [r n, (r + 1) n) of world_size n;
- DTensors (torch.distributed.tensor): the logits ``Shard(-1)``, or the head's weight (and bias) ``Shard(0)``, on
  one mesh dimension and ``Replicate()`` on the others; the group is that mesh dimension's, and uneven splits
  follow DTensor's own rule. The other inputs (hidden, target) are plain tensors or ``Replicate()`` DTensors.

Inputs other than the slice (hidden states, targets) must be the same on every rank of the group. The loss comes
back as a plain tensor, the same on every rank.
"""

from __future__ import annotations

import torch

from tritonkit._core.autograd import differentiable_op
from tritonkit._core.checks import FLOAT_DTYPES, check_device, check_tensor
from tritonkit._core.distributed import describe, group_name, group_rank_and_size, is_dtensor, sharded_dim
from tritonkit._core.layout import as_rows
from tritonkit._core.losses import (
    check_linear_head,
    check_loss_dtype,
    check_loss_options,
    check_target,
    head_grads,
    needs_grad,
    saved_head_grads,
)
from tritonkit.ops.vocab_parallel.launch import (
    vocab_parallel_cross_entropy_bwd,
    vocab_parallel_cross_entropy_bwd_fake,
    vocab_parallel_cross_entropy_fwd,
    vocab_parallel_cross_entropy_fwd_fake,
    vocab_parallel_fused_linear_cross_entropy_bwd,
    vocab_parallel_fused_linear_cross_entropy_bwd_fake,
    vocab_parallel_fused_linear_cross_entropy_fwd,
    vocab_parallel_fused_linear_cross_entropy_fwd_fake,
)


def _save_ce(ctx, inputs, outputs):
    logits, target, vocab_start, vocab_size, _group, *options, _loss_dtype = inputs
    ctx.save_for_backward(logits, target, outputs[1])
    ctx.slice, ctx.options = (vocab_start, vocab_size), tuple(options)


def _ce_gradients(ctx, grad_outputs, backward):
    if grad_outputs[0] is None:  # only lse was used, and it carries no gradient
        return (None,)
    logits, target, lse = ctx.saved_tensors
    return (backward(grad_outputs[0], logits, target, lse, *ctx.slice, *ctx.options),)


vocab_parallel_cross_entropy_op = differentiable_op(
    "vocab_parallel_cross_entropy",
    forward=vocab_parallel_cross_entropy_fwd,
    forward_fake=vocab_parallel_cross_entropy_fwd_fake,
    backward=vocab_parallel_cross_entropy_bwd,
    backward_fake=vocab_parallel_cross_entropy_bwd_fake,
    save=_save_ce,
    gradients=_ce_gradients,
    non_differentiable=(1,),  # lse
)


def _save_fused(ctx, inputs, outputs):
    """mean/sum keep the forward's gradients; "none" keeps what the recomputing backward reads."""
    hidden, weight, target, bias, *rest = inputs
    # rest: start, size, group, the four options, reduction, loss_dtype, the need_* flags
    ctx.rest, ctx.needs = tuple(rest[:-5]), tuple(rest[-3:])
    ctx.dtypes = (hidden.dtype, weight.dtype, bias.dtype if bias is not None else None)
    ctx.recompute = rest[-5] == "none"
    ctx.save_for_backward(*((hidden, weight, target, bias, outputs[1]) if ctx.recompute else outputs[2:]))


def _fused_gradients(ctx, grad_outputs, backward):
    """(grad_hidden, grad_weight, None for target, grad_bias), None where not needed."""
    grad_loss = grad_outputs[0]
    if grad_loss is None:
        return ()
    if ctx.recompute:
        grads = backward(grad_loss, *ctx.saved_tensors, *ctx.rest, *ctx.needs)
        grads = head_grads(grads, grad_loss, ctx.dtypes, ctx.needs, True)
    else:  # d(weight) and d(bias) summed in fp32, or in the weight's dtype where one chunk took every token
        grads = saved_head_grads(ctx.saved_tensors, grad_loss, ctx.dtypes, ctx.needs, torch.float32)
    return grads[0], grads[1], None, grads[2]


vocab_parallel_fused_linear_cross_entropy_op = differentiable_op(
    "vocab_parallel_fused_linear_cross_entropy",
    forward=vocab_parallel_fused_linear_cross_entropy_fwd,
    forward_fake=vocab_parallel_fused_linear_cross_entropy_fwd_fake,
    backward=vocab_parallel_fused_linear_cross_entropy_bwd,
    backward_fake=vocab_parallel_fused_linear_cross_entropy_bwd_fake,
    save=_save_fused,
    gradients=_fused_gradients,
    # The gradients are outputs only so that the custom op can save them; materialised, autograd would hand the
    # backward a zero tensor of each.
    non_differentiable=(1, 2, 3, 4),
)


def _vocab_slice(name: str, sliced: dict, shared: dict, dim: int, process_group) -> tuple[dict, int, int, str]:
    """The local tensors, this rank's first class, the vocabulary size and the group's name.

    ``sliced``: the tensors split along the vocabulary (logits, or weight and bias), their split dimension ``dim``;
    ``shared``: the tensors every rank holds whole (hidden, target).
    """
    first, tensor = next(iter(sliced.items()))
    local = {}
    if is_dtensor(tensor):
        if process_group is not None:
            raise ValueError(f"{name}: {first} is a DTensor, whose mesh gives the group; leave process_group None")
        where = sharded_dim(name, first, tensor, dim)
        for key, value in sliced.items():
            if value is not None and (not is_dtensor(value) or value.placements != tensor.placements
                                      or value.device_mesh != tensor.device_mesh):  # fmt: skip
                raise ValueError(f"{name}: {key} must be a DTensor placed as {first} is ({tensor.placements})")
            local[key] = value.to_local() if value is not None else None
        for key, value in shared.items():
            if is_dtensor(value):
                if value.device_mesh != tensor.device_mesh or not all(p.is_replicate() for p in value.placements):
                    placements = ", ".join(describe(p) for p in value.placements)
                    raise ValueError(
                        f"{name}: {key} must be whole on every rank (a plain tensor or Replicate() on {first}'s "
                        f"mesh), got ({placements}); redistribute it to Replicate() first"
                    )
                # The op sums d(hidden) over the group: each rank's gradient is already the whole one.
                value = value.to_local(grad_placements=value.placements)
            local[key] = value
        return local, where.start, where.size, group_name(where.group)
    for key, value in {**sliced, **shared}.items():
        if is_dtensor(value):
            raise TypeError(f"{name}: {key} is a DTensor but {first} is not; pass both as DTensors or neither")
        local[key] = value
    rank, ranks = group_rank_and_size(process_group)
    n = tensor.shape[dim]
    return local, rank * n, ranks * n, group_name(process_group)


def vocab_parallel_cross_entropy(
    logits: torch.Tensor, target: torch.Tensor, *, process_group=None, ignore_index: int = -100,
    label_smoothing: float = 0.0, z_loss: float = 0.0, softcap: float | None = None, reduction: str = "mean",
    loss_dtype: torch.dtype | None = None,
) -> torch.Tensor:  # fmt: skip
    """Cross-entropy of logits split along the vocabulary across a tensor-parallel group, never gathered.

    ``logits``: (..., n) this rank's slice of the classes (plain, with ``process_group``: rank r holds classes
    [r n, (r + 1) n), Megatron's ``vocab_parallel_cross_entropy`` layout; the default group is the world), or a
    DTensor (..., V) ``Shard(-1)`` over one mesh dimension (torchtitan's ``loss_parallel`` layout). ``target``:
    (...) global class indices, the same on every rank. Options (``loss_dtype`` too) and result as
    :func:`cross_entropy` (a plain tensor, equal on every rank). Differentiable in logits: each rank gets its slice's
    gradient (a DTensor placed as the logits for DTensor logits). Two all-reduces of a few floats per row.

    Example: ``loss = tk.ops.vocab_parallel_cross_entropy(local_logits, labels, process_group=tp_group)``.
    """
    name = "vocab_parallel_cross_entropy"
    options = check_loss_options(name, ignore_index, label_smoothing, z_loss, softcap, reduction)
    local, start, size, group = _vocab_slice(name, {"logits": logits}, {"target": target}, -1, process_group)
    logits, target = local["logits"], local["target"]
    check_tensor("logits", logits, dtypes=FLOAT_DTYPES)
    if logits.dim() == 0:
        raise ValueError(f"{name}: logits must be (..., n), this rank's n classes, got a 0-d tensor")
    check_target(name, target, tuple(logits.shape[:-1]))
    check_device(logits=logits, target=target)
    loss_dtype = check_loss_dtype(name, loss_dtype, logits.dtype)
    loss, _ = vocab_parallel_cross_entropy_op(as_rows(logits), target.reshape(-1), start, size, group, *options,
                                              loss_dtype)  # fmt: skip
    return loss.view(target.shape) if reduction == "none" else loss


def vocab_parallel_fused_linear_cross_entropy(
    hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, bias: torch.Tensor | None = None, *,
    process_group=None, ignore_index: int = -100, label_smoothing: float = 0.0, z_loss: float = 0.0,
    softcap: float | None = None, reduction: str = "mean", loss_dtype: torch.dtype | None = None,
) -> torch.Tensor:  # fmt: skip
    """``cross_entropy(hidden @ weight.T + bias, target)`` for an LM head split along the vocabulary, without
    building the logits or gathering anything of the vocabulary's size.

    ``weight``: (n, H) this rank's rows of the head (plain, with ``process_group``: rank r holds classes
    [r n, (r + 1) n); the default group is the world), or a DTensor (V, H) ``Shard(0)`` over one mesh dimension
    (torch's ``ColwiseParallel`` on the head); ``bias``: (n,) likewise, or None. ``hidden``: (..., H) and
    ``target``: (...), the same on every rank (plain, or ``Replicate()`` DTensors). One float dtype for hidden,
    weight and bias. Options and result as :func:`fused_linear_cross_entropy` (a plain tensor, equal on every
    rank). Gradients: d(hidden) summed over the group (every rank gets the whole gradient), d(weight) and d(bias)
    of this rank's slice (placed as the weight for a DTensor). Tokens go through in fused_linear_cross_entropy's
    chunks, planned for the group's largest slice of the head (the same chunks on every rank; one chunk of every
    token where the memory allows, up to 8192 tokens at H 4096 in bf16, where a 16-bit head's gradients come in its
    dtype and the backward scales them in place: a second backward through the call, ``retain_graph=True``, then
    raises); per chunk, two all-reduces of a few floats per token; one all-reduce of d(hidden) at the end.

    Example: ``loss = tk.ops.vocab_parallel_fused_linear_cross_entropy(h, lm_head.weight, labels)`` with the head
    under ``ColwiseParallel``.
    """
    name = "vocab_parallel_fused_linear_cross_entropy"
    options = check_loss_options(name, ignore_index, label_smoothing, z_loss, softcap, reduction)
    local, start, size, group = _vocab_slice(name, {"weight": weight, "bias": bias},
                                             {"hidden": hidden, "target": target}, 0, process_group)  # fmt: skip
    hidden, weight, target, bias = local["hidden"], local["weight"], local["target"], local["bias"]
    check_linear_head(name, hidden, weight, bias)
    check_target(name, target, tuple(hidden.shape[:-1]))
    check_device(hidden=hidden, target=target)
    needs = (needs_grad(hidden), needs_grad(weight), needs_grad(bias))
    rows, target_rows = hidden.reshape(-1, hidden.shape[-1]), target.reshape(-1)
    loss_dtype = check_loss_dtype(name, loss_dtype, hidden.dtype)
    loss = vocab_parallel_fused_linear_cross_entropy_op(rows, weight, target_rows, bias, start, size, group, *options,
                                                        loss_dtype, *needs)[0]  # fmt: skip
    return loss.view(target.shape) if reduction == "none" else loss
