"""Programs that count themselves in: rows split across programs, where a program publishes its slice's partial
results and waits for the row's other programs (the host side, and when waiting is allowed:
tritonkit._core.row_sync); and ``arrive``, for the last program of a group to finish what the others began (no
program waits, so nothing about residency is assumed)."""

import triton
import triton.language as tl


@triton.jit
def this_slice(n_cols, n_blocks, BLOCK_N: tl.constexpr):
    """This program's row (int64), its slice's index in the row, the slice's columns and their mask
    (program id = row * n_blocks + slice)."""
    i_row = (tl.program_id(0) // n_blocks).to(tl.int64)
    i_block = tl.program_id(0) % n_blocks
    o_n = i_block * BLOCK_N + tl.arange(0, BLOCK_N)
    return i_row, i_block, o_n, o_n < n_cols


@triton.jit
def arrive(p_count):
    """Count this program in at ``p_count`` (an int32, zero at launch) and return the count before it: the barrier
    puts every thread's stores before the release, and the acquire puts this program's later loads after the stores
    of every program counted before it (so the program that reads count - 1 finds them all)."""
    tl.debug_barrier()
    return tl.atomic_add(p_count, 1, sem="acq_rel")


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
