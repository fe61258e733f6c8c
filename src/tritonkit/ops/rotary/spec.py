"""rope in the registry: the float64 reference, typed cases, cost model, peers."""

from dataclasses import dataclass

import torch

from tritonkit._core.checks import FLOAT_DTYPES
from tritonkit.ops.rotary.launch import HEADS_DIM
from tritonkit.ops.rotary.op import rope
from tritonkit.registry import Case, Inputs, KernelSpec, register


@dataclass(frozen=True)
class RopeCase(Case):
    b: int  # batch
    hq: int  # q heads
    hk: int  # k heads
    t: int  # tokens
    d: int  # head_dim
    rot: int | None = None  # rotary_dim (None: head_dim)
    layout: str = "bhtd"  # or "bthd"
    storage: str = "contiguous"  # "qkv": views of one fused projection; "transposed": the other layout's memory
    cos: str = "1td"  # the tables' shape: "1td", "td", "btd", or gathered by position_ids "pos" (B, T), "pos1" (1, T)
    max_pos: int | None = None  # rows of a gathered table (None: t + 9)
    table: str = "rotary"  # "random": halves that differ, where a rotary embedding repeats them


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
    n_batch, n_q, n_k, n_tokens, head_dim = case.b, case.hq, case.hk, case.t, case.d
    rotary = case.rot or head_dim
    layout, storage = case.layout, case.storage

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
    kind = case.cos
    n_rows = (case.max_pos or n_tokens + 9) if kind.startswith("pos") else n_tokens
    lead = (n_batch,) if kind == "btd" else ()
    if case.table == "random":
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
    if case.rot is not None:
        kwargs["rotary_dim"] = rotary
    return Inputs((q, k), kwargs, frozen=frozenset({"cos", "sin"}))  # the tables are constants


def _cos_rows(case: RopeCase) -> int:
    if case.cos.startswith("pos"):
        return case.max_pos or case.t + 9
    return case.b * case.t if case.cos == "btd" else case.t


def _rope_bytes(case, dtype):
    """Fewest bytes moved, the same forward and backward: q and k (or their gradients) read once and
    written once, the cos and sin tables and the position ids read once."""
    qk = case.b * case.t * (case.hq + case.hk) * case.d
    positions = (case.b if case.cos == "pos" else 1) * case.t if case.cos.startswith("pos") else 0
    return 2 * qk * dtype.itemsize + 2 * _cos_rows(case) * (case.rot or case.d) * dtype.itemsize + 8 * positions


def _rope_flops(case, dtype):
    """Three per rotated element (two multiplies and an add)."""
    return 3 * case.b * case.t * (case.hq + case.hk) * (case.rot or case.d)


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
    sweep="t",
    case_type=RopeCase,
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
