"""Where one registry case's fwd+bwd step spends its time, host and device: torch.profiler's top ops.

`PYTHONPATH=src python3 benchmarks/profile_case.py lora_linear '{"m": 16, "k": 4096, "n": 4096, "r": 16}'`
(bf16 on CUDA; the case as JSON, as in the spec's bench_cases). With ``--python``: instead, the wall
time of a step back to back for tritonkit and the torch reference, and cProfile's top Python functions
of tritonkit's step (where a host-bound step's time goes).
"""

import cProfile
import pstats
import sys

import torch
from host_overhead import per_call_us  # the sibling script's back-to-back timing
from ncu_probe import parse_case  # the spec's case from JSON
from torch.profiler import ProfilerActivity, profile

from tritonkit import catalog
from tritonkit.bench.harness import make_step


def python_profile(spec, case):
    def fresh_step(fn):
        generator = torch.Generator("cuda").manual_seed(0)
        inputs = spec.make_inputs(case, torch.device("cuda"), torch.bfloat16, generator)
        return make_step(fn, inputs, "fwd+bwd")

    ours, theirs = fresh_step(spec.fn), fresh_step(spec.reference)
    print(f"step wall: tritonkit {per_call_us(ours, 500):.1f} us, torch {per_call_us(theirs, 500):.1f} us")
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(300):
        ours()
    torch.cuda.synchronize()
    profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(20)


def main():
    spec = catalog.get(sys.argv[1])
    case = parse_case(spec, sys.argv[2])
    if "--python" in sys.argv:
        python_profile(spec, case)
        return
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
