"""The choice every differentiable op makes per call: which of its three equivalent paths to take."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch


def cheapest_path(custom_op: Callable, function: type[torch.autograd.Function], launcher: Callable,
                  differentiable: Iterable[torch.Tensor | None]) -> Callable:  # fmt: skip
    """The op's custom op while torch.compile traces (no graph break); its ``autograd.Function`` when
    one of ``differentiable`` needs a gradient; otherwise the bare launcher. All three take the same
    arguments and return the outputs the op returns (the launcher may leave out what only a backward
    reads: the norms' statistics). In eager mode a custom-op call costs ~45 µs more on the
    H200's host than the Function (benchmarks/host_overhead.py), and the Function more than the launcher.
    """
    if torch.compiler.is_compiling():
        return custom_op
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in differentiable):
        return function.apply
    return launcher
