"""Two ranks: FSDP2 training with the Hugging Face patch equals it without, and tritonkit's ops on DTensor inputs equal
them on whole tensors (or refuse by name what they cannot take).

tests/distributed_worker.py runs each rank in its own process (a FileStore rendezvous: no port to find free) and
writes what it measured; the comparisons are made here, once per module for both ranks. The default suite runs a
CPU group (gloo, the Triton interpreter, tiny sizes, well within a minute); ``-m gpu`` runs the same checks on two
GPUs with NCCL, compiled, and skips where fewer than two GPUs are present (a missing resource, not a failure).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

WORKER = Path(__file__).parent / "distributed_worker.py"
RANKS = 2
TIMEOUT_S = 300  # both ranks, start to finish: ~1 minute on two busy CPU cores, so only a hang reaches it
# fp32 throughout. Patched against unpatched models: the kernels' sums in another order, through a momentum step.
MODEL_TOLERANCE = {"atol": 2e-5, "rtol": 1e-4}
# An op on shards against the op on whole tensors (the same kernels, so equal but for the reduction of weight
# gradients across ranks); the vocabulary-parallel losses against a float64 reference.
OP_TOLERANCE = {"atol": 1e-5, "rtol": 1e-5}


def _kill(processes) -> None:
    for process in processes:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)  # the rank and anything it started
    for process in processes:
        process.wait()


def _run_ranks(backend: str, folder: Path) -> list[dict]:
    """Run the worker on RANKS processes; their results, or a failure with each rank's output."""
    command = [sys.executable, str(WORKER), "--world", str(RANKS), "--store", str(folder / "store"), "--out",
               str(folder), "--backend", backend]  # fmt: skip
    logs = [open(folder / f"rank{rank}.log", "w+") for rank in range(RANKS)]  # noqa: SIM115 (closed below)
    processes = [
        subprocess.Popen([*command, "--rank", str(rank)], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        for rank, log in enumerate(logs)
    ]
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while any(p.poll() is None for p in processes) and time.monotonic() < deadline:
            if any(p.poll() not in (None, 0) for p in processes):  # one rank failed: the other would wait for it
                break
            time.sleep(0.2)
    finally:
        timed_out = any(p.poll() is None for p in processes) and time.monotonic() >= deadline
        _kill(processes)
        outputs = []
        for log in logs:
            log.seek(0)
            outputs.append(log.read())
            log.close()
    report = "\n".join(f"--- rank {rank} (exit {p.returncode}) ---\n{out[-4000:]}"
                       for rank, (p, out) in enumerate(zip(processes, outputs, strict=True)))  # fmt: skip
    if timed_out:
        pytest.fail(f"the {backend} ranks did not finish within {TIMEOUT_S} s\n{report}")
    if any(p.returncode != 0 for p in processes):
        pytest.fail(f"a {backend} rank failed\n{report}")
    return [torch.load(folder / f"rank{rank}.pt") for rank in range(RANKS)]


@pytest.fixture(scope="module", params=["gloo", pytest.param("nccl", marks=pytest.mark.gpu)])
def ranks(request, tmp_path_factory) -> list[dict]:
    if request.param == "nccl" and torch.cuda.device_count() < RANKS:
        pytest.skip(f"needs {RANKS} CUDA GPUs")
    return _run_ranks(request.param, tmp_path_factory.mktemp(request.param))


def _pairs(ranks, prefix: str) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    found = [(f"rank {rank}: {name}", *value) for rank, results in enumerate(ranks)
             for name, value in results.items() if name.startswith(prefix) and isinstance(value, tuple)]  # fmt: skip
    assert found, f"no {prefix!r} results"
    return found


def _assert_close(pairs, tolerance) -> None:
    for name, got, expected in pairs:
        torch.testing.assert_close(got, expected, **tolerance, msg=lambda m, name=name: f"{name}: {m}")


def test_fsdp2_training_with_the_patch_equals_without(ranks):
    """Two optimizer steps of a tiny Llama under fully_shard, each rank with its own batches: the losses and every
    gradient of the patched model equal the unpatched one's, with the LM head in the root's unit (gathered when the
    fused loss reads it) and sharded alone (the loss then runs as a forward method FSDP registered on it)."""
    for where in ("head in root", "head alone"):
        pairs = _pairs(ranks, f"fsdp {where} ")
        assert {name.split(": ", 1)[1] for name, *_ in pairs} >= {f"fsdp {where} loss step {s}" for s in (0, 1)}
        assert sum("grad step 1" in name for name, *_ in pairs) == 2 * 12  # both ranks, every parameter
        _assert_close(pairs, MODEL_TOLERANCE)
    for results in ranks:
        assert results["fsdp head alone fused through the head"] is True
        assert results["fsdp head in root fused through the head"] is False
    # Data parallelism: the ranks' losses differ (their own batches), the gradients FSDP reduced agree.
    first, second = ({name: value[0] for name, value in results.items() if isinstance(value, tuple)}
                     for results in ranks)  # fmt: skip
    assert not torch.equal(first["fsdp head alone loss step 0"], second["fsdp head alone loss step 0"])
    for name in first:
        if name.startswith("fsdp") and " grad step " in name:
            torch.testing.assert_close(first[name], second[name], atol=0, rtol=0, msg=name)


@pytest.mark.parametrize("prefix", ["rms_norm", "layer_norm", "rope"])
def test_ops_on_sharded_activations_equal_the_whole(ranks, prefix):
    """Split by batch, sequence, heads or not at all: outputs and every gradient (the norm weight's summed across
    ranks from its Partial placement) equal those of the whole tensors."""
    _assert_close(_pairs(ranks, f"{prefix} "), OP_TOLERANCE)


def test_vocab_parallel_losses_equal_the_plain_loss(ranks):
    """Logits split as Megatron splits them, an LM head split as ColwiseParallel does, an uneven DTensor split; with
    smoothing, z-loss, softcap, ignored targets and each reduction: the loss and the gradients of the whole."""
    pairs = _pairs(ranks, "vocab ")
    assert len(pairs) == RANKS * (3 * 6 + 2)
    _assert_close(pairs, OP_TOLERANCE)


def test_patched_model_with_a_vocabulary_parallel_head(ranks):
    """The patch's fused loss with the head's weight a DTensor Shard(0): the unpatched model's loss and gradients."""
    _assert_close(_pairs(ranks, "tp head "), MODEL_TOLERANCE)


REFUSALS = {
    "rms_norm features split": ("ValueError", "Shard(2)", "features"),
    "rms_norm partial": ("ValueError", "Partial(sum)"),
    "rms_norm plain weight needing grad": ("TypeError", "weight is a plain torch.Tensor"),
    "rms_norm residual split otherwise": ("ValueError", "residual along its row dim 0"),
    "rope head_dim split": ("ValueError", "Shard(3)", "head_dim"),
    "rope tables whole while tokens split": ("ValueError", "cos must be too (Shard(0))"),
    "fused_linear_cross_entropy DTensor head": ("TypeError", "Shard(0)", "vocab_parallel_fused_linear_cross_entropy"),
    "vocab_parallel hidden split": ("ValueError", "hidden must be whole", "Shard(0)"),
}


@pytest.mark.parametrize("check", sorted(REFUSALS))
def test_placements_an_op_cannot_take_raise_by_name(ranks, check):
    for results in ranks:
        message = results[check]
        assert all(part in message for part in REFUSALS[check]), message
