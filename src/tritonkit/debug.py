"""The practitioner's debug toolkit: helpers that work under the Triton interpreter and on the GPU.

Turning the interpreter on
    Set ``TRITON_INTERPRET=1`` in the environment before Python imports any module that defines
    kernels (``TRITON_INTERPRET=1 python my_script.py``): Triton decides between an interpreted and a
    compiled kernel when ``@triton.jit`` runs. Kernels then run on CPU tensors, one program at a time,
    in plain Python, so ``print``, ``breakpoint()`` and the helpers below work inside them.
    ``tritonkit check`` and the test suite switch it on by themselves on a machine without a GPU.
    :func:`interpreting` tells whether it is on. ``docs/interpreter.md`` lists what the interpreter gets
    wrong, each point verified by a test.

Inside kernels
    :func:`print_if` and :func:`breakpoint_if` act only in the programs that a rule string selects
    (see :func:`test_pid_conds`), reading the current program ids themselves. Under the interpreter
    they print or stop; in a compiled kernel they compile to nothing, so a kernel keeps them while
    it moves from the CPU to the GPU. ``offsets_1d``/``offsets_2d``/``mask_1d``/``mask_2d`` are
    ``@triton.jit`` helpers for the offset and mask arithmetic every kernel repeats.

Around kernels
    :func:`check_tensors_gpu_ready` checks launch arguments; :func:`guard_bounds` runs a launch on
    tensors padded with sentinels and reports writes outside the tensors and out-of-bounds reads that
    reached the output, which the interpreter (and the GPU) let pass silently.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
import triton
import triton.language as tl

from tritonkit._core import ints
from tritonkit._core.env import interpreting
from tritonkit._core.interpreter import speed_up_if_interpreting

# The offset and mask helpers every kernel repeats live with the library's shared jit pieces; learners reach them here.
from tritonkit._core.jit.offsets import mask_1d, mask_2d, offsets_1d, offsets_2d

speed_up_if_interpreting()  # learners' kernels that call helpers skip a redundant repatching of triton.language

__all__ = [
    "BoundsReport",
    "OutOfBoundsError",
    "breakpoint_if",
    "cdiv",
    "check_tensors_gpu_ready",
    "guard_bounds",
    "interpreting",
    "mask_1d",
    "mask_2d",
    "offsets_1d",
    "offsets_2d",
    "print_if",
    "test_pid_conds",
]


# --------------------------------------------------------------------------------------------------
# Launch arguments
# --------------------------------------------------------------------------------------------------
def check_tensors_gpu_ready(*tensors: torch.Tensor) -> None:
    """Check that every tensor is contiguous and, unless interpreting, on a CUDA device.

    Raises ValueError naming the first offending tensor by its position and the reason.
    """
    for position, tensor in enumerate(tensors):
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(f"tensor {position} is not a torch.Tensor but {type(tensor).__name__}")
        if not tensor.is_contiguous():
            raise ValueError(
                f"tensor {position} is not contiguous (shape {tuple(tensor.shape)}, strides {tensor.stride()})"
            )
        if not interpreting() and tensor.device.type != "cuda":
            raise ValueError(
                f"tensor {position} is on {tensor.device}, not on a CUDA device "
                "(set TRITON_INTERPRET=1 before importing triton to run on the CPU)"
            )


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative ``a`` by positive ``b`` (the number of blocks of size b covering a)."""
    if b <= 0:
        raise ValueError(f"cdiv: b must be positive, got {b}")
    if a < 0:
        raise ValueError(f"cdiv: a must be non-negative, got {a}")
    return ints.cdiv(a, b)


# --------------------------------------------------------------------------------------------------
# Program-id rules
# --------------------------------------------------------------------------------------------------
_RULE = re.compile(r"^(<=|>=|!=|==|<|>|=)\s*(-?\d+)$")
_COMPARE = {
    "<": lambda pid, n: pid < n,
    ">": lambda pid, n: pid > n,
    "<=": lambda pid, n: pid <= n,
    ">=": lambda pid, n: pid >= n,
    "=": lambda pid, n: pid == n,
    "==": lambda pid, n: pid == n,
    "!=": lambda pid, n: pid != n,
}


