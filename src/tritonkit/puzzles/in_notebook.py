"""The puzzle checker from inside a notebook: ``check(N, globals())`` runs puzzle N on the kernel and launcher the
notebook's cells define, ``hint(N)`` prints its hints (the cells :func:`tritonkit.notebooks.puzzle_notebook` writes
call them)."""

from __future__ import annotations

from tritonkit._core.env import interpreting
from tritonkit.puzzles import get
from tritonkit.puzzles.checker import check_puzzle
from tritonkit.puzzles.cli import main, print_case, print_diagnosis


class _Cells:
    """A notebook's global namespace seen as the learner's module: the checker reads the launcher and swaps the
    kernel for a recording stand-in, in the globals the launcher's cell looks the kernel up in."""

    def __init__(self, namespace: dict, source_file: str | None):
        object.__setattr__(self, "_namespace", namespace)
        object.__setattr__(self, "__file__", source_file)

    def __getattr__(self, name: str):
        try:
            return self._namespace[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name: str, value) -> None:
        self._namespace[name] = value


def check(number: int, namespace: dict, *, seed: int | None = None) -> None:
    """Check puzzle ``number`` on the kernel and launcher defined in ``namespace`` (a notebook's ``globals()``), on
    the GPU's cases when kernels are compiled, else under the interpreter; print the report as ``tritonkit puzzles
    check`` does, ending with PASSED or FAILED."""

    puzzle = get(number)
    kernel = namespace.get(puzzle.kernel)
    source = getattr(getattr(kernel, "fn", None), "__code__", None)
    module = _Cells(namespace, source.co_filename if source else None)
    device = "cpu" if interpreting() else "cuda"
    where = "compiled on the GPU" if device == "cuda" else "under the Triton interpreter on the CPU"
    print(f"Puzzle {number}: {puzzle.title}, checked {where}, with fresh random inputs (outputs start as NaN).")
    report = check_puzzle(puzzle, module, device=device, seed=seed, progress=print_case)
    print_diagnosis(report, f"check({number}, globals(), seed={{seed}})", f"hint({number})")
    print("  PASSED" if report.ok else "  FAILED")


def hint(number: int, level: int = 1) -> None:
    """The first ``level`` hints of puzzle ``number``, as ``tritonkit puzzles hint``."""
    main(["hint", str(number), "--level", str(level)])
