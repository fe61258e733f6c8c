"""RoPE's launcher: validate the public arguments, allocate, launch (tensors in, tensors out; ``plan=``)."""

from __future__ import annotations

import torch

from tritonkit._core.checks import FLOAT_DTYPES, check_device, check_same_dtype, check_tensor
from tritonkit._core.device import arch
from tritonkit._core.ints import next_power_of_2
from tritonkit.ops.rotary.kernels import _rope_kernel
from tritonkit.ops.rotary.plan import RopePlan, rope_plan

HEADS_DIM = {"bhtd": 1, "bthd": 2}  # layout -> the dimension of q and k that indexes heads
LAYOUTS = tuple(HEADS_DIM)
POSITION_DTYPES = (torch.int32, torch.int64)


def check_rope_args(q, k, cos, sin, position_ids, layout, rotary_dim) -> int:
    """Validate; return the rotary width R."""
    if layout not in LAYOUTS:
        raise ValueError(f"rope: layout must be one of {LAYOUTS}, got {layout!r}")
    check_tensor("q", q, ndim=4, dtypes=FLOAT_DTYPES)
    check_tensor("k", k, ndim=4, dtypes=FLOAT_DTYPES)
    check_same_dtype("q", q, "k", k)
    heads_dim = HEADS_DIM[layout]
    names = "(batch, heads, tokens, head_dim)" if layout == "bhtd" else "(batch, tokens, heads, head_dim)"
    for dim, what in ((0, "batch size"), (3 - heads_dim, "number of tokens"), (3, "head_dim")):
        if q.shape[dim] != k.shape[dim]:
            raise ValueError(f"rope: q and k must have the same {what} (layout {layout!r}: {names}), got shapes "
                             f"{tuple(q.shape)} and {tuple(k.shape)}")  # fmt: skip
    n_batch, n_tokens, head_dim = q.shape[0], q.shape[3 - heads_dim], q.shape[3]
    if rotary_dim is None:
        rotary_dim = head_dim
        if head_dim % 2:
            raise ValueError(f"rope: head_dim is odd ({head_dim}): pass an even rotary_dim < head_dim to rotate "
                             "only the first rotary_dim columns")  # fmt: skip
    elif isinstance(rotary_dim, bool) or not isinstance(rotary_dim, int):
        raise TypeError(f"rope: rotary_dim must be an int or None, got {type(rotary_dim).__name__}")
    if rotary_dim % 2 or not 2 <= rotary_dim <= head_dim:
        raise ValueError(f"rope: rotary_dim must be even and in [2, head_dim={head_dim}], got {rotary_dim}")
    check_tensor("cos", cos, dtypes=FLOAT_DTYPES)
    check_tensor("sin", sin, dtypes=FLOAT_DTYPES)
    if cos.shape != sin.shape:
        raise ValueError(f"rope: cos and sin must have the same shape, got {tuple(cos.shape)} and {tuple(sin.shape)}")
    if position_ids is None:
        expected = f"(T, R), (1, T, R) or (B, T, R) = ({n_tokens}, {rotary_dim}), (1, {n_tokens}, {rotary_dim}) " \
                   f"or ({n_batch}, {n_tokens}, {rotary_dim})"  # fmt: skip
        ok = cos.shape == (n_tokens, rotary_dim) or (
            cos.dim() == 3 and cos.shape[0] in (1, n_batch) and cos.shape[1:] == (n_tokens, rotary_dim)
        )
    else:
        check_tensor("position_ids", position_ids, ndim=2, dtypes=POSITION_DTYPES)
        if position_ids.shape[1] != n_tokens or position_ids.shape[0] not in (1, n_batch):
            raise ValueError(f"rope: position_ids must have shape ({n_batch}, {n_tokens}) or (1, {n_tokens}), got "
                             f"{tuple(position_ids.shape)}")  # fmt: skip
        expected = f"(max_position, R) with R = {rotary_dim}, rows gathered by position_ids"
        ok = cos.dim() == 2 and cos.shape[1] == rotary_dim
    if not ok:
        rotary_hint = "" if cos.shape[-1] == rotary_dim else f" (R is rotary_dim, or head_dim={head_dim} when None)"
        raise ValueError(f"rope: cos and sin must have shape {expected}{rotary_hint}, got {tuple(cos.shape)}")
    if torch.is_grad_enabled() and (cos.requires_grad or sin.requires_grad):
        raise ValueError("rope: cos and sin are constants and get no gradient, but one requires grad; compute "
                         "them under torch.no_grad() or pass cos.detach() and sin.detach()")  # fmt: skip
    tensors = {"q": q, "k": k, "cos": cos, "sin": sin}
    check_device(**tensors, **({"position_ids": position_ids} if position_ids is not None else {}))
    return rotary_dim


