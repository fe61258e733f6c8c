"""What the loss families share on the host: argument checks, means over non-ignored targets counted on the device,
the fused ops' gradient buffers, and the scaling of saved gradients by the upstream one."""

from __future__ import annotations

import math

import torch

from tritonkit._core.checks import check_choice, check_tensor
from tritonkit._core.cublas import addmm_into_fp32

REDUCTIONS = ("mean", "sum", "none")
TARGET_DTYPES = (torch.int64, torch.int32)


def check_loss_options(name, ignore_index, label_smoothing, z_loss, softcap, reduction) -> tuple:
    """The options as the kernels take them: (ignore_index, label_smoothing, z_loss, softcap (0 for none),
    reduction)."""
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        raise TypeError(f"{name}: ignore_index must be an int, got {type(ignore_index).__name__}")
    numbers = {"label_smoothing": label_smoothing, "z_loss": z_loss, "softcap": 1.0 if softcap is None else softcap}
    for key, value in numbers.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise TypeError(f"{name}: {key} must be a finite number, got {value!r}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"{name}: label_smoothing must be in [0, 1], got {label_smoothing}")
    if z_loss < 0:
        raise ValueError(f"{name}: z_loss must be >= 0, got {z_loss}")
    if softcap is not None and softcap <= 0:
        raise ValueError(f"{name}: softcap must be None or > 0, got {softcap}")
    check_choice("reduction", reduction, REDUCTIONS)
    return int(ignore_index), float(label_smoothing), float(z_loss), float(softcap or 0.0), reduction


def check_targets(name: str, target, expected_shape: tuple) -> None:
    check_tensor("target", target, dtypes=TARGET_DTYPES)
    if tuple(target.shape) != expected_shape:
        raise ValueError(f"{name}: target must have shape {expected_shape}, got {tuple(target.shape)}")


def valid_count(target: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """Non-ignored targets, at least 1 (an all-ignored mean is 0), fp32 on the device: no host synchronisation."""
    return (target != ignore_index).sum().clamp_min(1).to(torch.float32)


def reduced(loss_rows, target, ignore_index, reduction, dtype) -> torch.Tensor:
    """fp32 per-row losses (0 on ignored rows) reduced, in ``dtype``."""
    if reduction == "none":
        return loss_rows.to(dtype)
    total = loss_rows.sum()
    return (total / valid_count(target, ignore_index) if reduction == "mean" else total).to(dtype)


def grad_scale(grad_loss, target, ignore_index, reduction) -> torch.Tensor:
    """Each row's factor on d(loss)/d(logits): the upstream gradient (per row for "none"), over the count for
    "mean"."""
    if reduction == "none":
        return grad_loss.reshape(-1)
    grad_loss = grad_loss.reshape(()).float()
    return grad_loss / valid_count(target, ignore_index) if reduction == "mean" else grad_loss


def grad_buffers(hidden, weight, bias, need_hidden, need_weight, need_bias):
    """d(hidden) in hidden's dtype (each chunk's rows from one GEMM), fp32 accumulators for d(weight), d(bias)."""
    grad_hidden = torch.empty_like(hidden) if need_hidden else None
    grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_weight else None
    grad_bias = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) if need_bias else None
    return grad_hidden, grad_weight, grad_bias


def add_chunk_grads(dlogits, h_chunk, weight, rows: slice, grads) -> None:
    """A fused op's chunk of logit gradients (chunk, V) projected: its rows of d(hidden) (one GEMM, hidden's dtype),
    and its shares of d(weight) and d(bias) added to their fp32 accumulators; each where ``grads`` holds a buffer."""
    grad_hidden, grad_weight, grad_bias = grads
    if grad_hidden is not None:
        torch.mm(dlogits, weight, out=grad_hidden[rows])
    if grad_weight is not None:
        addmm_into_fp32(grad_weight, dlogits.t(), h_chunk)
    if grad_bias is not None:
        grad_bias.add_(dlogits.sum(0, dtype=torch.float32))


def or_empty(t: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """Custom ops cannot return None: an absent output is an empty tensor."""
    return t if t is not None else like.new_empty((0,))


_SCALE_PIECE = 1 << 24  # elements per piece of scaled(): a 64 MB fp32 temporary at most


def scaled(grad: torch.Tensor, grad_loss: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """grad * grad_loss (0-d) in ``dtype`` with one rounding and no full-size temporary (torch's mul into another
    dtype computes a whole temporary of grad's dtype first: 1 GB for a 64128 x 4096 fp32 slice of dW)."""
    out = torch.empty(grad.shape, dtype=dtype, device=grad.device)
    factor = grad_loss.reshape(()).float()
    for flat_grad, flat_out in zip(grad.reshape(-1).split(_SCALE_PIECE), out.view(-1).split(_SCALE_PIECE),
                                   strict=True):  # fmt: skip
        torch.mul(flat_grad, factor, out=flat_out)
    return out
