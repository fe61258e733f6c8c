"""Class weights, the z-term returned on its own and the token accuracy of tk.ops.cross_entropy and
fused_linear_cross_entropy, beyond the registry sweep (and test_cross_entropy's check against torch's weighted
cross-entropy itself): Liger-Kernel's return conventions, ties, compile, the in-place backward, bad input."""

import pytest
import torch

import tritonkit as tk
from helpers import assert_compiled_matches_eager
from tritonkit.ops.loss import op as loss_op_module
from tritonkit.ops.loss.op import CrossEntropyOutput

REDUCTIONS = ["mean", "sum", "none"]


def _targets(n, vocab, device, ignore_index=-100):
    target = torch.randint(0, vocab, (n,), device=device)
    target[::3] = ignore_index
    return target


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_fused_with_class_weights_equals_cross_entropy_of_the_logits(reduction, device):
    """Across chunks (25 tokens: chunks of 2 and a remainder), with the z-term and accuracy: the fused op's loss,
    z-term, accuracy and gradients are cross_entropy's on the logits."""
    hidden = torch.randn(25, 16, device=device, requires_grad=True)
    head = (torch.randn(33, 16, device=device) / 4).requires_grad_()
    weight, target = 0.5 + torch.rand(33, device=device), _targets(25, 33, device)
    options = dict(label_smoothing=0.1, z_loss=1e-2, reduction=reduction, return_z_loss=True,
                   return_token_accuracy=True)  # fmt: skip
    fused = tk.ops.fused_linear_cross_entropy(hidden, head, target, ce_weight=weight, **options)
    plain = tk.ops.cross_entropy(hidden @ head.t(), target, weight, **options)
    for ours, theirs in zip(fused, plain, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    upstream = torch.randn_like(fused.loss)
    grads = torch.autograd.grad(fused.loss, (hidden, head), upstream)
    expected = torch.autograd.grad(plain.loss, (hidden, head), upstream)
    for ours, theirs in zip(grads, expected, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
def test_z_loss_returned_as_liger_returns_it(reduction, weighted, device):
    """The z-term z * lse^2 reduced like the loss, a mean over the non-ignored targets even with class weights (as
    Liger-Kernel's); the loss is the one without the flag, and the z-term carries no gradient."""
    logits = 3 * torch.randn(9, 30, device=device)
    target = _targets(9, 30, device)
    weight = 0.5 + torch.rand(30, device=device) if weighted else None
    out = tk.ops.cross_entropy(logits, target, weight, z_loss=1e-2, reduction=reduction, return_z_loss=True)
    assert isinstance(out, CrossEntropyOutput) and out.token_accuracy is None
    valid = target != -100
    z_rows = torch.where(valid, 1e-2 * torch.logsumexp(logits.double(), -1) ** 2, 0.0)
    expected = {"none": z_rows, "sum": z_rows.sum(), "mean": z_rows.sum() / valid.sum()}[reduction]
    torch.testing.assert_close(out.z_loss.double(), expected, rtol=1e-5, atol=1e-7)
    plain = tk.ops.cross_entropy(logits, target, weight, z_loss=1e-2, reduction=reduction)
    torch.testing.assert_close(out.loss, plain, rtol=1e-6, atol=1e-7)
    with_grad = tk.ops.cross_entropy(logits.requires_grad_(), target, weight, z_loss=1e-2, return_z_loss=True)
    assert with_grad.loss.requires_grad and not with_grad.z_loss.requires_grad


@pytest.mark.parametrize("fused", [False, True], ids=["cross_entropy", "fused"])
def test_token_accuracy_is_the_fraction_of_argmax_hits(fused, device):
    """The fraction of non-ignored targets that are their row's argmax (for "sum" too, as Liger-Kernel's), per
    token (0.0 where ignored) for "none"; the first of tied largest logits counts, as torch.argmax, across the
    kernel's 4096-column steps; all ignored gives 0."""
    vocab = 5000
    logits = torch.randn(6, vocab, device=device)
    logits[:, 4500] = 9.0  # a tie across steps: the first (column 100) wins
    logits[:, 100] = 9.0
    target = torch.tensor([100, 4500, -100, 100, 7, -100], device=device)
    expected_rows = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0], device=device)

    def accuracy(target, reduction):
        if not fused:
            return tk.ops.cross_entropy(logits, target, reduction=reduction, return_token_accuracy=True).token_accuracy
        eye = torch.eye(vocab, device=device)  # logits = hidden @ eye.T: the same logits through the fused op
        return tk.ops.fused_linear_cross_entropy(logits, eye, target, reduction=reduction,
                                                 return_token_accuracy=True).token_accuracy  # fmt: skip

    assert torch.equal(accuracy(target, "none"), expected_rows)
    for reduction in ("mean", "sum"):
        assert accuracy(target, reduction).item() == 0.5
    assert accuracy(torch.full_like(target, -100), "mean").item() == 0.0