def _bhtd_strides(x: torch.Tensor, heads_dim: int) -> tuple[int, int, int, int]:
    """x's strides in (batch, head, token, dim) order, whichever of dims 1 and 2 holds the heads."""
    return tuple(x.stride(dim) for dim in ((0, 1, 2, 3) if heads_dim == 1 else (0, 2, 1, 3)))


def _batch_stride(t: torch.Tensor) -> int:
    """Stride of dim 0, or 0 where one batch row serves every sequence."""
    return t.stride(0) if t.shape[0] > 1 else 0


def _heads_block(n_heads: int, block_half: int, plan: RopePlan) -> int:
    """Heads per pass of the head loop: as many as keep a [heads, half] tile within the plan's elements (8 of
    Llama's 32 heads of 128 on sm90), at least one."""
    return min(next_power_of_2(max(n_heads, 1)), max(1, plan.half_tile // block_half))


def rope_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    position_ids: torch.Tensor | None,
    heads_dim: int,
    backward: bool,
    *,
    plan: RopePlan | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q: (B, Hq, T, D) with heads_dim=1 or (B, T, Hq, D) with heads_dim=2, k the same with Hk heads,
    any strides. cos, sin: (1 or B, T, R), or (1, P, R) rows gathered by position_ids (1 or B, T).
    Returns new (q_embed, k_embed) in q's and k's layout (dense inputs keep their strides), or with
    ``backward`` the input gradients for output gradients passed as q and k. ``plan``: the measured plan unless a
    sweep or a test gives one."""
    q_out = torch.empty_like(q, memory_format=torch.preserve_format)
    k_out = torch.empty_like(k, memory_format=torch.preserve_format)
    n_batch, n_tokens, head_dim = q.shape[0], q.shape[3 - heads_dim], q.shape[3]
    if n_batch * n_tokens == 0:
        return q_out, k_out
    half = cos.shape[-1] // 2
    n_pass = head_dim - 2 * half
    block_half = next_power_of_2(half)
    plan = plan or rope_plan(arch(q.device))
    block_hq = _heads_block(q.shape[heads_dim], block_half, plan)
    block_hk = _heads_block(k.shape[heads_dim], block_half, plan)
    has_pos = position_ids is not None
    pos_strides = (_batch_stride(position_ids), position_ids.stride(1)) if has_pos else (0, 0)
    _rope_kernel[(n_batch * n_tokens,)](
        q, k, cos, sin, position_ids if has_pos else cos, q_out, k_out,
        n_tokens, q.shape[heads_dim], k.shape[heads_dim], half, n_pass, cos.shape[1],
        *_bhtd_strides(q, heads_dim), *_bhtd_strides(k, heads_dim),
        *_bhtd_strides(q_out, heads_dim), *_bhtd_strides(k_out, heads_dim),
        _batch_stride(cos), cos.stride(1), cos.stride(2), _batch_stride(sin), sin.stride(1), sin.stride(2),
        *pos_strides,
        BACKWARD=backward, HAS_POS=has_pos, BLOCK_HQ=block_hq, BLOCK_HK=block_hk, BLOCK_HALF=block_half,
        BLOCK_PASS=next_power_of_2(n_pass) if n_pass else 0,
        num_warps=plan.warps,
    )  # fmt: skip
    return q_out, k_out


def rope_fake(q, k, cos, sin, position_ids, heads_dim, backward):
    return torch.empty_like(q), torch.empty_like(k)
