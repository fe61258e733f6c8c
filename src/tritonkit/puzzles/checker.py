"""The puzzle checker: run a learner's kernel on random cases and say what is wrong, by watching it.

For each case the checker draws inputs, fills the output with poison (NaN, or a sentinel integer),
and calls the learner's launcher inside :func:`tritonkit.debug.guard_bounds`, which pads every tensor
with sentinels and reports reads and writes outside them. Around the launch it

* counts launches of the learner's kernel (a launcher that computes the answer with torch and never
  launches, or changes the output after the kernel ran, is caught),
* under the interpreter, records every load, store and atomic by program (:class:`MemoryTrace`):
  which elements each program touched, which lanes fell outside their tensor, and stops an access
  that would land outside every launched tensor before it crashes the process.

Mistakes are named from what was observed: every program storing the same elements (offsets not
shifted by the program id), program k starting at k * n instead of k * BLOCK, lanes past the end
(a missing mask), outputs never written, and float32 passing where bfloat16 fails under the
interpreter (bf16 arithmetic without a cast). Under the interpreter "never written" means no store
reached the element (a stored NaN is a wrong value); compiled, it means the element still holds the
poison.

A puzzle may also name its classic mistakes (:class:`~tritonkit.puzzles._base.Probe`): when a case fails on its
values alone, the learner's kernel runs again on inputs designed to make each mistake show, and its output is
compared with what a kernel making each mistake would output; the one it matches is named (flash attention: no
maximum subtracted before exp, a running sum or accumulator not rescaled, a causal mask off by one).
"""

from __future__ import annotations

import importlib.util
import math
import sys
import traceback
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from tritonkit._core.env import interpreting
from tritonkit.debug import guard_bounds
from tritonkit.puzzles._base import Puzzle
from tritonkit.puzzles.trace import Access, Launch, LaunchRecorder, MemoryTrace, WildAccessError
from tritonkit.testing import compare, fresh_seed, upcast

_INT_POISON = -(2**31) + 7  # an integer output the kernel never wrote keeps this value
_SHOW_POSITIONS = 5


@dataclass(frozen=True)
class Finding:
    """One observation about a failing case: a stable ``code`` (tests match it) and a message."""

    code: str
    message: str


@dataclass
class CaseOutcome:
    case: dict
    dtype: torch.dtype
    seed: int
    findings: list[Finding] = field(default_factory=list)
    max_abs_err: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.findings

    @property
    def codes(self) -> list[str]:
        return [f.code for f in self.findings]

    def label(self) -> str:
        shape = " ".join(f"{key}={value}" for key, value in self.case.items())
        return f"{str(self.dtype).removeprefix('torch.'):<9} {shape}"


@dataclass
class PuzzleReport:
    puzzle: Puzzle
    outcomes: list[CaseOutcome]
    device: str
    seed: int  # case i of each dtype drew its inputs with seed + i: `--seed` replays them all
    notes: list[Finding] = field(default_factory=list)  # findings across cases (the bf16 one)

    @property
    def ok(self) -> bool:
        return bool(self.outcomes) and all(o.ok for o in self.outcomes)

    @property
    def codes(self) -> list[str]:
        failing = next((o for o in self.outcomes if not o.ok), None)
        return [f.code for f in self.notes] + (failing.codes if failing else [])


# --------------------------------------------------------------------------------------------------
# Loading the learner's file
# --------------------------------------------------------------------------------------------------
def load_file(path: Path):
    """Import the learner's file as a fresh module (a new name each time, so edits are seen)."""
    path = Path(path).resolve()
    name = f"_tritonkit_learner_{path.stem}_{abs(hash((str(path), path.stat().st_mtime_ns)))}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # triton's jit looks its function's module up
    spec.loader.exec_module(module)
    return module


# --------------------------------------------------------------------------------------------------
# One case
# --------------------------------------------------------------------------------------------------
def _poison(dtype: torch.dtype):
    return float("nan") if dtype.is_floating_point else _INT_POISON


