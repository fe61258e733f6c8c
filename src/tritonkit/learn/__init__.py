"""The practitioner's guide as runnable lessons: ``tritonkit learn`` lists them, ``tritonkit learn N``
prints lesson N and runs it (through the interpreter on a machine without a GPU, compiled on one).

Each lesson is one module ``lesson_NN_<slug>.py``: its docstring is the text, ``run(out_dir)`` the
code, so the text and the code cannot drift apart. ``python -m tritonkit.learn.lesson_01_...`` runs one
directly (set ``TRITON_INTERPRET=1`` first on a machine without a GPU).
"""

from __future__ import annotations

import importlib
import pkgutil
import re
import sys
from pathlib import Path

_NAME = re.compile(r"^lesson_(\d\d)_(\w+)$")


def lessons() -> list[tuple[int, str]]:
    """(number, module name) of every lesson, in order."""
    found = [
        (int(match.group(1)), f"{__name__}.{info.name}")
        for info in pkgutil.iter_modules(__path__)
        if (match := _NAME.match(info.name))
    ]
    return sorted(found)


def title(module_name: str) -> str:
    """The first line of the lesson's docstring, read without importing it (importing defines kernels)."""
    spec = importlib.util.find_spec(module_name)
    text = Path(spec.origin).read_text()
    return text.split('"""', 2)[1].strip().splitlines()[0]


def pyplot():
    """matplotlib.pyplot on the Agg backend (files only, no window), for the lessons' plots."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, out_dir: str, name: str) -> Path:
    """Write ``fig`` as out_dir/name (PNG), close it, and say where it went."""
    path = Path(out_dir) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    pyplot().close(fig)
    print(f"wrote {path}")
    return path


def run_lesson(number: int, out_dir: str | None = None, *, show_text: bool = True) -> int:
    by_number = dict(lessons())
    if number not in by_number:
        print(f"there is no lesson {number}: lessons are numbered 1 to {len(by_number)}", file=sys.stderr)
        return 2
    module = importlib.import_module(by_number[number])
    if show_text:
        print(module.__doc__.strip(), end="\n\n" + "-" * 72 + "\n")
    module.run(out_dir)
    return 0


def _cmd_learn(args) -> int:
    from tritonkit._core.env import enable_interpreter_if_no_gpu

    if args.number is None:
        for number, name in lessons():
            print(f"{number}. {title(name)}")
        print("\n`tritonkit learn N` prints lesson N and runs it.")
        return 0
    module_name = dict(lessons()).get(args.number)
    if (args.source or args.notebook) and module_name is None:
        print(f"there is no lesson {args.number}", file=sys.stderr)
        return 2
    if args.source:
        print(Path(importlib.util.find_spec(module_name).origin).read_text(), end="")
        return 0
    if args.notebook:
        from tritonkit import notebooks

        path = Path(args.notebook) / f"{module_name.rsplit('.', 1)[1]}.ipynb"
        notebooks.write(notebooks.lesson_notebook(module_name, args.number), path)
        print(f"wrote {path}: open it in Jupyter (`pip install jupyterlab`, then `jupyter lab {path}`)")
        return 0
    enable_interpreter_if_no_gpu()
    return run_lesson(args.number, args.out)


def add_parser(sub) -> None:
    learn = sub.add_parser(
        "learn",
        help="the practitioner's guide as runnable lessons",
        description="List the lessons, or print lesson N and run it (under the interpreter without a GPU).",
    )
    learn.add_argument("number", nargs="?", type=int, help="the lesson to run")
    learn.add_argument("--out", help="folder for the lesson's files (images, plots)")
    learn.add_argument("--source", action="store_true", help="print the lesson's source instead of running it")
    learn.add_argument("--notebook", metavar="DIR", help="write the lesson as a Jupyter notebook into DIR instead")
    learn.set_defaults(run=_cmd_learn)
