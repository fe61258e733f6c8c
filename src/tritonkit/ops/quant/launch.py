"""quantize and dequantize: validate, allocate, launch (tensors in, tensors out; ``plan=``).

x is read as rows of its last dimension, (M, K) = (x.numel() / K, K). Scales by granularity: "tensor" (), "row"
(..., 1), "group" (..., ceil(K / G)), "block" (ceil(M / G), ceil(K / G)) for a 2-D x; G is ``block_size``.
"""

from __future__ import annotations

import torch

from tritonkit._core.checks import FLOAT_DTYPES, check_device, check_tensor
from tritonkit._core.device import arch
from tritonkit._core.env import kernels_interpreted
from tritonkit._core.fourbit import (
    NESTED_BLOCK,
    NF4_BLOCKSIZES,
    check_int4_group,
    check_int4_weight,
    nf4_tables,
)
from tritonkit._core.ints import cdiv, next_power_of_2
from tritonkit._core.scales import FORMATS, MIN_BLOCK, granularity_of
from tritonkit.ops.quant.kernels import (
    _amax_kernel,
    _column_amax_kernel,
    _dequantize_kernel,
    _int4_dequantize_kernel,
    _int4_quantize_kernel,
    _nf4_dequantize_kernel,
    _nf4_quantize_kernel,
    _quantize_blocks_kernel,
    _quantize_columns_kernel,
    _quantize_groups_kernel,
)
from tritonkit.ops.quant.plan import (
    COLUMN_AMAX_ROWS,
    COLUMN_AMAX_TILE,
    FOURBIT_DEQUANTIZE,
    FourBitDequantizePlan,
    QuantPlan,
    blocks_plan,
    columns_plan,
    elementwise_plan,
    groups_plan,
    transposed_plan,
)

GRANULARITIES = ("tensor", "row", "group", "block")


def _names(dtypes) -> str:
    return ", ".join(str(d).removeprefix("torch.") for d in dtypes)


def check_block_size(name: str, block_size) -> None:
    if isinstance(block_size, bool) or not isinstance(block_size, int):
        raise TypeError(f"{name}: block_size must be an int, got {type(block_size).__name__}")
    if block_size < MIN_BLOCK or block_size & (block_size - 1):
        raise ValueError(f"{name}: block_size must be a power of two >= {MIN_BLOCK}, got {block_size}")


def check_quantize(x, dtype, granularity, block_size) -> None:
    name = "quantize"
    check_tensor(f"{name}: x", x, dtypes=FLOAT_DTYPES)
    if dtype not in FORMATS:
        raise TypeError(f"{name}: dtype must be one of {_names(FORMATS)}, got {dtype}")
    if granularity not in GRANULARITIES:
        raise ValueError(f"{name}: granularity must be one of {GRANULARITIES}, got {granularity!r}")
    check_block_size(name, block_size)
    if granularity == "block" and x.dim() != 2:
        raise ValueError(f"{name}: granularity 'block' takes a 2-D x (M, K), got shape {tuple(x.shape)}")
    if granularity in ("row", "group") and x.dim() == 0:
        raise ValueError(f"{name}: granularity {granularity!r} needs a last dimension, got a 0-d x")
    check_device(x=x)


def scale_shape(shape: tuple, granularity: str, block_size: int) -> tuple:
    if granularity == "tensor":
        return ()
    if granularity == "row":
        return (*shape[:-1], 1)
    if granularity == "group":
        return (*shape[:-1], cdiv(shape[-1], block_size))
    return cdiv(shape[0], block_size), cdiv(shape[1], block_size)


def _rows(x: torch.Tensor, *, columns_in_place: bool = False) -> torch.Tensor:
    """x as (M, K) with unit stride along K (a copy when it has none); with ``columns_in_place`` also unit stride
    along M (a transposed operand: the kernels read it where it lies)."""
    rows = x.reshape(-1, x.shape[-1]) if x.dim() else x.reshape(1, 1)
    if rows.stride(1) == 1 or rows.shape[1] <= 1 or (columns_in_place and _column_strided(rows)):
        return rows
    return rows.contiguous()


def _column_strided(rows: torch.Tensor) -> bool:
    """rows (M, K) lies down its columns (unit stride along M, none along K): a transposed view."""
    return rows.stride(1) != 1 and rows.shape[1] > 1 and (rows.stride(0) == 1 or rows.shape[0] <= 1)


