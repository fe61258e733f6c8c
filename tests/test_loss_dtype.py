"""loss_dtype: the cross-entropies' loss returned in fp32 for bf16 inputs, the unrounded fp32 reduction of the fp32
per-token losses (what transformers, which upcasts the logits, and Liger-Kernel report), eager and under
torch.compile(fullgraph=True); the gradients are the default's. The vocabulary-parallel ops run as a group of one."""

import pytest
import torch
import torch.nn.functional as F

import tritonkit as tk

REDUCTIONS = ["mean", "sum", "none"]
OPS = {
    "cross_entropy": tk.ops.cross_entropy,
    "fused": tk.ops.fused_linear_cross_entropy,
    "vocab_parallel": tk.ops.vocab_parallel_cross_entropy,
    "vocab_parallel_fused": tk.ops.vocab_parallel_fused_linear_cross_entropy,
}
# fp32 per-token losses of a few ulps each, summed over 24 tokens: a relative error near 1e-6. The bf16 value is off
# by up to half a bf16 ulp, 2**-9 relative (0.01 at a loss of 5).
FP32_TOLERANCE = {"rtol": 1e-5, "atol": 1e-6}


def _inputs(op: str, generator: torch.Generator, device: str):
    """bf16 inputs (logits, or hidden and head) and the targets, and the float64 logits they stand for. The fused
    ops' logits are exact in bf16: hidden in {-1, 0, 1} and the head in quarters over H = 8 make sums of 8 quarters,
    which the bf16 GEMM neither rounds nor loses, so the float64 reference sees the logits the kernel sees."""
    tokens, hidden, vocab = 24, 8, 40
    target = torch.randint(0, vocab, (tokens,), generator=generator)
    target[::5] = -100
    if op in ("cross_entropy", "vocab_parallel"):
        logits = (3 * torch.randn(tokens, vocab, generator=generator)).bfloat16()
        return [logits.to(device)], target.to(device), logits.double()
    h = torch.randint(-1, 2, (tokens, hidden), generator=generator).bfloat16()
    w = (torch.randint(-4, 5, (vocab, hidden), generator=generator) / 4).bfloat16()
    return [h.to(device), w.to(device)], target.to(device), h.double() @ w.double().t()


def _fresh() -> torch.Generator:
    generator = torch.Generator()
    generator.seed()
    return generator


def _loss(op: str, tensors, target, **options):
    return OPS[op](*tensors, target, **options)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("op", OPS)
def test_fp32_loss_of_bf16_inputs_is_the_float64_loss_to_fp32_precision(op, reduction, device):
    """A fixed draw: a random mean or sum lies within the tolerance of a bf16 value in about 0.5% of draws, where
    the check that the bf16-rounded value fails it could not tell the two apart (per-token losses always can)."""
    tensors, target, logits64 = _inputs(op, torch.Generator().manual_seed(0), device)
    loss = _loss(op, tensors, target, reduction=reduction, loss_dtype=torch.float32)
    assert loss.dtype == torch.float32
    expected = F.cross_entropy(logits64, target.cpu(), reduction=reduction)
    torch.testing.assert_close(loss.cpu().double(), expected, **FP32_TOLERANCE)
    assert not torch.allclose(expected.bfloat16().double(), expected, **FP32_TOLERANCE)
    default = _loss(op, tensors, target, reduction=reduction)
    assert default.dtype == torch.bfloat16 and torch.equal(default, loss.bfloat16())  # the same value, rounded once


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("op", OPS)
def test_gradients_are_the_defaults(op, reduction, device):
    """The same upstream values in fp32 (the fp32 loss's) and in bf16 give the same gradients, to the bit."""
    tensors, target, _ = _inputs(op, _fresh(), device)
    tensors = [t.requires_grad_() for t in tensors]
    upstream = torch.randn((target.shape[0],) if reduction == "none" else (), device=device).bfloat16()
    grads = []
    for loss_dtype, grad in ((None, upstream), (torch.float32, upstream.float())):
        loss = _loss(op, tensors, target, reduction=reduction, loss_dtype=loss_dtype)
        assert loss.dtype == grad.dtype
        grads.append(torch.autograd.grad(loss, tensors, grad))
    for default, fp32 in zip(*grads, strict=True):
        assert default.dtype == torch.bfloat16 and torch.equal(default, fp32)


