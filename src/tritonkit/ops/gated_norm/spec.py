"""rms_norm_gated in the registry (family norm): float64 reference, typed cases, cost model."""

import functools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tritonkit._core.checks import FLOAT_DTYPES
from tritonkit.ops.gated_norm.op import rms_norm_gated
from tritonkit.registry import Case, Inputs, KernelSpec, Tolerance, register


@dataclass(frozen=True)
class GatedNormCase(Case):
    rows: int
    n: int  # the last dimension, split into groups of group_size
    group_size: int | None = None  # None: one group
    z: bool = True
    norm_before_gate: bool = True
    lead: tuple[int, ...] | None = None  # x's leading shape (None: (rows,))
    transposed: bool = False  # x's last dimension strided
    scale: float = 1.0  # x's standard deviation (1e-3: a variance near eps)
    eps: float = 1e-6
    weight_fp32: bool = False  # an fp32 weight with 16-bit x and z, as mamba2 keeps its norm's weight


def _lead(case: GatedNormCase) -> tuple[int, ...]:
    return case.lead if case.lead is not None else (case.rows,)


def _rms_norm_gated_reference(x, weight, z=None, *, group_size=None, norm_before_gate=True, eps=1e-6):
    """mamba_ssm's rms_norm_ref without a bias: the gate silu(z) after the norm or on its input, the norm over groups
    of group_size columns."""
    if z is not None and not norm_before_gate:
        x = x * F.silu(z)
    groups = x.unflatten(-1, (-1, group_size or x.shape[-1]))
    y = (groups * torch.rsqrt(groups.pow(2).mean(-1, keepdim=True) + eps)).flatten(-2) * weight
    return y * F.silu(z) if z is not None and norm_before_gate else y


def _inputs(case: GatedNormCase, device, dtype, generator):
    lead, n = _lead(case), case.n

    def randn(*shape, scale=1.0):
        return (scale * torch.randn(shape, device=device, generator=generator, dtype=torch.float32)).to(dtype)

    x = randn(n, *lead, scale=case.scale).movedim(0, -1) if case.transposed else randn(*lead, n, scale=case.scale)
    weight = 1.0 + 0.1 * torch.randn(n, device=device, generator=generator)
    weight = weight if case.weight_fp32 else weight.to(dtype)
    z = 2.0 * randn(*x.shape) if case.z else None  # scale 2: both tails of silu matter
    return Inputs((x, weight, z), {"group_size": case.group_size, "norm_before_gate": case.norm_before_gate,
                                   "eps": case.eps})  # fmt: skip


def _bytes(case, dtype, backward=False):
    """Fewest bytes moved. Forward: x (and z) in, y out; backward: x (and z) and dy in, dx (and dz) out. The
    weight once."""
    elements = math.prod(_lead(case)) * case.n
    tensors = (3 + 2 * case.z) if backward else (2 + case.z)
    return tensors * elements * dtype.itemsize + case.n * dtype.itemsize


def _tolerance(case, dtype):
    """fp32 gradients at 1e-4, as the norms': dh = rstd * (g - xhat * mean(g * xhat)) cancels and rstd scales the
    remainder."""
    return Tolerance(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else None


_TESTS = (
    {"rows": 5, "n": 40},
    {"rows": 6, "n": 64, "group_size": 16, "norm_before_gate": False},
    {"rows": 6, "n": 48, "group_size": 12, "z": False},
    {"rows": 3, "n": 7, "norm_before_gate": False},
    {"rows": 0, "n": 16, "group_size": 4},
    {"rows": 6, "n": 32, "lead": (2, 3), "transposed": True, "group_size": 8, "weight_fp32": True},
    {"rows": 40, "n": 1024, "group_size": 256, "norm_before_gate": False},  # row groups' partial sums
    {"rows": 9, "n": 64, "group_size": 32, "scale": 1e-3, "eps": 1e-5},  # variance near eps: a wrong eps shows
)
_GPU = (
    {"rows": 4096, "n": 4096, "group_size": 512, "norm_before_gate": False, "weight_fp32": True},
    {"rows": 2048, "n": 8192},
    {"rows": 1000, "n": 16384, "norm_before_gate": False},
    {"rows": 333, "n": 3000, "group_size": 1000, "z": False},
)
# mamba2's shapes: d_inner 4096 or 8192 (d_model 2048, 4096), ngroups 1 and 8, its gate before the norm
_BENCH = (
    {"rows": 16384, "n": 4096, "norm_before_gate": False, "weight_fp32": True},
    {"rows": 16384, "n": 4096, "group_size": 512, "norm_before_gate": False, "weight_fp32": True},
    {"rows": 16384, "n": 8192, "group_size": 1024, "norm_before_gate": False, "weight_fp32": True},
)

register(KernelSpec(
    name="rms_norm_gated",
    family="norm",
    sweep="n",
    case_type=GatedNormCase,
    summary="Gated RMSNorm over groups (mamba2's RMSNormGated), forward and backward.",
    description="y = rmsnorm(x) * weight * silu(z), or rmsnorm(x * silu(z)) * weight with norm_before_gate=False; "
                "group_size normalises groups of the last dimension on their own. Whole groups in registers; "
                "fp32 statistics; deterministic fp32 dweight.",
    usage="y = tk.ops.rms_norm_gated(x, weight, z, group_size=512, norm_before_gate=False)",
    tags=("norm", "fused", "memory-bound", "backward"),
    limits="Normalises groups of the last dimension, at most 16384 columns each; no bias.",
    fn=rms_norm_gated,
    reference=_rms_norm_gated_reference,
    make_inputs=_inputs,
    test_cases=_TESTS,
    gpu_cases=_GPU,
    bench_cases=_BENCH,
    bytes_moved=_bytes,
    bytes_moved_bwd=functools.partial(_bytes, backward=True),
    flops=lambda case, dtype: 8 * math.prod(_lead(case)) * case.n,
    dtypes=FLOAT_DTYPES,
    has_backward=True,
    tolerance=_tolerance,
    status="experimental",
))  # fmt: skip