def _unwritten(out: torch.Tensor, expected: torch.Tensor, stored: torch.Tensor | None) -> torch.Tensor:
    """The outputs the kernel never wrote and that should differ from the poison. With the trace's ``stored`` (which
    elements a store or atomic reached), exactly those not stored: a stored NaN is a written, wrong value. Without
    it (compiled), those still holding the poison, which a stored NaN cannot be told apart from."""
    poison_is_wrong = ~torch.isnan(expected) if out.dtype.is_floating_point else expected != _INT_POISON
    if stored is not None:
        return ~stored & poison_is_wrong
    if out.dtype.is_floating_point:
        return torch.isnan(out) & poison_is_wrong
    return out == _INT_POISON


def _stored_elements(accesses: list[Access], out_name: str | None, out: torch.Tensor) -> torch.Tensor | None:
    """Which elements of the (contiguous) output a traced store or atomic reached, shaped like it; None without a
    trace of the output."""
    if out_name is None or not out.is_contiguous():
        return None
    stored = torch.zeros(out.numel(), dtype=torch.bool)
    for access in accesses:
        if access.kind in ("store", "atomic") and access.tensor == out_name:
            offsets = access.offsets[(access.offsets >= 0) & (access.offsets < out.numel())]
            stored[torch.from_numpy(offsets.astype(np.int64))] = True
    return stored.view(out.shape)


def _format_value(value: float) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def _where(index: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(i) for i in index) + "]"


def _learner_line(error: BaseException, path: str | None) -> str:
    """``file, line N: code`` of the deepest frame in the learner's file, if any."""
    found = ""
    chain = error
    while chain is not None:
        for frame in traceback.extract_tb(chain.__traceback__):
            if path and Path(frame.filename).resolve() == Path(path).resolve():
                found = f" (line {frame.lineno}: {frame.line.strip()})" if frame.line else f" (line {frame.lineno})"
        chain = chain.__cause__ or chain.__context__
    return found


def _root_error(error: BaseException) -> BaseException:
    while error.__cause__ is not None:
        error = error.__cause__
    return error


