"""Three probes of flash decoding's timing conditions on a GPU, each printing one line a measurement
(docs/kernels/decoding.md, Open gaps):

    python benchmarks/decode_probes.py --part clocks|capacity|order

``clocks``: paged bf16 and int8 at B64 S32k and B256 S16k, each timed four times in a row by
``triton.testing.do_bench_cudagraph`` and twice by the harness' ``graph_replay_ms``, then once after three idle
seconds, with nvidia-smi's SM clock, memory clock, power, temperature and throttle reasons after each: is a first
timing slower, and what does the power cap do to the SM clock?
``capacity``: contiguous caches at B64 S8k/S32k, B8 S32k, B256 S1k and B64 S1k with the capacity (the sequences'
stride) a power of two and 5, 64 and 256 tokens more, beside the paged cache: does a power-of-two stride slow it?
``order``: the decode table's own entries at B64 S8k (benchmarks/decode_table.py's timed()), contiguous alone, in
parts and after the paged entry with its peers: does the order of a run slow the contiguous cache?
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import torch
import triton.testing

from tritonkit import catalog
from tritonkit.bench.harness import graph_replay_ms

HEADS = {"hq": 32, "hk": 8, "d": 128}


def _smi() -> str:
    query = "clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active"
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=10).stdout.strip()  # fmt: skip
    except Exception as error:  # a probe's note, not its result
        out = repr(error)
    return out


def _inputs(spec, values: dict):
    case = spec.parse_case(values)
    inputs = spec.make_inputs(case, torch.device("cuda"), torch.bfloat16, torch.Generator("cuda").manual_seed(0))
    return case, inputs, (lambda: spec.fn(*inputs.args, **inputs.kwargs))


def clocks() -> None:
    spec = catalog.get("decode_attention")
    for b, s in ((64, 32768), (256, 16384)):
        for kv in ("plain", "int8"):
            values = {"b": b, "s": s, **HEADS, "page_size": 64} | ({} if kv == "plain" else {"kv": kv})
            start = time.perf_counter()
            case, inputs, fn = _inputs(spec, values)
            torch.cuda.synchronize()
            made = time.perf_counter() - start
            fn()
            torch.cuda.synchronize()
            gb = spec.bytes_moved(case, torch.bfloat16) / 1e9
            print(f"B{b} S{s} {kv}: inputs made in {made:.2f} s; clocks {_smi()}", flush=True)
            for i in range(4):
                ms = triton.testing.do_bench_cudagraph(fn, rep=100)
                print(f"  do_bench_cudagraph #{i}: {ms * 1e3:8.1f} us {gb / ms * 1e3:6.0f} GB/s; clocks {_smi()}",
                      flush=True)  # fmt: skip
            for i in range(2):
                ms = graph_replay_ms(fn)
                print(f"  harness graph_replay_ms #{i}: {ms * 1e3:8.1f} us {gb / ms * 1e3:6.0f} GB/s", flush=True)
            time.sleep(3)
            ms = triton.testing.do_bench_cudagraph(fn, rep=100)
            print(f"  after 3 s idle: {ms * 1e3:8.1f} us {gb / ms * 1e3:6.0f} GB/s; clocks {_smi()}", flush=True)
            del inputs, fn
            torch.cuda.empty_cache()


def capacity() -> None:
    spec = catalog.get("decode_attention")
    for b, s in ((64, 8192), (64, 32768), (8, 32768), (256, 1024), (64, 1024)):
        for capacity in (s, s + 5, s + 64, s + 256):
            for page in (0, 64):
                if page and capacity != s:
                    continue
                values = {"b": b, "s": s, **HEADS, "capacity": capacity} | ({"page_size": page} if page else {})
                case, inputs, fn = _inputs(spec, values)
                fn()
                torch.cuda.synchronize()
                ms = min(graph_replay_ms(fn) for _ in range(2))
                gb = spec.bytes_moved(case, torch.bfloat16) / 1e9
                layout = "paged" if page else "contiguous"
                print(f"B{b} S{s} capacity {capacity} {layout}: {ms * 1e3:8.1f} us {gb / ms * 1e3:6.0f} GB/s",
                      flush=True)  # fmt: skip
                del inputs, fn
                torch.cuda.empty_cache()


def order() -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    import decode_table

    case = {"b": 64, "s": 8192, **decode_table.HEADS, "capacity": 8192}
    paged = {"role": "paged", "case": {**case, "page_size": 64}, "providers": ("tritonkit", "flex", "xformers")}
    contiguous = {"role": "contiguous", "case": case, "providers": ("tritonkit", "sdpa", "xformers")}

    def only(entry, providers):
        return {**entry, "providers": providers}

    runs = (("contiguous alone (tritonkit, sdpa, xformers)", [contiguous]),
            ("contiguous tritonkit alone", [only(contiguous, ("tritonkit",))]),
            ("sdpa then tritonkit", [only(contiguous, ("sdpa",)), only(contiguous, ("tritonkit",))]),
            ("paged (all) then contiguous (all)", [paged, contiguous]))  # fmt: skip
    for name, entries in runs:
        results, _ = decode_table.timed(entries)
        print(name, flush=True)
        for row in (r.to_dict() for r in results):
            us = row["ms"] * 1e3 if row["ms"] else float("nan")
            print(f"   {row['case_id']:50} {row['provider']:10} {us:8.1f} us {row['gbps'] or 0:6.0f} GB/s "
                  f"{row.get('skipped') or ''}", flush=True)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=("clocks", "capacity", "order"), required=True)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("the probes time on a CUDA GPU")
    {"clocks": clocks, "capacity": capacity, "order": order}[args.part]()
    return 0


if __name__ == "__main__":
    sys.exit(main())
