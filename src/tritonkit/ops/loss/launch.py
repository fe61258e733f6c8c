"""Cross-entropy launchers: validate the public arguments, allocate, launch (tensors in, tensors out; ``plan=``).

``cross_entropy`` reads the logits once in the forward (loss and the fp32 lse, saved) and once in the backward,
which writes the gradient already multiplied by the upstream gradient: three passes over the logits in all. The
fused linear cross-entropy never builds the (tokens, vocab) logits: tokens go through in chunks (the rule it shares
with the vocabulary-parallel op, _core/loss_chunks.plan_and_accum, or ``plan=``); each chunk's logits come from one
GEMM into a reused buffer, the kernel overwrites them with their gradient, and two more GEMMs turn that into the
chunk's rows of d(hidden) and its share of d(weight), summed in fp32 or, with ``accum_dtype`` the weight's 16-bit
dtype, in that dtype (half the memory, a rounding a chunk). Where one chunk takes every token (the plan's rule: no
more memory than the chunks'), d(weight) comes from one GEMM straight in the weight's dtype, rounded once as the
fp32 sum's cast would be, and no accumulator exists. For mean and sum this all happens in the forward (the backward
multiplies in a scalar); ``reduction="none"`` weights each row by its own upstream gradient before the d(weight)
GEMM, so its backward recomputes the chunks.

Nothing here synchronises with the host: the mean divides by max(1, count of non-ignored targets) computed on the
device. A target outside [0, vocab) that is not ignore_index is never used as an address: its row's loss and
gradient are NaN. Checking the range on the host needs a synchronisation, so :func:`check_target_values` runs only
on request (the ops' ``check_targets=True`` or ``TRITONKIT_DEBUG=1``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from tritonkit._core.checks import FLOAT_DTYPES, check_tensor, overlaps_in_memory
from tritonkit._core.device import arch
from tritonkit._core.loss_chunks import FusedChunkPlan, plan_and_accum
from tritonkit._core.losses import (
    add_chunk_grads,
    chunk_logits,
    fake_grads,
    fake_loss_and_lse,
    grad_buffers,
    grad_scale,
    mean_count,
    needs_grad,
    or_empty,
    reduced,
    valid_count,
)
from tritonkit.ops.loss.kernels import _cross_entropy_kernel
from tritonkit.ops.loss.plan import CrossEntropyPlan, cross_entropy_plan


def check_inplace_logits(logits: torch.Tensor) -> None:
    """inplace_backward=True writes the gradient over the logits: refuse logits where that would be wrong.

    Only when a backward will run (grad mode on, logits requiring grad; torch.compile refuses the flag on its own).
    Elements sharing memory (an expanded tensor, stride 0, rows closer than their length) would receive several
    gradients in one place, the last written winning. A leaf, or a view of one, is a tensor the caller made and may
    read again: its values would be replaced by its own gradient."""
    if torch.compiler.is_compiling() or not needs_grad(logits):
        return
    why = "cross_entropy: inplace_backward=True writes the gradient over logits, but"
    if overlaps_in_memory(logits):
        raise ValueError(
            f"{why} logits' elements overlap in memory (shape {tuple(logits.shape)}, strides {logits.stride()}), "
            "so several gradients would land in one place; pass logits.contiguous() or leave inplace_backward False"
        )
    base = logits if logits._base is None else logits._base
    if base.is_leaf:
        raise ValueError(
            f"{why} logits is a leaf tensor or a view of one (a tensor created with requires_grad=True, which the "
            "caller may read again): its values would be replaced by their gradient. The in-place backward is for "
            "logits a layer produced and nothing reads after the loss; leave inplace_backward False here"
        )


def check_target_values(name: str, target: torch.Tensor, n_classes: int, ignore_index: int) -> None:
    """Raise ValueError if a target other than ignore_index lies outside [0, n_classes). Reads the device's values:
    a host synchronisation, so only on request (``check_targets``, TRITONKIT_DEBUG); skipped under torch.compile,
    where the branch on a device value would break the graph."""
    if torch.compiler.is_compiling():
        return
    bad = (target != ignore_index) & ((target < 0) | (target >= n_classes))
    if not bad.any():
        return
    where = bad.nonzero()[:3].tolist()
    first = ", ".join(f"{target[tuple(i)].item()} at {tuple(i)}" for i in where)
    raise ValueError(
        f"{name}: target must hold class indices in [0, {n_classes}) or ignore_index={ignore_index}, got "
        f"{int(bad.sum())} out of range (first: {first})"
    )


def _launch_rows(x, target, loss, lse, scale, dx, options, compute_loss, write_grad, plan=None, extras=None):
    """Run the kernel over every row of x (rows, V), unit column stride. ``options`` is
    (ignore_index, label_smoothing, z_loss, softcap), softcap 0 for none. Absent tensors may be any
    tensor: the switches keep the kernel from touching them. ``plan``: the plan for x's rows unless given.
    ``extras``: the options beyond torch's plain cross-entropy (class weights, the z-term on its own, accuracy)."""
    ignore_index, label_smoothing, z_loss, softcap = options
    n_rows, n_cols = x.shape
    if n_rows == 0:
        return
    plan = plan or cross_entropy_plan(n_cols, arch(x.device))
    _cross_entropy_kernel[(n_rows,)](
        x, target, loss, lse, scale, dx,
        n_cols, x.stride(0), target.stride(0), scale.stride(0) if scale.dim() else 0, dx.stride(0),
        ignore_index, label_smoothing, z_loss, softcap,
        COMPUTE_LOSS=compute_loss, WRITE_GRAD=write_grad, HAS_SMOOTHING=label_smoothing != 0.0,
        HAS_SOFTCAP=softcap != 0.0, BLOCK_N=plan.block_n, STAGES=plan.stages, num_warps=plan.warps,
        **(extras.kernel_args() if extras is not None else {}),
    )  # fmt: skip


