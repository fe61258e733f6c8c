"""The ``tritonkit`` command: list, show, check and bench the registered kernels."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

from tritonkit._core.env import enable_interpreter_if_no_gpu, interpreter_problem
from tritonkit._core.text import format_fields, format_table, parse_case_tokens
from tritonkit.bench import MODES, SIZES

_DTYPE_NAMES = ("float32", "float16", "bfloat16", "uint8")


def _dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _cmd_list(args) -> int:
    from tritonkit import catalog

    specs = catalog.select(tag=args.tag)
    if not specs:
        tags = sorted({tag for spec in catalog.all_specs() for tag in (spec.family, *spec.tags)})
        print(f"no kernel is tagged {args.tag!r} or of that family; tags: {', '.join(tags)}", file=sys.stderr)
        return 2
    rows = [[s.name, s.family, ",".join(s.tags), "yes" if s.has_backward else "no", s.status] for s in specs]
    print(format_table(["name", "family", "tags", "backward", "status"], rows))
    return 0


def _case_keys(case_type) -> str:
    """A case type's keys as `show` lists them: required ones bare, the others with their default."""

    keys = []
    for f in dataclasses.fields(case_type):
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        keys.append(f.name if required else f"{f.name}={f.default!r}")
    return ", ".join(keys)


def _cmd_show(args) -> int:
    from tritonkit import catalog

    try:
        spec = catalog.get(args.name)
    except KeyError as error:
        print(error.args[0], file=sys.stderr)
        return 2
    fields = [
        ("name", spec.name),
        ("family", spec.family),
        ("status", spec.status),
        ("tags", ", ".join(spec.tags)),
        ("summary", spec.summary),
        ("description", spec.description),
        ("usage", spec.usage),
        ("limits", spec.limits),
        ("dtypes", ", ".join(_dtype_name(d) for d in spec.dtypes)),
        ("backward", "yes" if spec.has_backward else "no"),
        ("min triton", spec.min_triton),
        ("peers", ", ".join(spec.peers) or "-"),
        ("notes", spec.notes or "-"),
        ("test cases", str(len(spec.test_cases))),
        ("gpu cases", str(len(spec.gpu_cases))),
        ("case keys", _case_keys(spec.case_type)),
        ("bench cases", "; ".join(spec.case_id(case) for case in spec.bench_cases)),
    ]
    print(format_fields(fields))
    return 0


def _given_cases(args, specs) -> list | None:
    """``--case`` options, each parsed as every selected kernel's case type (an unknown key raises ValueError);
    None when there are none."""
    if not args.case:
        return None
    cases = [parse_case_tokens(tokens) for tokens in args.case]
    for spec in specs:
        for case in cases:
            spec.parse_case(case)
    return cases


def _cmd_check(args) -> int:
    # Before any kernel module is imported: autotuned kernels read their config list when they are defined.
    os.environ.setdefault("TRITONKIT_AUTOTUNE", "quick")
    import torch

    from tritonkit import catalog, check

    on_gpu = torch.cuda.is_available() and not _interpreting()
    try:
        specs = catalog.select(args.names, tag=args.tag)
        given = _given_cases(args, specs)
    except KeyError as error:
        print(error.args[0], file=sys.stderr)
        return 2
    except ValueError as error:
        print(error, file=sys.stderr)
        return 2
    if not specs:
        print(f"nothing to check: no kernel is tagged {args.tag!r} or of that family", file=sys.stderr)
        return 2
    if args.dtype is not None:
        takes = [spec for spec in specs if args.dtype in (_dtype_name(d) for d in spec.dtypes)]
        if not takes:
            dtypes = ", ".join(f"{s.name}: {', '.join(_dtype_name(d) for d in s.dtypes)}" for s in specs)
            print(f"--dtype {args.dtype}: no selected kernel takes it ({dtypes})", file=sys.stderr)
            return 2
        specs = takes
    device = "cuda" if on_gpu else "cpu"
    if on_gpu:
        print(f"Checking compiled kernels on {torch.cuda.get_device_name()} with GPU-sized cases.")
    else:
        print("No CUDA GPU in use: running through the Triton interpreter (TRITON_INTERPRET=1) with small cases.")
    dtypes = lambda spec: tuple(_dtype_name(d) for d in spec.dtypes if args.dtype in (None, _dtype_name(d)))  # noqa: E731
    # On a GPU one job per kernel, dtype and case (its forward and gradient rows), so that a slow kernel spreads over
    # the workers; the compute-bound ones (GEMMs that autotune, attention's many kernel variants), fp32 first as the
    # slowest to compile, start first so that none of them is left running alone at the end. Under the interpreter
    # one job per kernel and dtype.
    jobs = [check.Job(spec.name, (dtype,), tuple(given) if given else None, args.seed, device, args.verbose)
            for spec in specs for dtype in dtypes(spec)]  # fmt: skip
    if on_gpu:
        jobs = [dataclasses.replace(job, only=labels) for job in jobs for labels in check.case_labels(job)]
    jobs.sort(key=lambda job: ("compute-bound" not in catalog.get(job.name).tags, job.dtypes != ("float32",)))
    workers = args.jobs or (min(check.MAX_JOBS, os.cpu_count() or 1, len(jobs)) if on_gpu else 1)
    passed, failed = check.run(jobs, {spec.name: spec.family for spec in specs}, workers)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


