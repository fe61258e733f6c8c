"""The latest measured benchmark of one of our kernels, read from ``benchmarks/results/<device>/*.json``.

The results live in the repository, not in the wheel: an installed package has none, and then the index says
"no measurement shipped" instead of failing. The headline is the newest run's forward pass, preferring
bfloat16, at the largest case (the one furthest from launch-bound sizes).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

NO_MEASUREMENT = "no measurement shipped"
_PREFERRED_MODE = "fwd"
_PREFERRED_DTYPE = "bfloat16"


@dataclass(frozen=True)
class Measurement:
    """tritonkit's own row of one benchmark case, with the plots of the same run."""

    device: str
    date: str
    case_id: str
    dtype: str
    mode: str
    ms: float
    unit: str
    rate: float | None  # in ``unit`` (GB/s or TFLOP/s)
    percent_of_ceiling: float | None
    speedup_vs_best_baseline: float | None
    source: Path
    plots: tuple[Path, ...] = field(default_factory=tuple)

    def line(self) -> str:
        """One line for listings: '0.0704 ms, 3617 GB/s (86% of ceiling), 1.10x best baseline'."""
        parts = [f"{self.ms:.4g} ms"]
        if self.rate is not None:
            rate = f"{self.rate:.0f} {self.unit}" if self.rate >= 10 else f"{self.rate:.3g} {self.unit}"
            if self.percent_of_ceiling is not None:
                rate += f" ({self.percent_of_ceiling:.0f}% of ceiling)"
            parts.append(rate)
        if self.speedup_vs_best_baseline is not None:
            parts.append(f"{self.speedup_vs_best_baseline:.2f}x best baseline")
        where = f"{self.case_id}, {self.dtype}, {self.mode}, {self.device}, {self.date}"
        return ", ".join(parts) + f" [{where}]"


def default_results_dir() -> Path | None:
    """``benchmarks/results`` of the repository this package runs from, or None in an installed wheel."""
    import tritonkit

    # src/tritonkit/__init__.py -> the repository root is three levels up in an editable (src layout) install.
    candidate = Path(tritonkit.__file__).resolve().parents[2] / "benchmarks" / "results"
    return candidate if candidate.is_dir() else None


def _case_size(case: dict) -> float:
    """The product of a case's numeric parameters: bigger means further from launch-bound."""
    numbers = [v for v in case.values() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return math.prod(numbers) if numbers else 0.0


def _runs(results_dir: Path):
    """(device folder, json path, meta, rows) for every benchmark run (calibration files excluded)."""
    for path in sorted(results_dir.glob("*/*.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if not isinstance(record, dict) or "results" not in record:
            continue
        yield path, record.get("meta", {}), record["results"]


def latest(kernel: str, results_dir: Path | None) -> Measurement | None:
    """The headline measurement of ``kernel``, or None when there is none."""
    if results_dir is None:
        return None
    best_key, best = None, None
    for path, meta, rows in _runs(results_dir):
        for row in rows:
            if row.get("spec") != kernel or row.get("provider") != "tritonkit" or row.get("ms") is None:
                continue
            key = (
                meta.get("date", ""),
                row.get("mode") == _PREFERRED_MODE,
                row.get("dtype") == _PREFERRED_DTYPE,
                _case_size(row.get("case", {})),
                not meta.get("cuda_graph", False),
            )
            if best_key is None or key > best_key:
                best_key, best = key, (path, meta, row)
    if best is None:
        return None
    path, meta, row = best
    unit = row.get("unit", "GB/s")
    return Measurement(
        device=meta.get("device", path.parent.name),
        date=meta.get("date", ""),
        case_id=row.get("case_id", ""),
        dtype=row.get("dtype", ""),
        mode=row.get("mode", ""),
        ms=row["ms"],
        unit=unit,
        rate=row.get("tflops") if unit == "TFLOP/s" else row.get("gbps"),
        percent_of_ceiling=row.get("percent_of_ceiling"),
        speedup_vs_best_baseline=row.get("speedup_vs_best_baseline"),
        source=path,
        plots=_plots(kernel, path.parent, meta.get("date", "")),
    )


def _plots(kernel: str, device_dir: Path, date: str) -> tuple[Path, ...]:
    """The PNG plots of ``kernel`` from runs of ``date`` (report.write_plots names them <stem>-<kernel>-...)."""
    plots = []
    for json_path in sorted(device_dir.glob(f"{date}-*.json")):
        plots += sorted(device_dir.glob(f"{json_path.stem}-{kernel}-*.png"))
    return tuple(plots)
