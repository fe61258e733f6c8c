"""scaled_linear: validate, allocate, launch (tensors in, tensors out; ``plan=``).

x (..., K) is read as rows (M, K); w is (N, K). Scales by granularity (_core/scales.py): x tensor (), row (..., 1),
group (..., ceil(K / G)); w tensor (), row (N, 1), group (N, ceil(K / G)), block (ceil(N / G), ceil(K / G)).
"""

from __future__ import annotations

import torch

from tritonkit._core.checks import FLOAT_DTYPES, check_device, check_tensor, debug_checks
from tritonkit._core.device import arch, sm_count
from tritonkit._core.env import kernels_interpreted
from tritonkit._core.ints import cdiv, next_power_of_2
from tritonkit._core.row_sync import kept_counters
from tritonkit._core.scales import FORMATS, granularity_of
from tritonkit._core.tma import descriptor, has_tma, tma_readable
from tritonkit.ops.gemm.kernels import (
    _gemv_int8_words_kernel,
    _gemv_split_k_kernel,
    _pad_codes_kernel,
    _scaled_linear_kernel,
    _scaled_linear_persistent_kernel,
    _split_k_reduce_kernel,
)
from tritonkit.ops.gemm.plan import (
    REDUCE_OUTPUTS,
    REDUCE_WARPS,
    GemmTiles,
    GemvPlan,
    gemm_tiles,
    gemv_plan,
    splits_to_fill,
)

CODE_KINDS = {torch.int8: "int8", torch.float8_e4m3fn: "fp8", torch.float8_e5m2: "fp8"}
X_GRANULARITIES = ("tensor", "row", "group")
# The tensor cores' smallest K step for 8-bit operands (16 for 16-bit ones): 8-bit codes need groups of >= 32 values.
MIN_CODE_K = 32
MIN_VALUE_K = 16
W_GRANULARITIES = ("tensor", "row", "group", "block")
# dynamic_scaled_linear's groups are its K step: from the 8-bit codes' smallest to the tiles' largest step (a wider
# one would not fit the tiled kernel's pipeline in sm86/sm89's shared memory).
DYNAMIC_GROUPS = (32, 64, 128)
# Codes' rows are copied into rows padded with zeros to a multiple of this many K values when K is not one or a row
# starts off a 16-byte boundary: such rows, and a K mask that changes inside a 16-value run, make every load of codes
# one byte wide (int8 at 512 x 4096 x 4100 ran at 27.7 TOP/s on the H200, docs/kernels/gemm.md).
CODE_K_ALIGN = 16
# The padding copy's tile: 8 rows of 512 bytes, 32 bytes a thread at 4 warps.
PAD_BLOCK_ROWS, PAD_BLOCK_K = 8, 512


def _names(dtypes) -> str:
    return ", ".join(str(d).removeprefix("torch.") for d in dtypes)


def _granularity(name: str, arg: str, codes_shape: tuple, scale, allowed: tuple) -> tuple[str, int]:
    check_tensor(f"{name}: {arg}", scale, dtypes=(torch.float32,))
    found = granularity_of(codes_shape, tuple(scale.shape))
    if found is None or found[0] not in allowed:
        raise ValueError(f"{name}: {arg} of shape {tuple(scale.shape)} is no {'/'.join(allowed)} scale of codes "
                         f"{codes_shape}")  # fmt: skip
    return found


def _check_bias_and_out_dtype(name: str, w, bias, out_dtype) -> None:
    if bias is not None:
        check_tensor(f"{name}: bias", bias, ndim=1, dtypes=FLOAT_DTYPES)
        if bias.shape[0] != w.shape[0]:
            raise ValueError(f"{name}: bias must have w_q's {w.shape[0]} output features, got {bias.shape[0]}")
    if out_dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name}: out_dtype must be one of {_names(FLOAT_DTYPES)}, got {out_dtype}")


def _check_finite_scales(name: str, check_inputs, x, **scales) -> None:
    """Non-finite scales raise where reading them costs no synchronisation (CPU tensors), or when asked
    (check_inputs, TRITONKIT_DEBUG=1); never while torch.compile traces."""
    if not (debug_checks(f"{name}: check_inputs", check_inputs) or x.device.type == "cpu"):
        return
    for arg, scale in scales.items():
        if scale is not None and not torch.compiler.is_compiling() and not bool(torch.isfinite(scale).all()):
            raise ValueError(f"{name}: {arg} holds a non-finite value")