def _bench_cases(args) -> list | None:
    """The parsed ``--case`` options, each checked against every selected kernel (None when there are none)."""
    if args.case and args.names == ["calibrate"]:
        raise ValueError("--case does not apply to `tritonkit bench calibrate`")
    if not args.case:
        return None
    from tritonkit import catalog

    return _given_cases(args, catalog.select(args.names, tag=args.tag))


def _cmd_bench(args) -> int:
    import datetime
    from pathlib import Path

    import torch

    try:  # bad options and unknown kernels are reported before the device is looked at
        cases = _bench_cases(args)
        if args.names != ["calibrate"]:
            from tritonkit import catalog

            if not catalog.select(args.names, tag=args.tag):
                raise ValueError(f"nothing to benchmark: no kernel is tagged {args.tag!r} or of that family")
    except ValueError as error:
        print(error, file=sys.stderr)
        return 2
    except KeyError as error:
        print(error.args[0], file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("tritonkit bench needs a CUDA GPU; none was found", file=sys.stderr)
        return 2
    if _interpreting():
        print("tritonkit bench times compiled kernels: unset TRITON_INTERPRET", file=sys.stderr)
        return 2
    import triton

    from tritonkit import catalog
    from tritonkit.bench import calibrate, harness, report

    date = datetime.date.today().isoformat()
    meta = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "date": date,
        "cuda_graph": args.cuda_graph,
        "command": "tritonkit " + " ".join(sys.argv[1:]),
        "sizes": "given cases" if cases else args.sizes,
        "mode": args.mode,
    }
    if args.names == ["calibrate"]:
        ceilings, by_block = calibrate.calibrate()
        path = calibrate.save(ceilings)
        print(report.ceilings_line(ceilings))
        print("copy GB/s by block size: " + ", ".join(f"{b}: {v:.0f}" for b, v in by_block.items()))
        print(f"cached in {path}")
        if args.out:
            out = Path(args.out)
            out.mkdir(parents=True, exist_ok=True)
            record = {
                "meta": meta,
                "bandwidth_gbps": ceilings.bandwidth_gbps,
                "copy_gbps_by_block": by_block,
                "matmul_tflops": ceilings.matmul_tflops,
            }
            (out / f"{date}-calibration.json").write_text(json.dumps(record, indent=2) + "\n")
            (out / f"{date}-calibration.md").write_text(
                f"# Calibration\n\n{meta['device']}; torch {meta['torch']}, triton {meta['triton']}; {date}.\n\n"
                f"{report.ceilings_line(ceilings)}\n\nCopy bandwidth (bytes read + written) by block size of "
                "tk.ops.copy over 1 GiB of fp32: "
                + ", ".join(f"{b}: {v:.0f} GB/s" for b, v in by_block.items())
                + ".\n"
            )
        return 0
    try:
        specs = catalog.select(args.names, tag=args.tag)
    except KeyError as error:
        print(error.args[0], file=sys.stderr)
        return 2
    ceilings = calibrate.load_or_calibrate()
    try:
        results = harness.run(
            specs,
            dtypes=args.dtype,
            modes=[args.mode],
            sizes=args.sizes,
            providers=args.providers,
            ceilings=ceilings,
            cuda_graph=args.cuda_graph,
            cases=cases,
        )
    except ValueError as error:
        print(error, file=sys.stderr)
        return 2
    print(report.terminal_table(results))
    print(report.ceilings_line(ceilings))
    if args.out:
        what = args.label or ("-".join(args.names) if args.names else args.tag or "all")
        meta["what"] = what
        for path in report.write_all(Path(args.out), f"{date}-{what}", results, meta, ceilings):
            print(f"wrote {path}")
    return 0


