"""The fused linear cross-entropy against the three GEMMs it must run, by chunk size and d(weight) accumulator: one
GPU, bf16, forward and backward, at 8192 tokens x hidden 4096 x vocabulary 128256 and at 4096 x 2048 x 128256 (a
1.2B model's training step).

    python benchmarks/flce_speed.py --out DIR
    python benchmarks/flce_speed.py --out DIR --dry-run    # CPU, interpreter, tiny sizes: checks the script
    python benchmarks/flce_speed.py --out DIR --alternate 3    # GEMMs, launcher, public op in turn, 3 rounds

Rows, per size: the three GEMMs alone at full size (logits = h W^T, dh = g W, dW = g^T h; cuBLAS, bf16 out); ours
through the forward launcher with the chunk rows forced by ``plan=`` (the plan's rule, 1024, 2048, 4096, 8192) and
d(weight) summed in fp32 and in bf16 (one chunk of every token: one GEMM in bf16 whichever is asked; the launcher
computes every gradient in the forward; the backward's scaling is timed with it); ours through the public op and
autograd (the rule); torch.compile of the unfused expression; liger-kernel's
LigerFusedLinearCrossEntropyLoss where importable. Each is timed as the GPU time of a CUDA graph of it
(triton.testing.do_bench_cudagraph) where it captures, else (and liger-kernel's always: NO_CAPTURE) by
triton.testing.do_bench; the row says which. Peak
extra memory: torch.cuda.max_memory_allocated() during one call above what was allocated before it (the inputs), the
returned gradients included. d(weight)'s error: ||dW - dW_fp32|| / ||dW_fp32|| (Frobenius), dW_fp32 from the same bf16
inputs through fp32 GEMMs and torch's loss. Prints a table with each row's ratio to the three GEMMs and writes
``<date>-flce-speed.json`` into DIR.
"""

# ruff: noqa: E402 -- --dry-run sets TRITON_INTERPRET, which triton reads when imported, before the imports below

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from pathlib import Path

DRY_RUN = "--dry-run" in sys.argv
if DRY_RUN:  # before triton is imported: the interpreter runs the kernels on CPU tensors
    os.environ["TRITON_INTERPRET"] = "1"

import torch
import torch.nn.functional as F
import triton.testing

import tritonkit as tk
from tritonkit._core.loss_chunks import FusedChunkPlan, chunk_plan
from tritonkit._core.losses import head_grads, scale_in_place
from tritonkit.bench import report
from tritonkit.ops.loss.launch import fused_linear_cross_entropy_fwd

SIZES = ((8192, 4096, 128256), (4096, 2048, 128256))  # (tokens, hidden, vocabulary)
FORCED_ROWS = (1024, 2048, 4096, 8192)  # 8192: every token of the larger size in one chunk
DRY_SIZES = ((64, 32, 300),)
DRY_ROWS = (8, 16, 64)
REP_MS = 50  # time a graph spans: one fwd+bwd call at the large size, ten replays of it; the run within ~60 s
MIB = 2**20
DTYPE = torch.bfloat16


def _inputs(tokens, hidden_size, vocab, device):
    hidden = torch.randn(tokens, hidden_size, device=device, dtype=DTYPE, requires_grad=True)
    weight = (torch.randn(vocab, hidden_size, device=device) * 2 * hidden_size**-0.5).to(DTYPE).requires_grad_()
    target = torch.randint(0, vocab, (tokens,), device=device)
    return hidden, weight, target


def _three_gemms(hidden, weight, logit_grad):
    with torch.no_grad():
        return hidden @ weight.t(), logit_grad @ weight, logit_grad.t() @ hidden


def _ours_forced(hidden, weight, target, accum_dtype, plan):
    """What the op runs for reduction "mean": the forward launcher (loss and every gradient, chunk by chunk) and the
    backward's scaling of the gradients by the upstream gradient."""
    options = (-100, 0.0, 0.0, 0.0, "mean", DTYPE, True, True, False, accum_dtype)
    with torch.no_grad():  # as inside the op's autograd Function
        _, _, *grads = fused_linear_cross_entropy_fwd(hidden, weight, target, None, *options, plan=plan)
        upstream = torch.ones((), device=hidden.device)
        if grads[1].dtype != torch.float32:  # summed in 16 bits: the op's eager backward scales them in place
            for grad in grads[:2]:
                scale_in_place(grad, upstream)
            return grads[:2]
        return head_grads(grads, upstream, (DTYPE, DTYPE, None), (True, True, False), False)


