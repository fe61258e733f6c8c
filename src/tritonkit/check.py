"""`tritonkit check`: every selected kernel's cases against their float64 references, printed as they finish.

On a GPU the checks run in several worker processes at once (``jobs``, one per kernel, dtype and case): compiling the
kernels is the most of the time and takes a CPU core each, while the GPU has room for several checks. A case that runs
out of GPU memory beside the others' is run again at the end, alone on the GPU, so that the check fits the device's
memory. Each worker prints nothing; the rows of a job appear when it is done, then how long each family took and the
slowest jobs. Under the interpreter (one process by default) each row appears as its case finishes. The interpreter's
numpy warnings (the -inf arithmetic masked rows do on purpose) stay out of the output unless ``verbose``.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import multiprocessing
import os
import sys
import time
import warnings
from collections import defaultdict
from dataclasses import dataclass

HEADERS = ["kernel", "case", "dtype", "max abs err", "max rel err", "result"]
MAX_JOBS = 12  # worker processes on a GPU: compiling is CPU-bound (a core each); memory is shared as said above
# Fewer autotuning configs while checking: correctness does not need the fastest tile, and every config of every
# shape compiles (tritonkit._core.gemm_plan.autotune_configs).
CHECK_AUTOTUNE = "quick"


@dataclass(frozen=True)
class Row:
    kernel: str
    label: str
    dtype: str
    max_abs: str
    max_rel: str
    ok: bool
    detail: str | None = None  # what a failure prints under the table

    def cells(self) -> list[str]:
        return [self.kernel, self.label, self.dtype, self.max_abs, self.max_rel, "pass" if self.ok else "FAIL"]


@dataclass(frozen=True)
class Job:
    """A kernel's check in some dtypes: the spec's name, the dtypes and the cases (given ones, or the spec's own)."""

    name: str
    dtypes: tuple[str, ...]
    given: tuple[dict, ...] | None
    seed: int | None
    device: str
    verbose: bool
    only: tuple[str, ...] | None = None  # the labels of the rows to run (the cases run again alone), else all


def _out_of_memory(error: Exception) -> bool:
    """torch's allocator and Triton's launcher both say so in their message."""
    return "out of memory" in str(error)


def _quiet(verbose: bool) -> None:
    if not verbose:
        warnings.filterwarnings("ignore", module="triton.runtime.interpreter")
        warnings.filterwarnings("ignore", category=RuntimeWarning, module="numpy")
        # torch's autograd threads have no current CUDA context until cuBLAS sets one; harmless, and said once a thread
        warnings.filterwarnings("ignore", message="Attempting to run cuBLAS, but there was no current CUDA context")


def labels(spec, job: Job) -> list[tuple[str, object, str | None]]:
    """(label, case, grad mode) of every row a kernel's check prints, in order, before any runs."""
    cases = [spec.parse_case(case) for case in job.given] if job.given else (
        spec.gpu_cases if job.device == "cuda" else spec.test_cases)  # fmt: skip
    # Kernels with a backward are checked twice: the forward, then every gradient as well.
    grad_modes = (None, "random") if spec.has_backward else (None,)
    return [(spec.case_id(case) + (" +grad" if mode else ""), case, mode) for case in cases for mode in grad_modes]


def case_labels(job: Job) -> list[tuple[str, ...]]:
    """The labels of a job's rows grouped by case (a case's forward row and its gradient row together)."""
    from tritonkit import catalog

    groups: dict[str, list[str]] = {}
    for label, _, mode in labels(catalog.get(job.name), job):
        groups.setdefault(label.removesuffix(" +grad") if mode else label, []).append(label)
    return [tuple(group) for group in groups.values()]


def check_kernel(job: Job, emit=None, defer_out_of_memory=False) -> tuple[list[Row], float, tuple[str, ...]]:
    """Run one kernel's check; ``emit(row)`` is called as each row finishes. Returns the rows, the seconds and, with
    ``defer_out_of_memory``, the labels of the cases that ran out of GPU memory (no row: they are to run again)."""
    import torch

    from tritonkit import catalog, testing

    _quiet(job.verbose)
    spec = catalog.get(job.name)
    started = time.perf_counter()
    rows, deferred = [], []
    for dtype in (d for d in spec.dtypes if str(d).removeprefix("torch.") in job.dtypes):
        for label, case, mode in labels(spec, job):
            if job.only is not None and label not in job.only:
                continue
            if job.device == "cuda":
                torch.cuda.empty_cache()  # GPU-sized cases: keep no cache of the last case's blocks
            dtype_name = str(dtype).removeprefix("torch.")
            try:
                result = testing.run_case(spec, case, dtype, job.device, seed=job.seed, grad_mode=mode)
            except Exception as error:  # a crash is a failure of that case, reported, not hidden
                if defer_out_of_memory and _out_of_memory(error):
                    deferred.append(label)
                    continue
                row = Row(spec.name, label, dtype_name, "-", "-", False, f"{spec.name} [{label}, {dtype}] raised "
                          f"{error!r}")  # fmt: skip
            else:
                row = Row(spec.name, label, dtype_name, f"{result.max_abs_err:.2e}", f"{result.max_rel_err:.2e}",
                          result.ok, None if result.ok else result.explain())  # fmt: skip
            rows.append(row)
            if emit is not None:
                emit(row)
    return rows, time.perf_counter() - started, tuple(deferred)


def _worker_init() -> None:
    os.environ.setdefault("TRITONKIT_AUTOTUNE", CHECK_AUTOTUNE)


def run(jobs: list[Job], families: dict[str, str], workers: int, out=None) -> tuple[int, int]:
    """Check every job, printing rows as they finish (to ``out``, else the current sys.stdout) under a header whose
    widths are known in advance, then each family's time. Returns (passed, failed)."""
    from tritonkit import catalog

    out = out or sys.stdout
    widths = [len(h) for h in HEADERS]
    for job in jobs:
        spec = catalog.get(job.name)
        for label, _, _ in labels(spec, job):
            widths[0], widths[1] = max(widths[0], len(job.name)), max(widths[1], len(label))
    widths[2:] = [max(widths[2], 8), 11, 11, 6]

    def line(cells: list[str]) -> None:
        out.write("  ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True)).rstrip() + "\n")
        out.flush()

    def emit(row: Row) -> None:
        line(row.cells())

    line(HEADERS)
    line(["-" * width for width in widths])
    started = time.perf_counter()
    results: list[tuple[Job, list[Row], float]] = []
    if workers <= 1:
        for job in jobs:
            rows, seconds, _ = check_kernel(job, emit)
            results.append((job, rows, seconds))
    else:
        alone = []
        context = multiprocessing.get_context("spawn")  # CUDA cannot be forked
        with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context, initializer=_worker_init) as pool:
            futures = {pool.submit(check_kernel, job, None, True): job for job in jobs}
            for future in concurrent.futures.as_completed(futures):
                rows, seconds, deferred = future.result()
                for row in rows:
                    emit(row)
                results.append((futures[future], rows, seconds))
                if deferred:
                    alone.append(dataclasses.replace(futures[future], only=deferred))
        if alone:  # the other workers have exited, so these cases have the GPU's memory to themselves
            with concurrent.futures.ProcessPoolExecutor(1, mp_context=context, initializer=_worker_init) as pool:
                for job in alone:
                    rows, seconds, _ = pool.submit(check_kernel, job, None, False).result()
                    for row in rows:
                        emit(row)
                    results.append((job, rows, seconds))
            out.write(f"({sum(len(job.only) for job in alone)} cases ran out of GPU memory beside the others and ran "
                      "again alone)\n")  # fmt: skip
    wall = time.perf_counter() - started
    details = [row.detail for _, rows, _ in results for row in rows if row.detail]
    for detail in details:
        out.write(detail + "\n")
    by_family: dict[str, float] = defaultdict(float)
    for job, _, seconds in results:
        by_family[families[job.name]] += seconds
    times = ", ".join(f"{family} {seconds:.1f} s" for family, seconds in sorted(by_family.items(), key=lambda i: -i[1]))
    out.write(f"time by family ({workers} worker{'s' if workers > 1 else ''}, {wall:.1f} s in all): {times}\n")
    by_job: dict[str, float] = defaultdict(float)
    for job, _, seconds in results:
        by_job[f"{job.name} {'/'.join(job.dtypes)}"] += seconds
    slowest = sorted(by_job.items(), key=lambda item: -item[1])[:3]
    out.write("slowest: " + ", ".join(f"{name} {seconds:.1f} s" for name, seconds in slowest) + "\n")
    failed = sum(not row.ok for _, rows, _ in results for row in rows)
    passed = sum(len(rows) for _, rows, _ in results) - failed
    return passed, failed
