"""Watching a learner's launches: which kernel launches ran (:class:`LaunchRecorder`), and under the interpreter
every load, store and atomic by program (:class:`MemoryTrace`), for the checker to name mistakes from."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from tritonkit._core.env import interpreting


@dataclass
class Launch:
    grid: tuple
    args: dict  # kernel argument name -> value


class LaunchRecorder:
    """Replace the module's kernel by a stand-in that records each launch and then runs the kernel.

    The learner's launcher looks the kernel up among its module's globals at call time, so it
    launches the stand-in. After each launch the output is copied, to see whether the launcher
    changes it afterwards.
    """

    def __init__(self, module, kernel_name: str, trace: MemoryTrace | None):
        self.module, self.kernel_name, self.trace = module, kernel_name, trace
        self.kernel = getattr(module, kernel_name, None)
        if self.kernel is None:
            raise AttributeError(f"the file defines no function named {kernel_name}")
        self.launches: list[Launch] = []
        self.out: torch.Tensor | None = None
        self.after_last_launch: torch.Tensor | None = None

    def __enter__(self):
        setattr(self.module, self.kernel_name, self)
        return self

    def __exit__(self, *exc):
        setattr(self.module, self.kernel_name, self.kernel)

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            names = _arg_names(self.kernel)
            named = dict(zip(names, args, strict=False)) | kwargs
            resolved = grid(named) if callable(grid) else grid
            resolved = tuple(resolved) if isinstance(resolved, (tuple, list)) else (resolved,)
            self.launches.append(Launch(resolved, named))
            if self.trace is not None:
                self.trace.start_launch(named, self.out)
            try:
                return self.kernel[grid](*args, **kwargs)
            finally:
                if self.out is not None:
                    self.after_last_launch = self.out.clone()

        return launch

    def __getattr__(self, name):  # anything else (.fn, .arg_names, .run) goes to the real kernel
        return getattr(self.kernel, name)


def _arg_names(kernel) -> list[str]:
    names = getattr(kernel, "arg_names", None)
    if names is None and hasattr(kernel, "fn"):  # an Autotuner or Heuristics wraps the JITFunction
        return _arg_names(kernel.fn)
    return list(names or [])


class WildAccessError(RuntimeError):
    """An access outside every tensor of the launch, stopped before it could crash the process."""


@dataclass
class _Region:
    name: str
    start: int  # address of element 0
    numel: int  # elements from the first to the last one the strides reach
    lo: int  # the allocation holding it (the guard's padded buffer): accesses there are safe
    hi: int
    item: int


@dataclass
class Access:
    kind: str  # "load", "store" or "atomic"
    pid: tuple[int, int, int]
    tensor: str
    offsets: np.ndarray  # element offsets of the active lanes from the tensor's element 0
    numel: int
    first_attempt: int | None = None  # stores to the output: lowest offset of any lane, masked or not


class MemoryTrace:
    """Under the interpreter, record each load, store and atomic of a launch, per program.

    It wraps the interpreter's builder (``create_masked_load``/``_store``/``create_atomic_rmw``); when
    a Triton release renames those, :meth:`available` is False and the checker works without it.
    """

    _METHODS = ("create_masked_load", "create_masked_store", "create_atomic_rmw")

    def __init__(self):
        from triton.runtime import interpreter

        self.builder = interpreter.interpreter_builder
        self.regions: list[_Region] = []
        self.accesses: list[Access] = []
        self.out_region: _Region | None = None
        self.out_name: str | None = None  # the kernel argument that received the output (traced run)
        self.enabled = True

    @staticmethod
    def available() -> bool:
        if not interpreting():
            return False
        try:
            from triton.runtime import interpreter
        except ImportError:
            return False
        builder = getattr(interpreter, "interpreter_builder", None)
        return builder is not None and all(hasattr(builder, m) for m in MemoryTrace._METHODS)

    def start_launch(self, named_args: dict, out: torch.Tensor | None) -> None:
        self.regions, self.out_region = [], None
        for name, value in named_args.items():
            if not isinstance(value, torch.Tensor):
                continue
            storage = value.untyped_storage()
            span = 1 + sum((s - 1) * abs(st) for s, st in zip(value.shape, value.stride(), strict=True))
            region = _Region(
                name,
                value.data_ptr(),
                span if value.numel() else 0,
                storage.data_ptr(),
                storage.data_ptr() + storage.nbytes(),
                value.element_size(),
            )
            self.regions.append(region)
            if out is not None and value.data_ptr() == out.data_ptr():
                self.out_region = region
                if self.enabled:
                    self.out_name = name

    def __enter__(self):
        load, store, atomic = (getattr(self.builder, m) for m in self._METHODS)

        def traced_load(ptrs, mask, *rest):
            self._record("load", ptrs.data, mask.data)
            return load(ptrs, mask, *rest)

        def traced_store(ptrs, value, mask, *rest):
            self._record("store", ptrs.data, mask.data)
            return store(ptrs, value, mask, *rest)

        def traced_atomic(op, ptrs, value, mask, *rest):
            self._record("atomic", ptrs.data, mask.data)
            return atomic(op, ptrs, value, mask, *rest)

        for method, traced in zip(self._METHODS, (traced_load, traced_store, traced_atomic), strict=True):
            setattr(self.builder, method, traced)
        return self

    def __exit__(self, *exc):
        for method in self._METHODS:
            self.builder.__dict__.pop(method, None)

    def _record(self, kind: str, ptrs: np.ndarray, mask: np.ndarray | None) -> None:
        pid = tuple(int(i) for i in self.builder.grid_idx)
        ptrs = np.asarray(ptrs, dtype=np.uint64).astype(np.int64)
        active = np.ones(ptrs.shape, bool) if mask is None else np.broadcast_to(np.asarray(mask, bool), ptrs.shape)
        live = ptrs[active]
        claimed = np.zeros(live.shape, bool)
        for region in self.regions:
            inside = (live >= region.lo) & (live < region.hi)
            claimed |= inside
            if inside.any() and self.enabled:
                self.accesses.append(
                    Access(kind, pid, region.name, (live[inside] - region.start) // region.item, region.numel)
                )
        # Checked in every run, traced or not: such an access would crash the process.
        if not claimed.all():
            address = int(live[~claimed][0])
            nearest = min(self.regions, key=lambda r: abs(address - r.start), default=None)
            where = (
                f"element {(address - nearest.start) // nearest.item} of {nearest.name} ({nearest.numel} elements)"
                if nearest
                else f"address {address:#x}"
            )
            raise WildAccessError(
                f"program {pid} tried to {kind} {where}, far outside every tensor of the launch; the checker "
                "stopped it before it crashed the process"
            )
        if kind == "store" and self.enabled and self.out_region is not None and ptrs.size:
            out = self.out_region
            self.accesses.append(
                Access(
                    "attempt",
                    pid,
                    out.name,
                    np.empty(0, np.int64),
                    out.numel,
                    first_attempt=int((ptrs.min() - out.start) // out.item),
                )
            )
