"""When to use Triton, torch.compile or CUDA.

Start with torch. When a profile shows a chain of elementwise or reduction ops that each read and
write the whole tensor, try torch.compile first: it fuses such chains by generating Triton kernels
itself, with no kernel code to maintain. Write a Triton kernel when

* the fusion you need is one the compiler does not find (a reduction followed by an elementwise
  epilogue over another tensor, an online softmax inside attention, a custom backward that
  recomputes instead of storing);
* you need control over tiling, data layout or precision (which dtype to accumulate in, what to
  save for the backward);
* the op must stay traceable and CUDA-graph capturable inside a larger torch.compile'd model (wrap
  the kernel as a torch custom op, as tritonkit does).

Go to CUDA (or CUTLASS, ThunderKittens) when Triton's block model does not reach: warp-level
specialisation, explicit shared-memory pipelines across thread blocks, hardware features Triton
does not expose yet. That is a small share of kernels, and the most expensive to maintain.

The reason fusion pays is memory traffic. This lesson computes relu(x + y) eagerly in two torch ops
and fused in one Triton kernel (tk.ops.add_relu), checks they agree, and counts the bytes each moves
with the registry's cost model: the fused kernel moves 3 elements per output, eager torch 5.
"""

from __future__ import annotations

import torch


def run(out_dir: str | None = None) -> None:
    import tritonkit as tk
    from tritonkit.catalog import get

    device = "cuda" if torch.cuda.is_available() and not tk.debug.interpreting() else "cpu"
    n = 1000
    x = torch.randn(n, device=device)
    y = torch.randn(n, device=device)
    fused = tk.ops.add_relu(x, y)
    eager = torch.relu(x + y)
    torch.testing.assert_close(fused, eager)
    print(f"tk.ops.add_relu agrees with torch.relu(x + y) on {n} elements ({device}).")
    fused_spec, add_spec = get("add_relu"), get("add")
    fused_bytes = fused_spec.bytes_moved(fused_spec.parse_case({"n": n}), torch.float32)
    eager_bytes = add_spec.bytes_moved(add_spec.parse_case({"n": n}), torch.float32) + 2 * n * 4  # relu: n in, n out
    print(f"bytes moved, fused kernel: {fused_bytes}; eager torch (add, then relu): {eager_bytes}")
    print(f"For a memory-bound op, time follows bytes: fusion saves {1 - fused_bytes / eager_bytes:.0%} here.")


if __name__ == "__main__":
    run()
