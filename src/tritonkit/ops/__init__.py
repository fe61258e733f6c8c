"""Public ops. Each family module holds kernels -> launchers -> public functions -> registry specs."""

from tritonkit.ops.activation import geglu, gelu, silu, swiglu
from tritonkit.ops.cross_entropy import cross_entropy, fused_linear_cross_entropy
from tritonkit.ops.lora import lora_linear
from tritonkit.ops.matmul import matmul
from tritonkit.ops.norm import layer_norm, rms_norm
from tritonkit.ops.rope import rope
from tritonkit.ops.softmax import log_softmax, softmax
from tritonkit.ops.tutorial import add, add_relu, copy, rgb_to_grey

__all__ = [
    "add",
    "add_relu",
    "copy",
    "cross_entropy",
    "fused_linear_cross_entropy",
    "geglu",
    "gelu",
    "layer_norm",
    "log_softmax",
    "lora_linear",
    "matmul",
    "rgb_to_grey",
    "rms_norm",
    "rope",
    "silu",
    "softmax",
    "swiglu",
]
