"""Rows split across programs: the programs sharing a row publish partial results and wait for each other.

A row too wide for one program's registers is split into ``n_blocks`` slices, one program each, with
consecutive program ids. Each program stores its slice's partial statistics, then :func:`publish_and_wait`
counts it in and waits until all ``n_blocks`` of the row are in; the combined statistics then come from
memory, read in a fixed order (deterministic). One launch reads each element from DRAM once, where a program
looping over the whole row reads it twice.

Waiting is safe when the programs a program waits for are running or will start: a GPU starts a 1-D grid's
programs in increasing order, and :func:`waits_safely` keeps ``n_blocks`` within what is resident at once.
The interpreter runs programs one at a time, so there (and for wider rows) launchers run the two halves as
two launches instead (:func:`launch_split_rows` launches them either way).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tritonkit._core.device import sm_count
from tritonkit._core.env import interpreting
from tritonkit._core.ints import cdiv, next_power_of_2


@triton.jit
def this_slice(n_cols, n_blocks, BLOCK_N: tl.constexpr):
    """This program's row (int64), its slice's index in the row, the slice's columns and their mask
    (program id = row * n_blocks + slice)."""
    i_row = (tl.program_id(0) // n_blocks).to(tl.int64)
    i_block = tl.program_id(0) % n_blocks
    o_n = i_block * BLOCK_N + tl.arange(0, BLOCK_N)
    return i_row, i_block, o_n, o_n < n_cols


@triton.jit
def publish(p_count):
    """Count this program's stores in for its row (``p_count``: the row's int32 counter, zero at launch). The
    barrier puts every thread's stores before the release."""
    tl.debug_barrier()
    tl.atomic_add(p_count, 1, sem="release")


@triton.jit
def wait_for(p_count, n_blocks):
    """Wait until all ``n_blocks`` programs of the row have published: the acquire read that sees ``n_blocks``
    puts every later load after all of their stores."""
    # Triton lowers an acquire add of 0 to an acquire load: the spin puts no read-modify-write traffic on L2.
    while tl.atomic_add(p_count, 0, sem="acquire") < n_blocks:
        pass


@triton.jit
def publish_and_wait(p_count, n_blocks):
    """publish, then wait_for the row's other programs."""
    publish(p_count)
    wait_for(p_count, n_blocks)


def waits_safely(n_blocks: int, device: torch.device) -> bool:
    """Whether one launch may wait across ``n_blocks`` programs per row: not under the interpreter, and at
    most one program per multiprocessor, which every kernel that launches at all can have resident."""
    return not interpreting() and n_blocks <= sm_count(device)


def launch_split_rows(kernel, leading, trailing, n_rows: int, n_cols: int, block_n: int, parts_per_slice: int,
                      device: torch.device, num_warps: int, **constexprs) -> None:  # fmt: skip
    """Launch a split-row kernel, whose arguments are ``*leading, workspace, counters, n_rows, n_cols, n_blocks,
    *trailing`` and whose constexprs include BLOCK_N, BLOCKS_P2 and PHASES: one program per ``block_n``-column
    slice of each row. The workspace holds ``parts_per_slice`` fp32 parts for each (row, slice), then the rows'
    counters (row_counters). PHASES 3, both halves in one launch, where the row's programs may wait for each
    other (waits_safely); else PHASES 1 then 2, statistics then output in two launches (each row read twice)."""
    n_blocks = cdiv(n_cols, block_n)
    workspace = torch.empty((parts_per_slice * n_rows * n_blocks + n_rows,), dtype=torch.float32, device=device)
    counters = row_counters(workspace, n_rows)
    for phases in (3,) if waits_safely(n_blocks, device) else (1, 2):
        kernel[(n_rows * n_blocks,)](
            *leading, workspace, counters, n_rows, n_cols, n_blocks, *trailing, **constexprs, BLOCK_N=block_n,
            BLOCKS_P2=next_power_of_2(n_blocks), PHASES=phases, num_warps=num_warps,
        )  # fmt: skip


def row_counters(workspace: torch.Tensor, n_rows: int) -> torch.Tensor:
    """The last ``n_rows`` fp32 elements of ``workspace`` as zeroed int32 counters, one per row (a fill
    launch; CUDA-graph capturable)."""
    counters = workspace[workspace.numel() - n_rows :].view(torch.int32)
    counters.zero_()
    return counters
