"""The ``tritonkit`` command: list, show and check the registered kernels."""

from __future__ import annotations

import argparse
import sys
import textwrap

from tritonkit._core.env import enable_interpreter_if_no_gpu

_DTYPE_NAMES = ("float32", "float16", "bfloat16", "uint8")


def _table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows, strict=True)]

    def line(cells):
        return "  ".join(str(cell).ljust(width) for cell, width in zip(cells, widths, strict=True)).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(row) for row in rows)])


def _dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _cmd_list(args) -> int:
    from tritonkit import registry

    specs = registry.select(tag=args.tag)
    rows = [[s.name, s.family, ",".join(s.tags), "yes" if s.has_backward else "no", s.status] for s in specs]
    print(_table(["name", "family", "tags", "backward", "status"], rows))
    return 0


def _cmd_show(args) -> int:
    from tritonkit import registry

    try:
        spec = registry.get(args.name)
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
    ]
    for key, value in fields:
        wrapped = textwrap.fill(value, width=88, subsequent_indent=" " * 14) if value else "-"
        print(f"{key + ':':<13} {wrapped}")
    return 0


def _cmd_check(args) -> int:
    import torch

    from tritonkit import registry, testing

    on_gpu = torch.cuda.is_available() and not _interpreting()
    device = "cuda" if on_gpu else "cpu"
    if on_gpu:
        print(f"Checking compiled kernels on {torch.cuda.get_device_name()} with GPU-sized cases.")
    else:
        print("No CUDA GPU in use: running through the Triton interpreter (TRITON_INTERPRET=1) with small cases.")
    try:
        specs = registry.select(args.names, tag=args.tag)
    except KeyError as error:
        print(error.args[0], file=sys.stderr)
        return 2
    rows, failures, details = [], 0, []
    for spec in specs:
        dtypes = [d for d in spec.dtypes if args.dtype is None or _dtype_name(d) == args.dtype]
        cases = spec.gpu_cases if on_gpu else spec.test_cases
        for dtype in dtypes:
            for case in cases:
                try:
                    result = testing.run_case(spec, case, dtype, device, seed=args.seed)
                except Exception as error:  # a crash is a failure of that case, reported, not hidden
                    failures += 1
                    rows.append([spec.name, spec.case_id(case), _dtype_name(dtype), "-", "-", "FAIL"])
                    details.append(f"{spec.name} [{spec.case_id(case)}, {dtype}] raised {error!r}")
                    continue
                failures += not result.ok
                rows.append(
                    [
                        spec.name,
                        result.case_id,
                        _dtype_name(dtype),
                        f"{result.max_abs_err:.2e}",
                        f"{result.max_rel_err:.2e}",
                        "pass" if result.ok else "FAIL",
                    ]
                )
                if not result.ok:
                    details.append(result.explain())
    print(_table(["kernel", "case", "dtype", "max abs err", "max rel err", "result"], rows))
    for detail in details:
        print(detail)
    if not rows:
        print("nothing to check: no kernel matches the selection", file=sys.stderr)
        return 2
    print(f"{len(rows) - failures} passed, {failures} failed")
    return 1 if failures else 0


def _interpreting() -> bool:
    from tritonkit._core.env import interpreting

    return interpreting()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tritonkit",
        description="Verified Triton kernels: list them, show one, check them against their references.",
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
        "reference and print a table; exit 1 on any failure. Small cases under the interpreter, "
        "GPU-sized cases when compiled.",
    )
    check.add_argument("names", nargs="*", help="kernel names (default: all)")
    check.add_argument("--tag", help="only kernels with this tag or family")
    check.add_argument("--dtype", choices=_DTYPE_NAMES, help="only this dtype")
    check.add_argument("--seed", type=int, help="seed for the random inputs (default: a fresh one per case)")
    check.set_defaults(run=_cmd_check)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # Before any kernel module is imported: Triton picks interpreted or compiled at @triton.jit time.
    enable_interpreter_if_no_gpu()
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
