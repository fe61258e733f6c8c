"""Activation launchers: validate the public arguments, allocate, launch (tensors in, tensors out; ``plan=``)."""

from __future__ import annotations

import torch

from tritonkit._core.checks import FLOAT_DTYPES, check_choice, check_device, check_tensor
from tritonkit._core.device import arch
from tritonkit._core.elementwise import ElementwisePlan, launch_elementwise
from tritonkit.ops.activation.kernels import (
    GELU_ERF,
    GELU_TANH,
    _activation_bwd_kernel,
    _activation_fwd_kernel,
    _gated_bwd_kernel,
    _gated_fwd_kernel,
)
from tritonkit.ops.activation.plan import activation_plan

GELU_APPROXIMATIONS = {"none": GELU_ERF, "tanh": GELU_TANH}  # torch's approximate= names -> the ACT switch


def check_activation_args(x) -> None:
    check_tensor("x", x, dtypes=FLOAT_DTYPES)
    check_device(x=x)


def check_gated_args(name: str, gate, up) -> None:
    check_tensor("gate", gate, dtypes=FLOAT_DTYPES)
    check_tensor("up", up, dtypes=FLOAT_DTYPES)
    if gate.shape != up.shape:
        raise ValueError(f"{name}: gate and up must have the same shape, got {tuple(gate.shape)} and {tuple(up.shape)}")
    if gate.dtype != up.dtype:
        raise TypeError(f"{name}: gate and up must have the same dtype, got {gate.dtype} and {up.dtype}")
    check_device(gate=gate, up=up)


def gelu_act(approximate) -> int:
    """The ACT switch for torch's ``approximate`` argument ("none" or "tanh")."""
    check_choice("approximate", approximate, tuple(GELU_APPROXIMATIONS))
    return GELU_APPROXIMATIONS[approximate]


def activation_fwd(x: torch.Tensor, act: int, *, plan: ElementwisePlan | None = None) -> torch.Tensor:
    """y = f(x), x's shape, dtype and dense layout."""
    return launch_elementwise(_activation_fwd_kernel, [x], x.dtype, plan or activation_plan(arch(x.device)), ACT=act)


def activation_bwd(dy: torch.Tensor, x: torch.Tensor, act: int, *,
                   plan: ElementwisePlan | None = None) -> torch.Tensor:  # fmt: skip
    """dx = dy * f'(x)."""
    return launch_elementwise(_activation_bwd_kernel, [dy, x], x.dtype, plan or activation_plan(arch(x.device)),
                              ACT=act)  # fmt: skip


def activation_fake(x, *args):
    return torch.empty_like(x, memory_format=torch.preserve_format)


def gated_fwd(gate: torch.Tensor, up: torch.Tensor, act: int, *, plan: ElementwisePlan | None = None) -> torch.Tensor:
    """y = f(gate) * up."""
    return launch_elementwise(_gated_fwd_kernel, [gate, up], gate.dtype, plan or activation_plan(arch(gate.device)),
                              ACT=act)  # fmt: skip


def gated_fwd_fake(gate, up, act):
    return torch.empty_like(gate, memory_format=torch.preserve_format)


def gated_bwd(dy: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, act: int, *,
              plan: ElementwisePlan | None = None) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """(dgate, dup) = (dy * up * f'(gate), dy * f(gate))."""
    return launch_elementwise(_gated_bwd_kernel, [dy, gate, up], gate.dtype,
                              plan or activation_plan(arch(gate.device)), n_outputs=2, ACT=act)  # fmt: skip


def gated_bwd_fake(dy, gate, up, act):
    like = torch.empty_like(gate, memory_format=torch.preserve_format)
    return like, torch.empty_like(like)
