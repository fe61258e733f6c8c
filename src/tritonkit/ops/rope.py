"""Rotary position embedding (RoPE) of q and k, Hugging Face's rotate-half convention, forward and backward.

``q_embed = q * cos + rotate_half(q) * sin`` on the first ``rotary_dim`` columns of each head, with
``rotate_half(x) = cat(-x2, x1)`` (x1, x2 the two halves), the other columns copied; the same for k.
This is ``apply_rotary_pos_emb`` of transformers' Llama, and its partial-rotary form (GPT-NeoX, Phi).

One program handles one (batch, token) pair: it reads that token's cos/sin row once and rotates every
head of q and of k with it, so each byte of q, k, cos and sin is read once and each output byte written
once. The rotation is orthogonal, so the backward is the same kernel with sin negated (and its halves
swapped, which keeps it exact for tables whose halves differ): one kernel, a ``BACKWARD`` switch.

cos and sin are constants: no gradient flows to them, and passing ones that require grad raises.

No ``from __future__ import annotations`` here: torch.library reads the launchers' type hints at runtime.
"""

# ruff: noqa: UP045 - torch.library's schema inference (torch 2.6 and up) is built on typing.Optional

from typing import Optional

import torch
import triton
import triton.language as tl

from tritonkit._core import alloc
from tritonkit._core.checks import FLOAT_DTYPES, check_device, check_same_dtype, check_tensor
from tritonkit._core.dispatch import cheapest_path
from tritonkit._core.ints import next_power_of_2
from tritonkit.registry import Inputs, KernelSpec, register

__all__ = ["rope"]

HEADS_DIM = {"bhtd": 1, "bthd": 2}  # layout -> the dimension of q and k that indexes heads
LAYOUTS = tuple(HEADS_DIM)
POSITION_DTYPES = (torch.int32, torch.int64)
# Elements of one [heads, rotary_dim / 2] tile a program holds at a time: 8 heads of 128 with 4 warps
# was the fastest on the H200 in both layouts (benchmarks/rope_configs.py: 86% of copy bandwidth, where
# 32 heads with 8 warps, the first guess, ran fwd+bwd at 63% and 36%).
MAX_HALF_TILE = 512


@triton.jit
def _rotate_heads(
    p_x, p_y, n_heads, stride_x_h, stride_x_d, stride_y_h, stride_y_d, b_cos1, b_cos2, b_sin1, b_sin2,
    half, n_pass, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_PASS: tl.constexpr,
):  # fmt: skip
    """Every head of one token: y1 = x1 * cos1 - x2 * sin1, y2 = x2 * cos2 + x1 * sin2 over the rotary
    columns [0, half) and [half, 2 * half); columns [2 * half, 2 * half + n_pass) copied (BLOCK_PASS > 0)."""
    o_d = tl.arange(0, BLOCK_HALF)
    m_d = o_d < half
    for h_start in range(0, n_heads, BLOCK_H):
        o_h = (h_start + tl.arange(0, BLOCK_H)).to(tl.int64)  # head * stride can pass 2**31
        m_h = o_h < n_heads
        m_hd = m_h[:, None] & m_d[None, :]
        p_x1 = p_x + o_h[:, None] * stride_x_h + o_d[None, :] * stride_x_d
        p_y1 = p_y + o_h[:, None] * stride_y_h + o_d[None, :] * stride_y_d
        b_x1 = tl.load(p_x1, mask=m_hd, other=0.0).to(tl.float32)  # [BLOCK_H, BLOCK_HALF]
        b_x2 = tl.load(p_x1 + half * stride_x_d, mask=m_hd, other=0.0).to(tl.float32)  # [BLOCK_H, BLOCK_HALF]
        tl.store(p_y1, (b_x1 * b_cos1[None, :] - b_x2 * b_sin1[None, :]).to(p_y.dtype.element_ty), mask=m_hd)
        b_y2 = b_x2 * b_cos2[None, :] + b_x1 * b_sin2[None, :]
        tl.store(p_y1 + half * stride_y_d, b_y2.to(p_y.dtype.element_ty), mask=m_hd)
        if BLOCK_PASS > 0:
            o_p = 2 * half + tl.arange(0, BLOCK_PASS)
            m_hp = m_h[:, None] & (o_p < 2 * half + n_pass)[None, :]
            b_pass = tl.load(p_x + o_h[:, None] * stride_x_h + o_p[None, :] * stride_x_d, mask=m_hp)
            tl.store(p_y + o_h[:, None] * stride_y_h + o_p[None, :] * stride_y_d, b_pass, mask=m_hp)


