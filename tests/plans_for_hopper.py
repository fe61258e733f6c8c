"""Compile for sm_90 the kernel variants that only a forced plan reaches (no default plan takes them yet, so
compile_for_hopper.py, which records the registry's cases under the default plans, never sees them). Run by
test_compiled_build.py without TRITON_INTERPRET; prints one line per compiled variant.

- The W8A16 GEMV reading int8 codes as words for 2 to 16 rows (GemvPlan(block_m=16, words=True)), in bf16 and fp16,
  at the byte loop's fallback tile; benchmarks/gemv_plans.py times it against the byte loop.
"""

import sys

import torch
import triton
from triton.runtime.autotuner import Autotuner
from triton.runtime.jit import JITFunction

import compile_for_hopper as hopper
from tritonkit._core import checks
from tritonkit.ops.gemm import launch
from tritonkit.ops.gemm.plan import GemvPlan

FORCED = [GemvPlan(16, 64, 128, 4, 3, 4, 512, words=True)]


def main() -> int:
    recorder = hopper.Recorder()
    JITFunction.run, Autotuner.run = hopper._recording(recorder)
    checks.kernels_interpreted = lambda: True  # CPU tensors pass the device check; the launches are only recorded
    launch.kernels_interpreted = lambda: False  # the GPU's code paths (no fp32 upcast of the dots)
    for dtype in (torch.bfloat16, torch.float16):
        for plan in FORCED:
            x, w = torch.ones(16, 256, dtype=dtype), torch.ones(64, 256, dtype=torch.int8)
            launch.scaled_linear_fwd(x, w, None, torch.ones(64, 1), None, dtype, False, plan=plan)
    for (name, *_), (kernel, signature, constexprs, options) in recorder.variants.items():
        source = triton.compiler.ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
        compiled = triton.compile(source, target=hopper.HOPPER, options=options)
        print(f"{name} [BLOCK_M={constexprs['BLOCK_M']}, x {signature['p_x']}]: {len(compiled.asm['cubin'])} bytes of "
              f"sm_90 code")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