def test_returns_the_loss_alone_without_the_flags(device):
    logits, target = torch.randn(4, 10, device=device), torch.randint(0, 10, (4,), device=device)
    assert isinstance(tk.ops.cross_entropy(logits, target, torch.ones(10, device=device)), torch.Tensor)
    both = tk.ops.cross_entropy(logits, target, return_z_loss=True, return_token_accuracy=True)
    assert both.loss.dtype == both.z_loss.dtype == logits.dtype and both.token_accuracy.dtype == torch.float32
    loss, z_loss, token_accuracy = both  # a NamedTuple: unpacks as Liger-Kernel's output's fields
    assert torch.equal(loss, tk.ops.cross_entropy(logits, target))
    assert z_loss is both.z_loss and token_accuracy is both.token_accuracy


def test_plain_calls_take_the_plain_ops(monkeypatch):
    """A call without the options never reaches their ops (so its path and kernel are as before)."""

    def refuse(*args):
        raise AssertionError("an options' op was called")

    for name in ("cross_entropy_options_op", "fused_linear_cross_entropy_options_op"):
        monkeypatch.setattr(loss_op_module, name, refuse)
    logits, target = torch.randn(4, 10), torch.randint(0, 10, (4,))
    tk.ops.cross_entropy(logits, target, z_loss=1e-3, label_smoothing=0.1)
    tk.ops.fused_linear_cross_entropy(torch.randn(4, 8), torch.randn(10, 8), target)
    with pytest.raises(AssertionError, match="options' op"):
        tk.ops.cross_entropy(logits, target, return_z_loss=True)


def test_inplace_backward_with_class_weights(device):
    """The in-place backward with weights writes the out-of-place backward's gradient over the logits."""
    hidden = torch.randn(6, 8, device=device, requires_grad=True)
    head = torch.randn(12, 8, device=device, requires_grad=True)
    weight, target = 0.5 + torch.rand(12, device=device), _targets(6, 12, device)
    grads = []
    for inplace in (False, True):
        loss = tk.ops.cross_entropy(hidden @ head.t(), target, weight, label_smoothing=0.1, inplace_backward=inplace,
                                    return_z_loss=True).loss  # fmt: skip
        grads.append(torch.autograd.grad(loss, (hidden, head)))
    for ours, theirs in zip(*grads, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("fused", [False, True], ids=["cross_entropy", "fused"])
def test_compiles_fullgraph_with_the_options(fused, device):
    weight = 0.5 + torch.rand(20, device=device)
    target = _targets(6, 20, device)

    def block(hidden, head):
        options = dict(label_smoothing=0.1, z_loss=1e-3, return_z_loss=True, return_token_accuracy=True)
        if fused:
            out = tk.ops.fused_linear_cross_entropy(hidden, head, target, ce_weight=weight, **options)
        else:
            out = tk.ops.cross_entropy(hidden @ head.t(), target, weight, **options)
        return out.loss + out.z_loss.detach() * 0 + out.token_accuracy * 0

    inputs = [torch.randn(6, 8, device=device), torch.randn(20, 8, device=device)]
    assert_compiled_matches_eager(block, [t.requires_grad_() for t in inputs], device)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"weight": torch.ones(9)}, ValueError, r"cross_entropy: weight must hold one weight a class, shape \(10,\)"),
        ({"weight": torch.ones(10, dtype=torch.int64)}, TypeError, "weight must have dtype"),
        ({"weight": torch.ones(2, 5)}, ValueError, "weight must have 1 dimensions"),
        ({"weight": torch.ones(10, requires_grad=True)}, ValueError, "weight requires grad"),
        ({"return_z_loss": 1}, TypeError, "cross_entropy: return_z_loss must be a bool"),
        ({"return_token_accuracy": "yes"}, TypeError, "cross_entropy: return_token_accuracy must be a bool"),
    ],
    ids=lambda value: value if isinstance(value, str) else None,
)
def test_bad_input(kwargs, error, match):
    with pytest.raises(error, match=match):
        tk.ops.cross_entropy(torch.randn(4, 10), torch.randint(0, 10, (4,)), **kwargs)


