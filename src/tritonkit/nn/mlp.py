"""The gated MLP of Llama-style models with tritonkit's fused SwiGLU."""

from __future__ import annotations

import torch

from tritonkit.ops import swiglu


class SwiGLUMLP(torch.nn.Module):
    """``down_proj(silu(gate_proj(x)) * up_proj(x))``, the activation and product fused in one pass.

    Parameters are named as in Hugging Face's Llama MLP (gate_proj, up_proj, down_proj), so its
    state_dict loads as is.
    """

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool = False, device=None, dtype=None):
        super().__init__()
        options = {"bias": bias, "device": device, "dtype": dtype}
        self.gate_proj = torch.nn.Linear(hidden_size, intermediate_size, **options)
        self.up_proj = torch.nn.Linear(hidden_size, intermediate_size, **options)
        self.down_proj = torch.nn.Linear(intermediate_size, hidden_size, **options)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(swiglu(self.gate_proj(x), self.up_proj(x)))
