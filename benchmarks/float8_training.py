"""A linear layer's training step in float8 (tk.nn.Float8Linear, torchao's recipes) against the bf16 layer and
torchao's own Float8Linear (compiled, as torchao asks) in one run, one GPU: y, then dx and dW for an upstream
gradient, at Llama 3 8B's MLP and attention shapes with 8192 tokens (bf16 master weight, no bias).

    python benchmarks/float8_training.py --out DIR [--dry-run]

Times are CUDA-graph GPU time (triton.testing.do_bench_cudagraph). Prints a line per run and writes
``<date>-float8-training.json`` and ``.md``: the shape, provider, ms, TFLOP/s of the three GEMMs (6 M N K), and the
bf16 layer's time over this one. torchao's rows need its wheel (absent: skipped, said so). ``--dry-run`` runs
tritonkit's providers once on a small shape under the CPU interpreter and checks y, dx and dW against the float64
layer within float8's error; no times.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sweep_cli  # the benchmarks folder is no package: its own path

TOKENS = 8192
SHAPES = ((4096, 14336), (14336, 4096), (4096, 4096))  # (K, N): gate/up, down, q/o of Llama 3 8B
RECIPES = ("rowwise", "tensorwise")
DRY = {"tokens": 40, "k": 96, "n": 72}


def _inputs(tokens: int, k: int, n: int, device, dtype):
    import torch

    g = torch.Generator(device).manual_seed(k * n)
    x = torch.randn(tokens, k, device=device, dtype=dtype, generator=g).requires_grad_()
    linear = torch.nn.Linear(k, n, bias=False, device=device, dtype=dtype)
    dy = torch.randn(tokens, n, device=device, dtype=dtype, generator=g)
    return x, linear, dy


def _providers(x, linear, dy, with_peers: bool) -> dict:
    """name -> a step returning (y, dx, dW)."""
    import copy

    import torch

    import tritonkit as tk

    def step_of(layer):
        def step():
            y = layer(x)
            return (y, *torch.autograd.grad(y, (x, layer.weight), dy))

        return step

    providers = {"bf16 nn.Linear": step_of(linear)}
    for recipe in RECIPES:
        providers[f"tritonkit {recipe}"] = step_of(tk.nn.Float8Linear.from_linear(linear, recipe=recipe))
    if with_peers:
        try:
            from torchao.float8 import Float8LinearConfig, convert_to_float8_training
        except ImportError as error:
            print(f"torchao: not installed ({error}); its rows are skipped", flush=True)
        else:
            for recipe in RECIPES:
                layer = convert_to_float8_training(copy.deepcopy(linear),
                                                   config=Float8LinearConfig.from_recipe_name(recipe))  # fmt: skip
                providers[f"torchao {recipe} (compiled)"] = step_of(torch.compile(layer))
    return providers


def dry_run() -> int:
    import torch

    x, linear, dy = _inputs(DRY["tokens"], DRY["k"], DRY["n"], "cpu", torch.float32)
    x64, w64 = x.detach().double().requires_grad_(), linear.weight.detach().double().requires_grad_()
    y64 = x64 @ w64.t()
    expected = (y64, *torch.autograd.grad(y64, (x64, w64), dy.double()))
    failures = 0
    for name, step in _providers(x, linear, dy, with_peers=False).items():
        got = step()
        errors = [((g.double() - e).abs().max() / e.abs().max()).item() for g, e in zip(got, expected, strict=True)]
        ok = max(errors) < (1e-5 if name.startswith("bf16") else 0.1)  # fp32 layer; float8: ~5% seen
        failures += not ok
        print(f"{name:22} largest error over the largest value {max(errors):.1e} {'ok' if ok else 'TOO LARGE'}")
    return 1 if failures else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    args = sweep_cli.parse(parser)
    if args.dry_run:
        return dry_run()

    import torch
    import triton
    import triton.testing

    from tritonkit.bench import report

    start = time.perf_counter()
    rows = []
    for k, n in SHAPES:
        x, linear, dy = _inputs(TOKENS, k, n, "cuda", torch.bfloat16)
        times = {}
        for name, step in _providers(x, linear, dy, with_peers=True).items():
            step()  # compiles and autotunes outside the timing
            torch.cuda.synchronize()
            times[name] = triton.testing.do_bench_cudagraph(step, rep=50)
        for name, ms in times.items():
            tflops = 6 * TOKENS * n * k / ms / 1e9
            ratio = times["bf16 nn.Linear"] / ms
            rows.append({"tokens": TOKENS, "k": k, "n": n, "provider": name, "ms": ms, "tflops": tflops,
                         "bf16_over_this": ratio})  # fmt: skip
            print(f"{TOKENS} x {k} -> {n}  {name:28} {ms * 1e3:9.1f} us  {tflops:6.0f} TFLOP/s  {ratio:5.2f}x bf16",
                  flush=True)  # fmt: skip
    record = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "timing": "CUDA graph", "seconds": time.perf_counter() - start, "rows": rows}  # fmt: skip
    path = report.write_record(args.out, "float8-training", record)
    path.with_suffix(".md").write_text(summary(record))
    return 0


def summary(record: dict) -> str:
    """The record as a markdown table: per shape and provider, the step's time, TFLOP/s and the bf16 layer's time over
    it."""
    lines = [f"# A linear layer's training step in float8 ({record['device']}, {record['timing']} GPU time)", "",
             "| tokens x K -> N | provider | us | TFLOP/s of the three GEMMs | bf16 layer's time / its time |",
             "|---|---|---|---|---|"]  # fmt: skip
    for row in record["rows"]:
        lines.append(f"| {row['tokens']} x {row['k']} -> {row['n']} | {row['provider']} | {row['ms'] * 1e3:.1f} | "
                     f"{row['tflops']:.0f} | {row['bf16_over_this']:.2f}x |")  # fmt: skip
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
