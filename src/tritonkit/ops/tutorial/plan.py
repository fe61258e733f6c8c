"""Launch plans of the guide's kernels, by device architecture where one was measured.

- add / add_relu: the shared elementwise launcher's block (sm90: 1024 elements a program, the copy's fastest on the
  H200; docs/kernels/tutorial.md); other GPUs fall back to the same block.
- rgb_to_grey: 32 x 32 pixel tiles everywhere (a lesson on 2-D grids; never tuned).
- matmul: the naive and grouped variants use the fixed tile of tritonkit._core.gemm_plan; the autotuned variant
  searches its space per shape; the persistent one has one Hopper tile per operand width (and runs the variant auto
  picks before Hopper, or where TMA cannot read the operands); ``variant="auto"`` takes the autotuned one on a GPU
  and the grouped one under the interpreter, where autotuning has nothing to measure.
"""

from __future__ import annotations

from dataclasses import dataclass

from tritonkit._core.elementwise import FALLBACK_PLAN, ElementwisePlan
from tritonkit._core.env import interpreting
from tritonkit._core.tma import has_tma

MAX_COPY_BLOCK = 65536  # copy's block_size limit: a 64 K-element block is 256 KB of fp32 registers a program
DEFAULT_GROUP_SIZE = 8  # the grouped variant's tile-rows per group: enough programs to share A's rows in L2
MATMUL_VARIANTS = ("auto", "naive", "grouped", "autotuned", "persistent")

ADD_MEASURED = {"sm90": ElementwisePlan(block_size=1024, warps=4)}


@dataclass(frozen=True)
class ImageTile:
    block_h: int
    block_w: int


IMAGE_TILE = ImageTile(block_h=32, block_w=32)


def add_plan(arch: str) -> ElementwisePlan:
    return ADD_MEASURED.get(arch, FALLBACK_PLAN)


@dataclass(frozen=True)
class PersistentTile:
    block_m: int
    block_n: int
    block_k: int
    warps: int
    stages: int
    group: int


# The persistent TMA variant's tile on Hopper (sm90 and newer), untuned yet: 128 x 256 output tiles, K steps of 64,
# two warpgroups, three stages (48 KB a stage in bf16). Under the interpreter small tiles keep tests quick.
PERSISTENT_SM90 = PersistentTile(128, 256, 64, 8, 3, 8)
# fp32 (checking, not speed): the 16-bit tile's stages (96 KB each) and its 128 KB output tile in shared memory for
# the TMA store would pass the H100's 227 KB; 128 x 128 tiles with K steps of 32 take 32 KB a stage.
PERSISTENT_SM90_FP32 = PersistentTile(128, 128, 32, 8, 3, 8)
PERSISTENT_INTERPRETER = PersistentTile(32, 32, 32, 4, 1, 2)


def persistent_tile(arch: str, itemsize: int) -> PersistentTile | None:
    """The persistent variant's tile on ``arch`` for ``itemsize``-byte operands, or None where it has no TMA (before
    Hopper): the autotuned variant runs there instead."""
    if interpreting():
        return PERSISTENT_INTERPRETER
    if not has_tma(arch):
        return None
    return PERSISTENT_SM90_FP32 if itemsize == 4 else PERSISTENT_SM90


def choose_matmul_variant(m: int, n: int, k: int) -> str:
    """The variant ``variant="auto"`` runs: the autotuned one on a GPU, grouped under the interpreter.

    Autotuning times every config on first use of a shape; under the interpreter it has nothing to
    measure, so the grouped kernel with its fixed tile runs there.
    """
    return "grouped" if interpreting() else "autotuned"
