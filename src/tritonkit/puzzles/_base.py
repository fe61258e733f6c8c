"""What a puzzle is, where the puzzles are found, and how a puzzle's learner file is written.

Each puzzle is one module ``tritonkit/puzzles/pNN_<slug>.py``. Everything above the line
:data:`CHECKER_LINE` is the learner's file, with the reference solution in the kernel's body:
``tritonkit puzzles solution N`` prints it as it is, ``tritonkit puzzles init DIR`` writes it with
the kernel body replaced by a TODO. Below the line, the module builds its :class:`Puzzle`: inputs,
float64 reference, cases and hints, which the learner never sees. So the stub, the solution and the
checker read one file, and nothing is kept twice.
"""

from __future__ import annotations

import ast
import importlib
import math
import pkgutil
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch

from tritonkit.registry import Tolerance

CHECKER_LINE = "# ===== checker data: not part of the learner's file ====="
_MODULE_NAME = re.compile(r"^p(\d\d)_(\w+)$")
TODO_BODY = "    # TODO: write the kernel (`tritonkit puzzles hint {number}` when stuck).\n    pass\n"


@dataclass(frozen=True)
class Mistake:
    """A classic mistake, recognised by its output: ``reference(*inputs, case=case, launch=args)`` computes, from
    float64 copies of the inputs, what a kernel making the mistake outputs (``launch``: the learner's kernel
    arguments by name, for mistakes whose effect depends on the block sizes), one tensor per output. ``message`` names
    the mistake and the fix; ``code`` is stable (tests match it).

    In an integer output, NaN marks an element the mistake leaves undefined (NaN or a float beyond int8's range cast
    to int8: each machine gives its own value): any value there matches the mistake."""

    code: str
    message: str
    reference: Callable


@dataclass(frozen=True)
class Probe:
    """Inputs designed so that a puzzle's mistakes show, each as an output far from the right one and from the other
    mistakes' outputs. After a case fails on its values alone, the checker runs the learner's launcher on every probe
    that ``applies`` to the failing case and names the mistake whose output the learner's matches.

    ``make_inputs(case, dtype, device, generator)`` as :attr:`Puzzle.make_inputs`, for ``case``; ``description``
    says what is special about the inputs, for the message.
    """

    case: dict
    make_inputs: Callable
    description: str
    mistakes: Sequence[Mistake]
    applies: Callable[[dict], bool] = lambda case: True


@dataclass(frozen=True)
class OffLimits:
    """Input elements the kernel must not load, even to discard them (cache rows that no sequence owns):
    ``elements(case, *inputs)`` gives one bool mask per input, True where a load is a mistake (None: any element may
    be loaded). Under the interpreter, a traced load of one is named ``code``, with ``message``, unless a probe names
    another mistake behind the same failure."""

    code: str
    message: str
    elements: Callable


@dataclass(frozen=True)
class Puzzle:
    """One puzzle: the learner writes ``kernel`` and the checker calls ``launcher``.

    ``make_inputs(case, dtype, device, generator)`` draws the input tensors; ``reference`` computes
    the expected output from float64 copies of them (and the case, with ``reference_takes_case``);
    ``out_shape(case)`` and ``out_dtype(dtype)`` describe the output that the checker allocates,
    fills with poison, and passes as the launcher's last argument. A puzzle with several outputs
    names them in ``outputs`` (the launcher's last arguments, in order); ``out_shape``, ``out_dtype``
    and ``reference`` then give a tuple, one entry per output. ``cases`` are small shapes for
    the interpreter (some not multiples of the block sizes), ``gpu_cases`` larger ones for the
    compiled run. ``block_arg`` names the constexpr that program k's offsets should be shifted by
    (k * BLOCK) in 1-D puzzles, for the diagnosis of ``pid * n``. ``launcher_kwargs(case)`` are keyword
    arguments for the launcher beyond the tensors (a flag such as ``causal=True``); a case that needs none
    passes none, so a launcher written before the flag existed still runs the cases without it. ``probes``
    name the puzzle's classic mistakes (:class:`Probe`). ``hints`` go from a nudge to nearly the answer.

    ``helper_kernels`` are further kernels the learner writes (the stub empties them too; the checker
    records their launches), ``kernel`` being the one that writes the output. ``accumulates``: the
    kernel adds into its output (atomics), which must be zeroed before it runs. ``deterministic``: the
    result must not depend on the order the programs run in, so atomics are refused. ``off_limits``:
    input elements the kernel must not read (:class:`OffLimits`).
    """

    title: str
    kernel: str
    launcher: str
    make_inputs: Callable
    reference: Callable
    out_shape: Callable
    cases: Sequence[dict]
    gpu_cases: Sequence[dict]
    hints: Sequence[str]
    dtypes: Sequence[torch.dtype] = (torch.float32,)
    out_dtype: Callable[[torch.dtype], torch.dtype] = lambda dtype: dtype
    block_arg: str | None = None
    reference_takes_case: bool = False  # reference(*inputs, case=case) when the inputs do not say it all
    tolerance: Callable | None = None  # (case, dtype, device) -> Tolerance, else the table's entry
    launcher_kwargs: Callable[[dict], dict] = lambda case: {}
    probes: Sequence[Probe] = ()
    outputs: Sequence[str] = ("out",)
    helper_kernels: Sequence[str] = ()
    accumulates: bool = False
    deterministic: bool = False
    off_limits: OffLimits | None = None
    number: int = 0
    slug: str = ""
    module: str = ""

    @property
    def file_name(self) -> str:
        return f"puzzle_{self.number:02d}_{self.slug}.py"

    def tolerance_for(self, case: dict, dtype: torch.dtype, device: str) -> Tolerance:
        from tritonkit.registry import TOLERANCES

        if self.tolerance is not None:
            return self.tolerance(case, dtype, device)
        return TOLERANCES.get(dtype, Tolerance(atol=0, rtol=0))

    @property
    def kernels(self) -> tuple[str, ...]:
        """The kernels the learner writes: ``kernel`` first."""
        return (self.kernel, *self.helper_kernels)

    def output_specs(self, case: dict, dtype: torch.dtype) -> list[tuple[str, tuple, torch.dtype]]:
        """(name, shape, dtype) of each output, in the launcher's order."""
        shapes, dtypes = self.out_shape(case), self.out_dtype(dtype)
        if len(self.outputs) == 1:
            shapes, dtypes = (shapes,), (dtypes,)
        return list(zip(self.outputs, shapes, dtypes, strict=True))

    def expected(self, case: dict, inputs: tuple) -> tuple[torch.Tensor, ...]:
        """The reference's outputs, one tensor per output."""
        from tritonkit.testing import upcast

        extra = {"case": case} if self.reference_takes_case else {}
        return as_outputs(self.reference(*upcast(inputs), **extra))

    def source(self) -> str:
        """The module's text: the solution file above :data:`CHECKER_LINE`, the checker data below."""
        return Path(importlib.import_module(self.module).__file__).read_text()

    def solution_text(self) -> str:
        """The learner's file with the reference solution in it."""
        text = self.source()
        if CHECKER_LINE not in text:
            raise ValueError(f"{self.module} has no line {CHECKER_LINE!r}")
        return text.split(CHECKER_LINE)[0].rstrip() + "\n"

    def stub_text(self) -> str:
        """The learner's file with each kernel's body (after its docstring) replaced by a TODO."""
        text = self.solution_text()
        functions = {node.name: node for node in ast.parse(text).body if isinstance(node, ast.FunctionDef)}
        missing = [name for name in self.kernels if name not in functions]
        if missing:
            raise ValueError(f"{self.module} defines no kernel named {', '.join(missing)}")
        lines = text.splitlines(keepends=True)
        # From the last kernel in the file up, so that the line numbers of those above stay valid.
        for function in sorted((functions[name] for name in self.kernels), key=lambda f: f.lineno, reverse=True):
            first = function.body[0]
            has_docstring = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
            body_start = first.end_lineno if has_docstring else first.lineno - 1
            lines[body_start : function.end_lineno] = [TODO_BODY.format(number=self.number)]
        return "".join(lines)


