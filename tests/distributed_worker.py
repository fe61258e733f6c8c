"""One rank of the two-rank checks in test_distributed.py: FSDP2 training with and without the Hugging Face patch,
and tritonkit's ops on DTensor inputs. Run as a script, one process per rank:

    python tests/distributed_worker.py --rank R --world 2 --store FILE --out DIR [--backend gloo|nccl]

gloo runs on the CPU under the Triton interpreter; nccl on GPU ``R``, compiled. Each rank writes what it measured
to ``DIR/rank<R>.pt``: for each check, the pair (got, expected) of tensors the test compares, or the message an op
raised where it must refuse. The comparisons and their tolerances are the test's.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import os
import sys
import time
from pathlib import Path


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--store", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    return parser.parse_args()


STARTED = time.perf_counter()
ARGS = parse_args()
if ARGS.backend == "gloo":
    os.environ["TRITON_INTERPRET"] = "1"  # before tritonkit defines a kernel
else:
    os.environ.pop("TRITON_INTERPRET", None)
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast stays off on the lent machines
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import transformers  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor  # noqa: E402

import tritonkit as tk  # noqa: E402
from tritonkit.integrations import transformers as tk_hf  # noqa: E402
from tritonkit.testing import poisoned_allocations  # noqa: E402

DEVICE = "cpu" if ARGS.backend == "gloo" else f"cuda:{ARGS.rank}"
RESULTS: dict = {}


def record(name: str, got, expected) -> None:
    RESULTS[name] = (got.detach().cpu().double(), expected.detach().cpu().double())


def refused(name: str, call) -> None:
    """The message ``call`` raises (TypeError or ValueError), or a note that it raised nothing."""
    try:
        call()
    except (TypeError, ValueError) as error:
        RESULTS[name] = f"{type(error).__name__}: {error}"
    else:
        RESULTS[name] = "raised nothing"


def full(t):
    return t.full_tensor() if isinstance(t, DTensor) else t


def randn(*shape, generator, scale=1.0):
    return (scale * torch.randn(*shape, generator=generator)).to(DEVICE)


# --------------------------------------------------------------------------------------------------
# FSDP2: the patched model trains as the unpatched one
# --------------------------------------------------------------------------------------------------
VOCAB, STEPS = 64, 2


def tiny_llama():
    torch.manual_seed(0)  # the same weights on every rank, as from a checkpoint
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=64, tie_word_embeddings=False,
        attn_implementation="sdpa", bos_token_id=None, eos_token_id=None,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config).to(DEVICE)


def sharded(model, mesh, head_alone: bool):
    """fully_shard per decoder layer, the LM head alone or inside the root unit, then the root."""
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    if head_alone:
        fully_shard(model.lm_head, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def train(model, batches) -> tuple[list, list]:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses, grads = [], []
    for ids, labels in batches:
        loss = model(ids, labels=labels).loss
        loss.backward()
        losses.append(loss.detach())
        grads.append({key: full(p.grad).clone() for key, p in model.named_parameters()})
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return losses, grads


def check_fsdp(mesh) -> None:
    generator = torch.Generator().manual_seed(100 + ARGS.rank)  # each rank its own data, as data parallelism has
    batches = []
    for _ in range(STEPS):
        ids = torch.randint(0, VOCAB, (2, 5), generator=generator).to(DEVICE)
        labels = ids.clone()
        labels[0, :2] = -100
        batches.append((ids, labels))
    base = tiny_llama()
    reference = sharded(copy.deepcopy(base), mesh, head_alone=False)
    expected_losses, expected_grads = train(reference, batches)
    for head_alone in (False, True):
        patched = copy.deepcopy(base)
        # Every switch but the attention kernel, which nothing distributed touches and which is the slowest under
        # the interpreter (test_transformers_integration checks it).
        counts = tk_hf.apply(patched, attention=False)
        assert counts["fused_linear_cross_entropy"] == 1 and counts["rms_norm"] == 3, counts
        patched = sharded(patched, mesh, head_alone=head_alone)
        losses, grads = train(patched, batches)
        where = "head alone" if head_alone else "head in root"
        # The loss was fused: a head sharded alone runs it as a forward method FSDP registered.
        RESULTS[f"fsdp {where} fused through the head"] = "_tritonkit_fused_loss" in patched.lm_head.__dict__
        for step in range(STEPS):
            record(f"fsdp {where} loss step {step}", losses[step], expected_losses[step])
            for key, grad in grads[step].items():
                record(f"fsdp {where} grad step {step} {key}", grad, expected_grads[step][key])


# --------------------------------------------------------------------------------------------------
# Norms and RoPE on sharded activations: the results of the whole tensors
# --------------------------------------------------------------------------------------------------
def leaf(t):
    return t.detach().clone().requires_grad_()


def check_norms(mesh, generator) -> None:
    x, residual = randn(2, 6, 16, generator=generator), randn(2, 6, 16, generator=generator)
    weight, bias = randn(16, generator=generator), randn(16, generator=generator)
    upstream = randn(2, 6, 16, generator=generator), randn(2, 6, 16, generator=generator)
    ref = [leaf(t) for t in (x, residual, weight)]
    y, h = tk.ops.rms_norm(ref[0], ref[2], residual=ref[1], prenorm=True)
    torch.autograd.backward((y, h), upstream)
    for split in (Shard(0), Shard(1), Replicate()):  # batch, sequence, none
        got = [leaf(distribute_tensor(t, mesh, [split])) for t in (x, residual)]
        w = leaf(distribute_tensor(weight, mesh, [Replicate()]))
        y_d, h_d = tk.ops.rms_norm(got[0], w, residual=got[1], prenorm=True)
        assert y_d.placements == (split,) and h_d.placements == (split,), (y_d.placements, h_d.placements)
        torch.autograd.backward((y_d, h_d), [distribute_tensor(u, mesh, [split]) for u in upstream])
        label = f"rms_norm {split}"
        record(f"{label} y", y_d.full_tensor(), y)
        record(f"{label} h", h_d.full_tensor(), h)
        for name, mine, theirs in (("dx", got[0], ref[0]), ("dresidual", got[1], ref[1]), ("dweight", w, ref[2])):
            record(f"{label} {name}", mine.grad.full_tensor(), theirs.grad)
    check_sequence_parallel_module(mesh, x, upstream[0])
    check_compiled_norm(mesh, x, weight, upstream[0])
    expected = tk.ops.layer_norm(x, weight, bias)
    sharded_x = distribute_tensor(x, mesh, [Shard(1)])
    got = tk.ops.layer_norm(sharded_x, *(distribute_tensor(t, mesh, [Replicate()]) for t in (weight, bias)))
    record("layer_norm Shard(1) y", got.full_tensor(), expected)
    plain_weight = leaf(weight)
    refused("rms_norm features split", lambda: tk.ops.rms_norm(distribute_tensor(x, mesh, [Shard(2)]), weight))
    refused(
        "rms_norm partial",
        lambda: tk.ops.rms_norm(
            DTensor.from_local(x, mesh, [Partial()], run_check=False), distribute_tensor(weight, mesh, [Replicate()])
        ),
    )
    refused("rms_norm plain weight needing grad", lambda: tk.ops.rms_norm(sharded_x, plain_weight))
    refused(
        "rms_norm residual split otherwise",
        lambda: tk.ops.rms_norm(
            sharded_x, distribute_tensor(weight, mesh, [Replicate()]), residual=distribute_tensor(x, mesh, [Shard(0)])
        ),
    )


def check_compiled_norm(mesh, x, weight, upstream) -> None:
    """torch.compile(fullgraph=True) traces the DTensor path whole (torchtitan compiles its blocks around DTensor
    activations): outputs and gradients of the eager op on the whole tensors."""
    compiled_x, compiled_w = (
        leaf(distribute_tensor(x, mesh, [Shard(1)])),
        leaf(distribute_tensor(weight, mesh, [Replicate()])),
    )
    y_c = torch.compile(tk.ops.rms_norm, fullgraph=True)(compiled_x, compiled_w)
    y_c.backward(distribute_tensor(upstream, mesh, [Shard(1)]))
    expected_x, expected_w = leaf(x), leaf(weight)
    tk.ops.rms_norm(expected_x, expected_w).backward(upstream)
    record("rms_norm compiled Shard(1) y", y_c.full_tensor(), tk.ops.rms_norm(x, weight))
    record("rms_norm compiled Shard(1) dx", compiled_x.grad.full_tensor(), expected_x.grad)
    record("rms_norm compiled Shard(1) dweight", compiled_w.grad.full_tensor(), expected_w.grad)


def check_sequence_parallel_module(mesh, x, upstream) -> None:
    """tk.nn.RMSNorm under torch's SequenceParallel (inputs split by sequence, the weight replicated, its gradient
    a Partial sum) and one SGD step: the module and step on the whole tensors."""
    from torch.distributed.tensor.parallel import SequenceParallel, parallelize_module

    torch.manual_seed(3)
    reference = tk.nn.RMSNorm(x.shape[-1], eps=1e-6).to(DEVICE)
    torch.nn.init.normal_(reference.weight)
    module = parallelize_module(copy.deepcopy(reference), mesh, SequenceParallel())
    expected = reference(x)
    expected.backward(upstream)
    got = module(slice_of(x, 1))  # each rank's part of the sequence, as the previous layer leaves it
    got.backward(distribute_tensor(upstream, mesh, [Shard(1)]))
    record("rms_norm SequenceParallel y", got.full_tensor(), expected)
    record("rms_norm SequenceParallel dweight", module.weight.grad.full_tensor(), reference.weight.grad)
    for parameters in (module.parameters(), reference.parameters()):
        torch.optim.SGD(parameters, lr=0.5).step()
    record("rms_norm SequenceParallel weight after a step", module.weight.full_tensor(), reference.weight)


def check_rope(mesh, generator) -> None:
    q, k = randn(2, 4, 6, 8, generator=generator), randn(2, 2, 6, 8, generator=generator)  # (B, H, T, D), GQA
    cos, sin = randn(6, 8, generator=generator), randn(6, 8, generator=generator)
    dq, dk = randn(*q.shape, generator=generator), randn(*k.shape, generator=generator)
    ref = leaf(q), leaf(k)
    expected = tk.ops.rope(*ref, cos, sin)
    torch.autograd.backward(expected, (dq, dk))
    # tokens split: the tables split alike; heads split: the tables whole (plain tensors, as a model computes them).
    for split, tables in ((Shard(2), lambda t: distribute_tensor(t, mesh, [Shard(0)])), (Shard(1), lambda t: t)):
        got = leaf(distribute_tensor(q, mesh, [split])), leaf(distribute_tensor(k, mesh, [split]))
        out = tk.ops.rope(*got, tables(cos), tables(sin))
        torch.autograd.backward(out, [distribute_tensor(g, mesh, [split]) for g in (dq, dk)])
        for name, mine, theirs in zip(("q", "k"), out, expected, strict=True):
            record(f"rope {split} {name}_embed", mine.full_tensor(), theirs)
        for name, mine, theirs in zip(("dq", "dk"), got, ref, strict=True):
            record(f"rope {split} {name}", mine.grad.full_tensor(), theirs.grad)
    refused(
        "rope head_dim split",
        lambda: tk.ops.rope(distribute_tensor(q, mesh, [Shard(3)]), distribute_tensor(k, mesh, [Shard(3)]), cos, sin),
    )
    refused(
        "rope tables whole while tokens split",
        lambda: tk.ops.rope(
            distribute_tensor(q, mesh, [Shard(2)]),
            distribute_tensor(k, mesh, [Shard(2)]),
            distribute_tensor(cos, mesh, [Replicate()]),
            distribute_tensor(sin, mesh, [Replicate()]),
        ),
    )


# --------------------------------------------------------------------------------------------------
# Vocabulary-parallel cross-entropy: the plain loss, and gradients, from slices
# --------------------------------------------------------------------------------------------------
def reference_loss(logits, target, *, ignore_index=-100, label_smoothing=0.0, z_loss=0.0, softcap=None,
                   reduction="mean"):  # fmt: skip
    """torch's cross_entropy on the capped logits plus z * lse^2, in float64."""
    logits = logits.double()
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    keep = target != ignore_index
    loss = torch.nn.functional.cross_entropy(logits, target, ignore_index=ignore_index, reduction="none",
                                             label_smoothing=label_smoothing)  # fmt: skip
    loss = loss + torch.where(keep, z_loss * torch.logsumexp(logits, -1) ** 2, 0.0)
    if reduction == "none":
        return loss
    return loss.sum() / keep.sum().clamp_min(1) if reduction == "mean" else loss.sum()