def _hardware_rounding(plan: QuantPlan) -> bool:
    """The plan's float8 rounding, except under the interpreter, whose conversion rounds wrongly (fp32 arithmetic)."""
    return plan.hardware_rounding and not kernels_interpreted()


def quantize_fwd(
    x: torch.Tensor, dtype: torch.dtype, granularity: str, block_size: int, *, plan: QuantPlan | None = None,
    inf_to_nan: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """(codes in x's shape and ``dtype``, fp32 scales) of validated arguments (kernels.py's definition). ``plan``:
    QuantPlan tiles (block_r rows of a block per chunk for block scales), or None: plan.groups_plan or
    plan.blocks_plan. ``inf_to_nan`` (float8, tensor, row or group scales; not the public op's): +-inf gets the NaN
    code instead of +-qmax, so that a product of the codes shows the overflow, as float8 training needs."""
    if plan is not None and not isinstance(plan, QuantPlan):
        raise TypeError(f"quantize: plan must be a QuantPlan, got {type(plan).__name__}")
    if inf_to_nan and (FORMATS[dtype] == "int8" or granularity == "block"):
        raise ValueError(f"quantize: inf_to_nan takes float8 codes with tensor, row or group scales, got {dtype} "
                         f"with {granularity!r} scales")  # fmt: skip
    codes = torch.empty(x.shape, dtype=dtype, device=x.device)
    scale = torch.empty(scale_shape(tuple(x.shape), granularity, block_size), dtype=torch.float32, device=x.device)
    if x.numel() == 0:  # every region empty, so a region of zeros: scale 1 (rows of no values too)
        return codes, scale.fill_(1.0)
    rows = _rows(x, columns_in_place=granularity != "block")
    strided = _column_strided(rows)
    code_rows = codes.view(rows.shape)
    n_rows, n_cols = rows.shape
    kind = FORMATS[dtype]
    if strided and granularity in ("row", "tensor"):
        _quantize_transposed(rows.t(), code_rows, scale, granularity, kind, plan, inf_to_nan)
        return codes, scale
    device_arch = arch(x.device)
    if granularity == "block":
        tiles = plan or blocks_plan(device_arch, block_size)
        _quantize_blocks_kernel[(scale.shape[0], scale.shape[1])](
            rows, code_rows, scale, n_rows, n_cols, rows.stride(0), code_rows.stride(0), scale.stride(0),
            KIND=kind, HARDWARE_ROUNDING=_hardware_rounding(tiles), BLOCK=block_size, CHUNK_R=tiles.block_r,
            num_warps=tiles.warps,
        )  # fmt: skip
        return codes, scale
    group = block_size if granularity == "group" else n_cols
    tiles = plan or (columns_plan(device_arch) if strided else groups_plan(device_arch, group))
    amax = _tensor_amax(rows, device_arch) if granularity == "tensor" else scale  # else a stand-in pointer
    scale_rows = scale.view(n_rows, -1) if granularity != "tensor" else scale
    _quantize_groups_kernel[(cdiv(n_rows, tiles.block_r), cdiv(n_cols, group))](
        rows, code_rows, scale_rows, amax, n_rows, n_cols, group, rows.stride(0), rows.stride(1), code_rows.stride(0),
        scale_rows.stride(0) if granularity != "tensor" else 0,
        KIND=kind, TENSOR=granularity == "tensor", HARDWARE_ROUNDING=_hardware_rounding(tiles),
        ONE_PASS=group <= tiles.block_c, COLUMN_STRIDED=strided, INF_IS_NAN=inf_to_nan, BLOCK_R=tiles.block_r,
        BLOCK_C=tiles.block_c, num_warps=tiles.warps,
    )  # fmt: skip
    return codes, scale


def _tensor_amax(rows: torch.Tensor, device_arch: str) -> torch.Tensor:
    """(1,) fp32: the largest finite |value| of rows (M, K, unit stride along K), for a tensor scale."""
    n_rows, n_cols = rows.shape
    amax = torch.zeros(1, dtype=torch.float32, device=rows.device)
    whole = elementwise_plan(device_arch, n_cols)
    _amax_kernel[(cdiv(n_rows, whole.block_r), cdiv(n_cols, whole.block_c))](
        rows, amax, n_rows, n_cols, rows.stride(0), BLOCK_R=whole.block_r, BLOCK_C=whole.block_c,
        num_warps=whole.warps,
    )  # fmt: skip
    return amax


def _quantize_transposed(x, code_rows, scale, granularity, kind, plan, inf_to_nan) -> None:
    """The codes (code_rows, (N, M)) and scales of x^T for a row-major x (M, N), x read along its own rows: its
    column amax (row scales of x^T) or its amax (a tensor scale), then _quantize_columns_kernel's transposed tiles
    (``plan``, else plan.transposed_plan)."""
    n_rows, n_cols = x.shape
    device_arch = arch(x.device)
    if granularity == "tensor":
        amax = _tensor_amax(x, device_arch)
    else:
        amax = torch.zeros(n_cols, dtype=torch.float32, device=x.device)
        block_r, block_c = COLUMN_AMAX_TILE
        _column_amax_kernel[(cdiv(n_rows, COLUMN_AMAX_ROWS), cdiv(n_cols, block_c))](
            x, amax, n_rows, n_cols, COLUMN_AMAX_ROWS, x.stride(0), BLOCK_R=block_r, BLOCK_C=block_c, num_warps=4,
        )  # fmt: skip
    tiles = plan or transposed_plan(device_arch)
    scale_rows = scale.view(n_cols, 1) if granularity == "row" else scale
    _quantize_columns_kernel[(cdiv(n_rows, tiles.block_r), cdiv(n_cols, tiles.block_c))](
        x, code_rows, scale_rows, amax, n_rows, n_cols, x.stride(0), code_rows.stride(0),
        scale_rows.stride(0) if granularity == "row" else 0,
        KIND=kind, TENSOR=granularity == "tensor", HARDWARE_ROUNDING=_hardware_rounding(tiles), INF_IS_NAN=inf_to_nan,
        BLOCK_R=tiles.block_r, BLOCK_C=tiles.block_c, num_warps=tiles.warps,
    )  # fmt: skip


def quantize_fake(x, dtype, granularity, block_size):
    shape = scale_shape(tuple(x.shape), granularity, block_size)
    return x.new_empty(x.shape, dtype=dtype), x.new_empty(shape, dtype=torch.float32)


def check_dequantize(codes, scale, dtype) -> tuple[str, int]:
    name = "dequantize"
    check_tensor(f"{name}: xq", codes, dtypes=tuple(FORMATS))
    check_tensor(f"{name}: scale", scale, dtypes=(torch.float32,))
    if dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name}: dtype must be one of {_names(FLOAT_DTYPES)}, got {dtype}")
    found = granularity_of(tuple(codes.shape), tuple(scale.shape))
    if found is None:
        raise ValueError(f"{name}: scale of shape {tuple(scale.shape)} matches no granularity for xq of shape "
                         f"{tuple(codes.shape)}: () tensor, (..., 1) row, (..., ceil(K / G)) group, "
                         "(ceil(M / G), ceil(K / G)) block, G a power of two >= 16")  # fmt: skip
    check_device(xq=codes, scale=scale)
    return found


