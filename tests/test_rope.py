"""RoPE beyond the registry sweep: compile without graph breaks, gradients through strided views and
double backward, constants that require grad, out-of-range positions, the checker's power to catch
wrong rotations, bad input; on a GPU the issue's shape and CUDA-graph capture."""

import pytest
import torch

import tritonkit as tk
from helpers import assert_compiled_matches_eager, assert_graph_replay_matches_eager
from tritonkit import catalog, registry, testing
from tritonkit.registry import KernelSpec

REFERENCE = catalog.get("rope").reference


def _tables(rows, rotary, device, dtype=torch.float32, offset=0):
    """cos, sin as transformers' rotary embedding makes them: halves repeated, base 10000."""
    inv_freq = 1.0 / 10000 ** (torch.arange(0, rotary, 2, device=device, dtype=torch.float64) / rotary)
    angles = (torch.arange(rows, device=device, dtype=torch.float64) + offset)[:, None] * inv_freq
    emb = torch.cat((angles, angles), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _qk(device, layout="bhtd", b=2, hq=4, hk=2, t=5, d=16, dtype=torch.float32):
    shape = (lambda h: (b, h, t, d)) if layout == "bhtd" else (lambda h: (b, t, h, d))
    return torch.randn(shape(hq), device=device, dtype=dtype), torch.randn(shape(hk), device=device, dtype=dtype)


def _assert_matches_reference(q, k, cos, sin, **kwargs):
    ours = tk.ops.rope(q, k, cos, sin, **kwargs)
    theirs = REFERENCE(q.double(), k.double(), cos.double(), sin.double(), **kwargs)
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b.to(a.dtype), rtol=1e-5, atol=1e-5)
    return ours


@pytest.mark.parametrize("layout", ["bhtd", "bthd"])
@pytest.mark.parametrize("gather", [False, True], ids=["shared", "position_ids"])
def test_compiles_fullgraph_with_backward(layout, gather, device):
    cos, sin = _tables(12 if gather else 5, 16, device)
    position_ids = torch.tensor([[3, 0, 11, 7, 5], [1, 2, 3, 4, 5]], device=device) if gather else None

    def block(q, k):
        q_embed, k_embed = tk.ops.rope(q * 2, k, cos, sin, position_ids=position_ids, layout=layout)
        return (q_embed * torch.arange(16, device=q.device)).sum() + k_embed.square().sum()

    q, k = _qk(device, layout)
    assert_compiled_matches_eager(block, [q.requires_grad_(), k.requires_grad_()], device)


def test_gradients_through_views_of_a_fused_projection(device):
    """q and k sliced from one qkv tensor (gaps between rows) as in attention layers; gradients land in it."""
    b, t, hq, hk, d = 2, 3, 4, 2, 16
    fused = torch.randn(b, t, (hq + 2 * hk) * d, device=device, requires_grad=True)
    cos, sin = _tables(t, d, device, offset=100)

    def split(x):
        q = x[..., : hq * d].unflatten(-1, (hq, d)).transpose(1, 2)
        return q, x[..., hq * d : (hq + hk) * d].unflatten(-1, (hk, d)).transpose(1, 2)

    ours = tk.ops.rope(*split(fused), cos, sin)
    theirs = REFERENCE(*split(fused.double()), cos.double(), sin.double())
    grads = [torch.randn_like(o) for o in ours]
    ours_grad = torch.autograd.grad(ours, fused, grads)[0]
    theirs_grad = torch.autograd.grad(theirs, fused, [g.double() for g in grads])[0]
    torch.testing.assert_close(ours_grad, theirs_grad.float(), rtol=1e-5, atol=1e-5)
    assert ours_grad[..., (hq + hk) * d :].abs().max() == 0  # v's columns get nothing


def test_outputs_are_new_and_keep_a_dense_layout(device):
    """HF's q is a (B, T, H, D) projection viewed as (B, H, T, D): the output keeps that memory order,
    as torch's elementwise ops would, and the inputs are untouched."""
    q = torch.randn(2, 5, 4, 16, device=device).transpose(1, 2)
    k = torch.randn(2, 5, 2, 16, device=device).transpose(1, 2)
    q_before, k_before = q.clone(), k.clone()
    cos, sin = _tables(5, 16, device, offset=7)
    q_embed, k_embed = _assert_matches_reference(q, k, cos, sin)
    assert q_embed.stride() == q.stride() and k_embed.stride() == k.stride()
    assert q_embed.data_ptr() != q.data_ptr() and torch.equal(q, q_before) and torch.equal(k, k_before)


