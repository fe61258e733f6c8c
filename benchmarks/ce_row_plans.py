"""The cross-entropy row kernel's plans on the fused linear CE's chunk: loss, lse and the logits' gradient written
over them (COMPUTE_LOSS and WRITE_GRAD, in place) for 8192 rows of 128256 bf16 logits (a 2 GiB chunk), each
CrossEntropyPlan forced through the launcher's plan= (block, warps, and how many blocks ahead each pass's loads are
issued), against a copy of the same bytes (one read, one write; the kernel reads each row twice). CUDA-graph GPU
time (triton.testing.do_bench_cudagraph).

    python benchmarks/ce_row_plans.py --out DIR [--dry-run]

Writes ``<date>-ce-row-plans.md``: each plan's time and the copy's time over it. ``--dry-run`` runs every plan once
on a small ragged shape under the CPU interpreter and checks loss, lse and gradient against the default plan's.
"""

# ruff: noqa: E402 -- --dry-run sets TRITON_INTERPRET, which triton reads when imported, before the imports below

from __future__ import annotations

import argparse
import datetime
import os
import sys
from pathlib import Path

DRY_RUN = "--dry-run" in sys.argv
if DRY_RUN:
    os.environ["TRITON_INTERPRET"] = "1"

import torch
import triton.testing

from tritonkit.ops.loss.launch import _launch_rows
from tritonkit.ops.loss.plan import CrossEntropyPlan

# (block_n, warps, stages); stages 1: each block's loads wait for the last block's arithmetic (the plan before this
# sweep: 4096, 8, 1).
PLANS = [(4096, 8, 1), (4096, 8, 2), (4096, 8, 3), (4096, 8, 4), (4096, 16, 1), (4096, 16, 2), (4096, 16, 3),
         (2048, 4, 3), (2048, 8, 2), (2048, 8, 3), (2048, 8, 4), (1024, 4, 4), (8192, 16, 2)]  # fmt: skip
SIZE, DRY_SIZE = (8192, 128256), (37, 3001)


def _run(logits, target, plan):
    n_rows = logits.shape[0]
    loss = torch.empty(n_rows, device=logits.device)
    lse = torch.empty(n_rows, device=logits.device)
    scale = torch.full((), 1.0 / n_rows, device=logits.device)
    _launch_rows(logits, target, loss, lse, scale, logits, (-100, 0.0, 0.0, 0.0), True, True, plan)
    return loss, lse, logits


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--dry-run", action="store_true", help="CPU, Triton interpreter, a small shape")
    args = parser.parse_args()
    device = "cpu" if args.dry_run else "cuda"
    n_rows, n_cols = DRY_SIZE if args.dry_run else SIZE
    logits = (torch.randn(n_rows, n_cols, device=device) * 2).to(torch.bfloat16)
    target = torch.randint(0, n_cols, (n_rows,), device=device)
    plans = [CrossEntropyPlan(block_n=min(b, 1024) if args.dry_run else b, warps=w, stages=st)
             for b, w, st in PLANS]  # fmt: skip
    if args.dry_run:
        expected = _run(logits.clone(), target, plans[0])
        for plan in plans[1:]:
            for ours, theirs in zip(_run(logits.clone(), target, plan), expected, strict=True):
                torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
        print(f"{len(plans)} plans agree under the interpreter")
        return 0
    work = logits.clone()
    copy_ms = triton.testing.do_bench_cudagraph(lambda: work.copy_(logits))
    lines = [f"# Cross-entropy row plans, {n_rows} x {n_cols} bf16 in place ({torch.cuda.get_device_name()})", "",
             f"A copy of the logits (read and write once): {copy_ms:.3f} ms, CUDA-graph GPU time.", "",
             "| block_n | warps | stages | ms | copy's time over this |",
             "|---|---|---|---|---|"]  # fmt: skip
    for plan in plans:
        ms = triton.testing.do_bench_cudagraph(lambda plan=plan: _run(work, target, plan))
        lines.append(f"| {plan.block_n} | {plan.warps} | {plan.stages} | {ms:.3f} | {copy_ms / ms:.2f} |")
        print(lines[-1], flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{datetime.date.today()}-ce-row-plans.md"
    path.write_text("\n".join(lines) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