def dequantize_fwd(
    codes: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype, *, plan: QuantPlan | None = None
) -> torch.Tensor:
    """codes * scale in ``dtype`` (validated arguments; the granularity read from the scale's shape)."""
    out = torch.empty(codes.shape, dtype=dtype, device=codes.device)
    if out.numel() == 0:
        return out
    granularity, size = granularity_of(tuple(codes.shape), tuple(scale.shape))
    rows = _rows(codes, columns_in_place=True)  # a transposed view's codes are read where they lie
    column_strided = _column_strided(rows)
    out_rows = out.view(rows.shape)
    n_rows, n_cols = rows.shape
    scale_rows = scale.reshape(1, 1) if granularity == "tensor" else scale.reshape(-1, scale.shape[-1])
    scale_rows = scale_rows if scale_rows.stride(-1) == 1 else scale_rows.contiguous()
    device_arch = arch(codes.device)
    tiles = plan or (transposed_plan(device_arch) if column_strided else elementwise_plan(device_arch, n_cols))
    _dequantize_kernel[(cdiv(n_rows, tiles.block_r), cdiv(n_cols, tiles.block_c))](
        rows, scale_rows, out_rows, n_rows, n_cols, rows.stride(0), rows.stride(1), scale_rows.stride(0),
        out_rows.stride(0), GRANULARITY=granularity, SIZE=size if granularity in ("group", "block") else 1,
        COLUMN_STRIDED=column_strided, BLOCK_R=tiles.block_r, BLOCK_C=tiles.block_c, num_warps=tiles.warps,
    )  # fmt: skip
    return out


