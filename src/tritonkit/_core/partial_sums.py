"""The column sums that finish a row-group backward (tritonkit._core.jit.row_groups): the fp32 workspace rows of
dweight and dbias summed in a fixed order and cast once, one launch for both (it replaced a torch ``sum`` and a cast
per gradient: docs/kernels/norm.md). The norms and the gated norm share it."""

from __future__ import annotations

import torch

from tritonkit._core.device import sm_count
from tritonkit._core.ints import cdiv, next_power_of_2, prev_power_of_2
from tritonkit._core.jit.row_groups import sum_partials_kernel

PARTIAL_SUM_ELEMENTS = 4096  # a sum program's tile per loop step (BLOCK_P x BLOCK_N)
PARTIAL_SUM_WARPS = 4  # that tile is 32 elements a thread at 4 warps: the sum is a few µs, not worth more


def partial_sum_block(n_parts: int, n_cols: int, sm_count: int) -> tuple[int, int]:
    """(BLOCK_P, BLOCK_N) of the dweight/dbias sum: columns split into about two programs per SM (8 to 32 columns
    each), parts in tiles of PARTIAL_SUM_ELEMENTS. A fixed 32 columns a program left 1024 columns to 32 programs, each
    reading its hundreds of parts in a long dependent chain, a quarter of the backward's time (docs/kernels/norm.md)."""
    block_n = min(32, max(8, prev_power_of_2(max(1, n_cols // (2 * sm_count)))))
    return min(next_power_of_2(n_parts), PARTIAL_SUM_ELEMENTS // block_n), block_n


def sum_partials(dw_part, db_part, dtype, n_cols, device):
    """Column sums of the backward's fp32 workspaces (n_parts, N), cast to ``dtype``; empty where the workspace is
    None."""
    dw = torch.empty((n_cols if dw_part is not None else 0,), dtype=dtype, device=device)
    db = torch.empty((n_cols if db_part is not None else 0,), dtype=dtype, device=device)
    parts = [t for t in (dw_part, db_part) if t is not None]
    if parts and n_cols > 0:
        n_parts = parts[0].shape[0]
        block_p, block_n = partial_sum_block(n_parts, n_cols, sm_count(device))
        sum_partials_kernel[(cdiv(n_cols, block_n),)](
            dw_part if dw_part is not None else db_part, db_part if db_part is not None else dw_part,
            dw if dw_part is not None else db,
            db if db_part is not None else dw, n_parts, n_cols, HAS_W=dw_part is not None, HAS_B=db_part is not None,
            BLOCK_P=block_p, BLOCK_N=block_n, num_warps=PARTIAL_SUM_WARPS,
        )  # fmt: skip
    return dw, db
