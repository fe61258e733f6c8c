"""Row groups of a backward that sums per-column gradients (a norm's dweight and dbias): each program takes a group of
rows, accumulates its share of the column sums in fp32 and writes it to a workspace row; sum_partials_kernel then
sums the workspace's rows in a fixed order, so the gradients are deterministic (host side:
tritonkit._core.partial_sums). The norms and the gated norm share these."""

import triton
import triton.language as tl


@triton.jit
def row_steps(i_part, rows_per_program, n_rows, ROWS: tl.constexpr, INTERLEAVED: tl.constexpr):
    """(first row, end, step) of row group ``i_part``'s loop: a block of rows_per_program rows taken ROWS at a time,
    or with INTERLEAVED the steps i_part, i_part + G, i_part + 2G, ... of ROWS rows each (G groups), so that the
    groups sweep the rows together, as a non-persistent grid does (int64: row * stride can pass 2**31)."""
    if INTERLEAVED:
        row_start = i_part * ROWS
        row_end = n_rows
        row_step = tl.num_programs(0) * ROWS
    else:
        row_start = i_part * rows_per_program
        row_end = tl.minimum(row_start + rows_per_program, n_rows)
        row_step = ROWS
    return row_start, row_end, row_step


@triton.jit
def store_partials(p_dw_part, p_db_part, i_part, n_cols, o_n, m_n, acc_dw, acc_db, HAS_W: tl.constexpr,
                   HAS_B: tl.constexpr):  # fmt: skip
    """Row group i_part's share of dw and db into row i_part of the fp32 workspaces, or into dweight and dbias
    themselves (in their dtype) when one program covers every row."""
    if HAS_W:
        tl.store(p_dw_part + i_part * n_cols + o_n, acc_dw.to(p_dw_part.dtype.element_ty), mask=m_n)
    if HAS_B:
        tl.store(p_db_part + i_part * n_cols + o_n, acc_db.to(p_db_part.dtype.element_ty), mask=m_n)


@triton.jit
def sum_partials_kernel(
    p_dw_part, p_db_part, p_dw, p_db, n_parts, n_cols,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """dw = sum over parts of dw_part[part, :], likewise db, in fp32 and in a fixed order (deterministic),
    each cast once to the weight's dtype. One program per BLOCK_N columns, for both sums: one launch in
    place of a torch ``sum`` and a cast per gradient."""
    o_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    m_n = o_n < n_cols
    acc_dw = tl.zeros((BLOCK_P, BLOCK_N), dtype=tl.float32)
    acc_db = tl.zeros((BLOCK_P, BLOCK_N), dtype=tl.float32)
    for start in range(0, n_parts, BLOCK_P):
        o_p = (start + tl.arange(0, BLOCK_P)).to(tl.int64)
        offsets = o_p[:, None] * n_cols + o_n[None, :]
        mask = (o_p < n_parts)[:, None] & m_n[None, :]
        if HAS_W:
            acc_dw += tl.load(p_dw_part + offsets, mask=mask, other=0.0)
        if HAS_B:
            acc_db += tl.load(p_db_part + offsets, mask=mask, other=0.0)
    if HAS_W:
        tl.store(p_dw + o_n, tl.sum(acc_dw, axis=0).to(p_dw.dtype.element_ty), mask=m_n)
    if HAS_B:
        tl.store(p_db + o_n, tl.sum(acc_db, axis=0).to(p_db.dtype.element_ty), mask=m_n)
