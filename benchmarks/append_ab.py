"""kv_cache_append of a prompt in place (decode_table.py's prompt cases: one sequence of 8192 tokens, eight of 2048;
int8 and int4 caches), CUDA-graph GPU time, three replays a case, for the tritonkit tree on PYTHONPATH. Run it for
two trees in turn, alternating, to compare them in one call:

    for round in 1 2; do PYTHONPATH=OLD/src python3 benchmarks/append_ab.py before
                         PYTHONPATH=src python3 benchmarks/append_ab.py after; done
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode_table import APPEND_CASES  # the benchmarks folder is no package: its own path

import tritonkit as tk
from tritonkit import catalog
from tritonkit.bench.harness import graph_replay_ms


def main(label: str) -> None:
    spec = catalog.get("kv_cache_append")
    for values in APPEND_CASES:
        if values["s"] != 0 or values["kv"] not in ("int8", "int4"):
            continue
        case = spec.parse_case(values)
        inputs = spec.make_inputs(case, torch.device("cuda"), torch.bfloat16, torch.Generator("cuda").manual_seed(0))
        ms = [graph_replay_ms(lambda inputs=inputs: tk.ops.kv_cache_append(*inputs.args, **inputs.kwargs))
              for _ in range(3)]  # fmt: skip
        gbps = spec.bytes_moved(case, torch.bfloat16) / min(ms) / 1e6
        times = " ".join(f"{m * 1e3:6.2f}" for m in ms)
        print(f"{label:10} b{values['b']} sq{values['sq']} {values['kv']:5} {times} us  best {gbps:6.0f} GB/s")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "this tree")