def run_case(puzzle: Puzzle, module, case: dict, dtype: torch.dtype, seed: int, device: str) -> CaseOutcome:
    """Run one case of ``puzzle`` through ``module``'s launcher and report what went wrong, if anything."""
    outcome = CaseOutcome(case, dtype, seed)
    generator = torch.Generator(device=device).manual_seed(seed)
    inputs = tuple(puzzle.make_inputs(case, dtype, device, generator))
    expected = puzzle.expected(case, inputs)
    out = torch.full(
        puzzle.out_shape(case), _poison(puzzle.out_dtype(dtype)), dtype=puzzle.out_dtype(dtype), device=device
    )
    launcher = getattr(module, puzzle.launcher, None)
    if launcher is None:
        outcome.findings.append(Finding("no-launcher", f"the file defines no function named {puzzle.launcher}"))
        return outcome
    inputs_before = [t.clone() for t in inputs]
    trace = MemoryTrace() if MemoryTrace.available() else None
    recorder = LaunchRecorder(module, puzzle.kernel, trace)
    runs = []
    kwargs = puzzle.launcher_kwargs(case)

    def launch(*views):
        recorder.launches, recorder.out, recorder.after_last_launch = [], views[-1], None
        if trace is not None:
            trace.enabled = not runs  # the first run (NaN padding) is traced; the second only guarded
        returned = launcher(*views, **kwargs)
        runs.append((views, returned, list(recorder.launches), recorder.after_last_launch))
        return returned

    try:
        with recorder:
            if trace is not None:
                with trace:
                    bounds = guard_bounds(launch, *inputs, out)
            else:
                bounds = guard_bounds(launch, *inputs, out)
    except Exception as error:
        root = _root_error(error)
        where = _learner_line(error, getattr(module, "__file__", None))
        code = "wild-access" if isinstance(root, WildAccessError) else "exception"
        outcome.findings.append(Finding(code, f"{type(root).__name__}: {root}{where}"))
        return outcome

    views, returned, launches, after_last_launch = runs[0]
    result = views[-1]
    findings = outcome.findings
    if not launches:
        findings.append(
            Finding(
                "never-launched",
                f"{puzzle.launcher} never launched {puzzle.kernel}: the output did not come from your kernel "
                "(a launcher must launch the kernel, kernel[grid](...), not compute the answer with torch)",
            )
        )
    elif not torch.equal(_bits_or_self(after_last_launch), _bits_or_self(result)):
        findings.append(
            Finding(
                "written-outside-kernel",
                f"{puzzle.launcher} changed the output after {puzzle.kernel} ran: the answer must come from the kernel",
            )
        )
    if isinstance(returned, torch.Tensor) and returned is not result:
        result = returned
    if result.shape != expected.shape:
        findings.append(
            Finding("shape-mismatch", f"output shape {tuple(result.shape)}, expected {tuple(expected.shape)}")
        )
        return outcome
    if result.dtype != out.dtype:
        findings.append(Finding("dtype-mismatch", f"output dtype {result.dtype}, expected {out.dtype}"))
        return outcome
    for position, (before, tensor) in enumerate(zip(inputs_before, inputs, strict=True)):
        if not torch.equal(_bits_or_self(before), _bits_or_self(tensor)):
            findings.append(Finding("input-modified", f"input {position} was changed: the kernel wrote into it"))
    stored = None
    if trace is not None:
        findings.extend(_trace_findings(trace.accesses, trace.out_name, launches, puzzle))
        if result is views[-1]:  # the traced output; a tensor the launcher returned instead was not traced
            stored = _stored_elements(trace.accesses, trace.out_name, result)
    if not bounds.ok and not any(f.code == "missing-mask" for f in findings):
        findings.append(Finding("out-of-bounds", f"the guard saw accesses outside the tensors:\n{bounds}"))
    values = _value_findings(puzzle, case, dtype, device, result, expected, launches, outcome, stored)
    if not findings and any(f.code == "wrong-values" for f in values):  # in bounds, launched, only values wrong
        findings.extend(_named_mistakes(puzzle, module, case, dtype, seed, device))
    findings.extend(values)
    return outcome


def _bits_or_self(tensor: torch.Tensor | None) -> torch.Tensor | None:
    """Integers of the same width, so that NaN compares equal to the same NaN."""
    if tensor is None or not tensor.dtype.is_floating_point:
        return tensor
    return tensor.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[tensor.element_size()])


def _value_findings(puzzle, case, dtype, device, result, expected, launches, outcome, stored) -> list[Finding]:
    tolerance = puzzle.tolerance_for(case, dtype, device)
    comparison = compare(result, expected, tolerance)
    outcome.max_abs_err = comparison.max_abs_err
    if comparison.ok:
        return []
    result, expected = result.detach().cpu(), expected.detach().cpu()
    unwritten = _unwritten(result, expected, stored)
    bad = ~torch.isclose(result.to(torch.float64), expected.to(torch.float64), tolerance.rtol, tolerance.atol, True)
    findings = []
    n_unwritten = int(unwritten.sum())
    if any(f.code == "never-written" for f in outcome.findings):
        pass  # the trace saw no store at all
    elif n_unwritten == result.numel():
        findings.append(Finding("never-written", "the kernel wrote nothing: every output still holds the poison"))
    elif n_unwritten:
        first = [_where(tuple(i)) for i in unwritten.nonzero()[:_SHOW_POSITIONS].tolist()]
        findings.append(
            Finding(
                "never-written",
                f"{n_unwritten} of {result.numel()} outputs were never written (first at {', '.join(first)})",
            )
        )
    wrong = bad & ~unwritten
    if int(wrong.sum()):
        lines = [
            f"  at {_where(tuple(i))}: expected {_format_value(expected[tuple(i)].item())}, "
            f"got {_format_value(result[tuple(i)].item())}"
            for i in wrong.nonzero()[:_SHOW_POSITIONS].tolist()
        ]
        findings.append(
            Finding(
                "wrong-values",
                f"{int(wrong.sum())} of {result.numel()} outputs are wrong (tolerance atol={tolerance.atol:.2g}, "
                f"rtol={tolerance.rtol:.2g}):\n" + "\n".join(lines),
            )
        )
    if not any(f.code in ("not-shifted", "pid-times-n") for f in outcome.findings):
        findings.extend(_first_block_only(result, unwritten, bad, launches, puzzle))
    return findings


