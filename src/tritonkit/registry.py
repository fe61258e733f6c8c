"""The registry of kernel specs: the one list that tests, ``tritonkit check``, benchmarks and the index read.

A leaf: it imports no other tritonkit module. Each family's ``spec.py`` registers its :class:`KernelSpec` here;
:mod:`tritonkit.catalog` imports the families and reads what they registered.

Here too: :class:`Case`, the base of every family's typed case (an unknown or misspelt key raises); the
:class:`Inputs` of one call; :class:`Tolerance` and :data:`TOLERANCES`, the one per-dtype tolerance table.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch


class Case(Mapping):
    """One shape/flag combination of a kernel, e.g. ``SoftmaxCase(rows=5, n=7)``.

    Each family subclasses it as a frozen dataclass whose fields are the case's keys, with types and defaults:
    family code reads attributes (``case.rows``), and a misspelt key fails where the case is made
    (:meth:`parse`), never silently dropping coverage. As a mapping it holds the keys the case was given (or,
    made directly, the fields that differ from their defaults), in order: what case ids, reports and
    ``--case`` show. ``case["rows"]`` reads any field.
    """

    _given: ClassVar[tuple[str, ...] | None] = None  # set per instance by parse()

    @classmethod
    def parse(cls, values: Mapping[str, Any] | Case, where: str = "") -> Case:
        """A case of this type from ``values``: a ValueError names an unknown key (with the known ones), a
        missing required key, or a value of the wrong type. ``where`` prefixes the message (the kernel)."""
        if isinstance(values, cls):
            return values
        if isinstance(values, Case):
            values = dict(values)
        known = [f.name for f in dataclasses.fields(cls)]
        unknown = [key for key in values if key not in known]
        if unknown:
            raise ValueError(f"{where}unknown case key(s) {', '.join(map(repr, unknown))} for {cls.__name__}; "
                             f"its keys are {', '.join(known)}")  # fmt: skip
        required = [f.name for f in dataclasses.fields(cls) if _required(f)]
        missing = [key for key in required if key not in values]
        if missing:
            raise ValueError(f"{where}{cls.__name__} needs {', '.join(map(repr, missing))}, got {dict(values)}")
        hints = typing.get_type_hints(cls)
        for key, value in values.items():
            if not _matches(value, hints[key]):
                raise ValueError(f"{where}case key {key!r} of {cls.__name__} must be {_type_name(hints[key])}, "
                                 f"got {value!r}")  # fmt: skip
        case = cls(**values)
        object.__setattr__(case, "_given", tuple(values))
        return case

    def _keys(self) -> tuple[str, ...]:
        if self._given is not None:
            return self._given
        return tuple(f.name for f in dataclasses.fields(self) if _required(f) or getattr(self, f.name) != f.default)

    def __getitem__(self, key: str) -> Any:
        if key not in {f.name for f in dataclasses.fields(self)}:
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys())

    def __len__(self) -> int:
        return len(self._keys())

    def __contains__(self, key) -> bool:
        return key in self._keys()


def _required(f: dataclasses.Field) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


def _type_name(hint) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


def _matches(value, hint) -> bool:
    """Whether ``value`` fits a case field's annotation: int (not bool), float (int too), bool, str, tuples of
    those, unions with None."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, arm) for arm in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if origin is tuple:
        args = typing.get_args(hint)
        if not isinstance(value, tuple):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(_matches(item, args[0]) for item in value)
        return len(args) == len(value) and all(_matches(v, a) for v, a in zip(value, args, strict=True))
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is typing.Any:
        return True
    return isinstance(value, hint)


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


# One table for the whole library. A correctly rounded result in a dtype is within half an ulp of the
# exact value, a relative error of 2**-24 (float32), 2**-11 (float16) or 2**-8 (bfloat16); the bounds
# leave room for a few roundings of fp32 intermediate arithmetic and nothing more, so a wrong
# constant, a dropped term or a skipped element fails. Integer outputs must match exactly.
TOLERANCES: dict[torch.dtype, Tolerance] = {
    torch.float32: Tolerance(atol=1e-5, rtol=1e-5),
    torch.float16: Tolerance(atol=1e-3, rtol=2e-3),
    torch.bfloat16: Tolerance(atol=8e-3, rtol=8e-3),
    torch.uint8: Tolerance(atol=0, rtol=0),
}


@dataclass(frozen=True)
class KernelSpec:
    """Everything the toolkit needs to know about one public op.

    ``make_inputs(case, device, dtype, generator)`` draws fresh random inputs for a case;
    ``reference`` is pure torch and receives floating inputs upcast to float64; ``bytes_moved`` and
    ``flops`` are the cost model (the fewest bytes a kernel must move, the arithmetic it must do) that
    turn a time into GB/s and TFLOP/s. ``test_cases`` are small enough for the interpreter,
    ``gpu_cases`` are checked compiled, ``bench_cases`` are for benchmarks; each is given as a mapping or a
    ``case_type`` and stored as a ``case_type`` (checked here: an unknown key raises). ``tolerance`` may
    override the per-dtype table :data:`TOLERANCES` for a case.
    """

    name: str
    family: str
    summary: str
    fn: Callable
    reference: Callable
    make_inputs: Callable[[Case, torch.device, torch.dtype, torch.Generator], Inputs]
    case_type: type[Case]
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
    min_triton: str = "3.6"  # the oldest Triton the package allows (pyproject.toml)
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
    # The swept axis: the case key that varies across the bench cases ("n" for the norms, "shape" for the
    # activations). Benchmark plots put it on x, one line per provider for each setting of the other keys.
    sweep: str = ""
    # Public ops the spec checks through ``fn`` when ``fn`` is not the op itself: an in-place op read back after
    # its call (kv_cache_append), or a pair checked as a round trip (quantize_kv, dequantize_kv).
    covers: tuple[Callable, ...] = ()
    # What benchmarks time as tritonkit's provider when ``fn`` does more than the op (an in-place op checked on
    # copies of its buffers and read back): a callable taking the same arguments. None: ``fn``.
    timed: Callable | None = None
    # Compute-bound kernels whose products run in another dtype than the checked one (int8 or float8 codes with a
    # bf16 output): the operands' dtype for a case and checked dtype, whose matmul ceiling judges the case (8-bit
    # tensor cores run at twice bf16's rate). None: the checked dtype.
    operand_dtype: Callable[[Case, torch.dtype], torch.dtype] | None = None

    def __post_init__(self) -> None:
        for group in ("test_cases", "gpu_cases", "bench_cases"):
            parsed = tuple(self.parse_case(case) for case in getattr(self, group))
            object.__setattr__(self, group, parsed)

    def parse_case(self, values: Mapping[str, Any]) -> Case:
        """``values`` as this kernel's case type; a ValueError names an unknown or missing key."""
        return self.case_type.parse(values, where=f"{self.name}: ")

    def case_id(self, case: Mapping[str, Any]) -> str:
        return "-".join(f"{key}{value}" for key, value in case.items()) or "default"

    def tolerance_for(self, case: Mapping[str, Any], dtype: torch.dtype) -> Tolerance:
        """The spec's own tolerance for this case when it sets one, else the table's entry for the dtype."""
        if self.tolerance is not None:
            specific = self.tolerance(self.parse_case(case), dtype)
            if specific is not None:
                return specific
        return TOLERANCES[dtype]

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


def registered() -> dict[str, KernelSpec]:
    """What has been registered so far (:func:`tritonkit.catalog.all_specs` imports every family first)."""
    return dict(_REGISTRY)
