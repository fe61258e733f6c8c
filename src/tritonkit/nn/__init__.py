"""Thin ``torch.nn.Module`` wrappers over :mod:`tritonkit.ops` (no kernels here)."""

from tritonkit.nn.lora import LoRALinear
from tritonkit.nn.loss import CrossEntropyLoss, FusedLinearCrossEntropyLoss
from tritonkit.nn.mlp import SwiGLUMLP
from tritonkit.nn.norm import LayerNorm, RMSNorm, RMSNormGated
from tritonkit.nn.quantized import QuantizedLinear

__all__ = ["CrossEntropyLoss", "FusedLinearCrossEntropyLoss", "LayerNorm", "LoRALinear", "QuantizedLinear", "RMSNorm",
           "RMSNormGated", "SwiGLUMLP"]  # fmt: skip
