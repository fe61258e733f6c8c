"""``tritonkit puzzles list | init DIR | check DIR [N] | hint N [--level K] | solution N``.

Nothing here defines a kernel at import: the puzzle modules are imported after ``check`` has chosen
the interpreter (``--device cpu``, the default) or the compiled path (``--device cuda``).
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
from pathlib import Path

_RULE = "-" * 72


def _puzzles():
    from tritonkit.puzzles import all_puzzles

    return all_puzzles()


def _lookup(number: int):
    """The puzzle numbered ``number``, or None after saying on stderr that there is no such puzzle."""
    from tritonkit.puzzles import get

    try:
        return get(number)
    except ValueError as error:
        print(error, file=sys.stderr)
        return None


def _cmd_list(args) -> int:
    for puzzle in _puzzles():
        dtypes = ", ".join(str(d).removeprefix("torch.") for d in puzzle.dtypes)
        print(f"{puzzle.number:>2}  {puzzle.title:<46} {dtypes}")
    print("\n`tritonkit puzzles init DIR` writes them all; `tritonkit puzzles check DIR N` checks number N.")
    return 0


def _cmd_init(args) -> int:
    folder = Path(args.dir)
    folder.mkdir(parents=True, exist_ok=True)
    written, kept = [], []
    for puzzle in _puzzles():
        path = folder / puzzle.file_name
        if args.notebook:
            path = path.with_suffix(".ipynb")
        if path.exists() and not args.force:
            kept.append(path.name)
            continue
        if args.notebook:
            from tritonkit import notebooks

            notebooks.write(notebooks.puzzle_notebook(puzzle), path)
        else:
            path.write_text(puzzle.stub_text())
        written.append(path.name)
    print(f"Wrote {len(written)} puzzles to {folder}/" + (f" (kept {len(kept)} you already have)" if kept else ""))
    first = folder / _puzzles()[0].file_name
    if args.notebook:
        print(f"Open {first.with_suffix('.ipynb')} in Jupyter: fill in the kernel, then run the checker cell")
    else:
        print(f"Start with {first}: fill in the kernel, then run")
        print(f"    tritonkit puzzles check {folder} 1")
    return 0


def _find_file(folder: Path, puzzle) -> Path | None:
    path = folder / puzzle.file_name
    return path if path.exists() else None


def _use_device(device: str) -> str | None:
    """Set the interpreter on or off before any kernel is defined; a reason when the device is unusable."""
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
        return None
    import torch

    if not torch.cuda.is_available():
        return "--device cuda needs a CUDA GPU; none was found (the default, --device cpu, needs none)"
    os.environ.pop("TRITON_INTERPRET", None)
    return None


def print_case(outcome) -> None:
    """One case's line, printed as soon as it has run."""
    print(f"  {outcome.label():<32} seed {outcome.seed:<10} {'pass' if outcome.ok else 'FAIL'}", flush=True)


def print_diagnosis(report, replay: str, stuck: str) -> None:
    """What went wrong in the first failing case, if any; ``replay`` says how to run it again ("{seed}" stands for
    its seed), ``stuck`` where the hints are."""
    failing = next((o for o in report.outcomes if not o.ok), None)
    if failing is None:
        return
    print("  What went wrong:")
    for finding in report.notes + failing.findings:
        first, *rest = finding.message.splitlines()
        print(textwrap.fill(first, width=100, initial_indent="  - ", subsequent_indent="    "))
        for line in rest:
            print(f"    {line}")
    print(f"  Replay this case: {replay.replace('{seed}', str(report.seed))}")
    print(f"  Stuck? {stuck}")


