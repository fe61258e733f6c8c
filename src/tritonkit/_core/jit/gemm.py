"""GEMM tile order shared by the matmul ladder and the fused LoRA GEMM."""

import triton
import triton.language as tl


@triton.jit
def grouped_tile(i_pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_SIZE: tl.constexpr):
    """(i_m, i_n), the output tile of program i_pid: programs walk GROUP_SIZE tile-rows column by
    column before moving to the next group (GROUP_SIZE = 1 is row-major order), so that programs running together
    share A rows and B columns in L2."""
    n_tiles_m = tl.cdiv(M, BLOCK_M)
    n_tiles_n = tl.cdiv(N, BLOCK_N)
    n_pids_in_group = GROUP_SIZE * n_tiles_n
    first_m = (i_pid // n_pids_in_group) * GROUP_SIZE
    rows_in_group = tl.minimum(n_tiles_m - first_m, GROUP_SIZE)
    i_m = first_m + (i_pid % n_pids_in_group) % rows_in_group
    i_n = (i_pid % n_pids_in_group) // rows_in_group
    return i_m, i_n
