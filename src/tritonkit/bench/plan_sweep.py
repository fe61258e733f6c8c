"""The frame of the plan sweeps (benchmarks/matmul_tiles.py, gemv_plans.py, code_tiles.py): candidate plans forced
through a launcher's ``plan=``, beside the plan the GPU takes and the peers, timed by the harness (CUDA-graph GPU
time, inputs rotated past L2) on one spec's cases, written as ``<date>-<name>.json`` with a markdown summary."""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path


def time_cases(spec_name: str, cases: Sequence[dict], providers_for: Callable) -> tuple[list[dict], float | None]:
    """Every case of ``spec_name`` (in bf16, forward) with ``providers_for(spec, case)``'s providers: the harness's
    rows as dicts, and the calibrated copy bandwidth (GB/s, None without a calibration)."""
    import torch

    from tritonkit import catalog
    from tritonkit.bench import calibrate
    from tritonkit.bench.harness import measure_case

    spec = catalog.get(spec_name)
    ceilings = calibrate.load_or_calibrate()
    results = []
    for values in cases:
        print(", ".join(f"{key} {value}" for key, value in values.items()), file=sys.stderr, flush=True)
        case = spec.parse_case(values)
        results += measure_case(spec, case, torch.bfloat16, "fwd", providers_for(spec, case), ceilings,
                                cuda_graph=True)  # fmt: skip
    return [row.to_dict() for row in results], ceilings.bandwidth_gbps if ceilings is not None else None


def main(argv: Sequence[str] | None, *, doc: str, name: str, title: str, spec_name: str, default_rows: Sequence[int],
         cases: Callable, providers_for: Callable, candidates: dict, summary: Callable,
         dry: Callable) -> int:  # fmt: skip
    """A sweep's command line: ``--out DIR``, ``--rows M ...`` (``cases(rows)`` gives the spec's cases) and
    ``--dry-run`` (``dry()`` under the CPU interpreter, its exit status). Timed, it writes the record (the device,
    torch, the ``candidates`` and the rows) and ``summary(record)`` under ``# {title} (device, ...)`` as its .md."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rows", type=int, nargs="+", default=list(default_rows), help="the values of M timed")
    parser.add_argument("--dry-run", action="store_true", help="every candidate once on the CPU, no times")
    args = parser.parse_args(argv)
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"
        return dry()
    import torch

    from tritonkit.bench import report

    if not torch.cuda.is_available():
        parser.error("timing needs a CUDA GPU (--dry-run checks the script on the CPU)")
    results, copy_gbps = time_cases(spec_name, cases(tuple(args.rows)), providers_for)
    record = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "candidates": candidates,
              "copy_gbps": copy_gbps, "results": results}  # fmt: skip
    path = report.write_record(args.out, name, record)
    text = f"# {title} ({record['device']}, CUDA-graph GPU time)\n\n{summary(record)}"
    path.with_suffix(".md").write_text(text)
    print(text)
    return 0


def times(record: dict) -> dict[tuple[int, int, int, str], float]:
    """(M, N, K, provider) -> milliseconds of a record's timed rows."""
    return {(r["case"]["m"], r["case"]["n"], r["case"]["k"], r["provider"]): r["ms"]
            for r in record["results"] if r.get("ms")}  # fmt: skip


def geomean(values: Sequence[float]) -> float:
    return math.exp(sum(map(math.log, values)) / len(values))


def fastest(by: dict, m: int, n: int, k: int, peer: str) -> tuple[str, dict] | None:
    """The fastest provider but ``peer`` at (m, n, k), with the shape's times by provider; None where the shape or its
    peer was not timed."""
    here = {key[3]: ms for key, ms in by.items() if key[:3] == (m, n, k)}
    ours = {name: ms for name, ms in here.items() if name != peer}
    if not ours or peer not in here:
        return None
    return min(ours, key=ours.get), here


def peer_ratio_summary(record: dict, shapes: Sequence[tuple[int, int]], peer: str, peer_name: str) -> str:
    """Per M, the geometric mean over ``shapes`` (N, K) of ``peer``'s time over each other provider's; then each
    shape's fastest provider, with the peer's time over it and over the plan's ("tritonkit")."""
    by = times(record)
    lines = [f"| M | provider | geomean {peer_name} time / its time | shapes |", "|---|---|---|---|"]
    best_lines = [f"| M | N | K | best | {peer_name} / best | {peer_name} / plan's |", "|---|---|---|---|---|---|"]
    for m in sorted({key[0] for key in by}):
        for name in sorted({key[3] for key in by if key[0] == m and key[3] != peer}):
            ratios = [by[(m, n, k, peer)] / by[(m, n, k, name)] for n, k in shapes
                      if (m, n, k, name) in by and (m, n, k, peer) in by]  # fmt: skip
            if ratios:
                lines.append(f"| {m} | {name} | {geomean(ratios):.2f}x | {len(ratios)} |")
        for n, k in shapes:
            if (found := fastest(by, m, n, k, peer)) is None:
                continue
            best, here = found
            plan = f"{here[peer] / here['tritonkit']:.2f}x" if "tritonkit" in here else "—"
            best_lines.append(f"| {m} | {n} | {k} | {best} | {here[peer] / here[best]:.2f}x | {plan} |")
    return "\n".join(lines) + "\n\n" + "\n".join(best_lines) + "\n"
