"""Roofline arithmetic: a time and a spec's cost model turned into GB/s, TFLOP/s and % of a ceiling."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from tritonkit.registry import KernelSpec


def gigabytes_per_second(n_bytes: int, ms: float) -> float:
    """Bytes moved over the time, in GB/s (10**9 bytes per second)."""
    return n_bytes / (ms * 1e-3) / 1e9


def teraflops_per_second(n_flops: int, ms: float) -> float:
    """Operations over the time, in TFLOP/s (10**12 per second)."""
    return n_flops / (ms * 1e-3) / 1e12


def percent_of(value: float, ceiling: float | None) -> float | None:
    return None if not ceiling else 100.0 * value / ceiling


# Dtypes whose tensor-core rate is that of one the calibration measures: it times float8 as e4m3 x e4m3 only
# (torch._scaled_mm takes no e5m2 x e5m2), and the two float8 formats run at one rate.
SAME_RATE = {"float8_e5m2": "float8_e4m3fn"}


def ceiling_dtype(spec: KernelSpec, case: Mapping, dtype: torch.dtype) -> str:
    """The name of the dtype whose matmul ceiling judges ``spec`` on ``case`` (a mapping parsed as the spec's case
    type) in ``dtype``: the operands' (``spec.operand_dtype``) where the spec gives them, else ``dtype``."""
    operand = dtype if spec.operand_dtype is None else spec.operand_dtype(spec.parse_case(case), dtype)
    name = str(operand).removeprefix("torch.")
    return SAME_RATE.get(name, name)


def is_compute_bound(spec: KernelSpec) -> bool:
    """Compute-bound specs are judged in TFLOP/s against the matmul ceiling; others in GB/s."""
    return "compute-bound" in spec.tags


@dataclass(frozen=True)
class Ceilings:
    """A device's measured ceilings: copy bandwidth (GB/s, read + written) and matmul TFLOP/s by dtype."""

    device: str
    bandwidth_gbps: float
    matmul_tflops: dict[str, float]

    def for_spec(self, spec: KernelSpec, case: Mapping, dtype: torch.dtype) -> tuple[str, float | None]:
        """(unit, ceiling) against which a spec's runs on ``case`` in ``dtype`` are judged: a compute-bound one's
        matmul ceiling in its operands' dtype (:func:`ceiling_dtype`), another's copy bandwidth."""
        if is_compute_bound(spec):
            return "TFLOP/s", self.matmul_tflops.get(ceiling_dtype(spec, case, dtype))
        return "GB/s", self.bandwidth_gbps


@dataclass(frozen=True)
class Throughput:
    gbps: float
    tflops: float | None  # None: no arithmetic model for the mode (a backward without ``flops_bwd``)
    unit: str
    percent: float | None  # of the ceiling in ``unit``; None without a ceiling or a value in that unit


def _for_mode(spec: KernelSpec, forward_model, backward_model, case: Mapping, dtype: torch.dtype,
              mode: str) -> int | None:  # fmt: skip
    """A cost model of the timed work: the forward (``fwd``, and ``fwd-train``, whose saved statistics are a
    row's few bytes), the backward, or both (None without a backward model). ``case``: the spec's case type, or a
    mapping parsed as one."""
    case = spec.parse_case(case)
    forward = forward_model(case, dtype)
    if mode in ("fwd", "fwd-train"):
        return forward
    if backward_model is None:
        return None
    backward = backward_model(case, dtype)
    return backward if mode == "bwd" else forward + backward


def bytes_for_mode(spec: KernelSpec, case: Mapping, dtype: torch.dtype, mode: str) -> int | None:
    """Fewest bytes of the timed work: the forward, the backward, or both (None without a model)."""
    return _for_mode(spec, spec.bytes_moved, spec.bytes_moved_bwd, case, dtype, mode)


def flops_for_mode(spec: KernelSpec, case: Mapping, dtype: torch.dtype, mode: str) -> int | None:
    """Arithmetic of the timed work, like :func:`bytes_for_mode` (None without a backward model)."""
    return _for_mode(spec, spec.flops, spec.flops_bwd, case, dtype, mode)


def throughput(
    spec: KernelSpec, case: Mapping, dtype: torch.dtype, ms: float, ceilings: Ceilings | None, mode: str = "fwd"
) -> Throughput | None:
    """GB/s, TFLOP/s and % of ceiling; None when the mode has no cost model. TFLOP/s of bwd and fwd+bwd
    runs need the spec's ``flops_bwd`` (None without it, and then no % for a compute-bound kernel)."""
    n_bytes = bytes_for_mode(spec, case, dtype, mode)
    if n_bytes is None:
        return None
    gbps = gigabytes_per_second(n_bytes, ms)
    n_flops = flops_for_mode(spec, case, dtype, mode)
    tflops = teraflops_per_second(n_flops, ms) if n_flops is not None else None
    if ceilings is not None:
        unit, ceiling = ceilings.for_spec(spec, case, dtype)
    else:
        unit, ceiling = ("TFLOP/s" if is_compute_bound(spec) else "GB/s"), None
    value = tflops if unit == "TFLOP/s" else gbps
    return Throughput(gbps, tflops, unit, None if value is None else percent_of(value, ceiling))


def speedup(best_baseline_ms: float | None, ms: float) -> float | None:
    """How many times faster than the best baseline (>1 is faster)."""
    return None if best_baseline_ms is None else best_baseline_ms / ms
