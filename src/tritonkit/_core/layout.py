"""Tensor layout helpers shared by the row-wise launchers (norms, softmax)."""

from __future__ import annotations

import torch


def as_rows(t: torch.Tensor | None) -> torch.Tensor | None:
    """``t`` as a (rows, N) matrix with unit column stride, N its last dimension: a view where possible.

    A last dimension that is not contiguous (a transpose, an expanded stride-0 gradient) costs one
    torch copy here.
    """
    if t is None:
        return None
    if t.stride(-1) != 1:
        t = t.contiguous()
    # Already (rows, N): the tensor itself, so that autograd records no view node (~15 µs of host per
    # call and its backward at small shapes).
    return t if t.dim() == 2 else t.reshape(-1, t.shape[-1])
