"""The registry of kernel specs: the one list that tests, ``tritonkit check``, benchmarks and the index read.

Each kernel family registers a :class:`KernelSpec` next to its code. Nothing else keeps a list of ops:
:func:`all_specs` imports every module of :mod:`tritonkit.ops` and returns what they registered.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

Case = Mapping[str, Any]
"""One shape/flag combination, e.g. ``{"n": 4097, "block_size": 128}``."""


@dataclass(frozen=True)
class Inputs:
    """Arguments for one call: ``spec.fn(*args, **kwargs)`` and ``spec.reference(*args64, **kwargs)``."""

    args: tuple
    kwargs: dict = field(default_factory=dict)
    # Floating tensor arguments that stay constant, as a frozen weight under LoRA: no gradient is
    # required, compared or timed for them. Positions (int) of positional arguments, names (str) of
    # keyword arguments.
    frozen: frozenset = frozenset()

    def named(self) -> list[tuple[int | str, Any]]:
        """(position or keyword, value) for every argument."""
        return [*enumerate(self.args), *self.kwargs.items()]

    def trainable(self) -> list[tuple[int | str, torch.Tensor]]:
        """(position or keyword, tensor) for every floating tensor argument that is not frozen."""
        return [
            (key, value)
            for key, value in self.named()
            if isinstance(value, torch.Tensor) and value.is_floating_point() and key not in self.frozen
        ]


@dataclass(frozen=True)
class Tolerance:
    """Element ``i`` passes when ``|out_i - ref_i| <= atol + rtol * |ref_i| + rms_atol * rms(ref)``.

    ``rms_atol`` is for long sums (GEMM outputs, weight gradients): their rounding error grows with
    the size of the terms and partial sums, not of the result, so an element that cancels to near zero
    carries an absolute error set by the output's typical size, rms(ref). Zero by default.
    """

    atol: float
    rtol: float
    rms_atol: float = 0.0


@dataclass(frozen=True)
class KernelSpec:
    """Everything the toolkit needs to know about one public op.

    ``make_inputs(case, device, dtype, generator)`` draws fresh random inputs for a case;
    ``reference`` is pure torch and receives floating inputs upcast to float64; ``bytes_moved`` and
    ``flops`` are the cost model (the fewest bytes a kernel must move, the arithmetic it must do) that
    turn a time into GB/s and TFLOP/s. ``test_cases`` are small enough for the interpreter,
    ``gpu_cases`` are checked compiled, ``bench_cases`` are for benchmarks. ``tolerance`` may override
    the per-dtype table of :mod:`tritonkit.testing` for a case.
    """

    name: str
    family: str
    summary: str
    fn: Callable
    reference: Callable
    make_inputs: Callable[[Case, torch.device, torch.dtype, torch.Generator], Inputs]
    test_cases: Sequence[Case]
    gpu_cases: Sequence[Case]
    bench_cases: Sequence[Case]
    bytes_moved: Callable[[Case, torch.dtype], int]
    flops: Callable[[Case, torch.dtype], int]
    dtypes: tuple[torch.dtype, ...]
    description: str = ""
    usage: str = ""
    tags: tuple[str, ...] = ()
    limits: str = ""
    notes: str = ""
    min_triton: str = "3.2"
    status: str = "stable"
    has_backward: bool = False
    tolerance: Callable[[Case, torch.dtype], Tolerance | None] | None = None
    bytes_moved_bwd: Callable[[Case, torch.dtype], int] | None = None
    # The backward's arithmetic, for compute-bound kernels (TFLOP/s of bwd and fwd+bwd runs); None
    # leaves those runs reported in GB/s only.
    flops_bwd: Callable[[Case, torch.dtype], int] | None = None
    # Peer implementations for benchmarks: peer name (a key of tritonkit.bench.providers.PEERS) ->
    # a factory that imports the peer and returns a callable taking this spec's arguments.
    peers: Mapping[str, Callable[[], Callable]] = field(default_factory=dict)

    def case_id(self, case: Case) -> str:
        return "-".join(f"{key}{value}" for key, value in case.items()) or "default"

    def missing(self) -> list[str]:
        """What this spec lacks that every registered op must have (read by the meta-test)."""
        problems = []
        if not callable(self.reference):
            problems.append("no reference")
        if not self.test_cases:
            problems.append("no test cases")
        if not self.gpu_cases:
            problems.append("no GPU cases")
        if not self.bench_cases:
            problems.append("no benchmark cases")
        if not (callable(self.bytes_moved) and callable(self.flops)):
            problems.append("no cost model")
        if not self.dtypes:
            problems.append("no dtypes")
        if self.has_backward and not callable(self.bytes_moved_bwd):
            problems.append("no backward cost model")
        if not self.usage:
            problems.append("no usage example")
        return problems


_REGISTRY: dict[str, KernelSpec] = {}
_STATUSES = ("stable", "experimental")
_RESERVED_NAMES = ("calibrate",)  # `tritonkit bench calibrate` is a command, never a kernel


def register(spec: KernelSpec) -> KernelSpec:
    if spec.name in _RESERVED_NAMES:
        raise ValueError(f"{spec.name!r} is reserved for a tritonkit command and cannot name a kernel")
    if spec.name in _REGISTRY:
        raise ValueError(f"a kernel named {spec.name!r} is already registered")
    if spec.status not in _STATUSES:
        raise ValueError(f"spec {spec.name!r}: status must be one of {_STATUSES}, got {spec.status!r}")
    _REGISTRY[spec.name] = spec
    return spec


def _load_ops() -> None:
    import tritonkit.ops as ops_package

    for module in pkgutil.iter_modules(ops_package.__path__):
        importlib.import_module(f"{ops_package.__name__}.{module.name}")


def all_specs() -> list[KernelSpec]:
    """Every registered spec, in name order."""
    _load_ops()
    return [_REGISTRY[name] for name in sorted(_REGISTRY)]


def get(name: str) -> KernelSpec:
    _load_ops()
    try:
        return _REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY))
        raise KeyError(f"no kernel named {name!r}; registered: {known}") from None


def select(names: Sequence[str] = (), tag: str | None = None) -> list[KernelSpec]:
    """Specs by name (all when empty), keeping those tagged ``tag`` when given."""
    specs = [get(name) for name in names] if names else all_specs()
    if tag is not None:
        specs = [spec for spec in specs if tag in spec.tags or spec.family == tag]
    return specs
