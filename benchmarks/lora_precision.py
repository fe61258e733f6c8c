"""Where LoRA's dA loses precision on a GPU: eager, compiled, and the cuBLAS variants, against float64.

The Llama-sized bf16 case of tests/test_lora.py (4096 tokens, 4096 x 4096, r 16): dA = scale (dy B)^T x
computed by tk.ops.lora_linear eagerly and under torch.compile, and by hand with a 16-bit-result GEMM
(the library's first version) with and without torch's reduced-precision split-K reductions. What it found is in
docs/kernels/lora.md.

    PYTHONPATH=src python3 benchmarks/lora_precision.py
"""

import torch

import tritonkit as tk
from tritonkit import catalog, testing


def report(label, got, ref, tol):
    c = testing.compare(got, ref, tol)
    line = f"{label:<44} off {c.n_bad:>4}/{c.numel}  max abs {c.max_abs_err:.3g}  max rel {c.max_rel_err:.3g}"
    if c.first_bad is not None:
        i = c.first_bad
        line += f"  first at {i}: got {float(got[i]):.5g}, exact {float(ref[i]):.5g}"
    print(line, flush=True)


def main():
    spec = catalog.get("lora_linear")
    case = spec.parse_case({"lead": (4, 1024), "k": 4096, "n": 4096, "r": 16, "bias": True, "frozen": True})
    dtype, device = torch.bfloat16, "cuda"
    inputs = spec.make_inputs(case, device, dtype, torch.Generator(device).manual_seed(1234))
    x, weight, lora_a, lora_b, scale = inputs.args
    bias = inputs.kwargs["bias"]
    dy = torch.randn(*x.shape[:-1], weight.shape[0], device=device, dtype=dtype)
    tol = spec.tolerance_for(case, dtype)

    rows, dy_rows = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])
    dyb64 = dy_rows.double() @ lora_b.double()
    exact = scale * dyb64.t() @ rows.double()
    print(f"dA magnitude: median |dA| {exact.abs().median():.4g}, max {exact.abs().max():.4g}")

    def grad_of(fn):
        leaves = [t.detach().requires_grad_(True) for t in (x, lora_a, lora_b)]
        y = fn(leaves[0], weight, leaves[1], leaves[2], scale, bias)
        return torch.autograd.grad(y, leaves[1], dy)[0]

    report("eager tk.ops.lora_linear", grad_of(tk.ops.lora_linear), exact, tol)
    torch._dynamo.reset()
    report("torch.compile(tk.ops.lora_linear)", grad_of(torch.compile(tk.ops.lora_linear, fullgraph=True)), exact, tol)

    r = lora_a.shape[0]
    dyb = dyb64.float()  # what the dx kernel saves, to fp32 precision
    hi = dyb.to(dtype)
    both = torch.cat([hi, (dyb - hi.float()).to(dtype)], dim=1)
    for reduced in (True, False):
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = reduced
        product = (both.t() @ rows).float()
        got = (scale * (product[:r] + product[r:])).to(dtype)
        report(f"bf16-result GEMM, reduced-precision split-K={reduced}", got, exact, tol)
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = True
    product = torch.mm(both.t(), rows, out_dtype=torch.float32)
    report("fp32-result GEMM (out_dtype)", (scale * (product[:r] + product[r:])).to(dtype), exact, tol)


if __name__ == "__main__":
    main()
