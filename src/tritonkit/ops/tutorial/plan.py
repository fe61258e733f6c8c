"""Launch plans of the guide's kernels, by device architecture where one was measured.

- add / add_relu: the shared elementwise launcher's block (sm90: 1024 elements a program, the copy's fastest on the
  H200; docs/kernels/tutorial.md); other GPUs fall back to the same block.
- rgb_to_grey: 32 x 32 pixel tiles everywhere (a lesson on 2-D grids; never tuned).
- matmul: the naive and grouped variants use the fixed tile of tritonkit._core.gemm_plan; the autotuned variant
  searches its space per shape; ``variant="auto"`` takes the autotuned one on a GPU and the grouped one under the
  interpreter, where autotuning has nothing to measure.
"""

from __future__ import annotations

from dataclasses import dataclass

from tritonkit._core.elementwise import FALLBACK_PLAN, ElementwisePlan
from tritonkit._core.env import interpreting

MAX_COPY_BLOCK = 65536  # copy's block_size limit: a 64 K-element block is 256 KB of fp32 registers a program
DEFAULT_GROUP_SIZE = 8  # the grouped variant's tile-rows per group: enough programs to share A's rows in L2
MATMUL_VARIANTS = ("auto", "naive", "grouped", "autotuned")

ADD_MEASURED = {"sm90": ElementwisePlan(block_size=1024, warps=4)}


@dataclass(frozen=True)
class ImageTile:
    block_h: int
    block_w: int


IMAGE_TILE = ImageTile(block_h=32, block_w=32)


def add_plan(arch: str) -> ElementwisePlan:
    return ADD_MEASURED.get(arch, FALLBACK_PLAN)


def choose_matmul_variant(m: int, n: int, k: int) -> str:
    """The variant ``variant="auto"`` runs: the autotuned one on a GPU, grouped under the interpreter.

    Autotuning times every config on first use of a shape; under the interpreter it has nothing to
    measure, so the grouped kernel with its fixed tile runs there.
    """
    return "grouped" if interpreting() else "autotuned"
