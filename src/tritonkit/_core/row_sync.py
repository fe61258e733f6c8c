"""Rows split across programs, on the host: when programs may wait for each other, and the launch either way.

A row too wide for one program's registers is split into ``n_blocks`` slices, one program each, with consecutive
program ids. Each program stores its slice's partial statistics, then counts itself in and waits until all
``n_blocks`` of the row are in (tritonkit._core.jit.row_sync); the combined statistics then come from memory, read
in a fixed order (deterministic). One launch reads each element from DRAM once, where two launches (statistics,
then output) read it twice.

**Waiting across programs assumes that all programs of a row are resident at once, which CUDA does not promise.**
A GPU starts a 1-D grid's programs in increasing order, and :func:`waits_safely` keeps ``n_blocks`` within one
program per multiprocessor; but where the GPU is shared so that fewer multiprocessors are available to this
process (MPS with an SM limit, green contexts, a persistent kernel of another stream occupying SMs), a waiting
program can hold the SM that a program it waits for needs, and the kernel never ends. In such settings turn the
waits off: ``TRITONKIT_SPIN_WAITS=0`` in the environment, or :func:`set_spin_waits` (``tritonkit.set_spin_waits``)
at run time, and every split-row kernel runs as two launches. The interpreter runs programs one at a time, so there
it always does.
"""

from __future__ import annotations

import contextlib
import os
import threading

import torch

from tritonkit._core.device import sm_count
from tritonkit._core.env import kernels_interpreted
from tritonkit._core.ints import cdiv, next_power_of_2

_spin_waits = os.environ.get("TRITONKIT_SPIN_WAITS", "1").strip().lower() not in ("0", "false", "off", "no")


def spin_waits_enabled() -> bool:
    """Whether kernels may spin-wait for other programs of their launch (TRITONKIT_SPIN_WAITS, set_spin_waits)."""
    return _spin_waits


@contextlib.contextmanager
def _restoring(previous: bool):
    try:
        yield
    finally:
        set_spin_waits(previous)


def set_spin_waits(enabled: bool):
    """Allow (the default) or forbid kernels that spin-wait for other programs of their launch; forbidden, rows
    split across programs take two launches (each row read twice). Returns a context manager that restores the
    previous setting, so ``with tritonkit.set_spin_waits(False): ...`` scopes it. A setting read at each launch:
    a CUDA graph or compiled region keeps the launches captured when it was made."""
    global _spin_waits
    if not isinstance(enabled, bool):
        raise TypeError(f"set_spin_waits: enabled must be a bool, got {type(enabled).__name__}")
    previous, _spin_waits = _spin_waits, enabled
    return _restoring(previous)


def waits_safely(n_blocks: int, device: torch.device) -> bool:
    """Whether one launch may wait across ``n_blocks`` programs per row: spin-waits allowed, not under the
    interpreter, and at most one program per multiprocessor, which every kernel that launches at all can have
    resident (see the module docstring for where even that does not hold)."""
    return _spin_waits and not kernels_interpreted() and n_blocks <= sm_count(device)


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


# Arrival counters that the kernels leave at zero (the last program of each group to arrive, jit.row_sync.arrive,
# sets its count back), kept per device and stream as PyTorch keeps cuBLAS's workspaces: a call reuses them instead
# of zeroing new ones, a launch of its own. Work on two streams never shares them; a graph that captured a stream's
# counters shares them with that stream's later calls, so it replays on that stream.
_KEPT: dict[tuple[int, int], torch.Tensor] = {}


def _zeros_outside_pools(size: int, device: torch.device) -> torch.Tensor:
    """size zeroed int32 on ``device``, allocated and zeroed on a thread of its own and waited for: the calling
    thread's allocations may be routed to a CUDA graph's pool (torch.compile's CUDA graphs warm up so), which must not
    hold memory its graph does not track. Once a stream, and when a call needs more counters."""
    made = []

    def allocate():
        with torch.cuda.device(device):
            made.append(torch.zeros(size, dtype=torch.int32, device=device))
            torch.cuda.current_stream(device).synchronize()

    worker = threading.Thread(target=allocate)
    worker.start()
    worker.join()
    return made[0]


def kept_counters(count: int, device: torch.device) -> torch.Tensor:
    """``count`` zeroed int32 counters for a kernel launched on the current stream that leaves them at zero: the
    stream's kept ones, grown where too few. A capture that finds too few zeroes its own inside the graph (each replay
    zeroes them again) and keeps none: memory of a graph's pool holds no zeros outside its replays. Off the GPU (the
    interpreter) new zeros each call."""
    if device.type != "cuda":
        return torch.zeros(count, dtype=torch.int32, device=device)
    stream = torch.cuda.current_stream(device)
    key = (stream.device.index, stream.cuda_stream)
    counters = _KEPT.get(key)
    if counters is not None and counters.numel() >= count:
        return counters[:count]
    if torch.cuda.is_current_stream_capturing():
        return torch.zeros(count, dtype=torch.int32, device=device)
    counters = _zeros_outside_pools(max(count, 2 * counters.numel() if counters is not None else 0), device)
    counters.record_stream(stream)  # freed when outgrown: after the stream's launches that read them
    _KEPT[key] = counters
    return counters[:count]
