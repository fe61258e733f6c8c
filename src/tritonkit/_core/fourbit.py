"""The 4-bit weight formats shared by the quant family (which makes and unmakes them) and the fourbit family (whose
linear layers read them): NF4's code book, bitsandbytes' nested code, :class:`NF4State`, and the checks that name
the argument at fault.

- NF4 (bitsandbytes' ``quant_type="nf4"``): the flattened weight in blocks of ``blocksize`` values, each value the
  index of one of the 16 NF4 values times its block's absmax; two codes a byte, the first in the high nibble, packed
  uint8 (ceil(n / 2),) (bitsandbytes keeps it as (ceil(n / 2), 1)). Double quantization stores the absmax values as
  8-bit codes of the dynamic code, one fp32 scale per NESTED_BLOCK blocks, plus the offset subtracted first.
- INT4 (AWQ/GPTQ style): a weight (N, K), codes uint8 (N, K / 2) two along K a byte (the even column in the low
  nibble), fp32 scales and uint8 zero points (N, ceil(K / group_size)); w = (code - zero) * scale.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from tritonkit._core.checks import check_tensor
from tritonkit._core.ints import cdiv

# NormalFloat4 (QLoRA, Dettmers et al. 2023; bitsandbytes' "nf4"): quantiles of N(0, 1) normalised to [-1, 1], with an
# exact 0 (code 7), in the order of the 4-bit codes.
NF4_CODE = (-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
            -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
            0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941, 0.7229568362236023,
            1.0)  # fmt: skip
NF4_BLOCKSIZES = (32, 64, 128, 256, 512, 1024, 2048, 4096)  # bitsandbytes' block sizes
NESTED_BLOCK = 256  # double quantization: the absmax values are themselves quantized in blocks of 256, as bitsandbytes
INT4_MIN_GROUP = 16  # the smallest group along K: a tensor-core K step for the fused 4-bit linear layers


def dynamic_code() -> torch.Tensor:
    """bitsandbytes' signed 8-bit dynamic code (its create_dynamic_map with 7 exponent bits), which its double
    quantization stores the absmax values in: for the magnitudes 10^-6 to 10^0, the midpoints of 2^i + 1 evenly
    spaced fractions of [0.1, 1] (i = 0 .. 6), with both signs, then 0 and 1; 256 fp32 values in increasing order."""
    values = []
    for i in range(7):
        fractions = torch.linspace(0.1, 1, 2**i + 1, dtype=torch.float32)
        midpoints = (fractions[:-1] + fractions[1:]) / 2.0
        magnitude = 10 ** (i - 6)
        values += (magnitude * midpoints).tolist() + (-magnitude * midpoints).tolist()
    return torch.tensor(sorted([*values, 0.0, 1.0]), dtype=torch.float32)


@functools.cache
def nf4_tables(device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(NF4 code, its 15 midpoints, the nested dynamic code) as fp32 tensors on ``device``, made once per device."""
    code = torch.tensor(NF4_CODE, dtype=torch.float32)
    bounds = (code[:-1] + code[1:]) / 2
    return code.to(device), bounds.to(device), dynamic_code().to(device)


