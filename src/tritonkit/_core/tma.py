"""Tensor descriptors (TMA, Hopper and newer) on the host: which tensors one can address, and making them."""

from __future__ import annotations

import torch

from tritonkit._core.device import arch_number

TMA_ALIGNMENT = 16  # bytes: a tensor descriptor's row strides and base address must be multiples of it


def has_tma(arch: str) -> bool:
    """Whether GPUs of ``arch`` ("sm90") have the tensor memory accelerator: Hopper (sm90) and newer."""
    return arch_number(arch) >= 90


def tma_readable(t: torch.Tensor) -> bool:
    """Whether a tensor descriptor can address ``t`` (1 to 5 dimensions, none empty): a unit last stride, every
    other stride a positive multiple of 16 bytes (an expanded dimension, stride 0, is not), a 16-byte aligned base."""
    return (t.dim() <= 5 and t.stride(-1) == 1 and t.data_ptr() % TMA_ALIGNMENT == 0 and t.numel() > 0
            and all(s > 0 and (s * t.element_size()) % TMA_ALIGNMENT == 0 for s in t.stride()[:-1]))  # fmt: skip


def descriptor(t: torch.Tensor, block: list[int]):
    """A host tensor descriptor of ``t`` (its own shape and strides) read or written in ``block``-shaped tiles (TMA
    fills the ragged edges' reads with zeros and clips their writes)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    return TensorDescriptor.from_tensor(t, block)
