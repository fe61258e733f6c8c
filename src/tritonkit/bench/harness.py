"""Timing on a CUDA GPU: medians from ``triton.testing.do_bench`` after warm-up, input sets rotated
when they would fit in L2, optional CUDA-graph replay, and peak memory above the inputs."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass

import torch

from tritonkit.bench import MODES, SIZES, clocks  # noqa: F401 - MODES, SIZES: re-exported for the harness' callers
from tritonkit.bench.cost import Ceilings, ceiling_dtype, speedup, throughput
from tritonkit.bench.providers import COMPILED, Provider, select_providers
from tritonkit.registry import Case, Inputs, KernelSpec
from tritonkit.testing import fresh_seed

MAX_INPUT_SETS = 256
# A timed CUDA-graph replay covers at least this much device work (the cycle of input sets repeated), at most
# MAX_GRAPH_REPEATS cycles. With one or two steps a replay, each replay's fixed cost (the graph's launch, the
# write-back of the cache do_bench flushed) was charged to them: a 64 MB copy read 83.0% of the ceiling, and
# 88.3% with the cost spread over 1 ms; runs repeat within 0.3% (docs/kernels/README.md).
GRAPH_REPLAY_MS = 1.0
MAX_GRAPH_REPEATS = 64


@dataclass
class Measurement:
    """One row of a report: a provider on a case, or the reason it was skipped."""

    spec: str
    family: str
    case: dict
    case_id: str
    dtype: str
    mode: str
    provider: str
    ms: float | None = None
    gbps: float | None = None
    tflops: float | None = None
    unit: str = "GB/s"
    percent_of_ceiling: float | None = None
    ceiling_dtype: str | None = None  # TFLOP/s rows: whose matmul ceiling the percentage is of (cost.ceiling_dtype)
    speedup_vs_best_baseline: float | None = None
    peak_mib: float | None = None
    input_sets: int = 1
    skipped: str | None = None
    # The GPU while this row was timed (tritonkit.bench.clocks): median SM clock and power of the busy samples, and
    # the slowdowns nvidia-smi reported (e.g. "power cap"); None without nvidia-smi.
    sm_mhz: float | None = None
    power_w: float | None = None
    slowdowns: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def bench_cases(spec: KernelSpec, sizes: str, cases: Sequence[Mapping] | None = None) -> Sequence[Case]:
    """``cases`` when given (each parsed as the spec's case type: an unknown key raises ValueError); else by
    ``sizes``: ``small``, the two smallest benchmark cases; ``default``, the larger half; ``sweep``, all."""
    if cases:
        return [spec.parse_case(case) for case in cases]
    cases = list(spec.bench_cases)
    if sizes == "small":
        return cases[:2]
    if sizes == "default":
        return cases[len(cases) // 2 :]
    return cases


def input_sets_needed(bytes_per_set: int, l2_bytes: int) -> int:
    """Enough distinct input sets that one pass over them overflows L2 twice, at most MAX_INPUT_SETS."""
    if bytes_per_set <= 0:
        return 1
    return max(1, min(MAX_INPUT_SETS, math.ceil(2 * l2_bytes / bytes_per_set)))


def _tensors(inputs: Inputs) -> list[torch.Tensor]:
    values = [*inputs.args, *inputs.kwargs.values()]
    return [v for v in values if isinstance(v, torch.Tensor)]


def make_input_sets(spec: KernelSpec, case: Case, device: torch.device, dtype: torch.dtype, l2_bytes: int,
                    next_seed: Callable[[], int]) -> list[Inputs]:  # fmt: skip
    """The case's inputs, as many sets as overflow ``l2_bytes`` twice (input_sets_needed; one for 0), each made
    from a generator seeded with the next of ``next_seed()``."""

    def make() -> Inputs:
        return spec.make_inputs(case, device, dtype, torch.Generator(device).manual_seed(next_seed()))

    first = make()
    count = input_sets_needed(sum(t.numel() * t.element_size() for t in _tensors(first)), l2_bytes)
    return [first, *(make() for _ in range(count - 1))]


def _differentiable_outputs(result) -> list[torch.Tensor]:
    """Every output a backward flows from: all of a tuple's, as a training step uses them all."""
    outputs = result if isinstance(result, (tuple, list)) else (result,)
    return [out for out in outputs if isinstance(out, torch.Tensor) and out.requires_grad]


def make_step(fn: Callable, inputs: Inputs, mode: str) -> Callable[[], object]:
    """A zero-argument callable that runs ``mode`` once on ``inputs`` and returns what it computed
    (the outputs, or the gradients of the trainable inputs in their order). ``fwd`` runs the forward with no
    input requiring grad (inference: ops may skip what only a backward reads); ``fwd-train`` the forward a
    training step runs, trainable inputs requiring grad, so each op saves its backward's statistics (the
    autograd graph is dropped with the outputs). ``bwd`` runs the forward once here and times the backward
    alone. Floating inputs require grad except the frozen ones (``Inputs.frozen``); the backward flows from
    every output, each under its own random gradient.

    The gradients are returned by ``torch.autograd.grad``, not accumulated into ``.grad``: accumulating
    adds a read-add-write of every gradient from the second step on (inside a CUDA graph, on every
    replay), about 40% of an RMSNorm backward, which is the optimizer's cost and not the op's."""
    leaves = [] if mode == "fwd" else [t.requires_grad_(True) for _, t in inputs.trainable()]
    if mode in ("fwd", "fwd-train"):
        return lambda: fn(*inputs.args, **inputs.kwargs)
    if mode == "fwd+bwd":
        upstream: list[torch.Tensor] = []  # allocated on the first call, outside the timed runs

        def step():
            outs = _differentiable_outputs(fn(*inputs.args, **inputs.kwargs))
            if not upstream:
                upstream.extend(torch.randn_like(out) for out in outs)
            return torch.autograd.grad(outs, leaves, upstream, allow_unused=True)

        return step
    outs = _differentiable_outputs(fn(*inputs.args, **inputs.kwargs))
    grads = [torch.randn_like(out) for out in outs]
    return lambda: torch.autograd.grad(outs, leaves, grads, retain_graph=True, allow_unused=True)


def graph_repeats(cycle_ms: float) -> int:
    """How many times one timed CUDA graph replays the cycle of steps: enough for GRAPH_REPLAY_MS of device
    work, at most MAX_GRAPH_REPEATS. Each replay pays a fixed cost that is not the op's: the graph's own
    launch, and the write-back of the L2 lines do_bench dirtied flushing the cache just before."""
    if cycle_ms <= 0 or GRAPH_REPLAY_MS <= 0:
        return 1
    return max(1, min(MAX_GRAPH_REPEATS, math.ceil(GRAPH_REPLAY_MS / cycle_ms)))


def _graph_ms(cycle: Callable[[], object], capture_stream: torch.cuda.Stream, repeats: int) -> float:
    """Median milliseconds of one replay of a graph that runs ``cycle`` ``repeats`` times."""
    import triton.testing

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=capture_stream):
        for _ in range(repeats):
            cycle()
    ms = triton.testing.do_bench(graph.replay, return_mode="median")
    del graph  # its memory pool is freed before a longer graph is captured
    return ms