@dataclass(frozen=True)
class NF4State:
    """What dequantizes NF4 codes: the weight's shape and dtype, the block size, and each block's absmax, either as
    fp32 values (``absmax``) or double-quantized (``absmax_codes`` uint8 in ``nested_code``, one fp32
    ``absmax_scales`` per 256 blocks, and the ``offset`` that was subtracted first), as bitsandbytes' QuantState."""

    shape: tuple
    dtype: torch.dtype
    blocksize: int
    absmax: torch.Tensor | None = None
    absmax_codes: torch.Tensor | None = None
    absmax_scales: torch.Tensor | None = None
    offset: torch.Tensor | None = None
    nested_code: torch.Tensor | None = None

    @property
    def nested(self) -> bool:
        return self.absmax is None

    def tensors(self) -> dict[str, torch.Tensor]:
        """The state's tensors by name (those that are set)."""
        names = ("absmax", "absmax_codes", "absmax_scales", "offset", "nested_code")
        return {name: getattr(self, name) for name in names if getattr(self, name) is not None}

    @classmethod
    def from_bitsandbytes(cls, quant_state) -> NF4State:
        """The state of a weight bitsandbytes quantized (``Params4bit.quant_state``, a ``QuantState`` with
        ``quant_type="nf4"``); the weight's data is ``param.data`` itself (uint8, two codes a byte)."""
        if getattr(quant_state, "quant_type", None) != "nf4":
            raise ValueError(f"NF4State.from_bitsandbytes: quant_state must be an nf4 QuantState, got quant_type "
                             f"{getattr(quant_state, 'quant_type', None)!r}")  # fmt: skip
        common = {"shape": tuple(quant_state.shape), "dtype": quant_state.dtype, "blocksize": quant_state.blocksize}
        if not getattr(quant_state, "nested", False):
            return cls(**common, absmax=quant_state.absmax.float())
        inner = quant_state.state2
        if inner.blocksize != NESTED_BLOCK:
            raise ValueError(f"NF4State.from_bitsandbytes: the nested absmax blocks must hold {NESTED_BLOCK} values, "
                             f"got {inner.blocksize}")  # fmt: skip
        return cls(**common, absmax_codes=quant_state.absmax, absmax_scales=inner.absmax.float(),
                   offset=torch.as_tensor(quant_state.offset, dtype=torch.float32, device=quant_state.absmax.device),
                   nested_code=inner.code.float())  # fmt: skip


def check_nf4_state(name: str, packed, state) -> int:
    """Check NF4 codes and their state (``name``: the op, for the messages); return the weight's element count."""
    check_tensor(f"{name}: packed", packed, dtypes=(torch.uint8,))
    if not isinstance(state, NF4State):
        raise TypeError(f"{name}: state must be an NF4State (nf4_quantize's, or NF4State.from_bitsandbytes), got "
                        f"{type(state).__name__}")  # fmt: skip
    if state.blocksize not in NF4_BLOCKSIZES:
        raise ValueError(f"{name}: state.blocksize must be one of {NF4_BLOCKSIZES}, got {state.blocksize!r}")
    n = math.prod(state.shape)
    if packed.numel() != (n + 1) // 2:
        raise ValueError(f"{name}: packed holds {packed.numel()} bytes, but state.shape {state.shape} needs "
                         f"{(n + 1) // 2}")  # fmt: skip
    blocks = cdiv(n, state.blocksize)
    if state.nested:
        if state.absmax_codes is None and state.absmax_scales is None:
            raise ValueError(f"{name}: state has neither absmax nor the double-quantized absmax_codes and "
                             "absmax_scales")  # fmt: skip
        for arg, tensor, dtype, count in (("absmax_codes", state.absmax_codes, torch.uint8, blocks),
                                          ("absmax_scales", state.absmax_scales, torch.float32,
                                           cdiv(blocks, NESTED_BLOCK))):  # fmt: skip
            if tensor is None:
                raise ValueError(f"{name}: a double-quantized state needs state.{arg}, its second level, got None")
            check_tensor(f"{name}: state.{arg}", tensor, dtypes=(dtype,))
            if tensor.numel() != count:
                raise ValueError(f"{name}: state.{arg} must hold {count} values, got {tensor.numel()}")
        if state.offset is None:
            raise ValueError(f"{name}: a double-quantized state needs its offset")
        check_tensor(f"{name}: state.offset", state.offset, dtypes=(torch.float32,))
        if state.nested_code is not None:
            check_tensor(f"{name}: state.nested_code", state.nested_code, dtypes=(torch.float32,))
            if state.nested_code.numel() != 256:
                raise ValueError(f"{name}: state.nested_code must hold the 256 values of an 8-bit code, got "
                                 f"{state.nested_code.numel()}")  # fmt: skip
    else:
        check_tensor(f"{name}: state.absmax", state.absmax, dtypes=(torch.float32,))
        if state.absmax.numel() != blocks:
            raise ValueError(f"{name}: state.absmax must hold one value per block of {state.blocksize} ({blocks}), "
                             f"got {state.absmax.numel()}")  # fmt: skip
    return n