@triton.jit
def _rope_kernel(
    p_q, p_k, p_cos, p_sin, p_pos, p_q_out, p_k_out,
    n_tokens, n_q_heads, n_k_heads, half, n_pass, n_positions,
    stride_q_b, stride_q_h, stride_q_t, stride_q_d, stride_k_b, stride_k_h, stride_k_t, stride_k_d,
    stride_qo_b, stride_qo_h, stride_qo_t, stride_qo_d, stride_ko_b, stride_ko_h, stride_ko_t, stride_ko_d,
    stride_cos_b, stride_cos_t, stride_cos_d, stride_sin_b, stride_sin_t, stride_sin_d, stride_pos_b, stride_pos_t,
    BACKWARD: tl.constexpr, HAS_POS: tl.constexpr, BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr,
    BLOCK_HALF: tl.constexpr, BLOCK_PASS: tl.constexpr,
):  # fmt: skip
    """RoPE of token (b, t) = divmod(program id, n_tokens), all heads of q and k (strides in b, h, t, d order).

    Forward, with c = (c1, c2), s = (s1, s2) the halves of this token's cos and sin rows (row
    position_ids[b, t] when HAS_POS, else row t of batch b, or of the one shared batch):
      y1 = x1 * c1 - x2 * s1,  y2 = x2 * c2 + x1 * s2,  pass-through columns copied.
    Backward (BACKWARD), the transpose of that rotation, given the output gradients g:
      dx1 = g1 * c1 + g2 * s2,  dx2 = g2 * c2 - g1 * s1,
    which is the forward with (s1, s2) replaced by (-s2, -s1). A position outside [0, n_positions)
    reads NaN instead of memory outside the table, so its row comes out NaN.
    """
    i_bt = tl.program_id(0).to(tl.int64)
    i_b = i_bt // n_tokens
    i_t = i_bt % n_tokens
    o_d = tl.arange(0, BLOCK_HALF)
    m_d = o_d < half
    if HAS_POS:
        i_row = tl.load(p_pos + i_b * stride_pos_b + i_t * stride_pos_t).to(tl.int64)
        m_d = m_d & (i_row >= 0) & (i_row < n_positions)
    else:
        i_row = i_t
    p_cos_row = p_cos + i_b * stride_cos_b + i_row * stride_cos_t + o_d * stride_cos_d
    p_sin_row = p_sin + i_b * stride_sin_b + i_row * stride_sin_t + o_d * stride_sin_d
    b_cos1 = tl.load(p_cos_row, mask=m_d, other=float("nan")).to(tl.float32)  # [BLOCK_HALF]
    b_cos2 = tl.load(p_cos_row + half * stride_cos_d, mask=m_d, other=float("nan")).to(tl.float32)
    b_sin1 = tl.load(p_sin_row, mask=m_d, other=float("nan")).to(tl.float32)
    b_sin2 = tl.load(p_sin_row + half * stride_sin_d, mask=m_d, other=float("nan")).to(tl.float32)
    if BACKWARD:
        b_minus_sin1 = -b_sin1
        b_sin1 = -b_sin2
        b_sin2 = b_minus_sin1
    _rotate_heads(
        p_q + i_b * stride_q_b + i_t * stride_q_t, p_q_out + i_b * stride_qo_b + i_t * stride_qo_t, n_q_heads,
        stride_q_h, stride_q_d, stride_qo_h, stride_qo_d, b_cos1, b_cos2, b_sin1, b_sin2, half, n_pass,
        BLOCK_HQ, BLOCK_HALF, BLOCK_PASS,
    )  # fmt: skip
    _rotate_heads(
        p_k + i_b * stride_k_b + i_t * stride_k_t, p_k_out + i_b * stride_ko_b + i_t * stride_ko_t, n_k_heads,
        stride_k_h, stride_k_d, stride_ko_h, stride_ko_d, b_cos1, b_cos2, b_sin1, b_sin2, half, n_pass,
        BLOCK_HK, BLOCK_HALF, BLOCK_PASS,
    )  # fmt: skip


