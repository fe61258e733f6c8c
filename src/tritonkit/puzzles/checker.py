"""The puzzle checker: run a learner's kernel on random cases and say what is wrong, by watching it.

For each case the checker draws inputs, fills the outputs with poison (NaN, or an integer no answer
holds), and calls the learner's launcher inside :func:`tritonkit.debug.guard_bounds`, which pads every
tensor with sentinels and reports reads and writes outside them. Around the launch it

* counts launches of the learner's kernels (a launcher that computes the answer with torch and never
  launches, or changes the output after the kernel ran, is caught) and notes whether an output that
  the kernel adds into still held the poison when it started (not zeroed),
* under the interpreter, records every load, store and atomic by program (:class:`MemoryTrace`):
  which elements each program touched, which lanes fell outside their tensor, and stops an access
  that would land outside every launched tensor before it crashes the process.

Mistakes are named from what was observed (:mod:`tritonkit.puzzles.trace_findings`): every program
storing the same elements (offsets not shifted by the program id), parts of a sum overwriting each
other (a plain store where an atomic is needed), program k starting at k * n instead of k * BLOCK,
lanes past the end (a missing mask), outputs never written, loads of input elements a puzzle puts
off limits, and float32 passing where bfloat16 fails under the interpreter (bf16 arithmetic without a
cast). Under the interpreter "never written" means no store reached the element (a stored NaN is a
wrong value); compiled, it means the element still holds the poison.

A puzzle may also name its classic mistakes (:class:`~tritonkit.puzzles._base.Probe`): when a case fails on its
values alone, the learner's kernel runs again on inputs designed to make each mistake show, and its output is
compared with what a kernel making each mistake would output; the one it matches is named (flash attention: no
maximum subtracted before exp, a running sum or accumulator not rescaled, a causal mask off by one; quantization:
a scale per tensor, codes truncated, no clamp; a page off by one).
"""

from __future__ import annotations

import importlib.util
import math
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from tritonkit._core.env import interpreting
from tritonkit.debug import guard_bounds
from tritonkit.puzzles._base import Puzzle, as_outputs
from tritonkit.puzzles.trace import Access, LaunchRecorder, MemoryTrace, WildAccessError
from tritonkit.puzzles.trace_findings import Finding, trace_findings
from tritonkit.testing import compare, fresh_seed, upcast

_INT_POISON = -(2**31) + 7  # an integer output the kernel never wrote keeps this value (narrower: its type's end)
_SHOW_POSITIONS = 5


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
    """What an output starts as: NaN, or an integer no answer holds (int8: -128, outside [-127, 127])."""
    if dtype.is_floating_point:
        return float("nan")
    info = torch.iinfo(dtype)
    if info.bits >= 32:
        return _INT_POISON
    return info.min if info.min < 0 else info.max


def _allocate_outputs(puzzle: Puzzle, case: dict, dtype: torch.dtype, device: str) -> tuple[torch.Tensor, ...]:
    return tuple(
        torch.full(shape, _poison(out_dtype), dtype=out_dtype, device=device)
        for _, shape, out_dtype in puzzle.output_specs(case, dtype)
    )


def _holds_poison(tensor: torch.Tensor) -> bool:
    if tensor.dtype.is_floating_point:
        return bool(torch.isnan(tensor).any())
    return bool((tensor == _poison(tensor.dtype)).any())


