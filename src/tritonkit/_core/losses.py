"""What the loss families share on the host: argument checks, reductions and means over non-ignored targets counted
on the device, the fused ops' chunk GEMMs, gradient buffers and gradients, and the fakes' gradient shapes."""

from __future__ import annotations

import math

import torch

from tritonkit._core.autograd import inference_op, tracing
from tritonkit._core.checks import FLOAT_DTYPES, check_choice, check_device, check_tensor
from tritonkit._core.cublas import addmm_into_fp32, addmm_rounded_, mm_into_fp32, mm_rounded_into
from tritonkit._core.elementwise import FALLBACK_PLAN
from tritonkit._core.ints import cdiv
from tritonkit._core.jit.scaling import scale_cast_kernel, scale_in_place_kernel

REDUCTIONS = ("mean", "sum", "none")
TARGET_DTYPES = (torch.int64, torch.int32)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_loss_options(name, ignore_index, label_smoothing, z_loss, softcap, reduction) -> tuple:
    """The options as the kernels take them: (ignore_index, label_smoothing, z_loss, softcap (0 for none),
    reduction)."""
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        raise TypeError(f"{name}: ignore_index must be an int, got {type(ignore_index).__name__}")
    expected = {
        "label_smoothing": ("a number in [0, 1]", _number(label_smoothing) and 0.0 <= label_smoothing <= 1.0),
        "z_loss": ("a finite number >= 0", _number(z_loss) and math.isfinite(z_loss) and z_loss >= 0),
        "softcap": ("None or a finite number > 0",
                    softcap is None or (_number(softcap) and math.isfinite(softcap) and softcap > 0)),
    }  # fmt: skip
    values = {"label_smoothing": label_smoothing, "z_loss": z_loss, "softcap": softcap}
    for key, (what, ok) in expected.items():
        if not ok:
            error = ValueError if _number(values[key]) else TypeError
            raise error(f"{name}: {key} must be {what}, got {values[key]!r}")
    check_choice("reduction", reduction, REDUCTIONS)
    return int(ignore_index), float(label_smoothing), float(z_loss), float(softcap or 0.0), reduction


def check_loss_dtype(name: str, loss_dtype, input_dtype: torch.dtype) -> torch.dtype:
    """The dtype the loss is returned in: ``input_dtype`` for None (torch's F.cross_entropy returns its input's), else
    one of the float dtypes. The per-row losses and their sum are fp32 either way; the result is rounded once."""
    if loss_dtype is None:
        return input_dtype
    if not isinstance(loss_dtype, torch.dtype):
        raise TypeError(f"{name}: loss_dtype must be None or a torch.dtype, got {type(loss_dtype).__name__}")
    if loss_dtype not in FLOAT_DTYPES:
        raise ValueError(f"{name}: loss_dtype must be None (the input's dtype) or one of "
                         f"{tuple(str(d) for d in FLOAT_DTYPES)}, got {loss_dtype}")  # fmt: skip
    return loss_dtype


def check_target(name: str, target, expected_shape: tuple) -> None:
    check_tensor("target", target, dtypes=TARGET_DTYPES)
    if tuple(target.shape) != expected_shape:
        raise ValueError(f"{name}: target must have shape {expected_shape}, got {tuple(target.shape)}")


def check_linear_head(name: str, hidden, weight, bias) -> None:
    """hidden (..., H), an LM head's weight (V, H) and bias (V,) or None, of one float dtype, on one device."""
    check_tensor("hidden", hidden, dtypes=FLOAT_DTYPES)
    check_tensor("weight", weight, ndim=2, dtypes=FLOAT_DTYPES)
    if hidden.dim() == 0 or hidden.shape[-1] != weight.shape[1]:
        raise ValueError(f"{name}: hidden must be (..., H) with H = weight.shape[1] = {weight.shape[1]}, got shape "
                         f"{tuple(hidden.shape)}")  # fmt: skip
    if bias is not None:
        check_tensor("bias", bias, ndim=1, dtypes=FLOAT_DTYPES)
        if bias.shape[0] != weight.shape[0]:
            raise ValueError(f"{name}: bias must have shape ({weight.shape[0]},), got {tuple(bias.shape)}")
    for other, value in (("weight", weight), ("bias", bias)):
        if value is not None and value.dtype != hidden.dtype:
            raise TypeError(f"{name}: {other} must have hidden's dtype {hidden.dtype}, got {value.dtype}")
    check_device(hidden=hidden, weight=weight, **({"bias": bias} if bias is not None else {}))


def needs_grad(t: torch.Tensor | None) -> bool:
    return t is not None and torch.is_grad_enabled() and t.requires_grad


