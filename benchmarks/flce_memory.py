"""Where fused linear cross-entropy's peak memory goes, on a GPU: held and peak MiB after the forward
and after the backward at 8192 tokens, hidden 4096, vocab 128256 (bf16), and the extra memory of one
fp32-accumulating chunk GEMM (tritonkit._core.cublas.addmm_into_fp32, the dW step of the fused op's chunk loop in
tritonkit/ops/loss/launch.py). Findings: docs/kernels/loss.md.

    PYTHONPATH=src python3 benchmarks/flce_memory.py
"""

import torch

import tritonkit as tk
from tritonkit._core.cublas import addmm_into_fp32

MIB = 2**20


def report(label, base):
    torch.cuda.synchronize()
    held = (torch.cuda.memory_allocated() - base) / MIB
    peak = (torch.cuda.max_memory_allocated() - base) / MIB
    print(f"{label:<28} held {held:8.1f} MiB   peak {peak:8.1f} MiB")
    torch.cuda.reset_peak_memory_stats()


def main():
    print("torch", torch.__version__, "| addmm has out_dtype:", hasattr(torch.ops.aten.addmm, "dtype_out"))
    tokens, hidden_size, vocab = 8192, 4096, 128256
    hidden = torch.randn(tokens, hidden_size, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    weight = (0.02 * torch.randn(vocab, hidden_size, device="cuda")).to(torch.bfloat16).requires_grad_()
    target = torch.randint(0, vocab, (tokens,), device="cuda")
    for attempt in range(2):  # the second round runs with weight.grad already held, as a training loop does
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        loss = tk.ops.fused_linear_cross_entropy(hidden, weight, target)
        report(f"round {attempt}: forward", base)
        loss.backward()
        report(f"round {attempt}: backward", base)
        del loss
    acc = torch.zeros(vocab, hidden_size, device="cuda")
    a = torch.randn(vocab, 745, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(745, hidden_size, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    addmm_into_fp32(acc, a, b)
    report("one chunk into the fp32 dW", base)


if __name__ == "__main__":
    main()
