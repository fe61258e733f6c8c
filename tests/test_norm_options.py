"""flash-attention's layer_norm_fn options on tk.ops.rms_norm / layer_norm: dropout of x and x1 (seeded, recomputed in
the backward), rowscale, the parallel second input x1 and second output from weight1/bias1.

The first test runs the checks of flash-attention's tests/ops/triton/test_layer_norm.py over its parametrizations with
dropout, rowscale and the parallel input/output, at interpreter sizes, against a float64 reference of the same
semantics fed the returned dropout masks (as flash-attention's test feeds its reference); every dtype pairing of that
test is reached, one per flag combination in turn. The rest: the masks are the seed's, bad input, torch.compile, the
launchers' plans.
"""

import itertools

import pytest
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

import tritonkit as tk
from helpers import assert_compiled_matches_eager
from tritonkit._core.dropout import keep_mask
from tritonkit._core.jit.dropout import keep_mask as keep_mask_in_kernel
from tritonkit.ops.norm import op as norm_op_module
from tritonkit.ops.norm.launch import norm_options_bwd, norm_options_fwd
from tritonkit.ops.norm.plan import BwdRowsPlan, FwdRowsPlan

NORMS = ["rms_norm", "layer_norm"]
# flash-attention's (input, residual) and weight dtypes
DTYPE_PAIRS = [(torch.float16, torch.float16), (torch.float16, torch.float32), (torch.float32, torch.float32),
               (torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float32)]  # fmt: skip
WEIGHT_DTYPES = [torch.float32, torch.float16, torch.bfloat16]
HIDDEN_SIZES = [40, 64]  # flash-attention's 192 ... 4096, cut to interpreter sizes; 40 leaves a masked tail
BATCH, SEQLEN = 2, 2  # flash-attention: 8, 512; the backward takes a row a step under the interpreter