def check_scaled_linear(x, w, x_scale, w_scale, bias, out_dtype, use_fast_accum, check_inputs) -> None:
    """Validate scaled_linear's arguments; non-finite scales only with a host read (check_inputs, TRITONKIT_DEBUG=1,
    or CPU tensors)."""
    name = "scaled_linear"
    if not isinstance(use_fast_accum, bool):
        raise TypeError(f"{name}: use_fast_accum must be a bool, got {type(use_fast_accum).__name__}")
    check_tensor(f"{name}: x_q", x, dtypes=(*CODE_KINDS, torch.bfloat16, torch.float16, torch.float32))
    check_tensor(f"{name}: w_q", w, ndim=2, dtypes=tuple(CODE_KINDS))
    if x.dim() == 0:
        raise ValueError(f"{name}: x_q must have a last dimension K, got a 0-d tensor")
    if x.shape[-1] != w.shape[1]:
        raise ValueError(f"{name}: x_q's last dim and w_q's dim 1 (K) must match, got shapes {tuple(x.shape)} and "
                         f"{tuple(w.shape)}")  # fmt: skip
    weight_only = x.dtype not in CODE_KINDS
    if not weight_only and CODE_KINDS[x.dtype] != CODE_KINDS[w.dtype]:
        raise TypeError(f"{name}: x_q and w_q must both be int8 or both float8, got {x.dtype} and {w.dtype}")
    if weight_only:
        if x_scale is not None:
            raise ValueError(f"{name}: x_q holds {x.dtype} values (weight-only), so x_scale must be None")
        x_granularity = ("none", 0)
    else:
        if x_scale is None:
            raise ValueError(f"{name}: x_q holds {x.dtype} codes, so x_scale is needed (quantize's scale)")
        x_granularity = _granularity(name, "x_scale", tuple(x.shape), x_scale, X_GRANULARITIES)
    w_granularity = _granularity(name, "w_scale", tuple(w.shape), w_scale, W_GRANULARITIES)
    sizes = {size for _, size in (x_granularity, w_granularity) if size}
    if len(sizes) > 1:
        raise ValueError(f"{name}: x_scale's groups ({x_granularity[1]}) and w_scale's ({w_granularity[1]}) must "
                         "span the same number of K values")  # fmt: skip
    if sizes and not weight_only and min(sizes) < MIN_CODE_K:
        raise ValueError(f"{name}: groups and blocks of {min(sizes)} K values are too short for 8-bit codes: the "
                         f"tensor cores take them {MIN_CODE_K} at a time (quantize with block_size >= 32)")  # fmt: skip
    _check_bias_and_out_dtype(name, w, bias, out_dtype)
    tensors = {"x_q": x, "w_q": w, "w_scale": w_scale, **({"x_scale": x_scale} if x_scale is not None else {})}
    check_device(**tensors, **({"bias": bias} if bias is not None else {}))
    _check_finite_scales(name, check_inputs, x, x_scale=x_scale, w_scale=w_scale)