def _unwritten(out: torch.Tensor, expected: torch.Tensor, stored: torch.Tensor | None) -> torch.Tensor:
    """The outputs the kernel never wrote and that should differ from the poison. With the trace's ``stored`` (which
    elements a store or atomic reached), exactly those not stored: a stored NaN is a written, wrong value. Without
    it (compiled), those still holding the poison, which a stored NaN cannot be told apart from."""
    poison = _poison(out.dtype)
    poison_is_wrong = ~torch.isnan(expected) if out.dtype.is_floating_point else expected != poison
    if stored is not None:
        return ~stored & poison_is_wrong
    if out.dtype.is_floating_point:
        return torch.isnan(out) & poison_is_wrong
    return out == poison


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
    outs = _allocate_outputs(puzzle, case, dtype, device)
    launcher = getattr(module, puzzle.launcher, None)
    if launcher is None:
        outcome.findings.append(Finding("no-launcher", f"the file defines no function named {puzzle.launcher}"))
        return outcome
    inputs_before = [t.clone() for t in inputs]
    trace = MemoryTrace() if MemoryTrace.available() else None
    try:
        recorder = LaunchRecorder(module, puzzle.kernels, trace, _holds_poison)
    except AttributeError as error:
        outcome.findings.append(Finding("no-kernel", str(error)))
        return outcome
    runs = []
    kwargs = puzzle.launcher_kwargs(case)
    n_outs = len(outs)

    def launch(*views):
        recorder.begin(views[-n_outs:])
        if trace is not None:
            trace.enabled = not runs  # the first run (NaN padding) is traced; the second only guarded
        returned = launcher(*views, **kwargs)
        runs.append((views, returned, list(recorder.launches), recorder.after_last_launch))
        return returned

    try:
        with recorder:
            if trace is not None:
                with trace:
                    bounds = guard_bounds(launch, *inputs, *outs)
            else:
                bounds = guard_bounds(launch, *inputs, *outs)
    except Exception as error:
        root = _root_error(error)
        where = _learner_line(error, getattr(module, "__file__", None))
        code = "wild-access" if isinstance(root, WildAccessError) else "exception"
        outcome.findings.append(Finding(code, f"{type(root).__name__}: {root}{where}"))
        return outcome

    views, returned, launches, after_last_launch = runs[0]
    traced_outs = views[-n_outs:]
    results = _results(traced_outs, returned)
    main = [record for record in launches if record.kernel == puzzle.kernel]
    findings = outcome.findings
    if not main:
        findings.append(
            Finding(
                "never-launched",
                f"{puzzle.launcher} never launched {puzzle.kernel}: the output did not come from your kernel "
                "(a launcher must launch the kernel, kernel[grid](...), not compute the answer with torch)",
            )
        )
    elif any(
        not torch.equal(_bits_or_self(after), _bits_or_self(view))
        for after, view in zip(after_last_launch, traced_outs, strict=True)
    ):
        findings.append(
            Finding(
                "written-outside-kernel",
                f"{puzzle.launcher} changed the output after {puzzle.kernel} ran: the answer must come from the kernel",
            )
        )
    names = [f"{name}: " if n_outs > 1 else "" for name in puzzle.outputs]
    for name, result, want, out in zip(names, results, expected, outs, strict=True):
        if result.shape != want.shape:
            findings.append(
                Finding("shape-mismatch", f"{name}output shape {tuple(result.shape)}, expected {tuple(want.shape)}")
            )
            return outcome
        if result.dtype != out.dtype:
            findings.append(Finding("dtype-mismatch", f"{name}output dtype {result.dtype}, expected {out.dtype}"))
            return outcome
    for position, (before, tensor) in enumerate(zip(inputs_before, inputs, strict=True)):
        if not torch.equal(_bits_or_self(before), _bits_or_self(tensor)):
            findings.append(Finding("input-modified", f"input {position} was changed: the kernel wrote into it"))
    stored = [None] * n_outs
    if trace is not None:
        out_names = (trace.out_names + [None] * n_outs)[:n_outs]  # None: no launch received that output
        findings.extend(trace_findings(trace.accesses, out_names, launches, puzzle))
        for index, (result, view) in enumerate(zip(results, traced_outs, strict=True)):
            if result is view:  # the traced output; a tensor the launcher returned instead was not traced
                stored[index] = _stored_elements(trace.accesses, out_names[index], result)
    if trace is None and puzzle.accumulates and any(out.dtype.is_floating_point for out in outs):
        # Compiled, float atomics add in a different order in the guard's two runs: outputs differing between
        # them are not a read outside the tensors here (writes outside still show).
        bounds.oob_reads.clear()
    if not bounds.ok and not any(f.code == "missing-mask" for f in findings):
        findings.append(Finding("out-of-bounds", f"the guard saw accesses outside the tensors:\n{bounds}"))
    values = []
    for name, result, want, written in zip(names, results, expected, stored, strict=True):
        values += _value_findings(puzzle, case, dtype, device, result, want, main, outcome, written, name)
    if values and puzzle.accumulates and main and main[0].poisoned:
        findings.append(_not_zeroed(puzzle))
    off_limits = [] if trace is None else _off_limits(puzzle, case, inputs, views, trace.accesses, launches)
    named = []
    if not findings and any(f.code == "wrong-values" for f in values):  # in bounds, launched, only values wrong
        named = _named_mistakes(puzzle, module, case, dtype, seed, device)
    findings.extend(named or off_limits)
    findings.extend(values)
    return outcome


def _off_limits(puzzle: Puzzle, case: dict, inputs: tuple, views: tuple, accesses, launches) -> list[Finding]:
    """Loads of input elements the puzzle puts off limits (traced run: ``views`` are the tensors its launcher got)."""
    if puzzle.off_limits is None:
        return []
    masks = puzzle.off_limits.elements(case, *inputs)
    positions = {view.data_ptr(): index for index, view in enumerate(views[: len(inputs)])}
    for access in accesses:
        if access.kind != "load":
            continue
        tensor = launches[access.launch].args.get(access.tensor)
        index = positions.get(tensor.data_ptr()) if isinstance(tensor, torch.Tensor) else None
        if index is None or masks[index] is None or not inputs[index].is_contiguous():
            continue
        flat = masks[index].reshape(-1).cpu()
        offsets = access.offsets[(access.offsets >= 0) & (access.offsets < flat.numel())]
        count = int(flat[torch.from_numpy(offsets.astype(np.int64))].sum())
        if count:
            return [
                Finding(
                    puzzle.off_limits.code,
                    f"{puzzle.off_limits.message} (program {access.pid} loaded {count} such elements of "
                    f"{access.tensor})",
                )
            ]
    return []


def _results(traced_outs, returned) -> list[torch.Tensor]:
    """The outputs to check: the tensors passed to the launcher, or what it returned instead of them."""
    returned = (returned,) if isinstance(returned, torch.Tensor) else returned
    if not isinstance(returned, (tuple, list)) or len(returned) != len(traced_outs):
        return list(traced_outs)
    return [r if isinstance(r, torch.Tensor) else out for r, out in zip(returned, traced_outs, strict=True)]


