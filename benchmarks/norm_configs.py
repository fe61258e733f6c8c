"""Sweep the norm kernels' launch configurations on a GPU and print the fastest per width and dtype.

The data behind ``norm_launch_plan``: forward rows per program and warps, backward programs per SM
and warps, timed on the kernels alone (16384 rows). `PYTHONPATH=src python3 benchmarks/norm_configs.py`.
"""

import importlib
import itertools

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


def bwd_ms(x, w, is_rms, per_sm, warps):
    n_rows, n = x.shape
    dy, dx = torch.randn_like(x), torch.empty_like(x)
    mean, rstd = torch.zeros(n_rows, device="cuda"), torch.ones(n_rows, device="cuda")
    programs = per_sm * torch.cuda.get_device_properties(0).multi_processor_count
    part = torch.empty(programs, n, device="cuda")
    block = triton.next_power_of_2(n)

    def run():
        norm._norm_bwd_kernel[(programs,)](
            dy, dy, x, x, w, mean, rstd, dx, dx, part, part, n_rows, n, triton.cdiv(n_rows, programs),
            n, 0, n, 0, n, 0, 0.0,
            IS_RMS=is_rms, HAS_RES=False, HAS_W=True, HAS_B=False, HAS_DH=False, STORE_DRES=False,
            SINGLE_PASS=True, BLOCK_N=block, num_warps=warps,
        )  # fmt: skip

    return triton.testing.do_bench(run, return_mode="median")


def main():
    print("kind  norm  dtype     n      best config            ms      GB/s   (worst ms)")
    for dtype, n, is_rms in itertools.product((torch.bfloat16, torch.float32), (1024, 2048, 4096, 8192, 16384),
                                              (True, False)):  # fmt: skip
        x = torch.randn(ROWS_TOTAL, n, device="cuda", dtype=dtype)
        w = torch.randn(n, device="cuda", dtype=dtype)
        label = f"{'rms' if is_rms else 'ln':<5} {str(dtype)[6:]:<9} {n:<6}"
        fwd = {}
        for rows, warps in itertools.product((1, 2, 4, 8, 16), (4, 8, 16)):
            if rows * triton.next_power_of_2(n) <= 32768:
                fwd[(rows, warps)] = fwd_ms(x, w, is_rms, rows, warps)
        best = min(fwd, key=fwd.get)
        gbps = 2 * x.numel() * x.element_size() / fwd[best] / 1e6
        print(
            f"fwd   {label} rows={best[0]:<2} warps={best[1]:<2}        {fwd[best]:.4f}  {gbps:6.0f} "
            f"({max(fwd.values()):.4f})"
        )
        bwd = {}
        for per_sm, warps in itertools.product((1, 2, 4, 8, 16), (4, 8, 16)):
            bwd[(per_sm, warps)] = bwd_ms(x, w, is_rms, per_sm, warps)
        best = min(bwd, key=bwd.get)
        gbps = 3 * x.numel() * x.element_size() / bwd[best] / 1e6
        print(
            f"bwd   {label} per_sm={best[0]:<2} warps={best[1]:<2}     {bwd[best]:.4f}  {gbps:6.0f} "
            f"({max(bwd.values()):.4f})"
        )


if __name__ == "__main__":
    main()
