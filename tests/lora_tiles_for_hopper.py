"""Compile the persistent LoRA kernel for sm_90 at the tile the plan gives each padded rank, and print the shared
memory each build asks (run by test_compiled_build.py without TRITON_INTERPRET; the interpreter has no such limit).

The launches of lora_fwd and lora_bwd (dx) on CPU tensors are recorded, as compile_for_hopper.py records every
kernel's, with the device's plan forced through LoraPlan(persistent_tile=persistent_tile_for(r_pad)).
"""

import sys

import torch
import triton
from triton.runtime.autotuner import Autotuner
from triton.runtime.jit import JITFunction

import compile_for_hopper as hopper
from tritonkit._core import checks
from tritonkit.ops.lora import launch, plan


def main() -> int:
    recorder = hopper.Recorder()
    JITFunction.run, Autotuner.run = hopper._recording(recorder)
    checks.kernels_interpreted = lambda: True  # CPU tensors pass the device check; the launches are only recorded
    for r_pad in plan.PERSISTENT_STAGES_BY_RANK:
        forced = plan.LoraPlan(persistent_min_tokens=0, persistent_tile=plan.persistent_tile_for(r_pad))
        x, w = torch.ones(64, 64, dtype=torch.bfloat16), torch.ones(128, 64, dtype=torch.bfloat16)
        a, b = torch.ones(r_pad, 64, dtype=torch.bfloat16), torch.ones(128, r_pad, dtype=torch.bfloat16)
        y, xa = launch.lora_fwd(x, w, a, b, None, 1.0, plan=forced)
        launch.lora_bwd(y, x, w, a, b, xa, 1.0, True, False, False, False, False, plan=forced)
    for name, (kernel, signature, constexprs, options) in ((k[0], v) for k, v in recorder.variants.items()):
        if name == "_lora_matmul_persistent_kernel":
            source = triton.compiler.ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
            compiled = triton.compile(source, target=hopper.HOPPER, options=options)
            print(f"R_PAD {constexprs['R_PAD']} Q_TRANSPOSED {constexprs['Q_TRANSPOSED']}: "
                  f"{compiled.metadata.shared} bytes of shared memory")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
