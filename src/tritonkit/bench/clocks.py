"""The GPU's SM clock, power draw and clock-throttle reasons while a benchmark times, as nvidia-smi reads them.

A kernel bound by memory alone runs at the memory clock's pace; one that also issues many instructions a byte slows
with the SM clock, which the board's power cap lowers while HBM streams: on the lent H200s, flash decoding over an
int8 cache ran at 1.6x a bf16 one's speed on one board and 1.8x on another (docs/kernels/decoding.md). Reports keep
the clocks beside the times, so that runs on different boards can be told apart. Without nvidia-smi (no NVIDIA
driver, a CPU run) nothing is sampled and nothing is reported. One nvidia-smi call a sample: a long-running one
(its --loop-ms) left a bench run's long timings without a sample, its output to a pipe buffered, it seems.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass

QUERY = ("clocks.sm", "power.draw", "utilization.gpu", "clocks_throttle_reasons.active")
# nvidia-smi's clocks_throttle_reasons bits that slow a busy GPU (idle, application clocks and sync boost are not
# slowdowns of the timed work).
SLOWDOWNS = {0x4: "power cap", 0x8: "hardware slowdown", 0x20: "thermal", 0x40: "hardware thermal",
             0x80: "power brake"}  # fmt: skip
BUSY_PERCENT = 50.0  # a sample speaks for the timed work when the GPU was busy at least this much of its window
INTERVAL_S = 0.1  # between samples: nvidia-smi's own call takes some 20-50 ms


@dataclass(frozen=True)
class Sample:
    sm_mhz: float
    power_w: float
    busy_percent: float
    reasons: int  # the clocks_throttle_reasons bit mask


def parse(line: str) -> Sample | None:
    """One line of ``nvidia-smi --query-gpu=<QUERY> --format=csv,noheader,nounits``; None where a field is missing
    or not a number ("[N/A]", "[Not Supported]")."""
    fields = [field.strip() for field in line.split(",")]
    if len(fields) != len(QUERY):
        return None
    try:
        return Sample(float(fields[0]), float(fields[1]), float(fields[2]), int(fields[3], 16))
    except ValueError:
        return None


def read(device: str | None = None) -> Sample | None:
    """One sample of ``device`` (nvidia-smi's -i: an index, a PCI bus id or a UUID; the first GPU when None), or
    None where nvidia-smi is missing or fails."""
    command = shutil.which("nvidia-smi")
    if command is None:
        return None
    arguments = [command, f"--query-gpu={','.join(QUERY)}", "--format=csv,noheader,nounits"]
    if device is not None:
        arguments.append(f"--id={device}")
    try:
        done = subprocess.run(arguments, capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = done.stdout.strip().splitlines()
    return parse(lines[0]) if done.returncode == 0 and lines else None


def torch_device_id() -> str | None:
    """nvidia-smi's id of torch's current CUDA device (its UUID), or None where torch does not expose it."""
    import torch

    uuid = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "uuid", None)
    return f"GPU-{uuid}" if uuid is not None else None


@dataclass(frozen=True)
class Clocks:
    """What the busy samples of one timing saw: the median SM clock and power, and every slowdown reported."""

    sm_mhz: float
    power_w: float
    slowdowns: tuple[str, ...]


def summarize(samples: list[Sample]) -> Clocks | None:
    """The busy samples' (BUSY_PERCENT) medians and slowdowns; None without a busy sample."""
    busy = [s for s in samples if s.busy_percent >= BUSY_PERCENT]
    if not busy:
        return None
    seen = 0
    for sample in busy:
        seen |= sample.reasons
    slowdowns = tuple(name for bit, name in SLOWDOWNS.items() if seen & bit)
    return Clocks(statistics.median(s.sm_mhz for s in busy), statistics.median(s.power_w for s in busy), slowdowns)


class Sampler:
    """Samples the GPU every INTERVAL_S on a thread while the ``with`` block runs (the first sample at once);
    ``clocks()`` summarises them afterwards. ``reader`` takes no argument and returns a Sample or None (tests give
    their own); by default nvidia-smi on ``device``."""

    def __init__(self, device: str | None = None, reader: Callable[[], Sample | None] | None = None,
                 interval_s: float = INTERVAL_S):  # fmt: skip
        self.reader = reader or (lambda: read(device))
        self.interval_s = interval_s
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while True:
            sample = self.reader()
            if sample is None:  # no nvidia-smi: stop asking
                return
            self.samples.append(sample)
            if self._stop.wait(self.interval_s):
                return

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def clocks(self) -> Clocks | None:
        return summarize(self.samples)
