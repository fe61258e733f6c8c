"""Flash decoding by split count, key block and plan variant: one GPU, CUDA-graph GPU time
(triton.testing.do_bench_cudagraph), GQA 32:8, d128, one new token per sequence, every sequence full, paged caches
of 64-token pages, SDPA with enable_gqa over a contiguous bf16 cache of the same shape in the same run. Every shape
takes as many input sets as overflow L2 twice (tritonkit.bench.harness.input_sets_needed), each run's graph calls
them in turn and its time is the graph's over their count, as the bench harness times: a cache that fits in L2 is
not read from it warm. (Results before 2026-11-30 timed one input set: small caches were read from L2.)

- Default against variant first: int8 and fp8 with their codes converted straight to bf16 (plan.direct_codes)
  beside the default plan, and int4 with the default plan, each with the split heuristic asking for 2 and for 8
  programs per multiprocessor (plan.programs_per_sm: more warps in flight to hide the conversions' latency), at B 8
  S 32k and B 64 S 4k, key blocks of 64.
- kv_cache_append in place, a prompt's keys and values (8192 tokens) into a paged cache of each format.
- Then the sweep, B 1, 4, 8 x S 4k, 8k, 32k: SDPA; paged bf16 at key blocks 64 and 128, each with the heuristic's
  split count and with 4 to 64 splits, and at 32 with the heuristic's; int8, fp8 and int4 with the default plan (and
  int8's and fp8's variant), at key block 64 with the heuristic's split count and with 16 to 64, and at 128 with the
  heuristic's.

    python benchmarks/decode_splits.py --out DIR [--budget-s 50] [--dry-run]
        [--part heuristic|quantized|tiles|splits|appends|pdl] [--formats int8 fp8 int4]

``--part quantized`` (``<date>-decode-quantized.json``): at B 8 S 32k and B 64 S 4k, paged bf16 with this GPU's
plan, and int8, fp8 and int4 with theirs, int8 and fp8 also with their plan's direct_codes the other way (the codes
converted straight to bf16 or through fp32) and with code_halves the other way (read by halves of the head dim or
as whole tiles); each against bf16 (bf16_over_this).

``--part tiles`` (``<date>-decode-tiles.json``): at TILE_SHAPES (or ``--shapes B:S,...``), SDPA and each format's
plan, then each format of ``--formats`` (default all four, "plain" for paged bf16) at every key block, warp count,
stage count, register cap and programs per multiprocessor of tile_grid (``--blocks``, ``--warps``, ``--stages``,
``--registers``, ``--programs-per-sm``; by default the plan's programs per multiprocessor, and with 2 warps twice
that); paged bf16 against SDPA, the quantized caches against paged bf16's plan.

``--part pdl`` (``<date>-decode-pdl.json``): at PDL_SHAPES (short caches, where the launches weigh, and one long one),
SDPA, then paged bf16 and each quantized format with this GPU's plans, their launches plain and programmatic
(DecodePlan.pdl).

``--part appends`` (``<date>-decode-append-tokens.json``): kv_cache_append of prompts (APPEND_SHAPES: one of 8192
tokens, eight of 2048) into each format's paged cache with each of PROGRAM_TOKENS tokens a program
(launch.append_tokens), and the public op.

``--part splits`` (``<date>-decode-split-counts.json``): at SPLIT_SHAPES (B 1 to 16 at S 1k to 32k, B 64 S 4k,
B 256 S 1k; or ``--shapes``), SDPA, then paged bf16 and the quantized formats (``--formats``, default int8 and fp8)
with this GPU's plans at the heuristic's split count and at each of SPLIT_COUNTS; bf16 against SDPA, the quantized
caches against bf16's heuristic run.

Prints one line per run and writes ``<date>-decode-splits.json`` into DIR: per run the shape, cache, plan, key block,
split count asked (0: the heuristic) and used, µs, GB/s of the spec's cost model (the keys and values in their
format, q, the output) and SDPA's time over this run's at the shape. Runs left when --budget-s seconds have passed
are listed as skipped, so that the script ends in time on a slow start. ``--dry-run`` checks the script on the CPU
under the interpreter: tiny shapes, each run once in float32 against the spec's float64 reference, no times.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import multiprocessing
import os
import sys
import time
from pathlib import Path

HEADS = {"hq": 32, "hk": 8, "d": 128}
PAGE = 64
HEADLINE = ((8, 32768), (64, 4096))
SHAPES = tuple((b, s) for b in (1, 4, 8) for s in (4096, 8192, 32768))
PLAIN_BLOCKS = (64, 128)  # with each split count; block 32 with the heuristic's only
PLAIN_SPLITS = (4, 8, 16, 32, 64)
QUANTIZED_BLOCKS = (64, 128)
QUANTIZED_SPLITS = (16, 32, 64)
MORE_PROGRAMS = 8  # programs per multiprocessor the headline's second heuristic asks for
HEURISTIC_SHAPES = (*((b, s) for b in (1, 4, 8, 16) for s in (4096, 8192, 32768)), (64, 4096), (256, 1024))
MIN_SPLIT_KEYS = 128  # fewer keys per split than two blocks of 64: the partials' traffic outweighs any parallelism
# Each quantized format's plan variant, timed beside its default plan; int4 has none.
VARIANTS = {"int8": {"direct_codes": True}, "fp8": {"direct_codes": True}, "int4": {}}
# --part tiles: each format's plan at key blocks 64 and 128, 2 and 4 warps, 2 and 3 stages (2 warps also at twice the
# plan's programs per multiprocessor: half the warps per program), at these shapes.
TILE_SHAPES = ((1, 32768), (8, 32768), (64, 4096))
TILE_FORMATS = ("plain", "int8", "fp8", "int4")  # --part tiles' formats swept unless --formats names others
TILE_STAGES = (2, 3)  # --part tiles' pipeline depths unless --stages names others (1: the key loop unpipelined)
TILE_BLOCKS = (64, 128)  # --part tiles' key blocks unless --blocks names others


def tile_grid(stages=TILE_STAGES, blocks=TILE_BLOCKS, warp_counts=(2, 4), registers=(0,), per_sm=()) -> tuple:
    """--part tiles' (key block, warps, stages, register cap, programs per multiprocessor) candidates; programs per
    multiprocessor 0: the plan's, and for 2 warps also twice that."""
    return tuple((block_n, warps, depth, regs, programs) for block_n in blocks for warps in warp_counts
                 for depth in stages for regs in registers for programs in per_sm or (0,))  # fmt: skip


