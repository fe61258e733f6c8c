"""cross_entropy and fused_linear_cross_entropy: the public functions, their autograd built by the one factory."""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from tritonkit._core.autograd import differentiable_op
from tritonkit._core.checks import FLOAT_DTYPES, check_device, check_tensor, debug_checks
from tritonkit._core.distributed import refuse_dtensors
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
from tritonkit.ops.loss.launch import (
    check_extras,
    check_inplace_logits,
    check_target_values,
    cross_entropy_bwd,
    cross_entropy_bwd_fake,
    cross_entropy_fwd,
    cross_entropy_fwd_fake,
    cross_entropy_options_bwd,
    cross_entropy_options_bwd_fake,
    cross_entropy_options_fwd,
    cross_entropy_options_fwd_fake,
    fused_linear_cross_entropy_bwd,
    fused_linear_cross_entropy_bwd_fake,
    fused_linear_cross_entropy_fwd,
    fused_linear_cross_entropy_fwd_fake,
    fused_linear_cross_entropy_options_bwd,
    fused_linear_cross_entropy_options_bwd_fake,
    fused_linear_cross_entropy_options_fwd,
    fused_linear_cross_entropy_options_fwd_fake,
)


class CrossEntropyOutput(NamedTuple):
    """What the losses return when asked for more than the loss (Liger-Kernel's convention): the loss, the z-term on
    its own (None unless ``return_z_loss``) and the token accuracy (None unless ``return_token_accuracy``)."""

    loss: torch.Tensor
    z_loss: torch.Tensor | None
    token_accuracy: torch.Tensor | None


def _ce_parts(class_weights: bool) -> tuple:
    """save and gradients of the cross-entropy ops; the options' op takes class weights after the target (and its
    two return flags after the options, which the backward does not need)."""

    def save(ctx, inputs, outputs):
        logits, target, *rest = inputs
        weight = [rest.pop(0)] if class_weights else []
        ctx.save_for_backward(logits, target, *weight, outputs[1])
        ctx.options = tuple(rest[:5])

    def gradients(ctx, grad_outputs, backward):
        grad_loss = grad_outputs[0]
        if grad_loss is None:  # only lse (or the z-term, the accuracy) was used downstream: no gradient
            return (None,)
        *tensors, lse = ctx.saved_tensors
        return (backward(grad_loss, *tensors, lse, *ctx.options),)

    return save, gradients


def _in_place(gradients):
    """The backward of ``inplace_backward=True``: it overwrites the saved logits with their gradient and returns
    that memory as the gradient, so the op allocates nothing of the logits' size. The version bump makes the
    overwrite safe: any other node that saved these logits for its own backward (or a second backward through this
    one) finds them modified and autograd raises, instead of silently reading gradients as logits."""

    def gradients_in_place(ctx, grad_outputs, backward):
        (grad,) = gradients(ctx, grad_outputs, functools.partial(backward, in_place=True))
        if grad is not None:
            torch.autograd.graph.increment_version(grad)  # grad is the saved logits, overwritten
        return (grad,)

    return gradients_in_place


_INPLACE_UNDER_COMPILE = (
    "cross_entropy: inplace_backward=True overwrites the logits in the backward, which torch.compile cannot trace; "
    "leave it False under torch.compile, where the compiler plans the gradient's memory"
)


def _ce_ops(name, forward, forward_fake, backward, backward_fake, class_weights, non_differentiable):
    """The op and its in-place twin (eager-only)."""
    save, gradients = _ce_parts(class_weights)
    parts = dict(forward=forward, forward_fake=forward_fake, backward=backward, backward_fake=backward_fake,
                 save=save, non_differentiable=non_differentiable)  # fmt: skip
    return (differentiable_op(name, gradients=gradients, **parts),
            differentiable_op(f"{name}_inplace", gradients=_in_place(gradients), **parts,
                              compile_error=_INPLACE_UNDER_COMPILE))  # fmt: skip


