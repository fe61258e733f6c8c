"""Triton puzzles: small kernels to write, checked on random cases by a checker that names mistakes.

``tritonkit puzzles list | init DIR | check DIR [N] | hint N | solution N``. Each puzzle is one
module ``pNN_<slug>.py`` (see :mod:`tritonkit.puzzles._base`); :mod:`tritonkit.puzzles.checker`
runs a learner's file. Importing this package defines no kernel: the puzzle modules are imported
on first use, after the CLI has chosen between the interpreter and the GPU.
"""

import importlib

__all__ = ["Puzzle", "all_puzzles", "get"]


def __getattr__(name: str):
    # Imported on first use: `tritonkit --help` builds the puzzles' parser from tritonkit.puzzles.cli without torch.
    if name in __all__:
        return getattr(importlib.import_module("tritonkit.puzzles._base"), name)
    raise AttributeError(f"module 'tritonkit.puzzles' has no attribute {name!r}")
