"""Validation helpers for launchers: every error names the argument, what was expected and what came."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from .env import interpreting

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _dtype_names(dtypes: Iterable[torch.dtype]) -> str:
    return ", ".join(str(d).removeprefix("torch.") for d in dtypes)


def check_tensor(name: str, value, *, ndim: int | None = None, dtypes: Iterable[torch.dtype] | None = None):
    """Check that ``value`` is a tensor, optionally of ``ndim`` dimensions and one of ``dtypes``."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if dtypes is not None:
        dtypes = tuple(dtypes)
        if value.dtype not in dtypes:
            raise TypeError(f"{name} must have dtype in ({_dtype_names(dtypes)}), got {value.dtype}")
    if ndim is not None and value.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got {value.dim()} (shape {tuple(value.shape)})")
    return value


def check_same_shape(first: str, a: torch.Tensor, second: str, b: torch.Tensor) -> None:
    if a.shape != b.shape:
        raise ValueError(f"{first} and {second} must have the same shape, got {tuple(a.shape)} and {tuple(b.shape)}")


def check_same_dtype(first: str, a: torch.Tensor, second: str, b: torch.Tensor) -> None:
    if a.dtype != b.dtype:
        raise TypeError(f"{first} and {second} must have the same dtype, got {a.dtype} and {b.dtype}")


def check_device(**tensors: torch.Tensor) -> torch.device:
    """Check that all tensors share one device on which Triton can run; return it.

    Compiled Triton needs CUDA tensors; the interpreter takes CPU tensors (and copies CUDA ones).
    """
    names = list(tensors)
    first = names[0]
    device = tensors[first].device
    for name in names[1:]:
        if tensors[name].device != device:
            raise ValueError(f"{first} and {name} must be on the same device, got {device} and {tensors[name].device}")
    if device.type != "cuda" and not interpreting():
        raise ValueError(
            f"{first} is on {device}, but compiled Triton kernels need CUDA tensors; move the inputs to a GPU "
            "or set TRITON_INTERPRET=1 before importing tritonkit to run on the CPU through the interpreter"
        )
    return device


def check_positive_int(name: str, value, *, power_of_two: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {value}")
    if power_of_two and value & (value - 1):
        raise ValueError(f"{name} must be a power of two, got {value}")
    return value


def check_choice(name: str, value, choices: Iterable) -> None:
    choices = tuple(choices)
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