def test_double_backward(device):
    """The backward is rope with the opposite flag, so it is differentiable: the gradient of <dq, v>
    with respect to the upstream gradient g is the forward rotation of v."""
    q, k = (t.requires_grad_() for t in _qk(device))
    cos, sin = _tables(5, 16, device, offset=3)
    q_embed, k_embed = tk.ops.rope(q, k, cos, sin)
    g_q, g_k = (torch.randn_like(t, requires_grad=True) for t in (q_embed, k_embed))
    dq, dk = torch.autograd.grad((q_embed, k_embed), (q, k), (g_q, g_k), create_graph=True)
    v_q, v_k = torch.randn_like(dq), torch.randn_like(dk)
    second = torch.autograd.grad((dq * v_q).sum() + (dk * v_k).sum(), (g_q, g_k))
    for ours, theirs in zip(second, REFERENCE(v_q.double(), v_k.double(), cos.double(), sin.double()), strict=True):
        torch.testing.assert_close(ours, theirs.float(), rtol=1e-5, atol=1e-5)


def test_only_q_used(device):
    q, k = (t.requires_grad_() for t in _qk(device))
    cos, sin = _tables(5, 16, device)
    q_embed, _ = tk.ops.rope(q, k, cos, sin)
    q_embed.sum().backward()
    (expected,) = torch.autograd.grad(REFERENCE(q.double(), k.double(), cos.double(), sin.double())[0].sum(), q)
    torch.testing.assert_close(q.grad, expected.float(), rtol=1e-5, atol=1e-5)
    assert k.grad is None or k.grad.abs().max() == 0


@pytest.mark.parametrize("needs", ["q", "k"])
def test_outputs_require_grad_only_where_their_input_does(needs, device):
    """With one of q and k requiring grad, only its embedding does (k_embed used to require grad when only q did),
    and that one's gradient is still right; eager and compiled alike."""
    q, k = _qk(device)
    cos, sin = _tables(5, 16, device, offset=7)
    (q if needs == "q" else k).requires_grad_()
    leaf, index = (q, 0) if needs == "q" else (k, 1)
    outputs = tk.ops.rope(q, k, cos, sin)
    assert [t.requires_grad for t in outputs] == [needs == "q", needs == "k"]
    upstream = torch.randn_like(outputs[index])
    (grad,) = torch.autograd.grad(outputs[index], leaf, upstream)
    exact = [t.detach().double().requires_grad_() for t in (q, k)]
    expected = REFERENCE(*exact, cos.double(), sin.double())[index]
    (theirs,) = torch.autograd.grad(expected, exact[index], upstream.double())
    torch.testing.assert_close(grad, theirs.float(), rtol=1e-5, atol=1e-5)

    def block(q, k):
        embeds = tk.ops.rope(q * 1, k * 1, cos, sin)
        assert [t.requires_grad for t in embeds] == [needs == "q", needs == "k"]
        return embeds[index].square().sum()

    torch._dynamo.reset()
    compiled = torch.compile(block, fullgraph=True, backend="inductor" if device == "cuda" else "aot_eager")
    (grad,) = torch.autograd.grad(compiled(q, k), leaf)
    (eager,) = torch.autograd.grad(block(q, k), leaf)
    torch.testing.assert_close(grad, eager, rtol=1e-5, atol=1e-5)


def test_cos_or_sin_requiring_grad_is_refused(device):
    q, k = _qk(device)
    cos, sin = _tables(5, 16, device)
    with pytest.raises(ValueError, match=r"rope: cos and sin are constants and get no gradient, but one requires"):
        tk.ops.rope(q, k, cos.requires_grad_(), sin)
    with torch.no_grad():  # nothing to differentiate, so nothing to refuse
        _assert_matches_reference(q, k, cos, sin)


