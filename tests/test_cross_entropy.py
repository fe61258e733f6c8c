"""Cross-entropy and fused linear cross-entropy beyond the registry sweep: torch's own semantics,
all-ignored batches, bad targets, compile without graph breaks, the nn modules, chunking, bad input;
and, with ``-m gpu``, CUDA graphs and memory."""

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import tritonkit as tk
from helpers import assert_compiled_matches_eager, assert_graph_replay_matches_eager, assert_one_chunk_sums_round_once
from tritonkit import catalog, debug, testing
from tritonkit._core.device import arch as tk_arch
from tritonkit._core.loss_chunks import MAX_CHUNK_LOGIT_BYTES, FusedChunkPlan, fused_chunk_plan
from tritonkit.ops.loss import launch as loss_launch
from tritonkit.ops.loss.launch import cross_entropy_bwd, cross_entropy_fwd, fused_linear_cross_entropy_fwd
from tritonkit.ops.loss.op import fused_linear_cross_entropy_op
from tritonkit.ops.loss.spec import _cross_entropy_reference
from tritonkit.registry import KernelSpec

REDUCTIONS = ["mean", "sum", "none"]


def _targets(n, vocab, device, ignore_every=3, ignore_index=-100):
    target = torch.randint(0, vocab, (n,), device=device)
    target[::ignore_every] = ignore_index
    return target


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("label_smoothing", [0.0, 0.3])
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "class-weights"])
def test_equals_torch_cross_entropy(reduction, label_smoothing, weighted, device):
    """Straight against F.cross_entropy in float64 (no reimplemented reduction): mean over non-ignored
    targets (with class weights: over their weights), label smoothing as torch defines it (weighted per class),
    and the gradient. The gradient's absolute floor is 1e-6: at the target column p - (1 - smoothing) can cancel to
    ~0 while p itself carries fp32 rounding of a few 1e-7 (a floor of 1e-7 against torch's fp32 result failed one
    full-suite run)."""
    logits = (3 * torch.randn(7, 50, device=device, dtype=torch.float64)).float().requires_grad_()
    exact = logits.detach().double().requires_grad_()
    target = _targets(7, 50, device)
    weight = 0.5 + torch.rand(50, device=device) if weighted else None
    options = dict(label_smoothing=label_smoothing, reduction=reduction)
    ours = tk.ops.cross_entropy(logits, target, weight, **options)
    theirs = F.cross_entropy(exact, target, weight.double() if weighted else None, **options)
    torch.testing.assert_close(ours.double(), theirs, rtol=1e-6, atol=1e-6)
    upstream = torch.randn_like(theirs)
    ours_grad = torch.autograd.grad(ours, logits, upstream.float())[0]
    theirs_grad = torch.autograd.grad(theirs, exact, upstream)[0]
    torch.testing.assert_close(ours_grad.double(), theirs_grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("fused", [False, True])
def test_all_ignored_gives_zero_loss_and_zero_gradient(reduction, fused, device):
    hidden = torch.randn(5, 8, device=device, requires_grad=True)
    weight = torch.randn(11, 8, device=device, requires_grad=True)
    target = torch.full((5,), -100, device=device)
    options = {"label_smoothing": 0.1, "z_loss": 1e-2, "softcap": 3.0, "reduction": reduction}
    if fused:
        loss = tk.ops.fused_linear_cross_entropy(hidden, weight, target, **options)
    else:
        loss = tk.ops.cross_entropy(hidden @ weight.t(), target, **options)
    loss.sum().backward()
    assert torch.equal(loss, torch.zeros_like(loss))
    assert torch.equal(hidden.grad, torch.zeros_like(hidden)) and torch.equal(weight.grad, torch.zeros_like(weight))


@pytest.mark.parametrize("bad", [7, 10**12, -1, -(10**12)])
def test_out_of_range_target_gives_nan_for_its_row_and_is_never_an_address(bad, device):
    logits = torch.randn(4, 7, device=device, requires_grad=True)
    target = torch.tensor([1, bad, -100, 6], device=device)
    rows = tk.ops.cross_entropy(logits, target, reduction="none")
    assert rows[1].isnan() and rows[2] == 0
    valid = torch.tensor([0, 3], device=device)
    torch.testing.assert_close(rows[valid], F.cross_entropy(logits[valid], target[valid], reduction="none"))
    assert tk.ops.cross_entropy(logits, target).isnan()  # the mean carries it: the error is visible
    (grad,) = torch.autograd.grad(rows.sum(), logits)
    assert grad[1].isnan().all() and grad[[0, 2, 3]].isfinite().all()

    def backward(x, t, lse):
        return cross_entropy_bwd(torch.ones(4, device=device), x, t, lse, -100, 0.0, 0.0, 0.0, "none")

    _, lse = cross_entropy_fwd(logits.detach(), target, -100, 0.0, 0.0, 0.0, "none", logits.dtype)
    debug.guard_bounds(backward, logits.detach(), target, lse).raise_if_bad()
    debug.guard_bounds(
        lambda x, t: cross_entropy_fwd(x, t, -100, 0.1, 1e-2, 0.0, "none", x.dtype), logits.detach(), target
    ).raise_if_bad()


class _HostSyncs(TorchDispatchMode):
    """Records the torch ops that hand a device value to the host (``.item()``, ``bool(tensor)``, ``nonzero``,
    ``torch.equal``): on a GPU each one waits for the device."""

    SYNCS = ("aten._local_scalar_dense", "aten.is_nonzero", "aten.nonzero", "aten.equal", "aten.tolist")

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if str(func.overloadpacket) in self.SYNCS:
            self.seen.append(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


def _ce_and_fused(op, logits, target, **options):
    """The loss of square ``logits`` through ``op``: the fused op gets hidden = I and weight = logits.T."""
    if op == "cross_entropy":
        return tk.ops.cross_entropy(logits, target, **options)
    hidden = torch.eye(logits.shape[0], device=logits.device)
    return tk.ops.fused_linear_cross_entropy(hidden, logits.t(), target, **options)


OUT_OF_RANGE = (
    r"{op}: target must hold class indices in \[0, 7\) or ignore_index=-100, got 2 out of range \(first: 7 at "
    r"\(1,\), -1 at \(3,\)\)"
)


@pytest.mark.parametrize("op", ["cross_entropy", "fused_linear_cross_entropy"])
def test_out_of_range_targets_raise_when_checked(op, device, monkeypatch):
    """check_targets=True (or TRITONKIT_DEBUG=1) turns the silent NaN into a ValueError naming the values and where
    they are; it synchronises, so it stays off by default. check_targets=False wins over the variable."""
    logits = torch.randn(7, 7, device=device)
    target = torch.tensor([1, 7, -100, -1, 0, 6, 2], device=device)
    message = OUT_OF_RANGE.format(op=op)
    with pytest.raises(ValueError, match=message):
        _ce_and_fused(op, logits, target, check_targets=True)
    monkeypatch.setenv("TRITONKIT_DEBUG", "1")
    with pytest.raises(ValueError, match=message):
        _ce_and_fused(op, logits, target)
    assert _ce_and_fused(op, logits, target, check_targets=False).isnan()
    good = target.clamp(0, 6)
    with _HostSyncs() as syncs:
        loss = _ce_and_fused(op, logits, good, check_targets=True)
    torch.testing.assert_close(loss, F.cross_entropy(logits, good), atol=1e-5, rtol=1e-5)
    assert syncs.seen  # the check ran, and it is a host synchronisation
    with pytest.raises(TypeError, match=r"check_targets must be a bool or None, got int"):
        _ce_and_fused(op, logits, target, check_targets=1)


@pytest.mark.parametrize("op", ["cross_entropy", "fused_linear_cross_entropy"])
def test_out_of_range_targets_stay_nan_without_a_host_sync_by_default(op, device, monkeypatch):
    monkeypatch.delenv("TRITONKIT_DEBUG", raising=False)
    logits = torch.randn(7, 7, device=device, requires_grad=True)
    target = torch.tensor([1, 7, -100, -1, 0, 6, 2], device=device)
    with _HostSyncs() as syncs:
        loss = _ce_and_fused(op, logits, target, reduction="none")
        loss.sum().backward()
    assert syncs.seen == []
    assert loss[[1, 3]].isnan().all() and loss[[0, 2, 4, 5, 6]].isfinite().all()
    monkeypatch.setenv("TRITONKIT_DEBUG", "0")
    assert _ce_and_fused(op, logits, target).isnan()


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_fused_equals_cross_entropy_of_the_logits_across_chunks(reduction, device):
    """37 tokens go through in chunks of 3 (and a remainder of 1); loss and every gradient must match
    the unfused op on the materialised logits."""
    assert fused_chunk_plan(37, 29, 4, 4, "cpu").rows == 3
    hidden = torch.randn(37, 16, device=device, requires_grad=True)
    weight = torch.randn(29, 16, device=device, requires_grad=True)
    bias = torch.randn(29, device=device, requires_grad=True)
    target = _targets(37, 29, device)
    options = {"label_smoothing": 0.1, "z_loss": 1e-3, "softcap": 6.0, "reduction": reduction}
    fused = tk.ops.fused_linear_cross_entropy(hidden, weight, target, bias, **options)
    plain = tk.ops.cross_entropy(torch.addmm(bias, hidden, weight.t()), target, **options)
    torch.testing.assert_close(fused, plain, rtol=1e-5, atol=1e-6)
    upstream = torch.randn_like(plain)
    ours = torch.autograd.grad(fused, (hidden, weight, bias), upstream)
    theirs = torch.autograd.grad(plain, (hidden, weight, bias), upstream)
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_fused_chunks_on_the_cpu_hold_at_most_a_tenth_of_the_tokens():
    for n in (1, 9, 10, 11, 129, 1279, 1280, 1281, 4097, 8192, 65536):
        rows = fused_chunk_plan(n, 128256, 2, 4, "cpu").rows
        assert 1 <= rows <= max(1, n // 10), n
    assert fused_chunk_plan(8192, 128256, 2, 4, "cpu").rows == 768


@pytest.mark.parametrize("arch", ["sm90", "sm100"])
def test_fused_chunks_on_a_gpu_hide_the_accumulator_within_the_logit_cap(arch):
    """4096 rows for an fp32 accumulator, 2048 for a bf16 one (half its traffic), fewer where a chunk's logits would
    pass the cap or there are fewer tokens; whole GEMM tiles (128 rows) once that large."""
    assert fused_chunk_plan(8192, 128256, 2, 4, arch).rows == 4096
    assert fused_chunk_plan(8192, 128256, 2, 2, arch).rows == 2048
    assert fused_chunk_plan(8192, 262144, 2, 4, arch).rows == 2048  # the cap: 2048 x 262144 x 2 bytes = 1 GiB
    assert fused_chunk_plan(8192, 128256, 4, 4, arch).rows == 2048  # fp32 logits: twice the bytes a row
    assert fused_chunk_plan(1000, 128256, 2, 4, arch).rows == 1000  # all the tokens in one chunk
    assert fused_chunk_plan(8192, 10**9, 2, 4, arch).rows == 1  # a huge vocabulary: one token a chunk
    # Where a d(weight) is made and all the logits take no more than the fp32 accumulator and a chunk: one chunk.
    head = {"hidden_size": 4096, "weight_bytes": 2}
    assert fused_chunk_plan(8192, 128256, 2, 4, arch, **head).rows == 8192  # 2 GiB of logits against 3 GiB
    assert fused_chunk_plan(8193, 128256, 2, 4, arch, **head).rows == 4096
    assert fused_chunk_plan(8192, 128256, 2, 2, arch, **head).rows == 2048  # a bf16 accumulator: its chunks
    assert fused_chunk_plan(8192, 128256, 2, 4, arch, hidden_size=2048, weight_bytes=2).rows == 4096
    for n_vocab in (7, 32000, 128256, 262144, 10**6):
        for accum_bytes in (2, 4):
            rows = fused_chunk_plan(65536, n_vocab, 2, accum_bytes, arch).rows
            assert rows * n_vocab * 2 <= MAX_CHUNK_LOGIT_BYTES and rows % 128 == 0, (n_vocab, accum_bytes)


def _fused_sum_grads(hidden, weight, bias, target, accum_dtype, plan):
    """The forward launcher's d(hidden), d(weight), d(bias) for reduction "sum" (an upstream gradient of 1)."""
    options = (-100, 0.0, 0.0, 0.0, "sum", hidden.dtype, True, True, True, accum_dtype)
    _, _, *grads = fused_linear_cross_entropy_fwd(hidden, weight, target, bias, *options, plan=plan)
    return grads


def test_one_chunk_of_every_token_writes_d_weight_in_the_weights_dtype(device):
    """A chunk that takes every token needs no accumulator: d(weight) and d(bias) come from one GEMM (and one sum) in
    the weight's bf16, rounded once (assert_one_chunk_sums_round_once); chunked, the same call sums in the fp32
    accumulator asked for."""
    tokens = 40
    hidden = torch.randn(tokens, 16, device=device).bfloat16()
    weight = (torch.randn(29, 16, device=device) / 2).bfloat16()
    bias = torch.randn(29, device=device).bfloat16()
    target = _targets(tokens, 29, device)
    _, *whole = _fused_sum_grads(hidden, weight, bias, target, torch.float32, FusedChunkPlan(rows=tokens))
    _, *chunked = _fused_sum_grads(hidden, weight, bias, target, torch.float32, FusedChunkPlan(rows=7))
    assert_one_chunk_sums_round_once(hidden, weight, bias, target, whole, chunked)


@pytest.mark.parametrize(
    "op", [tk.ops.fused_linear_cross_entropy, tk.ops.vocab_parallel_fused_linear_cross_entropy], ids=["fused", "vp"]
)
def test_one_chunk_in_bf16_scales_in_place_and_refuses_a_second_backward(op, device):
    """The default fp32 accumulator, but one chunk of every token (one token: one chunk everywhere): d(weight) comes
    in bf16 and the backward scales it in place, so an upstream gradient of 3 gives 3 times the gradients of 1, and a
    second backward through the call is refused rather than fed scaled values. The vocabulary-parallel op (a group
    of one here) the same way."""
    hidden = torch.randn(1, 16, device=device).bfloat16().requires_grad_()
    weight = torch.randn(29, 16, device=device).bfloat16().requires_grad_()
    target = torch.tensor([5], device=device)
    once = torch.autograd.grad(op(hidden, weight, target), (hidden, weight))
    loss = op(hidden, weight, target)
    thrice = torch.autograd.grad(loss, (hidden, weight), torch.tensor(3.0, device=device), retain_graph=True)
    for a, b in zip(thrice, once, strict=True):
        torch.testing.assert_close(a.double(), 3 * b.double(), rtol=2**-7, atol=0)  # one bf16 ulp (see above)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        torch.autograd.grad(loss, (hidden, weight), torch.tensor(3.0, device=device))


def test_scale_in_place_skips_a_factor_of_one_and_moves_the_version(device, monkeypatch):
    """scale_in_place multiplies by the 0-d factor with one rounding; at 1 it leaves the values as they were; either
    way the tensor's version moves (autograd then refuses a reader of the old values). Two programs stride over
    the 5 blocks of 5000 elements (the grid is capped at about a wave)."""
    from tritonkit._core import losses
    from tritonkit._core.losses import scale_in_place

    monkeypatch.setattr(losses, "_SCALE_IN_PLACE_PROGRAMS", 2)
    grad = torch.randn(5000, device=device).bfloat16()
    before = grad.clone()
    version = grad._version
    scale_in_place(grad, torch.tensor(1.0, device=device))
    assert torch.equal(grad, before) and grad._version > version
    scale_in_place(grad, torch.tensor(3.0, device=device))
    # One bf16 ulp (2**-7 relative at most): the GPU rounds to nearest, the interpreter's cast truncates.
    torch.testing.assert_close(grad.float(), before.float() * 3, rtol=2**-7, atol=0)
    column = torch.randn(8, 6, device=device).t()  # not contiguous: torch's mul_
    expected = column * -2
    scale_in_place(column, torch.tensor(-2.0, device=device))
    assert torch.equal(column, expected)


def test_pipelined_row_passes_give_the_same_bits(device):
    """CrossEntropyPlan.stages: the passes' loads issued ahead give the loss, lse and in-place gradient of the
    unpipelined loop, bit for bit."""
    from tritonkit.ops.loss.launch import _launch_rows
    from tritonkit.ops.loss.plan import CrossEntropyPlan

    logits = (torch.randn(37, 3001, device=device) * 2).bfloat16()
    target = _targets(37, 3001, device)

    def run(plan):
        x = logits.clone()
        loss, lse = (torch.full((37,), float("nan"), device=device) for _ in range(2))
        _launch_rows(x, target, loss, lse, torch.full((), 0.5, device=device), x, (-100, 0.1, 1e-3, 0.0), True, True,
                     plan)  # fmt: skip
        return loss, lse, x

    for ours, theirs in zip(run(CrossEntropyPlan(512, 4, stages=3)), run(CrossEntropyPlan(512, 4)), strict=True):
        assert torch.equal(ours, theirs)


def test_fused_plan_forces_the_chunks(device, monkeypatch):
    """plan= sets the chunk rows: 37 tokens in chunks of 5 are 8 chunk GEMMs, with the gradients of one chunk."""
    hidden, weight, bias = (torch.randn(shape, device=device) for shape in ((37, 16), (29, 16), (29,)))
    target = _targets(37, 29, device)
    calls = []
    logits_gemm = loss_launch.chunk_logits
    monkeypatch.setattr(loss_launch, "chunk_logits", lambda h, *args: calls.append(h.shape[0]) or logits_gemm(h, *args))
    chunked = _fused_sum_grads(hidden, weight, bias, target, torch.float32, FusedChunkPlan(rows=5))
    assert calls == [5] * 7 + [2]
    whole = _fused_sum_grads(hidden, weight, bias, target, torch.float32, FusedChunkPlan(rows=37))
    assert calls[8:] == [37]
    for a, b in zip(chunked, whole, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows", [0, -3, 2.0, True])
def test_fused_chunk_plans_are_checked(rows):
    with pytest.raises(ValueError, match="FusedChunkPlan: rows must be an int >= 1"):
        FusedChunkPlan(rows=rows)


def test_fused_weight_dtype_accum_sums_the_chunks_in_bf16(device):
    """accum_dtype=torch.bfloat16: d(weight) and d(bias) held in bf16 and rounded once a chunk. With one token a
    chunk (48 roundings) both stay within 48 half-ulps (2**-9 relative) of the largest float64 value beyond the fp32
    accumulator's error, and the running bf16 sums differ from the fp32 sums rounded once."""
    tokens = 48
    hidden = torch.randn(tokens, 16, device=device).bfloat16()
    weight = (torch.randn(29, 16, device=device) / 2).bfloat16()
    bias = torch.randn(29, device=device).bfloat16()
    target = _targets(tokens, 29, device)
    one_token = FusedChunkPlan(rows=1)
    _, *fp32 = _fused_sum_grads(hidden, weight, bias, target, torch.float32, one_token)
    _, *bf16 = _fused_sum_grads(hidden, weight, bias, target, torch.bfloat16, one_token)
    assert [g.dtype for g in fp32] == [torch.float32] * 2 and [g.dtype for g in bf16] == [torch.bfloat16] * 2
    leaves = [t.double().requires_grad_() for t in (weight, bias)]
    logits = hidden.double() @ leaves[0].t() + leaves[1]
    expected = torch.autograd.grad(F.cross_entropy(logits, target, reduction="sum"), leaves)
    for ours, theirs, exact in zip(bf16, fp32, expected, strict=True):
        fp32_error = (theirs.double() - exact).abs().max()
        bound = fp32_error + tokens * 2**-9 * exact.abs().max()
        assert (ours.double() - exact).abs().max() <= bound
        assert not torch.equal(ours, theirs.bfloat16())


def test_fused_weight_dtype_accum_scales_its_saved_gradients_once(device):
    """With a bf16 accumulator the backward scales the forward's gradients in place: an upstream gradient of 3 gives
    3 times the gradients an upstream gradient of 1 gives (one bf16 rounding of the product; the accumulation itself
    is the same in both calls), and a second backward through the op is refused by autograd."""
    hidden = torch.randn(12, 16, device=device).bfloat16().requires_grad_()
    weight = torch.randn(29, 16, device=device).bfloat16().requires_grad_()
    target = _targets(12, 29, device)
    one, upstream = (torch.tensor(value, device=device, dtype=torch.bfloat16) for value in (1.0, 3.0))

    def fused_loss():
        return tk.ops.fused_linear_cross_entropy(hidden, weight, target, accum_dtype=torch.bfloat16)

    unscaled = torch.autograd.grad(fused_loss(), (hidden, weight), one)
    loss = fused_loss()
    ours = torch.autograd.grad(loss, (hidden, weight), upstream, retain_graph=True)
    for a, b in zip(ours, unscaled, strict=True):
        assert a.dtype == torch.bfloat16
        # One bf16 ulp: the GPU's product rounds to nearest (a half-ulp), the interpreter's cast truncates.
        torch.testing.assert_close(a.double(), 3 * b.double(), rtol=2**-7, atol=0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        torch.autograd.grad(loss, (hidden, weight), upstream)


def test_fused_with_a_frozen_weight_or_hidden_skips_their_gradients(device):
    hidden = torch.randn(6, 8, device=device)
    weight = torch.randn(5, 8, device=device).t().contiguous().t()  # a column-major view, as tied weights can be
    target = _targets(6, 5, device)
    loss = tk.ops.fused_linear_cross_entropy(hidden.requires_grad_(), weight, target)
    (grad_hidden,) = torch.autograd.grad(loss, hidden)
    hidden.requires_grad_(False)
    weight.requires_grad_()
    (grad_weight,) = torch.autograd.grad(tk.ops.fused_linear_cross_entropy(hidden, weight, target), weight)
    hidden.requires_grad_()
    plain = F.cross_entropy(hidden @ weight.t(), target)
    expected = torch.autograd.grad(plain, (hidden, weight))
    torch.testing.assert_close(grad_hidden, expected[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grad_weight, expected[1], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_compiles_fullgraph_with_backward(reduction, device):
    def cross_entropy_block(logits):
        target = torch.arange(logits.shape[0], device=logits.device) % logits.shape[1]
        target[::2] = -100
        loss = tk.ops.cross_entropy(logits * 2, target, z_loss=1e-3, label_smoothing=0.1, softcap=4.0,
                                    reduction=reduction)  # fmt: skip
        return (loss * torch.arange(loss.numel(), device=loss.device)).sum() if reduction == "none" else loss * 3

    def fused_block(hidden, weight, bias):
        target = torch.arange(hidden.shape[0], device=hidden.device) % weight.shape[0]
        target[::3] = -100
        loss = tk.ops.fused_linear_cross_entropy(hidden, weight, target, bias, z_loss=1e-3, reduction=reduction)
        return (loss * torch.arange(loss.numel(), device=loss.device)).sum() if reduction == "none" else loss * 3

    assert_compiled_matches_eager(cross_entropy_block, [torch.randn(6, 33, device=device, requires_grad=True)], device)
    fused_inputs = [torch.randn(shape, device=device, requires_grad=True) for shape in ((12, 8), (9, 8), (9,))]
    assert_compiled_matches_eager(fused_block, fused_inputs, device)


INPLACE_UNDER_COMPILE = (
    r"cross_entropy: inplace_backward=True overwrites the logits in the backward, which torch\.compile cannot trace; "
    r"leave it False under torch\.compile"
)


@pytest.mark.parametrize("fullgraph", [True, False], ids=["fullgraph", "graph-breaks-allowed"])
def test_inplace_backward_under_compile_raises(fullgraph, device):
    """A backward that overwrites its input cannot be traced: under torch.compile the flag is refused with a
    ValueError (it used to be ignored silently), with or without fullgraph (a graph break must not fall back to
    eager mode and run the in-place backward there)."""
    backend = "inductor" if device == "cuda" else "aot_eager"

    def block(logits):
        target = torch.arange(logits.shape[0], device=logits.device) % logits.shape[1]
        return tk.ops.cross_entropy(logits * 2, target, reduction="sum", inplace_backward=True) * 3

    logits = torch.randn(6, 33, device=device, requires_grad=True)
    torch._dynamo.reset()
    with pytest.raises(ValueError, match=INPLACE_UNDER_COMPILE):
        torch.compile(block, fullgraph=fullgraph, backend=backend)(logits)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_inplace_backward_writes_the_gradient_over_the_logits(reduction, device):
    """The gradient is right (against float64 torch, through an LM head's matmul too) and lives in the
    logits' memory: a skipped element would keep its logit and fail the comparison."""
    hidden = torch.randn(9, 16, device=device, requires_grad=True)
    weight = torch.randn(37, 16, device=device, requires_grad=True)
    target = _targets(9, 37, device)
    options = {"label_smoothing": 0.1, "z_loss": 1e-2, "softcap": 6.0, "reduction": reduction}
    logits = hidden @ weight.t()
    loss = tk.ops.cross_entropy(logits, target, inplace_backward=True, **options)
    upstream = torch.randn_like(loss)
    grads = torch.autograd.grad(loss, (hidden, weight, logits), upstream)
    assert grads[2].data_ptr() == logits.data_ptr()
    exact = [t.detach().double().requires_grad_() for t in (hidden, weight)]
    expected_loss = _cross_entropy_reference(exact[0] @ exact[1].t(), target, **options)
    expected = torch.autograd.grad(expected_loss, exact, upstream.double())
    torch.testing.assert_close(loss.double(), expected_loss, rtol=1e-5, atol=1e-5)
    for ours, theirs in zip(grads[:2], expected, strict=True):
        torch.testing.assert_close(ours.double(), theirs, rtol=1e-5, atol=1e-5)


def test_inplace_backward_raises_rather_than_feed_gradients_to_another_node(device):
    """sin saved the logits for its backward, which autograd runs after the loss's (older nodes run
    later); the overwrite bumps the logits' version, so autograd refuses instead of computing cos of a
    gradient. A second backward through the loss itself is refused the same way."""
    leaf = torch.randn(4, 11, device=device, requires_grad=True)
    logits = leaf * 1  # produced by a layer: the in-place backward may overwrite it
    target = _targets(4, 11, device)
    other = logits.sin().sum()
    loss = tk.ops.cross_entropy(logits, target, inplace_backward=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        (other + loss).backward()
    loss = tk.ops.cross_entropy(leaf * 1, target, inplace_backward=True)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


INPLACE_OVERLAP = (
    r"cross_entropy: inplace_backward=True writes the gradient over logits, but logits' elements overlap in memory "
    r"\(shape {shape}, strides {strides}\)"
)


@pytest.mark.parametrize(
    ("make", "shape", "strides"),
    [
        (lambda x: x[:1].expand(6, 11), r"\(6, 11\)", r"\(0, 1\)"),  # the report's case: one row seen six times
        (lambda x: x.flatten()[:36].as_strided((6, 11), (5, 1)), r"\(6, 11\)", r"\(5, 1\)"),  # rows 5 apart, 11 long
        (lambda x: x[:2].unsqueeze(1).expand(2, 3, 11), r"\(2, 3, 11\)", r"\(11, 0, 1\)"),
        (lambda x: x[0].expand(6, 11).t(), r"\(11, 6\)", r"\(1, 0\)"),
    ],
    ids=["expanded-rows", "rows-closer-than-their-length", "expanded-middle-dim", "expanded-transposed"],
)
def test_inplace_backward_refuses_logits_whose_memory_overlaps(make, shape, strides, device):
    """Six rows seen through one (stride 0) would get six gradients written into one row, the last one
    winning: the gradient was wrong by 0.66. Refused with the reason; out of place the same logits work."""
    produced = torch.randn(6, 11, device=device, requires_grad=True) * 1  # a layer's output, not a leaf
    logits = make(produced)
    target = torch.randint(0, logits.shape[-1], logits.shape[:-1], device=device)
    with pytest.raises(ValueError, match=INPLACE_OVERLAP.format(shape=shape, strides=strides)) as raised:
        tk.ops.cross_entropy(logits, target, inplace_backward=True)
    assert "logits.contiguous()" in str(raised.value)
    exact = logits.detach().double().requires_grad_()
    (ours,) = torch.autograd.grad(tk.ops.cross_entropy(logits, target), produced)
    (theirs,) = torch.autograd.grad(F.cross_entropy(exact.reshape(-1, exact.shape[-1]), target.reshape(-1)), exact)
    (expected,) = torch.autograd.grad(logits, produced, theirs.float())
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-6)


def test_inplace_backward_takes_rows_with_gaps(device):
    """Rows apart by more than their length (a slice of wider logits) share no memory: in place is right."""
    produced = torch.randn(5, 20, device=device, requires_grad=True) * 1
    logits = produced[:, 3:14]
    target = _targets(5, 11, device)
    exact = logits.detach().double().requires_grad_()  # before the backward overwrites the logits
    (ours,) = torch.autograd.grad(tk.ops.cross_entropy(logits, target, inplace_backward=True), produced)
    (theirs,) = torch.autograd.grad(F.cross_entropy(exact, target), exact)
    torch.testing.assert_close(ours[:, 3:14], theirs.float(), rtol=1e-5, atol=1e-6)
    assert torch.equal(ours[:, :3], torch.zeros_like(ours[:, :3])) and torch.equal(ours[:, 14:], ours[:, 14:] * 0)


INPLACE_LEAF = (
    r"cross_entropy: inplace_backward=True writes the gradient over logits, but logits is a leaf tensor or a view "
    r"of one \(a tensor created with requires_grad=True, which the caller may read again\)"
)


@pytest.mark.parametrize(
    "make",
    [lambda leaf: leaf, lambda leaf: leaf.view(2, 2, 11), lambda leaf: leaf[:, :]],
    ids=["leaf", "view", "slice"],
)
def test_inplace_backward_refuses_a_leaf(make, device):
    """A leaf's data would be overwritten by its own gradient. Refused, the leaf untouched; without grad (nothing is
    overwritten) and out of place it is fine."""
    leaf = torch.randn(4, 11, device=device, requires_grad=True)
    before = leaf.detach().clone()
    logits = make(leaf)
    target = torch.randint(0, 11, logits.shape[:-1], device=device)
    with pytest.raises(ValueError, match=INPLACE_LEAF):
        tk.ops.cross_entropy(logits, target, inplace_backward=True)
    assert torch.equal(leaf.detach(), before)
    with torch.no_grad():
        loss = tk.ops.cross_entropy(logits, target, inplace_backward=True)
    torch.testing.assert_close(loss, F.cross_entropy(before, target.reshape(-1)))
    tk.ops.cross_entropy(logits, target).backward()
    assert torch.equal(leaf.detach(), before)


def test_modules_match_the_ops(device):
    hidden = torch.randn(2, 5, 8, device=device)
    weight = torch.randn(13, 8, device=device)
    target = torch.randint(0, 13, (2, 5), device=device)
    options = {"ignore_index": 4, "label_smoothing": 0.05, "z_loss": 1e-3, "softcap": 10.0, "reduction": "none"}
    fused = tk.nn.FusedLinearCrossEntropyLoss(**options)(hidden, weight, target)
    assert fused.shape == (2, 5) and "z_loss=0.001" in repr(tk.nn.FusedLinearCrossEntropyLoss(**options))
    plain = tk.nn.CrossEntropyLoss(**options)(hidden @ weight.t(), target)
    torch.testing.assert_close(fused, plain, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(plain, _cross_entropy_reference(hidden @ weight.t(), target, **options))
    head = tk.nn.FusedLinearCrossEntropyLoss(accum_dtype=torch.bfloat16, **options)
    assert "accum_dtype=torch.bfloat16" in repr(head)
    h16, w16 = hidden.bfloat16().requires_grad_(), weight.bfloat16().requires_grad_()
    by_module = torch.autograd.grad(head(h16, w16, target).sum(), w16)
    by_op = torch.autograd.grad(tk.ops.fused_linear_cross_entropy(h16, w16, target, accum_dtype=torch.bfloat16,
                                                                  **options).sum(), w16)  # fmt: skip
    assert torch.equal(by_module[0], by_op[0])
    module = tk.nn.CrossEntropyLoss(inplace_backward=True, **options)
    assert "inplace_backward=True" in repr(module)
    logits = hidden.requires_grad_() @ weight.t()  # a layer's output (a leaf would be refused)
    (grad,) = torch.autograd.grad(module(logits, target).sum(), logits)
    assert grad.data_ptr() == logits.data_ptr()


def _broken(name, fn):
    return KernelSpec(**{**catalog.get(name).__dict__, "name": f"broken_{name}", "fn": fn})


def _without(option):
    """cross_entropy with ``option`` switched off whatever the case asks."""
    off = {option: None if option == "softcap" else 0.0}
    return lambda logits, target, **options: tk.ops.cross_entropy(logits, target, **{**options, **off})


@pytest.mark.parametrize(
    ("label", "fn", "case"),
    [
        ("label smoothing ignored", _without("label_smoothing"), {"tokens": 6, "vocab": 40, "label_smoothing": 0.1}),
        ("z-loss ignored", _without("z_loss"), {"tokens": 6, "vocab": 40, "z_loss": 1e-2}),
        ("softcap ignored", _without("softcap"), {"tokens": 6, "vocab": 40, "softcap": 5.0}),
        ("sum for mean", lambda x, t, **kw: tk.ops.cross_entropy(x, t, reduction="sum"),
         {"tokens": 6, "vocab": 40, "ignored": True}),
    ],
)  # fmt: skip
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_checker_catches_a_dropped_option(label, fn, case, dtype):
    result = testing.run_case(_broken("cross_entropy", fn), case, dtype, "cpu", grad_mode="random")
    assert not result.ok, label


def test_bad_input(device):
    logits = torch.randn(4, 7, device=device)
    target = torch.zeros(4, dtype=torch.int64, device=device)
    with pytest.raises(ValueError, match=r"cross_entropy: target must have shape \(4,\), got \(5,\)"):
        tk.ops.cross_entropy(logits, torch.zeros(5, dtype=torch.int64, device=device))
    with pytest.raises(TypeError, match=r"target must have dtype in \(int64, int32\), got torch.float32"):
        tk.ops.cross_entropy(logits, target.float())
    with pytest.raises(ValueError, match=r"reduction must be one of \('mean', 'sum', 'none'\), got 'avg'"):
        tk.ops.cross_entropy(logits, target, reduction="avg")
    with pytest.raises(ValueError, match=r"label_smoothing must be a number in \[0, 1\], got 1.5"):
        tk.ops.cross_entropy(logits, target, label_smoothing=1.5)
    with pytest.raises(ValueError, match=r"softcap must be None or a finite number > 0, got 0"):
        tk.ops.cross_entropy(logits, target, softcap=0)
    with pytest.raises(ValueError, match=r"z_loss must be a finite number >= 0, got -1"):
        tk.ops.cross_entropy(logits, target, z_loss=-1)
    with pytest.raises(TypeError, match=r"label_smoothing must be a number in \[0, 1\], got '0.1'"):
        tk.ops.cross_entropy(logits, target, label_smoothing="0.1")
    with pytest.raises(ValueError, match=r"vocab_parallel_cross_entropy: z_loss must be a finite number >= 0, got inf"):
        tk.ops.vocab_parallel_cross_entropy(logits, target, z_loss=float("inf"))
    with pytest.raises(TypeError, match=r"inplace_backward must be a bool, got int"):
        tk.ops.cross_entropy(logits, target, inplace_backward=1)
    head = torch.randn(7, 4, device=device, dtype=torch.bfloat16)
    hidden = torch.randn(4, 4, device=device, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match=r"fused_linear_cross_entropy: accum_dtype must be a torch.dtype, got str"):
        tk.ops.fused_linear_cross_entropy(hidden, head, target, accum_dtype="bfloat16")
    with pytest.raises(ValueError, match=r"accum_dtype must be torch.float32 or the weight's dtype torch.bfloat16, "
                                         r"got torch.float16"):  # fmt: skip
        tk.ops.fused_linear_cross_entropy(hidden, head, target, accum_dtype=torch.float16)
    with pytest.raises(ValueError, match=r"V >= 1 classes, got shape \(4, 0\)"):
        tk.ops.cross_entropy(torch.randn(4, 0, device=device), target)
    weight = torch.randn(7, 3, device=device)
    with pytest.raises(
        ValueError, match=r"hidden must be \(..., H\) with H = weight.shape\[1\] = 3, got shape \(4, 7\)"
    ):
        tk.ops.fused_linear_cross_entropy(logits, weight, target)
    with pytest.raises(TypeError, match=r"weight must have hidden's dtype torch.float32, got torch.float16"):
        tk.ops.fused_linear_cross_entropy(logits[:, :3], weight.half(), target)
    with pytest.raises(ValueError, match=r"bias must have shape \(7,\), got \(6,\)"):
        tk.ops.fused_linear_cross_entropy(logits[:, :3], weight, target, torch.zeros(6, device=device))


def test_empty_batch_gives_zero(device):
    logits = torch.randn(0, 7, device=device, requires_grad=True)
    target = torch.zeros(0, dtype=torch.int64, device=device)
    loss = tk.ops.cross_entropy(logits, target)
    loss.backward()
    assert loss.item() == 0 and logits.grad.shape == (0, 7)


@pytest.mark.parametrize("accum_dtype", [torch.float32, torch.bfloat16])
def test_fused_empty_batch_gives_zero_weight_grads(device, accum_dtype):
    """No tokens, so no chunk writes the d(weight) and d(bias) accumulators (the first chunk writes them, not adds):
    they must come back zero, not the unset memory they were allocated as."""
    hidden = torch.randn(0, 8, device=device, dtype=torch.bfloat16, requires_grad=True)
    weight = torch.randn(10, 8, device=device, dtype=torch.bfloat16, requires_grad=True)
    bias = torch.randn(10, device=device, dtype=torch.bfloat16, requires_grad=True)
    target = torch.zeros(0, dtype=torch.int64, device=device)
    loss = tk.ops.fused_linear_cross_entropy(hidden, weight, target, bias, reduction="sum", accum_dtype=accum_dtype)
    (loss * 2).backward()
    assert loss.item() == 0 and hidden.grad.shape == (0, 8)
    assert torch.equal(weight.grad, torch.zeros_like(weight)) and torch.equal(bias.grad, torch.zeros_like(bias))


# --------------------------------------------------------------------------------------------------
# GPU only: CUDA graphs, memory
# --------------------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_cuda_graph_capture():
    device = "cuda"
    target = _targets(300, 1000, device)

    def ce_step(logits):
        loss = tk.ops.cross_entropy(logits.requires_grad_(), target, z_loss=1e-4)
        return (loss, *torch.autograd.grad(loss, logits))

    def fused_step(hidden, weight):
        hidden.requires_grad_(), weight.requires_grad_()
        loss = tk.ops.fused_linear_cross_entropy(hidden, weight, target, label_smoothing=0.1)
        return (loss, *torch.autograd.grad(loss, (hidden, weight)))

    assert_graph_replay_matches_eager(ce_step, [torch.randn(300, 1000, device=device)])
    fused_inputs = [torch.randn(300, 64, device=device), torch.randn(1000, 64, device=device)]
    assert_graph_replay_matches_eager(fused_step, fused_inputs)


def _peak_extra_bytes(fn) -> int:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


@pytest.mark.gpu
@pytest.mark.parametrize("accum_dtype", [torch.float32, torch.bfloat16], ids=["fp32-dW", "bf16-dW"])
def test_fused_peak_memory_is_the_gradients_and_one_chunk_of_logits(accum_dtype):
    """Beyond the gradients (d(hidden) saved by the forward and its scaled copy, d(weight)'s accumulator in
    accum_dtype and the returned bf16 copy), the fused op's peak is its chunk of logits: 4096 of 8192 tokens with an
    fp32 accumulator, 2048 with a bf16 one (loss_chunks.fused_chunk_plan)."""
    tokens, hidden_size, vocab = 8192, 256, 65536
    hidden = torch.randn(tokens, hidden_size, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    weight = torch.randn(vocab, hidden_size, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    target = _targets(tokens, vocab, "cuda")
    chunk_rows = fused_chunk_plan(tokens, vocab, 2, accum_dtype.itemsize, tk_arch(hidden.device)).rows
    assert chunk_rows == (4096 if accum_dtype == torch.float32 else 2048)
    gradients = hidden.numel() * (2 + 2) + weight.numel() * (2 + accum_dtype.itemsize)

    def step():
        tk.ops.fused_linear_cross_entropy(hidden, weight, target, accum_dtype=accum_dtype).backward()

    step()
    hidden.grad = weight.grad = None
    assert _peak_extra_bytes(step) - gradients <= chunk_rows * vocab * 2 + 4 * 2**20
    # The backward alone makes at most the returned 16-bit gradients (scaled copies of fp32 sums; a bf16
    # accumulator's are scaled in place); a zero tensor per unused output (autograd's default) would add a whole dW.
    hidden.grad = weight.grad = None
    loss = tk.ops.fused_linear_cross_entropy(hidden, weight, target, accum_dtype=accum_dtype)
    returned = 2 * (hidden.numel() + weight.numel())
    assert _peak_extra_bytes(loss.backward) <= returned + 4 * 2**20


@pytest.mark.gpu
def test_fused_peak_memory_of_one_chunk_is_its_logits_and_the_gradients():
    """8192 tokens, H 4096 (a d(weight) fp32 accumulator and a chunk of 4096 tokens would peak at 3 times the
    weight's bytes and 4096 tokens' logits beside them): one chunk of every token (loss_chunks.whole_batch_fits), whose
    peak beyond d(hidden), d(weight) (both bf16, scaled in place) is its logits, and whose backward allocates
    nothing of their size."""
    tokens, hidden_size, vocab = 8192, 4096, 16384
    hidden = torch.randn(tokens, hidden_size, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    weight = torch.randn(vocab, hidden_size, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    target = _targets(tokens, vocab, "cuda")
    arch = tk_arch(hidden.device)
    assert fused_chunk_plan(tokens, vocab, 2, 4, arch, hidden_size=hidden_size, weight_bytes=2).rows == tokens

    def step():
        tk.ops.fused_linear_cross_entropy(hidden, weight, target).backward()

    step()
    assert weight.grad.dtype == torch.bfloat16
    hidden.grad = weight.grad = None
    gradients = 2 * (hidden.numel() + weight.numel())
    assert _peak_extra_bytes(step) - gradients <= tokens * vocab * 2 + 4 * 2**20
    hidden.grad = weight.grad = None
    loss = tk.ops.fused_linear_cross_entropy(hidden, weight, target)
    assert _peak_extra_bytes(loss.backward) <= 4 * 2**20


@pytest.mark.gpu
def test_cross_entropy_extra_memory_is_the_gradient():
    logits = torch.randn(4096, 32000, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    target = _targets(4096, 32000, "cuda")

    def step():
        tk.ops.cross_entropy(logits, target).backward()

    step()
    logits.grad = None
    grad_bytes = logits.numel() * 2
    assert _peak_extra_bytes(step) <= grad_bytes + 4 * 2**20  # plus per-row fp32 lse and loss


@pytest.mark.gpu
def test_cross_entropy_inplace_backward_allocates_nothing_of_the_logits_size():
    """As in training: logits from an LM head, the loss's backward then the head's. With the flag the
    backward's peak is the head's d(hidden) (2 MiB here); without it, plus the 250 MiB logits' gradient.
    (A leaf's .grad would be a clone: AccumulateGrad copies a gradient that aliases its variable.)"""
    hidden = torch.randn(4096, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    weight = torch.randn(32000, 256, device="cuda", dtype=torch.bfloat16)
    target = _targets(4096, 32000, "cuda")
    logits_bytes, hidden_bytes = 4096 * 32000 * 2, hidden.numel() * 2
    peaks = {}
    for inplace in (True, False, True):
        loss = tk.ops.cross_entropy(hidden @ weight.t(), target, inplace_backward=inplace)
        hidden.grad = None
        peaks[inplace] = _peak_extra_bytes(loss.backward)
    assert peaks[True] <= hidden_bytes + 4 * 2**20
    assert peaks[False] >= logits_bytes


def test_fused_backward_gets_none_for_its_unused_outputs(monkeypatch):
    """The forward returns its gradients as outputs (for the custom op to save); autograd must not
    build a zero tensor for each of them when the backward runs (a 2.1 GB fp32 dW at Llama 3's size)."""
    function = fused_linear_cross_entropy_op.function  # the eager autograd.Function
    received = []
    backward = function.backward

    def spy(ctx, grad_loss, *unused):
        received.extend(unused)
        return backward(ctx, grad_loss, *unused)

    monkeypatch.setattr(function, "backward", staticmethod(spy))
    hidden = torch.randn(6, 8, requires_grad=True)
    weight = torch.randn(20, 8, requires_grad=True)
    tk.ops.fused_linear_cross_entropy(hidden, weight, _targets(6, 20, "cpu")).backward()
    assert received and all(g is None for g in received)
    assert hidden.grad is not None and weight.grad is not None
