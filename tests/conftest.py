"""Test set-up: the default run is the CPU suite under the Triton interpreter; ``-m gpu`` is compiled.

The interpreter must be switched on before any kernel is defined, so this happens in
``pytest_configure``, before test modules (and through them tritonkit's kernels) are imported.
"""

from __future__ import annotations

import os

import pytest


def _gpu_run(config) -> bool:
    expression = config.getoption("markexpr") or ""
    return "gpu" in expression and "not gpu" not in expression


def pytest_addoption(parser):
    parser.addoption(
        "--shard",
        default=None,
        metavar="I/N",
        help="run only every N-th selected test, starting at the I-th (0-based): scripts/gpu_verify.sh runs one "
        "slow part as N processes at once this way",
    )


@pytest.hookimpl(trylast=True)  # after `-m` and `-k` deselected theirs, so the shards come out even
def pytest_collection_modifyitems(config, items):
    shard = config.getoption("shard")
    if shard is None:
        return
    try:
        index, count = (int(part) for part in shard.split("/"))
    except ValueError:
        raise pytest.UsageError(f"--shard expects I/N such as 0/4, got {shard!r}") from None
    if not 0 <= index < count:
        raise pytest.UsageError(f"--shard {shard}: I must be at least 0 and below N")
    kept, dropped = [], []
    for position, item in enumerate(items):
        (kept if position % count == index else dropped).append(item)
    config.hook.pytest_deselected(items=dropped)
    items[:] = kept


def pytest_configure(config):
    if _gpu_run(config):
        import torch

        if not torch.cuda.is_available():
            raise pytest.UsageError("`pytest -m gpu` runs compiled kernels and needs a CUDA GPU; none was found")
        if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
            raise pytest.UsageError("`pytest -m gpu` tests compiled kernels: unset TRITON_INTERPRET")
    else:
        os.environ["TRITON_INTERPRET"] = "1"
        from tritonkit._core.env import interpreter_problem

        if problem := interpreter_problem():
            raise pytest.UsageError(problem)


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def device(request) -> str:
    """Tests that take ``device`` run on the CPU (interpreter suite) and compiled on CUDA (``-m gpu``)."""
    return request.param


@pytest.fixture(autouse=True)
def _poisoned_allocations():
    """Every ``torch.empty``, ``empty_like``, ``empty_strided`` and ``Tensor.new_empty`` that tritonkit's ops make
    during a test is filled with NaN (integers with their largest value): an element a kernel never writes cannot
    pass by matching leftover memory, whichever test reads it."""
    from tritonkit.testing import poisoned_allocations

    with poisoned_allocations():
        yield


@pytest.fixture(autouse=True)
def _release_gpu_memory():
    """After each test, hand cached GPU memory back: `scripts/gpu_verify.sh parallel` runs several test
    processes on one GPU, and one process's cache of freed blocks ran the others out of memory."""
    yield
    import torch

    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()
