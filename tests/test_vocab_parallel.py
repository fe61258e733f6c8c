"""The vocabulary-parallel fused loss's chunks in one process (a group of one; two ranks: test_distributed.py): the
single-GPU fused op's chunk rule on the head's slice, planned alike on every rank, one chunk of every token writing
d(weight) in the weight's dtype, plan= forcing the chunks, and compiled calls agreeing with eager ones."""

import pytest
import torch

import tritonkit as tk
from helpers import assert_compiled_matches_eager, assert_one_chunk_sums_round_once
from tritonkit._core import loss_chunks
from tritonkit._core.loss_chunks import FusedChunkPlan, fused_chunk_plan
from tritonkit.ops.vocab_parallel import launch as vp_launch
from tritonkit.ops.vocab_parallel.launch import fused_plan, vocab_parallel_fused_linear_cross_entropy_fwd


@pytest.mark.parametrize("arch", ["sm90", "sm100"])
def test_a_slice_of_a_head_takes_the_single_gpu_chunk_rule(arch):
    """Half of a 128256 x 4096 bf16 head per rank (two ranks), an fp32 accumulator: every token in one chunk up to
    8192 tokens (their logits no more than the accumulator and a chunk), 4096-row chunks beyond; the rule that
    replaced a tenth of the tokens a chunk (384 rows at 4096 tokens)."""
    head = {"hidden_size": 4096, "weight_bytes": 2}
    assert fused_chunk_plan(4096, 64128, 2, 4, arch, **head).rows == 4096
    assert fused_chunk_plan(8192, 64128, 2, 4, arch, **head).rows == 8192
    assert fused_chunk_plan(16384, 64128, 2, 4, arch, **head).rows == 4096


def test_every_rank_plans_its_chunks_for_the_largest_slice(monkeypatch):
    """40 classes over 3 ranks, DTensor's uneven split: slices of 14, 14 and 12 rows. Each rank asks the rule for
    ceil(40 / 3) = 14 classes, so that their chunks, and the chunks' all-reduces, pair up."""
    asked = []

    def recording(n_tokens, n_vocab, *args, **kwargs):
        asked.append(n_vocab)
        return fused_chunk_plan(n_tokens, n_vocab, *args, **kwargs)

    monkeypatch.setattr(vp_launch, "group_size", lambda group: 3)
    monkeypatch.setattr(loss_chunks, "fused_chunk_plan", recording)
    hidden = torch.randn(50, 8)
    plans = {fused_plan(hidden, torch.randn(rows, 8), 40, "tp", True) for rows in (14, 14, 12)}
    assert asked == [14] * 3 and plans == {(FusedChunkPlan(rows=5), torch.float32)}


def _inputs(tokens, vocab, device):
    hidden = torch.randn(tokens, 16, device=device).bfloat16()
    weight = (torch.randn(vocab, 16, device=device) / 2).bfloat16()
    bias = torch.randn(vocab, device=device).bfloat16()
    target = torch.randint(0, vocab, (tokens,), device=device)
    target[::3] = -100
    return hidden, weight, bias, target


def _sum_grads(hidden, weight, bias, target, plan):
    """The forward launcher's d(hidden), d(weight), d(bias) for reduction "sum", in a group of one."""
    options = (0, weight.shape[0], "", -100, 0.0, 0.0, 0.0, "sum", hidden.dtype, True, True, True)
    _, _, *grads = vocab_parallel_fused_linear_cross_entropy_fwd(hidden, weight, target, bias, *options, plan=plan)
    return grads


def test_one_chunk_of_every_token_writes_d_weight_in_the_weights_dtype(device, monkeypatch):
    """plan= forces the chunks (40 tokens: 5 chunks of 7 and one of 5, or one of 40). In one chunk d(weight) and
    d(bias) come from one GEMM (and one sum) in the weight's bf16, rounded once (assert_one_chunk_sums_round_once);
    in several, summed in fp32."""
    tokens = 40
    hidden, weight, bias, target = _inputs(tokens, 29, device)
    chunks = []
    logits_gemm = vp_launch.chunk_logits
    monkeypatch.setattr(vp_launch, "chunk_logits", lambda h, *args: chunks.append(h.shape[0]) or logits_gemm(h, *args))
    _, *whole = _sum_grads(hidden, weight, bias, target, FusedChunkPlan(rows=tokens))
    assert chunks == [tokens]
    _, *chunked = _sum_grads(hidden, weight, bias, target, FusedChunkPlan(rows=7))
    assert chunks[1:] == [7] * 5 + [5]
    assert_one_chunk_sums_round_once(hidden, weight, bias, target, whole, chunked)


@pytest.mark.parametrize("reduction", ["mean", "none"])
@pytest.mark.parametrize("tokens", [1, 24], ids=["one-chunk", "chunks"])
def test_compiled_calls_give_eager_gradients_in_the_parameters_dtype(tokens, reduction, device):
    """torch.compile(fullgraph=True) traces the fakes, which take the launchers' rule: one token is one chunk (its
    d(weight) summed in bf16), 24 tokens are chunks on the CPU (fp32 sums); either way the gradients come back in
    bf16, the compiled ones equal to eager's."""
    hidden, weight, bias, target = _inputs(tokens, 29, device)
    inputs = [t.requires_grad_() for t in (hidden, weight, bias)]

    def block(hidden, weight, bias):
        loss = tk.ops.vocab_parallel_fused_linear_cross_entropy(hidden, weight, target, bias, reduction=reduction)
        return loss.float().sum()

    grads = torch.autograd.grad(block(*inputs), inputs)
    assert [g.dtype for g in grads] == [torch.bfloat16] * 3
    assert_compiled_matches_eager(block, inputs, device, grad_atol=0)


def _real_and_fake(custom_op, tensors, flags) -> list:
    """The custom op's outputs on ``tensors`` paired with its fake's on fake copies of them."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    real = custom_op(*tensors, *flags)
    with FakeTensorMode() as mode:
        fake = custom_op(*(mode.from_tensor(t) for t in tensors), *flags)
    return list(zip(real, fake, strict=True))


@pytest.mark.parametrize("reduction", ["sum", "none"])
@pytest.mark.parametrize("tokens", [1, 24], ids=["one-chunk", "chunks"])
def test_custom_ops_outputs_match_their_fakes(tokens, reduction):
    """The fakes promise what the launchers return, d(weight) and d(bias) in bf16 for one chunk and fp32 for
    several (the forward's for "sum", the recomputing backward's for "none"): torch.compile plans the gradients'
    casts on the fakes' dtypes."""
    from tritonkit.ops.vocab_parallel.op import vocab_parallel_fused_linear_cross_entropy_op as op

    hidden, weight, bias, target = _inputs(tokens, 29, "cpu")
    options, needs = (0, 29, "", -100, 0.0, 0.0, 0.0), (True, True, True)
    pairs = _real_and_fake(op.forward_op, (hidden, weight, target, bias), (*options, reduction, torch.float32, *needs))
    sums = [real for real, _ in pairs[3:]]
    if reduction == "none":
        upstream = torch.randn(tokens).bfloat16()
        backward = _real_and_fake(op.backward_op, (upstream, hidden, weight, target, bias, pairs[1][0]),
                                  (*options, *needs))  # fmt: skip
        pairs, sums = pairs + backward, [real for real, _ in backward[1:]]
    assert [g.dtype for g in sums] == [torch.bfloat16 if tokens == 1 else torch.float32] * 2
    for real, fake in pairs:
        assert (real.shape, real.dtype) == (fake.shape, fake.dtype)