def graph_replay_ms(cycle: Callable[[], object], capture_stream: torch.cuda.Stream | None = None) -> float:
    """Median milliseconds of one call of ``cycle``, timed as CUDA-graph replays that repeat it for about
    GRAPH_REPLAY_MS of work (graph_repeats). ``cycle`` must have run once already (compilation, lazy
    allocations); the capture is on ``capture_stream``, or on a new side stream."""
    stream = capture_stream or torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    torch.cuda.synchronize()
    cycle_ms = _graph_ms(cycle, stream, 1)
    repeats = graph_repeats(cycle_ms)
    if repeats == 1:
        return cycle_ms
    torch.cuda.synchronize()
    return _graph_ms(cycle, stream, repeats) / repeats


def _time(steps: list[Callable], capture_stream: torch.cuda.Stream | None) -> float:
    """Median milliseconds of one step, cycling through ``steps`` (one per input set); with a
    ``capture_stream``, of CUDA-graph replays of the steps captured on it (graph_replay_ms)."""
    import triton.testing

    for step in steps[:3]:  # warm-up: compilation, autotuning, allocator growth
        step()
    torch.cuda.synchronize()
    if capture_stream is not None:
        for step in steps:  # every input set once outside the capture (lazy allocations, autograd state)
            step()

        def cycle():
            for step in steps:
                step()

        return graph_replay_ms(cycle, capture_stream) / len(steps)
    position = [0]

    def rotating():
        steps[position[0]]()
        position[0] = (position[0] + 1) % len(steps)

    return triton.testing.do_bench(rotating, return_mode="median")


def _peak_mib(step: Callable) -> float:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**20


