"""Flash attention's two grid orders side by side: the heads fastest, or a head's blocks together.

    python3 benchmarks/attention_grid_order.py > benchmarks/results/<device>/<date>-attention-grid-order.txt

For each shape (bf16), the forward and the backward launchers timed with ``launch._heads_fastest`` forced each way
(triton.testing.do_bench medians of eager calls, ms), and the order the launcher picks by itself ("default": whether
every head's K and V fit in L2). The shapes span K and V from 8 MB (the 1B training step's attention) to 256 MB.
"""

from __future__ import annotations

import functools
import math

import torch
import triton.testing

from tritonkit.ops.flash_attention import launch

# (batch, query heads, key heads, tokens, head dim, causal)
SHAPES = [
    (1, 32, 8, 4096, 64, True), (4, 32, 32, 4096, 128, False), (4, 32, 32, 4096, 128, True),
    (4, 32, 8, 4096, 128, True), (2, 16, 16, 8192, 64, False), (2, 32, 8, 4096, 128, True),
    (1, 32, 32, 4096, 128, True),
]  # fmt: skip


def main() -> None:
    print(f"# Flash attention grid order on {torch.cuda.get_device_name()}: eager do_bench medians, ms")
    chosen = launch._heads_fastest
    for b, h, hk, n, d, causal in SHAPES:
        q = torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(b, hk, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        grad = torch.randn_like(q)
        common = (None, None, n, n, 1, 1 / math.sqrt(d), *launch._check_window("order", (-1, -1), causal), 0.0)
        row = [f"B{b} H{h}:{hk} N{n} d{d} causal={causal} KV {2 * k.numel() * 2 / 2**20:.0f} MB "
               f"default={chosen(k, v)}"]  # fmt: skip
        try:
            for order in (True, False):
                launch._heads_fastest = lambda k, v, order=order: order
                out, lse = launch.attention_fwd(q, k, v, *common)
                fwd = triton.testing.do_bench(functools.partial(launch.attention_fwd, q, k, v, *common))
                bwd = triton.testing.do_bench(functools.partial(launch.attention_bwd, grad, q, k, v, out, lse, *common))
                row.append(f"heads_fastest={order}: fwd {fwd:.3f} bwd {bwd:.3f} ms")
        finally:
            launch._heads_fastest = chosen
        print(" | ".join(row), flush=True)


if __name__ == "__main__":
    main()