def dequantize_fake(codes, scale, dtype):
    return codes.new_empty(codes.shape, dtype=dtype)


# ---------------------------------------------------------------- NF4


_QUANTIZE_VALUES = 1024  # values per program of nf4_quantize (whole blocks; one block when a block is larger)


def check_nf4_quantize(w, blocksize, double_quant) -> None:
    name = "nf4_quantize"
    check_tensor(f"{name}: w", w, dtypes=FLOAT_DTYPES)
    if blocksize not in NF4_BLOCKSIZES:
        raise ValueError(f"{name}: blocksize must be one of {NF4_BLOCKSIZES}, got {blocksize!r}")
    if not isinstance(double_quant, bool):
        raise TypeError(f"{name}: double_quant must be a bool, got {type(double_quant).__name__}")
    check_device(w=w)


def nf4_quantize_fwd(w: torch.Tensor, blocksize: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(packed uint8 (ceil(n / 2),), absmax fp32 (ceil(n / blocksize),)) of the flattened w (validated)."""
    n = w.numel()
    packed = torch.empty((n + 1) // 2, dtype=torch.uint8, device=w.device)
    absmax = torch.empty(cdiv(n, blocksize), dtype=torch.float32, device=w.device)
    if n == 0:
        return packed, absmax
    flat = w.reshape(-1)
    flat = flat if flat.stride(0) == 1 else flat.contiguous()
    _, bounds, _ = nf4_tables(w.device)
    blocks = max(1, _QUANTIZE_VALUES // blocksize)
    _nf4_quantize_kernel[(cdiv(absmax.shape[0], blocks),)](flat, packed, absmax, bounds, n, absmax.shape[0],
                                                           BLOCKSIZE=blocksize, BLOCKS=blocks, num_warps=4)  # fmt: skip
    return packed, absmax


def nf4_quantize_fake(w, blocksize):
    n = w.numel()
    return w.new_empty((n + 1) // 2, dtype=torch.uint8), w.new_empty(cdiv(n, blocksize), dtype=torch.float32)


def nf4_dequantize_fwd(
    packed: torch.Tensor,
    absmax: torch.Tensor | None,
    absmax_codes: torch.Tensor | None,
    absmax_scales: torch.Tensor | None,
    offset: torch.Tensor | None,
    nested_code: torch.Tensor | None,
    n: int,
    blocksize: int,
    dtype: torch.dtype,
    *,
    plan: FourBitDequantizePlan | None = None,
) -> torch.Tensor:
    """The n values (flat, in ``dtype``) of packed NF4 codes and their absmax (or its nested form). ``plan``: the
    tiles (FOURBIT_DEQUANTIZE unless given)."""
    out = torch.empty(n, dtype=dtype, device=packed.device)
    if n == 0:
        return out
    code, _, dynamic = nf4_tables(packed.device)
    nested = absmax is None
    tiles = plan or FOURBIT_DEQUANTIZE
    blocks = max(1, tiles.values // blocksize)
    _nf4_dequantize_kernel[(cdiv(cdiv(n, blocksize), blocks),)](
        packed, absmax, code, absmax_codes, absmax_scales, nested_code if nested_code is not None else dynamic,
        offset, out, n, cdiv(n, 2), BLOCKSIZE=blocksize, NESTED=nested, NESTED_BLOCK=NESTED_BLOCK, BLOCKS=blocks,
        num_warps=tiles.warps, enable_fp_fusion=False,  # separate roundings, as bitsandbytes' (an FMA would round once)
    )  # fmt: skip
    return out


def nf4_dequantize_fake(packed, absmax, absmax_codes, absmax_scales, offset, nested_code, n, blocksize, dtype):
    return packed.new_empty(n, dtype=dtype)


# ---------------------------------------------------------------- INT4 weights

_INT4_VALUES = 4096  # values per program tile of int4_quantize (16 KB of fp32)


def check_int4_quantize(w, group_size, symmetric) -> None:
    name = "int4_quantize"
    check_tensor(f"{name}: w", w, ndim=2, dtypes=FLOAT_DTYPES)
    if w.shape[1] % 2:
        raise ValueError(f"{name}: w's K (dim 1) must be even, two 4-bit codes a byte, got shape {tuple(w.shape)}")
    check_int4_group(name, group_size)
    if not isinstance(symmetric, bool):
        raise TypeError(f"{name}: symmetric must be a bool, got {type(symmetric).__name__}")
    check_device(w=w)


def int4_quantize_fwd(
    w: torch.Tensor, group_size: int, symmetric: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(codes uint8 (N, K / 2), scales fp32 (N, ceil(K / G)), zeros uint8 (N, ceil(K / G))) of w (N, K) (validated)."""
    n_rows, n_cols = w.shape
    groups = cdiv(n_cols, group_size)
    codes = torch.empty((n_rows, n_cols // 2), dtype=torch.uint8, device=w.device)
    scales = torch.empty((n_rows, groups), dtype=torch.float32, device=w.device)
    zeros = torch.empty((n_rows, groups), dtype=torch.uint8, device=w.device)
    if codes.numel() == 0:
        return codes, scales, zeros
    w = w if w.stride(1) == 1 else w.contiguous()
    rows = max(1, _INT4_VALUES // group_size)  # [rows, group / 2] tiles of even and of odd columns
    _int4_quantize_kernel[(cdiv(n_rows, rows), groups)](
        w, codes, scales, zeros, n_rows, n_cols, w.stride(0), codes.stride(0), scales.stride(0),
        GROUP=group_size, SYMMETRIC=symmetric, BLOCK_R=rows, num_warps=4,
    )  # fmt: skip
    return codes, scales, zeros


def int4_quantize_fake(w, group_size, symmetric):
    n_rows, n_cols = w.shape
    groups = cdiv(n_cols, group_size)
    return (w.new_empty((n_rows, n_cols // 2), dtype=torch.uint8), w.new_empty((n_rows, groups), dtype=torch.float32),
            w.new_empty((n_rows, groups), dtype=torch.uint8))  # fmt: skip


def check_int4_dequantize(qweight, scales, zeros, group_size, dtype) -> None:
    name = "int4_dequantize"
    check_int4_weight(name, qweight, scales, zeros, group_size)
    if dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name}: dtype must be one of float32, float16, bfloat16, got {dtype}")
    check_device(qweight=qweight, scales=scales, zeros=zeros)


def int4_dequantize_fwd(
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    group_size: int,
    dtype: torch.dtype,
    *,
    plan: FourBitDequantizePlan | None = None,
) -> torch.Tensor:
    """w' (N, K) in ``dtype`` of int4_quantize's tensors (validated). ``plan``: the tiles (FOURBIT_DEQUANTIZE unless
    given)."""
    n_rows, n_cols = qweight.shape[0], 2 * qweight.shape[1]
    out = torch.empty((n_rows, n_cols), dtype=dtype, device=qweight.device)
    if out.numel() == 0:
        return out
    qweight = qweight if qweight.stride(1) == 1 else qweight.contiguous()
    scales, zeros = scales.contiguous(), zeros.contiguous()
    tiles = plan or FOURBIT_DEQUANTIZE
    columns = max(group_size, min(next_power_of_2(n_cols), tiles.columns))  # whole groups a tile
    rows = max(1, tiles.values // columns)
    _int4_dequantize_kernel[(cdiv(n_rows, rows), cdiv(n_cols, columns))](
        qweight, scales, zeros, out, n_rows, n_cols, qweight.stride(0), scales.stride(0), out.stride(0),
        GROUP=group_size, BLOCK_R=rows, GROUPS=columns // group_size, num_warps=tiles.warps,
    )  # fmt: skip
    return out


def int4_dequantize_fake(qweight, scales, zeros, group_size, dtype):
    return qweight.new_empty((qweight.shape[0], 2 * qweight.shape[1]), dtype=dtype)