# --part splits: paged bf16, int8 and fp8 with their plans at the heuristic's split count and at each of
# SPLIT_COUNTS (none shorter than a key block), at these shapes: where splits are few blocks long.
SPLIT_SHAPES = (*((b, s) for b in (1, 4, 8, 16) for s in (1024, 2048, 4096, 8192, 32768)), (64, 4096), (256, 1024))
SPLIT_COUNTS = (1, 2, 4, 8, 16, 32, 64, 128)
SPLIT_FORMATS = ("int8", "fp8")  # --part splits' quantized formats unless --formats names others (bf16 always runs)
APPEND_TOKENS = 8192  # a prompt's keys and values appended at once (kv_cache_append's bandwidth case)
# --part pdl: short caches, where the split kernel's and the reduction's launches are a large share of the time
PDL_SHAPES = ((1, 1024), (1, 8192), (1, 32768), (8, 1024), (8, 4096), (64, 1024), (8, 32768))
APPEND_SHAPES = ((1, 8192), (8, 2048))  # --part appends: (sequences, new tokens each)
PROGRAM_TOKENS = (1, 2, 4)  # --part appends: the new tokens a kv_cache_append program writes (plan.APPEND_TOKENS)
# The CPU check: two small shapes, heads of two int4 groups of 32 (the default group).
DRY = {
    "heads": {"hq": 4, "hk": 2, "d": 64},
    "shapes": ((1, 256), (2, 512)),
    "headline": ((2, 256),),
    "append": 64,
    "appends": ((1, 64), (2, 24)),
}