def _interpreting() -> bool:
    from tritonkit._core.env import interpreting

    return interpreting()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tritonkit",
        description="Verified Triton kernels: list them, show one, check them against their references, "
        "benchmark them.",
        epilog="On a machine without a CUDA GPU the kernels run through the Triton interpreter.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    listing = sub.add_parser("list", help="table of registered kernels", description="Table of registered kernels.")
    listing.add_argument("--tag", help="only kernels with this tag or family")
    listing.set_defaults(run=_cmd_list)

    show = sub.add_parser(
        "show",
        help="one kernel's metadata, usage and limits",
        description="Show one kernel's metadata, usage and limits.",
    )
    show.add_argument("name", help="kernel name, as printed by `tritonkit list`")
    show.set_defaults(run=_cmd_show)

    check = sub.add_parser(
        "check",
        help="verify kernels against their references",
        description="Run every case of the selected kernels on fresh random inputs, compare with the float64 "
        "reference (and, for kernels with a backward, every gradient under a random upstream gradient) and "
        "print a table; exit 1 on any failure. Small cases under the interpreter, GPU-sized cases when compiled.",
    )
    check.add_argument("names", nargs="*", help="kernel names (default: all)")
    check.add_argument("--tag", help="only kernels with this tag or family")
    check.add_argument("--dtype", choices=_DTYPE_NAMES, help="only this dtype")
    check.add_argument("--seed", type=int, help="seed for the random inputs (default: a fresh one per case)")
    check.add_argument(
        "--jobs",
        type=int,
        help="checks run at once in worker processes, one kernel in one dtype each (default: up to 12 on a GPU, "
        "where compiling takes a CPU core each; 1 under the interpreter)",
    )
    check.add_argument("-v", "--verbose", action="store_true", help="show the interpreter's numpy warnings too")
    check.add_argument(
        "--case",
        action="append",
        nargs="+",
        metavar="KEY=VALUE",
        help="check this case in place of the kernels' own (repeatable; the keys are the `case keys` of "
        "`tritonkit show NAME`; an unknown key is an error)",
    )
    check.set_defaults(run=_cmd_check)

    bench = sub.add_parser(
        "bench",
        help="benchmark kernels against torch eager, torch.compile and peers (needs a GPU)",
        description="Time the selected kernels and their baselines (torch eager on the reference, torch.compile "
        "of it, peer libraries when installed) on a CUDA GPU; report ms, GB/s, TFLOP/s, % of the "
        "calibrated ceiling, speed-up against the best baseline and peak memory. "
        "`tritonkit bench calibrate` measures the ceilings (cached per device).",
    )
    bench.add_argument("names", nargs="*", help="kernel names (default: all), or `calibrate`")
    bench.add_argument("--tag", help="only kernels with this tag or family")
    bench.add_argument(
        "--mode",
        choices=MODES,
        default="fwd",
        help="what to time: fwd (no gradients), fwd-train (inputs requiring grad, so the ops save their "
        "backward's statistics), bwd, fwd+bwd (default: fwd)",
    )
    bench.add_argument("--dtype", action="append", choices=_DTYPE_NAMES, help="dtype to run (repeatable; default: all)")
    bench.add_argument("--providers", nargs="+", help="only these providers (tritonkit, torch, torch.compile, peers)")
    bench.add_argument(
        "--sizes",
        choices=SIZES,
        default="default",
        help="small: two smallest cases; default: the larger half; sweep: all",
    )
    bench.add_argument(
        "--case",
        action="append",
        nargs="+",
        metavar="KEY=VALUE",
        help="time this case in place of the kernels' own (repeatable; e.g. --case rows=65536 n=1024 bias=false; "
        "the keys are the `case keys` of `tritonkit show NAME`; an unknown key is an error)",
    )
    bench.add_argument("--out", help="write JSON, markdown and PNG plots into this folder")
    bench.add_argument("--label", help="name for the output files (default: the kernel names, tag or 'all')")
    bench.add_argument(
        "--cuda-graph",
        action="store_true",
        help="time CUDA-graph replays (no launch overhead); peers known to fail capture are reported, not timed",
    )
    bench.set_defaults(run=_cmd_bench)

    from tritonkit.index.cli import add_parser as add_index_parser
    from tritonkit.learn import add_parser as add_learn_parser
    from tritonkit.puzzles.cli import add_parser as add_puzzles_parser

    add_index_parser(sub)
    add_puzzles_parser(sub)
    add_learn_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # Before any kernel module is imported: Triton picks interpreted or compiled at @triton.jit time.
    if enable_interpreter_if_no_gpu() and (problem := interpreter_problem()):
        print(problem, file=sys.stderr)
        return 2
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
