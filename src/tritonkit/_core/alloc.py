"""Output allocation shared by every launcher, with optional poisoning for tests.

Tests and ``tritonkit check`` fill fresh outputs with NaN (or the largest value of an integer dtype)
so that an element a kernel forgot to write cannot pass by matching leftover memory.
"""

from __future__ import annotations

import contextlib
import contextvars

import torch

_POISON = contextvars.ContextVar("tritonkit_poison_outputs", default=False)


def poison_value(dtype: torch.dtype):
    if dtype.is_floating_point:
        return float("nan")
    if dtype == torch.bool:
        return True
    return torch.iinfo(dtype).max


def empty(shape, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``torch.empty``, filled with a poison value while :func:`poisoned_outputs` is active."""
    out = torch.empty(shape, dtype=dtype, device=device)
    if _POISON.get():
        out.fill_(poison_value(dtype))
    return out


def empty_like(t: torch.Tensor, *, dtype: torch.dtype) -> torch.Tensor:
    """``torch.empty_like`` keeping ``t``'s dense layout, poisoned like :func:`empty`."""
    out = torch.empty_like(t, dtype=dtype, memory_format=torch.preserve_format)
    if _POISON.get():
        out.fill_(poison_value(dtype))
    return out


@contextlib.contextmanager
def poisoned_outputs(enabled: bool = True):
    token = _POISON.set(enabled)
    try:
        yield
    finally:
        _POISON.reset(token)