def cross_entropy_fwd(
    logits: torch.Tensor, target: torch.Tensor, ignore_index: int, label_smoothing: float, z_loss: float,
    softcap: float, reduction: str, loss_dtype: torch.dtype, *, plan: CrossEntropyPlan | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """logits: (rows, V) with unit column stride; target: (rows,). Returns the reduced loss (in ``loss_dtype``, from
    fp32 per-row losses; 0-d, or (rows,) for "none") and the fp32 row lse the backward needs."""
    n_rows = logits.shape[0]
    loss_rows = torch.empty((n_rows,), dtype=torch.float32, device=logits.device)
    lse = torch.empty((n_rows,), dtype=torch.float32, device=logits.device)
    options = (ignore_index, label_smoothing, z_loss, softcap)
    _launch_rows(logits, target, loss_rows, lse, lse, logits, options, True, False, plan)
    return reduced(loss_rows, reduction, loss_dtype, mean_count(target, ignore_index, reduction)), lse


def cross_entropy_bwd(grad_loss: torch.Tensor, logits: torch.Tensor, target: torch.Tensor, lse: torch.Tensor,
                      ignore_index: int, label_smoothing: float, z_loss: float, softcap: float, reduction: str, *,
                      in_place: bool = False, plan: CrossEntropyPlan | None = None) -> torch.Tensor:  # fmt: skip
    """d(loss)/d(logits), (rows, V) in logits' dtype, already multiplied by ``grad_loss``; written over
    ``logits`` itself when ``in_place`` (the kernel reads each block before writing it)."""
    dx = logits if in_place else torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
    scale = grad_scale(grad_loss, reduction, mean_count(target, ignore_index, reduction))
    options = (ignore_index, label_smoothing, z_loss, softcap)
    _launch_rows(logits, target, lse, lse, scale, dx, options, False, True, plan)
    return dx


def _fused_chunks(hidden, weight, bias, target, options, loss_rows, lse, scale, grads, plan, extras=None):
    """The chunk loop of the fused op, in ``plan``'s chunks. With ``loss_rows`` the kernel computes loss and lse
    (forward), without it it reads lse (the recomputing backward of "none"). With a ``scale`` it writes each
    chunk's logit gradient over its logits and adds the chunk's share to whichever of ``grads``
    (grad_buffers': grad_hidden, grad_weight, grad_bias) are given."""
    n_tokens = hidden.shape[0]
    chunk = plan.rows
    buffer = torch.empty((min(chunk, n_tokens), weight.shape[0]), dtype=hidden.dtype, device=hidden.device)
    write_grad = scale is not None
    for start in range(0, n_tokens, chunk):
        end = min(start + chunk, n_tokens)
        rows = slice(start, end)
        h_chunk, logits = hidden[rows], buffer[: end - start]
        chunk_logits(h_chunk, weight, bias, logits)
        row_scale = scale[rows] if write_grad and scale.dim() else scale
        _launch_rows(
            logits, target[rows], loss_rows[rows] if loss_rows is not None else lse[rows], lse[rows],
            row_scale if write_grad else lse, logits, options, compute_loss=loss_rows is not None,
            write_grad=write_grad, extras=extras.rows(rows) if extras is not None else None,
        )  # fmt: skip
        if write_grad:
            add_chunk_grads(logits, h_chunk, weight, rows, grads)


def fused_linear_cross_entropy_fwd(
    hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, bias: torch.Tensor | None,
    ignore_index: int, label_smoothing: float, z_loss: float, softcap: float, reduction: str, loss_dtype: torch.dtype,
    need_hidden: bool, need_weight: bool, need_bias: bool, accum_dtype: torch.dtype, *,
    plan: FusedChunkPlan | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """hidden: (tokens, H); weight: (V, H); bias: (V,) or None; target: (tokens,).

    Returns (loss, lse, grad_hidden, grad_weight, grad_bias), the loss in ``loss_dtype``. For "mean" and
    "sum" the gradients asked for by the need_* flags are computed here, for an upstream gradient of 1
    (grad_weight and grad_bias in plan_and_accum's dtype: ``accum_dtype``, summed over the chunks in it, or the
    weight's in one chunk); absent ones, and all of them for "none", are empty tensors. ``plan``: the chunks
    (chunk_plan's unless given).
    """
    n_tokens = hidden.shape[0]
    loss_rows = torch.empty((n_tokens,), dtype=torch.float32, device=hidden.device)
    lse = torch.empty((n_tokens,), dtype=torch.float32, device=hidden.device)
    now = reduction != "none" and (need_hidden or need_weight or need_bias)
    plan, accum_dtype = plan_and_accum(hidden, weight, accum_dtype, need_weight and now, plan)
    grads = grad_buffers(hidden, weight, bias, need_hidden and now, need_weight and now, need_bias and now,
                         accum_dtype)  # fmt: skip
    count = mean_count(target, ignore_index, reduction)
    scale = None
    if now:
        scale = grad_scale(torch.ones((), dtype=torch.float32, device=hidden.device), reduction, count)
    options = (ignore_index, label_smoothing, z_loss, softcap)
    _fused_chunks(hidden, weight, bias, target, options, loss_rows, lse, scale, grads, plan)
    loss = reduced(loss_rows, reduction, loss_dtype, count)
    return loss, lse, *(or_empty(g, lse) for g in grads)


def fused_linear_cross_entropy_bwd(
    grad_loss: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
    bias: torch.Tensor | None, lse: torch.Tensor, ignore_index: int, label_smoothing: float, z_loss: float,
    softcap: float, need_hidden: bool, need_weight: bool, need_bias: bool, accum_dtype: torch.dtype, *,
    plan: FusedChunkPlan | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """The backward of reduction="none": recompute each chunk's logits, write their gradient weighted
    by the per-token ``grad_loss``, and project it. Returns grad_hidden, grad_weight, grad_bias (the
    last two in plan_and_accum's dtype; absent ones empty)."""
    plan, accum_dtype = plan_and_accum(hidden, weight, accum_dtype, need_weight, plan)
    grads = grad_buffers(hidden, weight, bias, need_hidden, need_weight, need_bias, accum_dtype)
    options = (ignore_index, label_smoothing, z_loss, softcap)
    _fused_chunks(hidden, weight, bias, target, options, None, lse, grad_loss.reshape(-1), grads, plan)
    return tuple(or_empty(g, lse) for g in grads)


def cross_entropy_fwd_fake(logits, target, ignore_index, label_smoothing, z_loss, softcap, reduction, loss_dtype):
    return fake_loss_and_lse(logits, reduction, loss_dtype)


def cross_entropy_bwd_fake(grad_loss, logits, target, lse, ignore_index, label_smoothing, z_loss, softcap, reduction):
    return torch.empty_like(logits)


def fused_linear_cross_entropy_fwd_fake(hidden, weight, target, bias, *options_and_needs):
    *_, reduction, loss_dtype, need_hidden, need_weight, need_bias, accum_dtype = options_and_needs
    now = reduction != "none"
    _, accum_dtype = plan_and_accum(hidden, weight, accum_dtype, need_weight and now, None)
    return (
        *fake_loss_and_lse(hidden, reduction, loss_dtype),
        *fake_grads(hidden, weight, bias, need_hidden and now, need_weight and now, need_bias and now, accum_dtype),
    )


def fused_linear_cross_entropy_bwd_fake(grad_loss, hidden, weight, target, bias, lse, *options_and_needs):
    *_, need_hidden, need_weight, need_bias, accum_dtype = options_and_needs
    _, accum_dtype = plan_and_accum(hidden, weight, accum_dtype, need_weight, None)
    return fake_grads(hidden, weight, bias, need_hidden, need_weight, need_bias, accum_dtype)


# ----------------------------------------------------------------------------------------------------------------
# The options beyond torch's plain cross-entropy: class weights, the z-term on its own, token accuracy
# ----------------------------------------------------------------------------------------------------------------
def check_extras(name, weight_name, weight, n_classes, return_z_loss, return_token_accuracy) -> None:
    """Class weights as torch's ``weight`` (one a class, floating, no gradient) and the two return flags."""
    if weight is not None:
        check_tensor(weight_name, weight, ndim=1, dtypes=FLOAT_DTYPES)
        if weight.shape[0] != n_classes:
            raise ValueError(f"{name}: {weight_name} must hold one weight a class, shape ({n_classes},), got "
                             f"{tuple(weight.shape)}")  # fmt: skip
        if torch.is_grad_enabled() and weight.requires_grad:
            raise ValueError(f"{name}: {weight_name} requires grad, but the class weights get no gradient (neither "
                             f"does torch's cross_entropy); pass {weight_name}.detach()")  # fmt: skip
    for flag, value in (("return_z_loss", return_z_loss), ("return_token_accuracy", return_token_accuracy)):
        if not isinstance(value, bool):
            raise TypeError(f"{name}: {flag} must be a bool, got {type(value).__name__}")


@dataclass(frozen=True)
class Extras:
    """The kernel's optional arguments: class weights (and, for label smoothing, their 0-d fp32 sum; for the
    gradient of a weighted mean, z_ratio, the z-term's scale over the rest's), and the per-row outputs it fills, the
    z-term (z_rows) and whether the row's argmax is its target (correct), fp32 (rows,)."""

    weight: torch.Tensor | None = None
    weight_sum: torch.Tensor | None = None
    z_ratio: torch.Tensor | None = None
    z_rows: torch.Tensor | None = None
    correct: torch.Tensor | None = None

    def rows(self, rows: slice) -> Extras:
        """The same options for the rows ``rows`` (a chunk of the fused op)."""
        return replace(self, z_rows=_rows(self.z_rows, rows), correct=_rows(self.correct, rows))

    def kernel_args(self) -> dict:
        args = {}
        if self.weight is not None:
            args.update(p_weight=self.weight, p_weight_sum=self.weight_sum, p_z_ratio=self.z_ratio, HAS_WEIGHT=True)
        if self.z_rows is not None:
            args.update(p_z_rows=self.z_rows, SPLIT_Z=True)
        if self.correct is not None:
            args.update(p_correct=self.correct, STORE_CORRECT=True)
        return args


def _rows(t: torch.Tensor | None, rows: slice) -> torch.Tensor | None:
    return t[rows] if t is not None else None


def _counts(weight, target, ignore_index) -> tuple[torch.Tensor, torch.Tensor]:
    """0-d fp32 device tensors (no synchronisation): the non-ignored targets, at least 1, and what a mean divides
    the loss by: that count, or with class weights the sum of the targets' weights (torch's weighted mean), 1 where
    it is 0 (every target ignored or weighted 0: a loss of 0, where torch gives NaN)."""
    count = valid_count(target, ignore_index)
    if weight is None:
        return count, count
    # clamped: an out-of-range target is never an address (its row is NaN anyway)
    weights = weight.float()[target.clamp(0, weight.shape[0] - 1)]
    total = torch.where(target != ignore_index, weights, 0.0).sum()
    return count, torch.where(total == 0, 1.0, total)


def _extras(weight, target, ignore_index, label_smoothing, reduction, z_rows, correct, counts) -> Extras:
    if weight is None:
        return Extras(z_rows=z_rows, correct=correct)
    count, denominator = counts
    # the z-term is a mean over the targets even where the loss is weighted (as Liger-Kernel's)
    z_ratio = denominator / count if reduction == "mean" else torch.ones((), device=weight.device)
    weight_sum = weight.float().sum() if label_smoothing != 0 else None
    return Extras(weight, weight_sum, z_ratio, z_rows, correct)


def _option_results(loss_rows, extras: Extras, counts, reduction, dtype, return_z_loss, return_accuracy) -> tuple:
    """The loss (with the z-term, which a weighted mean divides by the count, not the weights), the z-term alone and
    the token accuracy (a fraction of the non-ignored targets for mean and sum, per token for none), or empty."""
    count, denominator = counts
    if extras.z_rows is None:
        loss = reduced(loss_rows, reduction, dtype, denominator)
    elif reduction == "none":
        loss = (loss_rows + extras.z_rows).to(dtype)
    else:
        loss = (reduced(loss_rows, reduction, torch.float32, denominator)
                + reduced(extras.z_rows, reduction, torch.float32, count)).to(dtype)  # fmt: skip
    z_loss = (
        reduced(extras.z_rows, reduction, dtype, count) if return_z_loss else loss_rows.new_empty((0,), dtype=dtype)
    )
    accuracy = loss_rows.new_empty((0,))
    if return_accuracy:
        accuracy = reduced(extras.correct, "mean" if reduction != "none" else "none", torch.float32, count)
    return loss, z_loss, accuracy


def _option_rows(n_rows, device, weight, target, ignore_index, label_smoothing, reduction, return_z_loss,
                 return_accuracy):  # fmt: skip
    """The forward's fp32 per-row buffers, loss and lse, the counts a mean divides by, and the extras: with the
    per-row z-term (kept apart to return it, or for a weighted mean) and correctness buffers where needed."""

    def rows():
        return torch.empty((n_rows,), dtype=torch.float32, device=device)

    counts = _counts(weight, target, ignore_index)
    z_rows = rows() if return_z_loss or weight is not None else None
    correct = rows() if return_accuracy else None
    return rows(), rows(), counts, _extras(weight, target, ignore_index, label_smoothing, reduction, z_rows, correct,
                                           counts)  # fmt: skip


def cross_entropy_options_fwd(
    logits: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None, ignore_index: int,
    label_smoothing: float, z_loss: float, softcap: float, reduction: str, loss_dtype: torch.dtype,
    return_z_loss: bool, return_accuracy: bool, *, plan: CrossEntropyPlan | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """cross_entropy_fwd with class weights (V,) or None, and the z-term and token accuracy. Returns the loss, the
    fp32 row lse, the z-term reduced like the loss (in ``loss_dtype`` too; empty unless return_z_loss) and the
    accuracy (fp32; empty unless return_accuracy)."""
    flags = (label_smoothing, reduction, return_z_loss, return_accuracy)
    loss_rows, lse, counts, extras = _option_rows(logits.shape[0], logits.device, weight, target, ignore_index,
                                                  *flags)  # fmt: skip
    options = (ignore_index, label_smoothing, z_loss, softcap)
    _launch_rows(logits, target, loss_rows, lse, lse, logits, options, True, False, plan, extras)
    loss, z_term, accuracy = _option_results(loss_rows, extras, counts, reduction, loss_dtype, return_z_loss,
                                             return_accuracy)  # fmt: skip
    return loss, lse, z_term, accuracy


def cross_entropy_options_bwd(
    grad_loss: torch.Tensor, logits: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None,
    lse: torch.Tensor, ignore_index: int, label_smoothing: float, z_loss: float, softcap: float, reduction: str, *,
    in_place: bool = False, plan: CrossEntropyPlan | None = None,
) -> torch.Tensor:  # fmt: skip
    """cross_entropy_bwd with class weights (V,) or None."""
    dx = logits if in_place else torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
    counts = _counts(weight, target, ignore_index)
    extras = _extras(weight, target, ignore_index, label_smoothing, reduction, None, None, counts)
    options = (ignore_index, label_smoothing, z_loss, softcap)
    _launch_rows(logits, target, lse, lse, grad_scale(grad_loss, reduction, counts[1]), dx, options, False, True,
                 plan, extras)  # fmt: skip
    return dx


def cross_entropy_options_fwd_fake(logits, target, weight, ignore_index, label_smoothing, z_loss, softcap, reduction,
                                   loss_dtype, return_z_loss, return_accuracy):  # fmt: skip
    loss, lse = fake_loss_and_lse(logits, reduction, loss_dtype)
    return loss, lse, *_fake_extras(loss, return_z_loss, return_accuracy)


def _fake_extras(loss, return_z_loss, return_accuracy) -> tuple[torch.Tensor, torch.Tensor]:
    """The options' z-term (the loss's shape and dtype) and accuracy (fp32), or empty ones, for the fakes."""
    return (
        loss.new_empty(loss.shape if return_z_loss else (0,)),
        loss.new_empty(loss.shape if return_accuracy else (0,), dtype=torch.float32),
    )


def cross_entropy_options_bwd_fake(grad_loss, logits, target, weight, lse, *options):
    return torch.empty_like(logits)


def fused_linear_cross_entropy_options_fwd(
    hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, bias: torch.Tensor | None,
    ce_weight: torch.Tensor | None, ignore_index: int, label_smoothing: float, z_loss: float, softcap: float,
    reduction: str, loss_dtype: torch.dtype, return_z_loss: bool, return_accuracy: bool, need_hidden: bool,
    need_weight: bool, need_bias: bool, accum_dtype: torch.dtype, *, plan: FusedChunkPlan | None = None,
) -> tuple[
    torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor
]:  # fmt: skip
    """fused_linear_cross_entropy_fwd with class weights (ce_weight, (V,) or None), the z-term and the token
    accuracy: returns (loss, lse, grad_hidden, grad_weight, grad_bias, z-term, accuracy), the last two as
    cross_entropy_options_fwd's."""
    flags = (label_smoothing, reduction, return_z_loss, return_accuracy)
    loss_rows, lse, counts, extras = _option_rows(hidden.shape[0], hidden.device, ce_weight, target, ignore_index,
                                                  *flags)  # fmt: skip
    now = reduction != "none" and (need_hidden or need_weight or need_bias)
    plan, accum_dtype = plan_and_accum(hidden, weight, accum_dtype, need_weight and now, plan)
    grads = grad_buffers(hidden, weight, bias, need_hidden and now, need_weight and now, need_bias and now,
                         accum_dtype)  # fmt: skip
    scale = grad_scale(torch.ones((), dtype=torch.float32, device=hidden.device), reduction, counts[1]) if now else None
    options = (ignore_index, label_smoothing, z_loss, softcap)
    _fused_chunks(hidden, weight, bias, target, options, loss_rows, lse, scale, grads, plan, extras)
    loss, z_term, accuracy = _option_results(loss_rows, extras, counts, reduction, loss_dtype, return_z_loss,
                                             return_accuracy)  # fmt: skip
    return loss, lse, *(or_empty(g, lse) for g in grads), z_term, accuracy


def fused_linear_cross_entropy_options_bwd(
    grad_loss: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
    bias: torch.Tensor | None, ce_weight: torch.Tensor | None, lse: torch.Tensor, ignore_index: int,
    label_smoothing: float, z_loss: float, softcap: float, need_hidden: bool, need_weight: bool, need_bias: bool,
    accum_dtype: torch.dtype, *, plan: FusedChunkPlan | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """fused_linear_cross_entropy_bwd (reduction "none", recomputing the chunks) with class weights."""
    plan, accum_dtype = plan_and_accum(hidden, weight, accum_dtype, need_weight, plan)
    grads = grad_buffers(hidden, weight, bias, need_hidden, need_weight, need_bias, accum_dtype)
    counts = _counts(ce_weight, target, ignore_index)
    extras = _extras(ce_weight, target, ignore_index, label_smoothing, "none", None, None, counts)
    options = (ignore_index, label_smoothing, z_loss, softcap)
    _fused_chunks(hidden, weight, bias, target, options, None, lse, grad_loss.reshape(-1), grads, plan, extras)
    return tuple(or_empty(g, lse) for g in grads)


def fused_linear_cross_entropy_options_fwd_fake(hidden, weight, target, bias, ce_weight, *options_and_needs):
    *options, return_z_loss, return_accuracy, need_hidden, need_weight, need_bias, accum = options_and_needs
    plain = fused_linear_cross_entropy_fwd_fake(hidden, weight, target, bias, *options, need_hidden, need_weight,
                                                need_bias, accum)  # fmt: skip
    return *plain, *_fake_extras(plain[0], return_z_loss, return_accuracy)


def fused_linear_cross_entropy_options_bwd_fake(grad_loss, hidden, weight, target, bias, ce_weight, lse,
                                                *options_and_needs):  # fmt: skip
    *_, need_hidden, need_weight, need_bias, accum_dtype = options_and_needs
    return fake_grads(hidden, weight, bias, need_hidden, need_weight, need_bias, accum_dtype)