def _flash_grid():
    """flash-attention's flag product (rowscale with x1 is refused: test_bad_input), each flag combination with the
    next dtype pairing and hidden size in turn, so that every pairing runs with every option somewhere."""
    params = []
    flags = itertools.product([True, False], [False, True], [True, False], [0.0, 0.27], [False, True], [False, True],
                              [False, True])  # fmt: skip
    combos = [combo for combo in flags if not (combo[4] and combo[5])]
    for i, (prenorm, is_rms, has_residual, dropout_p, has_rowscale, has_x1, has_weight1) in enumerate(combos):
        input_dtype, residual_dtype = DTYPE_PAIRS[i % len(DTYPE_PAIRS)]
        weight_dtype = WEIGHT_DTYPES[(i // len(DTYPE_PAIRS)) % len(WEIGHT_DTYPES)]
        hidden = HIDDEN_SIZES[i % len(HIDDEN_SIZES)]
        label = (f"{'rms' if is_rms else 'ln'}-prenorm{prenorm:d}-res{has_residual:d}-p{dropout_p}-"
                 f"rowscale{has_rowscale:d}-x1{has_x1:d}-w1{has_weight1:d}-{str(input_dtype)[6:]}-"
                 f"{str(residual_dtype)[6:]}-w{str(weight_dtype)[6:]}-{hidden}")  # fmt: skip
        params.append(pytest.param(hidden, input_dtype, residual_dtype, weight_dtype, has_residual, is_rms, prenorm,
                                   dropout_p, has_rowscale, has_x1, has_weight1, id=label))  # fmt: skip
    return params


def _reference(is_rms, x, weight, bias, residual=None, x1=None, weight1=None, bias1=None, eps=1e-6, dropout_p=0.0,
               rowscale=None, prenorm=False, dropout_mask=None, dropout_mask1=None, dtypes=None):  # fmt: skip
    """flash-attention's layer_norm_ref / rms_norm_ref semantics, in whatever dtype the tensors come in; ``dtypes``:
    the (outputs', h's) dtypes to round to, as torch's own low-precision computation returns them."""
    if rowscale is not None:
        x = x * rowscale[..., None]
    if dropout_p > 0.0:
        x = x.masked_fill(~dropout_mask, 0.0) / (1.0 - dropout_p)
        if x1 is not None:
            x1 = x1.masked_fill(~dropout_mask1, 0.0) / (1.0 - dropout_p)
    if x1 is not None:
        x = x + x1
    if residual is not None:
        x = x + residual
    if is_rms:
        normalized = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)
    else:
        centered = x - x.mean(-1, keepdim=True)
        normalized = centered * torch.rsqrt(centered.square().mean(-1, keepdim=True) + eps)
    out_dtype, h_dtype = dtypes or (None, None)
    out = normalized * weight + bias if bias is not None else normalized * weight
    outputs = [out.to(out_dtype)]
    if weight1 is not None:
        outputs.append((normalized * weight1 + bias1 if bias1 is not None else normalized * weight1).to(out_dtype))
    if prenorm:
        outputs.append(x.to(h_dtype))
    return outputs


def _leaf(t, dtype=None):
    return None if t is None else t.detach().to(dtype or t.dtype).requires_grad_()


@pytest.mark.parametrize(("hidden_size", "input_dtype", "residual_dtype", "weight_dtype", "has_residual", "is_rms_norm",
                          "prenorm", "dropout_p", "has_rowscale", "has_x1", "has_weight1"), _flash_grid())  # fmt: skip
def test_flash_attention_layer_norm_checks(hidden_size, input_dtype, residual_dtype, weight_dtype, has_residual,
                                           is_rms_norm, prenorm, dropout_p, has_rowscale, has_x1, has_weight1,
                                           device):  # fmt: skip
    """Output, h, y1 and every gradient within flash-attention's bound: no further from the float64 reference than
    twice torch's own computation in the inputs' dtypes, plus its atol; the outputs in flash-attention's dtypes."""
    low = {input_dtype, residual_dtype, weight_dtype}
    atol = 5e-2 if torch.bfloat16 in low else 1e-2 if torch.float16 in low else 1e-4

    def allclose(ours, pt, ref):
        """flash-attention's bound: torch's error over the elements where its low-precision gradient is not NaN
        (it can be), perturbed where it is exactly 0 (0.3 / 0.3 rounds). Plus, with bf16 outputs or inputs, one
        bf16 ulp of the largest value: the interpreter truncates fp32 to bf16 where the GPU rounds
        (docs/interpreter.md), in the outputs and so in the gradients that the test's loss takes from them."""
        finite = ~pt.isnan()
        pt_error = (pt.double()[finite] - ref[finite]).abs().max()
        if pt_error == 0:
            pt_error = ((pt * 0.3 / 0.3).double()[finite] - ref[finite]).abs().max()
        truncated = torch.bfloat16 in (ours.dtype, input_dtype)
        truncation = torch.finfo(torch.bfloat16).eps * ref.abs().max() if truncated else 0.0
        return (ours.double() - ref).abs().max() <= 2 * pt_error + atol + truncation

    shape = (BATCH, SEQLEN, hidden_size)
    tensors = {
        "x": torch.randn(shape, dtype=input_dtype, device=device),
        "residual": torch.randn(shape, dtype=residual_dtype, device=device) if has_residual else None,
        "weight": torch.randn(hidden_size, dtype=weight_dtype, device=device),
        "bias": None if is_rms_norm else torch.randn(hidden_size, dtype=weight_dtype, device=device),
        "x1": torch.randn(shape, dtype=input_dtype, device=device) if has_x1 else None,
        "weight1": torch.randn(hidden_size, dtype=weight_dtype, device=device) if has_weight1 else None,
        "bias1": (
            torch.randn(hidden_size, dtype=weight_dtype, device=device) if has_weight1 and not is_rms_norm else None
        ),
    }
    rowscale = torch.randn(BATCH, SEQLEN, dtype=input_dtype, device=device) if has_rowscale else None
    ours = {k: _leaf(t) for k, t in tensors.items()}
    pt = {k: _leaf(t) for k, t in tensors.items()}
    ref = {k: _leaf(t, torch.float64) for k, t in tensors.items()}
    residual_in_fp32 = (not has_residual) and residual_dtype == torch.float32
    op = tk.ops.rms_norm if is_rms_norm else tk.ops.layer_norm
    out, *rest = op(ours["x"], ours["weight"], ours["bias"], residual=ours["residual"], eps=1e-6, prenorm=prenorm,
                    residual_in_fp32=residual_in_fp32, x1=ours["x1"], weight1=ours["weight1"], bias1=ours["bias1"],
                    dropout_p=dropout_p, rowscale=rowscale, return_dropout_mask=True)  # fmt: skip
    dropout_mask, dropout_mask1 = rest[-2], rest[-1]
    assert (dropout_mask is not None) == (dropout_p > 0)
    assert (dropout_mask1 is not None) == (dropout_p > 0 and has_x1)
    masks = {"dropout_mask": dropout_mask, "dropout_mask1": dropout_mask1}
    common = dict(eps=1e-6, dropout_p=dropout_p, prenorm=prenorm, **masks)
    out_pt, *rest_pt = _reference(is_rms_norm, **pt, rowscale=rowscale, dtypes=(input_dtype, residual_dtype), **common)
    out_ref, *rest_ref = _reference(is_rms_norm, **ref, rowscale=_leaf(rowscale, torch.float64), **common)
    out1, out1_pt, out1_ref = (rest.pop(0), rest_pt.pop(0), rest_ref.pop(0)) if has_weight1 else (None,) * 3
    assert out.dtype == input_dtype
    assert allclose(out, out_pt, out_ref)
    if has_weight1:
        assert out1.dtype == input_dtype
        assert allclose(out1, out1_pt, out1_ref)
    if prenorm:
        residual, residual_pt, residual_ref = rest[0], rest_pt[0], rest_ref[0]
        assert residual.dtype == residual_dtype
        assert allclose(residual, residual_pt, residual_ref)
    if dropout_mask1 is not None:
        assert not torch.equal(dropout_mask, dropout_mask1)

    g = torch.randn_like(out) / BATCH
    losses = []
    for o, o1, r in ((out, out1, rest), (out_pt, out1_pt, rest_pt), (out_ref, out1_ref, rest_ref)):
        o = o * F.gelu(o1) if has_weight1 else o
        losses.append(o * torch.sigmoid(r[0]) if prenorm else o)
    for loss in losses:
        loss.backward(g.to(loss.dtype))
    for name in tensors:
        if tensors[name] is not None:
            assert allclose(ours[name].grad, pt[name].grad, ref[name].grad), name


@pytest.mark.parametrize("norm", NORMS)
def test_dropout_masks_are_the_seeds(norm):
    """The masks are tritonkit._core.dropout.keep_mask of the seed at each element's counter (x: row * N + column,
    x1: the rows after x's), the output is x dropped by them, a seed gives the same call twice and another seed
    other masks; without a seed, torch.manual_seed makes the call reproducible."""
    op = getattr(tk.ops, norm)
    x, x1, weight = torch.randn(6, 40), torch.randn(6, 40), torch.randn(40)
    bias = None if norm == "rms_norm" else torch.randn(40)
    seed = 2**40 + 12345  # a seed with a high word
    y, mask, mask1 = op(x, weight, bias, x1=x1, dropout_p=0.27, dropout_seed=seed, return_dropout_mask=True)
    counters = torch.arange(x.numel()).view(x.shape)
    assert torch.equal(mask, keep_mask(seed, counters, 0.27))
    assert torch.equal(mask1, keep_mask(seed, counters + x.numel(), 0.27))
    expected = op(torch.where(mask, x / 0.73, 0.0) + torch.where(mask1, x1 / 0.73, 0.0), weight, bias)
    torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-5)
    again = op(x, weight, bias, x1=x1, dropout_p=0.27, dropout_seed=seed, return_dropout_mask=True)
    assert all(torch.equal(a, b) for a, b in zip((y, mask, mask1), again, strict=True))
    other = op(x, weight, bias, x1=x1, dropout_p=0.27, dropout_seed=seed + 1, return_dropout_mask=True)
    assert not torch.equal(other[1], mask)
    draws = []
    for _ in range(2):
        torch.manual_seed(7)
        draws.append(op(x, weight, bias, dropout_p=0.27, return_dropout_mask=True)[1])
    assert torch.equal(draws[0], draws[1])