cross_entropy_op, cross_entropy_inplace_op = _ce_ops(
    "cross_entropy", cross_entropy_fwd, cross_entropy_fwd_fake, cross_entropy_bwd, cross_entropy_bwd_fake, False,
    non_differentiable=(1,),  # lse
)  # fmt: skip
# class weights, the z-term and the accuracy: an op of their own, so that a call without them takes the plain one
cross_entropy_options_op, cross_entropy_options_inplace_op = _ce_ops(
    "cross_entropy_options", cross_entropy_options_fwd, cross_entropy_options_fwd_fake, cross_entropy_options_bwd,
    cross_entropy_options_bwd_fake, True, non_differentiable=(1, 2, 3),  # lse, the z-term (for logging), accuracy
)  # fmt: skip


def _flce_parts(class_weights: bool) -> tuple:
    """save and gradients of the fused ops; the options' op takes class weights after the bias and its two return
    flags after the options."""

    def save(ctx, inputs, outputs):
        """mean/sum keep the forward's gradients; "none" keeps what the recomputing backward reads."""
        hidden, weight, target, bias, *rest = inputs
        ce_weight = [rest.pop(0)] if class_weights else []
        ctx.options, ctx.needs, ctx.accum_dtype = tuple(rest[:5]), tuple(rest[-4:-1]), rest[-1]
        ctx.dtypes = (hidden.dtype, weight.dtype, bias.dtype if bias is not None else None)
        ctx.recompute = ctx.options[-1] == "none"
        if ctx.recompute:
            ctx.save_for_backward(hidden, weight, target, bias, *ce_weight, outputs[1])
        else:
            ctx.save_for_backward(*outputs[2:5])

    def gradients(ctx, grad_outputs, backward):
        """(grad_hidden, grad_weight, None for target, grad_bias), None where not needed."""
        grad_loss = grad_outputs[0]
        if grad_loss is None:  # only lse or the gradients were used downstream: nothing flows back
            return ()
        if ctx.recompute:
            *tensors, lse = ctx.saved_tensors
            grads = backward(grad_loss, *tensors, lse, *ctx.options[:-1], *ctx.needs, ctx.accum_dtype)
            grads = head_grads(grads, grad_loss, ctx.dtypes, ctx.needs, True)
        else:
            # d(weight) and d(bias) in accum_dtype, or in the weight's where one chunk took every token
            grads = saved_head_grads(ctx.saved_tensors, grad_loss, ctx.dtypes, ctx.needs, ctx.accum_dtype)
        grad_hidden, grad_weight, grad_bias = grads
        return grad_hidden, grad_weight, None, grad_bias

    return save, gradients


_save_flce, _flce_gradients = _flce_parts(False)
fused_linear_cross_entropy_op = differentiable_op(
    "fused_linear_cross_entropy",
    forward=fused_linear_cross_entropy_fwd,
    forward_fake=fused_linear_cross_entropy_fwd_fake,
    backward=fused_linear_cross_entropy_bwd,
    backward_fake=fused_linear_cross_entropy_bwd_fake,
    save=_save_flce,
    gradients=_flce_gradients,
    # The gradients are outputs only so that the custom op can save them; with materialised gradients autograd
    # would hand the backward a zero tensor for each, 2.1 GB for a 128256 x 4096 fp32 dW.
    non_differentiable=(1, 2, 3, 4),
)
_save_flce_options, _flce_options_gradients = _flce_parts(True)
fused_linear_cross_entropy_options_op = differentiable_op(
    "fused_linear_cross_entropy_options",
    forward=fused_linear_cross_entropy_options_fwd,
    forward_fake=fused_linear_cross_entropy_options_fwd_fake,
    backward=fused_linear_cross_entropy_options_bwd,
    backward_fake=fused_linear_cross_entropy_options_bwd_fake,
    save=_save_flce_options,
    gradients=_flce_options_gradients,
    non_differentiable=(1, 2, 3, 4, 5, 6),  # as the plain op's, and the z-term (for logging) and the accuracy
)


