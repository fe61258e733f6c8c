"""Flash attention beyond the registry sweep: every run of the block walk with small tiles, queries that see no key,
large scores, strided and expanded inputs, packed sequences against the dense op, deterministic= changing nothing,
the checker's power to catch wrong attention, bad input; compile without graph breaks; on a GPU determinism and
CUDA-graph capture."""

import dataclasses
import math

import pytest
import torch

import tritonkit as tk
from helpers import assert_compiled_matches_eager, assert_graph_replay_matches_eager
from tritonkit import catalog, testing
from tritonkit.ops.flash_attention import launch
from tritonkit.ops.flash_attention.plan import AttentionPlan, Tiles
from tritonkit.registry import KernelSpec

REFERENCE = catalog.get("attention").reference
VARLEN_REFERENCE = catalog.get("attention_varlen").reference
SMALL = AttentionPlan(Tiles(16, 16, 4, 1), Tiles(16, 16, 4, 1), Tiles(16, 16, 4, 1))  # many blocks at small sizes
UNEVEN = AttentionPlan(Tiles(32, 16, 4, 1), Tiles(16, 32, 4, 1), Tiles(16, 32, 4, 1))  # rows and keys tiled apart
# Streamed tiles through tensor descriptors in every kernel (TMA on Hopper; the interpreter runs descriptors too)
DESCRIPTORS = AttentionPlan(*(Tiles(16, 16, 4, 1, descriptors=True),) * 3)


def _qkv(device, b=1, hq=2, hk=1, sq=17, sk=17, d=16, dtype=torch.float32, scale=1.0):
    def make(h, s):
        return (scale * torch.randn(b, h, s, d, device=device)).to(dtype)

    return make(hq, sq), make(hk, sk), make(hk, sk)


def _launch_and_compare(q, k, v, plan, causal=False, window=(-1, -1), softcap=0.0, atol=2e-5):
    """The launchers with ``plan`` against the float64 reference: output, lse and the three gradients."""
    scale = 1 / math.sqrt(q.shape[-1])
    left, right = launch._check_window("test", window, causal)
    args = (None, None, q.shape[2], k.shape[2], 1, scale, left, right, softcap)
    out, lse = launch.attention_fwd(q, k, v, *args, plan=plan)
    leaves = [x.double().requires_grad_() for x in (q, k, v)]
    exact_out, exact_lse = REFERENCE(*leaves, causal=causal, window=window, softcap=softcap, return_lse=True)
    grad_out = torch.randn_like(out)
    grads = launch.attention_bwd(grad_out, q, k, v, out, lse, *args, plan=plan)
    exact_grads = torch.autograd.grad(exact_out, leaves, grad_out.double())
    torch.testing.assert_close(out, exact_out.to(out.dtype), atol=atol, rtol=1e-4)
    torch.testing.assert_close(lse, exact_lse.float(), atol=atol, rtol=1e-4)
    for name, ours, exact in zip("qkv", grads, exact_grads, strict=True):
        torch.testing.assert_close(ours, exact.to(ours.dtype), atol=atol, rtol=1e-4, msg=f"d{name}")


WALKS = [  # (sq, sk, causal, window, softcap): every mix of masked and whole blocks, both alignments
    (50, 50, False, (-1, -1), 0.0),
    (50, 50, True, (-1, -1), 0.0),
    (37, 70, True, (-1, -1), 0.0),
    (70, 37, True, (-1, -1), 0.0),
    (64, 64, True, (-1, -1), 0.0),
    (80, 80, False, (20, 5), 0.0),
    (80, 80, False, (0, 0), 0.0),
    (80, 96, False, (3, -1), 3.0),
    (80, 80, False, (-1, 17), 0.0),
    (96, 96, True, (40, 0), 10.0),
    (1, 49, True, (-1, -1), 0.0),
    (49, 1, False, (-1, -1), 0.0),
]