def test_dropout_drops_p_of_the_elements():
    """Over 2**16 elements each mask drops p of them to within flash-attention's 0.01 (five standard deviations; the
    masks are fixed, so this never flakes), at counters below and above 2**32 and under seeds with a high word; two
    streams of one seed agree on half their elements, as independent ones do."""
    counters = torch.arange(1 << 16)
    for p, seed, base in ((0.1, 0, 0), (0.27, 2**62 + 3, 0), (0.5, 123, 2**33), (0.9, 2**40, 2**32 - 7)):
        dropped = 1.0 - keep_mask(seed, counters + base, p).float().mean()
        assert abs(float(dropped) - p) < 0.01, (p, seed, base)
    first, second = keep_mask(5, counters, 0.5), keep_mask(5, counters + counters.numel(), 0.5)
    assert abs(float((first == second).float().mean()) - 0.5) < 0.01


@triton.jit
def _keep_mask_probe_kernel(p_seed, p_keep, base, threshold, BLOCK: tl.constexpr):
    o_counter = base + tl.arange(0, BLOCK).to(tl.int64)
    tl.store(p_keep + tl.arange(0, BLOCK), keep_mask_in_kernel(p_seed, o_counter, threshold))


def test_kernel_mask_is_the_torch_mirror_at_counters_past_two_to_the_32():
    for seed, base in ((2**63 - 1, 2**32 + 5), (99, 2**45)):
        keep = torch.empty(256, dtype=torch.bool)
        _keep_mask_probe_kernel[(1,)](torch.tensor([seed]), keep, base, round(0.3 * 2**24), BLOCK=256)
        assert torch.equal(keep, keep_mask(seed, base + torch.arange(256), 0.3))


