"""What the interpreter's trace of a run shows (:class:`~tritonkit.puzzles.trace.MemoryTrace`): lanes outside their
tensor (a missing mask), nothing stored, every program storing the same elements (offsets not shifted by the program
id, or one axis of the grid unused), parts of a sum overwriting each other (a plain store where an atomic is needed),
two programs storing one element (a race), program k starting at k * n instead of k * BLOCK, and atomics where the
result must not depend on the order the programs run in."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from tritonkit.puzzles._base import Puzzle
from tritonkit.puzzles.trace import Access, Launch


@dataclass(frozen=True)
class Finding:
    """One observation about a failing case: a stable ``code`` (tests match it) and a message."""

    code: str
    message: str


def trace_findings(accesses: list[Access], out_names: list, launches: list[Launch], puzzle) -> list[Finding]:
    """The mistakes the trace of one run shows; ``out_names``: the kernel argument that received each output,
    ``launches``: the run's launches in order (the accesses' ``launch`` indexes them)."""
    findings = _outside_findings(accesses)
    outputs = {name for name in out_names if name}
    if not any(a.kind in ("store", "atomic") and a.tensor in outputs for a in accesses):
        findings.append(
            Finding("never-written", "the kernel never stored anything to its output (is its body still the stub's?)")
        )
    if puzzle.deterministic and any(a.kind == "atomic" for a in accesses):
        findings.append(
            Finding(
                "atomics-not-deterministic",
                "the result must be the same bits on every run, and atomics add in whatever order the programs run "
                "in (float addition is not associative): store each part to its own place with tl.store, and add "
                "the parts up in a fixed order",
            )
        )
    main = next((index for index, launch in enumerate(launches) if launch.kernel == puzzle.kernel), None)
    out_name = out_names[0] if out_names else None
    for index, launch in enumerate(launches):
        mine = [a for a in accesses if a.launch == index]
        if index != main:
            findings.extend(_buffer_findings(mine, launch.grid, puzzle.deterministic))
            continue
        for access in mine:  # one store writing an element from several lanes: nothing else counts
            if access.kind == "store" and access.tensor == out_name and _repeats(access.offsets):
                return [*findings, _collision(access)]
        findings.extend(_output_findings(mine, out_name, launch.grid, puzzle.deterministic))
        findings.extend(_pid_times_n(mine, [launch], puzzle))
    return findings


def _repeats(offsets: np.ndarray) -> bool:
    return np.unique(offsets).size < offsets.size


def _outside_findings(accesses: list[Access]) -> list[Finding]:
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
    return findings


def _by_program(accesses: list[Access], kind: str, tensor: str | None = None) -> dict[tuple, set]:
    """The elements each program reached with ``kind`` accesses (of ``tensor``; loads: (tensor, element) pairs)."""
    reached: dict[tuple, set] = defaultdict(set)
    for access in accesses:
        if access.kind != kind or (tensor is not None and access.tensor != tensor):
            continue
        if tensor is None:
            reached[access.pid].update((access.tensor, offset) for offset in access.offsets.tolist())
        else:
            reached[access.pid].update(access.offsets.tolist())
    return reached


def _output_findings(accesses: list[Access], out_name: str | None, grid: tuple, deterministic: bool) -> list[Finding]:
    """What the kernel's plain stores to its output show: programs storing the same elements (offsets not shifted, an
    axis unused, or parts of a sum overwriting each other), two programs storing one element."""
    stored = _by_program(accesses, "store", out_name)  # plain stores only: atomics may share elements
    programs = sorted(stored)
    if len(programs) > 1 and all(stored[p] == stored[programs[0]] for p in programs):
        loaded = _by_program(accesses, "load")
        if any(loaded[p] != loaded[programs[0]] for p in programs):
            return [_lost_updates(f"all {len(programs)} programs", out_name, deterministic)]
        return [
            Finding(
                "not-shifted",
                f"all {len(programs)} programs stored to the same {len(stored[programs[0]])} elements of "
                f"{out_name}: the offsets are not shifted by the program id (start at tl.program_id(0) * BLOCK)",
            )
        ]
    if int(np.prod(grid)) > 1:
        return _unused_axis(stored, accesses, grid, out_name, deterministic) or _race(stored, out_name)
    return []


def _buffer_findings(accesses: list[Access], grid: tuple, deterministic: bool) -> list[Finding]:
    """In a launch that does not write the output (the first pass of two): parts overwriting each other in a buffer."""
    for tensor in dict.fromkeys(a.tensor for a in accesses if a.kind == "store"):
        found = _unused_axis(_by_program(accesses, "store", tensor), accesses, grid, tensor, deterministic)
        if found and found[0].code == "lost-updates":
            return found
    return []


def _lost_updates(who: str, tensor: str | None, deterministic: bool) -> Finding:
    fix = (
        "Give each part its own place (each program its own slice of the buffer)"
        if deterministic
        else "Add the parts with tl.atomic_add into a zeroed output, or give each part its own place in a buffer "
        "and add them up in a second kernel"
    )
    return Finding(
        "lost-updates",
        f"{who} store to the same elements of {tensor}, each its own part (they load different inputs): a plain "
        "tl.store keeps only one part. The interpreter runs the programs one after the other, so the last store "
        f"wins; on a GPU they run at once and updates are lost. {fix}",
    )


def _unused_axis(stored: dict, accesses: list[Access], grid: tuple, out_name: str | None, deterministic: bool):
    """Programs that differ along one axis only, yet store the same elements: that axis is unused, or (when they
    load different inputs) each computes a part of the same outputs and the plain stores lose all but one."""
    for axis in range(len(grid)):
        if grid[axis] < 2:
            continue
        pairs = [
            (p, (*p[:axis], 0, *p[axis + 1 :]))
            for p in stored
            if p[axis] > 0 and (*p[:axis], 0, *p[axis + 1 :]) in stored
        ]
        if not pairs or not all(stored[p] == stored[q] for p, q in pairs):
            continue
        loaded = _by_program(accesses, "load")
        if any(loaded[p] != loaded[q] for p, q in pairs):
            return [_lost_updates(f"programs that differ only in tl.program_id({axis})", out_name, deterministic)]
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
