"""``torch.nn.Linear`` with a LoRA adapter, the forward through tritonkit's fused LoRA linear."""

from __future__ import annotations

import math

import torch

from tritonkit.ops import lora_linear


class LoRALinear(torch.nn.Linear):
    """``x W^T + b + (lora_alpha / r) * (x A^T) B^T`` with ``lora_A`` (r, in) and ``lora_B`` (out, r).

    Keeps nn.Linear's ``weight`` and ``bias`` (so a Linear's state_dict loads with ``strict=False``)
    and adds the parameters ``lora_A`` and ``lora_B``, initialised as PEFT does: A Kaiming-uniform, B
    zero, so a fresh adapter changes nothing. ``freeze_base=True`` (the default) turns off the base
    weight's and bias's gradients, and the backward then skips the dW GEMM. All parameters and the
    input share one dtype (see :func:`tritonkit.ops.lora_linear`).

    Example: ``layer = tk.nn.LoRALinear.from_linear(model.q_proj, r=16, lora_alpha=32)``.
    """

    def __init__(self, in_features: int, out_features: int, r: int = 8, lora_alpha: float | None = None,
                 bias: bool = True, freeze_base: bool = True, device=None, dtype=None):  # fmt: skip
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self._add_adapter(r, lora_alpha, freeze_base)

    def _add_adapter(self, r: int, lora_alpha: float | None, freeze_base: bool) -> None:
        """lora_A and lora_B on the weight's device and dtype, initialised as PEFT's; the freeze."""
        if isinstance(r, bool) or not isinstance(r, int) or r < 1:
            raise ValueError(f"LoRALinear: r must be a positive int, got {r!r}")
        self.r = r
        self.lora_alpha = float(r if lora_alpha is None else lora_alpha)
        options = {"device": self.weight.device, "dtype": self.weight.dtype}
        self.lora_A = torch.nn.Parameter(torch.empty(r, self.in_features, **options))
        self.lora_B = torch.nn.Parameter(torch.zeros(self.out_features, r, **options))
        torch.nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        if freeze_base:
            self.weight.requires_grad_(False)
            if self.bias is not None:
                self.bias.requires_grad_(False)

    @property
    def scaling(self) -> float:
        return self.lora_alpha / self.r

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, r: int = 8, lora_alpha: float | None = None,
                    freeze_base: bool = True) -> LoRALinear:  # fmt: skip
        """A LoRALinear over ``linear``'s own weight and bias parameters (shared, not copied; frozen in
        place with ``freeze_base``) with a fresh adapter on their device and dtype."""
        layer = cls(linear.in_features, linear.out_features, r, lora_alpha, bias=linear.bias is not None,
                    freeze_base=False, device="meta")  # fmt: skip
        layer.weight, layer.bias = linear.weight, linear.bias
        layer._add_adapter(r, lora_alpha, freeze_base)
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return lora_linear(x, self.weight, self.lora_A, self.lora_B, self.scaling, self.bias)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, r={self.r}, lora_alpha={self.lora_alpha}"
