"""Sweep the norm kernels' launch configurations on a GPU and print the fastest per width and dtype.

The data behind ``norm_launch_plan``: forward rows per program and warps, backward programs per SM
and warps and rows per loop iteration, timed on the kernels alone (16384 rows).
`PYTHONPATH=src python3 benchmarks/norm_configs.py [WIDTH ...] [--bwd-only] [--layer-norm] [--wide]` (``--bwd-only``:
the backward alone, over a narrower grid, of RMSNorm, or with ``--layer-norm`` of LayerNorm with a bias,
whose dbias accumulator takes registers that RMSNorm's table does not account for; ``--wide``: the
two-phase backward of wide rows, whole launcher, over ``WIDE_BWD_TILE`` choices).
"""

import importlib
import itertools
import sys

import torch
import triton
import triton.testing

norm = importlib.import_module("tritonkit.ops.norm")
ROWS_TOTAL = 16384


def fwd_ms(x, w, is_rms, rows, warps):
    n_rows, n = x.shape
    y, rstd = torch.empty_like(x), torch.empty(n_rows, device="cuda")
    mean = torch.empty(n_rows, device="cuda")
    block = triton.next_power_of_2(n)

    def run():
        norm._norm_fwd_kernel[(triton.cdiv(n_rows, rows),)](
            x, x, w, x, y, y, mean, rstd, n_rows, n, n, 0, n, 0, 1e-6, 0.0,
            IS_RMS=is_rms, HAS_RES=False, HAS_W=True, HAS_B=False, STORE_H=False, SINGLE_PASS=True,
            ROWS=rows, BLOCK_N=block, num_warps=warps,
        )  # fmt: skip

    return triton.testing.do_bench(run, return_mode="median")


def bwd_ms(x, w, is_rms, per_sm, warps, rows, has_bias=False, stages=3):
    n_rows, n = x.shape
    dy, dx = torch.randn_like(x), torch.empty_like(x)
    mean, rstd = torch.zeros(n_rows, device="cuda"), torch.ones(n_rows, device="cuda")
    programs = per_sm * torch.cuda.get_device_properties(0).multi_processor_count
    part = torch.empty(programs, n, device="cuda")
    block = triton.next_power_of_2(n)

    def run():
        norm._norm_bwd_kernel[(1, programs)](
            dy, dy, x, x, w, mean, rstd, rstd, rstd, dx, dx, part, part, n_rows, n, triton.cdiv(n_rows, programs),
            n, 0, n, 0, n, 0, 0.0,
            IS_RMS=is_rms, HAS_RES=False, HAS_W=True, HAS_B=has_bias, HAS_DH=False, STORE_DRES=False,
            ROW_TERMS_GIVEN=False, ROWS=rows, BLOCK_N=block, num_warps=warps, num_stages=stages,
        )  # fmt: skip

    return triton.testing.do_bench(run, return_mode="median")


def print_fwd(x, w, is_rms, label):
    fwd = {}
    for rows, warps in itertools.product((1, 2, 4, 8, 16), (4, 8, 16)):
        if rows * triton.next_power_of_2(x.shape[1]) <= 32768:
            fwd[(rows, warps)] = fwd_ms(x, w, is_rms, rows, warps)
    best = min(fwd, key=fwd.get)
    gbps = 2 * x.numel() * x.element_size() / fwd[best] / 1e6
    print(f"fwd   {label} rows={best[0]:<2} warps={best[1]:<2}        {fwd[best]:.4f}  {gbps:6.0f} "
          f"({max(fwd.values()):.4f})")  # fmt: skip


