"""LoRALinear: a linear layer (full precision or 4-bit) with a LoRA adapter, laid out as PEFT's LoRA layers, and the
adapter's state dict in the names PEFT saves and loads."""

from __future__ import annotations

import math

import torch

from tritonkit.nn.fourbit import Linear4bit
from tritonkit.ops import lora_linear

ADAPTER = "default"  # PEFT's name for a model's one adapter


def _in_dtype(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """tensor cast to dtype, itself where it has it already (as .to gives, without a dispatch per call)."""
    return tensor if tensor.dtype == dtype else tensor.to(dtype)


class LoRALinear(torch.nn.Module):
    """``base(x) + (lora_alpha / r) * (dropout(x) A^T) B^T``, with PEFT's layout and names.

    - ``base_layer``: a ``torch.nn.Linear`` (its weight full precision) or a :class:`tk.nn.Linear4bit` (NF4 or INT4,
      QLoRA); ``lora_A.default`` (in -> r) and ``lora_B.default`` (r -> out): ``nn.Linear`` layers without bias,
      initialised as PEFT does (A Kaiming-uniform, B zero, so a fresh adapter changes nothing); ``lora_dropout.default``
      on the adapter's input. The state dict's keys are PEFT's: ``base_layer.weight``, ``base_layer.bias``,
      ``lora_A.default.weight``, ``lora_B.default.weight`` (:func:`adapter_state_dict` gives the keys PEFT saves).
    - ``freeze_base=True`` (the default) turns off the base layer's gradients; a 4-bit base is always frozen.
    - Forward: a full-precision base with no active dropout runs :func:`tritonkit.ops.lora_linear` (one fused GEMM,
      the backward skipping dW for a frozen weight); otherwise the base (nf4_linear / int4_linear for a 4-bit one)
      plus the adapter's two thin products, added in place. The adapter computes in x's dtype (an fp32 adapter
      over a bf16 model is cast, as torch.autocast would), its gradients flowing to the fp32 weights.
    - ``merge()`` adds ``scaling * B A`` into the base weight and ``unmerge()`` takes it out, as PEFT's. A 4-bit base
      is dequantized, added to and requantized: the merged weight is within one quantization step of the exact sum
      (NF4: half the gap between neighbouring code values times the block's absmax; INT4: half a scale), the error
      of any quantized merge; ``unmerge()`` restores the original codes exactly (kept aside while merged). A
      full-precision base rounds ``W + delta`` and ``W + delta - delta`` to its dtype, as PEFT's.

    Example: ``layer = tk.nn.LoRALinear.from_linear(model.q_proj, r=16, lora_alpha=32, quantize="nf4")``.
    """

    def __init__(self, in_features: int, out_features: int, r: int = 8, lora_alpha: float | None = None,
                 bias: bool = True, freeze_base: bool = True, device=None, dtype=None, *, lora_dropout: float = 0.0,
                 base_layer: torch.nn.Module | None = None):  # fmt: skip
        super().__init__()
        if isinstance(r, bool) or not isinstance(r, int) or r < 1:
            raise ValueError(f"LoRALinear: r must be a positive int, got {r!r}")
        if not 0.0 <= lora_dropout < 1.0:
            raise ValueError(f"LoRALinear: lora_dropout must be in [0, 1), got {lora_dropout!r}")
        if base_layer is None:
            base_layer = torch.nn.Linear(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.base_layer = base_layer
        self.in_features, self.out_features = base_layer.in_features, base_layer.out_features
        self.r, self.lora_alpha = r, float(r if lora_alpha is None else lora_alpha)
        # A 4-bit base keeps the dtype its weight had; the adapter takes it.
        dtype = base_layer.dtype if isinstance(base_layer, Linear4bit) else base_layer.weight.dtype
        options = {"device": base_layer.weight.device, "dtype": dtype}
        self.lora_A = torch.nn.ModuleDict({ADAPTER: torch.nn.Linear(self.in_features, r, bias=False, **options)})
        self.lora_B = torch.nn.ModuleDict({ADAPTER: torch.nn.Linear(r, self.out_features, bias=False, **options)})
        dropout = torch.nn.Dropout(lora_dropout) if lora_dropout > 0 else torch.nn.Identity()
        self.lora_dropout = torch.nn.ModuleDict({ADAPTER: dropout})
        torch.nn.init.kaiming_uniform_(self.lora_A[ADAPTER].weight, a=math.sqrt(5))
        torch.nn.init.zeros_(self.lora_B[ADAPTER].weight)
        if freeze_base:
            for parameter in base_layer.parameters():
                parameter.requires_grad_(False)
        self._unmerged_codes: dict | None = None
        self.merged = False

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, r: int = 8, lora_alpha: float | None = None, *,
                    lora_dropout: float = 0.0, quantize: str | None = None, freeze_base: bool = True,
                    **quantize_options) -> LoRALinear:  # fmt: skip
        """A LoRALinear over ``linear``: the module itself (shared, not copied; frozen in place with
        ``freeze_base``), or with ``quantize="nf4"`` or ``"int4"`` a :class:`tk.nn.Linear4bit` of its weight
        (``quantize_options``: Linear4bit.from_linear's ``blocksize``, ``double_quant``, ``group_size``,
        ``symmetric``); a fresh adapter on the weight's device and dtype."""
        if not isinstance(linear, torch.nn.Linear):
            raise TypeError(f"LoRALinear.from_linear: linear must be a torch.nn.Linear, got {type(linear).__name__}")
        if quantize is None and quantize_options:
            raise ValueError(f"LoRALinear.from_linear: {sorted(quantize_options)} apply to quantize='nf4' or 'int4'")
        base = linear if quantize is None else Linear4bit.from_linear(linear, quantize, **quantize_options)
        return cls(linear.in_features, linear.out_features, r, lora_alpha, freeze_base=freeze_base,
                   lora_dropout=lora_dropout, base_layer=base)  # fmt: skip

    @property
    def weight(self) -> torch.Tensor:
        """The base layer's weight (a 4-bit base's packed codes), as PEFT's layers give it."""
        return self.base_layer.weight

    @property
    def bias(self) -> torch.Tensor | None:
        return self.base_layer.bias

    @property
    def scaling(self) -> float:
        return self.lora_alpha / self.r

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.merged:
            return self.base_layer(x)
        lora_a = _in_dtype(self.lora_A[ADAPTER].weight, x.dtype)
        lora_b = _in_dtype(self.lora_B[ADAPTER].weight, x.dtype)
        dropout = self.lora_dropout[ADAPTER]
        if not isinstance(self.base_layer, Linear4bit) and not (
            self.training and isinstance(dropout, torch.nn.Dropout)
        ):
            return lora_linear(x, self.base_layer.weight, lora_a, lora_b, self.scaling, self.base_layer.bias)
        rows = x.reshape(-1, self.in_features)
        # The base's output for rows is its own tensor (a 4-bit base's op output, or nn.Linear's), not a view: the
        # adapter is added to it in place, with no second y and no CopySlices node for autograd to run backward.
        y = self.base_layer(rows)
        adapter_input = dropout(rows) if isinstance(dropout, torch.nn.Dropout) else rows
        y.addmm_(adapter_input @ lora_a.t(), lora_b.t(), alpha=self.scaling)
        return y.view(*x.shape[:-1], self.out_features)

    def _delta(self) -> torch.Tensor:
        """scaling * B A in fp32."""
        return (self.lora_B[ADAPTER].weight.float() @ self.lora_A[ADAPTER].weight.float()) * self.scaling

    @torch.no_grad()
    def merge(self) -> None:
        """Add the adapter into the base weight (a 4-bit base requantized; see the class docstring)."""
        if self.merged:
            return
        if isinstance(self.base_layer, Linear4bit):
            self._unmerged_codes = self.base_layer.codes()
            merged = self.base_layer.dequantize(torch.float32) + self._delta()
            self.base_layer.load_codes(Linear4bit.quantized(merged, self.base_layer.quantize,
                                                            self.base_layer.options))  # fmt: skip
        else:
            weight = self.base_layer.weight
            weight.copy_((weight.float() + self._delta()).to(weight.dtype))
        self.merged = True

    @torch.no_grad()
    def unmerge(self) -> None:
        """Take the adapter out of the base weight again (a 4-bit base's original codes restored exactly)."""
        if not self.merged:
            return
        if isinstance(self.base_layer, Linear4bit):
            self.base_layer.load_codes(self._unmerged_codes)
            self._unmerged_codes = None
        else:
            weight = self.base_layer.weight
            weight.copy_((weight.float() - self._delta()).to(weight.dtype))
        self.merged = False

    def extra_repr(self) -> str:
        return f"r={self.r}, lora_alpha={self.lora_alpha}, merged={self.merged}"


def adapter_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The adapters of ``model``'s LoRALinear layers in the names PEFT saves (``get_peft_model_state_dict``, the
    contents of adapter_model.safetensors): ``base_model.model.<path>.lora_A.weight`` and ``...lora_B.weight``."""
    state = {}
    for path, module in model.named_modules():
        if isinstance(module, LoRALinear):
            prefix = f"base_model.model.{path}." if path else "base_model.model."
            for side in ("lora_A", "lora_B"):
                state[f"{prefix}{side}.weight"] = getattr(module, side)[ADAPTER].weight.detach()
    return state


def load_adapter_state_dict(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load adapters saved by PEFT (or :func:`adapter_state_dict`) into ``model``'s LoRALinear layers; a key that
    names no layer of ``model``, or a layer left without its adapter, raises KeyError."""
    expected = adapter_state_dict(model)
    unknown, missing = sorted(set(state) - set(expected)), sorted(set(expected) - set(state))
    if unknown or missing:
        raise KeyError(f"load_adapter_state_dict: keys of no LoRALinear layer {unknown[:4]}, adapters not in the "
                       f"state dict {missing[:4]}")  # fmt: skip
    with torch.no_grad():
        for key, target in expected.items():
            target.copy_(state[key])
