"""Drop-in replacements for ``torch.nn.RMSNorm`` and ``torch.nn.LayerNorm``: same constructor
arguments, same parameters and state_dict keys, the forward through tritonkit's fused kernels; and mamba2's
``RMSNormGated`` (mamba_ssm's gated RMSNorm module), likewise."""

from __future__ import annotations

import math

import torch

from tritonkit.ops import layer_norm, rms_norm, rms_norm_gated


def _flatten_normalized(x: torch.Tensor, normalized_shape: tuple[int, ...]) -> torch.Tensor:
    """Fold the normalised trailing dimensions into one, as the kernels normalise the last dimension."""
    k = len(normalized_shape)
    if tuple(x.shape[x.dim() - k :]) != normalized_shape:
        raise ValueError(f"input's trailing dimensions must be {normalized_shape}, got shape {tuple(x.shape)}")
    return x.reshape(*x.shape[: x.dim() - k], math.prod(normalized_shape))


class RMSNorm(torch.nn.RMSNorm):
    """``torch.nn.RMSNorm`` whose forward runs tritonkit's fused RMSNorm (eps=None means the input
    dtype's machine epsilon, as torch)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = tuple(self.normalized_shape)
        eps = self.eps if self.eps is not None else torch.finfo(x.dtype).eps
        weight = self.weight.reshape(-1) if self.weight is not None else None
        return rms_norm(_flatten_normalized(x, shape), weight, eps=eps).view(x.shape)


class LayerNorm(torch.nn.LayerNorm):
    """``torch.nn.LayerNorm`` whose forward runs tritonkit's fused LayerNorm."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = tuple(self.normalized_shape)
        weight = self.weight.reshape(-1) if self.weight is not None else None
        bias = self.bias.reshape(-1) if self.bias is not None else None
        return layer_norm(_flatten_normalized(x, shape), weight, bias, eps=self.eps).view(x.shape)


class RMSNormGated(torch.nn.Module):
    """mamba2's ``RMSNormGated`` (mamba_ssm.ops.triton.layernorm_gated.RMSNorm): the same constructor arguments,
    parameter (``weight``, ones; ``bias`` registered as None) and state_dict keys; the forward is
    :func:`tritonkit.ops.rms_norm_gated`: ``rmsnorm(x) * weight * silu(z)`` with ``norm_before_gate=True``,
    ``rmsnorm(x * silu(z)) * weight`` with False, over groups of ``group_size`` columns (None: one group)."""

    def __init__(self, hidden_size: int, eps: float = 1e-5, group_size: int | None = None,
                 norm_before_gate: bool = True, device=None, dtype=None):  # fmt: skip
        super().__init__()
        self.eps, self.group_size, self.norm_before_gate = eps, group_size, norm_before_gate
        self.weight = torch.nn.Parameter(torch.ones(hidden_size, device=device, dtype=dtype))
        self.register_parameter("bias", None)

    def reset_parameters(self) -> None:
        torch.nn.init.ones_(self.weight)

    def forward(self, x: torch.Tensor, z: torch.Tensor | None = None) -> torch.Tensor:
        return rms_norm_gated(x, self.weight, z, group_size=self.group_size, norm_before_gate=self.norm_before_gate,
                              eps=self.eps)  # fmt: skip

    def extra_repr(self) -> str:
        return (f"{self.weight.shape[0]}, eps={self.eps}, group_size={self.group_size}, "
                f"norm_before_gate={self.norm_before_gate}")  # fmt: skip
