"""Which side of a bf16 GeGLU MLP comparison is further from float64: tritonkit's geglu or transformers' LlamaMLP.

    TRITON_INTERPRET=1 python3 benchmarks/geglu_parity.py [--device cpu|cuda] [--out FILE]

Liger-Kernel's test compares its GeGLU MLP with a bf16 LlamaMLP (gelu tanh) at atol = rtol = 1e-2. Both sides share
the bf16 projections here (the same gate and up, the same down projection), so what differs is the activation step:
tritonkit computes gelu_tanh(gate) * up in fp32 and rounds once; torch's eager LlamaMLP rounds gelu_tanh(gate) to bf16,
then multiplies by up in bf16 and rounds again. Each side's activation and MLP output are compared with float64 from
the same bf16 inputs (the activation exactly, the down projection in float64). Prints a table; writes it with --out.
"""

from __future__ import annotations

import argparse
import sys

import torch

import tritonkit as tk

SHAPES = ((2, 2048, 2048, 4096), (9, 41, 341, 4231))  # (batch, tokens, hidden, intermediate): the peer test's


def _gelu_tanh64(x):
    return 0.5 * x * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (x + 0.044715 * x**3)))


def _stats(ours, exact):
    """Max and mean absolute error, and the share of elements off by more than 1e-2 absolute + 1e-2 relative."""
    error = (ours.double() - exact).abs()
    beyond = (error > 1e-2 + 1e-2 * exact.abs()).double().mean()
    return float(error.max()), float(error.mean()), float(beyond)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out")
    args = parser.parse_args()
    generator = torch.Generator(args.device).manual_seed(0)
    lines = [f"# bf16 GeGLU MLP against float64 ({args.device}; gate, up and down projections shared)", "",
             "| shape (B, T, H -> I) | output | side | max abs err | mean abs err | share beyond 1e-2 + 1e-2 rel |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for batch, tokens, hidden, inter in SHAPES:

        def randn(*shape, std=1.0):
            return (std * torch.randn(shape, generator=generator, device=args.device)).to(torch.bfloat16)

        x = randn(batch, tokens, hidden)
        w_gate, w_up = randn(inter, hidden, std=hidden**-0.5), randn(inter, hidden, std=hidden**-0.5)
        w_down = randn(hidden, inter, std=inter**-0.5)
        gate, up = x @ w_gate.t(), x @ w_up.t()  # bf16 projections, shared by both sides
        exact_h = _gelu_tanh64(gate.double()) * up.double()
        exact_y = exact_h @ w_down.double().t()
        sides = {
            "tritonkit geglu": tk.ops.geglu(gate, up, approximate="tanh"),
            "LlamaMLP (torch eager)": torch.nn.functional.gelu(gate, approximate="tanh") * up,
        }
        for name, h in sides.items():
            shape = f"({batch}, {tokens}, {hidden} -> {inter})"
            for output, ours, exact in (("activation", h, exact_h), ("MLP output", h @ w_down.t(), exact_y)):
                max_err, mean_err, beyond = _stats(ours, exact)
                lines.append(f"| {shape} | {output} | {name} | {max_err:.3e} | {mean_err:.3e} | {beyond:.2e} |")
                print(lines[-1], flush=True)
    if args.out:
        with open(args.out, "w") as file:
            file.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