def _ours_public(hidden, weight, target, accum_dtype):
    loss = tk.ops.fused_linear_cross_entropy(hidden, weight, target, accum_dtype=accum_dtype)
    return torch.autograd.grad(loss, (hidden, weight))


def _unfused(compiled, hidden, weight, target):
    return torch.autograd.grad(compiled(hidden, weight, target), (hidden, weight))


def _liger(loss_fn, hidden, weight, target):
    return torch.autograd.grad(loss_fn(weight, hidden, target), (hidden, weight))


def _fp32_weight_grad(hidden, weight, target):
    """d(mean loss)/d(weight) from the bf16 inputs widened to fp32, every product fp32: what the rows are held to."""
    leaf = weight.detach().float().requires_grad_()
    loss = F.cross_entropy(hidden.detach().float() @ leaf.t(), target)
    (grad,) = torch.autograd.grad(loss, leaf)
    return grad


# Why liger-kernel's loss is not captured: its capture fails on the H200 ("operation failed due to a previous error
# during capture"), and the failed capture leaves torch's generator unusable for the next size's inputs.
NO_CAPTURE = "liger-kernel's loss fails CUDA-graph capture"


def _time(fn, dry_run, capture: bool) -> tuple[float, str]:
    """Milliseconds a call and how they were measured: a CUDA graph where ``capture`` and it captures."""
    if dry_run:
        fn()
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3, "wall clock, CPU interpreter"
    if not capture:
        return triton.testing.do_bench(fn, rep=REP_MS), f"do_bench (no graph: {NO_CAPTURE})"
    try:
        return triton.testing.do_bench_cudagraph(fn, rep=REP_MS), "cuda graph"
    except Exception as error:  # a host synchronisation or an unsupported call during capture
        torch.cuda.synchronize()
        reason = str(error).splitlines()[0][:80] if str(error) else type(error).__name__
        return triton.testing.do_bench(fn, rep=REP_MS), f"do_bench (no graph: {reason})"


def _peak_extra_mib(fn, dry_run) -> float | None:
    if dry_run:
        return None
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / MIB


