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
    kernel: str = ""
    poisoned: bool = False  # an output the kernel received still held the checker's poison when it started


class LaunchRecorder:
    """Replace the module's kernels by stand-ins that record each launch and then run the kernel.

    The learner's launcher looks its kernels up among its module's globals at call time, so it
    launches the stand-ins. After each launch the outputs are copied, to see whether the launcher
    changes them afterwards. ``is_poisoned(tensor)`` tells whether an output still holds the poison.
    """

    def __init__(self, module, kernel_names, trace: MemoryTrace | None, is_poisoned=None):
        self.module, self.trace, self.is_poisoned = module, trace, is_poisoned
        names = (kernel_names,) if isinstance(kernel_names, str) else tuple(kernel_names)
        self.kernels = {}
        for name in names:
            kernel = getattr(module, name, None)
            if kernel is None:
                raise AttributeError(f"the file defines no function named {name}")
            self.kernels[name] = kernel
        self.launches: list[Launch] = []
        self.outs: tuple[torch.Tensor, ...] = ()
        self.after_last_launch: tuple[torch.Tensor, ...] | None = None

    def begin(self, outs) -> None:
        """A new run of the launcher, into ``outs``."""
        self.launches, self.outs, self.after_last_launch = [], tuple(outs), None

    def __enter__(self):
        for name, kernel in self.kernels.items():
            setattr(self.module, name, _StandIn(self, name, kernel))
        return self

    def __exit__(self, *exc):
        for name, kernel in self.kernels.items():
            setattr(self.module, name, kernel)

    def launch(self, name: str, kernel, grid, args, kwargs):
        named = dict(zip(_arg_names(kernel), args, strict=False)) | kwargs
        resolved = grid(named) if callable(grid) else grid
        resolved = tuple(resolved) if isinstance(resolved, (tuple, list)) else (resolved,)
        received = [out for out in self.outs if any(_same_tensor(out, value) for value in named.values())]
        poisoned = self.is_poisoned is not None and any(self.is_poisoned(out) for out in received)
        self.launches.append(Launch(resolved, named, name, poisoned))
        if self.trace is not None:
            self.trace.start_launch(named, self.outs)
        try:
            return kernel[grid](*args, **kwargs)
        finally:
            self.after_last_launch = tuple(out.clone() for out in self.outs)


class _StandIn:
    """What the learner's launcher finds under a kernel's name while the recorder is on."""

    def __init__(self, recorder: LaunchRecorder, name: str, kernel):
        self.recorder, self.name, self.kernel = recorder, name, kernel

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.recorder.launch(self.name, self.kernel, grid, args, kwargs)

    def __getattr__(self, name):  # anything else (.fn, .arg_names, .run) goes to the real kernel
        return getattr(self.kernel, name)


def _same_tensor(out: torch.Tensor, value) -> bool:
    return isinstance(value, torch.Tensor) and value.data_ptr() == out.data_ptr()


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
    kind: str  # "load", "store", "atomic" or "attempt" (a store to the first output, masked lanes included)
    pid: tuple[int, int, int]
    tensor: str
    offsets: np.ndarray  # element offsets of the active lanes from the tensor's element 0
    numel: int
    first_attempt: int | None = None  # stores to the output: lowest offset of any lane, masked or not
    launch: int = 0  # which launch of the run (0, 1, ...): program ids repeat across launches


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
        self.out_region: _Region | None = None  # the first output's, for the stores' "attempt" records
        self.out_names: list[str | None] = []  # per output, the kernel argument that received it (traced run)
        self.launch_index = -1
        self.enabled = True

    @property
    def out_name(self) -> str | None:
        """The kernel argument that received the (first) output."""
        return self.out_names[0] if self.out_names else None

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

    def start_launch(self, named_args: dict, out) -> None:
        """A launch with these arguments begins; ``out`` is the output tensor, several, or None."""
        outs = () if out is None else (out,) if isinstance(out, torch.Tensor) else tuple(out)
        if self.enabled:
            self.launch_index += 1
            if len(self.out_names) != len(outs):
                self.out_names = [None] * len(outs)
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
            for index, out_tensor in enumerate(outs):
                if value.data_ptr() != out_tensor.data_ptr():
                    continue
                if index == 0:
                    self.out_region = region
                if self.enabled:
                    self.out_names[index] = name

    def __enter__(self):
        load, store, atomic = (getattr(self.builder, m) for m in self._METHODS)

        # Keyword arguments pass through: the interpreter's tensor-descriptor loads call the masked load with them.
        def traced_load(ptrs, mask, *rest, **named):
            self._record("load", ptrs.data, mask.data)
            return load(ptrs, mask, *rest, **named)

        def traced_store(ptrs, value, mask, *rest, **named):
            self._record("store", ptrs.data, mask.data)
            return store(ptrs, value, mask, *rest, **named)

        def traced_atomic(op, ptrs, value, mask, *rest, **named):
            self._record("atomic", ptrs.data, mask.data)
            return atomic(op, ptrs, value, mask, *rest, **named)

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
                offsets = (live[inside] - region.start) // region.item
                self.accesses.append(Access(kind, pid, region.name, offsets, region.numel, launch=self.launch_index))
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
                    launch=self.launch_index,
                )
            )