def _unit_k(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 or t.shape[-1] <= 1 else t.contiguous()


def _scale_rows(scale: torch.Tensor | None, granularity: str) -> tuple[torch.Tensor | None, int]:
    """The scale as the kernels read it (a 2-D view for row, group and block, unit stride along K) and its row
    stride. Group scales stored K-major (each group's column contiguous, as DeepGEMM takes them) are copied: read in
    place they made the block-scaled product 2-11% slower on the H200 (docs/kernels/gemm.md), the copy costs a few
    microseconds."""
    if scale is None or granularity == "tensor":
        return scale, 0
    rows = _unit_k(scale.reshape(-1, scale.shape[-1]))
    return rows, rows.stride(0)


def _zero_padded_k(codes: torch.Tensor, align: int) -> torch.Tensor:
    """2-D codes (unit stride along K) as rows of whole ``align``-byte units starting on ``align``-byte boundaries:
    the codes themselves where they already are, else a copy with K padded with zeros to a multiple of ``align``
    (zero bits are 0 in int8, e4m3 and e5m2, so the products and every scale group's sum are unchanged: a group of
    G >= 32 values, G a power of two, gains no new group since K and the padded K round up to the same number of
    groups). Copied by _pad_codes_kernel: torch's pad took about 50 us for 18 MB of codes on the H200
    (docs/kernels/gemm.md)."""
    rows, k = codes.shape
    k_out = cdiv(k, align) * align
    if k_out == k and (codes.stride(0) % align == 0 or rows <= 1) and codes.data_ptr() % align == 0:
        return codes
    out = torch.empty((rows, k_out), dtype=codes.dtype, device=codes.device)
    grid = (cdiv(rows, PAD_BLOCK_ROWS), cdiv(k_out, PAD_BLOCK_K))
    _pad_codes_kernel[grid](codes.view(torch.int8), out.view(torch.int8), rows, k, k_out, codes.stride(0),
                            BLOCK_R=PAD_BLOCK_ROWS, BLOCK_K=PAD_BLOCK_K)  # fmt: skip
    return out


def _varies_along_k(x_granularity: str, w_granularity: str) -> bool:
    """Whether a scale varies along K (x's groups, dynamic or stored, w's groups or blocks): each K step's sum is then
    scaled apart (kernels.py), so int8 sums leave int32 and fast accumulation has nothing to change."""
    return x_granularity in ("group", "dynamic") or w_granularity in ("group", "block")


def _output(x, w, bias, out_dtype) -> torch.Tensor:
    """out (..., N), allocated; already its value where there is nothing to multiply (no rows or outputs, or K = 0:
    the bias, or zeros)."""
    out = torch.empty((*x.shape[:-1], w.shape[0]), dtype=out_dtype, device=x.device)
    if out.numel() and w.shape[1] == 0:
        out.copy_(bias.expand(out.shape) if bias is not None else torch.zeros_like(out))
    return out


def choose_plan(weight_only: bool, m: int, n: int, device: torch.device, per_step: bool = False
                ) -> GemmTiles | GemvPlan:  # fmt: skip
    """The split-K GEMV for weight-only calls with few rows of x (plan.gemv_plan's bound), else the tiled or
    persistent kernel's tiles (plan.gemm_tiles; ``per_step``: a scale varies along K)."""
    gemv = weight_only and gemv_plan(arch(device), m, n, sm_count(device))
    return gemv or gemm_tiles(arch(device), m, weight_only=weight_only, n=n, per_step=per_step)


def scaled_linear_fwd(
    x: torch.Tensor,
    w: torch.Tensor,
    x_scale: torch.Tensor | None,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
    use_fast_accum: bool,
    *,
    plan: GemmTiles | GemvPlan | None = None,
) -> torch.Tensor:
    """out (..., N) in ``out_dtype`` of validated arguments (kernels.py's definition). ``use_fast_accum``: float8
    codes with tensor or row scales let the tensor cores sum over all of K (FP8_FAST_ACC); other calls ignore it.
    ``plan``: GemmTiles runs the tiled kernel, or the persistent one where its ``persistent`` asks and the call
    allows (_persistent_applies), GemvPlan the split-K GEMV (weight-only calls only); None: choose_plan."""
    weight_only = x.dtype not in CODE_KINDS
    if plan is not None and not isinstance(plan, (GemmTiles, GemvPlan)):
        raise TypeError(f"scaled_linear: plan must be a GemmTiles or a GemvPlan, got {type(plan).__name__}")
    if isinstance(plan, GemvPlan) and not weight_only:
        raise ValueError(f"scaled_linear: plan: the split-K GEMV takes weight-only calls (x in bf16, fp16 or fp32), "
                         f"got x_q in {x.dtype}")  # fmt: skip
    n_out, k = w.shape
    out = _output(x, w, bias, out_dtype)
    if out.numel() == 0 or k == 0:
        return out
    rows, w, out_rows = _unit_k(x.reshape(-1, k)), _unit_k(w), out.view(-1, n_out)
    x_granularity, x_size = ("none", 0) if weight_only else granularity_of(tuple(x.shape), tuple(x_scale.shape))
    w_granularity, w_size = granularity_of(tuple(w.shape), tuple(w_scale.shape))
    if not weight_only:
        rows, w = _zero_padded_k(rows, CODE_K_ALIGN), _zero_padded_k(w, CODE_K_ALIGN)
    group = max(x_size, w_size)
    x_scale, stride_xs = _scale_rows(x_scale, x_granularity)
    w_scale, stride_ws = _scale_rows(w_scale, w_granularity)
    per_step = _varies_along_k(x_granularity, w_granularity)
    tiles = plan or choose_plan(weight_only, rows.shape[0], n_out, x.device, per_step)
    block_k = min(tiles.block_k, group) if group else tiles.block_k
    block_k = max(block_k, MIN_VALUE_K if weight_only else MIN_CODE_K)
    upcast = kernels_interpreted()  # the interpreter's 8- and 16-bit products go through fp32 (exact for these codes)
    precision = "ieee" if x.dtype == torch.float32 else "tf32"
    if isinstance(tiles, GemvPlan):
        _gemv(rows, w, w_scale, stride_ws, w_granularity, max(group, 1), bias, out_rows, tiles, block_k, precision)
        return out
    if tiles.persistent and _persistent_applies(rows, w, out_rows):
        _persistent(rows, w, x_scale, stride_xs, w_scale, stride_ws, bias, out_rows, tiles, block_k,
                    use_fast_accum, X_SCALE=x_granularity, W_SCALE=w_granularity, G=max(group, 1),
                    INT_ACC=x.dtype == torch.int8 and not per_step and not upcast)  # fmt: skip
        return out
    _tiled(rows, w, x_scale, stride_xs, w_scale, stride_ws, bias, out_rows, tiles, block_k, use_fast_accum,
           X_SCALE=x_granularity, W_SCALE=w_granularity, G=max(group, 1),
           INT_ACC=x.dtype == torch.int8 and not per_step and not upcast,
           DOT_PRECISION=precision)  # fmt: skip
    return out


def _tiled(rows, w, x_scale, stride_xs, w_scale, stride_ws, bias, out_rows, tiles: GemmTiles, block_k: int,
           fast_accum: bool, **constexprs) -> None:  # fmt: skip
    """The tiled kernel over rows (M, K) and w (N, K) into out_rows (M, N), with tiles' plan and a K step of
    block_k; stride_xs, stride_ws: x_scale's and w_scale's row strides (_scale_rows);
    ``fast_accum``: float8 sums over all of K in the tensor cores (where no scale varies along K); ``constexprs``: the
    scales' forms and the product's (kernels.py)."""
    m, n = out_rows.shape
    float8_product = CODE_KINDS.get(w.dtype) == "fp8" and constexprs["X_SCALE"] != "none"
    per_step = _varies_along_k(constexprs["X_SCALE"], constexprs["W_SCALE"])
    _scaled_linear_kernel[(cdiv(m, tiles.block_m) * cdiv(n, tiles.block_n),)](
        rows, w, x_scale, w_scale, bias, out_rows, m, n, w.shape[1],
        rows.stride(0), w.stride(0), stride_xs, stride_ws, out_rows.stride(0),
        HAS_BIAS=bias is not None, UPCAST=kernels_interpreted(), **constexprs,
        FP8_PROMOTE=(min(tiles.fp8_promote, block_k) or None) if float8_product else None,
        FP8_FAST_ACC=fast_accum and float8_product and not per_step,
        BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, BLOCK_K=block_k, GROUP_SIZE=tiles.group,
        num_warps=tiles.warps, num_stages=tiles.stages,
    )  # fmt: skip


def _persistent_applies(rows, w, out_rows) -> bool:
    """Whether the persistent kernel takes a call: codes in x (not weight-only), a GPU with TMA (or the interpreter),
    and rows, w and out that tensor descriptors can address (K and the output's rows 16-byte aligned)."""
    return (rows.dtype in CODE_KINDS and has_tma(arch(rows.device))
            and all(tma_readable(t) for t in (rows, w, out_rows)))  # fmt: skip


def _persistent(rows, w, x_scale, stride_xs, w_scale, stride_ws, bias, out_rows, tiles: GemmTiles, block_k: int,
                fast_accum: bool, **constexprs) -> None:  # fmt: skip
    """The persistent kernel over rows (M, K) and w (N, K) into out_rows (M, N): one program per multiprocessor at
    most, tiles' plan with a K step of block_k; ``fast_accum`` and ``constexprs`` as _tiled's."""
    m, n = out_rows.shape
    n_programs = min(sm_count(rows.device), cdiv(m, tiles.block_m) * cdiv(n, tiles.block_n))
    store_n = tiles.block_n // 2 if tiles.split_store else tiles.block_n
    float8_product = CODE_KINDS[w.dtype] == "fp8"
    per_step = _varies_along_k(constexprs["X_SCALE"], constexprs["W_SCALE"])
    _scaled_linear_persistent_kernel[(n_programs,)](
        descriptor(rows, [tiles.block_m, block_k]), descriptor(w, [tiles.block_n, block_k]),
        descriptor(out_rows, [tiles.block_m, store_n]), x_scale, w_scale, bias, m, n, w.shape[1], stride_xs, stride_ws,
        n_programs, HAS_BIAS=bias is not None, UPCAST=kernels_interpreted(), **constexprs,
        FP8_PROMOTE=(min(tiles.fp8_promote, block_k) or None) if float8_product else None,
        FP8_FAST_ACC=fast_accum and float8_product and not per_step, SPLIT_STORE=tiles.split_store,
        BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, BLOCK_K=block_k,
        GROUP_SIZE=tiles.group, num_warps=tiles.warps, num_stages=tiles.stages,
    )  # fmt: skip


def check_dynamic_scaled_linear(x, w, w_scale, bias, out_dtype, group_size, x_dtype, check_inputs) -> None:
    """Validate dynamic_scaled_linear's arguments (those it shares with scaled_linear as scaled_linear does)."""
    name = "dynamic_scaled_linear"
    check_tensor(f"{name}: x", x, dtypes=FLOAT_DTYPES)
    if not isinstance(group_size, int) or isinstance(group_size, bool) or group_size not in DYNAMIC_GROUPS:
        raise ValueError(f"{name}: group_size must be one of {', '.join(map(str, DYNAMIC_GROUPS))}, got "
                         f"{group_size!r}")  # fmt: skip
    check_tensor(f"{name}: w_q", w, ndim=2, dtypes=tuple(CODE_KINDS))
    if x_dtype not in CODE_KINDS or CODE_KINDS[x_dtype] != CODE_KINDS[w.dtype]:
        raise TypeError(f"{name}: x_dtype must be int8 with int8 w_q, or a float8 with float8 w_q; got {x_dtype} "
                        f"with w_q in {w.dtype}")  # fmt: skip
    if x.dim() == 0 or x.shape[-1] != w.shape[1]:
        raise ValueError(f"{name}: x's last dim and w_q's dim 1 (K) must match, got shapes {tuple(x.shape)} and "
                         f"{tuple(w.shape)}")  # fmt: skip
    w_granularity, w_size = _granularity(name, "w_scale", tuple(w.shape), w_scale, W_GRANULARITIES)
    if w_size and w_size != group_size:
        raise ValueError(f"{name}: w_scale's {w_granularity}s span {w_size} K values, but group_size is "
                         f"{group_size}: they must match")  # fmt: skip
    _check_bias_and_out_dtype(name, w, bias, out_dtype)
    check_device(x=x, w_q=w, w_scale=w_scale, **({"bias": bias} if bias is not None else {}))
    _check_finite_scales(name, check_inputs, x, w_scale=w_scale)


def dynamic_scaled_linear_fwd(
    x: torch.Tensor,
    w: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
    group_size: int,
    x_dtype: torch.dtype,
    *,
    plan: GemmTiles | None = None,
) -> torch.Tensor:
    """out (..., N) of validated arguments: x quantized to x_dtype in 1 x group_size groups inside the tiled
    kernel (kernels.py, dynamic activations), whose K step is the group. ``plan``: GemmTiles (its block_k is
    replaced by group_size), or None: the tiled kernel's plan for x's rows."""
    if plan is not None and not isinstance(plan, GemmTiles):
        raise TypeError(f"dynamic_scaled_linear: plan must be a GemmTiles, got {type(plan).__name__}")
    n_out, k = w.shape
    out = _output(x, w, bias, out_dtype)
    if out.numel() == 0 or k == 0:
        return out
    rows, w, out_rows = _unit_k(x.reshape(-1, k)), _unit_k(w), out.view(-1, n_out)
    w_granularity, _ = granularity_of(tuple(w.shape), tuple(w_scale.shape))
    w_scale, stride_ws = _scale_rows(w_scale, w_granularity)
    tiles = plan or gemm_tiles(arch(x.device), rows.shape[0])
    _tiled(
        rows,
        w,
        None,
        0,
        w_scale,
        stride_ws,
        bias,
        out_rows,
        tiles,
        group_size,
        False,  # each group's sum is scaled apart: there is no sum over K for the tensor cores to keep
        X_SCALE="dynamic",
        W_SCALE=w_granularity,
        G=group_size,
        INT_ACC=False,
        DOT_PRECISION="tf32",
        KIND=FORMATS[x_dtype],
    )
    return out


def dynamic_scaled_linear_fake(x, w, w_scale, bias, out_dtype, group_size, x_dtype):
    return x.new_empty((*x.shape[:-1], w.shape[0]), dtype=out_dtype)


def _words_apply(w: torch.Tensor, w_granularity: str, plan: GemvPlan, block_k: int) -> bool:
    """Whether the one-row GEMV reads w's int8 codes as int32 words (GemvPlan.words, which only one-row plans take): a
    tensor or row scale (nothing varies along K), and rows of whole, 4-byte aligned words (the int32 view exists)."""
    return (plan.words and w.dtype == torch.int8 and w_granularity in ("tensor", "row")
            and w.shape[1] % 4 == 0 and w.stride(0) % 4 == 0 and w.storage_offset() % 4 == 0 and block_k % 4 == 0
            and w.data_ptr() % 4 == 0)  # fmt: skip


def _gemv(rows, w, w_scale, stride_ws, w_granularity, group, bias, out_rows, plan: GemvPlan, block_k: int,
          precision: str) -> None:  # fmt: skip
    """The split-K GEMV (kernels.py): K cut into splits of whole block_k steps (plan.splits_to_fill), then, with more
    than one, the partials summed in split order: by a second launch, or with plan.last_split_sums by each output
    tile's last split to finish (counted in at a zeroed int32 a tile)."""
    m, k = rows.shape
    n = w.shape[0]
    splits = splits_to_fill(n, k, m, sm_count(rows.device), plan)
    k_per_split = cdiv(cdiv(k, splits), block_k) * block_k
    splits = cdiv(k, k_per_split)
    partial = rows.new_empty((splits, m, n), dtype=torch.float32) if splits > 1 else None
    scales = {"W_SCALE": w_granularity, "G": group, "HAS_BIAS": bias is not None}
    words = _words_apply(w, w_granularity, plan, block_k)
    tiles = cdiv(m, plan.block_m) * cdiv(n, plan.block_n)
    last_split_sums = splits > 1 and plan.last_split_sums
    arrivals = kept_counters(tiles, rows.device) if last_split_sums else None
    if words:
        _gemv_int8_words_kernel[(tiles, splits)](
            rows, w.view(torch.int32), w_scale, bias, out_rows, partial, arrivals, m, n, k // 4, k_per_split // 4,
            splits, rows.stride(0), w.stride(0) // 4, stride_ws, out_rows.stride(0),
            W_SCALE=w_granularity, HAS_BIAS=bias is not None, SPLIT=splits > 1, LAST_SPLIT_SUMS=last_split_sums,
            STAGES=plan.stages, BLOCK_N=plan.block_n, BLOCK_K=block_k, num_warps=plan.warps, num_stages=plan.stages,
        )  # fmt: skip
    else:
        _gemv_split_k_kernel[(tiles, splits)](
            rows, w, w_scale, bias, out_rows, partial, arrivals, m, n, k, k_per_split, splits,
            rows.stride(0), w.stride(0), stride_ws, out_rows.stride(0),
            **scales, SPLIT=splits > 1, LAST_SPLIT_SUMS=last_split_sums, DOT_PRECISION=precision,
            UPCAST=kernels_interpreted(), STAGES=plan.stages, BLOCK_M=plan.block_m, BLOCK_N=plan.block_n,
            BLOCK_K=block_k, num_warps=plan.warps, num_stages=plan.stages,
        )  # fmt: skip
    if splits > 1 and not last_split_sums:
        block_m = min(next_power_of_2(m), 16)
        block_n = REDUCE_OUTPUTS // block_m
        _split_k_reduce_kernel[(cdiv(m, block_m) * cdiv(n, block_n),)](
            partial, w_scale, bias, out_rows, m, n, splits, stride_ws, out_rows.stride(0),
            **scales, BLOCK_M=block_m, BLOCK_N=block_n, num_warps=REDUCE_WARPS,
        )  # fmt: skip


def scaled_linear_fake(x, w, x_scale, w_scale, bias, out_dtype, use_fast_accum):
    return x.new_empty((*x.shape[:-1], w.shape[0]), dtype=out_dtype)