def check_accum_dtype(name: str, accum_dtype, weight_dtype: torch.dtype) -> torch.dtype:
    """d(weight)'s accumulator: torch.float32, or the weight's own dtype."""
    if not isinstance(accum_dtype, torch.dtype):
        raise TypeError(f"{name}: accum_dtype must be a torch.dtype, got {type(accum_dtype).__name__}")
    if accum_dtype not in (torch.float32, weight_dtype):
        raise ValueError(f"{name}: accum_dtype must be torch.float32 or the weight's dtype {weight_dtype}, got "
                         f"{accum_dtype}")  # fmt: skip
    return accum_dtype


def _with_extras(loss, z_term, accuracy, target, reduction, return_z_loss, return_token_accuracy):
    """The loss alone, or CrossEntropyOutput where a return flag asks for more; per token for "none"."""

    def shaped(t, asked=True):
        return None if not asked else t.view(target.shape) if reduction == "none" else t

    if not (return_z_loss or return_token_accuracy):
        return shaped(loss)
    return CrossEntropyOutput(shaped(loss), shaped(z_term, return_z_loss), shaped(accuracy, return_token_accuracy))


@refuse_dtensors(
    "cross_entropy",
    ("logits", "target"),
    "for logits split along the vocabulary (Shard(-1)) call "
    "tk.ops.vocab_parallel_cross_entropy; for replicated logits pass logits.to_local()",
)
def cross_entropy(
    logits: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None = None, *, ignore_index: int = -100,
    label_smoothing: float = 0.0, z_loss: float = 0.0, softcap: float | None = None, reduction: str = "mean",
    loss_dtype: torch.dtype | None = None, inplace_backward: bool = False, check_targets: bool | None = None,
    return_z_loss: bool = False, return_token_accuracy: bool = False,
) -> torch.Tensor | CrossEntropyOutput:  # fmt: skip
    """Cross-entropy of class-last ``logits`` (..., V) against integer ``target`` (...).

    ``torch.nn.functional.cross_entropy(y, target, ignore_index=..., label_smoothing=...,
    reduction=...) + z_loss * logsumexp(y)**2`` (the z-term reduced like the loss), with
    ``y = softcap * tanh(logits / softcap)`` when ``softcap`` is given, else ``y = logits``. "mean"
    divides by the number of non-ignored targets; an all-ignored batch gives 0 loss and 0 gradient
    (torch gives NaN). Returns a 0-d tensor ("mean", "sum") or target's shape ("none"), in logits'
    dtype, as torch's, or in ``loss_dtype``: the per-token losses and their sum are fp32, and
    ``loss_dtype=torch.float32`` returns that value unrounded (a bf16 model's loss as transformers,
    which upcasts the logits, and Liger-Kernel report it); the gradient is the same either way.
    logits fp32/fp16/bf16, any vocabulary size; target int64/int32. Differentiable in logits; the
    backward allocates only the gradient.

    A target outside [0, V) other than ``ignore_index`` makes its row's loss and gradient NaN, and so a
    NaN mean: by default nothing checks the range, since reading the targets on the host synchronises
    with the GPU (a stall, and no CUDA graph capture). ``check_targets=True``, or ``check_targets=None``
    (the default) with the environment variable ``TRITONKIT_DEBUG=1``, raises ValueError naming the
    out-of-range values instead, at the cost of that synchronisation (eager mode only; under
    torch.compile the check is skipped). ``check_targets=False`` never checks.

    ``inplace_backward=True`` (eager mode) makes the backward write the gradient over the logits'
    memory and return it, allocating nothing of their size: for logits that a layer produced and that
    nothing reads after the loss (an LM head's output). It raises ValueError for logits that require grad
    and are a leaf or a view of one (their values, which the caller may read, would become their
    gradient) or whose elements overlap in memory (an expanded tensor: several rows' gradients would
    land in one). Autograd raises if another op saved those logits for its backward and runs after this
    one. Under torch.compile it raises ValueError: a backward that overwrites its input cannot be traced,
    and there the compiler plans the gradient's memory.

    Beyond torch's options (each off by default, where the call takes the plain op): ``weight``, class weights (V,)
    as torch's ``weight`` (``ce_weight`` for the fused op, whose ``weight`` is the head's): each target's loss is
    scaled by its class's weight, label smoothing weights each class's term, and "mean" divides by the sum of the
    targets' weights (0 where that sum is 0, where torch gives NaN); the z-term stays a mean over the targets, as
    Liger-Kernel's; the weights take no gradient. ``return_z_loss=True`` and ``return_token_accuracy=True`` return
    a :class:`CrossEntropyOutput` (loss, z_loss, token_accuracy; None where not asked for), as Liger-Kernel's: the
    z-term (already in the loss) reduced like the loss, and the fraction of non-ignored targets that are their
    row's argmax (the first largest logit), per token (1.0 or 0.0, 0.0 where ignored) for "none"; the z-term in the
    loss's dtype, the accuracy in fp32. Neither carries
    a gradient; both come from the loss's own pass over the logits, with no host synchronisation.

    Example: ``loss = tk.ops.cross_entropy(logits.view(-1, V), labels.view(-1), z_loss=1e-4)``.
    """
    options = check_loss_options("cross_entropy", ignore_index, label_smoothing, z_loss, softcap, reduction)
    if not isinstance(inplace_backward, bool):
        raise TypeError(f"cross_entropy: inplace_backward must be a bool, got {type(inplace_backward).__name__}")
    check_tensor("logits", logits, dtypes=FLOAT_DTYPES)
    if logits.dim() == 0 or logits.shape[-1] == 0:
        raise ValueError(f"cross_entropy: logits must be (..., V) with V >= 1 classes, got shape {tuple(logits.shape)}")
    check_target("cross_entropy", target, tuple(logits.shape[:-1]))
    check_device(logits=logits, target=target)
    if inplace_backward:
        check_inplace_logits(logits)
    if debug_checks("cross_entropy: check_targets", check_targets):
        check_target_values("cross_entropy", target, logits.shape[-1], ignore_index)
    rows, target_rows = as_rows(logits), target.reshape(-1)
    options = (*options, check_loss_dtype("cross_entropy", loss_dtype, logits.dtype))
    if weight is not None or return_z_loss is not False or return_token_accuracy is not False:
        check_extras("cross_entropy", "weight", weight, logits.shape[-1], return_z_loss, return_token_accuracy)
        weight = weight.contiguous() if weight is not None else None
        if weight is not None:
            check_device(logits=logits, weight=weight)
        op = cross_entropy_options_inplace_op if inplace_backward else cross_entropy_options_op
        loss, _, z_term, accuracy = op(rows, target_rows, weight, *options, return_z_loss, return_token_accuracy)
        return _with_extras(loss, z_term, accuracy, target, reduction, return_z_loss, return_token_accuracy)
    loss, _ = (cross_entropy_inplace_op if inplace_backward else cross_entropy_op)(rows, target_rows, *options)
    return loss.view(target.shape) if reduction == "none" else loss


