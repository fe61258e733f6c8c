"""4-bit weights from other libraries' checkpoints, in tritonkit's INT4 layout (tk.ops.int4_quantize's).

tritonkit's layout for a weight (N, K) (F.linear's): codes uint8 (N, K / 2), two along K a byte (the even column in
the low nibble); scales fp32 and zero points uint8, (N, ceil(K / G)); w = (code - zero) * scale.

- AWQ (AutoAWQ's GEMM layout): ``qweight`` int32 (K, N / 8) and ``qzeros`` int32 (K / G, N / 8), eight codes an
  int32 along N, nibble i holding column 8c + [0, 2, 4, 6, 1, 3, 5, 7][i]; ``scales`` fp16 (K / G, N).
- GPTQ (AutoGPTQ's layout): ``qweight`` int32 (K / 8, N), eight codes an int32 along K, nibble i holding row 8r + i;
  ``qzeros`` int32 (K / G, N / 8) along N in plain order, each stored one below the zero point (``zero_offset=1``, the
  original format; 0 for checkpoints that store the zero point itself); ``scales`` fp16 (K / G, N); ``g_idx`` (K,)
  maps each input feature to its group, and only the plain order k // G is taken (act-order checkpoints permute it).

Conversions are torch code, run once when a checkpoint loads; they read no values back to the host.
"""

from __future__ import annotations

import torch

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # the column each nibble of an AWQ int32 holds, within its eight


def _nibbles(packed: torch.Tensor) -> torch.Tensor:
    """(..., 8) the eight 4-bit values of each int32, nibble 0 (lowest bits) first."""
    shifts = torch.arange(0, 32, 4, device=packed.device, dtype=torch.int32)
    return (packed.to(torch.int32)[..., None] >> shifts) & 15


def _unpack_columns(packed: torch.Tensor, order: tuple) -> torch.Tensor:
    """(R, C * 8) values of int32 (R, C) holding eight columns each, nibble i holding column 8c + order[i]."""
    nibbles = _nibbles(packed)  # (R, C, 8), nibble i
    columns = torch.empty_like(nibbles)
    columns[..., list(order)] = nibbles  # column order[i] takes nibble i
    return columns.flatten(-2)


def _pack_pairs(values: torch.Tensor) -> torch.Tensor:
    """(N, K) codes 0..15 as uint8 (N, K / 2), the even column in the low nibble."""
    values = values.to(torch.uint8)
    return values[:, 0::2] | (values[:, 1::2] << 4)


def _check(name: str, arg: str, tensor, dtype: torch.dtype, ndim: int) -> None:
    if not isinstance(tensor, torch.Tensor) or tensor.dtype != dtype or tensor.dim() != ndim:
        raise TypeError(f"{name}: {arg} must be a {ndim}-D {dtype} tensor, got "
                        f"{getattr(tensor, 'dtype', type(tensor).__name__)} of shape "
                        f"{tuple(getattr(tensor, 'shape', ()))}")  # fmt: skip


def int4_from_awq(
    qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, *, group_size: int = 128
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """An AWQ layer's tensors as tritonkit's (qweight, scales, zeros) (see the module docstring)."""
    name = "int4_from_awq"
    for arg, tensor, dtype in (("qweight", qweight, torch.int32), ("qzeros", qzeros, torch.int32)):
        _check(name, arg, tensor, dtype, 2)
    k, n = qweight.shape[0], qweight.shape[1] * 8
    groups = -(-k // group_size)
    if qzeros.shape != (groups, n // 8) or scales.shape != (groups, n):
        raise ValueError(f"{name}: for qweight {tuple(qweight.shape)} and group_size {group_size}, qzeros must be "
                         f"{(groups, n // 8)} and scales {(groups, n)}, got {tuple(qzeros.shape)} and "
                         f"{tuple(scales.shape)}")  # fmt: skip
    codes = _unpack_columns(qweight, AWQ_ORDER).T  # (N, K)
    zeros = _unpack_columns(qzeros, AWQ_ORDER).T.to(torch.uint8)  # (N, groups)
    return _pack_pairs(codes), scales.T.float().contiguous(), zeros.contiguous()


def int4_from_gptq(
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    g_idx: torch.Tensor | None = None,
    *,
    group_size: int = 128,
    zero_offset: int = 1,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A GPTQ layer's tensors as tritonkit's (qweight, scales, zeros) (see the module docstring). ``g_idx`` is checked
    to be the plain order k // group_size (reading it synchronises with the GPU: it is a load-time check)."""
    name = "int4_from_gptq"
    for arg, tensor in (("qweight", qweight), ("qzeros", qzeros)):
        _check(name, arg, tensor, torch.int32, 2)
    k, n = qweight.shape[0] * 8, qweight.shape[1]
    groups = -(-k // group_size)
    if qzeros.shape != (groups, n // 8) or scales.shape != (groups, n):
        raise ValueError(f"{name}: for qweight {tuple(qweight.shape)} and group_size {group_size}, qzeros must be "
                         f"{(groups, n // 8)} and scales {(groups, n)}, got {tuple(qzeros.shape)} and "
                         f"{tuple(scales.shape)}")  # fmt: skip
    if g_idx is not None:
        plain = torch.arange(k, device=g_idx.device) // group_size
        if g_idx.shape != (k,) or not bool(torch.equal(g_idx.to(plain.dtype), plain)):
            raise ValueError(f"{name}: g_idx is not the plain order k // {group_size} (an act-order checkpoint); "
                             "only the plain order is supported")  # fmt: skip
    codes = _nibbles(qweight).permute(0, 2, 1).reshape(k, n).T  # row 8r + i from nibble i of row r
    # The original format stored zero - 1 in 4 bits, so a zero point of 0 reads back as 15: the sum wraps to 0.
    zeros = ((_unpack_columns(qzeros, tuple(range(8))) + zero_offset) & 15).T.to(torch.uint8)
    return _pack_pairs(codes), scales.T.float().contiguous(), zeros.contiguous()
