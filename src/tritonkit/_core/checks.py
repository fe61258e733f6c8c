"""Validation helpers for launchers: every error names the argument, what was expected and what came."""

from __future__ import annotations

import os
from collections.abc import Iterable

import torch

from .env import _TRUE_WORDS, kernels_interpreted

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_INTERPRETER_DEVICES = ("cpu", "cuda")  # the interpreter reads CPU memory and copies CUDA tensors to it and back


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

    Compiled Triton needs CUDA tensors; the interpreter takes CPU tensors (and copies CUDA ones). A ``meta``
    tensor has a shape but no data, so no kernel can read it: it is refused here, by name, before any launch.
    """
    names = list(tensors)
    first = names[0]
    reference = tensors[first]
    if reference.is_cuda and not kernels_interpreted():  # the common case, without making a torch.device per tensor
        index = reference.get_device()
        if all(t.is_cuda and t.get_device() == index for t in tensors.values()):
            return reference.device
    device = reference.device
    for name in names[1:]:
        if tensors[name].device != device:
            raise ValueError(f"{first} and {name} must be on the same device, got {device} and {tensors[name].device}")
    if device.type == "meta":
        raise ValueError(
            f"{first} is on the meta device, which holds shapes but no data, so no kernel can run on it; "
            "tritonkit's ops need CUDA tensors (or CPU tensors under TRITON_INTERPRET=1)"
        )
    if kernels_interpreted():
        if device.type not in _INTERPRETER_DEVICES:
            raise ValueError(
                f"{first} is on {device}, but the Triton interpreter runs kernels on CPU tensors (and CUDA ones); "
                "move the inputs to the CPU"
            )
    elif device.type != "cuda":
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


def overlaps_in_memory(t: torch.Tensor) -> bool:
    """Whether two elements of ``t`` may share one address: a dimension of stride 0 and size > 1 (an expanded
    tensor), or strides too small for the dimensions inside them (rows closer than their length).

    Conservative: dimensions sorted by stride, each stride must exceed the span of the smaller ones. Every layout
    torch's views make without overlap passes (contiguous, permuted, sliced with gaps); an interleaving that the
    rule cannot prove free of overlap counts as overlapping.
    """
    span = 0  # the farthest element offset reached by the dimensions seen so far
    for size, stride in sorted(((s, abs(st)) for s, st in zip(t.shape, t.stride(), strict=True) if s > 1),
                               key=lambda dim: dim[1]):  # fmt: skip
        if stride <= span:
            return True
        span += (size - 1) * stride
    return False


def debug_checks(name: str, requested: bool | None) -> bool:
    """Whether to run the checks that synchronise with the host (reading device values, such as targets' range):
    ``requested`` when a bool, else the environment variable ``TRITONKIT_DEBUG`` (1/true/on/yes), read per call.
    Off by default: a host synchronisation stalls the CPU until the GPU catches up and breaks CUDA graph capture.
    ``name`` is the argument that carried ``requested``, for the error when it is not a bool or None."""
    if requested is None:
        return os.environ.get("TRITONKIT_DEBUG", "0").strip().lower() in _TRUE_WORDS
    if not isinstance(requested, bool):
        raise TypeError(f"{name} must be a bool or None, got {type(requested).__name__}")
    return requested