def print_bwd(x, w, is_rms, label, per_sm_choices, has_bias=False):
    bwd = {}
    for per_sm, warps, rows in itertools.product(per_sm_choices, (4, 8, 16), (1, 2, 4)):
        if rows * triton.next_power_of_2(x.shape[1]) <= 16384:
            bwd[(per_sm, warps, rows)] = bwd_ms(x, w, is_rms, per_sm, warps, rows, has_bias)
    best = min(bwd, key=bwd.get)
    gbps = 3 * x.numel() * x.element_size() / bwd[best] / 1e6
    print(f"bwd   {label} per_sm={best[0]:<2} warps={best[1]:<2} rows={best[2]} {bwd[best]:.4f}  {gbps:6.0f} "
          f"({max(bwd.values()):.4f})")  # fmt: skip
    for config in sorted(bwd, key=bwd.get)[:5]:  # the runners-up, to see how flat the optimum is
        print(f"        per_sm={config[0]:<2} warps={config[1]:<2} rows={config[2]} {bwd[config]:.4f}")
    for stages in (1, 2, 4):  # the best config at other pipeline depths (the launches use the default, 3)
        print(f"        stages={stages} {bwd_ms(x, w, is_rms, *best, has_bias=has_bias, stages=stages):.4f}")


def wide_bwd_ms(x, w, is_rms, tile):
    """The whole backward launcher (both phases and the dweight/dbias sum) with ``tile`` as WIDE_BWD_TILE."""
    n_rows = x.shape[0]
    dy = torch.randn_like(x)
    mean, rstd = torch.zeros(n_rows, device="cuda"), torch.ones(n_rows, device="cuda")
    saved = norm.WIDE_BWD_TILE
    norm.WIDE_BWD_TILE = {x.element_size(): tile}
    try:
        return triton.testing.do_bench(
            lambda: norm.norm_bwd_launch(dy, None, x, w, None, None if is_rms else mean, rstd, 0.0, is_rms, not is_rms),
            return_mode="median",
        )
    finally:
        norm.WIDE_BWD_TILE = saved


def print_wide(widths):
    """Rows that take the wide backward: bf16 LayerNorm and fp32 at 16384, everything wider."""
    for dtype, n, is_rms in itertools.product((torch.bfloat16, torch.float32), widths, (True, False)):
        if norm.norm_launch_plan(n, dtype.itemsize, is_rms).bwd_single_pass:
            continue
        rows = max(1, ROWS_TOTAL * 16384 // n)  # the same bytes as 16384 x 16384
        x = torch.randn(rows, n, device="cuda", dtype=dtype)
        w = torch.randn(n, device="cuda", dtype=dtype)
        times = {}
        for tile in itertools.product((1024, 2048), (2, 4), (4, 8), (4, 8)):
            times[tile] = wide_bwd_ms(x, w, is_rms, tile)
        best = min(times, key=times.get)
        gbps = 3 * x.numel() * x.element_size() / times[best] / 1e6
        label = f"{'rms' if is_rms else 'ln':<5} {str(dtype)[6:]:<9} {n:<6}"
        print(
            f"wide  {label} (block, rows, warps, per_sm)={best} {times[best]:.4f}  {gbps:6.0f} "
            f"(now {times.get(norm.WIDE_BWD_TILE[dtype.itemsize], float('nan')):.4f}, worst {max(times.values()):.4f})"
        )


def main():
    if "--wide" in sys.argv:
        print_wide([int(a) for a in sys.argv[1:] if a.isdigit()] or [16384, 65536, 131072])
        return
    print("kind  norm  dtype     n      best config            ms      GB/s   (worst ms)")
    widths = [int(a) for a in sys.argv[1:] if a.isdigit()] or [1024, 2048, 4096, 8192, 16384]
    bwd_only = "--bwd-only" in sys.argv
    layer_norm = "--layer-norm" in sys.argv
    norms = ((not layer_norm),) if bwd_only else (True, False)
    for dtype, n, is_rms in itertools.product((torch.bfloat16, torch.float32), widths, norms):
        x = torch.randn(ROWS_TOTAL, n, device="cuda", dtype=dtype)
        w = torch.randn(n, device="cuda", dtype=dtype)
        label = f"{'rms' if is_rms else 'ln':<5} {str(dtype)[6:]:<9} {n:<6}"
        if not bwd_only:
            print_fwd(x, w, is_rms, label)
        print_bwd(x, w, is_rms, label, (2, 4, 8) if bwd_only else (1, 2, 4, 8, 16), has_bias=not is_rms)


if __name__ == "__main__":
    main()