@pytest.mark.parametrize("reduction", ["mean", "none"])
@pytest.mark.parametrize("op", ["cross_entropy", "fused"])
def test_fp32_loss_under_torch_compile(op, reduction, device):
    """torch.compile(fullgraph=True) traces the op with its fp32 loss (the fakes' dtype): the value to fp32
    precision, the gradients eager's."""
    tensors, target, logits64 = _inputs(op, torch.Generator().manual_seed(0), device)
    tensors = [t.requires_grad_() for t in tensors]

    def block(*tensors):
        return _loss(op, tensors, target, reduction=reduction, loss_dtype=torch.float32)

    eager = block(*tensors)
    upstream = torch.randn_like(eager)
    eager_grads = torch.autograd.grad(eager, tensors, upstream)
    torch._dynamo.reset()
    compiled = torch.compile(block, fullgraph=True, backend="inductor" if device == "cuda" else "aot_eager")
    loss = compiled(*tensors)
    assert loss.dtype == torch.float32
    expected = F.cross_entropy(logits64, target.cpu(), reduction=reduction)
    torch.testing.assert_close(loss.detach().cpu().double(), expected, **FP32_TOLERANCE)
    for ours, theirs in zip(torch.autograd.grad(loss, tensors, upstream), eager_grads, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("fused", [False, True], ids=["cross_entropy", "fused"])
def test_options_return_the_z_term_in_the_loss_dtype(fused, reduction, device):
    """With class weights, the z-term returned and the accuracy: loss and z-term fp32 and to fp32 precision of the
    float64 values (a weighted mean; the z-term a mean over the targets), the accuracy fp32 as always."""
    op = "fused" if fused else "cross_entropy"
    tensors, target, logits64 = _inputs(op, _fresh(), device)
    weight = (0.5 + torch.rand(40)).bfloat16()
    z = 1e-2
    out = _loss(op, tensors, target, reduction=reduction, loss_dtype=torch.float32, z_loss=z, return_z_loss=True,
                return_token_accuracy=True, **{"ce_weight" if fused else "weight": weight.to(device)})  # fmt: skip
    assert (out.loss.dtype, out.z_loss.dtype, out.token_accuracy.dtype) == (torch.float32,) * 3
    valid = target.cpu() != -100
    z_rows = torch.where(valid, z * torch.logsumexp(logits64, -1) ** 2, 0.0)
    z_term = {"none": z_rows, "sum": z_rows.sum(), "mean": z_rows.sum() / valid.sum()}[reduction]
    loss = F.cross_entropy(logits64, target.cpu(), weight.double(), reduction=reduction) + z_term
    torch.testing.assert_close(out.loss.cpu().double(), loss, **FP32_TOLERANCE)
    torch.testing.assert_close(out.z_loss.cpu().double(), z_term, **FP32_TOLERANCE)


@pytest.mark.parametrize(
    ("loss_dtype", "error", "match"),
    [
        (torch.float64, ValueError, r"loss_dtype must be None \(the input's dtype\) or one of .*got torch.float64"),
        (torch.int32, ValueError, "loss_dtype must be None"),
        ("float32", TypeError, "cross_entropy: loss_dtype must be None or a torch.dtype, got str"),
    ],
    ids=["float64", "int32", "string"],
)
def test_bad_loss_dtype(loss_dtype, error, match):
    with pytest.raises(error, match=match):
        tk.ops.cross_entropy(torch.randn(4, 10), torch.randint(0, 10, (4,)), loss_dtype=loss_dtype)