@pytest.mark.parametrize("norm", NORMS)
def test_dropout_mask_without_dropout_is_none(norm):
    """As flash-attention: return_dropout_mask=True with dropout_p=0 returns None for both masks."""
    op = getattr(tk.ops, norm)
    x, weight = torch.randn(3, 16), torch.randn(16)
    y, mask, mask1 = op(x, weight, None, return_dropout_mask=True)
    assert mask is None and mask1 is None
    torch.testing.assert_close(y, op(x, weight, None))


def test_plain_calls_take_the_plain_op(monkeypatch):
    """A call without the options never reaches the options' op (so its path and kernels are as before)."""

    def refuse(*args):
        raise AssertionError("the options' op was called")

    monkeypatch.setattr(norm_op_module, "norm_options_op", refuse)
    x, weight = torch.randn(3, 16), torch.randn(16)
    tk.ops.rms_norm(x, weight, residual=torch.randn(3, 16), prenorm=True, dropout_seed=5)
    with pytest.raises(AssertionError, match="options' op"):
        tk.ops.rms_norm(x, weight, dropout_p=0.1)


@pytest.mark.parametrize("norm", NORMS)
def test_forward_without_gradient_matches_training_forward(norm):
    """Without grad the options' forward skips the statistics and gives the training forward's outputs bit for bit."""
    op = getattr(tk.ops, norm)
    x, x1, res = torch.randn(5, 48), torch.randn(5, 48), torch.randn(5, 48)
    weight, weight1 = torch.randn(48), torch.randn(48)
    kwargs = dict(residual=res, prenorm=True, x1=x1, weight1=weight1, dropout_p=0.2, dropout_seed=3)
    with torch.no_grad():
        inference = op(x, weight, None, **kwargs)
    training = op(x.requires_grad_(), weight, None, **kwargs)
    assert all(torch.equal(a, b.detach()) for a, b in zip(inference, training, strict=True))


