"""Jupyter notebooks (nbformat 4) of the lessons and the puzzles, built from the same source files.

``tritonkit learn N --notebook DIR`` and ``tritonkit puzzles init DIR --notebook`` write them. A Python source
becomes cells: its docstring a markdown cell, each function or class a code cell (with the comments just above
it), the statements between them one code cell each run, and a comment banner (a title between two ``# ----``
lines) a markdown heading. A notebook starts with a cell that turns the Triton interpreter on when there is no GPU,
since that must happen before any kernel is defined.

One notebook per puzzle, as one file per puzzle: each stands alone (its kernel, launcher and checker cell), so
"Run all" in one puzzle never stops at an unsolved one, and a restarted kernel re-runs one puzzle only. The
checker cell calls :func:`check`, which runs the same checker as ``tritonkit puzzles check`` on the kernel and
launcher defined in the notebook.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

_BANNER = re.compile(r"^# -{20,}$")
SETUP_SOURCE = """\
# Without a GPU, kernels run through Triton's interpreter; it must be turned on before any kernel is defined.
from tritonkit._core.env import enable_interpreter_if_no_gpu

enable_interpreter_if_no_gpu()"""


def _is_docstring(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def _skipped(node: ast.stmt) -> bool:
    """``from __future__`` (a notebook cell runs as its own module body) and the ``if __name__ == "__main__":``
    block (a notebook's __name__ is "__main__": the notebook's last cell runs the code instead)."""
    if isinstance(node, ast.ImportFrom) and node.module == "__future__":
        return True
    return isinstance(node, ast.If) and "__name__" in ast.unparse(node.test)


def source_cells(text: str) -> list[tuple[str, str]]:
    """("markdown" | "code", source) cells of a Python module's text (see the module docstring)."""
    lines = text.splitlines()
    body = ast.parse(text).body
    cells: list[tuple[str, str]] = []
    if body and _is_docstring(body[0]):
        cells.append(("markdown", ast.get_docstring(ast.Module(body=body[:1], type_ignores=[]), clean=True)))
        body = body[1:]
    previous_end = 0
    pending: list[int] = []  # first and last line of consecutive plain statements: one cell, blank lines kept

    def flush() -> None:
        if pending:
            cells.append(("code", "\n".join(lines[pending[0] - 1 : pending[-1]])))
            pending.clear()

    for node in body:
        start = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
        gap = lines[previous_end : start - 1]
        previous_end = node.end_lineno
        rules = [i for i, line in enumerate(gap) if _BANNER.match(line)]
        if len(rules) >= 2:  # a section title between two rules
            flush()
            cells.append(("markdown", "## " + " ".join(line.lstrip("# ") for line in gap[rules[0] + 1 : rules[-1]])))
            gap = gap[rules[-1] + 1 :]
        while gap and gap[-1].startswith("#"):  # the comment lines right above the node belong to it
            gap.pop()
            start -= 1
        if _skipped(node):
            continue
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            flush()
            cells.append(("code", "\n".join(lines[start - 1 : node.end_lineno])))
        else:
            pending[:] = [pending[0] if pending else start, node.end_lineno]
    flush()
    return cells


def build(cells: list[tuple[str, str]]):
    """An nbformat 4 notebook of the cells, for a Python 3 kernel."""
    import nbformat

    notebook = nbformat.v4.new_notebook()
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    notebook.metadata["language_info"] = {"name": "python"}
    for kind, source in cells:
        make = nbformat.v4.new_markdown_cell if kind == "markdown" else nbformat.v4.new_code_cell
        notebook.cells.append(make(source))
    return notebook


def write(notebook, path: Path) -> Path:
    import nbformat

    nbformat.validate(notebook)
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, str(path))
    return path


# --------------------------------------------------------------------------------------------------
# Lessons
# --------------------------------------------------------------------------------------------------
def lesson_notebook(module_name: str, number: int):
    """Lesson ``number``'s notebook: its text as markdown, its code in cells, and a last cell that runs it and shows
    the images it wrote."""
    import importlib.util

    origin = Path(importlib.util.find_spec(module_name).origin)
    cells = source_cells(origin.read_text())
    title, _, text = cells[0][1].partition("\n")
    out_dir = f"{origin.stem}_out"
    setup = SETUP_SOURCE
    if "__file__" in origin.read_text():  # the lesson reads files beside its module (a committed benchmark)
        setup += f"\n__file__ = {str(origin)!r}  # the lesson's module, for the files it reads beside it"
    return build([
        ("markdown", f"# Lesson {number}. {title}\n{text}"),
        ("code", setup),
        *cells[1:],
        ("markdown", f"## Run the lesson\n\n`run(out_dir)` runs every step; images and plots go to `{out_dir}/`."),
        ("code", f"from pathlib import Path\n\nfrom IPython.display import Image, display\n\nrun({out_dir!r})\n"
                 f"for png in sorted(Path({out_dir!r}).glob('*.png')):\n    display(Image(filename=str(png)))"),
    ])  # fmt: skip


# --------------------------------------------------------------------------------------------------
# Puzzles
# --------------------------------------------------------------------------------------------------
def puzzle_notebook(puzzle, *, solution: bool = False):
    """Puzzle's notebook: its text, the imports, the kernel stub (the solution with ``solution``), the launcher,
    and a cell that runs the checker on them."""
    cells = source_cells(puzzle.solution_text() if solution else puzzle.stub_text())
    text = cells[0][1]
    title, _, rest = text.partition("\n")
    kernel_cell = next(i for i, (kind, source) in enumerate(cells) if f"def {puzzle.kernel}(" in source)
    return build([
        ("markdown", f"# {title}\n{rest}"),
        ("code", SETUP_SOURCE),
        *cells[1:kernel_cell],
        ("markdown", "## Your kernel\n\nFill in the body, run the cell, then run the checker below."),
        cells[kernel_cell],
        ("markdown", "## The launcher (given)\n\nThe checker calls it with the inputs and an output that starts as "
                     "NaN; keep its signature."),
        *cells[kernel_cell + 1 :],
        ("markdown", f"## Check\n\nFresh random inputs each run; the report names the mistakes it sees. "
                     f"`hint({puzzle.number}, level=2)` shows hints, `check({puzzle.number}, globals(), seed=...)` "
                     "replays a failing case."),
        ("code", f"from tritonkit.puzzles.in_notebook import check, hint\n\ncheck({puzzle.number}, globals())"),
    ])  # fmt: skip