def _cmd_check(args) -> int:
    reason = _use_device(args.device)
    if reason:
        print(reason, file=sys.stderr)
        return 2
    from tritonkit.puzzles.checker import check_puzzle, load_file

    folder = Path(args.dir)
    if not folder.is_dir():
        print(f"{folder} is not a folder: create it with `tritonkit puzzles init {folder}`", file=sys.stderr)
        return 2
    chosen = list(_puzzles()) if args.number is None else [_lookup(args.number)]  # 0 is a number, out of range
    if None in chosen:
        return 2
    where = "compiled on the GPU" if args.device == "cuda" else "under the Triton interpreter on the CPU"
    print(f"Checking {where}, with fresh random inputs (outputs start as NaN).", flush=True)
    passed, failed, untouched = [], [], []
    for puzzle in chosen:
        path = _find_file(folder, puzzle)
        if path is None:
            print(f"\nPuzzle {puzzle.number} ({puzzle.title}): no {puzzle.file_name} in {folder}")
            failed.append(puzzle.number)
            continue
        if args.number is None and path.read_text() == puzzle.stub_text():
            untouched.append(puzzle.number)
            continue
        print(f"\nPuzzle {puzzle.number}: {puzzle.title}  ({path})", flush=True)
        try:
            module = load_file(path)
        except Exception as error:  # the learner's file does not even import: say where
            print(f"  FAIL: the file does not import: {type(error).__name__}: {error}")
            failed.append(puzzle.number)
            continue
        report = check_puzzle(puzzle, module, device=args.device, seed=args.seed, progress=print_case)
        number = report.puzzle.number
        print_diagnosis(report, f"tritonkit puzzles check {path.parent} {number} --seed {{seed}}",
                        f"tritonkit puzzles hint {number}")  # fmt: skip
        (passed if report.ok else failed).append(puzzle.number)
        print(f"  {'PASSED' if report.ok else 'FAILED'}")
    print(
        f"\n{_RULE}\n{len(passed)} passed, {len(failed)} failed"
        + (f", {len(untouched)} not started" if untouched else "")
    )
    if passed and not failed and args.number is None:
        print("Next: the first puzzle not started, or `tritonkit learn` for the lessons.")
    return 1 if failed or not passed else 0


def _cmd_hint(args) -> int:
    puzzle = _lookup(args.number)
    if puzzle is None:
        return 2
    hints = puzzle.hints
    level = min(max(args.level, 1), len(hints))
    print(f"Puzzle {puzzle.number}: {puzzle.title} (hints 1 to {level} of {len(hints)})")
    for index, hint in enumerate(hints[:level], start=1):
        print(textwrap.fill(hint, width=100, initial_indent=f"{index}. ", subsequent_indent="   "))
    if level < len(hints):
        print(f"More: tritonkit puzzles hint {puzzle.number} --level {level + 1}")
    return 0


def _cmd_solution(args) -> int:
    puzzle = _lookup(args.number)
    if puzzle is None:
        return 2
    print(puzzle.solution_text(), end="")
    return 0


def add_parser(sub) -> None:
    """Add ``puzzles`` and its subcommands to the main CLI's subparsers."""
    puzzles = sub.add_parser(
        "puzzles",
        help="Triton puzzles with a checker that explains mistakes",
        description="Write small Triton kernels, from a vector add to flash attention, quantization, split-K and "
        "a paged KV cache. `init` writes the stubs, "
        "`check` runs your kernels on random cases (under the interpreter on the CPU by default) and names the "
        "mistakes it sees, `hint` and `solution` help.",
    )
    commands = puzzles.add_subparsers(dest="puzzles_command", required=True, metavar="COMMAND")
    commands.add_parser("list", help="the puzzles, in order").set_defaults(run=_cmd_list)
    init = commands.add_parser("init", help="write the puzzle stubs into DIR")
    init.add_argument("dir", help="folder for your puzzle files (created if needed)")
    init.add_argument("--force", action="store_true", help="overwrite files that exist (your work is lost)")
    init.add_argument("--notebook", action="store_true", help="write Jupyter notebooks, one per puzzle, instead")
    init.set_defaults(run=_cmd_init)
    check = commands.add_parser("check", help="check your kernels in DIR (all, or number N)")
    check.add_argument("dir", help="the folder `init` wrote")
    check.add_argument("number", nargs="?", type=int, help="only this puzzle")
    check.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cpu: the interpreter (default)")
    check.add_argument("--seed", type=int, help="replay the inputs of a failing case")
    check.set_defaults(run=_cmd_check)
    hint = commands.add_parser("hint", help="hints for puzzle N, one more per level")
    hint.add_argument("number", type=int)
    hint.add_argument("--level", type=int, default=1, help="how many hints to show (default 1)")
    hint.set_defaults(run=_cmd_hint)
    solution = commands.add_parser("solution", help="print the reference solution of puzzle N")
    solution.add_argument("number", type=int)
    solution.set_defaults(run=_cmd_solution)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tritonkit")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.run(args)