@pytest.mark.parametrize("norm", NORMS)
def test_every_option_plan_through_the_launchers(norm):
    """Whole-row plans of several rows a program and step, interleaved and in blocks, against the op's own plans."""
    is_rms = norm == "rms_norm"
    x, x1, res = torch.randn(9, 40), torch.randn(9, 40), torch.randn(9, 40)
    w, w1 = torch.randn(40), torch.randn(40)
    seed = torch.tensor([11])
    args = (x, x1, w, w1, None, None, res, None, seed, 1e-5, 0.0, 0.3, is_rms, True, False, False)
    expected = norm_options_fwd(*args)
    y, y1, h, mean, rstd, _ = norm_options_fwd(*args, plan=FwdRowsPlan(rows=4, warps=2))
    for ours, theirs in zip((y, y1, h, mean, rstd), expected[:5], strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-6)
    dy, dy1 = torch.randn(9, 40), torch.randn(9, 40)
    bwd = (dy, dy1, None, x, x1, w, w1, res, None, seed, None if is_rms else mean, rstd, 0.0, 0.3, is_rms, False, False)
    reference = norm_options_bwd(*bwd)
    for plan in (BwdRowsPlan(programs_per_sm=1, warps=2, rows=2, stages=1, interleaved=False),
                 BwdRowsPlan(programs_per_sm=2, warps=2, rows=4, stages=2)):  # fmt: skip
        grads = norm_options_bwd(*bwd, plan=plan)
        for ours, theirs in zip(grads, reference, strict=True):
            torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("norm", NORMS)
def test_compiles_fullgraph_with_options(norm, device):
    op = getattr(tk.ops, norm)

    def block(x, x1, residual, weight, weight1):
        y, y1, h = op(x, weight, None, residual=residual, prenorm=True, x1=x1, weight1=weight1, dropout_p=0.2,
                      dropout_seed=9)  # fmt: skip
        return (y * y1).sum() + h.sum()

    inputs = [torch.randn(4, 32, device=device) for _ in range(3)] + [torch.randn(32, device=device) for _ in range(2)]
    assert_compiled_matches_eager(block, [t.requires_grad_() for t in inputs], device)

    def drawn_seed(x, weight):  # the seed drawn from torch's generator inside the graph
        return op(x, weight, None, dropout_p=0.2).sum()

    torch._dynamo.reset()
    backend = "inductor" if device == "cuda" else "aot_eager"
    torch.compile(drawn_seed, fullgraph=True, backend=backend)(inputs[0], inputs[3]).backward()


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"x1": torch.randn(4, 17)}, ValueError, "x1 must have x's shape"),
        ({"x1": torch.ones(4, 16, dtype=torch.int32)}, TypeError, "x1 must have dtype"),
        ({"weight1": torch.randn(15)}, ValueError, r"weight1 must have shape \(16,\)"),
        ({"bias1": torch.randn(16)}, ValueError, "bias1 .* weight1 is None"),
        ({"rowscale": torch.randn(16)}, ValueError, r"rowscale must have x's leading shape \(4,\)"),
        ({"rowscale": torch.randn(4), "x1": torch.randn(4, 16)}, ValueError, "rowscale .* x1"),
        ({"rowscale": torch.randn(4, requires_grad=True)}, ValueError, "rowscale requires grad"),
        ({"dropout_p": 1.0}, ValueError, r"dropout_p must be a probability in \[0, 1\), got 1.0"),
        ({"dropout_p": -0.1}, ValueError, "dropout_p must be"),
        ({"dropout_p": True}, ValueError, "dropout_p must be"),
        ({"dropout_p": 0.1, "dropout_seed": -1}, ValueError, "dropout_seed must be None or an int"),
        ({"dropout_p": 0.1, "dropout_seed": 2**63}, ValueError, "dropout_seed must be"),
        ({"dropout_p": 0.1, "dropout_seed": 1.5}, ValueError, "dropout_seed must be"),
        ({"return_dropout_mask": "yes"}, TypeError, "return_dropout_mask must be a bool"),
    ],
    ids=lambda value: value if isinstance(value, str) else None,
)
@pytest.mark.parametrize("norm", NORMS)
def test_bad_input(norm, kwargs, error, match):
    with pytest.raises(error, match=match):
        getattr(tk.ops, norm)(torch.randn(4, 16), torch.randn(16), None, **kwargs)


@pytest.mark.parametrize("norm", NORMS)
def test_options_refuse_rows_wider_than_one_program(norm):
    with pytest.raises(ValueError, match=f"{norm}: x1, weight1, dropout_p and rowscale take rows of at most 16384"):
        getattr(tk.ops, norm)(torch.randn(2, 16385), None, None, dropout_p=0.1)
