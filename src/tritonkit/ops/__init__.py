"""Public ops. Each family is a package ``tritonkit.ops.<family>`` with the same floor plan: kernels.py (the
``@triton.jit`` kernels), plan.py (launch plans by device architecture), launch.py (validate, allocate, launch),
op.py (the public functions and their autograd), spec.py (float64 reference, cases, cost model; the registry spec).
A package never carries the name of a public op, which would shadow it here.
"""

from tritonkit._core.env import record_kernel_mode
from tritonkit._core.interpreter import speed_up_if_interpreting
from tritonkit.ops.activation.op import geglu, gelu, silu, swiglu
from tritonkit.ops.decoding.op import decode_attention, dequantize_kv, kv_cache_append, quantize_kv
from tritonkit.ops.flash_attention.op import attention, attention_varlen
from tritonkit.ops.fourbit.op import int4_linear, nf4_linear
from tritonkit.ops.gated_norm.op import rms_norm_gated
from tritonkit.ops.gemm.op import dynamic_scaled_linear, scaled_linear
from tritonkit.ops.lora.op import lora_linear
from tritonkit.ops.loss.op import cross_entropy, fused_linear_cross_entropy
from tritonkit.ops.norm.op import layer_norm, rms_norm
from tritonkit.ops.quant.op import NF4State as NF4State  # nf4_quantize's state type, not an op
from tritonkit.ops.quant.op import (
    dequantize,
    int4_dequantize,
    int4_quantize,
    nf4_dequantize,
    nf4_quantize,
    quantize,
)
from tritonkit.ops.rotary.op import rope
from tritonkit.ops.row_softmax.op import log_softmax, softmax
from tritonkit.ops.tutorial.op import add, add_relu, copy, matmul, rgb_to_grey
from tritonkit.ops.vocab_parallel.op import vocab_parallel_cross_entropy, vocab_parallel_fused_linear_cross_entropy

record_kernel_mode()  # the mode the families' kernels above were defined in
speed_up_if_interpreting()  # helper calls inside interpreted kernels skip a redundant repatching of triton.language

__all__ = [
    "add",
    "add_relu",
    "attention",
    "attention_varlen",
    "copy",
    "cross_entropy",
    "decode_attention",
    "dequantize",
    "dequantize_kv",
    "dynamic_scaled_linear",
    "fused_linear_cross_entropy",
    "geglu",
    "gelu",
    "int4_dequantize",
    "int4_linear",
    "int4_quantize",
    "kv_cache_append",
    "layer_norm",
    "log_softmax",
    "lora_linear",
    "matmul",
    "nf4_dequantize",
    "nf4_linear",
    "nf4_quantize",
    "quantize",
    "quantize_kv",
    "rgb_to_grey",
    "rms_norm",
    "rms_norm_gated",
    "rope",
    "scaled_linear",
    "silu",
    "softmax",
    "swiglu",
    "vocab_parallel_cross_entropy",
    "vocab_parallel_fused_linear_cross_entropy",
]