# --------------------------------------------------------------------------------------------------
# Launcher (tensors in, tensors out)
# --------------------------------------------------------------------------------------------------
def _bhtd_strides(x: torch.Tensor, heads_dim: int) -> tuple[int, int, int, int]:
    """x's strides in (batch, head, token, dim) order, whichever of dims 1 and 2 holds the heads."""
    return tuple(x.stride(dim) for dim in ((0, 1, 2, 3) if heads_dim == 1 else (0, 2, 1, 3)))


def _batch_stride(t: torch.Tensor) -> int:
    """Stride of dim 0, or 0 where one batch row serves every sequence."""
    return t.stride(0) if t.shape[0] > 1 else 0


def _heads_block(n_heads: int, block_half: int) -> int:
    """Heads per pass of the head loop: as many as keep a [heads, half] tile within MAX_HALF_TILE elements
    (8 of Llama's 32 heads of 128), at least one."""
    return min(next_power_of_2(max(n_heads, 1)), max(1, MAX_HALF_TILE // block_half))


def rope_launch(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                position_ids: Optional[torch.Tensor], heads_dim: int,
                backward: bool) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """q: (B, Hq, T, D) with heads_dim=1 or (B, T, Hq, D) with heads_dim=2, k the same with Hk heads,
    any strides. cos, sin: (1 or B, T, R), or (1, P, R) rows gathered by position_ids (1 or B, T).
    Returns new (q_embed, k_embed) in q's and k's layout (dense inputs keep their strides), or with
    ``backward`` the input gradients for output gradients passed as q and k."""
    q_out, k_out = alloc.empty_like(q, dtype=q.dtype), alloc.empty_like(k, dtype=k.dtype)
    n_batch, n_tokens, head_dim = q.shape[0], q.shape[3 - heads_dim], q.shape[3]
    if n_batch * n_tokens == 0:
        return q_out, k_out
    half = cos.shape[-1] // 2
    n_pass = head_dim - 2 * half
    block_half = next_power_of_2(half)
    block_hq, block_hk = _heads_block(q.shape[heads_dim], block_half), _heads_block(k.shape[heads_dim], block_half)
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
        num_warps=4,
    )  # fmt: skip
    return q_out, k_out


# --------------------------------------------------------------------------------------------------
# Autograd, shared by the eager path (an autograd.Function) and the compiled path (a torch custom op);
# _core.dispatch.cheapest_path picks one per call. The backward of rope is rope with the opposite
# ``backward`` flag, so the backward is differentiable too.
# --------------------------------------------------------------------------------------------------
def _save(ctx, q, k, cos, sin, position_ids, heads_dim, backward):
    ctx.save_for_backward(cos, sin, position_ids)
    ctx.heads_dim, ctx.backward = heads_dim, backward
    ctx.q_meta, ctx.k_meta = (q.shape, q.dtype), (k.shape, k.dtype)


def _zeros_if_none(grad: Optional[torch.Tensor], meta, like: torch.Tensor) -> torch.Tensor:
    """An unused output's gradient: zeros expanded from one element (stride 0, nothing allocated)."""
    shape, dtype = meta
    return grad if grad is not None else torch.zeros((), dtype=dtype, device=like.device).expand(shape)


def _grads(ctx, dq, dk, launch):
    """rope with the opposite flag on the output gradients (which may be expanded, stride 0)."""
    cos, sin, position_ids = ctx.saved_tensors
    dq, dk = _zeros_if_none(dq, ctx.q_meta, cos), _zeros_if_none(dk, ctx.k_meta, cos)
    if launch is None:  # eager: a Function only when a double backward needs this backward's graph
        launch = cheapest_path(rope_op, _RopeFunction, rope_launch, (dq, dk))
    return launch(dq, dk, cos, sin, position_ids, ctx.heads_dim, not ctx.backward)


class _RopeFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, cos, sin, position_ids, heads_dim, backward):
        _save(ctx, q, k, cos, sin, position_ids, heads_dim, backward)
        ctx.set_materialize_grads(False)  # _grads expands a zero for an unused output; autograd would fill one
        return rope_launch(q, k, cos, sin, position_ids, heads_dim, backward)

    @staticmethod
    def backward(ctx, dq, dk):
        dq, dk = _grads(ctx, dq, dk, None)
        return dq, dk, None, None, None, None, None


@torch.library.custom_op("tritonkit::rope", mutates_args=())
def rope_op(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
            position_ids: Optional[torch.Tensor], heads_dim: int,
            backward: bool) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """:func:`rope_launch` as a custom op."""
    return rope_launch(q, k, cos, sin, position_ids, heads_dim, backward)


