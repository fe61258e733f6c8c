"""A/B of the norm plans that serve a single table entry: each against what that entry would take without it.

    python3 benchmarks/norm_modes_ab.py [--out FILE]

For each such entry (plan.py's sm90 tables) the launcher runs with the entry's plan and with the alternatives that
would replace it were the entry dropped, at the sizes it was measured at; times are CUDA-graph GPU time
(triton.testing.do_bench_cudagraph, median). A mode stays only where it wins by 3% or more (docs/kernels/norm.md).
"""

from __future__ import annotations

import argparse
import sys

import torch
import triton

from tritonkit.ops.norm.launch import norm_bwd, norm_fwd
from tritonkit.ops.norm.plan import BwdRowsPlan, BwdSharedPlan, FwdRowsPlan, given_plan


def _inputs(rows, cols, dtype, bias):
    x = torch.randn(rows, cols, device="cuda", dtype=dtype)
    weight = (1 + 0.1 * torch.randn(cols, device="cuda")).to(dtype)
    b = (0.1 * torch.randn(cols, device="cuda")).to(dtype) if bias else None
    return x, weight, b


def _bwd_timer(rows, cols, dtype, is_rms, bias):
    x, weight, b = _inputs(rows, cols, dtype, bias)
    _, _, mean, rstd = norm_fwd(x, weight, b, None, 1e-5, 0.0, is_rms, False, False)
    dy = torch.randn_like(x)
    mean = None if is_rms else mean

    def time(plan):
        return triton.testing.do_bench_cudagraph(
            lambda: norm_bwd(dy, None, x, weight, None, mean, rstd, 0.0, is_rms, bias, plan=plan)
        )

    return time


def _fwd_timer(rows, cols, dtype, is_rms, bias):
    x, weight, b = _inputs(rows, cols, dtype, bias)

    def time(plan):
        return triton.testing.do_bench_cudagraph(
            lambda: norm_fwd(x, weight, b, None, 1e-5, 0.0, is_rms, False, False, store_stats=False, plan=plan)
        )

    return time


# (entry, timer arguments, the entry's plan, {alternative: plan})
CASES = [
    ("bf16 RMSNorm wide backward, no bias: shared, published ahead (AHEAD)", (_bwd_timer, 4096, 65536, torch.bfloat16,
     True, False), BwdSharedPlan(1024, 2, 2, 8, ahead=True),
     {"shared in turn": BwdSharedPlan(1024, 2, 2, 8), "two phases": given_plan(2, "sm90")}),
    ("bf16 RMSNorm wide backward, no bias: shared, published ahead (AHEAD)", (_bwd_timer, 2048, 131072,
     torch.bfloat16, True, False), BwdSharedPlan(1024, 2, 2, 8, ahead=True),
     {"shared in turn": BwdSharedPlan(1024, 2, 2, 8), "two phases": given_plan(2, "sm90")}),
    ("bf16 LayerNorm 16384 backward with bias: blocks of rows", (_bwd_timer, 16384, 16384, torch.bfloat16, False,
     True), BwdRowsPlan(1, 8, 1, 1, interleaved=False),
     {"interleaved 8 warps": BwdRowsPlan(1, 8, 1, 1), "interleaved 16 warps": BwdRowsPlan(1, 16, 1, 1)}),
    ("bf16 LayerNorm 16384 backward with bias: blocks of rows", (_bwd_timer, 4096, 16384, torch.bfloat16, False,
     True), BwdRowsPlan(1, 8, 1, 1, interleaved=False),
     {"interleaved 8 warps": BwdRowsPlan(1, 8, 1, 1), "interleaved 16 warps": BwdRowsPlan(1, 16, 1, 1)}),
    ("bf16 LayerNorm 16384 backward without bias", (_bwd_timer, 16384, 16384, torch.bfloat16, False, False),
     BwdRowsPlan(1, 16, 1, 1), {"the with-bias plan": BwdRowsPlan(1, 8, 1, 1, interleaved=False)}),
    ("fp32 LayerNorm 16384 backward: shared column blocks", (_bwd_timer, 8192, 16384, torch.float32, False, True),
     BwdSharedPlan(4096, 1, 4, 2),
     {"single pass 8 warps": BwdRowsPlan(1, 8, 1, 1), "single pass 16 warps": BwdRowsPlan(1, 16, 1, 1),
      "two phases": given_plan(4, "sm90")}),
    ("bf16 LayerNorm 1024 inference forward", (_fwd_timer, 32768, 1024, torch.bfloat16, False, True),
     FwdRowsPlan(2, 4), {"the training plan": FwdRowsPlan(2, 2)}),
    ("fp32 LayerNorm 1024 inference forward", (_fwd_timer, 32768, 1024, torch.float32, False, True),
     FwdRowsPlan(1, 2), {"the training plan": FwdRowsPlan(1, 1)}),
]  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="also write the table here (markdown)")
    args = parser.parse_args()
    lines = [f"# Single-entry norm plans, A/B ({torch.cuda.get_device_name()}, CUDA-graph GPU time, median ms)", "",
             "| entry | rows x cols | entry's plan | best alternative | alternatives | entry wins by |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for title, (timer, rows, cols, dtype, is_rms, bias), plan, alternatives in CASES:
        time = timer(rows, cols, dtype, is_rms, bias)
        ours = time(plan)
        others = {name: time(alternative) for name, alternative in alternatives.items()}
        best = min(others.values())
        text = ", ".join(f"{name} {ms:.4f}" for name, ms in others.items())
        lines.append(f"| {title} | {rows} x {cols} | {ours:.4f} | {best:.4f} | {text} | {best / ours - 1:+.1%} |")
        print(lines[-1], flush=True)
    if args.out:
        with open(args.out, "w") as file:
            file.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
