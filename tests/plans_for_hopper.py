"""Compile for sm_90 the kernel variants that compile_for_hopper.py, which records the registry's cases under the
interpreter and the default plans, never sees: those only a forced plan reaches (no sm90 plan takes them; its
FORCED_PLAN_ONLY names the kernels left to this script) and those the interpreter launches otherwise. Run by
test_compiled_build.py without TRITON_INTERPRET; prints one line per compiled variant.

- The W8A16 GEMV's two-launch form (GemvPlan(last_split_sums=False): the fallback's on every other GPU): the byte
  loop at one row and at 16 rows (tl.dot), the one-row kernel reading int8 codes as words, in bf16, and the split-K
  reduction that sums their partials; benchmarks/gemv_plans.py times them against sm90's plans.
- Flash decoding launched as programmatic dependents (DecodePlan.pdl, which sm90's plans take on the GPU but the
  interpreter, under which compile_for_hopper.py records, launches without): the split kernel and the reduction with
  their griddepcontrol waits, a paged bf16 cache split four ways; and int8 and fp8 caches read by halves of the head
  dim (DecodePlan.code_halves, whose PTX the interpreter does not take).
"""

import sys

import torch
import triton
from triton.runtime.autotuner import Autotuner
from triton.runtime.jit import JITFunction

import compile_for_hopper as hopper
import tritonkit
from tritonkit._core import checks
from tritonkit.ops.decoding import launch as decoding
from tritonkit.ops.decoding.plan import decode_plan
from tritonkit.ops.gemm import launch
from tritonkit.ops.gemm.plan import GemvPlan

# (plan, rows of x, w's dtype): 4096 K values, so that each plan splits K.
FORCED = [
    (GemvPlan(1, 32, 256, 4, 3, 2, 512), 1, torch.float8_e4m3fn),
    (GemvPlan(1, 32, 256, 4, 3, 2, 512, words=True), 1, torch.int8),
    (GemvPlan(16, 64, 128, 4, 3, 4, 512), 16, torch.int8),
]


def main() -> int:
    recorder = hopper.Recorder()
    JITFunction.run, Autotuner.run = hopper._recording(recorder)
    checks.kernels_interpreted = lambda: True  # CPU tensors pass the device check; the launches are only recorded
    launch.kernels_interpreted = lambda: False  # the GPU's code paths (no fp32 upcast of the dots)
    launch.sm_count = lambda device: 132  # an H100's, so that the splits are those of the GPU
    for plan, m, codes in FORCED:
        x, w = torch.ones(m, 4096, dtype=torch.bfloat16), torch.ones(64, 4096).to(codes)
        launch.scaled_linear_fwd(x, w, None, torch.ones(64, 1), None, torch.bfloat16, False, plan=plan)
    decoding.kernels_interpreted = lambda: False  # launches as on the GPU: the plan's pdl is kept
    decoding.upcast_bf16_dots = lambda dtype: False
    cache = torch.ones(64, 64, 8, 128, dtype=torch.bfloat16)  # 64 pages of 64 keys, 8 key heads, d128
    table, lengths = torch.arange(64, dtype=torch.int32)[None], torch.full((1,), 4096, dtype=torch.int32)
    q = torch.ones(1, 1, 32, 128, dtype=torch.bfloat16)
    plan = decode_plan("sm90", 128)
    assert plan.pdl, "sm90's paged bf16 plan launches as programmatic dependents"
    decoding.decode_attention_fwd(q, cache, cache, lengths, table, None, None, 0.125, True, -1, 0.0, 4, plan=plan)
    for fmt in ("int8", "fp8"):  # read by halves of the head dim (16 key blocks a split)
        data, scales = tritonkit.ops.quantize_kv(cache, fmt)
        plan = decode_plan("sm90", 128, fmt)
        assert plan.code_halves, f"sm90's {fmt} plan reads its cache by halves"
        decoding.decode_attention_fwd(q, data, data, lengths, table, scales, scales, 0.125, True, -1, 0.0, 4,
                                      plan=plan)  # fmt: skip
    for key, (kernel, signature, constexprs, options) in recorder.variants.items():
        name = key[0]
        if name == "_quantize_kv_kernel":
            continue  # it only made the caches above (compile_for_hopper.py compiles it)
        source = triton.compiler.ASTSource(fn=kernel, signature=signature, constexprs=constexprs,
                                           attrs=recorder.attrs[key])  # fmt: skip
        compiled = triton.compile(source, target=hopper.HOPPER, options=options)
        form = " [two launches]" if "LAST_SPLIT_SUMS" in constexprs else ""  # the GEMV's; the reduction has none
        form += " [PDL]" if constexprs.get("PDL") else ""
        form += f" [{constexprs['KV']} by halves]" if constexprs.get("CODE_PARTS") == 2 else ""
        print(f"{name}{form}: {len(compiled.asm['cubin'])} bytes of sm_90 code")
    return 0


if __name__ == "__main__":
    sys.exit(main())
