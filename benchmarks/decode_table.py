"""Flash decoding against its peers in one run: tritonkit.ops.decode_attention over a paged bf16 cache, a contiguous
one and paged int8, fp8 and int4 caches; SDPA with GQA over a contiguous cache of the same shape, every sequence full;
FlexAttention (compiled) over the same paged cache through a block mask, and xFormers' Triton split-K kernel over
both caches where its wheel is installed (tritonkit.bench.decoding_peers). Each is
timed in this process as CUDA-graph GPU time (tritonkit.bench.harness.measure_case), one new token per sequence,
GQA 32:8, d128.

    python benchmarks/decode_table.py --out DIR [--quick] [--dry-run]

GB/s from the spec's cost model: the keys and values of every token in its format (data and scales), q, the output
and the block table's used entries; % of the calibrated copy bandwidth. Also measured: a sweep of page sizes at one
shape, kv_cache_append's GB/s in place (a decode step's token and a prompt's), a whole decode step (append +
attention) replayed from a CUDA graph, and the host time of one eager decode_attention call (µs, median of calls that
each wait for the GPU first, so that only the host's work is timed).

Writes into DIR: ``<date>-decode-table.json`` and ``.md`` (every measurement, as ``tritonkit bench`` writes them,
with its plots), and ``<date>-decode-table-peers.md``: per batch and length, tritonkit paged against SDPA and
FlexAttention, % of bandwidth, and the quantized caches' speed-ups over paged bf16.

``--dry-run`` checks the script end to end on the CPU: tiny shapes, each provider called once in float32 under
TRITON_INTERPRET=1 (FlexAttention eager; xFormers, CUDA only, left out), outputs compared with the spec's float64
reference; no times.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import time
from pathlib import Path

HEADS = {"hq": 32, "hk": 8, "d": 128}
PAGE = 64  # the page size of the main table; the page-size sweep varies it
GRID = ((1, (1024, 8192, 32768, 131072)), (8, (1024, 8192, 32768, 131072)), (64, (1024, 8192, 32768, 65536)),
        (256, (1024, 4096, 16384)))  # fmt: skip
QUICK = ((1, (32768,)), (8, (32768,)), (64, (4096,)))
PAGE_SWEEP = {"b": 8, "s": 32768, "pages": (16, 32, 64, 128, 256)}
FORMATS = ("int8", "fp8", "int4")


def cases(grid) -> list[dict]:
    """Every (paged bf16, contiguous, quantized) case of the grid: each sequence full (lengths = capacity)."""
    out = []
    for b, lengths in grid:
        for s in lengths:
            base = {"b": b, "s": s, **HEADS, "capacity": s}
            paged = {**base, "page_size": PAGE}
            out.append({"role": "paged", "case": paged, "providers": ("tritonkit", "flex", "xformers")})
            out.append({"role": "contiguous", "case": base, "providers": ("tritonkit", "sdpa", "xformers")})
            for fmt in FORMATS:
                out.append({"role": fmt, "case": {**base, "page_size": PAGE, "kv": fmt}, "providers": ("tritonkit",)})
    return out


def page_sweep() -> list[dict]:
    b, s = PAGE_SWEEP["b"], PAGE_SWEEP["s"]
    return [{"role": f"page{p}", "case": {"b": b, "s": s, **HEADS, "capacity": s, "page_size": p},
             "providers": ("tritonkit",)} for p in PAGE_SWEEP["pages"]]  # fmt: skip


def tiny(entry: dict) -> dict:
    case = {**entry["case"], "b": min(entry["case"]["b"], 2), "s": 40, "capacity": 40, "hq": 4, "hk": 1, "d": 16}
    if "page_size" in case:
        case["page_size"] = 16
    return {**entry, "case": case}


# ---------------------------------------------------------------- running


def timed(entries: list[dict]) -> tuple[list, object]:
    import torch

    from tritonkit import catalog
    from tritonkit.bench import calibrate
    from tritonkit.bench.harness import measure_case
    from tritonkit.bench.providers import select_providers

    ceilings = calibrate.load_or_calibrate()
    spec = catalog.get("decode_attention")
    results = []
    for index, entry in enumerate(entries, 1):
        print(f"[{index}/{len(entries)}] {entry['role']}: {entry['case']}", file=sys.stderr, flush=True)
        case = spec.parse_case(entry["case"])
        results += measure_case(spec, case, torch.bfloat16, "fwd", select_providers(spec, entry["providers"]),
                                ceilings, cuda_graph=True)  # fmt: skip
    return results, ceilings


# kv_cache_append in place: a decode step's one token per sequence, and a prompt's keys and values (prefill).
APPEND_CASES = tuple({"b": b, "s": 4096, "sq": 1, "hk": 8, "d": 128, "page_size": PAGE, "kv": kv}
                     for b in (8, 256) for kv in ("plain", "int8")) + tuple(
    {"b": b, "s": 0, "sq": sq, "hk": 8, "d": 128, "page_size": PAGE, "kv": kv, "capacity": sq}
    for b, sq in ((1, 8192), (8, 2048)) for kv in ("plain", "int8", "fp8", "int4"))  # fmt: skip


def append_in_place(copy_gbps: float) -> list:
    """kv_cache_append called on the cache itself (the registry's benchmark checks it on copies, whose clone and
    read-back would be timed too): CUDA-graph GPU time, GB/s of the spec's bytes (new keys and values read, written
    in the cache's format), as report rows. The call is idempotent: cache_seqlens is not advanced, so every replay
    writes the same slots."""
    import torch

    import tritonkit as tk
    from tritonkit import catalog
    from tritonkit.bench.harness import Measurement, graph_replay_ms

    spec = catalog.get("kv_cache_append")
    rows = []
    for values in APPEND_CASES:
        case = spec.parse_case(values)
        inputs = spec.make_inputs(case, torch.device("cuda"), torch.bfloat16, torch.Generator("cuda").manual_seed(0))
        ms = graph_replay_ms(lambda inputs=inputs: tk.ops.kv_cache_append(*inputs.args, **inputs.kwargs))
        gbps = spec.bytes_moved(case, torch.bfloat16) / ms / 1e6
        rows.append(Measurement(spec.name, spec.family, dict(case), spec.case_id(case), "bfloat16", "fwd", "tritonkit",
                                ms=ms, gbps=gbps, percent_of_ceiling=100 * gbps / copy_gbps))  # fmt: skip
    return rows


def dry(entries: list[dict]) -> list[dict]:
    """Each provider once per tiny entry on the CPU, its largest error against the float64 reference."""
    import torch

    from tritonkit import catalog
    from tritonkit.bench import decoding_peers
    from tritonkit.bench.harness import Measurement
    from tritonkit.bench.providers import Provider, select_providers

    spec = catalog.get("decode_attention")
    results = []
    for entry in map(tiny, entries):
        case = spec.parse_case(entry["case"])
        on_cpu = {
            "flex": Provider("flex", decoding_peers.flex_decode(compiled=False)),
            "xformers": Provider("xformers", None, "xFormers' split-K kernel runs on a CUDA GPU only"),
        }
        providers = [on_cpu.get(p.name, p) for p in select_providers(spec, entry["providers"])]  # fmt: skip
        for provider in providers:
            row = Measurement(spec.name, spec.family, dict(case), spec.case_id(case), "float32", "fwd", provider.name)
            if provider.fn is None:
                row.skipped = provider.skip_reason
                results.append(row)
                continue
            inputs = spec.make_inputs(case, "cpu", torch.float32, torch.Generator().manual_seed(0))
            try:
                out = provider.fn(*inputs.args, **inputs.kwargs)
            except Exception as error:  # recorded as the GPU run records it
                row.skipped = f"failed: {type(error).__name__}: {str(error).splitlines()[0][:160]}"
            else:
                as64 = [a.double() if a.is_floating_point() else a for a in inputs.args]
                error = (out.double() - spec.reference(*as64, **inputs.kwargs)).abs().max().item()
                row.skipped = f"dry run: ran; max abs error {error:.1e} against the float64 reference"
            results.append(row)
    return results


def decode_step_and_host_cost() -> dict:
    """A whole decode step (kv_cache_append + decode_attention, B8 S4096 paged) replayed from a CUDA graph, and the
    host time of one eager decode_attention call at B1 S1024 (median of 200 calls, each after a synchronisation)."""
    import torch

    import tritonkit as tk
    from tritonkit import catalog
    from tritonkit.bench.harness import graph_replay_ms

    spec = catalog.get("decode_attention")
    case = spec.parse_case({"b": 8, "s": 4096, **HEADS, "capacity": 4097, "page_size": PAGE})
    inputs = spec.make_inputs(case, torch.device("cuda"), torch.bfloat16, torch.Generator("cuda").manual_seed(0))
    q, k_cache, v_cache, lengths = inputs.args
    table = inputs.kwargs["block_table"]
    before = lengths - 1
    k_new = torch.randn(8, 1, HEADS["hk"], HEADS["d"], device="cuda", dtype=torch.bfloat16)
    v_new = torch.randn_like(k_new)

    def step():
        tk.ops.kv_cache_append(k_new, v_new, k_cache, v_cache, before, block_table=table)
        return tk.ops.decode_attention(q, k_cache, v_cache, lengths, block_table=table)

    step_ms = graph_replay_ms(step)
    small = spec.make_inputs(spec.parse_case({"b": 1, "s": 1024, **HEADS, "page_size": PAGE}), torch.device("cuda"),
                             torch.bfloat16, torch.Generator("cuda").manual_seed(1))  # fmt: skip
    for _ in range(20):
        tk.ops.decode_attention(*small.args, **small.kwargs)
    host = []
    for _ in range(200):
        torch.cuda.synchronize()
        start = time.perf_counter()
        tk.ops.decode_attention(*small.args, **small.kwargs)
        host.append((time.perf_counter() - start) * 1e6)
    return {"decode_step_graph_ms": step_ms, "host_us_per_call": statistics.median(host)}


# ---------------------------------------------------------------- the comparison


def _by(results: list[dict]) -> dict[tuple, dict]:
    return {(r["case_id"], r["provider"]): r for r in results if r["spec"] == "decode_attention"}


def _case_id(case: dict) -> str:
    from tritonkit import catalog

    spec = catalog.get("decode_attention")
    return spec.case_id(spec.parse_case(case))


def comparison(results: list[dict], entries: list[dict], ceilings_gbps: float | None, extra: dict) -> str:
    """The peers markdown: one line per (B, S) of the grid, then the page sweep, the append and the step."""
    by = _by(results)

    def row(role, b, s):
        entry = next((e for e in entries if e["role"] == role and e["case"]["b"] == b and e["case"]["s"] == s), None)
        return entry and _case_id(entry["case"])

    def ms(case_id, provider):
        found = by.get((case_id, provider))
        return found and found.get("ms")

    def gbps(case_id, provider):
        found = by.get((case_id, provider))
        return f"{found['gbps']:.0f}" if found and found.get("gbps") else "—"

    def ratio(theirs, ours):
        return f"{theirs / ours:.2f}x" if theirs and ours else "—"

    def mhz(case_id):
        found = by.get((case_id, "tritonkit"))
        return f"{found['sm_mhz']:.0f}" if found and found.get("sm_mhz") else "—"

    lines = ["| B | S | tritonkit paged GB/s | % of copy | vs SDPA-GQA (contiguous) | vs FlexAttention (paged) | "
             "vs xFormers split-K (paged) | contiguous GB/s | vs xFormers (contiguous) | int8 | fp8 | int4 | "
             "SM MHz bf16 / int8 |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    shapes = sorted({(e["case"]["b"], e["case"]["s"]) for e in entries if e["role"] == "paged"})
    for b, s in shapes:
        paged, contiguous = row("paged", b, s), row("contiguous", b, s)
        ours = ms(paged, "tritonkit")
        found = by.get((paged, "tritonkit"))
        percent = f"{found['percent_of_ceiling']:.0f}%" if found and found.get("percent_of_ceiling") else "—"
        quantized = [ratio(ours, ms(row(fmt, b, s), "tritonkit")) for fmt in FORMATS]
        lines.append(
            f"| {b} | {s} | {gbps(paged, 'tritonkit')} | {percent} | {ratio(ms(contiguous, 'sdpa'), ours)} | "
            f"{ratio(ms(paged, 'flex'), ours)} | {ratio(ms(paged, 'xformers'), ours)} | "
            f"{gbps(contiguous, 'tritonkit')} | {ratio(ms(contiguous, 'xformers'), ms(contiguous, 'tritonkit'))} | "
            f"{' | '.join(quantized)} | {mhz(paged)} / {mhz(row('int8', b, s))} |"
        )
    lines += [
        "",
        "Ratios: the other's time over tritonkit paged bf16's (> 1: tritonkit faster), xFormers on a contiguous "
        "cache over tritonkit's contiguous; int8, fp8 and int4: paged bf16's time over the quantized cache's. "
        "SM MHz: the median SM clock while tritonkit's paged bf16 and int8 were timed (nvidia-smi; the power cap "
        "lowers it, which slows the quantized caches' conversions and not bf16's streaming).",
        "",
        "| page size | GB/s | % of copy |",
        "|---|---|---|",
    ]
    for entry in (e for e in entries if e["role"].startswith("page") and e["role"] != "paged"):
        found = by.get((_case_id(entry["case"]), "tritonkit"))
        if found and found.get("gbps"):
            size, percent = entry["case"]["page_size"], found["percent_of_ceiling"]
            lines.append(f"| {size} | {found['gbps']:.0f} | {percent:.0f}% |")
    lines += ["", "| kv_cache_append in place | µs | GB/s | % of copy |", "|---|---|---|---|"]
    for found in (r for r in results if r["spec"] == "kv_cache_append" and r.get("gbps")):
        lines.append(f"| {found['case_id']} | {found['ms'] * 1000:.1f} | {found['gbps']:.0f} | "
                     f"{found['percent_of_ceiling']:.0f}% |")  # fmt: skip
    if extra:
        lines += ["", f"A decode step (append + attention, B8 S4096 paged {PAGE}) from a CUDA graph: "
                  f"{extra['decode_step_graph_ms'] * 1000:.1f} µs; one eager decode_attention call costs "
                  f"{extra['host_us_per_call']:.1f} µs of host time."]  # fmt: skip
    if ceilings_gbps:
        lines += ["", f"Copy ceiling (calibrated, read + written): {ceilings_gbps:.0f} GB/s."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--quick", action="store_true", help="three shapes, no page sweep")
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU, each provider once, no times")
    args = parser.parse_args(argv)
    entries = cases(QUICK if args.quick or args.dry_run else GRID) + (
        [] if args.quick or args.dry_run else page_sweep()
    )
    date = datetime.date.today().isoformat()
    stem = f"{date}-decode-table"
    import torch

    from tritonkit.bench import report

    if args.dry_run:
        results, ceilings, extra = dry(entries), None, {}
        entries = [tiny(e) for e in entries]
    else:
        if not torch.cuda.is_available():
            parser.error("timing needs a CUDA GPU (--dry-run checks the script on the CPU)")
        results, ceilings = timed(entries)
        results += append_in_place(ceilings.bandwidth_gbps)
        extra = decode_step_and_host_cost()
    meta = {"what": "decode-table", "date": date, **report.environment(args.dry_run),
            "command": report.script_command(argv),
            "dtype": "float32" if args.dry_run else "bfloat16", "cuda_graph": not args.dry_run,
            "sizes": "given cases", "dry_run": args.dry_run, **extra}  # fmt: skip
    paths = report.write_all(args.out, stem, results, meta, ceilings)
    rows = [r.to_dict() for r in results]
    peers = args.out / f"{stem}-peers.md"
    peers.write_text(f"# Flash decoding against its peers ({'dry run' if args.dry_run else 'CUDA-graph GPU time'})\n\n"
                     + comparison(rows, entries, ceilings and ceilings.bandwidth_gbps, extra))  # fmt: skip
    print("\n".join(str(p) for p in [*paths, peers]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
