"""LoRA's two paths against torch's eager LoRA and torch.compile of it, forward and backward, one GPU: the fused Triton
kernel and the cuBLAS GEMMs, each forced through LoraPlan, at TOKENS from 16 to 8192 (K 4096 -> N 4096, r 16, scale
2, a frozen base weight, bf16), beside the default plan, the public op (autograd) and the peers, all in one run, to
place FUSED_MAX_TOKENS and to see where lora_linear stands against eager at every size.

    python benchmarks/lora_paths.py --out DIR [--eager] [--dry-run]

Each provider runs one step: y, then dx, dA and dB for an upstream gradient (the base weight is frozen: no dW).
Times are CUDA-graph GPU time (triton.testing.do_bench_cudagraph); with ``--eager`` each is also timed as eager
calls (triton.testing.do_bench), where the host's launches count. Prints a line per run and writes
``<date>-lora-paths.json``: tokens, provider, ms, and torch eager's time over this one (in the same timing).
``--dry-run`` runs every provider once on small shapes under the CPU interpreter and checks y, dx, dA and dB
against the float64 reference; no times.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sweep_cli  # the benchmarks folder is no package: its own path

TOKENS = (16, 64, 256, 1024, 2048, 4096, 8192)
K, N, R, SCALE = 4096, 4096, 16, 2.0
DRY = {"tokens": (5, 40), "k": 24, "n": 12, "r": 3}
ALWAYS_FUSED = 1 << 30  # a fused limit no call reaches


def _inputs(tokens: int, k: int, n: int, r: int, device, dtype):
    import torch

    g = torch.Generator(device).manual_seed(tokens)
    x = torch.randn(tokens, k, device=device, dtype=dtype, generator=g)
    weight = torch.randn(n, k, device=device, dtype=dtype, generator=g) * k**-0.5
    lora_a = torch.randn(r, k, device=device, dtype=dtype, generator=g) * k**-0.5
    lora_b = torch.randn(n, r, device=device, dtype=dtype, generator=g) * r**-0.5
    dy = torch.randn(tokens, n, device=device, dtype=dtype, generator=g)
    return x, weight, lora_a, lora_b, dy


def _providers(x, weight, lora_a, lora_b, dy, compile_peer: bool) -> dict:
    """name -> a step returning (y, dx, dA, dB)."""
    import torch
    import torch.nn.functional as F

    import tritonkit as tk
    from tritonkit.ops.lora.launch import lora_bwd, lora_fwd
    from tritonkit.ops.lora.plan import LoraPlan

    def launcher(plan):
        def step():
            y, xa = lora_fwd(x, weight, lora_a, lora_b, None, SCALE, plan=plan)
            dx, _, da, db, _ = lora_bwd(dy, x, weight, lora_a, lora_b, xa, SCALE, True, False, True, True, False,
                                        plan=plan)  # fmt: skip
            return y, dx, da, db

        return step

    leaves = [t.detach().requires_grad_(True) for t in (x, lora_a, lora_b)]

    def eager_lora(x, lora_a, lora_b):
        return F.linear(x, weight) + SCALE * F.linear(F.linear(x, lora_a), lora_b)

    def public_op(x, lora_a, lora_b):
        return tk.ops.lora_linear(x, weight, lora_a, lora_b, SCALE)

    def autograd_step(fn):
        def step():
            y = fn(*leaves)
            return (y, *torch.autograd.grad(y, leaves, dy))

        return step

    providers = {
        "fused kernel": launcher(LoraPlan(fused_max_tokens=ALWAYS_FUSED)),
        "cuBLAS GEMMs": launcher(LoraPlan(fused_max_tokens=0)),
        "tritonkit (plan)": launcher(None),
        "tritonkit public op": autograd_step(public_op),
        "torch eager": autograd_step(eager_lora),
    }
    if compile_peer:
        providers["torch.compile"] = autograd_step(torch.compile(eager_lora))
    return providers


def dry_run() -> int:
    """Every provider once under the interpreter at two token counts, y, dx, dA and dB against the float64
    reference (each path forced by its plan, so both run whatever the default limit)."""
    import torch

    failures = 0
    for tokens in DRY["tokens"]:
        x, weight, lora_a, lora_b, dy = _inputs(tokens, DRY["k"], DRY["n"], DRY["r"], "cpu", torch.float32)
        xd, wd, ad, bd, dyd = (t.double() for t in (x, weight, lora_a, lora_b, dy))
        expected = (xd @ wd.t() + SCALE * (xd @ ad.t()) @ bd.t(), dyd @ wd + SCALE * (dyd @ bd) @ ad,
                    SCALE * (dyd @ bd).t() @ xd, SCALE * dyd.t() @ (xd @ ad.t()))  # fmt: skip
        for name, step in _providers(x, weight, lora_a, lora_b, dy, compile_peer=False).items():
            got = step()
            ok = all(torch.allclose(g.double(), e, rtol=1e-4, atol=1e-4) for g, e in zip(got, expected, strict=True))
            failures += not ok
            print(f"tokens {tokens:5} {name:22} {'matches the reference' if ok else 'DIFFERS'}", flush=True)
    return 1 if failures else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--eager", action="store_true", help="also time eager calls (host launches included)")
    args = sweep_cli.parse(parser)
    if args.dry_run:
        return dry_run()

    import torch
    import triton
    import triton.testing

    from tritonkit.bench import report

    start = time.perf_counter()
    rows = []
    timings = {"graph": lambda fn: triton.testing.do_bench_cudagraph(fn, rep=20)}
    if args.eager:
        timings["eager"] = lambda fn: triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median")
    for tokens in TOKENS:
        inputs = _inputs(tokens, K, N, R, "cuda", torch.bfloat16)
        providers = _providers(*inputs, compile_peer=True)
        for timing, bench in timings.items():
            times = {}
            for name, step in providers.items():
                step()  # compiles and autotunes outside the timing
                torch.cuda.synchronize()
                times[name] = bench(step)
            for name, ms in times.items():
                ratio = times["torch eager"] / ms
                rows.append({"tokens": tokens, "timing": timing, "provider": name, "ms": ms, "eager_over_this": ratio})
                print(f"tokens {tokens:5} {timing:5} {name:22} {ms * 1e3:9.1f} us  {ratio:5.2f}x torch eager",
                      flush=True)  # fmt: skip
    record = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "shape": {"k": K, "n": N, "r": R, "scale": SCALE}, "dtype": "bfloat16",
              "seconds": time.perf_counter() - start, "rows": rows}  # fmt: skip
    report.write_record(args.out, "lora-paths", record)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