def valid_count(target: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """Non-ignored targets, at least 1 (an all-ignored mean is 0), fp32 on the device: no host synchronisation."""
    return (target != ignore_index).sum().clamp_min(1).to(torch.float32)


def mean_count(target: torch.Tensor, ignore_index: int, reduction: str) -> torch.Tensor | None:
    """What a mean over the non-ignored targets divides by (:func:`valid_count`); None for "sum" and "none", which
    divide by nothing (no count computed)."""
    return valid_count(target, ignore_index) if reduction == "mean" else None


def reduced(rows: torch.Tensor, reduction: str, dtype: torch.dtype, denominator: torch.Tensor | None) -> torch.Tensor:
    """fp32 per-row values (0 on ignored rows) reduced, in ``dtype``: as they are for "none", summed for "sum",
    summed and divided by ``denominator`` (a 0-d device tensor) for "mean"."""
    if reduction == "none":
        return rows.to(dtype)
    total = rows.sum()
    return (total / denominator if reduction == "mean" else total).to(dtype)


def grad_scale(grad_loss: torch.Tensor, reduction: str, denominator: torch.Tensor | None) -> torch.Tensor:
    """Each row's factor on d(loss)/d(logits): the upstream gradient (per row for "none", possibly expanded with
    stride 0), divided by the mean's ``denominator`` for "mean". Any float dtype: the kernels load it in fp32."""
    if reduction == "none":
        return grad_loss.reshape(-1)
    grad_loss = grad_loss.reshape(())
    return grad_loss.float() / denominator if reduction == "mean" else grad_loss


def chunk_logits(h_chunk: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor) -> None:
    """A fused op's chunk of logits, h W^T (+ b), by one GEMM into ``out`` (a reused buffer)."""
    if bias is None:
        torch.mm(h_chunk, weight.t(), out=out)
    else:
        torch.addmm(bias, h_chunk, weight.t(), out=out)


def grad_buffers(hidden, weight, bias, need_hidden, need_weight, need_bias, accum_dtype=torch.float32):
    """d(hidden) in hidden's dtype (each chunk's rows from one GEMM, rounded once), accumulators for d(weight) and
    d(bias) in ``accum_dtype`` (fp32, or the weight's dtype); None where not needed. The accumulators are left
    unset where a chunk will run (add_chunk_grads' first chunk writes them: zeroing a 128256 x 4096 fp32 d(weight)
    and reading the zeros back cost 4.2 GB of traffic) and zeroed where none will (no tokens)."""
    accumulator = torch.empty if hidden.shape[0] else torch.zeros
    grad_hidden = torch.empty_like(hidden) if need_hidden else None
    grad_weight = accumulator(weight.shape, dtype=accum_dtype, device=weight.device) if need_weight else None
    grad_bias = accumulator(bias.shape, dtype=accum_dtype, device=bias.device) if need_bias else None
    return grad_hidden, grad_weight, grad_bias


def add_chunk_grads(dlogits, h_chunk, weight, rows: slice, grads) -> None:
    """A fused op's chunk of logit gradients (chunk, V) projected: its rows of d(hidden) (one GEMM, hidden's dtype),
    and its shares of d(weight) and d(bias) added to their accumulators (fp32, or 16-bit ones rounded once a chunk),
    or written into them by the first chunk (rows from 0: grad_buffers leaves them unset); each where ``grads``
    holds a buffer."""
    grad_hidden, grad_weight, grad_bias = grads
    first = rows.start == 0
    if grad_hidden is not None:
        torch.mm(dlogits, weight, out=grad_hidden[rows])
    if grad_weight is not None:
        fp32 = grad_weight.dtype == torch.float32
        if first:
            (mm_into_fp32 if fp32 else mm_rounded_into)(grad_weight, dlogits.t(), h_chunk)
        else:
            (addmm_into_fp32 if fp32 else addmm_rounded_)(grad_weight, dlogits.t(), h_chunk)
    if grad_bias is not None:
        bias_share = dlogits.sum(0, dtype=torch.float32)
        if first:
            grad_bias.copy_(bias_share)
        else:
            grad_bias.add_(bias_share)


def or_empty(t: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """Custom ops cannot return None: an absent output is an empty tensor."""
    return t if t is not None else like.new_empty((0,))


def fake_loss_and_lse(rows: torch.Tensor, reduction: str, loss_dtype: torch.dtype) -> tuple:
    """The forwards' loss (0-d, or one a row of ``rows`` for "none", in ``loss_dtype``) and fp32 lse, for the fakes."""
    n_rows = rows.shape[0]
    return (rows.new_empty((n_rows,) if reduction == "none" else (), dtype=loss_dtype),
            rows.new_empty((n_rows,), dtype=torch.float32))  # fmt: skip


def fake_grads(hidden, weight, bias, need_hidden, need_weight, need_bias, accum_dtype=torch.float32) -> tuple:
    """:func:`grad_buffers`' shapes and dtypes as the custom ops return them (absent: empty fp32), for the fakes."""
    fp32 = torch.float32
    return (
        hidden.new_empty(hidden.shape) if need_hidden else hidden.new_empty((0,), dtype=fp32),
        hidden.new_empty(weight.shape, dtype=accum_dtype) if need_weight else hidden.new_empty((0,), dtype=fp32),
        hidden.new_empty(bias.shape, dtype=accum_dtype) if need_bias else hidden.new_empty((0,), dtype=fp32),
    )


def head_grads(grads, grad_loss, dtypes, needs, recomputed: bool) -> list:
    """The fused ops' (d(hidden), d(weight), d(bias)), each in its input's dtype, None where not needed: ``grads``
    already weighted by the upstream gradient (``recomputed``: the recomputing backward of "none", or the forward's
    16-bit ones scaled in place), or the forward's, saved for an upstream gradient of 1 and now multiplied by the 0-d
    ``grad_loss``."""
    if recomputed:
        return [g.to(dtype) if need else None for g, dtype, need in zip(grads, dtypes, needs, strict=True)]
    return [scaled(g, grad_loss, dtype) if need else None for g, dtype, need in zip(grads, dtypes, needs, strict=True)]


def saved_head_grads(grads, grad_loss, dtypes, needs, accum_dtype: torch.dtype) -> list:
    """The fused ops' backward of "mean" and "sum": the forward's gradients (d(hidden), d(weight), d(bias)), saved for
    an upstream gradient of 1, times the 0-d ``grad_loss``, each in its input's dtype, None where not needed.
    Where d(weight) and d(bias) were summed in 16 bits (a 16-bit ``accum_dtype``, or one chunk's GEMM in the weight's
    dtype) all three are in their inputs' dtypes already, and eager mode scales them in place
    (:func:`scale_in_place`): a scaled copy would hold a second d(weight) at the backward's peak. Autograd then
    refuses a second backward through the op (retain_graph=True): the saved gradients' version changed. Traced
    (torch.compile plans the memory itself), and for fp32 sums, they are scaled into copies."""
    sums = [g for g, need in zip(grads[1:], needs[1:], strict=True) if need]
    in_place = (sums[0].dtype if sums else accum_dtype) != torch.float32 and not tracing(grads)
    if in_place:
        for grad in grads:
            scale_in_place(grad, grad_loss)
    return head_grads(grads, grad_loss, dtypes, needs, in_place)


# One program's elements in scaled(): the elementwise fallback's block (docs/kernels/tutorial.md).
_SCALE_PLAN = FALLBACK_PLAN


def _scale_cast(grad: torch.Tensor, grad_loss: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """grad * grad_loss (0-d) in ``dtype`` with one rounding, without mutating grad, in one pass over a contiguous
    grad: torch's mul into an output of another dtype first computes into a temporary of the input's dtype (a full
    fp32 copy of a 128256 x 4096 d(weight): 2.1 GB more memory and over twice the traffic; torch's profiler gave its
    muls 2.6 ms of a 43 ms fused linear CE step at 8192 x 4096 x 128256 on the H200)."""
    out = torch.empty(grad.shape, dtype=dtype, device=grad.device)
    n = grad.numel()
    if n:
        scale_cast_kernel[(cdiv(n, _SCALE_PLAN.block_size),)](grad.contiguous(), grad_loss.reshape(()), out, n,
                                                             BLOCK_SIZE=_SCALE_PLAN.block_size,
                                                             num_warps=_SCALE_PLAN.warps)  # fmt: skip
    return out


def _scale_cast_fake(grad, grad_loss, dtype):
    return grad.new_empty(grad.shape, dtype=dtype)


# An op of its own: the fused ops' backward, where it runs, is traced by torch.compile.
scaled = inference_op("scale_cast", launcher=_scale_cast, fake=_scale_cast_fake)


# One wave of scale_in_place's 4-warp programs on an H100/H200 (132 multiprocessors x 16 resident programs): a 1 GB
# bf16 d(weight) at a factor of 1 was 512K programs that each read the factor and left, ~0.3 ms of the GPU's time.
_SCALE_IN_PLACE_PROGRAMS = 2048


def scale_in_place(grad: torch.Tensor, grad_loss: torch.Tensor) -> None:
    """grad *= grad_loss (0-d) in place, rounded once, eager mode's way to scale a fused op's saved 16-bit gradients
    (a scaled copy would hold a second d(weight)). On a contiguous grad one Triton pass that reads and writes
    nothing where grad_loss is 1 (the d(weight) of a 128256 x 4096 head is 1 GB in bf16: 2 GB of traffic saved).
    Either way grad's version moves, as torch's in-place ops move it, so that autograd refuses a later reader of
    the unscaled values (a second backward through the op) instead of handing it scaled ones."""
    n = grad.numel()
    if not grad.is_contiguous():
        grad.mul_(grad_loss.reshape(()).float())
        return
    if n:
        programs = min(cdiv(n, _SCALE_PLAN.block_size), _SCALE_IN_PLACE_PROGRAMS)
        scale_in_place_kernel[(programs,)](grad, grad_loss.reshape(()), n, BLOCK_SIZE=_SCALE_PLAN.block_size,
                                           num_warps=_SCALE_PLAN.warps)  # fmt: skip
    torch.autograd.graph.increment_version(grad)
