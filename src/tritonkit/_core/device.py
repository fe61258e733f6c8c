"""Cached device facts, so launchers make no device query per call."""

from __future__ import annotations

import functools

import torch

from tritonkit._core.env import kernels_interpreted

_INTERPRETER_PROGRAMS = 4  # under the interpreter programs run one by one: a few are plenty
_INTERPRETER_L2_BYTES = 50 * 2**20  # the H100's and H200's L2, so that the CPU suite takes the GPU's choices
# Under the interpreter, launch plans follow the Hopper tables, so that the CPU suite walks the schedules the GPU runs.
INTERPRETER_ARCH = "sm90"


def _cuda_index(device: torch.device) -> int:
    """The CUDA device ordinal of ``device`` ("cuda" alone: the current device)."""
    return device.index if device.index is not None else torch.cuda.current_device()


@functools.cache
def _cuda_sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


@functools.cache
def _cuda_l2_bytes(index: int) -> int:
    return torch.cuda.get_device_properties(index).L2_cache_size


@functools.cache
def _cuda_arch(index: int) -> str:
    major, minor = torch.cuda.get_device_capability(index)
    return f"sm{major}{minor}"


def arch(device: torch.device) -> str:
    """The architecture launch-plan tables are keyed by: "sm90" for Hopper (H100, H200), "sm80" for Ampere (A100),
    and so on; INTERPRETER_ARCH under the interpreter."""
    if kernels_interpreted() or device.type != "cuda":
        return INTERPRETER_ARCH
    return _cuda_arch(_cuda_index(device))


def arch_number(arch_name: str) -> int:
    """The number of an architecture as :func:`arch` names it: 90 for "sm90", 89 for "sm89"."""
    return int(arch_name.removeprefix("sm"))


FLOAT8_CONVERSION_ARCH = 89  # sm_89 (Ada) and newer convert fp32 to float8 in one rounding instruction


def converts_to_float8_rounding(arch_name: str) -> bool:
    """Whether GPUs of ``arch_name`` ("sm90") round fp32 to float8 in their conversion instruction (cvt.rn.satfinite,
    to nearest, ties to even), so that kernels need not round to the float8 grid in fp32 arithmetic first."""
    return arch_number(arch_name) >= FLOAT8_CONVERSION_ARCH


def converts_e4m3_pairs(arch_name: str) -> bool:
    """Whether GPUs of ``arch_name`` ("sm90") convert two e4m3 codes to fp16 in one instruction (cvt.rn.f16x2.e4m3x2,
    which _core/jit/int_codes.halfword_bytes_as_halves issues): the same sm_89 (Ada) and newer."""
    return arch_number(arch_name) >= FLOAT8_CONVERSION_ARCH


def sm_count(device: torch.device) -> int:
    """Multiprocessors of ``device`` (a small stand-in under the interpreter)."""
    if kernels_interpreted() or device.type != "cuda":
        return _INTERPRETER_PROGRAMS
    return _cuda_sm_count(_cuda_index(device))


# Shared memory a pipelined loop leaves to the rest of its kernel (reduction scratch, layout conversions).
_SHARED_MEMORY_RESERVE = 16 * 1024
_SAFE_SHARED_MEMORY = 48 * 1024  # what every CUDA GPU gives a block without opting in


@functools.cache
def _cuda_max_shared_memory(index: int) -> int:
    import triton

    try:
        return int(triton.runtime.driver.active.utils.get_device_properties(index)["max_shared_mem"])
    except (AttributeError, KeyError, RuntimeError):  # another Triton's driver API: assume the least
        return _SAFE_SHARED_MEMORY


def max_shared_memory(device: torch.device) -> int:
    """Bytes of shared memory one program may use on ``device`` (unbounded under the interpreter)."""
    if kernels_interpreted() or device.type != "cuda":
        return 1 << 30
    return _cuda_max_shared_memory(_cuda_index(device))


def pipeline_depth(stages: int, bytes_per_stage: int, device: torch.device) -> int:
    """``stages``, or fewer where the device lacks the shared memory: a loop pipelined ``stages`` deep
    buffers ``stages - 1`` iterations' loads in shared memory, and a kernel asking for more than the device
    has fails to launch. ``bytes_per_stage``: one iteration's loads, summed over the kernel's pipelined
    loops (each has buffers of its own)."""
    if stages <= 1:  # nothing buffered: no device query on the (common) unpipelined launch
        return stages
    budget = max_shared_memory(device) - _SHARED_MEMORY_RESERVE
    while stages > 1 and (stages - 1) * bytes_per_stage > budget:
        stages -= 1
    return stages


def l2_bytes(device: torch.device) -> int:
    """Bytes of L2 cache of ``device`` (the H100's 50 MB under the interpreter)."""
    if kernels_interpreted() or device.type != "cuda":
        return _INTERPRETER_L2_BYTES
    return _cuda_l2_bytes(_cuda_index(device))
