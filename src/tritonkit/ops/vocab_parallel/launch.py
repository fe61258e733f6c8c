"""Vocabulary-parallel cross-entropy launchers: validate, allocate, launch, combine across ranks (tensors in, tensors
out; ``plan=``).

Each rank holds a slice of the vocabulary: its logits (or its rows of the LM head's weight) for classes
[vocab_start, vocab_start + n) of vocab_size. The forward runs the statistics kernel on the slice, combines the
statistics across the group with two all-reduces per row batch (the maxima; then the rescaled sums, the target
logits and the sums of logits, in one), and gets the loss and lse every rank agrees on. The gradient kernel then
writes the slice's d(loss)/d(logits) from the global lse alone.

The fused form never builds the (tokens, vocab) logits, nor even the (tokens, vocab / ranks) slice: tokens go
through in chunks (the single-GPU fused op's rule, _core/loss_chunks.py, for the group's largest slice: see
:func:`fused_plan`; or ``plan=``), each chunk's slice of logits from one GEMM into a reused buffer, its statistics
all-reduced, then overwritten with their gradient and projected by two more GEMMs into the chunk's share of
d(hidden) and this rank's slice of d(weight): summed over the chunks in fp32, or, where one chunk takes every token,
from one GEMM in the weight's dtype. d(hidden) is summed over the group once at the end: every rank gets the full
gradient of the hidden states they share. For mean and sum this happens in the forward; the backward
of ``reduction="none"`` recomputes the chunks (from the saved lse: no statistics, no all-reduce but d(hidden)'s).

Every rank of the group must call with the same tokens and targets (the chunks' all-reduces pair up in order). The
group travels by name (custom ops' schemas take no ProcessGroup); "" is a world of one, where nothing is reduced.
Nothing synchronises with the host.
"""

from __future__ import annotations

import torch

from tritonkit._core.device import arch
from tritonkit._core.distributed import all_reduce, group_size
from tritonkit._core.ints import cdiv
from tritonkit._core.loss_chunks import FusedChunkPlan, plan_and_accum
from tritonkit._core.losses import (
    add_chunk_grads,
    chunk_logits,
    fake_grads,
    fake_loss_and_lse,
    grad_buffers,
    grad_scale,
    mean_count,
    or_empty,
    reduced,
)
from tritonkit.ops.vocab_parallel.kernels import _vocab_slice_grad_kernel, _vocab_slice_stats_kernel
from tritonkit.ops.vocab_parallel.plan import SlicePlan, slice_plan

_STATS = 4  # per row and slice: max, sum of exps, target logit, sum of logits


def _launch_stats(x, target, vocab_start, softcap, smoothing, plan=None) -> torch.Tensor:
    """(rows, 4) fp32 statistics of this slice (kernels.py)."""
    n_rows, n_cols = x.shape
    stats = torch.empty((n_rows, _STATS), dtype=torch.float32, device=x.device)
    if n_rows:
        plan = plan or slice_plan(n_cols, arch(x.device))
        _vocab_slice_stats_kernel[(n_rows,)](
            x, target, stats, n_cols, x.stride(0), target.stride(0), stats.stride(0), vocab_start, softcap,
            HAS_SMOOTHING=smoothing != 0.0, HAS_SOFTCAP=softcap != 0.0, BLOCK_N=plan.block_n, num_warps=plan.warps,
        )  # fmt: skip
    return stats


def _launch_grad(x, target, lse, scale, dx, vocab_start, vocab_size, options, plan=None) -> None:
    """dx = scale_row * d(loss)/dx over this slice; ``scale`` 0-d (one factor) or (rows,), possibly stride 0."""
    ignore_index, label_smoothing, z_loss, softcap = options
    n_rows, n_cols = x.shape
    if n_rows == 0 or n_cols == 0:
        return
    plan = plan or slice_plan(n_cols, arch(x.device))
    _vocab_slice_grad_kernel[(n_rows,)](
        x, target, lse, scale, dx,
        n_cols, x.stride(0), target.stride(0), scale.stride(0) if scale.dim() else 0, dx.stride(0),
        vocab_start, vocab_size, ignore_index, label_smoothing, z_loss, softcap,
        HAS_SMOOTHING=label_smoothing != 0.0, HAS_SOFTCAP=softcap != 0.0, BLOCK_N=plan.block_n, num_warps=plan.warps,
    )  # fmt: skip


def _combine(stats, target, vocab_size, options, group) -> tuple[torch.Tensor, torch.Tensor]:
    """The group's statistics combined into every rank's fp32 (loss per row, lse per row): 0 loss on ignored rows,
    NaN where the target lies outside [0, vocab_size)."""
    ignore_index, label_smoothing, z_loss, _ = options
    maxima = all_reduce(stats[:, 0].clone(), "max", group)
    shift = torch.where(maxima == float("-inf"), 0.0, maxima)  # a row of -inf logits: exp(-inf - 0) = 0, no NaN
    sums = stats[:, 1:]
    sums[:, 0] *= torch.exp(stats[:, 0] - shift)
    sums = all_reduce(sums.contiguous(), "sum", group)
    lse = shift + torch.log(sums[:, 0])
    loss = lse - (1.0 - label_smoothing) * sums[:, 1] + z_loss * lse * lse
    if label_smoothing:
        loss = loss - label_smoothing / vocab_size * sums[:, 2]
    valid = (target >= 0) & (target < vocab_size)
    loss = torch.where(target == ignore_index, 0.0, torch.where(valid, loss, float("nan")))
    return loss, lse


