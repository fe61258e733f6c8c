"""The lessons and puzzles as Jupyter notebooks: written by the CLI (nbformat 4), run headless by nbclient in a fresh
Python kernel, which inherits the suite's TRITON_INTERPRET=1.

One lesson (4: its kernel, and the image it writes shown by the last cell) and puzzle 1: its stub notebook run as
written shows the checker's diagnosis, and with the solution's kernel pasted into the kernel cell it passes.
"""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

import tritonkit
from tritonkit import notebooks
from tritonkit.cli import main
from tritonkit.puzzles import get


@pytest.fixture(autouse=True)
def _kernels_import_this_tritonkit(monkeypatch):
    """The notebook's kernel is a new process: it must import the tritonkit under test, whatever is installed."""
    here = str(Path(tritonkit.__file__).resolve().parents[1])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")])))


def _execute(notebook, folder) -> tuple[str, list[str]]:
    """Run every cell in a new kernel started in ``folder``; the printed text and the MIME types displayed."""
    NotebookClient(
        notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(folder)}}
    ).execute()
    outputs = [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs]
    printed = "".join(output.get("text", "") for output in outputs if output.output_type == "stream")
    displayed = [kind for output in outputs if output.output_type == "display_data" for kind in output.data]
    return printed, displayed


def test_source_cells_split_a_module_at_its_definitions_and_sections():
    text = '''"""Title.

Text."""

from __future__ import annotations

import os

N = 3  # why three


# --------------------------------------------------------------------------------------------------
# (a) first part
# --------------------------------------------------------------------------------------------------
# what f is for
@decorator
def f():
    return N


if __name__ == "__main__":
    f()
'''
    assert notebooks.source_cells(text) == [
        ("markdown", "Title.\n\nText."),
        ("code", "import os\n\nN = 3  # why three"),
        ("markdown", "## (a) first part"),
        ("code", "# what f is for\n@decorator\ndef f():\n    return N"),
    ]


def test_a_lesson_notebook_runs(tmp_path, capsys):
    assert main(["learn", "4", "--notebook", str(tmp_path)]) == 0
    path = tmp_path / "lesson_04_greyscale_image.ipynb"
    assert str(path) in capsys.readouterr().out
    notebook = nbformat.read(path, as_version=4)
    nbformat.validate(notebook)
    assert notebook.cells[0].cell_type == "markdown" and notebook.cells[0].source.startswith("# Lesson 4. ")
    printed, displayed = _execute(notebook, tmp_path)
    assert "equal to the integer reference" in printed
    assert (tmp_path / "lesson_04_greyscale_image_out" / "grace_hopper_grey.png").exists()
    assert "image/png" in displayed  # the last cell shows the greyscale image


def test_a_puzzle_notebook_fails_on_the_stub_and_passes_with_the_solution(tmp_path):
    assert main(["puzzles", "init", str(tmp_path), "--notebook"]) == 0
    path = tmp_path / "puzzle_01_vector_add.ipynb"
    assert not (tmp_path / "puzzle_01_vector_add.py").exists()
    printed, _ = _execute(nbformat.read(path, as_version=4), tmp_path)
    assert "the kernel never stored anything to its output" in printed
    assert "Replay this case: check(1, globals(), seed=" in printed and printed.rstrip().endswith("FAILED")

    notebook = nbformat.read(path, as_version=4)
    kernel = get(1).kernel
    (index,) = [i for i, cell in enumerate(notebook.cells) if f"def {kernel}(" in cell.source]
    assert "TODO" in notebook.cells[index].source
    (solution,) = [code for kind, code in notebooks.source_cells(get(1).solution_text()) if f"def {kernel}(" in code]
    notebook.cells[index].source = solution
    printed, _ = _execute(notebook, tmp_path)
    assert "FAIL" not in printed and printed.rstrip().endswith("PASSED")