OPTIONS = (
    {},
    {"label_smoothing": 0.1, "z_loss": 1e-2, "softcap": 5.0, "reduction": "none"},
    {"label_smoothing": 0.2, "reduction": "sum"},
)


def slice_of(t, dim: int):
    """This rank's piece of an even split, as Megatron's layout has it."""
    return t.chunk(ARGS.world, dim=dim)[ARGS.rank]


def check_vocab_parallel(mesh, generator) -> None:
    tokens, vocab, hidden_size = 7, 40, 8
    target = torch.randint(0, vocab, (tokens,), generator=generator).to(DEVICE)
    target[::3] = -100
    logits = randn(tokens, vocab, generator=generator, scale=3.0)
    hidden = randn(tokens, hidden_size, generator=generator)
    weight, bias = randn(vocab, hidden_size, generator=generator, scale=0.7), randn(vocab, generator=generator)
    for index, options in enumerate(OPTIONS):
        upstream = randn(tokens, generator=generator).double() if options.get("reduction") == "none" else None
        # The logits form, Megatron's layout (plain slices, the default group).
        ref = leaf(logits)
        expected = reference_loss(ref, target, **options)
        expected.backward(upstream)
        mine = leaf(slice_of(logits, 1))
        got = tk.ops.vocab_parallel_cross_entropy(mine, target, **options)
        got.backward(None if upstream is None else upstream.float())
        record(f"vocab logits {index} loss", got, expected)
        record(f"vocab logits {index} dlogits", mine.grad, slice_of(ref.grad, 1))
        # The fused form with a DTensor head (Shard(0), as ColwiseParallel leaves it) and a bias.
        ref = leaf(hidden), leaf(weight), leaf(bias)
        expected = reference_loss(ref[0] @ ref[1].t() + ref[2], target, **options)
        expected.backward(upstream)
        h = leaf(hidden)
        w, b = (leaf(distribute_tensor(t, mesh, [Shard(0)])) for t in (weight, bias))
        got = tk.ops.vocab_parallel_fused_linear_cross_entropy(h, w, target, b, **options)
        got.backward(None if upstream is None else upstream.float())
        record(f"vocab fused {index} loss", got, expected)
        record(f"vocab fused {index} dhidden", h.grad, ref[0].grad)
        record(f"vocab fused {index} dweight", w.grad.full_tensor(), ref[1].grad)
        record(f"vocab fused {index} dbias", b.grad.full_tensor(), ref[2].grad)
    # An uneven split (37 classes: 19 and 18) as DTensor logits, Shard(-1).
    uneven = logits[:, :37]
    ref = leaf(uneven)
    reference_loss(ref, torch.where(target < 37, target, 0)).backward()
    mine = leaf(distribute_tensor(uneven, mesh, [Shard(1)]))
    got = tk.ops.vocab_parallel_cross_entropy(mine, torch.where(target < 37, target, 0))
    got.backward()
    record("vocab uneven DTensor loss", got, reference_loss(uneven, torch.where(target < 37, target, 0)))
    record("vocab uneven DTensor dlogits", mine.grad.full_tensor(), ref.grad)
    refused(
        "fused_linear_cross_entropy DTensor head",
        lambda: tk.ops.fused_linear_cross_entropy(hidden, distribute_tensor(weight, mesh, [Shard(0)]), target),
    )
    refused(
        "vocab_parallel hidden split",
        lambda: tk.ops.vocab_parallel_fused_linear_cross_entropy(
            distribute_tensor(hidden, mesh, [Shard(0)]), distribute_tensor(weight, mesh, [Shard(0)]), target
        ),
    )


