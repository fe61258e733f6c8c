"""quantize and dequantize: validate, allocate, launch (tensors in, tensors out; ``plan=``).

x is read as rows of its last dimension, (M, K) = (x.numel() / K, K). Scales by granularity: "tensor" (), "row"
(..., 1), "group" (..., ceil(K / G)), "block" (ceil(M / G), ceil(K / G)) for a 2-D x; G is ``block_size``.
"""

from __future__ import annotations

import torch

from tritonkit._core.checks import FLOAT_DTYPES, check_device, check_tensor
from tritonkit._core.device import arch
from tritonkit._core.ints import cdiv
from tritonkit._core.scales import MIN_BLOCK, granularity_of
from tritonkit.ops.quant.kernels import (
    _amax_kernel,
    _dequantize_kernel,
    _quantize_blocks_kernel,
    _quantize_groups_kernel,
)
from tritonkit.ops.quant.plan import QuantPlan, blocks_plan, elementwise_plan, groups_plan

KINDS = {torch.int8: "int8", torch.float8_e4m3fn: "e4m3", torch.float8_e5m2: "e5m2"}  # dtype -> the kernels' name
QMAX = {torch.int8: 127.0, torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}
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
    if dtype not in KINDS:
        raise TypeError(f"{name}: dtype must be one of {_names(KINDS)}, got {dtype}")
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


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x as (M, K) with unit stride along K (a copy when it has none)."""
    rows = x.reshape(-1, x.shape[-1]) if x.dim() else x.reshape(1, 1)
    return rows if rows.stride(1) == 1 or rows.shape[1] <= 1 else rows.contiguous()


def quantize_fwd(
    x: torch.Tensor, dtype: torch.dtype, granularity: str, block_size: int, *, plan: QuantPlan | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes in x's shape and ``dtype``, fp32 scales) of validated arguments (kernels.py's definition)."""
    codes = torch.empty(x.shape, dtype=dtype, device=x.device)
    scale = torch.empty(scale_shape(tuple(x.shape), granularity, block_size), dtype=torch.float32, device=x.device)
    if x.numel() == 0:
        return codes, scale
    rows = _rows(x)
    code_rows = codes.view(rows.shape)
    n_rows, n_cols = rows.shape
    kind = KINDS[dtype]
    if granularity == "block":
        tiles = plan or blocks_plan(arch(x.device), block_size)
        _quantize_blocks_kernel[(scale.shape[0], scale.shape[1])](
            rows, code_rows, scale, n_rows, n_cols, rows.stride(0), code_rows.stride(0), scale.stride(0),
            KIND=kind, BLOCK=block_size, CHUNK_R=tiles.block_r, num_warps=tiles.warps,
        )  # fmt: skip
        return codes, scale
    group = block_size if granularity == "group" else n_cols
    tiles = plan or groups_plan(arch(x.device), group)
    amax = scale  # a stand-in pointer unless the tensor's amax is needed
    if granularity == "tensor":
        amax = torch.zeros(1, dtype=torch.float32, device=x.device)
        whole = elementwise_plan(arch(x.device), n_cols)
        _amax_kernel[(cdiv(n_rows, whole.block_r), cdiv(n_cols, whole.block_c))](
            rows, amax, n_rows, n_cols, rows.stride(0), BLOCK_R=whole.block_r, BLOCK_C=whole.block_c,
            num_warps=whole.warps,
        )  # fmt: skip
    scale_rows = scale.view(n_rows, -1) if granularity != "tensor" else scale
    _quantize_groups_kernel[(cdiv(n_rows, tiles.block_r), cdiv(n_cols, group))](
        rows, code_rows, scale_rows, amax, n_rows, n_cols, group, rows.stride(0), code_rows.stride(0),
        scale_rows.stride(0) if granularity != "tensor" else 0,
        KIND=kind, TENSOR=granularity == "tensor", BLOCK_R=tiles.block_r, BLOCK_C=tiles.block_c,
        num_warps=tiles.warps,
    )  # fmt: skip
    return codes, scale


def quantize_fake(x, dtype, granularity, block_size):
    shape = scale_shape(tuple(x.shape), granularity, block_size)
    return x.new_empty(x.shape, dtype=dtype), x.new_empty(shape, dtype=torch.float32)


def check_dequantize(codes, scale, dtype) -> tuple[str, int]:
    name = "dequantize"
    check_tensor(f"{name}: xq", codes, dtypes=tuple(KINDS))
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
    rows = _rows(codes)
    out_rows = out.view(rows.shape)
    n_rows, n_cols = rows.shape
    scale_rows = scale.reshape(1, 1) if granularity == "tensor" else scale.reshape(-1, scale.shape[-1])
    scale_rows = scale_rows if scale_rows.stride(-1) == 1 else scale_rows.contiguous()
    rows_per_scale = {"tensor": n_rows, "row": 1, "group": 1, "block": size}[granularity]
    cols_per_scale = {"tensor": n_cols, "row": n_cols, "group": size, "block": size}[granularity]
    tiles = plan or elementwise_plan(arch(codes.device), n_cols)
    _dequantize_kernel[(cdiv(n_rows, tiles.block_r), cdiv(n_cols, tiles.block_c))](
        rows, scale_rows, out_rows, n_rows, n_cols, rows_per_scale, cols_per_scale, rows.stride(0),
        scale_rows.stride(0), out_rows.stride(0), BLOCK_R=tiles.block_r, BLOCK_C=tiles.block_c, num_warps=tiles.warps,
    )  # fmt: skip
    return out


def dequantize_fake(codes, scale, dtype):
    return codes.new_empty(codes.shape, dtype=dtype)
