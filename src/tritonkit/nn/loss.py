"""Loss modules over :mod:`tritonkit.ops.cross_entropy`: the options are fixed at construction, the
tensors (the LM head's weight too) arrive at call time."""

from __future__ import annotations

import torch

from tritonkit.ops import cross_entropy, fused_linear_cross_entropy


class _CrossEntropyOptions(torch.nn.Module):
    def __init__(self, ignore_index: int = -100, label_smoothing: float = 0.0, z_loss: float = 0.0,
                 softcap: float | None = None, reduction: str = "mean"):  # fmt: skip
        super().__init__()
        self.ignore_index, self.label_smoothing, self.z_loss = ignore_index, label_smoothing, z_loss
        self.softcap, self.reduction = softcap, reduction

    def _options(self) -> dict:
        return {"ignore_index": self.ignore_index, "label_smoothing": self.label_smoothing, "z_loss": self.z_loss,
                "softcap": self.softcap, "reduction": self.reduction}  # fmt: skip

    def extra_repr(self) -> str:
        return ", ".join(f"{key}={value!r}" for key, value in self._options().items())


class CrossEntropyLoss(_CrossEntropyOptions):
    """``loss = CrossEntropyLoss(z_loss=1e-4)(logits, target)``: :func:`tritonkit.ops.cross_entropy`
    on class-last logits (..., V). ``inplace_backward=True`` lets the backward overwrite the logits
    with their gradient (no allocation of their size; see the op for when that is safe)."""

    def __init__(self, ignore_index: int = -100, label_smoothing: float = 0.0, z_loss: float = 0.0,
                 softcap: float | None = None, reduction: str = "mean", inplace_backward: bool = False):  # fmt: skip
        super().__init__(ignore_index, label_smoothing, z_loss, softcap, reduction)
        self.inplace_backward = inplace_backward

    def _options(self) -> dict:
        return {**super()._options(), "inplace_backward": self.inplace_backward}

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return cross_entropy(logits, target, **self._options())


class FusedLinearCrossEntropyLoss(_CrossEntropyOptions):
    """``loss = FusedLinearCrossEntropyLoss()(hidden, lm_head.weight, target, lm_head.bias)``: the LM
    head's projection and the cross-entropy in one op that never builds the logits
    (:func:`tritonkit.ops.fused_linear_cross_entropy`).

    The module holds no weight: the caller passes the head's weight on every call, from inside the
    model's forward, so an FSDP-gathered, tied or otherwise wrapped weight is the one used.
    """

    def forward(self, hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                bias: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
        return fused_linear_cross_entropy(hidden, weight, target, bias, **self._options())
