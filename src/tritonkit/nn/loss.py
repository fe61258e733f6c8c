"""Loss modules over :mod:`tritonkit.ops.cross_entropy`: the options (and class weights, a buffer) are fixed at
construction, the tensors (the LM head's weight too) arrive at call time."""

from __future__ import annotations

import torch

from tritonkit.ops import cross_entropy, fused_linear_cross_entropy
from tritonkit.ops.loss.op import CrossEntropyOutput


class _CrossEntropyOptions(torch.nn.Module):
    """The options both modules pass to their op, and the class weights, registered as the buffer ``weight_name`` (as
    torch's ``nn.CrossEntropyLoss`` registers ``weight``): they follow ``.to()`` and live in the state dict, and
    None is no weights."""

    weight_name = "weight"

    def __init__(self, class_weight: torch.Tensor | None, ignore_index: int, label_smoothing: float, z_loss: float,
                 softcap: float | None, reduction: str, loss_dtype: torch.dtype | None, return_z_loss: bool,
                 return_token_accuracy: bool):  # fmt: skip
        super().__init__()
        self.register_buffer(self.weight_name, class_weight)
        self.ignore_index, self.label_smoothing, self.z_loss = ignore_index, label_smoothing, z_loss
        self.softcap, self.reduction, self.loss_dtype = softcap, reduction, loss_dtype
        self.return_z_loss, self.return_token_accuracy = return_z_loss, return_token_accuracy

    def _options(self) -> dict:
        return {"ignore_index": self.ignore_index, "label_smoothing": self.label_smoothing, "z_loss": self.z_loss,
                "softcap": self.softcap, "reduction": self.reduction, "loss_dtype": self.loss_dtype,
                "return_z_loss": self.return_z_loss,
                "return_token_accuracy": self.return_token_accuracy}  # fmt: skip

    def _call_options(self) -> dict:
        """The op's keyword arguments: the options and the class weights."""
        return {self.weight_name: getattr(self, self.weight_name), **self._options()}

    def extra_repr(self) -> str:
        weights = getattr(self, self.weight_name)
        shown = [f"{self.weight_name}=({weights.shape[0]},)"] if weights is not None else []
        return ", ".join(shown + [f"{key}={value!r}" for key, value in self._options().items()])


class CrossEntropyLoss(_CrossEntropyOptions):
    """``loss = CrossEntropyLoss(z_loss=1e-4)(logits, target)``: :func:`tritonkit.ops.cross_entropy` on class-last
    logits (..., V), with its options.

    ``weight``: class weights (V,) as torch's ``nn.CrossEntropyLoss(weight=...)`` (a buffer, no gradient).
    ``loss_dtype=torch.float32`` returns the loss unrounded in fp32 for 16-bit logits. ``return_z_loss`` and
    ``return_token_accuracy`` make the module return a :class:`~tritonkit.ops.loss.op.CrossEntropyOutput` (loss,
    z_loss, token_accuracy), as Liger-Kernel's. ``inplace_backward=True`` lets the backward overwrite the logits with
    their gradient (no allocation of their size; see the op for when that is safe)."""

    def __init__(self, weight: torch.Tensor | None = None, *, ignore_index: int = -100, label_smoothing: float = 0.0,
                 z_loss: float = 0.0, softcap: float | None = None, reduction: str = "mean",
                 loss_dtype: torch.dtype | None = None, return_z_loss: bool = False,
                 return_token_accuracy: bool = False, inplace_backward: bool = False):  # fmt: skip
        super().__init__(weight, ignore_index, label_smoothing, z_loss, softcap, reduction, loss_dtype, return_z_loss,
                         return_token_accuracy)  # fmt: skip
        self.inplace_backward = inplace_backward

    def _options(self) -> dict:
        return {**super()._options(), "inplace_backward": self.inplace_backward}

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor | CrossEntropyOutput:
        return cross_entropy(logits, target, **self._call_options())


class FusedLinearCrossEntropyLoss(_CrossEntropyOptions):
    """``loss = FusedLinearCrossEntropyLoss()(hidden, lm_head.weight, target, lm_head.bias)``: the LM head's
    projection and the cross-entropy in one op that never builds the logits
    (:func:`tritonkit.ops.fused_linear_cross_entropy`), with its options.

    The module holds no head weight: the caller passes the head's weight on every call, from inside the model's
    forward, so an FSDP-gathered, tied or otherwise wrapped weight is the one used. Class weights are ``ce_weight``
    (V,), the op's name for them (a buffer, no gradient); ``loss_dtype``, ``return_z_loss`` and
    ``return_token_accuracy`` as :class:`CrossEntropyLoss`'s. ``accum_dtype``: d(weight)'s accumulator, torch.float32
    (the default) or the head weight's dtype (half the memory, a 16-bit rounding a chunk), as the op's.
    """

    weight_name = "ce_weight"

    def __init__(self, ce_weight: torch.Tensor | None = None, *, ignore_index: int = -100,
                 label_smoothing: float = 0.0, z_loss: float = 0.0, softcap: float | None = None,
                 reduction: str = "mean", loss_dtype: torch.dtype | None = None, return_z_loss: bool = False,
                 return_token_accuracy: bool = False, accum_dtype: torch.dtype = torch.float32):  # fmt: skip
        super().__init__(ce_weight, ignore_index, label_smoothing, z_loss, softcap, reduction, loss_dtype,
                         return_z_loss, return_token_accuracy)  # fmt: skip
        self.accum_dtype = accum_dtype

    def _options(self) -> dict:
        return {**super()._options(), "accum_dtype": self.accum_dtype}

    def forward(self, hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                bias: torch.Tensor | None = None) -> torch.Tensor | CrossEntropyOutput:  # fmt: skip
        return fused_linear_cross_entropy(hidden, weight, target, bias, **self._call_options())