def as_outputs(value) -> tuple[torch.Tensor, ...]:
    """A reference's or mistake's result as a tuple of output tensors."""
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


# Per sqrt(terms) like the table's rows: five times float16's atol and twice its rtol, for truncation
# to 10 mantissa bits (see scaled_tolerance).
TF32_TOLERANCE = Tolerance(atol=5e-3, rtol=4e-3)


def scaled_tolerance(length: Callable[[dict], int], *, dot: bool = False, float32_output: bool = False):
    """A tolerance for outputs that sum ``length(case)`` terms: atol grows like its square root.

    ``float32_output``: the output is float32 whatever the input dtype (sums, maxima), so the float32
    row applies. ``dot``: on a GPU, fp32 ``tl.dot`` uses TF32 by default, which keeps 10 mantissa bits
    and (on Hopper's tensor cores) drops the rest: each input is off by up to 2**-10 relative, always
    towards zero, four times float16's rounding. Measured on the H200 at K = 2048: errors up to 0.19,
    against 0.045 allowed by the float16 row. So float32 there gets TF32_TOLERANCE; the interpreter
    computes in full fp32.
    """
    from tritonkit.registry import TOLERANCES

    def tolerance(case, dtype, device):
        row = torch.float32 if float32_output else dtype
        base = TF32_TOLERANCE if dot and row == torch.float32 and device == "cuda" else TOLERANCES[row]
        return Tolerance(atol=base.atol * math.sqrt(max(length(case), 1)), rtol=base.rtol)

    return tolerance


@cache
def all_puzzles() -> tuple[Puzzle, ...]:
    """Every puzzle, in order, found by module name (``pNN_slug``); no list is kept anywhere else."""
    import tritonkit.puzzles as package

    found = []
    for info in pkgutil.iter_modules(package.__path__):
        match = _MODULE_NAME.match(info.name)
        if match is None:
            continue
        module_name = f"{package.__name__}.{info.name}"
        puzzle = importlib.import_module(module_name).PUZZLE
        found.append(
            Puzzle(**{**puzzle.__dict__, "number": int(match.group(1)), "slug": match.group(2), "module": module_name})
        )
    found.sort(key=lambda p: p.number)
    numbers = [p.number for p in found]
    if numbers != list(range(1, len(found) + 1)):
        raise RuntimeError(f"puzzle numbers must run 1, 2, ... without gaps, got {numbers}")
    return tuple(found)


def get(number: int) -> Puzzle:
    """Puzzle ``number`` (1-based); ValueError naming the valid range otherwise."""
    puzzles = all_puzzles()
    if not 1 <= number <= len(puzzles):
        raise ValueError(f"there is no puzzle {number}: puzzles are numbered 1 to {len(puzzles)}")
    return puzzles[number - 1]


def draw(shape, dtype: torch.dtype, device, generator, scale: float = 1.0, shift: float = 0.0) -> torch.Tensor:
    """Normal random numbers drawn in fp32 and rounded to ``dtype``: scale * N(0, 1) + shift."""
    values = torch.randn(shape, device=device, generator=generator, dtype=torch.float32)
    return (values * scale + shift).to(dtype)
