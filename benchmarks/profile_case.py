"""Where one registry case's fwd+bwd step spends its time, host and device: torch.profiler's top ops.

`PYTHONPATH=src python3 benchmarks/profile_case.py lora_linear '{"m": 16, "k": 4096, "n": 4096, "r": 16}'`
(bf16 on CUDA; the case as JSON, as in the spec's bench_cases).
"""

import json
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from tritonkit import registry
from tritonkit.bench.harness import make_step


def main():
    spec, case = registry.get(sys.argv[1]), json.loads(sys.argv[2])
    inputs = spec.make_inputs(case, torch.device("cuda"), torch.bfloat16, torch.Generator("cuda").manual_seed(0))
    step = make_step(spec.fn, inputs, "fwd+bwd")
    for _ in range(5):  # compile, autotune
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            step()
        torch.cuda.synchronize()
    averages = prof.key_averages()
    print(averages.table(sort_by="cpu_time_total", row_limit=15))
    print(averages.table(sort_by="cuda_time_total", row_limit=10))


if __name__ == "__main__":
    main()
