"""Hardware counters for registry cases: run each case's step once inside a CUDA profiler range, for
Nsight Compute to read (DRAM bytes, L2 hit rate, occupancy, stall reasons, pipe use).

    ncu --profile-from-start off --clock-control none --section SpeedOfLight ... \\
        python3 benchmarks/ncu_probe.py 'softmax fwd bfloat16 {"rows": 8192, "n": 65536}' ...

Each argument is ``NAME MODE DTYPE CASE_JSON`` (MODE fwd or bwd; bwd profiles the backward alone). For the
copy a memory-bound kernel of the same size is held to, name the registry's ``copy`` (torch's same-dtype
copy is a cudaMemcpy, which Nsight Compute does not profile as a kernel). The cases run in the order
given; the printed list names the kernels in it.
"""

import json
import sys

import torch

from tritonkit import catalog
from tritonkit.bench.harness import make_step


def parse_case(spec, text: str):
    """The spec's case from JSON (a list, as a shape, becomes a tuple)."""
    values = json.loads(text)
    return spec.parse_case({key: tuple(v) if isinstance(v, list) else v for key, v in values.items()})


def parse(argument: str):
    name, mode, dtype, case = argument.split(maxsplit=3)
    spec = catalog.get(name)
    inputs = spec.make_inputs(parse_case(spec, case), torch.device("cuda"), getattr(torch, dtype),
                              torch.Generator("cuda").manual_seed(0))  # fmt: skip
    return argument, make_step(spec.fn, inputs, mode)


def main():
    steps = [parse(argument) for argument in sys.argv[1:]]
    for _, step in steps:  # compile and warm outside the profiled ranges
        step()
        step()
    torch.cuda.synchronize()
    for label, step in steps:
        print("profiling:", label, flush=True)
        torch.cuda.profiler.start()
        step()
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()