def check_tensor_parallel_head(mesh) -> None:
    """The patched model's fused loss with the LM head split along the vocabulary (a DTensor weight, as tensor
    parallelism leaves it): the unpatched model's loss and gradients."""
    generator = torch.Generator().manual_seed(7)  # the same tokens on every rank: tensor parallelism shares them
    ids = torch.randint(0, VOCAB, (2, 5), generator=generator).to(DEVICE)
    reference, patched = tiny_llama(), tiny_llama()
    tk_hf.apply(patched, rms_norm=False, rope=False, attention=False, swiglu=False)  # the loss alone is at stake
    patched.lm_head.weight = torch.nn.Parameter(distribute_tensor(patched.lm_head.weight.detach(), mesh, [Shard(0)]))
    expected, got = reference(ids, labels=ids).loss, patched(ids, labels=ids).loss
    expected.backward()
    got.backward()
    record("tp head loss", got, expected)
    record("tp head dweight", patched.lm_head.weight.grad.full_tensor(), reference.lm_head.weight.grad)
    for (name, mine), theirs in zip(patched.model.named_parameters(), reference.model.parameters(), strict=True):
        record(f"tp head grad {name}", mine.grad, theirs.grad)


def run_checks() -> None:
    mesh = init_device_mesh("cpu" if ARGS.backend == "gloo" else "cuda", (ARGS.world,))
    generator = torch.Generator().manual_seed(1)  # the same inputs on every rank
    for check in (check_norms, check_rope, check_vocab_parallel):
        started = time.perf_counter()
        check(mesh, generator)
        print(f"{check.__name__}: {time.perf_counter() - started:.1f} s")
    for check in (check_tensor_parallel_head, check_fsdp):
        started = time.perf_counter()
        check(mesh)
        print(f"{check.__name__}: {time.perf_counter() - started:.1f} s")


def main() -> int:
    print(f"imports: {time.perf_counter() - STARTED:.1f} s")
    if ARGS.backend == "nccl":
        torch.cuda.set_device(ARGS.rank)
    store = dist.FileStore(str(ARGS.store), ARGS.world)
    dist.init_process_group(ARGS.backend, store=store, rank=ARGS.rank, world_size=ARGS.world,
                            timeout=datetime.timedelta(seconds=120))  # fmt: skip
    try:
        with poisoned_allocations():  # what tritonkit allocates is NaN until written, as in the rest of the suite
            run_checks()
        torch.save(RESULTS, ARGS.out / f"rank{ARGS.rank}.pt")
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
