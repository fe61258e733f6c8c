"""The W8A16 split-K GEMV's sm_90 machine code, without a GPU: scaled_linear's weight-only launches at a few rows
(int8 weights with row scales, K 4096, N 4096 and 14336) recorded as a GPU launch would specialise them
(tests/compile_for_hopper.py's Recorder, 132 multiprocessors, this Hopper plan), compiled for Hopper; prints each
K loop's SASS by opcode and its instructions per weight value a step reads (per thread: the loop's count times the
threads of a program over the step's block_n x block_k values), with decode_sass.py's report.

    python benchmarks/gemv_sass.py [ROWS ...]     # default: 1 4 16

A proxy for the GEMV's cost per weight byte where timing needs a GPU (docs/kernels/gemm.md: the one-row loop's 6.3
instructions a value fell to 4.6 with its codes read as words, 65 -> 72% of the copy on the H200).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode_sass import compile_sass, report_loops  # the benchmarks folder is no package: its own path

K = 4096
SHAPES = (4096, 14336)  # N: the narrow outputs (GEMV_NARROW at one row) and the wide


def main(argv=None) -> int:
    os.environ.pop("TRITON_INTERPRET", None)  # compile, not interpret
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    import torch
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import JITFunction

    import compile_for_hopper as hopper
    from tritonkit._core import checks
    from tritonkit.ops.gemm import launch

    rows = [int(word) for word in (argv if argv is not None else sys.argv[1:])] or [1, 4, 16]
    checks.kernels_interpreted = lambda: True  # CPU tensors pass the device check; the launches are only recorded
    launch.kernels_interpreted = lambda: False  # the GPU's code paths
    launch.arch, launch.sm_count = (lambda device: "sm90"), (lambda device: 132)
    for m in rows:
        for n in SHAPES:
            recorder = hopper.Recorder()
            JITFunction.run, Autotuner.run = hopper._recording(recorder)
            x, w = torch.ones(m, K, dtype=torch.bfloat16), torch.ones(n, K).to(torch.int8)
            launch.scaled_linear_fwd(x, w, None, torch.ones(n, 1), None, torch.bfloat16, False)
            for key, (kernel, signature, constexprs, options) in recorder.variants.items():
                if not key[0].startswith("_gemv"):
                    continue
                compiled, sass, _ = compile_sass(kernel, signature, constexprs, options, recorder.attrs[key])
                warps = options.get("num_warps", 4)
                print(f"M {m}, N {n}: {key[0]}, {constexprs['BLOCK_N']} x {constexprs['BLOCK_K']}, {warps} warps, "
                      f"{options.get('num_stages')} stages, {compiled.metadata.shared} B of shared memory")  # fmt: skip
                report_loops(sass, 32 * warps, constexprs["BLOCK_N"] * constexprs["BLOCK_K"], shortest=40)
    return 0


if __name__ == "__main__":
    sys.exit(main())
