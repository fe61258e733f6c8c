"""Sweep register caps per thread (ptxas's .maxnreg) on the softmax and norm kernels' weak widths.

Where a kernel holds whole rows in registers, the compiler's register count can leave one or two
programs on an SM, and then few loads are in flight while a program reduces. A cap lets more programs
share the SM, at the price of spills where the cap is below what the code needs. Timed on the kernels
alone (16384 rows; the launchers take no cap, so the kernels are launched here with each configuration's
plan values), each line against the plan in use now (softmax_plan, norm_fwd_plan, norm_bwd_plan).

    PYTHONPATH=src:benchmarks python3 benchmarks/register_caps.py [softmax] [norm-fwd] [norm-bwd] [--compile-only I/K]

(none: all; ``--compile-only``: norm_configs.compile_only). The plans carry no cap: none of these gained
more than noise (docs/kernels/softmax.md, docs/kernels/norm.md).
"""

import itertools
import sys

import torch
from norm_configs import DEVICE, ROWS_TOTAL, bwd_ms, compile_only, fwd_ms, launcher_bwd_ms, median_ms
from softmax_configs import kernel_ms, plan_now, sweep_tensors

from tritonkit._core.device import arch
from tritonkit._core.ints import cdiv
from tritonkit.ops.norm.plan import MANY_ROWS, BwdRowsPlan, FwdRowsPlan, norm_bwd_plan, norm_fwd_plan
from tritonkit.ops.row_softmax.kernels import _softmax_bwd_kernel, _softmax_fwd_kernel

REGISTERS_PER_SM = 65536