def _parse_conds(conds: str) -> list[tuple[str, int] | None]:
    """Parse ``'!=0,<=3'`` into one (operator, number) per axis; an empty rule matches every id."""
    if not isinstance(conds, str):
        raise ValueError(f"program-id rules must be a string such as '=0,>1', got {conds!r}")
    parts = conds.split(",")
    if len(parts) > 3:
        raise ValueError(f"program-id rules {conds!r} name {len(parts)} axes; a grid has at most 3")
    rules: list[tuple[str, int] | None] = []
    for part in parts:
        part = part.strip()
        if not part:
            rules.append(None)
            continue
        match = _RULE.match(part)
        if match is None:
            raise ValueError(
                f"invalid program-id rule {part!r} in {conds!r}: expected an operator "
                "(<, >, <=, >=, =, !=) followed by an integer, such as '>=2'"
            )
        rules.append((match.group(1), int(match.group(2))))
    return rules


def _current_program_ids() -> tuple[int, int, int]:
    """The ids of the program the interpreter is running now (read from inside a kernel)."""
    if not interpreting():
        raise ValueError("program ids can only be read inside a kernel running under TRITON_INTERPRET=1")
    try:
        return tuple(int(tl.program_id(axis).handle.data.item()) for axis in range(3))
    except Exception as error:  # outside a kernel tl.program_id is not patched by the interpreter
        raise ValueError(
            "pid_0, pid_1 and pid_2 were not given and no interpreted kernel is running; "
            "pass the program ids or call from inside a kernel"
        ) from error


def _program_id(axis: int, value) -> int | None:
    """One program id as an int: given as an int, or as one element of a list, tuple, NumPy array, torch tensor or
    interpreter block (``tl.program_id(0)``, ``tl.full([1], pid, tl.int32)``); None stays None (not given)."""
    if value is None or isinstance(value, int):
        return value
    values = np.asarray(_host_value(value), dtype=object if isinstance(value, (list, tuple)) else None).reshape(-1)
    if values.size != 1:
        raise ValueError(f"pid_{axis} must be one program id (an int or a block of one), got {values.size} elements")
    return int(values[0])


def test_pid_conds(conds: str, pid_0=None, pid_1=None, pid_2=None) -> bool:
    """Whether the program ids satisfy ``conds``: one rule per axis, comma-separated.

    A rule is empty (any id) or an operator among ``< > <= >= = !=`` and an integer: ``''``
    (every program), ``'=0'`` (pid_0 is 0), ``',>=2'`` (pid_1 at least 2), ``'!=0,<=3'``. Each id is an
    int or one element of a list, array or block (``test_pid_conds('=0,=1', [0], [1], [0])``, or
    ``tl.program_id(0)`` inside a kernel); ids not given are read from the running interpreted kernel.
    An invalid rule raises ValueError quoting it; a block of several ids raises ValueError naming it.
    """
    rules = _parse_conds(conds)
    pids = tuple(_program_id(axis, pid) for axis, pid in enumerate((pid_0, pid_1, pid_2)))
    if any(rule is not None and pids[axis] is None for axis, rule in enumerate(rules)):
        current = _current_program_ids()
        pids = tuple(current[axis] if pid is None else pid for axis, pid in enumerate(pids))
    return all(rule is None or _COMPARE[rule[0]](pids[axis], rule[1]) for axis, rule in enumerate(rules))


test_pid_conds.__test__ = False  # a helper named test_*, not a test: keep pytest from collecting it


def _host_value(value):
    """Render an interpreter tensor as a NumPy value; leave anything else as it is."""
    handle = getattr(value, "handle", None)
    data = getattr(handle, "data", None)
    return data if data is not None else value