@rope_op.register_fake
def _(q, k, cos, sin, position_ids, heads_dim, backward):
    return torch.empty_like(q), torch.empty_like(k)


def _setup_context(ctx, inputs, output):
    _save(ctx, *inputs)


def _custom_op_backward(ctx, dq, dk):
    dq, dk = _grads(ctx, dq, dk, rope_op)
    return dq, dk, None, None, None, None, None


rope_op.register_autograd(_custom_op_backward, setup_context=_setup_context)


# --------------------------------------------------------------------------------------------------
# Public function
# --------------------------------------------------------------------------------------------------
def _check_rope_args(q, k, cos, sin, position_ids, layout, rotary_dim) -> int:
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


def rope(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    position_ids: Optional[torch.Tensor] = None,
    layout: str = "bhtd",
    rotary_dim: Optional[int] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary position embedding of q and k, as Hugging Face's ``apply_rotary_pos_emb``.

    ``q_embed = q * cos + rotate_half(q) * sin`` on the first R = ``rotary_dim`` (default head_dim)
    columns of every head, ``rotate_half(x) = cat(-x[..., R/2:], x[..., :R/2])``; columns beyond R are
    copied. The same for k. Computed in fp32, stored in q's dtype; returns new ``(q_embed, k_embed)``.

    - ``layout="bhtd"``: q (B, Hq, T, D), k (B, Hk, T, D); ``"bthd"``: q (B, T, Hq, D), k (B, T, Hk, D).
      Hq and Hk may differ (GQA, MQA); any strides; fp32/fp16/bf16.
    - cos, sin: (T, R), (1, T, R) or (B, T, R), any float dtype; or, with ``position_ids`` of shape
      (B, T) or (1, T) (int32/int64), tables (max_position, R) whose rows are gathered per token.
      Positions outside [0, max_position) give NaN rows (no host check, so no synchronisation).
    - R must be even and at most head_dim. Differentiable in q and k; cos and sin are constants
      (no gradient: cos or sin requiring grad raises ValueError).

    Example: ``q, k = tk.ops.rope(q, k, cos, sin)`` with cos, sin from a ``LlamaRotaryEmbedding``.
    """
    rotary_dim = _check_rope_args(q, k, cos, sin, position_ids, layout, rotary_dim)
    cos3, sin3 = (cos, sin) if cos.dim() == 3 else (cos.unsqueeze(0), sin.unsqueeze(0))
    heads_dim = HEADS_DIM[layout]
    call = cheapest_path(rope_op, _RopeFunction, rope_launch, (q, k))
    return call(q, k, cos3, sin3, position_ids, heads_dim, False)


# --------------------------------------------------------------------------------------------------
# Reference (float64) and registry spec
# --------------------------------------------------------------------------------------------------
def _rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _rope_reference(q, k, cos, sin, *, position_ids=None, layout="bhtd", rotary_dim=None):
    """transformers' apply_rotary_pos_emb, with the partial-rotary split of GPT-NeoX / Phi."""
    if position_ids is not None:
        cos, sin = cos[position_ids], sin[position_ids]
    heads_dim = HEADS_DIM[layout]
    cos = (cos if cos.dim() == 3 else cos.unsqueeze(0)).unsqueeze(heads_dim)
    sin = (sin if sin.dim() == 3 else sin.unsqueeze(0)).unsqueeze(heads_dim)
    rotary = cos.shape[-1]

    def embed(x):
        x_rot, x_pass = x[..., :rotary], x[..., rotary:]
        return torch.cat((x_rot * cos + _rotate_half(x_rot) * sin, x_pass), dim=-1)

    return embed(q), embed(k)


def _rope_inputs(case, device, dtype, generator):
    """q, k in the case's layout and storage; cos/sin tables as a rotary embedding makes them (or random
    values when ``table="random"``, so that halves differ) in one of the accepted shapes."""
    n_batch, n_q, n_k, n_tokens, head_dim = case["b"], case["hq"], case["hk"], case["t"], case["d"]
    rotary = case.get("rot", head_dim)
    layout, storage = case.get("layout", "bhtd"), case.get("storage", "contiguous")

    def randn(*shape):
        return torch.randn(shape, device=device, generator=generator, dtype=torch.float32).to(dtype)

    def shape(in_layout, heads):
        return (n_batch, heads, n_tokens, head_dim) if in_layout == "bhtd" else (n_batch, n_tokens, heads, head_dim)

    if storage == "qkv":  # views of one fused projection (B, T, (Hq + 2 Hk) * D): gaps between rows
        fused = randn(n_batch, n_tokens, (n_q + 2 * n_k) * head_dim)
        q = fused[..., : n_q * head_dim].unflatten(-1, (n_q, head_dim))
        k = fused[..., n_q * head_dim : (n_q + n_k) * head_dim].unflatten(-1, (n_k, head_dim))
        q, k = (q, k) if layout == "bthd" else (q.transpose(1, 2), k.transpose(1, 2))
    elif storage == "transposed":  # the other layout's memory order, viewed in this layout (HF's q and k)
        other = "bthd" if layout == "bhtd" else "bhtd"
        q, k = randn(*shape(other, n_q)).transpose(1, 2), randn(*shape(other, n_k)).transpose(1, 2)
    else:
        q, k = randn(*shape(layout, n_q)), randn(*shape(layout, n_k))
    kind = case.get("cos", "1td")
    n_rows = case.get("max_pos", n_tokens + 9) if kind.startswith("pos") else n_tokens
    lead = (n_batch,) if kind == "btd" else ()
    if case.get("table") == "random":
        cos, sin = (2 * torch.rand((*lead, n_rows, rotary), device=device, generator=generator) - 1 for _ in range(2))
    else:
        # A table gathered by position_ids starts at 0; the others at a random offset (a decoding step,
        # a chunk of a long sequence), one per sequence for (B, T, R) tables.
        offsets = torch.randint(0, 4096, (n_batch if kind == "btd" else 1, 1), device=device, generator=generator)
        positions = torch.arange(n_rows, device=device) + (0 * offsets if kind.startswith("pos") else offsets)
        positions = positions if kind == "btd" else positions[0]
        inv_freq = 1.0 / 10000 ** (torch.arange(0, rotary, 2, device=device, dtype=torch.float32) / rotary)
        angles = positions[..., None].float() * inv_freq
        cos, sin = torch.cat((angles, angles), dim=-1).cos(), torch.cat((angles, angles), dim=-1).sin()
    cos, sin = cos.to(dtype), sin.to(dtype)
    if kind == "1td":
        cos, sin = cos.unsqueeze(0), sin.unsqueeze(0)
    kwargs = {"cos": cos, "sin": sin, "layout": layout}
    if kind.startswith("pos"):
        pos_batch = 1 if kind == "pos1" else n_batch
        kwargs["position_ids"] = torch.randint(0, n_rows, (pos_batch, n_tokens), device=device, generator=generator)
    if "rot" in case:
        kwargs["rotary_dim"] = rotary
    return Inputs((q, k), kwargs, frozen=frozenset({"cos", "sin"}))  # the tables are constants


def _cos_rows(case) -> int:
    kind = case.get("cos", "1td")
    if kind.startswith("pos"):
        return case.get("max_pos", case["t"] + 9)
    return case["b"] * case["t"] if kind == "btd" else case["t"]


def _rope_bytes(case, dtype):
    """Fewest bytes moved, the same forward and backward: q and k (or their gradients) read once and
    written once, the cos and sin tables and the position ids read once."""
    qk = case["b"] * case["t"] * (case["hq"] + case["hk"]) * case["d"]
    kind = case.get("cos", "1td")
    positions = (case["b"] if kind == "pos" else 1) * case["t"] if kind.startswith("pos") else 0
    return 2 * qk * dtype.itemsize + 2 * _cos_rows(case) * case.get("rot", case["d"]) * dtype.itemsize + 8 * positions


def _rope_flops(case, dtype):
    """Three per rotated element (two multiplies and an add)."""
    return 3 * case["b"] * case["t"] * (case["hq"] + case["hk"]) * case.get("rot", case["d"])


def _liger_rope():
    from liger_kernel.ops.rope import LigerRopeFunction

    def call(q, k, cos, sin, *, position_ids=None, layout="bhtd", rotary_dim=None):
        if layout != "bhtd" or position_ids is not None:
            raise ValueError("liger-kernel's RoPE takes bhtd q and k and cos/sin already gathered per token")
        return LigerRopeFunction.apply(q, k, cos, sin, None, 1, rotary_dim)

    return call


_TESTS = (
    {"b": 2, "hq": 4, "hk": 2, "t": 5, "d": 16},
    {"b": 2, "hq": 4, "hk": 2, "t": 5, "d": 16, "layout": "bthd", "cos": "btd"},
    {"b": 1, "hq": 3, "hk": 3, "t": 1, "d": 8, "cos": "td"},
    {"b": 2, "hq": 4, "hk": 1, "t": 3, "d": 10, "rot": 6, "layout": "bthd", "cos": "btd"},
    {"b": 1, "hq": 3, "hk": 1, "t": 7, "d": 6, "rot": 4, "cos": "td"},
    {"b": 2, "hq": 2, "hk": 2, "t": 6, "d": 12, "layout": "bthd", "cos": "pos", "max_pos": 20},
    {"b": 3, "hq": 4, "hk": 2, "t": 3, "d": 12, "rot": 8, "cos": "pos1"},
    {"b": 2, "hq": 4, "hk": 2, "t": 3, "d": 16, "storage": "qkv"},
    {"b": 2, "hq": 4, "hk": 2, "t": 3, "d": 16, "layout": "bthd", "storage": "qkv", "cos": "td"},
    {"b": 1, "hq": 2, "hk": 3, "t": 4, "d": 8, "storage": "transposed", "table": "random", "cos": "btd"},
    {"b": 1, "hq": 40, "hk": 8, "t": 2, "d": 128},  # 40 q heads: two passes of the head loop
    {"b": 0, "hq": 4, "hk": 2, "t": 5, "d": 16},
    {"b": 2, "hq": 4, "hk": 2, "t": 0, "d": 16, "layout": "bthd"},
)
_GPU = (
    {"b": 2, "hq": 32, "hk": 32, "t": 1024, "d": 128},
    {"b": 2, "hq": 32, "hk": 8, "t": 2048, "d": 128, "layout": "bthd", "cos": "pos", "max_pos": 8192},
    {"b": 4, "hq": 32, "hk": 8, "t": 512, "d": 128, "storage": "qkv", "cos": "btd"},
    {"b": 2, "hq": 32, "hk": 32, "t": 1000, "d": 80, "rot": 32},  # Phi-2's partial rotary
    {"b": 3, "hq": 7, "hk": 1, "t": 333, "d": 10, "rot": 6, "layout": "bthd", "storage": "transposed"},
    {"b": 2, "hq": 128, "hk": 8, "t": 257, "d": 64, "cos": "td", "table": "random"},
    {"b": 1, "hq": 32, "hk": 8, "t": 1, "d": 128, "cos": "pos1", "max_pos": 4096},  # decoding one token
)
# The small cases first (`--sizes small`), then the training shape in both layouts.
_BENCH = (
    {"b": 1, "hq": 32, "hk": 8, "t": 128, "d": 128},
    {"b": 1, "hq": 32, "hk": 8, "t": 1024, "d": 128},
    {"b": 4, "hq": 32, "hk": 8, "t": 4096, "d": 128},
    {"b": 4, "hq": 32, "hk": 8, "t": 4096, "d": 128, "layout": "bthd"},
)

register(KernelSpec(
    name="rope",
    family="rope",
    summary="Rotary position embedding of q and k (Hugging Face rotate-half), forward and backward.",
    description="q * cos + rotate_half(q) * sin for q and k in one pass: one program per token reads its "
                "cos/sin row once for all heads of q and k. bhtd or bthd, GQA, partial rotary, cos/sin per "
                "batch or shared or gathered by position_ids. The backward is the same kernel with -sin.",
    usage="q, k = tk.ops.rope(q, k, cos, sin)  # q (B, Hq, T, D), k (B, Hk, T, D), cos/sin (B, T, D)",
    tags=("rope", "attention", "fused", "memory-bound", "backward"),
    limits="q/k 4-D in bhtd or bthd with any strides; rotary_dim even and <= head_dim; cos/sin are constants "
           "(no gradient); positions outside the table give NaN.",
    fn=rope,
    reference=_rope_reference,
    make_inputs=_rope_inputs,
    test_cases=_TESTS,
    gpu_cases=_GPU,
    bench_cases=_BENCH,
    bytes_moved=_rope_bytes,
    bytes_moved_bwd=_rope_bytes,
    flops=_rope_flops,
    dtypes=FLOAT_DTYPES,
    has_backward=True,
    peers={"liger": _liger_rope},
    status="experimental",
))  # fmt: skip
