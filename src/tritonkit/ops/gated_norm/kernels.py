"""Gated RMSNorm kernels, forward and backward: mamba2's RMSNormGated, an RMSNorm over groups of the last dimension
gated by silu(z), after the norm or before it. Whole groups in registers, ROWS rows of one group a program step.

With s = silu(z) = z * sigmoid(z) and, for each row and group of G columns, rstd = 1 / sqrt(mean(h^2) + eps):
  the norm before the gate:  h = x,      y = h * rstd * w * s
  the gate first:            h = x * s,  y = h * rstd * w
(no z: y = h * rstd * w, h = x). dweight is summed in fp32 per row group and reduced in a fixed order
(tritonkit._core.jit.row_groups), so it is deterministic.
"""

import triton
import triton.language as tl

from tritonkit._core.jit.row_groups import row_steps, store_partials


@triton.jit
def _silu_and_slope(b_z):
    """silu(z) = z * sigmoid(z) and its derivative sigmoid(z) * (1 + z * (1 - sigmoid(z))), in fp32."""
    b_sigmoid = tl.sigmoid(b_z)
    return b_z * b_sigmoid, b_sigmoid * (1.0 + b_z * (1.0 - b_sigmoid))


@triton.jit
def _load_tile(p_t, o_r, o_cols, stride_row, m_rn):
    """t at rows o_r and columns o_cols, in fp32 (0 where masked)."""
    return tl.load(p_t + o_r[:, None] * stride_row + o_cols[None, :], mask=m_rn, other=0.0).to(tl.float32)


@triton.jit
def _rms_norm_gated_fwd_kernel(
    p_x, p_z, p_w, p_y, p_rstd,
    n_rows, group_size, n_groups, stride_x_row, stride_z_row, stride_y_row, eps,
    HAS_Z: tl.constexpr, GATE_FIRST: tl.constexpr, STORE_STATS: tl.constexpr, ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr,
):  # fmt: skip
    """Forward of ROWS rows (program_id(0)) of one group (program_id(1)): h = x (* silu(z) with GATE_FIRST),
    rstd = 1 / sqrt(sum(h^2) / G + eps), y = h * rstd * w (* silu(z) without GATE_FIRST). Stores y and, with
    STORE_STATS, rstd (fp32, (rows, groups), for the backward)."""
    i_group = tl.program_id(1)
    o_r = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)
    m_r = o_r < n_rows
    o_n = tl.arange(0, BLOCK_N)
    m_n = o_n < group_size
    o_cols = i_group * group_size + o_n
    m_rn = m_r[:, None] & m_n[None, :]
    b_h = _load_tile(p_x, o_r, o_cols, stride_x_row, m_rn)  # [ROWS, BLOCK_N]
    if HAS_Z:
        b_z = _load_tile(p_z, o_r, o_cols, stride_z_row, m_rn)
        b_gate = b_z * tl.sigmoid(b_z)
        if GATE_FIRST:
            b_h *= b_gate
    b_rstd = tl.rsqrt(tl.sum(b_h * b_h, axis=1) / group_size + eps)  # [ROWS]
    if STORE_STATS:
        tl.store(p_rstd + o_r * n_groups + i_group, b_rstd, mask=m_r)
    b_w = tl.load(p_w + o_cols, mask=m_n, other=0.0).to(tl.float32)
    b_y = b_h * b_rstd[:, None] * b_w[None, :]
    if HAS_Z and not GATE_FIRST:
        b_y *= b_gate
    tl.store(p_y + o_r[:, None] * stride_y_row + o_cols[None, :], b_y.to(p_y.dtype.element_ty), mask=m_rn)


@triton.jit
def _rms_norm_gated_bwd_kernel(
    p_dy, p_x, p_z, p_w, p_rstd, p_dx, p_dz, p_dw_part,
    n_rows, n_cols, group_size, n_groups, rows_per_program, stride_dy_row, stride_x_row, stride_z_row, stride_dx_row,
    stride_dz_row,
    HAS_Z: tl.constexpr, GATE_FIRST: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """Backward of row group program_id(0)'s block of rows (row_steps) in group program_id(1), ROWS rows a step.

    With xhat = h * rstd, u = dy * silu(z) (the norm before the gate) or u = dy, g = w * u:
      dh = rstd * (g - xhat * mean(g * xhat)),  dw = sum_rows(u * xhat);
      the norm before the gate:  dz = dy * xhat * w * silu'(z),  dx = dh;
      the gate first:            dz = dh * x * silu'(z),         dx = dh * silu(z).
    The row group's share of dw goes to its row of the fp32 workspace (store_partials: columns of the group).
    """
    i_part = tl.program_id(0).to(tl.int64)
    i_group = tl.program_id(1)
    row_start, row_end, row_step = row_steps(i_part, rows_per_program, n_rows, ROWS, False)
    o_n = tl.arange(0, BLOCK_N)
    m_n = o_n < group_size
    o_cols = i_group * group_size + o_n
    b_w = tl.load(p_w + o_cols, mask=m_n, other=0.0).to(tl.float32)
    acc_dw = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for r0 in tl.range(row_start, row_end, row_step):
        o_r = r0 + tl.arange(0, ROWS)
        m_r = o_r < row_end
        m_rn = m_r[:, None] & m_n[None, :]
        b_x = _load_tile(p_x, o_r, o_cols, stride_x_row, m_rn)  # [ROWS, BLOCK_N]
        b_u = _load_tile(p_dy, o_r, o_cols, stride_dy_row, m_rn)
        b_rstd = tl.load(p_rstd + o_r * n_groups + i_group, mask=m_r, other=0.0)
        b_h = b_x
        if HAS_Z:
            b_gate, b_slope = _silu_and_slope(_load_tile(p_z, o_r, o_cols, stride_z_row, m_rn))
            if GATE_FIRST:
                b_h = b_x * b_gate
        b_xhat = b_h * b_rstd[:, None]
        if HAS_Z and not GATE_FIRST:
            b_dz = b_u * b_xhat * b_w[None, :] * b_slope
            tl.store(p_dz + o_r[:, None] * stride_dz_row + o_cols[None, :], b_dz.to(p_dz.dtype.element_ty), mask=m_rn)
            b_u *= b_gate
        b_g = b_u * b_w[None, :]
        c_xhat = tl.sum(b_g * b_xhat, axis=1) / group_size  # [ROWS]
        b_dx = (b_g - b_xhat * c_xhat[:, None]) * b_rstd[:, None]
        acc_dw += tl.sum(b_u * b_xhat, axis=0)
        if HAS_Z and GATE_FIRST:
            b_dz = b_dx * b_x * b_slope
            tl.store(p_dz + o_r[:, None] * stride_dz_row + o_cols[None, :], b_dz.to(p_dz.dtype.element_ty), mask=m_rn)
            b_dx *= b_gate
        tl.store(p_dx + o_r[:, None] * stride_dx_row + o_cols[None, :], b_dx.to(p_dx.dtype.element_ty), mask=m_rn)
    store_partials(p_dw_part, p_dw_part, i_part, n_cols, o_cols, m_n, acc_dw, acc_dw, True, False)
