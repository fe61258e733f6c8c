"""QuantizedLinear: a linear layer whose weight is held in int8 or float8 codes, for inference."""

from __future__ import annotations

import torch

from tritonkit import ops

GRANULARITIES = {  # the module's granularity -> (activations', weight's) scales
    "tensor": ("tensor", "tensor"),
    "row": ("row", "row"),
    "block": ("group", "block"),  # DeepSeek-V3: activations per 1 x 128, weights per 128 x 128
}
ACTIVATIONS = ("dynamic", "weight_only")


class QuantizedLinear(torch.nn.Module):
    """``y = x W^T + b`` with W held as int8 or float8 codes and fp32 scales (buffers, in the state_dict).

    - ``activations="dynamic"`` (W8A8): each call quantizes x to the weight's format (tk.ops.quantize: per tensor, per
      row, or per 1 x block_size group with block granularity), then one scaled GEMM (tk.ops.scaled_linear) applies
      both scales and the bias. (These two launches ran 2.3 to 5.5 times as fast as tk.ops.dynamic_scaled_linear,
      which quantizes x inside the GEMM, at every M from 16 to 8192 on the H200.)
    - ``activations="weight_only"`` (W8A16): x stays in its dtype; the kernel converts the weight's codes.
    - ``granularity``: ``"tensor"``, ``"row"`` (per token and per output feature) or ``"block"`` (activations per
      1 x block_size group, weights per block_size x block_size block).
    - ``use_fast_accum``: float8 W8A8 with tensor or row scales sums over all of K in the tensor cores
      (tk.ops.scaled_linear's option: faster on Hopper, outputs within about 3e-3 of their rms); the other forms
      ignore it.

    The output has x's dtype. Inference only: the codes carry no gradient, and x must not require one.

    Example: ``layer = tk.nn.QuantizedLinear.from_linear(model.q_proj, torch.float8_e4m3fn)``.
    """

    def __init__(self, weight_codes: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None,
                 activations: str, granularity: str, block_size: int, use_fast_accum: bool = False):  # fmt: skip
        super().__init__()
        if not isinstance(use_fast_accum, bool):
            raise TypeError(f"QuantizedLinear: use_fast_accum must be a bool, got {type(use_fast_accum).__name__}")
        if activations not in ACTIVATIONS:
            raise ValueError(f"QuantizedLinear: activations must be one of {ACTIVATIONS}, got {activations!r}")
        if granularity not in GRANULARITIES:
            raise ValueError(f"QuantizedLinear: granularity must be one of {tuple(GRANULARITIES)}, got "
                             f"{granularity!r}")  # fmt: skip
        self.out_features, self.in_features = weight_codes.shape
        self.activations, self.granularity, self.block_size = activations, granularity, block_size
        self.use_fast_accum = use_fast_accum
        self.register_buffer("weight_codes", weight_codes)
        self.register_buffer("weight_scale", weight_scale)
        self.register_buffer("bias", bias)

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, dtype: torch.dtype, *, granularity: str = "row",
                    activations: str = "dynamic", block_size: int = 128,
                    use_fast_accum: bool = False) -> QuantizedLinear:  # fmt: skip
        """``linear``'s weight quantized to ``dtype`` (torch.int8, torch.float8_e4m3fn or torch.float8_e5m2); its
        bias kept in its dtype."""
        if not isinstance(linear, torch.nn.Linear):
            raise TypeError(f"QuantizedLinear.from_linear: linear must be a torch.nn.Linear, got {type(linear)}")
        if granularity not in GRANULARITIES:
            raise ValueError(f"QuantizedLinear: granularity must be one of {tuple(GRANULARITIES)}, got "
                             f"{granularity!r}")  # fmt: skip
        with torch.no_grad():
            codes, scale = ops.quantize(linear.weight.detach(), dtype, granularity=GRANULARITIES[granularity][1],
                                        block_size=block_size)  # fmt: skip
        bias = None if linear.bias is None else linear.bias.detach().clone()
        return cls(codes, scale, bias, activations, granularity, block_size, use_fast_accum)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and x.requires_grad:
            raise ValueError("QuantizedLinear is for inference, but its input requires grad; call the model under "
                             "torch.no_grad() or torch.inference_mode()")  # fmt: skip
        if self.activations == "weight_only":
            return ops.scaled_linear(x, self.weight_codes, None, self.weight_scale, bias=self.bias, out_dtype=x.dtype)
        x_codes, x_scale = ops.quantize(x, self.weight_codes.dtype, granularity=GRANULARITIES[self.granularity][0],
                                        block_size=self.block_size)  # fmt: skip
        return ops.scaled_linear(x_codes, self.weight_codes, x_scale, self.weight_scale, bias=self.bias,
                                 out_dtype=x.dtype, use_fast_accum=self.use_fast_accum)  # fmt: skip

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, weight={self.weight_codes.dtype}, "
                f"activations={self.activations}, granularity={self.granularity}"
                + (", use_fast_accum=True" if self.use_fast_accum else ""))  # fmt: skip