def resident_programs(regs: int, warps: int) -> int:
    """Programs of ``warps`` warps an SM holds at ``regs`` registers per thread (its register file only)."""
    return max(1, REGISTERS_PER_SM // (regs * 32 * warps))


def report(label: str, times: dict, now: float, n_bytes: int) -> None:
    best = min(times, key=times.get)
    uncapped = {c: t for c, t in times.items() if not c[-1]}
    best_uncapped = min(uncapped, key=uncapped.get) if uncapped else None
    print(f"{label} best {best} {times[best]:.4f} ms {n_bytes / times[best] / 1e6:6.0f} GB/s; now {now:.4f}; "
          f"best uncapped {best_uncapped} {uncapped.get(best_uncapped, float('nan')):.4f}", flush=True)  # fmt: skip
    for config in sorted(times, key=times.get)[1:5]:
        print(f"        {config} {times[config]:.4f}", flush=True)


def single_pass_ms(backward, x, dy, lse, out, rows, warps, regs):
    """The single-pass softmax kernel (forward, or backward), ``rows`` rows a program, registers capped."""
    n_rows, n = x.shape
    kernel, tensors = (_softmax_bwd_kernel, (dy, x, lse, out)) if backward else (_softmax_fwd_kernel, (x, out, lse))
    strides = (n,) * (len(tensors) - 1)
    return median_ms(
        lambda: kernel[(cdiv(n_rows, rows),)](
            *tensors, n_rows, n, *strides, LOG=False, GRID_LOOP=False, ROWS=rows, BLOCK_N=n, LOOP_STAGES=1,
            **({} if backward else {"STORE_LSE": True}), num_warps=warps, maxnreg=regs or None,
        )
    )  # fmt: skip


def sweep_softmax() -> None:
    """Single-pass softmax: (rows, warps, regs) at the widths below 90% of the copy bandwidth."""
    cases = (  # (width, backward, (rows, warps) choices, caps)
        (1024, False, ((1, 2), (2, 2), (2, 4), (4, 4), (1, 4)), (0, 32, 40, 48, 64)),
        (2048, False, ((1, 2), (1, 4), (2, 4), (2, 8)), (0, 32, 40, 48, 64)),
        (1024, True, ((1, 2), (1, 4), (2, 4), (4, 4)), (0, 32, 40, 48, 64)),
        (32768, False, ((1, 16), (1, 32)), (0, 32, 40, 48, 64)),
        (32768, True, ((1, 16), (1, 32)), (0, 32, 40, 48, 64)),
    )
    for n, backward, shapes, caps in cases:
        x, dy, lse, out = sweep_tensors(ROWS_TOTAL, n, torch.bfloat16)
        times = {}
        for (rows, warps), regs in itertools.product(shapes, caps):
            times[(rows, warps, regs)] = single_pass_ms(backward, x, dy, lse, out, rows, warps, regs)
        now = kernel_ms(backward, x, dy, lse, False, plan_now(n, backward, x))
        label = f"softmax {'bwd' if backward else 'fwd'} bfloat16 {n:<6} (rows, warps, regs)"
        report(label, times, now, (3 if backward else 2) * x.numel() * 2)


def sweep_norm_fwd() -> None:
    """Single-pass norm forward, bf16 at 1024 and 2048: (rows, warps, regs)."""
    for n, is_rms in itertools.product((1024, 2048), (True, False)):
        x = torch.randn(ROWS_TOTAL, n, device=DEVICE, dtype=torch.bfloat16)
        w = torch.randn(n, device=DEVICE, dtype=torch.bfloat16)
        times = {}
        for (rows, warps), regs in itertools.product(((1, 4), (2, 4), (4, 4), (2, 8)), (0, 32, 40, 48, 64)):
            times[(rows, warps, regs)] = fwd_ms(x, w, is_rms, FwdRowsPlan(rows=rows, warps=warps), regs=regs)
        now = fwd_ms(x, w, is_rms, norm_fwd_plan(n, 2, is_rms, arch(x.device)))
        report(f"norm fwd {'rms' if is_rms else 'ln '} bfloat16 {n:<6} (rows, warps, regs)", times, now,
               2 * x.numel() * 2)  # fmt: skip


def sweep_norm_bwd() -> None:
    """Single-pass norm backward: (programs per SM, warps, rows, stages, regs), each program a block of rows (as
    norm_configs.py --bwd-only). A capped configuration also runs with as many programs per SM as the cap lets the
    register file hold."""
    cases = (  # (dtype, width, RMSNorm, warps, rows, stages, caps)
        (torch.bfloat16, 1024, True, (4, 8), (1, 2), (3,), (0, 48, 64, 80, 96)),
        (torch.bfloat16, 2048, True, (4, 8), (1, 2), (3,), (0, 64, 80, 96, 128)),
        (torch.bfloat16, 4096, True, (4, 8), (1, 2), (1, 3), (0, 64, 80, 96, 128)),
        (torch.bfloat16, 16384, True, (16, 32), (1,), (1,), (0, 64, 96, 128)),
        (torch.bfloat16, 16384, False, (16, 32), (1,), (1,), (0, 64, 96, 128)),
        (torch.float32, 16384, True, (16, 32), (1,), (1,), (0, 64, 128)),
    )
    for dtype, n, is_rms, warps_choices, rows_choices, stage_choices, caps in cases:
        x = torch.randn(ROWS_TOTAL, n, device=DEVICE, dtype=dtype)
        w = torch.randn(n, device=DEVICE, dtype=dtype)
        # LayerNorm is timed with a bias (bwd_ms's has_bias), so its plan is the one with a bias
        plan = norm_bwd_plan(n, dtype.itemsize, is_rms, not is_rms, ROWS_TOTAL >= MANY_ROWS, arch(x.device))
        table_per_sm = plan.programs_per_sm if isinstance(plan, BwdRowsPlan) else 1
        times = {}
        for warps, rows, stages, regs in itertools.product(warps_choices, rows_choices, stage_choices, caps):
            if (warps == 32 and regs not in (0, 64)) or rows * n > 16384:
                continue  # 32 warps hold 64 registers a thread at most
            for per_sm in sorted({table_per_sm, resident_programs(regs, warps) if regs else 1}):
                config = (per_sm, warps, rows, stages, regs)
                swept = BwdRowsPlan(programs_per_sm=per_sm, warps=warps, rows=rows, stages=stages, interleaved=False)
                times[config] = bwd_ms(x, w, is_rms, swept, not is_rms, regs)
        # whole rows: the kernel alone; the wide path: the whole launcher (two phases and the partial sums)
        now = bwd_ms(x, w, is_rms, plan, not is_rms) if isinstance(plan, BwdRowsPlan) else launcher_bwd_ms(x, w, is_rms)
        label = f"norm bwd {'rms' if is_rms else 'ln '} {str(dtype)[6:]} {n:<6} (per_sm, warps, rows, stages, regs)"
        report(label, times, now, 3 * x.numel() * dtype.itemsize)


def main():
    parts = {"softmax": sweep_softmax, "norm-fwd": sweep_norm_fwd, "norm-bwd": sweep_norm_bwd}
    wanted = [a for a in sys.argv[1:] if a in parts] or list(parts)
    compile_only(sys.argv)
    print(f"# register_caps.py {' '.join(wanted)} on the {torch.cuda.get_device_name()}", flush=True)
    for name in wanted:
        parts[name]()


if __name__ == "__main__":
    main()
