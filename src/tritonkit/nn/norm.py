"""Drop-in replacements for ``torch.nn.RMSNorm`` and ``torch.nn.LayerNorm``: same constructor
arguments, same parameters and state_dict keys, the forward through tritonkit's fused kernels."""

from __future__ import annotations

import math

import torch

from tritonkit.ops import layer_norm, rms_norm


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