class Runner:
    """Times (or, dry, checks) decode_attention_fwd runs and keeps their rows; stops timing past the budget. As one of
    ``warm[1]`` compiling workers (``warm`` = (index, workers)), only calls the runs of its share of the kernel
    variants once, so that their compiled code is in Triton's cache when the timing process reaches them."""

    def __init__(self, dry: bool, budget_s: float, rep_ms: int, warm: tuple[int, int] | None = None):
        import torch

        from tritonkit import catalog
        from tritonkit._core.device import arch, sm_count

        self.dry, self.budget_s, self.rep_ms = dry, budget_s, rep_ms
        self.device = torch.device("cpu" if dry else "cuda")
        self.dtype = torch.float32 if dry else torch.bfloat16
        self.heads = DRY["heads"] if dry else HEADS
        self.spec = catalog.get("decode_attention")
        self.arch, self.sms = arch(self.device), sm_count(self.device)
        self.start = time.perf_counter()
        self.rows: list[dict] = []
        self.warm, self.owners = warm, {}

    def inputs(self, b: int, s: int, kv: str, paged: bool = True):
        """The case at (b, s) in format ``kv`` and its input sets: one when dry, else as many as overflow L2 twice."""
        values = {"b": b, "s": s, **self.heads, "capacity": s, "kv": kv, "page_size": PAGE if paged else 0}
        case = self.spec.parse_case(values)
        return case, self.input_sets(self.spec, case)

    def input_sets(self, spec, case) -> list:
        """The case's input sets, seeded 0, 1, ...: one when dry, else as many as overflow L2 twice."""
        import itertools

        import torch

        from tritonkit.bench.harness import make_input_sets

        l2_bytes = 0 if self.dry else torch.cuda.get_device_properties(self.device).L2_cache_size
        return make_input_sets(spec, case, self.device, self.dtype, l2_bytes, itertools.count().__next__)

    def sdpa(self, b: int, s: int, part: str) -> float | None:
        """SDPA with GQA over a contiguous bf16 cache of this shape, timed as a row of ``part``: its milliseconds."""
        from tritonkit.bench.decoding_peers import sdpa_decode

        case, sets = self.inputs(b, s, "plain", paged=False)
        call = sdpa_decode()
        return self.run(case, sets, {"part": part, "cache": "bf16", "plan": "sdpa contiguous"},
                        lambda inputs: call(*inputs.args, **inputs.kwargs))  # fmt: skip

    def plan(self, block_n: int, variant: dict):
        from tritonkit.ops.decoding.plan import decode_plan

        return dataclasses.replace(decode_plan(self.arch, self.heads["d"]), block_n=block_n, **variant)

    def run(self, case, sets: list, label: dict, fn, sdpa_ms: float | None = None, variant=None, spec=None,
            baseline: str = "SDPA"):  # fmt: skip
        """Time fn (one call of the op on an input set) over ``sets`` in turn and record a row labelled ``label``;
        returns the milliseconds of one call. ``variant``: the keys of the kernels fn compiles (the split kernel's,
        the reduction's or None; None: none of ours). ``sdpa_ms``: the time of the ``baseline`` run at this shape,
        recorded as its time over this one's."""
        import torch
        import triton.testing

        if self.warm:
            # The first run of each split-kernel variant goes to the next worker in turn, and so does the first run
            # of a reduction variant whose split kernel is already someone's: every worker takes the same turns.
            split_key, reduce_key = variant or (None, None)
            new = [key for key in (split_key, reduce_key) if key is not None and key not in self.owners]
            for key in new:
                self.owners[key] = len(self.owners) % self.warm[1]
            if new and self.owners[new[0]] == self.warm[0]:
                try:
                    fn(sets[0])
                    if not self.dry:
                        torch.cuda.synchronize()
                except Exception as error:  # the timing process meets it again and records it
                    print(f"compiling {variant} failed: {type(error).__name__}", file=sys.stderr, flush=True)
            return None
        spec = spec or self.spec
        row = {"b": case.b, "s": case.s, **label}
        if time.perf_counter() - self.start > self.budget_s:
            row["skipped"] = "time budget"
            self.rows.append(row)
            return None
        try:
            out = fn(sets[0])
        except Exception as error:  # one variant that fails leaves the others' times
            row["skipped"] = f"failed: {type(error).__name__}: {str(error).splitlines()[0][:160] if str(error) else ''}"
            print(f"B{case.b:<3} S{case.s:<6} {_describe(label)}  {row['skipped']}", flush=True)
            self.rows.append(row)
            return None
        if self.dry and spec is not self.spec:  # an append: its output is the cache, checked by the tests
            print(f"B{case.b:<3} S{case.s:<6} {_describe(label)}  ran", flush=True)
            self.rows.append(row)
            return None
        if self.dry:
            as64 = [a.double() if a.is_floating_point() else a for a in sets[0].args]
            expected = self.spec.reference(*as64, **sets[0].kwargs)
            row["max_abs_error"] = (out.double() - expected).abs().max().item()
            print(f"B{case.b:<3} S{case.s:<6} {_describe(label)}  max abs error {row['max_abs_error']:.1e}", flush=True)
            self.rows.append(row)
            return None
        for inputs in sets[1:]:  # every set once outside the capture
            fn(inputs)
        torch.cuda.synchronize()

        def cycle():
            for inputs in sets:
                fn(inputs)

        ms = triton.testing.do_bench_cudagraph(cycle, rep=self.rep_ms) / len(sets)
        row.update(us=ms * 1e3, gb_s=spec.bytes_moved(case, self.dtype) / ms / 1e6, input_sets=len(sets))
        ratio_key = f"{baseline.lower()}_over_this"
        if sdpa_ms:
            row[ratio_key] = sdpa_ms / ms
        versus = f"  {row[ratio_key]:5.2f}x {baseline}" if sdpa_ms else ""
        print(f"B{case.b:<3} S{case.s:<6} {_describe(label)}  {row['us']:8.1f} us {row['gb_s']:6.0f} GB/s{versus}",
              flush=True)  # fmt: skip
        self.rows.append(row)
        return ms

    def ours(self, case, sets: list, plan, splits: int, label: dict, sdpa_ms: float | None = None,
             baseline: str = "SDPA") -> float | None:  # fmt: skip
        from tritonkit.ops.decoding import launch
        from tritonkit.ops.decoding.plan import choose_splits

        used = splits or choose_splits(case.b * self.heads["hk"], case.s, self.sms, plan)
        label = {**label, "block_n": plan.block_n, "splits": splits, "splits_used": used}
        scale = 1 / math.sqrt(self.heads["d"])

        def call(inputs):
            options = inputs.kwargs
            return launch.decode_attention_fwd(*inputs.args, options.get("block_table"), options.get("k_scales"),
                                               options.get("v_scales"), scale, True, -1, 0.0, splits,
                                               plan=plan)[0]  # fmt: skip

        # What the kernels are compiled for: the format, the plan's switches, the key block, warps and stages, one
        # split or several and the split count's divisibility by 16 (Triton specialises on it); the reduction's tile
        # of splits.
        stages = plan.stages_for(case.s, used)  # the launch's, from about its capacity
        warps = plan.warps_for(used * case.b * self.heads["hk"], self.sms)  # one block of rows a program (GQA 4)
        split_key = (label["cache"], label["plan"], plan.block_n, warps, stages, used > 1, used % 16 == 0)
        variant = (split_key, ("reduce", 1 << (used - 1).bit_length()) if used > 1 else None)
        return self.run(case, sets, label, call, sdpa_ms, variant, baseline=baseline)