def _first_block_only(result, unwritten, bad, launches, puzzle) -> list[Finding]:
    """Without a trace (compiled), the output's shape of failure: only the first block right."""
    if puzzle.block_arg is None or not launches or result.dim() != 1:
        return []
    block = launches[0].args.get(puzzle.block_arg)
    if not isinstance(block, int) or result.numel() <= block:
        return []
    good_head = not bool(bad[:block].any())
    rest_unwritten = bool(unwritten[block:].all())
    if good_head and rest_unwritten:
        return [
            Finding(
                "first-block-only",
                f"only the first block ({puzzle.block_arg} = {block} elements) is right and nothing after it was "
                "written: every program stored to the first block (offsets not shifted by tl.program_id), or the "
                f"shift jumps past the end where the mask drops the stores (pid * n instead of pid * "
                f"{puzzle.block_arg})",
            )
        ]
    return []


# --------------------------------------------------------------------------------------------------
# Classic mistakes, named by running the learner's kernel on designed inputs
# --------------------------------------------------------------------------------------------------
# A mistake is named when the learner's output equals its output at this share of the elements it changes, and of
# all elements (elsewhere the mistake's output is the right one): not all, as a kernel's loop bounds can hide a
# mask's mistake from a few rows (a key past the last block the loop visits).
_MATCH = 0.75


def _named_mistakes(puzzle: Puzzle, module, case: dict, dtype: torch.dtype, seed: int, device: str) -> list[Finding]:
    """For each probe that applies to the failing case: run the learner's launcher on the probe's inputs and, when
    its output is wrong there, name the mistake whose output it matches best (if one matches well enough)."""
    findings = []
    for probe in puzzle.probes:
        if not probe.applies(case):
            continue
        generator = torch.Generator(device=device).manual_seed(seed)
        inputs = tuple(probe.make_inputs(probe.case, dtype, device, generator))
        ran = _run_probe(puzzle, module, probe.case, dtype, device, inputs)
        if ran is None:
            continue
        result, launch_args = ran
        expected = puzzle.expected(probe.case, inputs)
        tolerance = puzzle.tolerance_for(probe.case, dtype, device)
        if result.shape != expected.shape or compare(result, expected, tolerance).ok:
            continue
        best = None
        for mistake in probe.mistakes:
            variant = mistake.reference(*upcast(inputs), case=probe.case, launch=launch_args)
            share, overall = _shared_share(result, expected, variant, tolerance)
            if share >= _MATCH and overall >= _MATCH and (best is None or share > best[0]):
                best = (share, mistake)
        if best is not None:
            share, mistake = best
            findings.append(
                Finding(
                    mistake.code,
                    f"{mistake.message} (seen on {probe.description}: your output matches that mistake's at "
                    f"{share:.0%} of the outputs it changes)",
                )
            )
    return findings


def _run_probe(puzzle: Puzzle, module, case: dict, dtype, device, inputs) -> tuple[torch.Tensor, dict] | None:
    """The learner's output on a probe's inputs and its kernel's arguments; None when the launcher raised or never
    launched (the failing case already reports what broke: a probe only names a mistake)."""
    out = torch.full(
        puzzle.out_shape(case), _poison(puzzle.out_dtype(dtype)), dtype=puzzle.out_dtype(dtype), device=device
    )
    trace = MemoryTrace() if MemoryTrace.available() else None
    recorder = LaunchRecorder(module, puzzle.kernel, trace)
    try:
        with recorder:
            if trace is None:
                returned = getattr(module, puzzle.launcher)(*inputs, out, **puzzle.launcher_kwargs(case))
            else:
                # Not recorded, but an access far outside every tensor is still stopped before it crashes.
                trace.enabled = False
                with trace:
                    returned = getattr(module, puzzle.launcher)(*inputs, out, **puzzle.launcher_kwargs(case))
    except Exception:
        return None
    if not recorder.launches:
        return None
    return (returned if isinstance(returned, torch.Tensor) else out), recorder.launches[0].args