def test_bad_class_weights_of_the_fused_op_name_ce_weight():
    hidden, head, target = torch.randn(4, 8), torch.randn(10, 8), torch.randint(0, 10, (4,))
    with pytest.raises(ValueError, match=r"fused_linear_cross_entropy: ce_weight must hold one weight a class"):
        tk.ops.fused_linear_cross_entropy(hidden, head, target, ce_weight=torch.ones(11))
    with pytest.raises(TypeError, match="fused_linear_cross_entropy: return_z_loss must be a bool"):
        tk.ops.fused_linear_cross_entropy(hidden, head, target, return_z_loss=None)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_cross_entropy_module_with_class_weights_is_torchs(reduction, device):
    """tk.nn.CrossEntropyLoss(weight) as torch.nn.CrossEntropyLoss(weight) (the weight positional, a buffer): the
    loss and the logits' gradient against torch's module in float64."""
    logits = (3 * torch.randn(9, 20, device=device)).requires_grad_()
    target, weight = _targets(9, 20, device), 0.5 + torch.rand(20, device=device)
    module = tk.nn.CrossEntropyLoss(weight, label_smoothing=0.1, reduction=reduction)
    torch_module = torch.nn.CrossEntropyLoss(weight.double(), label_smoothing=0.1, reduction=reduction)
    loss, expected = module(logits, target), torch_module(logits.double(), target)
    torch.testing.assert_close(loss.double(), expected, rtol=1e-5, atol=1e-6)
    upstream = torch.randn_like(loss)
    (grad,) = torch.autograd.grad(loss, logits, upstream)
    (expected_grad,) = torch.autograd.grad(expected, logits, upstream.double())
    torch.testing.assert_close(grad, expected_grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("fused", [False, True], ids=["cross_entropy", "fused"])
def test_modules_take_the_ops_options(fused, device):
    """The modules hold class weights (``weight``, the fused one's ``ce_weight``) as a buffer that follows .to() and
    the state dict, and pass every option: their results are the ops' to the bit, a CrossEntropyOutput with the
    return flags, the loss and z-term in fp32 for bf16 inputs with loss_dtype."""
    hidden = torch.randn(9, 8, device=device).bfloat16()
    head = (torch.randn(20, 8, device=device) / 4).bfloat16()
    target, weight = _targets(9, 20, device), 0.5 + torch.rand(20, device=device)
    options = dict(ignore_index=-100, label_smoothing=0.1, z_loss=1e-3, softcap=8.0, reduction="sum",
                   loss_dtype=torch.float32, return_z_loss=True, return_token_accuracy=True)  # fmt: skip
    if fused:
        module, name = tk.nn.FusedLinearCrossEntropyLoss(ce_weight=weight, **options), "ce_weight"
        out = module(hidden, head, target)
        expected = tk.ops.fused_linear_cross_entropy(hidden, head, target, ce_weight=weight, **options)
    else:
        module, name = tk.nn.CrossEntropyLoss(weight=weight, **options), "weight"
        logits = hidden @ head.t()
        out = module(logits, target)
        expected = tk.ops.cross_entropy(logits, target, weight, **options)
    assert isinstance(out, CrossEntropyOutput) and (out.loss.dtype, out.z_loss.dtype) == (torch.float32,) * 2
    for ours, theirs in zip(out, expected, strict=True):
        assert torch.equal(ours, theirs)
    assert [key for key, _ in module.named_buffers()] == [name] and module.get_buffer(name) is weight
    assert torch.equal(module.state_dict()[name], weight)
    assert module.to(torch.float64).get_buffer(name).dtype == torch.float64
    assert f"{name}=(20,)" in repr(module) and "loss_dtype=torch.float32" in repr(module)
    plain = type(module)()
    assert list(plain.named_buffers()) == [] and plain.state_dict() == {}


def test_module_with_class_weights_compiles_fullgraph(device):
    """The weight buffer and the return flags under torch.compile(fullgraph=True): eager's loss and gradients."""
    module = tk.nn.CrossEntropyLoss(0.5 + torch.rand(20, device=device), z_loss=1e-3, return_z_loss=True)
    target = _targets(6, 20, device)

    def block(hidden, head):
        out = module(hidden @ head.t(), target)
        return out.loss + out.z_loss.detach() * 0

    inputs = [torch.randn(6, 8, device=device), torch.randn(20, 8, device=device)]
    assert_compiled_matches_eager(block, [t.requires_grad_() for t in inputs], device)
