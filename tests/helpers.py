"""Shared test helpers (a plain module, not a test file)."""

import torch


def assert_compiled_matches_eager(block, inputs, device, grad_atol=1e-5):
    """``torch.compile(block, fullgraph=True)`` gives eager's loss and gradients for ``inputs``.

    On the CPU aot_eager traces through the custom ops' fake kernels (a graph break raises under
    fullgraph) and runs the real ones; on the GPU inductor compiles the graph around them.
    """
    backend = "inductor" if device == "cuda" else "aot_eager"
    eager_loss = block(*inputs)
    eager_grads = torch.autograd.grad(eager_loss, inputs)
    torch._dynamo.reset()
    compiled_loss = torch.compile(block, fullgraph=True, backend=backend)(*inputs)
    compiled_grads = torch.autograd.grad(compiled_loss, inputs)
    torch.testing.assert_close(compiled_loss, eager_loss, rtol=1e-5, atol=1e-4)
    for ours, theirs in zip(compiled_grads, eager_grads, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=grad_atol)


def assert_one_chunk_sums_round_once(hidden, weight, bias, target, whole, chunked):
    """A fused loss's d(weight) and d(bias) for reduction "sum": ``whole`` from one chunk of every token (one GEMM and
    one sum, in the weight's bf16), ``chunked`` from several (fp32 sums). The one chunk's are each the fp32 sum
    rounded once: as close to float64 as the chunked fp32 sums (whose error, the bf16 logits' and their gradient's
    roundings, is most of it) plus a bf16 half-ulp."""
    import torch.nn.functional as F

    assert [g.dtype for g in whole] == [torch.bfloat16] * 2 and [g.dtype for g in chunked] == [torch.float32] * 2
    leaves = [t.double().requires_grad_() for t in (weight, bias)]
    logits = hidden.double() @ leaves[0].t() + leaves[1]
    expected = torch.autograd.grad(F.cross_entropy(logits, target, reduction="sum"), leaves)
    for ours, fp32, exact in zip(whole, chunked, expected, strict=True):
        bound = 1.5 * (fp32.double() - exact).abs().max() + 2**-9 * exact.abs().max()
        assert (ours.double() - exact).abs().max() <= bound


def replay_on_new_inputs(step, inputs) -> list:
    """``step(*inputs)`` (returning tensors) captured in a CUDA graph, then replayed after the floating-point tensors
    of ``inputs`` are refilled in place with new values: the replay's outputs (GPU only)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step(*inputs)  # warm-up: compilation and allocator growth outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        # detached: the capture's autograd graph is freed, not kept alive into later calls
        captured = [t.detach() for t in step(*inputs)]
    with torch.no_grad():  # the step may have made the inputs leaves that require grad
        for t in inputs:
            if t.is_floating_point():
                t.copy_(torch.randn_like(t))
    graph.replay()
    torch.cuda.synchronize()
    return captured


def assert_graph_replay_matches_eager(step, inputs):
    """No host synchronisation: ``step(*inputs)`` (a forward and backward returning outputs and gradients) captures
    in a CUDA graph, and a replay on new values of ``inputs`` gives what an eager call on those values gives (GPU
    only)."""
    captured = replay_on_new_inputs(step, inputs)
    for ours, theirs in zip(captured, step(*inputs), strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


def puzzle_mutant(tmp_path, number: int, *edits: tuple[str, str]):
    """Puzzle ``number`` and its reference solution with ``edits`` (old, new) applied, loaded as a learner's file from
    ``tmp_path``. Each edit asserts that its target text is still there, so the mistakes follow the solutions."""
    from tritonkit.puzzles import get
    from tritonkit.puzzles.checker import load_file

    puzzle = get(number)
    text = puzzle.solution_text()
    for old, new in edits:
        assert old in text, f"puzzle {number}'s solution no longer contains {old!r}"
        text = text.replace(old, new)
    path = tmp_path / puzzle.file_name
    path.write_text(text)
    return puzzle, load_file(path)


def benchmark_script(name: str):
    """benchmarks/<name>.py loaded as a module (the benchmarks folder is no package)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class RecordingKernel:
    """A stand-in for one of a launcher module's kernels (looked up there at each launch): appends ``note(grid,
    kwargs)`` of each launch to ``log`` (the grid unless told), then launches the kernel."""

    def __init__(self, kernel, log, note=lambda grid, kwargs: grid):
        self.kernel, self.log, self.note = kernel, log, note

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.log.append(self.note(grid, kwargs))
            return self.kernel[grid](*args, **kwargs)

        return run