def _runs(hidden, weight, target, forced_rows, dry_run):
    """(label, chunk rows or None, call, whether to capture it) for one size, the three GEMMs first; every call
    after them returns (d(hidden), d(weight))."""
    logit_grad = torch.randn(hidden.shape[0], weight.shape[0], device=hidden.device, dtype=DTYPE)
    runs = [("three GEMMs (cuBLAS)", None, functools.partial(_three_gemms, hidden, weight, logit_grad), True)]
    for accum_dtype, name in ((torch.float32, "fp32 dW"), (torch.bfloat16, "bf16 dW")):
        rule = chunk_plan(hidden, weight, accum_dtype, need_weight=True).rows
        for rows in (rule, *(r for r in forced_rows if r != rule)):
            label = f"ours, {name}, {'rule' if rows == rule else 'forced'}"
            plan = FusedChunkPlan(rows=rows)
            runs.append((label, rows, functools.partial(_ours_forced, hidden, weight, target, accum_dtype, plan), True))
        call = functools.partial(_ours_public, hidden, weight, target, accum_dtype)
        runs.append((f"ours, {name}, public op + autograd", rule, call, True))
    compiled = torch.compile(lambda h, w, t: F.cross_entropy((h @ w.t()).float(), t), dynamic=False)
    runs.append(("torch.compile, unfused", None, functools.partial(_unfused, compiled, hidden, weight, target), True))
    try:
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss
    except ImportError:
        print("liger-kernel: not importable, no row")
    else:
        if not dry_run:  # its kernels need a GPU
            call = functools.partial(_liger, LigerFusedLinearCrossEntropyLoss(), hidden, weight, target)
            runs.append(("liger-kernel LigerFusedLinearCrossEntropyLoss", None, call, False))
    return runs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--dry-run", action="store_true", help="CPU, Triton interpreter, tiny sizes")
    alternate = (
        "instead: the three GEMMs, the launcher's rule and the public op (fp32 dW) timed in turn, ROUNDS "
        "times, at the larger size: whether the runs' order moves their times"
    )
    parser.add_argument("--alternate", type=int, default=0, metavar="ROUNDS", help=alternate)
    args = parser.parse_args()
    if args.alternate:
        return _alternate(args)
    device = "cpu" if args.dry_run else "cuda"
    sizes, forced_rows = (DRY_SIZES, DRY_ROWS) if args.dry_run else (SIZES, FORCED_ROWS)
    rows = []
    for tokens, hidden_size, vocab in sizes:
        torch.manual_seed(0)
        hidden, weight, target = _inputs(tokens, hidden_size, vocab, device)
        flop = 6 * tokens * hidden_size * vocab
        print(f"\n{tokens} tokens x hidden {hidden_size} x vocabulary {vocab}, bf16, fwd+bwd")
        exact = _fp32_weight_grad(hidden, weight, target)
        print(f"{'run':46} {'rows':>5} {'ms':>8} {'x GEMMs':>8} {'TFLOP/s':>8} {'peak MiB':>9} {'dW err':>8}  timing")
        gemms_ms = None
        for label, chunk_rows, call, capture in _runs(hidden, weight, target, forced_rows, args.dry_run):
            peak = _peak_extra_mib(call, args.dry_run)  # also the warm-up (torch.compile compiles here)
            ms, method = _time(call, args.dry_run, capture)
            error = None
            if gemms_ms is not None:  # not the GEMMs themselves
                error = ((call()[1].float() - exact).norm() / exact.norm()).item()
            gemms_ms = gemms_ms or ms
            row = {"tokens": tokens, "hidden": hidden_size, "vocab": vocab, "run": label, "chunk_rows": chunk_rows,
                   "ms": ms, "ratio_to_gemms": ms / gemms_ms, "tflops": flop / ms / 1e9, "peak_extra_mib": peak,
                   "dw_relative_error": error, "timing": method}  # fmt: skip
            rows.append(row)
            shown_peak = f"{peak:9.0f}" if peak is not None else f"{'-':>9}"
            shown_error = f"{error:8.1e}" if error is not None else f"{'-':>8}"
            print(f"{label:46} {chunk_rows or '-':>5} {ms:8.2f} {ms / gemms_ms:8.3f} {row['tflops']:8.0f} "
                  f"{shown_peak} {shown_error}  {method}", flush=True)  # fmt: skip
        del exact
    name = "cpu-interpreter" if args.dry_run else torch.cuda.get_device_name()
    record = {"device": name, "torch": torch.__version__, "triton": triton.__version__, "dtype": "bfloat16",
              "rows": rows}  # fmt: skip
    report.write_record(args.out, "flce-speed" + ("-dry-run" if args.dry_run else ""), record)
    return 0


def _alternate(args) -> int:
    """--alternate: the three GEMMs, ours through the launcher (the rule's chunks) and through the public op, each
    timed once a round, in that order, for ``args.alternate`` rounds; prints each time and writes them."""
    device = "cpu" if args.dry_run else "cuda"
    tokens, hidden_size, vocab = (DRY_SIZES if args.dry_run else SIZES)[0]
    torch.manual_seed(0)
    hidden, weight, target = _inputs(tokens, hidden_size, vocab, device)
    logit_grad = torch.randn(tokens, vocab, device=device, dtype=DTYPE)
    rule = chunk_plan(hidden, weight, torch.float32, need_weight=True)
    calls = {
        "three GEMMs": functools.partial(_three_gemms, hidden, weight, logit_grad),
        "launcher, rule": functools.partial(_ours_forced, hidden, weight, target, torch.float32, rule),
        "public op + autograd": functools.partial(_ours_public, hidden, weight, target, torch.float32),
    }
    rows = []
    for round_ in range(args.alternate):
        for label, call in calls.items():
            ms, method = _time(call, args.dry_run, capture=True)
            rows.append({"round": round_, "run": label, "ms": ms, "timing": method})
            print(f"round {round_}  {label:24} {ms:8.2f} ms  {method}", flush=True)
    name = "cpu-interpreter" if args.dry_run else torch.cuda.get_device_name()
    record = {"device": name, "size": [tokens, hidden_size, vocab], "chunk_rows": rule.rows, "rows": rows}
    report.write_record(args.out, "flce-alternate" + ("-dry-run" if args.dry_run else ""), record)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
