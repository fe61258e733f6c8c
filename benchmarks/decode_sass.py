"""Flash decoding's sm_90 machine code, without a GPU: the decode kernel compiled for Hopper (as a GPU launch would
specialise it: tests/compile_for_hopper.py's Recorder) for each cache format, at B8, d128, GQA 32:8, pages of 64,
four splits, this Hopper plan; prints each key loop's SASS by opcode, its instructions per K or V value read (per
thread: the loop's count times the threads of a program over the block's 2 x BLOCK_N x 128 values), and the kinds of
its loads and stores (spills to local memory included), with the registers and stack a thread takes.

    python benchmarks/decode_sass.py [int4 int8 fp8 plain] [--code-halves] [--max-registers N]

``--code-halves``: int8 and fp8 with their plan's code_halves on (read by halves of the head dim).
``--max-registers N``: each plan with DecodePlan.max_registers N (ptxas' cap; what it spills shows as STACK and as
local loads and stores in the loops).

A proxy for a format's cost per value where timing needs a GPU: on the H200 plain caches stream at the copy
bandwidth, 8-bit ones at up to 1.4x paged bf16's speed, int4 at up to 1.5x (docs/kernels/decoding.md). The count
is not the whole story: int4's loop halved its instructions (9.5 to 4.3 a value) for an 8% gain while its scales
were loaded in each step, and Nsight Compute showed the round trip of its values through shared memory next.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

FORMATS = ("int4", "int8", "fp8", "plain")
MEMORY_OPS = ("LDG", "LDS", "STS", "LDGSTS", "LDL", "STL")  # global, shared and local (spills) loads and stores
# B8: 256 programs for the 132 multiprocessors set below, so the plans' own warps (not DecodePlan.one_wave_warps)
B, S, HQ, HK, D, PAGE, SPLITS = 8, 4096, 32, 8, 128, 64, 4


def _launch(fmt: str) -> None:
    import torch

    import tritonkit as tk
    from tritonkit.ops.decoding import launch

    q = torch.randn(B, 1, HQ, D, dtype=torch.bfloat16)
    x = torch.randn(S // PAGE, PAGE, HK, D, dtype=torch.bfloat16)
    table = torch.arange(S // PAGE, dtype=torch.int32)[None]
    k, scales = (x, None) if fmt == "plain" else tk.ops.quantize_kv(x, fmt)
    seqlens = torch.full((B,), S, dtype=torch.int32)
    launch.decode_attention_fwd(q, k, k, seqlens, table, scales, scales, D**-0.5, True, -1, 0.0, SPLITS)


def _loops(sass: str) -> list[tuple[int, int, collections.Counter]]:
    """(start, end, opcode counts) of each backward branch's body in nvdisasm's listing."""
    label_at, instructions, pending = {}, [], []
    for line in sass.splitlines():
        label = re.match(r"^(\.L_x_\d+):", line.strip())
        if label:
            pending.append(label.group(1))
            continue
        instruction = re.match(r"^\s+/\*([0-9a-f]+)\*/\s+(.*)$", line)
        if instruction:
            address = int(instruction.group(1), 16)
            label_at.update((name, address) for name in pending)
            pending = []
            instructions.append((address, instruction.group(2)))
    found = []
    for address, text in instructions:
        target = re.search(r"BRA\s+(?:`\()?(\.L_x_\d+)", text)
        if target and label_at.get(target.group(1), address) < address:
            start = label_at[target.group(1)]
            body = [text for at, text in instructions if start <= at <= address]
            opcodes = [re.match(r"(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", text) for text in body]
            found.append((start, address, collections.Counter(m.group(1) for m in opcodes if m)))
    return found


def report_loops(sass: str, threads: int, values: int, shortest: int = 100) -> None:
    """Print each loop of at least ``shortest`` instructions in ``sass``: its count, the count per value of the
    ``values`` a step of the loop reads over a program's ``threads``, its opcodes and its loads and stores (spills
    to local memory included)."""
    for start, end, opcodes in _loops(sass):
        count = sum(opcodes.values())
        if count < shortest:
            continue
        memory = {op: n for op, n in opcodes.items() if op.startswith(MEMORY_OPS)}
        print(f"  loop {start:#x}-{end:#x}: {count} instructions, {count * threads / values:.2f} a value")
        base = collections.Counter()
        for op, n in opcodes.items():
            base[op.split(".")[0]] += n
        print(f"    {dict(base.most_common(16))}")
        print(f"    memory: {memory}")


def compile_sass(kernel, signature, constexprs, options, attrs) -> tuple:
    """(compiled kernel, nvdisasm's listing, cuobjdump's resource usage line) of a launch recorded by
    tests/compile_for_hopper.py's Recorder, compiled for sm_90."""
    import triton

    import compile_for_hopper as hopper

    source = triton.compiler.ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    compiled = triton.compile(source, target=hopper.HOPPER, options=options or None)
    tools = Path(triton.__file__).parent / "backends/nvidia/bin"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(compiled.asm["cubin"])
        cubin.flush()
        sass = subprocess.run([tools / "nvdisasm", "-c", cubin.name], capture_output=True, text=True).stdout
        usage = subprocess.run([tools / "cuobjdump", "--dump-resource-usage", cubin.name], capture_output=True,
                               text=True).stdout  # fmt: skip
    resources = re.search(r"REG:\d+.*", usage)
    return compiled, sass, resources.group(0) if resources else "resource usage not found"


def main(argv=None) -> int:
    os.environ.pop("TRITON_INTERPRET", None)  # compile, not interpret
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import JITFunction

    import compile_for_hopper as hopper
    from tritonkit._core import checks
    from tritonkit.ops.decoding import launch

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("formats", nargs="*", choices=FORMATS, default=FORMATS)
    parser.add_argument("--code-halves", action="store_true", help="int8 and fp8 read by halves of the head dim")
    parser.add_argument("--max-registers", type=int, default=0, help="DecodePlan.max_registers (0: the plan's)")
    args = parser.parse_args(argv)
    formats = args.formats or FORMATS
    changes = {"code_halves": True} if args.code_halves else {}
    if args.max_registers:
        changes["max_registers"] = args.max_registers
    if changes:
        plan_of = launch.decode_plan
        launch.decode_plan = lambda *key: dataclasses.replace(plan_of(*key), **changes)
    checks.kernels_interpreted = lambda: True  # CPU tensors pass the device check; the launches are only recorded
    launch.arch, launch.sm_count = (lambda device: "sm90"), (lambda device: 132)
    launch.upcast_bf16_dots = lambda dtype: False  # the GPU's code paths
    for fmt in formats:
        recorder = hopper.Recorder()
        JITFunction.run, Autotuner.run = hopper._recording(recorder)
        _launch(fmt)
        for key, (kernel, signature, constexprs, options) in recorder.variants.items():
            if key[0] != "_decode_kernel":
                continue
            compiled, sass, resources = compile_sass(kernel, signature, constexprs, options, recorder.attrs[key])
            threads = 32 * options.get("num_warps", 4)
            values = 2 * constexprs["BLOCK_N"] * D
            print(f"{fmt}: {options.get('num_warps')} warps, {options.get('num_stages')} stages, BLOCK_N "
                  f"{constexprs['BLOCK_N']}, {compiled.metadata.shared} B of shared memory; {resources}")  # fmt: skip
            report_loops(sass, threads, values)
    return 0


if __name__ == "__main__":
    sys.exit(main())
