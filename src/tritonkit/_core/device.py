"""Cached device facts, so launchers make no device query per call."""

from __future__ import annotations

import functools

import torch

from tritonkit._core.env import interpreting

_INTERPRETER_PROGRAMS = 4  # under the interpreter programs run one by one: a few are plenty


@functools.cache
def _cuda_sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device: torch.device) -> int:
    """Multiprocessors of ``device`` (a small stand-in under the interpreter)."""
    if interpreting() or device.type != "cuda":
        return _INTERPRETER_PROGRAMS
    return _cuda_sm_count(device.index if device.index is not None else torch.cuda.current_device())