if interpreting():

    def print_if(text, conds: str = "", pid_0=None, pid_1=None, pid_2=None) -> None:
        """Print ``text`` (a string or a block) in the programs that ``conds`` selects.

        Under the interpreter it prints ``[pid a,b,c] text``; compiled for a GPU it is a no-op.
        """
        if test_pid_conds(conds, pid_0, pid_1, pid_2):
            given = tuple(_program_id(axis, pid) for axis, pid in enumerate((pid_0, pid_1, pid_2)))
            ids = _current_program_ids() if None in given else given
            print(f"[pid {ids[0]},{ids[1]},{ids[2]}]", _host_value(text))

    def breakpoint_if(conds: str = "", pid_0=None, pid_1=None, pid_2=None) -> None:
        """Stop in the debugger (Python's ``breakpoint()``) in the programs that ``conds`` selects.

        Under the interpreter the debugger shows the kernel's local blocks as NumPy-backed values;
        compiled for a GPU it is a no-op.
        """
        if test_pid_conds(conds, pid_0, pid_1, pid_2):
            breakpoint()

else:
    # Compiled kernels cannot call Python, and Triton rejects a reference to a Python function even in
    # a branch that is never taken, so the compiled helpers are jit functions that generate nothing.

    @triton.jit
    def print_if(text, conds: tl.constexpr = "", pid_0=None, pid_1=None, pid_2=None):
        """Compiled for a GPU: a no-op (under the interpreter it prints; see the module docstring)."""
        pass

    @triton.jit
    def breakpoint_if(conds: tl.constexpr = "", pid_0=None, pid_1=None, pid_2=None):
        """Compiled for a GPU: a no-op (under the interpreter it stops in the debugger)."""
        pass


# --------------------------------------------------------------------------------------------------
# Out-of-bounds guard
# --------------------------------------------------------------------------------------------------
class OutOfBoundsError(AssertionError):
    """Raised by :meth:`BoundsReport.raise_if_bad` when a launch touched memory outside its tensors."""


@dataclass
class BoundsReport:
    """What :func:`guard_bounds` found: one line per tensor written outside, or output changed by a read."""

    oob_writes: list[str] = field(default_factory=list)
    oob_reads: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.oob_writes and not self.oob_reads

    def __str__(self) -> str:
        if self.ok:
            return "no out-of-bounds access detected"
        lines = [f"out-of-bounds write: {line}" for line in self.oob_writes]
        lines += [f"out-of-bounds read reached the output: {line}" for line in self.oob_reads]
        return "\n".join(lines)

    def raise_if_bad(self) -> None:
        if not self.ok:
            raise OutOfBoundsError(str(self))


_BITS_DTYPE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    """Reinterpret as integers of the same width, so that comparisons see NaN payloads exactly."""
    return tensor.view(_BITS_DTYPE[tensor.element_size()])


def _sentinel(dtype: torch.dtype, run: int, position: int):
    """The padding fill of tensor ``position`` in ``run``.

    Run 0 pads with NaN, so out-of-bounds reads poison arithmetic; run 1 gives each tensor its own
    finite value, so a copy from one tensor's padding into another's shows as a change.
    """
    if dtype == torch.bool:
        return run == 0
    if dtype.is_floating_point:
        return float("nan") if run == 0 else -1024.0 * (12 + position % 64)
    info = torch.iinfo(dtype)
    return info.max if run == 0 else info.min + 1 + position % 64


def _span(tensor: torch.Tensor) -> int:
    """Elements from the first to the last one the tensor's strides can reach."""
    if tensor.numel() == 0:
        return 0
    return 1 + sum((size - 1) * abs(stride) for size, stride in zip(tensor.shape, tensor.stride(), strict=True))