def _not_zeroed(puzzle: Puzzle) -> Finding:
    return Finding(
        "not-zeroed",
        f"the output was not zeroed before {puzzle.kernel} added into it: it still held the checker's poison when "
        "the kernel started, and tl.atomic_add adds to whatever is there. Zero it first (out.zero_() in the "
        "launcher, before the launch)",
    )


def _bits_or_self(tensor: torch.Tensor | None) -> torch.Tensor | None:
    """Integers of the same width, so that NaN compares equal to the same NaN."""
    if tensor is None or not tensor.dtype.is_floating_point:
        return tensor
    return tensor.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[tensor.element_size()])


def _value_findings(puzzle, case, dtype, device, result, expected, launches, outcome, stored, name="") -> list[Finding]:
    """What is wrong in one output (``name``: its label in messages, empty for a puzzle with one output)."""
    tolerance = puzzle.tolerance_for(case, dtype, device)
    comparison = compare(result, expected, tolerance)
    outcome.max_abs_err = max(outcome.max_abs_err, comparison.max_abs_err)
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
        findings.append(
            Finding("never-written", f"{name}the kernel wrote nothing: every output still holds the poison")
        )
    elif n_unwritten:
        first = [_where(tuple(i)) for i in unwritten.nonzero()[:_SHOW_POSITIONS].tolist()]
        findings.append(
            Finding(
                "never-written",
                f"{name}{n_unwritten} of {result.numel()} outputs were never written (first at {', '.join(first)})",
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
                f"{name}{int(wrong.sum())} of {result.numel()} outputs are wrong (tolerance atol={tolerance.atol:.2g}, "
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
        results, launch_args = ran
        expected = puzzle.expected(probe.case, inputs)
        tolerance = puzzle.tolerance_for(probe.case, dtype, device)
        if any(r.shape != e.shape for r, e in zip(results, expected, strict=True)) or all(
            compare(r, e, tolerance).ok for r, e in zip(results, expected, strict=True)
        ):
            continue
        best = None
        for mistake in probe.mistakes:
            variant = as_outputs(mistake.reference(*upcast(inputs), case=probe.case, launch=launch_args))
            share, overall = _shared_share(results, expected, variant, tolerance)
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


def _run_probe(puzzle: Puzzle, module, case: dict, dtype, device, inputs) -> tuple[tuple, dict] | None:
    """The learner's outputs on a probe's inputs and its kernel's arguments; None when the launcher raised or never
    launched the kernel (the failing case already reports what broke: a probe only names a mistake)."""
    outs = _allocate_outputs(puzzle, case, dtype, device)
    trace = MemoryTrace() if MemoryTrace.available() else None
    recorder = LaunchRecorder(module, puzzle.kernels, trace)
    recorder.begin(outs)
    launcher = getattr(module, puzzle.launcher)
    try:
        with recorder:
            if trace is None:
                returned = launcher(*inputs, *outs, **puzzle.launcher_kwargs(case))
            else:
                # Not recorded, but an access far outside every tensor is still stopped before it crashes.
                trace.enabled = False
                with trace:
                    returned = launcher(*inputs, *outs, **puzzle.launcher_kwargs(case))
    except Exception:
        return None
    main = [record for record in recorder.launches if record.kernel == puzzle.kernel]
    if not main:
        return None
    return tuple(_results(outs, returned)), main[0].args


def _shared_share(results, expected, variants, tolerance) -> tuple[float, float]:
    """How often the learner's outputs equal a mistake's (``variants``) within the tolerance: the share of the
    elements where the mistake's output differs from ``expected``, and of all elements, over every output.
    Infinities and NaN count as one value: a softmax that overflows gives inf or NaN depending on the signs it
    meets. In an integer output a NaN of the mistake's stands for any value (see Mistake)."""

    def canonical(tensor):
        tensor = tensor.detach().to("cpu", torch.float64)
        return torch.where(torch.isfinite(tensor), tensor, math.nan)

    changed_total = same_changed = same_total = elements = 0
    for result, want, variant in zip(results, expected, variants, strict=True):
        integer = not result.dtype.is_floating_point
        result, want, variant = canonical(result), canonical(want), canonical(variant)
        changed = ~torch.isclose(variant, want, tolerance.rtol, tolerance.atol, equal_nan=True)
        same = torch.isclose(result, variant, tolerance.rtol, tolerance.atol, equal_nan=True)
        if integer:  # where the mistake leaves the value undefined, it changes it only if the learner's is wrong
            undefined = torch.isnan(variant)
            right = torch.isclose(result, want, tolerance.rtol, tolerance.atol, equal_nan=True)
            changed = torch.where(undefined, ~right, changed)
            same |= undefined
        changed_total += int(changed.sum())
        same_changed += int(same[changed].sum())
        same_total += int(same.sum())
        elements += same.numel()
    if not changed_total:
        return 0.0, 0.0
    return same_changed / changed_total, same_total / elements


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