def _describe(label: dict) -> str:
    programs = f" {label['programs_per_sm']}/SM" if "programs_per_sm" in label else ""
    text = f"{label['cache']:5} {label['plan'] + programs:17}"
    if "block_n" in label:
        text += f" block {label['block_n']:<3} splits {label['splits'] or 'auto':>4} ({label['splits_used']:>3})"
    return f"{text:51}"


def appends(runner: Runner, shapes, program_tokens: tuple[int, ...] = (0,)) -> None:
    """kv_cache_append of (batch, tokens) new keys and values a sequence, for each of ``shapes``, into an empty paged
    cache of each format, in place (idempotent: the lengths are not advanced, so every replay writes the same
    slots), with each count of tokens a program in ``program_tokens`` (0: the plan's); with several counts, the
    public op (validation, custom op) at the plan's count too."""
    import tritonkit as tk
    from tritonkit import catalog
    from tritonkit.ops.decoding import launch, plan

    spec = catalog.get("kv_cache_append")
    for batch, tokens in shapes:
        for kv in ("plain", "int8", "fp8", "int4"):
            values = {"b": batch, "s": 0, "sq": tokens, "hk": runner.heads["hk"], "d": runner.heads["d"],
                      "page_size": PAGE, "kv": kv, "capacity": tokens}  # fmt: skip
            case = spec.parse_case(values)
            sets = runner.input_sets(spec, case)
            cache = "bf16" if kv == "plain" else kv
            for per_program in program_tokens:
                count = per_program or plan.APPEND_TOKENS
                label = {"part": "append", "cache": cache, "plan": f"{tokens} tokens, {count} a program",
                         "tokens_a_program": count}  # fmt: skip

                def call(inputs, count=count):
                    options = inputs.kwargs
                    launch.append_tokens(*inputs.args, options["block_table"], options.get("k_scales"),
                                         options.get("v_scales"), count)  # fmt: skip

                runner.run(case, sets, label, call, variant=(("append", kv, count), None), spec=spec)
            if len(program_tokens) > 1:
                label = {"part": "append", "cache": cache, "plan": f"{tokens} tokens, public op",
                         "tokens_a_program": plan.APPEND_TOKENS}  # fmt: skip
                runner.run(case, sets, label, lambda inputs: tk.ops.kv_cache_append(*inputs.args, **inputs.kwargs),
                           variant=(("append", kv, plan.APPEND_TOKENS), None), spec=spec)  # fmt: skip