def _padded_copy(tensor: torch.Tensor, pad: int, fill) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A buffer of ``pad`` sentinels, the tensor's span, ``pad`` sentinels; a view of the tensor in it.

    Returns (buffer, view, owned) where ``owned`` marks the buffer elements that belong to the tensor.
    """
    if any(stride < 0 for stride in tensor.stride()):
        raise ValueError("guard_bounds does not take tensors with negative strides")
    span = _span(tensor)
    buffer = torch.full((pad + span + pad,), fill, dtype=tensor.dtype, device=tensor.device)
    view = buffer.as_strided(tensor.shape, tensor.stride(), pad)
    view.copy_(tensor)
    owned = torch.zeros(buffer.shape, dtype=torch.bool, device=tensor.device)
    owned.as_strided(tensor.shape, tensor.stride(), pad).fill_(True)
    return buffer, view, owned


def _flatten_outputs(result) -> list[torch.Tensor]:
    if isinstance(result, torch.Tensor):
        return [result]
    if isinstance(result, (tuple, list)):
        return [item for item in result if isinstance(item, torch.Tensor)]
    return []


def _describe_difference(name: str, first: torch.Tensor, second: torch.Tensor) -> str | None:
    differs = _bits(first.contiguous()).ne(_bits(second.contiguous()))
    count = int(differs.sum())
    if count == 0:
        return None
    where = differs.nonzero()[:3].tolist()
    return f"{name}: {count} of {differs.numel()} elements depend on memory outside the inputs (first at {where})"


def guard_bounds(launch: Callable, *tensors: torch.Tensor, pad: int = 1024) -> BoundsReport:
    """Run ``launch(*tensors)`` twice on padded copies and report out-of-bounds accesses.

    Every tensor is copied into the middle of a buffer with ``pad`` sentinel elements on each side
    (NaN in the first run, a large finite value per tensor in the second; the extremes of the range
    for integers). Afterwards:

    * a sentinel that changed, in any buffer and either run, is a write outside that tensor (gaps
      between the elements of a strided view count as outside); each tensor gets its own finite
      sentinel in the second run, so copying padding into padding shows;
    * an element of any tensor or of the launch's returned tensors that differs between the two
      runs is an out-of-bounds read that reached the output.

    The originals are left untouched. Writes farther than ``pad`` elements away land in memory
    the guard does not own and are not seen. Kernels whose results are nondeterministic (atomics
    in floating point) show up as out-of-bounds reads.
    """
    for position, tensor in enumerate(tensors):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"guard_bounds: argument {position + 1} must be a torch.Tensor, got {type(tensor)}")
    runs = []
    for run in range(2):
        padded = [
            _padded_copy(tensor, pad, _sentinel(tensor.dtype, run, position)) for position, tensor in enumerate(tensors)
        ]
        before = [_bits(buffer).clone() for buffer, _, _ in padded]
        result = launch(*[view for _, view, _ in padded])
        if any(t.is_cuda for t in tensors):
            torch.cuda.synchronize()
        runs.append((padded, before, _flatten_outputs(result)))

    report = BoundsReport()
    for position in range(len(tensors)):
        # A write of a value equal to the padding is invisible in one run; the two runs differ.
        changed = [_bits(padded[position][0]).ne(before[position]) & ~padded[position][2] for padded, before, _ in runs]
        worst = max(changed, key=lambda mask: int(mask.sum()))
        count = int(worst.sum())
        if count:
            offsets = (worst.nonzero().flatten()[:3] - pad).tolist()
            report.oob_writes.append(
                f"tensor {position}: {count} elements written outside it (first at element offsets {offsets} "
                "from its start)"
            )
    (padded_a, _, outputs_a), (padded_b, _, outputs_b) = runs
    for position, ((_, view_a, _), (_, view_b, _)) in enumerate(zip(padded_a, padded_b, strict=True)):
        line = _describe_difference(f"tensor {position}", view_a, view_b)
        if line:
            report.oob_reads.append(line)
    for position, (out_a, out_b) in enumerate(zip(outputs_a, outputs_b, strict=True)):
        line = _describe_difference(f"returned tensor {position}", out_a, out_b)
        if line:
            report.oob_reads.append(line)
    return report