def measure_case(
    spec: KernelSpec,
    case: Case,
    dtype: torch.dtype,
    mode: str,
    providers: list[Provider],
    ceilings: Ceilings | None,
    cuda_graph: bool = False,
) -> list[Measurement]:
    """Time every provider on one case; fill in throughput, % of ceiling and speed-ups."""
    device = torch.device("cuda")
    l2_bytes = torch.cuda.get_device_properties(device).L2_cache_size
    gpu = clocks.torch_device_id()
    dtype_name = str(dtype).removeprefix("torch.")
    rows = []
    for provider in providers:
        row = Measurement(spec.name, spec.family, dict(case), spec.case_id(case), dtype_name, mode, provider.name)
        rows.append(row)
        if provider.skip_reason:
            row.skipped = provider.skip_reason
            continue
        if mode != "fwd" and not spec.has_backward:  # fwd-train too: without a backward it would time fwd again
            row.skipped = f"{spec.name} has no backward pass"
            continue
        if provider.name in COMPILED:
            torch._dynamo.reset()  # a fresh compile per case: no recompile limit, no stale guards
        try:
            input_sets = make_input_sets(spec, case, device, dtype, l2_bytes, fresh_seed)
            n_sets = len(input_sets)
            # Under CUDA graphs everything runs on the capture stream, the setup's forward of a "bwd" step
            # included: autograd runs each backward op on its forward op's stream, so a forward run
            # elsewhere would put the captured backward outside the capture.
            capture_stream = torch.cuda.Stream() if cuda_graph else None
            if capture_stream is not None:
                capture_stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(capture_stream):  # the current stream when None
                steps = [make_step(provider.fn, inputs, mode) for inputs in input_sets]
                with clocks.Sampler(gpu) as sampler:
                    row.ms = _time(steps, capture_stream)
                row.peak_mib = _peak_mib(steps[0])
            row.input_sets = n_sets
            seen = sampler.clocks()
            if seen is not None:
                row.sm_mhz, row.power_w, row.slowdowns = seen.sm_mhz, seen.power_w, ", ".join(seen.slowdowns)
        except Exception as error:  # a provider that fails is reported, not dropped
            row.skipped = f"failed: {type(error).__name__}: {str(error).splitlines()[0][:160] if str(error) else ''}"
            continue
        result = throughput(spec, case, dtype, row.ms, ceilings, mode)
        if result is not None:
            row.gbps, row.tflops, row.unit, row.percent_of_ceiling = (
                result.gbps,
                result.tflops,
                result.unit,
                result.percent,
            )
            if result.unit == "TFLOP/s":
                row.ceiling_dtype = ceiling_dtype(spec, case, dtype)
        del input_sets, steps
        torch.cuda.empty_cache()
    fill_speedups(rows)
    return rows


def fill_speedups(rows: list[Measurement]) -> None:
    """Each timed row's speed-up against the fastest timed baseline (any provider but tritonkit)."""
    baselines = [r.ms for r in rows if r.provider != "tritonkit" and r.ms is not None]
    best = min(baselines) if baselines else None
    for row in rows:
        if row.ms is not None:
            row.speedup_vs_best_baseline = speedup(best, row.ms)


def run(
    specs: Sequence[KernelSpec],
    *,
    dtypes: Sequence[str] | None,
    modes: Sequence[str],
    sizes: str,
    providers: Sequence[str] | None,
    ceilings: Ceilings | None,
    cuda_graph: bool = False,
    progress: bool = True,
    cases: Sequence[Case] | None = None,
) -> list[Measurement]:
    """Benchmark every selected spec x dtype x mode x case (``cases``: these in place of each spec's own)."""
    plan = []
    for spec in specs:
        chosen = [d for d in spec.dtypes if dtypes is None or str(d).removeprefix("torch.") in dtypes]
        for dtype in chosen:
            for mode in modes:
                for case in bench_cases(spec, sizes, cases):
                    plan.append((spec, case, dtype, mode))
    rows: list[Measurement] = []
    selected = {spec.name: select_providers(spec, providers, cuda_graph) for spec in specs}
    for index, (spec, case, dtype, mode) in enumerate(plan, 1):
        if progress:
            label = f"{spec.name} {spec.case_id(case)} {str(dtype).removeprefix('torch.')} {mode}"
            bar = "#" * (30 * index // len(plan))
            print(f"\r[{bar:<30}] {index}/{len(plan)} {label:<60}", end="", file=sys.stderr, flush=True)
        rows.extend(measure_case(spec, case, dtype, mode, selected[spec.name], ceilings, cuda_graph))
    if progress and plan:
        print(file=sys.stderr)
    return rows