@refuse_dtensors(
    "fused_linear_cross_entropy",
    ("hidden", "weight", "target", "bias"),
    "for an LM head split along the vocabulary (tensor parallelism: weight Shard(0)) call "
    "tk.ops.vocab_parallel_fused_linear_cross_entropy; under FSDP2, call the loss where the head's "
    "weight is gathered (inside its module's forward, or a method registered with "
    "torch.distributed.fsdp.register_fsdp_forward_method)",
)
def fused_linear_cross_entropy(
    hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, bias: torch.Tensor | None = None, *,
    ce_weight: torch.Tensor | None = None, ignore_index: int = -100, label_smoothing: float = 0.0,
    z_loss: float = 0.0, softcap: float | None = None, reduction: str = "mean", loss_dtype: torch.dtype | None = None,
    check_targets: bool | None = None, return_z_loss: bool = False, return_token_accuracy: bool = False,
    accum_dtype: torch.dtype = torch.float32,
) -> torch.Tensor | CrossEntropyOutput:  # fmt: skip
    """``cross_entropy(hidden @ weight.T + bias, target, ...)`` without building the logits.

    hidden: (..., H); weight: (V, H) (the LM head's weight, passed at call time so that a gathered
    FSDP weight, a tied embedding or any view works); bias: (V,) or None; target: hidden's leading
    shape. hidden, weight and bias share one float dtype. Options, ``check_targets`` (off by default:
    it synchronises with the host) and result as :func:`cross_entropy` (the loss in hidden's dtype, or
    ``loss_dtype``).
    Tokens are processed in chunks (on a GPU of 4096 tokens for an fp32 accumulator and 2048 for a 16-bit one,
    fewer where a chunk's logits would pass 1 GiB; docs/kernels/loss.md), the transient logits being one chunk's;
    where all the tokens' logits take no more memory than the accumulator and a chunk would (up to 8192 tokens for
    an fp32 accumulator at H 4096 in bf16), one chunk takes them all and d(weight) comes from one GEMM in the
    weight's dtype, rounded once as the fp32 sum is. Gradients summed in 16 bits (either way) are scaled in place
    by the backward in eager mode, so a second backward through the same call (``retain_graph=True``) raises.
    ``accum_dtype`` is the memory choice for d(weight) and d(bias), summed over the chunks: ``torch.float32`` (the
    default) keeps the sums in fp32 and rounds once, at the cost of an fp32 (V, H) accumulator (2.1 GB for a
    128256 x 4096 head) during the step; the weight's dtype (bf16 or fp16) accumulates in it, as Liger-Kernel's
    default ``accum_dtype`` does, at half that memory and one 16-bit rounding of the running sum a chunk (about
    2**-9 relative in bf16 each, so a few times that over a step's chunks). The GEMMs are torch's (cuBLAS on CUDA).
    ``ce_weight`` (class weights), ``return_z_loss`` and ``return_token_accuracy`` as :func:`cross_entropy`'s
    ``weight`` and flags.

    Example: ``loss = tk.ops.fused_linear_cross_entropy(h.view(-1, H), lm_head.weight, labels.view(-1))``.
    """
    name = "fused_linear_cross_entropy"
    options = check_loss_options(name, ignore_index, label_smoothing, z_loss, softcap, reduction)
    check_linear_head(name, hidden, weight, bias)
    if weight.shape[0] == 0:
        raise ValueError(f"{name}: weight must have at least one row (class), got shape {tuple(weight.shape)}")
    check_target(name, target, tuple(hidden.shape[:-1]))
    check_device(hidden=hidden, target=target)
    if debug_checks(f"{name}: check_targets", check_targets):
        check_target_values(name, target, weight.shape[0], ignore_index)
    rows, target_rows = hidden.reshape(-1, hidden.shape[-1]), target.reshape(-1)
    options = (*options, check_loss_dtype(name, loss_dtype, hidden.dtype))
    needs = (needs_grad(hidden), needs_grad(weight), needs_grad(bias))
    accum_dtype = check_accum_dtype(name, accum_dtype, weight.dtype)
    if ce_weight is not None or return_z_loss is not False or return_token_accuracy is not False:
        check_extras(name, "ce_weight", ce_weight, weight.shape[0], return_z_loss, return_token_accuracy)
        ce_weight = ce_weight.contiguous() if ce_weight is not None else None
        if ce_weight is not None:
            check_device(hidden=hidden, ce_weight=ce_weight)
        outputs = fused_linear_cross_entropy_options_op(rows, weight, target_rows, bias, ce_weight, *options,
                                                        return_z_loss, return_token_accuracy, *needs,
                                                        accum_dtype)  # fmt: skip
        loss, *_, z_term, accuracy = outputs
        return _with_extras(loss, z_term, accuracy, target, reduction, return_z_loss, return_token_accuracy)
    loss = fused_linear_cross_entropy_op(rows, weight, target_rows, bias, *options, *needs, accum_dtype)[0]
    return loss.view(target.shape) if reduction == "none" else loss
