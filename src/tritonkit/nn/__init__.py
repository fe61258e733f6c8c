"""Thin ``torch.nn.Module`` wrappers over :mod:`tritonkit.ops` (no kernels here)."""

from tritonkit.nn.float8 import Float8Linear, convert_to_float8_training
from tritonkit.nn.fourbit import Linear4bit
from tritonkit.nn.lora import LoRALinear, adapter_state_dict, load_adapter_state_dict
from tritonkit.nn.loss import CrossEntropyLoss, FusedLinearCrossEntropyLoss
from tritonkit.nn.mlp import SwiGLUMLP
from tritonkit.nn.norm import LayerNorm, RMSNorm, RMSNormGated
from tritonkit.nn.quantized import QuantizedLinear

__all__ = ["CrossEntropyLoss", "Float8Linear", "FusedLinearCrossEntropyLoss", "LayerNorm", "Linear4bit",
           "LoRALinear", "QuantizedLinear", "RMSNorm", "RMSNormGated", "SwiGLUMLP", "adapter_state_dict",
           "convert_to_float8_training", "load_adapter_state_dict"]  # fmt: skip