def _shared_share(result: torch.Tensor, expected: torch.Tensor, variant: torch.Tensor, tolerance) -> tuple:
    """How often ``result`` equals ``variant`` (a mistake's output) within the tolerance: the share of the elements
    where ``variant`` differs from ``expected``, and of all elements. Infinities and NaN count as one value: a
    softmax that overflows gives inf or NaN depending on the signs it meets."""

    def canonical(tensor):
        tensor = tensor.detach().to("cpu", torch.float64)
        return torch.where(torch.isfinite(tensor), tensor, math.nan)

    result, expected, variant = canonical(result), canonical(expected), canonical(variant)
    changed = ~torch.isclose(variant, expected, tolerance.rtol, tolerance.atol, equal_nan=True)
    if not changed.any():
        return 0.0, 0.0
    same = torch.isclose(result, variant, tolerance.rtol, tolerance.atol, equal_nan=True)
    return float(same[changed].double().mean()), float(same.double().mean())


# --------------------------------------------------------------------------------------------------
# What the trace shows
# --------------------------------------------------------------------------------------------------
def _trace_findings(accesses: list[Access], out_name: str | None, launches: list[Launch], puzzle) -> list[Finding]:
    findings = []
    for kind, verb in (("store", "stored"), ("load", "loaded"), ("atomic", "updated atomically")):
        for access in accesses:
            if access.kind != kind:
                continue
            outside = access.offsets[(access.offsets < 0) | (access.offsets >= access.numel)]
            if outside.size:
                lo, hi = int(outside.min()), int(outside.max())
                findings.append(
                    Finding(
                        "missing-mask",
                        f"program {access.pid} {verb} {outside.size} elements outside {access.tensor} (elements "
                        f"{lo}..{hi}; it has {access.numel}): lanes past the end need mask= (offsets < n), "
                        "and a load also other=",
                    )
                )
                break
    stored: dict[tuple, set] = defaultdict(set)  # plain stores only: atomics may share elements
    for access in accesses:
        if access.kind == "store" and access.tensor == out_name:
            stored[access.pid].update(access.offsets.tolist())
            if np.unique(access.offsets).size < access.offsets.size:
                return [*findings, _collision(access)]
    if not stored and not any(a.kind == "atomic" and a.tensor == out_name for a in accesses):
        findings.append(
            Finding("never-written", "the kernel never stored anything to its output (is its body still the stub's?)")
        )
    programs = sorted(stored)
    n_programs = int(np.prod(launches[0].grid)) if launches else 0
    if len(programs) > 1 and all(stored[p] == stored[programs[0]] for p in programs):
        findings.append(
            Finding(
                "not-shifted",
                f"all {len(programs)} programs stored to the same {len(stored[programs[0]])} elements of "
                f"{out_name}: the offsets are not shifted by the program id (start at tl.program_id(0) * BLOCK)",
            )
        )
    elif n_programs > 1:
        findings.extend(_unused_axis(stored, launches[0].grid, out_name) or _race(stored, out_name))
    findings.extend(_pid_times_n(accesses, launches, puzzle))
    return findings


def _unused_axis(stored: dict, grid: tuple, out_name: str | None) -> list[Finding]:
    """Programs that differ along one axis only, yet store the same elements: that axis is unused."""
    for axis in range(len(grid)):
        if grid[axis] < 2:
            continue
        same = [
            stored[p] == stored[(*p[:axis], 0, *p[axis + 1 :])]
            for p in stored
            if p[axis] > 0 and (*p[:axis], 0, *p[axis + 1 :]) in stored
        ]
        if same and all(same):
            return [
                Finding(
                    "not-shifted",
                    f"programs that differ only in tl.program_id({axis}) store to the same elements of {out_name}: "
                    f"the offsets do not use program id {axis}",
                )
            ]
    return []


