"""Time two source trees of tritonkit on the same GPU in one call, alternating, and compare them case by case.

    python3 benchmarks/before_after.py BEFORE_SRC AFTER_SRC NAMES... --out DIR [--rounds 2] [--mode fwd+bwd]
        [--case KEY=VALUE ...]...

Each round runs ``tritonkit bench NAMES --providers tritonkit --cuda-graph --dtype bfloat16 --sizes sweep`` (or,
with ``--case``, repeatable, those cases in place of the kernels' own, as ``tritonkit bench --case``) once with each
tree on PYTHONPATH (before, after, before, after, ...), in fresh processes that share one calibration, so
that drift of the GPU's clocks over the call lands on both. Per case the best of the rounds is kept (the least
disturbed run), and the table gives before, after and after / before. Writes DIR/before-after.md and .json; prints
the table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path


def bench(src: str, names: list[str], mode: str, out: Path, label: str, cache: Path,
          cases: list[list[str]] | None = None) -> dict:  # fmt: skip
    """One ``tritonkit bench`` run of the tree ``src`` (over ``cases``, each a list of KEY=VALUE, when given): case
    id -> ms (CUDA-graph GPU time of tritonkit)."""
    env = {**os.environ, "PYTHONPATH": src, "TRITONKIT_CACHE_DIR": str(cache), "TRITONKIT_AUTOTUNE": "quick"}
    env.pop("TRITON_INTERPRET", None)
    sizes = [word for case in cases for word in ("--case", *case)] if cases else ["--sizes", "sweep"]
    command = [sys.executable, "-m", "tritonkit", "bench", *names, "--mode", mode, "--dtype", "bfloat16", *sizes,
               "--providers", "tritonkit", "--cuda-graph", "--out", str(out), "--label", label]  # fmt: skip
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    (out / f"{label}.log").write_text(result.stdout + result.stderr)
    if result.returncode:
        raise RuntimeError(f"{label} failed:\n{result.stderr[-3000:]}")
    (path,) = out.glob(f"*-{label}.json")
    rows = json.loads(path.read_text())["results"]
    return {(r["spec"], r["case_id"]): r["ms"] for r in rows if r["provider"] == "tritonkit" and r["ms"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("names", nargs="+")
    parser.add_argument("--out", required=True)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--mode", default="fwd+bwd")
    parser.add_argument(
        "--case",
        nargs="+",
        action="append",
        metavar="KEY=VALUE",
        help="time this case in place of the kernels' own (repeatable; tritonkit bench --case)",
    )
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cache = out / "cache"
    runs = {"before": [], "after": []}
    for index in range(args.rounds):
        for which in ("before", "after"):
            src = args.before if which == "before" else args.after
            runs[which].append(bench(src, args.names, args.mode, out, f"{which}-{index}", cache, args.case))
    keys = [key for key in runs["before"][0] if all(key in run for run in runs["before"] + runs["after"])]
    table = []
    for spec, case in keys:
        before = min(run[spec, case] for run in runs["before"])
        after = min(run[spec, case] for run in runs["after"])
        table.append({"spec": spec, "case": case, "before_ms": before, "after_ms": after, "ratio": after / before})
    worst = max(table, key=lambda row: abs(row["ratio"] - 1.0))
    lines = [
        f"# Before and after, {args.mode}, bfloat16, CUDA-graph GPU time (best of {args.rounds} alternating rounds)",
        "",
        f"before: {args.before}; after: {args.after}; `tritonkit bench NAMES --mode {args.mode} --providers tritonkit "
        f"--cuda-graph {' '.join('--case ' + ' '.join(c) for c in args.case) if args.case else '--sizes sweep'}`.",
        "",
        "| kernel | case | before ms | after ms | after / before |",
        "|---|---|---|---|---|",
        *(
            f"| {r['spec']} | {r['case']} | {r['before_ms']:.4f} | {r['after_ms']:.4f} | {r['ratio']:.3f} |"
            for r in table
        ),
        "",
        f"{len(table)} cases; within ±2%: {sum(abs(r['ratio'] - 1) <= 0.02 for r in table)}; the farthest: "
        f"{worst['spec']} {worst['case']} {worst['ratio']:.3f}.",
    ]
    (out / "before-after.md").write_text("\n".join(lines) + "\n")
    rounds = {which: [{f"{spec} {case}": ms for (spec, case), ms in run.items()} for run in run_list]
              for which, run_list in runs.items()}  # fmt: skip
    (out / "before-after.json").write_text(json.dumps({"rounds": rounds, "table": table}, indent=1) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
