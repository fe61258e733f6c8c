"""Triton puzzles: small kernels to write, checked on random cases by a checker that names mistakes.

``tritonkit puzzles list | init DIR | check DIR [N] | hint N | solution N``. Each puzzle is one
module ``pNN_<slug>.py`` (see :mod:`tritonkit.puzzles._base`); :mod:`tritonkit.puzzles.checker`
runs a learner's file. Importing this package defines no kernel: the puzzle modules are imported
on first use, after the CLI has chosen between the interpreter and the GPU.
"""

from tritonkit.puzzles._base import Puzzle, all_puzzles, get

__all__ = ["Puzzle", "all_puzzles", "get"]