def _collision(access: Access) -> Finding:
    values, counts = np.unique(access.offsets, return_counts=True)
    return Finding(
        "race",
        f"one store of program {access.pid} writes element {int(values[counts.argmax()])} of {access.tensor} from "
        f"{int(counts.max())} lanes at once, and only one of them lands: to add up contributions to the same "
        "element (a histogram), use tl.atomic_add",
    )


def _race(stored: dict, out_name: str | None) -> list[Finding]:
    """Two programs storing to one element: on a GPU they run at once and one update is lost."""
    owner: dict[int, tuple] = {}
    for pid in sorted(stored):
        for element in stored[pid]:
            if element in owner:
                return [
                    Finding(
                        "race",
                        f"programs {owner[element]} and {pid} both store to element {element} of {out_name}. The "
                        "interpreter runs programs one at a time, so this passes on the CPU, but on a GPU they run "
                        "at once and one update is lost: give each element to one program, or use tl.atomic_add",
                    )
                ]
            owner[element] = pid
    return []


def _pid_times_n(accesses: list[Access], launches: list[Launch], puzzle: Puzzle) -> list[Finding]:
    """Program k's block starts at k * (an integer argument) other than k * BLOCK."""
    if puzzle.block_arg is None or not launches:
        return []
    args = launches[0].args
    block = args.get(puzzle.block_arg)
    starts = {}
    for access in accesses:
        if access.kind == "attempt" and access.pid[1:] == (0, 0):
            starts[access.pid[0]] = min(starts.get(access.pid[0], access.first_attempt), access.first_attempt)
    if 1 not in starts or starts[1] == block:
        return []
    step = starts[1] - starts.get(0, 0)
    culprits = [
        name
        for name, value in args.items()
        if name != puzzle.block_arg and isinstance(value, int) and not isinstance(value, bool) and value == step
    ]
    if not culprits:
        return []
    return [
        Finding(
            "pid-times-n",
            f"program 1 starts at element {starts[1]} and program k at k * {culprits[0]} (= {step}): the block "
            f"start should be tl.program_id(0) * {puzzle.block_arg} (= {block}), not * {culprits[0]}",
        )
    ]


# --------------------------------------------------------------------------------------------------
# A whole puzzle
# --------------------------------------------------------------------------------------------------
def check_puzzle(
    puzzle: Puzzle, module, *, device: str = "cpu", seed: int | None = None, cases=None, dtypes=None, progress=None
) -> PuzzleReport:
    """Run every case in every dtype (float32 first) and stop at the first failing case; ``progress(outcome)``, when
    given, is called after each case.

    Under the interpreter, float32 passing and a 16-bit dtype failing adds the bf16-cast diagnosis.
    """
    cases = list(cases if cases is not None else (puzzle.gpu_cases if device == "cuda" else puzzle.cases))
    base_seed = fresh_seed() if seed is None else seed
    report = PuzzleReport(puzzle, [], device, base_seed)
    passed_dtypes = []
    for dtype in dtypes or puzzle.dtypes:
        for index, case in enumerate(cases):
            outcome = run_case(puzzle, module, case, dtype, base_seed + index, device)
            report.outcomes.append(outcome)
            if progress is not None:
                progress(outcome)
            if outcome.ok:
                continue
            if torch.float32 in passed_dtypes and dtype in (torch.bfloat16, torch.float16) and interpreting():
                report.notes.append(
                    Finding(
                        "bf16-no-cast",
                        f"float32 passes but {str(dtype).removeprefix('torch.')} fails. The interpreter computes "
                        "16-bit arithmetic on raw bits (bf16 especially): load, .to(tl.float32), compute in "
                        "float32, and store (the store casts back to the output's dtype)",
                    )
                )
            return report
        passed_dtypes.append(dtype)
    return report
