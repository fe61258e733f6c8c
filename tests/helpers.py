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