def _plans(variant: dict) -> list[tuple[str, dict]]:
    """("default", no change) and, where the format has a variant, (its field's name, the variant)."""
    return [("default", {})] + ([(next(iter(variant)), variant)] if variant else [])


def headline(runner: Runner, shapes) -> None:
    """Each quantized cache with the default plan and with its variant (if any), each with the heuristic at 2 and at
    MORE_PROGRAMS programs per multiprocessor (key block 64)."""
    for b, s in shapes:
        for kv, variant in VARIANTS.items():
            case, sets = runner.inputs(b, s, kv)
            for name, change in _plans(variant):
                for programs in (2, MORE_PROGRAMS):
                    plan = runner.plan(64, {**change, "programs_per_sm": programs})
                    label = {"part": "headline", "cache": kv, "plan": name, "programs_per_sm": programs}
                    runner.ours(case, sets, plan, 0, label)
            del sets


def sweep(runner: Runner, shapes) -> None:
    """SDPA, then paged bf16 by key block and split count, then the quantized caches (see the module docstring)."""
    for b, s in shapes:
        sdpa_ms = runner.sdpa(b, s, "sweep")
        splits = [0, *(n for n in PLAIN_SPLITS if s // n >= MIN_SPLIT_KEYS)]
        case, sets = runner.inputs(b, s, "plain")
        label = {"part": "sweep", "cache": "bf16", "plan": "default"}
        runner.ours(case, sets, runner.plan(32, {}), 0, label, sdpa_ms)
        for block_n in PLAIN_BLOCKS:
            for n in splits:
                runner.ours(case, sets, runner.plan(block_n, {}), n, label, sdpa_ms)
        del sets
        for kv, variant in VARIANTS.items():
            case, sets = runner.inputs(b, s, kv)
            for plan_name, change in _plans(variant):
                label = {"part": "sweep", "cache": kv, "plan": plan_name}
                for n in (0, *(n for n in QUANTIZED_SPLITS if s // n >= MIN_SPLIT_KEYS)):
                    runner.ours(case, sets, runner.plan(64, change), n, label, sdpa_ms)
                runner.ours(case, sets, runner.plan(128, change), 0, label, sdpa_ms)
            del sets


def heuristic(runner: Runner, shapes) -> None:
    """--part heuristic: paged bf16 with the split heuristic of the plan the GPU takes (plan.decode_plan) against
    FALLBACK's, SDPA on a contiguous cache beside, over HEURISTIC_SHAPES."""
    from tritonkit.ops.decoding.plan import FALLBACK, decode_plan

    d = runner.heads["d"]
    for b, s in shapes:
        sdpa_ms = runner.sdpa(b, s, "heuristic")
        case, sets = runner.inputs(b, s, "plain")
        for name, plan in (("fallback", FALLBACK[d]), ("this GPU's", decode_plan(runner.arch, d, "plain"))):
            runner.ours(case, sets, plan, 0, {"part": "heuristic", "cache": "bf16", "plan": name}, sdpa_ms)
        del sets


def quantized(runner: Runner, shapes) -> None:
    """--part quantized: paged bf16 with this GPU's plan, then int8, fp8 and int4 with theirs, and int8 and fp8 with
    their plan's direct_codes flipped and with its code_halves flipped, each against the bf16 run at the shape."""
    from tritonkit.ops.decoding.plan import decode_plan

    d = runner.heads["d"]
    for b, s in shapes:
        case, sets = runner.inputs(b, s, "plain")
        label = {"part": "quantized", "cache": "bf16", "plan": "default"}
        bf16_ms = runner.ours(case, sets, decode_plan(runner.arch, d, "plain"), 0, label)
        del sets
        for kv in ("int8", "fp8", "int4"):
            case, sets = runner.inputs(b, s, kv)
            default = decode_plan(runner.arch, d, kv)
            plans = [("default", default)]
            if kv != "int4":  # direct_codes converts int8 and fp8 codes only
                flipped = not default.direct_codes
                plans.append((f"direct_codes {'on' if flipped else 'off'}",
                              dataclasses.replace(default, direct_codes=flipped)))  # fmt: skip
                halves = not default.code_halves
                plans.append((f"code_halves {'on' if halves else 'off'}",
                              dataclasses.replace(default, code_halves=halves)))  # fmt: skip
            for name, plan in plans:
                runner.ours(case, sets, plan, 0, {"part": "quantized", "cache": kv, "plan": name}, bf16_ms,
                            baseline="bf16")  # fmt: skip
            del sets


def pdl(runner: Runner, shapes) -> None:
    """--part pdl: SDPA, then paged bf16 and each quantized format with this GPU's plans, with DecodePlan.pdl off and
    on (the decode kernel and the reduction launched as programmatic dependents), bf16 against SDPA, the quantized
    caches against bf16's launches without it."""
    from tritonkit.ops.decoding.plan import decode_plan

    d = runner.heads["d"]
    for b, s in shapes:
        sdpa_ms = runner.sdpa(b, s, "pdl")
        bf16_ms = None
        for kv in ("plain", "int8", "fp8", "int4"):
            case, sets = runner.inputs(b, s, kv)
            default = decode_plan(runner.arch, d, kv)
            cache = "bf16" if kv == "plain" else kv
            baseline, baseline_ms = ("SDPA", sdpa_ms) if kv == "plain" else ("bf16", bf16_ms)
            for name, on in (("two launches", False), ("pdl", True)):
                plan = dataclasses.replace(default, pdl=on)
                ms = runner.ours(case, sets, plan, 0, {"part": "pdl", "cache": cache, "plan": name}, baseline_ms,
                                 baseline=baseline)  # fmt: skip
                if kv == "plain" and not on:
                    bf16_ms = ms
            del sets


def tiles(runner: Runner, shapes, grid, formats=TILE_FORMATS) -> None:
    """--part tiles: SDPA and paged bf16's default plan, then each of ``formats`` ("plain": paged bf16) with its
    default plan and at each (key block, warps, stages) of ``grid``; paged bf16 against SDPA, the quantized caches
    against paged bf16's default plan."""
    from tritonkit.ops.decoding.plan import decode_plan

    d = runner.heads["d"]
    for b, s in shapes:
        sdpa_ms = runner.sdpa(b, s, "tiles")
        bf16_ms = None
        for kv in ("plain", *(f for f in formats if f != "plain")):
            case, sets = runner.inputs(b, s, kv)
            default = decode_plan(runner.arch, d, kv)
            cache = "bf16" if kv == "plain" else kv
            baseline, baseline_ms = ("SDPA", sdpa_ms) if kv == "plain" else ("bf16", bf16_ms)
            ms = runner.ours(case, sets, default, 0, {"part": "tiles", "cache": cache, "plan": "default"},
                             baseline_ms, baseline=baseline)  # fmt: skip
            if kv == "plain":
                bf16_ms = ms
            for block_n, warps, depth, regs, programs in grid if kv in formats else ():
                doubled = (default.programs_per_sm, 2 * default.programs_per_sm)[: 2 if warps == 2 else 1]
                for per_sm in (programs,) if programs else doubled:
                    plan = dataclasses.replace(default, block_n=block_n, warps=warps, stages=depth,
                                               programs_per_sm=per_sm, short_split_stages=(), one_wave_warps=0,
                                               max_registers=regs)  # fmt: skip
                    name = f"{warps}w {depth}s" + (f" {regs}r" if regs else "")
                    label = {"part": "tiles", "cache": cache, "plan": name, "programs_per_sm": per_sm,
                             "max_registers": regs}  # fmt: skip
                    runner.ours(case, sets, plan, 0, label, baseline_ms, baseline=baseline)
            del sets


def splits(runner: Runner, shapes, formats=SPLIT_FORMATS) -> None:
    """--part splits: SDPA, then paged bf16 and each quantized format of ``formats`` with this GPU's plan at the
    heuristic's split count and at every count of SPLIT_COUNTS that leaves each split at least a key block; bf16
    against SDPA, the quantized caches against bf16's heuristic run."""
    from tritonkit.ops.decoding.plan import decode_plan

    d = runner.heads["d"]
    for b, s in shapes:
        sdpa_ms = runner.sdpa(b, s, "splits")
        bf16_ms = None
        for kv in ("plain", *(f for f in formats if f != "plain")):
            case, sets = runner.inputs(b, s, kv)
            plan = decode_plan(runner.arch, d, kv)
            cache = "bf16" if kv == "plain" else kv
            baseline, baseline_ms = ("SDPA", sdpa_ms) if kv == "plain" else ("bf16", bf16_ms)
            for count in (0, *(n for n in SPLIT_COUNTS if s // n >= plan.block_n)):
                ms = runner.ours(case, sets, plan, count, {"part": "splits", "cache": cache, "plan": "default"},
                                 baseline_ms, baseline=baseline)  # fmt: skip
                if kv == "plain" and count == 0:
                    bf16_ms = ms
            del sets


def _warm(task: tuple[int, int, bool, str, tuple, tuple, tuple]) -> None:
    index, workers, dry, part, shapes, formats, grid = task
    runner = Runner(dry, math.inf, 0, warm=(index, workers))
    if part == "quantized":
        quantized(runner, DRY["headline"] if dry else HEADLINE)
        return
    if part == "tiles":
        tiles(runner, DRY["headline"] if dry else shapes, grid, formats)
        return
    if part == "splits":
        splits(runner, DRY["shapes"] if dry else shapes, formats)
        return
    if part == "appends":
        appends(runner, DRY["appends"] if dry else APPEND_SHAPES, PROGRAM_TOKENS)
        return
    if part == "pdl":
        pdl(runner, DRY["headline"] if dry else PDL_SHAPES)
        return
    headline(runner, DRY["headline"] if dry else HEADLINE)
    appends(runner, ((1, DRY["append"] if dry else APPEND_TOKENS),))
    sweep(runner, DRY["shapes"] if dry else SHAPES)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--budget-s", type=float, default=50.0, help="stop timing after this many seconds")
    parser.add_argument("--rep-ms", type=int, default=4, help="do_bench_cudagraph's rep: ms of work per graph")
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU, each run once, no times")
    parser.add_argument("--part", choices=("all", "heuristic", "quantized", "tiles", "splits", "appends", "pdl"),
                        default="all",
                        help="heuristic: this GPU's split heuristic against the fallback's, paged bf16; quantized: "
                             "the quantized caches' plans (direct_codes, code_halves both ways) against paged "
                             "bf16; tiles: key block, warps, stages and registers of every format; splits: bf16 "
                             "and --formats at each split count; appends: a prompt's append at each count of "
                             "tokens a program; pdl: the plans with their launches programmatic, at short "
                             "caches")  # fmt: skip
    parser.add_argument("--stages", type=int, nargs="+", default=list(TILE_STAGES),
                        help="--part tiles: the key loop's pipeline depths tried (default: 2 3)")  # fmt: skip
    parser.add_argument("--blocks", type=int, nargs="+", default=list(TILE_BLOCKS),
                        help="--part tiles: the key blocks tried (default: 64 128)")  # fmt: skip
    parser.add_argument("--warps", type=int, nargs="+", default=[2, 4],
                        help="--part tiles: the warp counts tried (default: 2 4)")  # fmt: skip
    parser.add_argument("--registers", type=int, nargs="+", default=[0],
                        help="--part tiles: register caps a thread tried (DecodePlan.max_registers; default: 0, "
                             "the compiler's choice)")  # fmt: skip
    parser.add_argument("--programs-per-sm", type=int, nargs="+", default=[],
                        help="--part tiles: programs per multiprocessor tried (default: the plan's, and twice it "
                             "with 2 warps)")  # fmt: skip
    parser.add_argument("--shapes", type=_shapes, default=None,
                        help="--part tiles and splits: B:S pairs, comma-separated (default: TILE_SHAPES, "
                             "SPLIT_SHAPES)")  # fmt: skip
    parser.add_argument(
        "--formats",
        nargs="+",
        choices=("plain", "int8", "fp8", "int4"),
        default=None,
        help="--part splits: the quantized formats swept beside paged bf16 (default: int8 fp8); --part tiles: the "
        "formats whose tiles are swept, plain for paged bf16 (default: all four)",
    )
    parser.add_argument("--compile-workers", type=int, default=min(12, (os.cpu_count() or 2) - 2),
                        help="processes compiling the kernel variants first (0: compile as the runs come)")  # fmt: skip
    args = parser.parse_args(argv)
    formats = tuple(args.formats or (SPLIT_FORMATS if args.part == "splits" else TILE_FORMATS))
    shapes = args.shapes or (SPLIT_SHAPES if args.part == "splits" else TILE_SHAPES)  # --shapes' parts
    grid = tile_grid(tuple(args.stages), tuple(args.blocks), tuple(args.warps), tuple(args.registers),
                     tuple(args.programs_per_sm))  # fmt: skip
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"
    import torch

    if not args.dry_run and not torch.cuda.is_available():
        parser.error("timing needs a CUDA GPU (--dry-run checks the script on the CPU)")
    start = time.perf_counter()
    if args.part == "heuristic":
        runner = Runner(args.dry_run, math.inf if args.dry_run else args.budget_s, args.rep_ms)
        heuristic(runner, DRY["shapes"] if args.dry_run else HEURISTIC_SHAPES)
        return _write(args, runner, start, "decode-heuristic")
    if args.compile_workers > 0:
        # Some 30 variants of a large kernel take about as long to compile as the whole timing: compiled at once
        # into Triton's on-disk cache, they cost the timing process a cache read each.
        workers = args.compile_workers
        with multiprocessing.get_context("spawn").Pool(workers) as pool:
            tasks = [(index, workers, args.dry_run, args.part, shapes, formats, grid)
                     for index in range(workers)]  # fmt: skip
            pool.map(_warm, tasks)
        print(f"compiled in {time.perf_counter() - start:.0f} s by {workers} processes", flush=True)
    budget = math.inf if args.dry_run else args.budget_s - (time.perf_counter() - start)
    runner = Runner(args.dry_run, budget, args.rep_ms)
    if args.part == "quantized":
        quantized(runner, DRY["headline"] if args.dry_run else HEADLINE)
        return _write(args, runner, start, "decode-quantized")
    if args.part == "tiles":
        tiles(runner, DRY["headline"] if args.dry_run else shapes, grid, formats)
        return _write(args, runner, start, "decode-tiles")
    if args.part == "splits":
        splits(runner, DRY["shapes"] if args.dry_run else shapes, formats)
        return _write(args, runner, start, "decode-split-counts")
    if args.part == "appends":
        appends(runner, DRY["appends"] if args.dry_run else APPEND_SHAPES, PROGRAM_TOKENS)
        return _write(args, runner, start, "decode-append-tokens")
    if args.part == "pdl":
        pdl(runner, DRY["headline"] if args.dry_run else PDL_SHAPES)
        return _write(args, runner, start, "decode-pdl")
    headline(runner, DRY["headline"] if args.dry_run else HEADLINE)
    appends(runner, ((1, DRY["append"] if args.dry_run else APPEND_TOKENS),))
    sweep(runner, DRY["shapes"] if args.dry_run else SHAPES)
    return _write(args, runner, start, "decode-splits")


def _shapes(text: str) -> tuple[tuple[int, int], ...]:
    """ "1:1024,8:8192" -> ((1, 1024), (8, 8192))."""
    try:
        return tuple((int(b), int(s)) for b, s in (pair.split(":") for pair in text.split(",")))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected B:S pairs separated by commas, got {text!r}") from None


def _write(args, runner: Runner, start: float, name: str) -> int:
    import torch

    from tritonkit.bench import report

    device = "cpu (dry run)" if args.dry_run else torch.cuda.get_device_name()
    seconds = time.perf_counter() - start
    record = {"device": device, "torch": torch.__version__, "heads": runner.heads, "page_size": PAGE,
              "dtype": str(runner.dtype), "seconds": seconds, "rows": runner.rows}  # fmt: skip
    report.write_record(args.out, name, record)
    skipped = sum("skipped" in row for row in runner.rows)
    print(f"{len(runner.rows)} runs, {skipped} skipped, {seconds:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