@pytest.mark.parametrize("plan", [SMALL, UNEVEN], ids=["16x16", "uneven"])
@pytest.mark.parametrize(("sq", "sk", "causal", "window", "softcap"), WALKS)
def test_every_run_of_the_block_walk(sq, sk, causal, window, softcap, plan):
    torch.manual_seed(sq * 1000 + sk)
    _launch_and_compare(*_qkv("cpu", hq=2, hk=1, sq=sq, sk=sk), plan, causal, window, softcap)


@pytest.mark.parametrize("heads_fastest", [True, False])
def test_both_grid_orders_give_the_same_attention(monkeypatch, heads_fastest):
    """The grid runs the heads fastest where K and V fit in L2 (every small input here) and a head's blocks together
    otherwise; both orders, causal GQA with uneven blocks, forward and backward."""
    monkeypatch.setattr(launch, "_heads_fastest", lambda k, v: heads_fastest)
    torch.manual_seed(testing.fresh_seed())
    _launch_and_compare(*_qkv("cpu", b=2, hq=4, hk=2, sq=37, sk=45), UNEVEN, causal=True)


def test_a_grid_past_cudas_second_axis_is_refused():
    with pytest.raises(ValueError, match=r"second axis would hold 70000 programs .* more than CUDA's 65535"):
        launch._grid(4, 70000 * 16, 16, heads_fastest=True)
    assert launch._grid(70000, 32, 16, heads_fastest=True) == (70000, 2)
    with pytest.raises(ValueError, match=r"second axis would hold 70000 programs"):
        launch._grid(70000, 32, 16, heads_fastest=False)


def test_dkdv_few_takes_over_only_below_the_program_threshold():
    """A plan's dkdv_few runs where dkdv's key blocks would give fewer programs than FEW_DKDV_PROGRAMS_PER_SM per
    multiprocessor, dkdv from there on, and a plan without dkdv_few always runs dkdv."""
    few = Tiles(16, 16, 4, 1)
    plan = dataclasses.replace(SMALL, dkdv_few=few)
    threshold = launch.FEW_DKDV_PROGRAMS_PER_SM * launch.sm_count(torch.device("cpu"))
    blocks_below = threshold - 1  # key blocks of 16 for one head: one program each
    assert launch._dkdv_tiles(plan, 1, 16 * blocks_below, torch.device("cpu")) is few
    assert launch._dkdv_tiles(plan, 1, 16 * threshold, torch.device("cpu")) is plan.dkdv
    assert launch._dkdv_tiles(SMALL, 1, 16, torch.device("cpu")) is SMALL.dkdv


def test_deterministic_false_gives_the_same_backward(device):
    """deterministic=False is accepted (flash-attn's keyword) and changes nothing: the same output and the same
    gradient bits as the default, dense and packed."""
    torch.manual_seed(5)
    q, k, v = _qkv(device, b=2, hq=4, hk=2, sq=23, sk=29)
    grad = torch.randn_like(q)
    cu = torch.tensor([0, 23, 46], dtype=torch.int32, device=device)

    def packed(x):
        return x.transpose(1, 2).flatten(0, 1)

    runs = {"dense": [], "varlen": []}
    for deterministic in (True, False):
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        out = tk.ops.attention(*leaves, causal=True, deterministic=deterministic)
        runs["dense"].append((out, *torch.autograd.grad(out, leaves, grad)))
        leaves = [packed(x[:, :, :23]).detach().requires_grad_() for x in (q, k, v)]
        out = tk.ops.attention_varlen(*leaves, cu, cu, 23, 23, causal=True, deterministic=deterministic)
        runs["varlen"].append((out, *torch.autograd.grad(out, leaves, packed(grad))))
    for form, (default, other) in runs.items():
        for name, ours, theirs in zip(("out", "dq", "dk", "dv"), default, other, strict=True):
            assert torch.equal(ours, theirs), f"{form} {name}"