def check_int4_group(name: str, group_size) -> None:
    if isinstance(group_size, bool) or not isinstance(group_size, int):
        raise TypeError(f"{name}: group_size must be an int, got {type(group_size).__name__}")
    if group_size < INT4_MIN_GROUP or group_size & (group_size - 1):
        raise ValueError(f"{name}: group_size must be a power of two >= {INT4_MIN_GROUP}, got {group_size}")


def check_int4_weight(name: str, qweight, scales, zeros, group_size) -> None:
    """Check INT4 codes (N, K / 2), scales and zero points (N, ceil(K / group_size)) and the group size."""
    if isinstance(scales, NF4State) or isinstance(zeros, NF4State):
        raise TypeError(f"{name}: scales and zeros must be int4_quantize's tensors, got an NF4State; NF4 codes go "
                        "to the NF4 ops")  # fmt: skip
    check_tensor(f"{name}: qweight", qweight, ndim=2, dtypes=(torch.uint8,))
    check_int4_group(name, group_size)
    expected = (qweight.shape[0], cdiv(2 * qweight.shape[1], group_size))
    check_tensor(f"{name}: scales", scales, ndim=2, dtypes=(torch.float32,))
    check_tensor(f"{name}: zeros", zeros, ndim=2, dtypes=(torch.uint8,))
    for arg, tensor in (("scales", scales), ("zeros", zeros)):
        if tuple(tensor.shape) != expected:
            raise ValueError(f"{name}: {arg} must have shape {expected} (N, ceil(K / group_size)) for qweight "
                             f"{tuple(qweight.shape)} and group_size {group_size}, got "
                             f"{tuple(tensor.shape)}")  # fmt: skip


@torch.compiler.disable  # traced, the tables would be host copies in the graph, which no CUDA graph captures
def _nf4_tables_untraced(device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """nf4_tables for torch code that may be compiled (the launchers call nf4_tables: this wrapper costs host time)."""
    return nf4_tables(device)


def nf4_weight(packed: torch.Tensor, *tensors: torch.Tensor, shape: tuple, blocksize: int,
               tables: tuple | None = None) -> torch.Tensor:  # fmt: skip
    """The NF4 weight in fp32, in torch from the format's definition (references and benchmark peers): ``tensors``
    the absmax, or the absmax codes, their scales and the offset (decoded in fp32, two roundings). ``tables``:
    nf4_tables(packed.device), passed by a caller that compiles this (so that the graph does not break to get them)."""
    code, _, dynamic = tables if tables is not None else _nf4_tables_untraced(packed.device)
    n = math.prod(shape)
    codes = torch.stack((packed.reshape(-1) >> 4, packed.reshape(-1) & 15), dim=-1).reshape(-1)[:n].long()
    if len(tensors) == 1:
        absmax = tensors[0].float().reshape(-1)
    else:
        nested, scales, offset = tensors
        scale = scales.float().reshape(-1).repeat_interleave(NESTED_BLOCK)[: nested.numel()]
        absmax = dynamic[nested.reshape(-1).long()] * scale + offset.float().reshape(-1)
    values = code[codes] * absmax.repeat_interleave(blocksize)[:n]
    return values.view(shape)


def int4_weight(qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, *, group_size: int) -> torch.Tensor:
    """The INT4 weight (N, K) in fp32, in torch from the format's definition: (code - zero) * scale."""
    codes = torch.stack((qweight & 15, qweight >> 4), dim=-1).flatten(-2).float()
    k = codes.shape[1]
    scale = scales.float().repeat_interleave(group_size, dim=1)[:, :k]
    zero = zeros.float().repeat_interleave(group_size, dim=1)[:, :k]
    return (codes - zero) * scale
