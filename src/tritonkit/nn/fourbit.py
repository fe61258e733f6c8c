"""Linear4bit: a linear layer whose weight is frozen in NF4 or INT4 codes, the base of QLoRA's adapters."""

from __future__ import annotations

import torch

from tritonkit import ops
from tritonkit.ops.fourbit.launch import CheckedWeight, checked_int4_weight, checked_nf4_weight
from tritonkit.ops.fourbit.op import linear_4bit

QUANTIZE = ("nf4", "int4")
_NF4_TENSORS = ("absmax", "absmax_codes", "absmax_scales", "offset", "nested_code")
_FP32_BUFFERS = ("absmax", "absmax_scales", "offset", "nested_code", "scales")  # kept in fp32 through .to(dtype)


def _same_tensors(held: list, before: list) -> bool:
    """Whether two lists of (tensor, data_ptr) name the same tensors at the same addresses."""
    return len(held) == len(before) and all(
        t is u and address == address_before for (t, address), (u, address_before) in zip(held, before, strict=True)
    )


class Linear4bit(torch.nn.Module):
    """``y = x W^T + b`` with W (out, in) held in 4-bit codes (buffers, in the state_dict) and multiplied by
    :func:`tritonkit.ops.nf4_linear` or :func:`tritonkit.ops.int4_linear`, which dequantize it in registers.

    - ``quantize="nf4"``: bitsandbytes' NF4 (``blocksize``, ``double_quant``); buffers ``weight`` (the packed codes)
      and ``absmax``, or ``absmax_codes``, ``absmax_scales``, ``offset``, ``nested_code`` when double-quantized.
    - ``quantize="int4"``: grouped INT4 (``group_size``, ``symmetric``); buffers ``weight`` (codes (out, in / 2)),
      ``scales``, ``zeros``.
    - The weight is frozen (no gradient reaches it); x's gradient flows. The bias is a Parameter that does not
      require grad (set it to train it). ``model.to(torch.bfloat16)`` leaves the fp32 scales in fp32, as
      bitsandbytes keeps its quantization state.

    Example: ``layer = tk.nn.Linear4bit.from_linear(model.q_proj, "nf4", double_quant=True)``.
    """

    def __init__(self, in_features: int, out_features: int, quantize: str, tensors: dict, bias: torch.Tensor | None,
                 *, dtype: torch.dtype, options: dict) -> None:  # fmt: skip
        super().__init__()
        if quantize not in QUANTIZE:
            raise ValueError(f"Linear4bit: quantize must be one of {QUANTIZE}, got {quantize!r}")
        self.in_features, self.out_features, self.quantize = in_features, out_features, quantize
        self.dtype, self.options = dtype, dict(options)  # the weight's dtype before quantization; the quantizer's
        for name, tensor in tensors.items():
            self.register_buffer(name, tensor)
        self.bias = None if bias is None else torch.nn.Parameter(bias, requires_grad=False)
        self._checked: tuple | None = None  # (the buffers' identities and addresses, their CheckedWeight)

    @staticmethod
    def quantized(weight: torch.Tensor, quantize: str, options: dict) -> dict:
        """The buffers of ``weight`` (out, in) quantized with ``options`` (nf4: blocksize, double_quant; int4:
        group_size, symmetric)."""
        with torch.no_grad():
            if quantize == "nf4":
                packed, state = ops.nf4_quantize(weight.detach(), **options)
                return {"weight": packed, **{name: getattr(state, name) for name in _NF4_TENSORS}}
            qweight, scales, zeros = ops.int4_quantize(weight.detach(), **options)
            return {"weight": qweight, "scales": scales, "zeros": zeros}

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, quantize: str = "nf4", *, blocksize: int = 64,
                    double_quant: bool = False, group_size: int = 128,
                    symmetric: bool = False) -> Linear4bit:  # fmt: skip
        """``linear``'s weight quantized (NF4: ``blocksize``, ``double_quant``; INT4: ``group_size``, ``symmetric``),
        its bias copied."""
        if not isinstance(linear, torch.nn.Linear):
            raise TypeError(f"Linear4bit.from_linear: linear must be a torch.nn.Linear, got {type(linear).__name__}")
        if quantize not in QUANTIZE:
            raise ValueError(f"Linear4bit: quantize must be one of {QUANTIZE}, got {quantize!r}")
        options = ({"blocksize": blocksize, "double_quant": double_quant} if quantize == "nf4" else
                   {"group_size": group_size, "symmetric": symmetric})  # fmt: skip
        bias = None if linear.bias is None else linear.bias.detach().clone()
        return cls(linear.in_features, linear.out_features, quantize, cls.quantized(linear.weight, quantize, options),
                   bias, dtype=linear.weight.dtype, options=options)  # fmt: skip

    @property
    def state(self) -> ops.NF4State:
        """The NF4 codes' state (NF4 only)."""
        tensors = {name: getattr(self, name, None) for name in _NF4_TENSORS}
        return ops.NF4State((self.out_features, self.in_features), self.dtype, self.options["blocksize"], **tensors)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x W^T + b``; x (..., in) gives (..., out), and rows (M, in) the op's own output (M, out), not a view."""
        bias = self.bias if self.bias is None or self.bias.dtype == x.dtype else self.bias.to(x.dtype)
        if torch.compiler.is_compiling():  # traced once: the public ops, with no cache to guard on
            if self.quantize == "nf4":
                return ops.nf4_linear(x, self.weight, self.state, bias=bias)
            return ops.int4_linear(x, self.weight, self.scales, self.zeros, group_size=self.options["group_size"],
                                   bias=bias)  # fmt: skip
        return linear_4bit(x, self._checked_weight(), bias)

    def _checked_weight(self) -> CheckedWeight:
        """The codes checked once for the buffers held now: again when they change (load_codes, .to(), a buffer
        assigned or its .data swapped), not every step."""
        held = [(t, t.data_ptr()) for t in self._buffers.values() if t is not None]
        if self._checked is None or not _same_tensors(held, self._checked[0]):
            if self.quantize == "nf4":
                weight = checked_nf4_weight(self.weight, self.state)
            else:
                weight = checked_int4_weight(self.weight, self.scales, self.zeros, self.options["group_size"])
            self._checked = (held, weight)
        return self._checked[1]

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The weight (out, in) the codes hold, in ``dtype``."""
        if self.quantize == "nf4":
            return ops.nf4_dequantize(self.weight, self.state, dtype=dtype)
        return ops.int4_dequantize(self.weight, self.scales, self.zeros, group_size=self.options["group_size"],
                                   dtype=dtype)  # fmt: skip

    def codes(self) -> dict:
        """The buffers that hold the weight, by name."""
        return {name: tensor for name, tensor in self._buffers.items() if tensor is not None}

    def load_codes(self, codes: dict) -> None:
        """Replace the weight's buffers (as ``codes()`` or ``quantized()`` give them)."""
        for name, tensor in codes.items():
            self._buffers[name] = tensor
        self._checked = None

    def _apply(self, fn, recurse=True):
        """Module.to and friends: devices move, but the fp32 scales stay fp32 whatever dtype the model takes."""
        before = {name: t for name, t in self._buffers.items() if name in _FP32_BUFFERS and t is not None}
        super()._apply(fn, recurse)
        for name, tensor in before.items():
            if self._buffers[name].dtype != torch.float32:
                self._buffers[name] = tensor.to(self._buffers[name].device)
        self._checked = None  # it held the tensors before the move
        return self

    def extra_repr(self) -> str:
        options = ", ".join(f"{key}={value}" for key, value in self.options.items())
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"quantize={self.quantize}, {options}")  # fmt: skip