@pytest.mark.parametrize("heads_dim", [1, 2], ids=["bhsd", "bshd"])
def test_descriptors_in_both_layouts_with_a_ragged_head_dim(heads_dim):
    """The descriptors of every kernel (K and V in the forward and dQ, Q and dO in dK/dV) address (B, H, S, D) and
    (B, S, H, D) in their own order, GQA reads the key head of each query head, and columns past a head dim of 24
    (tiles of 32) read as zeros: output, lse and the three gradients against the float64 reference."""
    torch.manual_seed(4)
    as_bhsd = (lambda x: x.transpose(1, 2)) if heads_dim == 2 else (lambda x: x)
    q, k, v = (as_bhsd(x).contiguous() for x in _qkv("cpu", b=2, hq=4, hk=2, sq=40, sk=45, d=24))
    grad_out = torch.randn_like(q)
    seq_dim = 3 - heads_dim
    left, right = launch._check_window("test", (-1, -1), True)
    args = (None, None, q.shape[seq_dim], k.shape[seq_dim], heads_dim, 24**-0.5, left, right, 0.0)
    assert None not in launch._descriptors((q, grad_out, k, v), heads_dim, False, DESCRIPTORS.forward, 16, 32)
    out, lse = launch.attention_fwd(q, k, v, *args, plan=DESCRIPTORS)
    grads = launch.attention_bwd(grad_out, q, k, v, out, lse, *args, plan=DESCRIPTORS)
    leaves = [as_bhsd(x).double().requires_grad_() for x in (q, k, v)]
    exact_out, exact_lse = REFERENCE(*leaves, causal=True, return_lse=True)
    exact_grads = torch.autograd.grad(exact_out, leaves, as_bhsd(grad_out).double())
    torch.testing.assert_close(as_bhsd(out), exact_out.float(), atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(lse, exact_lse.float(), atol=2e-5, rtol=1e-4)
    for name, ours, exact in zip("qkv", grads, exact_grads, strict=True):
        torch.testing.assert_close(as_bhsd(ours), exact.float(), atol=2e-5, rtol=1e-4, msg=f"d{name}")


def test_gqa_group_of_sixteen_with_small_tiles():
    torch.manual_seed(0)
    _launch_and_compare(*_qkv("cpu", b=1, hq=16, hk=1, sq=33, sk=40), SMALL, causal=True)


def test_queries_that_see_no_key_give_zero_and_minus_infinity(device):
    """Causal with Sq > Sk: the first Sq - Sk rows see nothing (bottom-right alignment). No NaN, in values or in
    gradients, and those rows pass no gradient on."""
    q, k, v = (x.requires_grad_() for x in _qkv(device, sq=30, sk=10))
    out, lse = tk.ops.attention(q, k, v, causal=True, return_lse=True)
    assert torch.all(out[:, :, :20] == 0) and torch.all(lse[:, :, :20] == -math.inf)
    assert torch.isfinite(lse[:, :, 20:]).all() and not out.isnan().any()
    out.backward(torch.randn_like(out))
    assert all(torch.isfinite(x.grad).all() for x in (q, k, v))
    assert torch.all(q.grad[:, :, :20] == 0)


def test_no_keys_with_causal_gives_zeros_and_zero_gradients(device):
    q, k, v = (x.requires_grad_() for x in _qkv(device, sq=5, sk=0))
    out = tk.ops.attention(q, k, v, causal=True)
    assert out.shape == q.shape and torch.all(out == 0)
    out.sum().backward()
    assert torch.all(q.grad == 0) and k.grad.shape == k.shape


def test_large_scores_stay_finite(device):
    """Scores of order 1e4 (entries of 30 with d 16 and scale 1): the running maximum keeps every exponential <= 1."""
    torch.manual_seed(1)
    q, k, v = _qkv(device, sq=40, sk=40, scale=30.0)
    v = v / 30
    out, lse = tk.ops.attention(q, k, v, scale=1.0, return_lse=True, causal=True)
    exact_out, exact_lse = REFERENCE(q.double(), k.double(), v.double(), scale=1.0, causal=True, return_lse=True)
    torch.testing.assert_close(out, exact_out.float(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, exact_lse.float(), atol=1e-2, rtol=1e-6)  # |lse| ~ 1e4: fp32's ulp is 1e-3


@pytest.mark.parametrize("scale", [-0.3, 0.0])
def test_non_positive_scales(device, scale):
    """A negative scale reverses the scores' order and zero makes them equal: the forward's shortcut of taking the
    maximum over the unscaled products (valid for a positive scale only) must not be taken, and masked keys stay out."""
    torch.manual_seed(3)
    q, k, v = _qkv(device, sq=21, sk=37)
    out, lse = tk.ops.attention(q, k, v, scale=scale, return_lse=True, causal=True)
    exact_out, exact_lse = REFERENCE(q.double(), k.double(), v.double(), scale=scale, causal=True, return_lse=True)
    torch.testing.assert_close(out, exact_out.float(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, exact_lse.float(), atol=1e-5, rtol=1e-5)


def test_strided_and_expanded_inputs(device):
    """A head dim with stride 2 (copied once), k and v expanded over heads (stride 0: MQA written as MHA), and an
    upstream gradient expanded from a scalar."""
    torch.manual_seed(2)
    q = torch.randn(1, 4, 9, 32, device=device)[..., ::2].requires_grad_()
    k_one = torch.randn(1, 1, 11, 16, device=device, requires_grad=True)
    v_one = torch.randn(1, 1, 11, 16, device=device, requires_grad=True)
    out = tk.ops.attention(q, k_one.expand(1, 4, 11, 16), v_one.expand(1, 4, 11, 16), causal=True)
    exact = REFERENCE(q.double(), k_one.double().expand(1, 4, 11, 16), v_one.double().expand(1, 4, 11, 16),
                      causal=True)  # fmt: skip
    torch.testing.assert_close(out, exact.float(), atol=1e-5, rtol=1e-5)
    out.sum().backward()
    leaves = [x.detach().double().requires_grad_() for x in (q, k_one, v_one)]
    REFERENCE(leaves[0], leaves[1].expand(1, 4, 11, 16), leaves[2].expand(1, 4, 11, 16), causal=True).sum().backward()
    for ours, exact in zip((q, k_one, v_one), leaves, strict=True):
        torch.testing.assert_close(ours.grad, exact.grad.float(), atol=1e-5, rtol=1e-5)


def test_bshd_views_of_a_fused_projection_get_their_gradients(device):
    b, s, hq, hk, d = 2, 9, 4, 2, 16
    fused = torch.randn(b, s, (hq + 2 * hk) * d, device=device, requires_grad=True)

    def split(x):
        q, k, v = x.split((hq * d, hk * d, hk * d), dim=-1)
        return q.unflatten(-1, (hq, d)), k.unflatten(-1, (hk, d)), v.unflatten(-1, (hk, d))

    out = tk.ops.attention(*split(fused), causal=True, layout="bshd")
    exact = REFERENCE(*split(fused.double()), causal=True, layout="bshd")
    torch.testing.assert_close(out, exact.float(), atol=1e-5, rtol=1e-5)
    grad = torch.randn_like(out)
    ours = torch.autograd.grad(out, fused, grad)[0]
    theirs = torch.autograd.grad(exact, fused, grad.double())[0]
    torch.testing.assert_close(ours, theirs.float(), atol=1e-5, rtol=1e-5)


def test_packed_sequences_match_the_dense_op_per_sequence(device):
    torch.manual_seed(3)
    lengths = [7, 1, 20, 12]
    q = torch.randn(sum(lengths), 4, 32, device=device, requires_grad=True)
    k = torch.randn(sum(lengths), 2, 32, device=device, requires_grad=True)
    v = torch.randn(sum(lengths), 2, 32, device=device, requires_grad=True)
    cu = torch.tensor([0, 7, 8, 28, 40], dtype=torch.int32, device=device)
    out, lse = tk.ops.attention_varlen(q, k, v, cu, cu, 20, 20, causal=True, window=(5, 0), return_lse=True)
    grad = torch.randn_like(out)
    out.backward(grad)
    start = 0
    for length in lengths:
        rows = slice(start, start + length)
        parts = [x.detach()[rows].transpose(0, 1)[None].requires_grad_() for x in (q, k, v)]
        dense, dense_lse = tk.ops.attention(*parts, causal=True, window=(5, 0), return_lse=True)
        dense.backward(grad[rows].transpose(0, 1)[None])
        torch.testing.assert_close(out[rows], dense[0].transpose(0, 1), atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(lse[:, rows], dense_lse[0], atol=1e-6, rtol=1e-6)
        for packed, part in zip((q, k, v), parts, strict=True):
            torch.testing.assert_close(packed.grad[rows], part.grad[0].transpose(0, 1), atol=1e-6, rtol=1e-6)
        start += length


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_compiles_fullgraph_with_backward(layout, device):
    q, k, v = _qkv(device, hq=4, hk=2, sq=19, sk=23)
    if layout == "bshd":
        q, k, v = q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()

    def block(q, k, v):
        out = tk.ops.attention(q * 2, k, v, causal=True, softcap=3.0, window=(8, 0), layout=layout)
        return (out * torch.arange(16, device=q.device)).sum()

    assert_compiled_matches_eager(block, [q.requires_grad_(), k.requires_grad_(), v.requires_grad_()], device)


def _broken(fn) -> KernelSpec:
    spec = catalog.get("attention")
    return KernelSpec(**{**spec.__dict__, "fn": fn, "name": f"broken-{spec.name}"})


def _drop_last_key(q, k, v, **kw):
    return tk.ops.attention(q, k[:, :, :-1], v[:, :, :-1], **kw)


def _shift_window(q, k, v, *, window=(-1, -1), **kw):
    return tk.ops.attention(q, k, v, window=(window[0] + 1, window[1]), **kw)


@pytest.mark.parametrize(
    ("label", "fn", "case"),
    [
        # 10%: in bf16 a 4% scale passed the checker at about 1 seed in 150 (CI, 2026-11-29); 10% at none of 500
        ("scale off by 10%", lambda q, k, v, **kw: tk.ops.attention(q, k, v, scale=1.10 / math.sqrt(q.shape[-1]), **kw),
         {"b": 1, "hq": 2, "hk": 1, "sq": 17, "sk": 17, "d": 16}),
        ("the last key dropped", _drop_last_key, {"b": 1, "hq": 2, "hk": 1, "sq": 17, "sk": 40, "d": 16}),
        ("causal aligned top-left", lambda q, k, v, causal=False, **kw: tk.ops.attention(
            q, torch.cat((k[:, :, -q.shape[2]:], k[:, :, :-q.shape[2]]), 2),
            torch.cat((v[:, :, -q.shape[2]:], v[:, :, :-q.shape[2]]), 2), causal=causal, **kw),
         {"b": 1, "hq": 2, "hk": 1, "sq": 12, "sk": 30, "d": 16, "causal": True}),
        ("window one key wider", _shift_window, {"b": 1, "hq": 2, "hk": 1, "sq": 40, "sk": 40, "d": 16, "left": 5}),
        ("softcap ignored", lambda q, k, v, softcap=0.0, **kw: tk.ops.attention(q, k, v, **kw),
         {"b": 1, "hq": 2, "hk": 1, "sq": 20, "sk": 20, "d": 16, "softcap": 1.0}),
    ],
)  # fmt: skip
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_checker_catches_wrong_attention(label, fn, case, dtype):
    assert not testing.run_case(_broken(fn), case, dtype, "cpu", grad_mode="random").ok, label


def _call(device, **changes):
    q, k, v = _qkv(device, hq=4, hk=2, sq=5, sk=6, d=16)
    args = {"q": q, "k": k, "v": v, **changes}
    return tk.ops.attention(**args)


BAD = [
    ({"layout": "bsdh"}, ValueError, r"attention: layout must be one of \('bhsd', 'bshd'\), got 'bsdh'"),
    ({"k": torch.randn(2, 2, 6, 16), "v": torch.randn(2, 2, 6, 16)}, ValueError,
     r"attention: q and k must have the same batch size \(batch, heads, seq, head_dim\), got shapes \(1, 4, 5, 16\) "
     r"and \(2, 2, 6, 16\)"),
    ({"k": torch.randn(1, 3, 6, 16), "v": torch.randn(1, 3, 6, 16)}, ValueError,
     "attention: the number of q heads must be a multiple of the number of k and v heads .GQA., got 4 and 3"),
    ({"v": torch.randn(1, 2, 7, 16)}, ValueError, r"attention: k and v must have the same shape .* got \(1, 2, 6, 16\) "
     r"and \(1, 2, 7, 16\)"),
    ({"k": torch.randn(1, 2, 6, 8), "v": torch.randn(1, 2, 6, 8)}, ValueError,
     "attention: q and k must have the same head_dim"),
    ({"q": torch.randn(1, 4, 5, 300), "k": torch.randn(1, 2, 6, 300), "v": torch.randn(1, 2, 6, 300)}, ValueError,
     r"attention: head_dim must be in \[1, 256\], got 300"),
    ({"q": torch.ones(1, 4, 5, 16, dtype=torch.int32)}, TypeError,
     "attention: q must have dtype in .* got torch.int32"),
    ({"v": torch.randn(1, 2, 6, 16, dtype=torch.float16)}, TypeError,
     "attention: q and v must have the same dtype, got torch.float32 and torch.float16"),
    ({"q": torch.randn(4, 5, 16)}, ValueError, r"attention: q must have 4 dimensions, got 3"),
    ({"k": torch.randn(1, 2, 0, 16), "v": torch.randn(1, 2, 0, 16)}, ValueError,
     r"attention: k and v hold no keys \(seq length 0\) and causal=False"),
    ({"window": (-2, 0)}, ValueError, r"attention: window's left must be -1 \(unbounded\) or >= 0, got -2"),
    ({"window": (3,)}, TypeError, r"attention: window must be a pair \(left, right\) of ints, got \(3,\)"),
    ({"window": (3, 1.5)}, TypeError, r"attention: window's right must be an int \(-1: unbounded\), got float"),
    ({"window": (3, 2), "causal": True}, ValueError, r"attention: causal=True means window right = 0"),
    ({"causal": 1}, TypeError, "attention: causal must be a bool, got int"),
    ({"deterministic": 0}, TypeError, "attention: deterministic must be a bool, got int"),
    ({"softcap": -1.0}, ValueError, r"attention: softcap must be >= 0 \(0: no cap\), got -1.0"),
    ({"scale": float("nan")}, TypeError, r"attention: scale must be a finite float or None"),
    ({"k": [1.0]}, TypeError, "attention: k must be a torch.Tensor, got list"),
]  # fmt: skip


@pytest.mark.parametrize(("changes", "error", "match"), BAD, ids=[m[:40] for _, _, m in BAD])
def test_bad_input_names_the_argument(changes, error, match, device):
    changes = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in changes.items()}
    with pytest.raises(error, match=match):
        _call(device, **changes)


def _varlen_call(**changes):
    q, k, v = torch.randn(12, 4, 16), torch.randn(12, 2, 16), torch.randn(12, 2, 16)
    cu = torch.tensor([0, 5, 12], dtype=torch.int32)
    args = {"q": q, "k": k, "v": v, "cu_seqlens_q": cu, "cu_seqlens_k": cu, "max_seqlen_q": 7, "max_seqlen_k": 7,
            **changes}  # fmt: skip
    return tk.ops.attention_varlen(**args)


VARLEN_BAD = [
    ({"cu_seqlens_q": torch.tensor([0, 5, 12])}, TypeError,
     "attention_varlen: cu_seqlens_q must have dtype in .int32., got torch.int64"),
    ({"cu_seqlens_k": torch.tensor([0, 7, 5, 12], dtype=torch.int32)}, ValueError,
     "cu_seqlens_q and cu_seqlens_k must have the same length"),
    ({"cu_seqlens_q": torch.tensor([0, 7, 5], dtype=torch.int32)}, ValueError,
     r"attention_varlen: cu_seqlens_q must rise from 0 to the packed length 12 without decreasing, got \[0, 7, 5\]"),
    ({"cu_seqlens_q": torch.tensor([0, 5, 11], dtype=torch.int32)}, ValueError, "got \\[0, 5, 11\\]"),
    ({"max_seqlen_q": 6}, ValueError, r"attention_varlen: cu_seqlens_q holds a sequence of 7 tokens, longer than its "
     r"max \(6\)"),
    ({"max_seqlen_k": 7.0}, TypeError, "attention_varlen: max_seqlen_k must be an int, got float"),
    ({"deterministic": "no"}, TypeError, "attention_varlen: deterministic must be a bool, got str"),
    ({"q": torch.randn(1, 12, 4, 16)}, ValueError, "attention_varlen: q must have 3 dimensions, got 4"),
    ({"cu_seqlens_q": torch.tensor([0], dtype=torch.int32), "cu_seqlens_k": torch.tensor([0], dtype=torch.int32)},
     ValueError, r"cu_seqlens_q must hold batch \+ 1 >= 2 offsets"),
]  # fmt: skip


@pytest.mark.parametrize(("changes", "error", "match"), VARLEN_BAD, ids=[m[:40] for _, _, m in VARLEN_BAD])
def test_varlen_bad_input_names_the_argument(changes, error, match):
    with pytest.raises(error, match=match):
        _varlen_call(**changes)


# ---------------------------------------------------------------- GPU only: determinism, CUDA graphs, a large case
@pytest.mark.gpu
@pytest.mark.parametrize("deterministic", [True, False])
def test_backward_is_deterministic(deterministic):
    """Every gradient the same bits run to run, whatever deterministic= says."""
    q, k, v = _qkv("cuda", b=2, hq=16, hk=4, sq=1000, sk=1000, d=128, dtype=torch.bfloat16)
    grad = torch.randn_like(q)
    runs = []
    for _ in range(2):
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        out = tk.ops.attention(*leaves, causal=True, deterministic=deterministic)
        runs.append(torch.autograd.grad(out, leaves, grad))
    for first, second in zip(*runs, strict=True):
        assert torch.equal(first, second)


@pytest.mark.gpu
@pytest.mark.parametrize("packed", [False, True], ids=["dense", "varlen"])
def test_cuda_graph_capture_forward_and_backward(packed):
    if packed:
        q, k, v = (torch.randn(300, h, 64, device="cuda", dtype=torch.bfloat16) for h in (8, 2, 2))
        cu = torch.tensor([0, 100, 130, 300], dtype=torch.int32, device="cuda")

        def attend(q, k, v):
            return tk.ops.attention_varlen(q, k, v, cu, cu, 170, 170, causal=True, softcap=20.0)
    else:
        q, k, v = _qkv("cuda", b=2, hq=8, hk=2, sq=257, sk=257, d=64, dtype=torch.bfloat16)

        def attend(q, k, v):
            return tk.ops.attention(q, k, v, causal=True, window=(64, 0))

    def step(q, k, v, grad):
        leaves = (q.requires_grad_(), k.requires_grad_(), v.requires_grad_())
        out = attend(*leaves)
        return (out, *torch.autograd.grad(out, leaves, grad))

    assert_graph_replay_matches_eager(step, [q, k, v, torch.randn_like(q)])


@pytest.mark.gpu
def test_issue_shape_forward_and_backward_on_gpu():
    """B4 H32 N4096 d128 causal GQA 32:8 in bf16 against the float64 reference."""
    case = {"b": 1, "hq": 32, "hk": 8, "sq": 4096, "sk": 4096, "d": 128, "causal": True}
    result = testing.run_case(catalog.get("attention"), case, torch.bfloat16, "cuda", grad_mode="random")
    assert result.ok, result.explain()