def test_positions_outside_the_table_give_nan_rows(device):
    q, k = _qk(device, "bthd", b=1, t=3)
    cos, sin = _tables(8, 16, device)
    position_ids = torch.tensor([[2, 8, -1]], device=device, dtype=torch.int32)
    q_embed, k_embed = tk.ops.rope(q, k, cos, sin, position_ids=position_ids, layout="bthd")
    assert q_embed[:, 1:].isnan().all() and k_embed[:, 1:].isnan().all()
    expected = REFERENCE(q[:, :1], k[:, :1], cos, sin, position_ids=torch.tensor([[2]], device=device), layout="bthd")
    torch.testing.assert_close(q_embed[:, :1], expected[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fp32_tables_with_16_bit_q_and_k(dtype, device):
    q, k = _qk(device, dtype=dtype)
    cos, sin = _tables(5, 16, device, offset=1000)
    ours = tk.ops.rope(q, k, cos, sin)
    theirs = REFERENCE(q.double(), k.double(), cos.double(), sin.double())
    for a, b in zip(ours, theirs, strict=True):
        assert a.dtype == dtype
        assert testing.compare(a, b, registry.TOLERANCES[dtype]).ok


def _broken(fn):
    return KernelSpec(**{**catalog.get("rope").__dict__, "name": "broken_rope", "fn": fn})


def _first_half_twice(t):
    half = t.shape[-1] // 2
    return torch.cat((t[..., :half], t[..., :half]), dim=-1)


@pytest.mark.parametrize(
    ("label", "fn", "case"),
    [
        ("rotated the other way", lambda q, k, cos, sin, **kw: tk.ops.rope(q, k, cos, -sin, **kw),
         {"b": 1, "hq": 2, "hk": 1, "t": 4, "d": 8}),
        ("position_ids ignored",
         lambda q, k, cos, sin, position_ids, **kw: tk.ops.rope(q, k, cos[: q.shape[2]], sin[: q.shape[2]], **kw),
         {"b": 2, "hq": 2, "hk": 1, "t": 4, "d": 8, "cos": "pos"}),
        ("only the first half of the tables read",
         lambda q, k, cos, sin, **kw: tk.ops.rope(q, k, _first_half_twice(cos), _first_half_twice(sin), **kw),
         {"b": 1, "hq": 2, "hk": 1, "t": 4, "d": 8, "table": "random", "cos": "btd"}),
        ("pass-through columns rotated too",
         lambda q, k, cos, sin, rotary_dim, **kw: tk.ops.rope(q, k, torch.cat((cos, cos), -1),
                                                              torch.cat((sin, sin), -1), **kw),
         {"b": 1, "hq": 2, "hk": 1, "t": 4, "d": 8, "rot": 4}),
    ],
)  # fmt: skip
@pytest.mark.parametrize("grad_mode", [None, "random"])
def test_checker_catches_wrong_ropes(label, fn, case, grad_mode):
    assert not testing.run_case(_broken(fn), case, torch.bfloat16, "cpu", grad_mode=grad_mode).ok, label


def _call(device, **changes):
    q, k = _qk(device)
    cos, sin = _tables(5, 16, device)
    args = {"q": q, "k": k, "cos": cos, "sin": sin, **changes}
    return tk.ops.rope(**args)


BAD = [
    ({"layout": "bhdt"}, ValueError, r"rope: layout must be one of \('bhtd', 'bthd'\), got 'bhdt'"),
    ({"rotary_dim": 7}, ValueError, r"rope: rotary_dim must be even and in \[2, head_dim=16\], got 7"),
    ({"rotary_dim": 18}, ValueError, r"rope: rotary_dim must be even and in \[2, head_dim=16\], got 18"),
    ({"rotary_dim": 0}, ValueError, r"rope: rotary_dim must be even and in \[2, head_dim=16\], got 0"),
    ({"rotary_dim": 8.0}, TypeError, "rope: rotary_dim must be an int or None, got float"),
    ({"q": torch.randn(2, 4, 5, 15), "k": torch.randn(2, 2, 5, 15), "cos": torch.ones(5, 15),
      "sin": torch.ones(5, 15)}, ValueError, r"rope: head_dim is odd \(15\): pass an even rotary_dim"),
    ({"k": torch.randn(3, 2, 5, 16)}, ValueError,
     r"rope: q and k must have the same batch size \(layout 'bhtd': \(batch, heads, tokens, head_dim\)\), got "
     r"shapes \(2, 4, 5, 16\) and \(3, 2, 5, 16\)"),
    ({"k": torch.randn(2, 2, 6, 16)}, ValueError, "rope: q and k must have the same number of tokens"),
    ({"k": torch.randn(2, 2, 5, 8)}, ValueError, "rope: q and k must have the same head_dim"),
    ({"layout": "bthd"}, ValueError, r"rope: q and k must have the same number of tokens \(layout 'bthd'"),
    ({"q": torch.randn(2, 4, 16)}, ValueError, r"q must have 4 dimensions, got 3 \(shape \(2, 4, 16\)\)"),
    ({"q": torch.ones(2, 4, 5, 16, dtype=torch.int32)}, TypeError, "q must have dtype in .* got torch.int32"),
    ({"k": torch.randn(2, 2, 5, 16, dtype=torch.float16)}, TypeError,
     "q and k must have the same dtype, got torch.float32 and torch.float16"),
    ({"cos": torch.ones(5, 8)}, ValueError, r"rope: cos and sin must have the same shape, got \(5, 8\) and \(5, 16\)"),
    ({"cos": torch.ones(4, 16), "sin": torch.ones(4, 16)}, ValueError,
     r"rope: cos and sin must have shape \(T, R\), \(1, T, R\) or \(B, T, R\) = \(5, 16\), \(1, 5, 16\) or "
     r"\(2, 5, 16\), got \(4, 16\)"),
    ({"cos": torch.ones(3, 5, 16), "sin": torch.ones(3, 5, 16)}, ValueError, r"must have shape .* got \(3, 5, 16\)"),
    ({"cos": torch.ones(5, 8), "sin": torch.ones(5, 8)}, ValueError,
     r"or \(2, 5, 16\) \(R is rotary_dim, or head_dim=16 when None\), got \(5, 8\)"),
    ({"cos": torch.ones(2, 1, 5, 16), "sin": torch.ones(2, 1, 5, 16)}, ValueError, r"got \(2, 1, 5, 16\)"),
    ({"position_ids": torch.zeros(2, 4, dtype=torch.int64)}, ValueError,
     r"rope: position_ids must have shape \(2, 5\) or \(1, 5\), got \(2, 4\)"),
    ({"position_ids": torch.zeros(5, dtype=torch.int64)}, ValueError, "position_ids must have 2 dimensions, got 1"),
    ({"position_ids": torch.zeros(2, 5)}, TypeError, "position_ids must have dtype in .* got torch.float32"),
    ({"position_ids": torch.zeros(2, 5, dtype=torch.int64), "cos": torch.ones(1, 5, 16), "sin": torch.ones(1, 5, 16)},
     ValueError, r"cos and sin must have shape \(max_position, R\) with R = 16, rows gathered by position_ids"),
    ({"cos": [1.0]}, TypeError, "cos must be a torch.Tensor, got list"),
]  # fmt: skip


@pytest.mark.parametrize(("changes", "error", "match"), BAD, ids=[m[:40] for _, _, m in BAD])
def test_bad_input_names_the_argument(changes, error, match, device):
    changes = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in changes.items()}
    with pytest.raises(error, match=match):
        _call(device, **changes)


# ---------------------------------------------------------------- GPU only: the issue's shape, CUDA graphs
@pytest.mark.gpu
def test_issue_shape_forward_and_backward_on_gpu():
    """q (4, 32, 4096, 128), k (4, 8, 4096, 128) in bf16, cos/sin (1, T, D): outputs and gradients
    against the float64 reference within the bf16 row of the tolerance table."""
    spec = catalog.get("rope")
    case = {"b": 4, "hq": 32, "hk": 8, "t": 4096, "d": 128}
    result = testing.run_case(spec, case, torch.bfloat16, "cuda", grad_mode="random")
    assert result.ok, result.explain()


@pytest.mark.gpu
@pytest.mark.parametrize("gather", [False, True], ids=["shared", "position_ids"])
def test_cuda_graph_capture_forward_and_backward(gather):
    q, k = _qk("cuda", "bthd", b=2, hq=8, hk=2, t=64, d=128, dtype=torch.bfloat16)
    cos, sin = _tables(128 if gather else 64, 128, "cuda", torch.bfloat16)
    position_ids = torch.randint(0, 128, (2, 64), device="cuda") if gather else None

    def step(q, k, g_q, g_k):
        leaves = (q.requires_grad_(), k.requires_grad_())
        out = tk.ops.rope(q, k, cos, sin, position_ids=position_ids, layout="bthd")
        return (*out, *torch.autograd.grad(out, leaves, (g_q, g_k)))

    assert_graph_replay_matches_eager(step, [q, k, torch.randn_like(q), torch.randn_like(k)])