def vocab_parallel_cross_entropy_fwd(
    logits: torch.Tensor, target: torch.Tensor, vocab_start: int, vocab_size: int, group: str, ignore_index: int,
    label_smoothing: float, z_loss: float, softcap: float, reduction: str, loss_dtype: torch.dtype, *,
    plan: SlicePlan | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """logits: (rows, n) this rank's slice, unit column stride; target: (rows,) global class indices. Returns the
    reduced loss (in ``loss_dtype``) and the fp32 global lse per row, the same on every rank of ``group``."""
    options = (ignore_index, label_smoothing, z_loss, softcap)
    stats = _launch_stats(logits, target, vocab_start, softcap, label_smoothing, plan)
    loss_rows, lse = _combine(stats, target, vocab_size, options, group)
    return reduced(loss_rows, reduction, loss_dtype, mean_count(target, ignore_index, reduction)), lse


def vocab_parallel_cross_entropy_bwd(
    grad_loss: torch.Tensor, logits: torch.Tensor, target: torch.Tensor, lse: torch.Tensor, vocab_start: int,
    vocab_size: int, ignore_index: int, label_smoothing: float, z_loss: float, softcap: float, reduction: str, *,
    plan: SlicePlan | None = None,
) -> torch.Tensor:  # fmt: skip
    """d(loss)/d(logits) of this rank's slice, (rows, n) in logits' dtype, times ``grad_loss``; no communication."""
    dx = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
    scale = grad_scale(grad_loss, reduction, mean_count(target, ignore_index, reduction))
    options = (ignore_index, label_smoothing, z_loss, softcap)
    _launch_grad(logits, target, lse, scale, dx, vocab_start, vocab_size, options, plan)
    return dx


def fused_plan(hidden: torch.Tensor, weight: torch.Tensor, vocab_size: int, group: str, need_weight: bool,
               plan: FusedChunkPlan | None = None) -> tuple[FusedChunkPlan, torch.dtype]:  # fmt: skip
    """The fused op's chunks (``plan``, else the single-GPU fused op's rule: _core/loss_chunks.plan_and_accum) and
    the dtype this slice's d(weight) and d(bias) come in: fp32, summed over the chunks, or the weight's where one
    chunk takes every token. ``need_weight``: a d(weight) is made.

    Every rank of the group must run the same chunks, or the chunks' all-reduces would not pair up. The rule reads
    the tokens, H, the dtypes and the device's arch, which the ranks share, and the classes: it plans for the
    group's largest slice, ceil(vocab_size / ranks), not this rank's own, which DTensor's uneven split (torch.chunk's
    rule) makes shorter on the last ranks. An even split's slices are all that large."""
    largest_slice = cdiv(vocab_size, group_size(group))
    return plan_and_accum(hidden, weight, torch.float32, need_weight, plan, n_classes=largest_slice)


def _chunks(hidden, weight, bias, target, vocab_start, vocab_size, group, options, loss_rows, lse, scale, grads,
            plan):  # fmt: skip
    """The fused op's chunk loop (module docstring), in ``plan``'s chunks. With ``loss_rows`` each chunk's
    statistics are combined into loss_rows and lse (the forward); without, lse is read (the backward of "none").
    With ``scale`` the chunk's gradient is written over its logits and projected into whichever of ``grads``
    (d(hidden), d(weight), d(bias)) are given; d(hidden) is then summed over the group."""
    grad_hidden = grads[0]
    n_tokens = hidden.shape[0]
    rows_per_chunk = plan.rows
    buffer = torch.empty((min(rows_per_chunk, n_tokens), weight.shape[0]), dtype=hidden.dtype, device=hidden.device)
    for start in range(0, n_tokens, rows_per_chunk):
        rows = slice(start, min(start + rows_per_chunk, n_tokens))
        h_chunk, t_chunk, logits = hidden[rows], target[rows], buffer[: rows.stop - start]
        chunk_logits(h_chunk, weight, bias, logits)
        if loss_rows is not None:
            stats = _launch_stats(logits, t_chunk, vocab_start, options[3], options[1])
            loss_rows[rows], lse[rows] = _combine(stats, t_chunk, vocab_size, options, group)
        if scale is None:
            continue
        row_scale = scale[rows] if scale.dim() else scale
        _launch_grad(logits, t_chunk, lse[rows], row_scale, logits, vocab_start, vocab_size, options)
        add_chunk_grads(logits, h_chunk, weight, rows, grads)
    if grad_hidden is not None:
        all_reduce(grad_hidden, "sum", group)


def vocab_parallel_fused_linear_cross_entropy_fwd(
    hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, bias: torch.Tensor | None, vocab_start: int,
    vocab_size: int, group: str, ignore_index: int, label_smoothing: float, z_loss: float, softcap: float,
    reduction: str, loss_dtype: torch.dtype, need_hidden: bool, need_weight: bool, need_bias: bool, *,
    plan: FusedChunkPlan | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """hidden: (tokens, H), the same on every rank; weight: (n, H) this rank's rows of the head (classes
    [vocab_start, vocab_start + n)); bias: (n,) or None; target: (tokens,).

    Returns (loss, lse, grad_hidden, grad_weight, grad_bias), the loss in ``loss_dtype``: for "mean" and "sum" the
    gradients the need_* flags ask for, for an upstream gradient of 1 (d(hidden) summed over the group; d(weight),
    d(bias) of this slice in fused_plan's dtype); absent ones, and all of them for "none", are empty tensors.
    ``plan``: the chunks (fused_plan's unless given; the same on every rank).
    """
    n_tokens = hidden.shape[0]
    loss_rows = torch.empty((n_tokens,), dtype=torch.float32, device=hidden.device)
    lse = torch.empty((n_tokens,), dtype=torch.float32, device=hidden.device)
    now = reduction != "none"
    plan, accum_dtype = fused_plan(hidden, weight, vocab_size, group, need_weight and now, plan)
    grads = grad_buffers(hidden, weight, bias, need_hidden and now, need_weight and now, need_bias and now,
                         accum_dtype)  # fmt: skip
    options = (ignore_index, label_smoothing, z_loss, softcap)
    count = mean_count(target, ignore_index, reduction)
    scale = None
    if any(g is not None for g in grads):
        scale = grad_scale(torch.ones((), dtype=torch.float32, device=hidden.device), reduction, count)
    _chunks(hidden, weight, bias, target, vocab_start, vocab_size, group, options, loss_rows, lse, scale, grads,
            plan)  # fmt: skip
    loss = reduced(loss_rows, reduction, loss_dtype, count)
    return loss, lse, *(or_empty(g, lse) for g in grads)


def vocab_parallel_fused_linear_cross_entropy_bwd(
    grad_loss: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
    bias: torch.Tensor | None, lse: torch.Tensor, vocab_start: int, vocab_size: int, group: str, ignore_index: int,
    label_smoothing: float, z_loss: float, softcap: float, need_hidden: bool, need_weight: bool, need_bias: bool, *,
    plan: FusedChunkPlan | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """The backward of reduction="none": the chunks recomputed, each row's gradient weighted by its ``grad_loss``.
    Returns grad_hidden (summed over the group), grad_weight, grad_bias (in fused_plan's dtype); absent ones empty.
    ``plan`` as the forward's."""
    plan, accum_dtype = fused_plan(hidden, weight, vocab_size, group, need_weight, plan)
    grads = grad_buffers(hidden, weight, bias, need_hidden, need_weight, need_bias, accum_dtype)
    options = (ignore_index, label_smoothing, z_loss, softcap)
    _chunks(hidden, weight, bias, target, vocab_start, vocab_size, group, options, None, lse, grad_loss.reshape(-1),
            grads, plan)  # fmt: skip
    return tuple(or_empty(g, lse) for g in grads)


def vocab_parallel_cross_entropy_fwd_fake(logits, target, vocab_start, vocab_size, group, ignore_index,
                                          label_smoothing, z_loss, softcap, reduction, loss_dtype):  # fmt: skip
    return fake_loss_and_lse(logits, reduction, loss_dtype)


def vocab_parallel_cross_entropy_bwd_fake(grad_loss, logits, *rest):
    return torch.empty_like(logits)


def vocab_parallel_fused_linear_cross_entropy_fwd_fake(hidden, weight, target, bias, vocab_start, vocab_size, group,
                                                       *options_and_needs):  # fmt: skip
    *_, reduction, loss_dtype, need_hidden, need_weight, need_bias = options_and_needs
    now = reduction != "none"
    _, accum_dtype = fused_plan(hidden, weight, vocab_size, group, need_weight and now)
    return (
        *fake_loss_and_lse(hidden, reduction, loss_dtype),
        *fake_grads(hidden, weight, bias, need_hidden and now, need_weight and now, need_bias and now, accum_dtype),
    )


def vocab_parallel_fused_linear_cross_entropy_bwd_fake(grad_loss, hidden, weight, target, bias, lse, vocab_start,
                                                       vocab_size, group, *options_and_needs):  # fmt: skip
    *_, need_hidden, need_weight, need_bias = options_and_needs
    _, accum_dtype = fused_plan(hidden, weight, vocab_size, group, need_weight)
    return fake_grads(hidden, weight, bias, need_hidden, need_weight, need_bias, accum_dtype)
