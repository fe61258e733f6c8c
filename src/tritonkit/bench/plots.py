"""Benchmark plots: which rows make a plot, and drawing it (matplotlib, imported only to draw).

A plot shows one kernel in one dtype and mode along its spec's swept axis (``KernelSpec.sweep``: "n" for the
norms, "shape" for the activations), for one fixed setting of the other case keys, with a line per provider;
the unit on y is the row's (GB/s for memory-bound kernels, TFLOP/s for compute-bound ones). A key that equals
the axis in every row of a kernel (a square matmul's n and k beside m) moves with it and is part of the axis.
A setting with fewer than two values along the axis gets no plot. A shape on the axis is placed by its element
count. Rows are plain mappings (``Measurement.to_dict()`` or a results file's rows), so grouping imports
nothing heavy: the index uses it to find the plot that holds a case.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAX_TICKS = 12
# A marker and line style per provider, so that lines that coincide stay visible (tritonkit drawn on top).
STYLES = {
    "tritonkit": {"color": "C0", "marker": "o", "linestyle": "-", "linewidth": 2.0, "zorder": 5},
    "torch": {"color": "C1", "marker": "s", "linestyle": "--", "linewidth": 1.5, "zorder": 3},
    "torch.compile": {"color": "C2", "marker": "^", "linestyle": "-.", "linewidth": 1.5, "zorder": 4},
    "liger": {"color": "C3", "marker": "D", "linestyle": ":", "linewidth": 1.8, "zorder": 3},
    "sdpa-flash": {"color": "C4", "marker": "P", "linestyle": "--", "linewidth": 1.5, "zorder": 3},
    "sdpa-cudnn": {"color": "C5", "marker": "X", "linestyle": "-.", "linewidth": 1.5, "zorder": 3},
    "flex": {"color": "C6", "marker": "v", "linestyle": ":", "linewidth": 1.8, "zorder": 3},
}
# Providers without a style of their own (the peers of one family: cuBLAS, bitsandbytes, SDPA-GQA...) take these in
# the order a plot meets them, in colours no named provider uses: one shared style drew several peers as one line.
PEER_STYLES = (
    {"color": "C7", "marker": "h", "linestyle": "-", "linewidth": 1.5, "zorder": 3},
    {"color": "C8", "marker": "*", "linestyle": "--", "linewidth": 1.5, "zorder": 3},
    {"color": "C9", "marker": "p", "linestyle": "-.", "linewidth": 1.5, "zorder": 3},
    {"color": "black", "marker": "d", "linestyle": ":", "linewidth": 1.8, "zorder": 3},
    {"color": "saddlebrown", "marker": "<", "linestyle": "--", "linewidth": 1.5, "zorder": 3},
    {"color": "magenta", "marker": ">", "linestyle": "-.", "linewidth": 1.5, "zorder": 3},
)
TOP_MARGIN = 1.06  # room above the highest line (point or ceiling), so that neither sits on the axes' frame
# A ceiling more than this many times the highest point is named in the legend, not drawn: a dashed line far
# above launch-bound points would flatten them against the x axis.
CEILING_SCALE = 4.0


def _hashable(value: Any) -> Any:
    """JSON gives shapes as lists; cases give tuples: both become tuples."""
    return tuple(_hashable(v) for v in value) if isinstance(value, (list, tuple)) else value


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_shape(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and len(value) > 0 and all(_is_number(v) for v in value)


def axis_position(value: Any) -> float | None:
    """Where a case value sits on x: a number as it is, a shape by its element count; None if neither."""
    if _is_number(value):
        return float(value)
    if _is_shape(value):
        return float(math.prod(value))
    return None


def _compact(number: float) -> str:
    """4096 -> '4096', 1048576 -> '1M', 268435456 -> '256M': binary multiples once they pass 65536."""
    if number.is_integer() and number > 65536:
        for power, letter in ((3, "G"), (2, "M"), (1, "K")):
            if number % 1024**power == 0:
                return f"{int(number // 1024**power)}{letter}"
    return f"{number:g}"


def tick_label(value: Any) -> str:
    """A case value as a tick: a shape as '16384x4096', a number compactly."""
    if _is_shape(value):
        return "x".join(str(v) for v in value)
    return _compact(float(value))


def _row_rate(row: Mapping) -> float | None:
    """The row's value in its own unit, or None (not timed, or no cost model: old results wrote 0.0 there)."""
    if row.get("ms") is None:
        return None
    value = row.get("tflops") if row.get("unit") == "TFLOP/s" else row.get("gbps")
    return value if value is not None and value > 0 else None


def _id_part(key: str, value: Any) -> str:
    text = "x".join(str(v) for v in value) if isinstance(value, (list, tuple)) else str(value)
    return re.sub(r"[^A-Za-z0-9_.]", "", f"{key}{text}")


@dataclass(frozen=True)
class PlotGroup:
    """The rows of one plot: a kernel, dtype and mode along ``axis`` at one setting (``fixed``) of the rest."""

    spec: str
    dtype: str
    mode: str
    axis: str
    tied: tuple[str, ...]  # keys equal to the axis in every row (they move with it)
    fixed: tuple[tuple[str, Any], ...]  # the other keys and their values
    rows: tuple[Mapping, ...]
    suffix: str = ""  # set when one kernel/dtype/mode has several plots: the keys that tell them apart

    @property
    def unit(self) -> str:
        return self.rows[0].get("unit", "GB/s")

    def filename(self, stem: str) -> str:
        return f"{stem}-{self.spec}-{self.dtype}-{self.mode.replace('+', '-')}{self.suffix}.png"

    def case_ids(self) -> set[str]:
        return {row.get("case_id", "") for row in self.rows}

    def axis_label(self) -> str:
        label = " = ".join((self.axis, *self.tied))
        if any(_is_shape(row["case"][self.axis]) for row in self.rows):
            label += " (elements)"
        return label

    def setting(self) -> str:
        """The fixed keys as the title shows them: 'rows=16384, bias=False'."""
        return ", ".join(f"{key}={tick_label(v) if _is_shape(v) else v}" for key, v in self.fixed)

    def ticks(self) -> list[tuple[float, str]]:
        """(position, label) of every axis value, in order."""
        values = {}
        for row in self.rows:
            value = row["case"][self.axis]
            values[axis_position(value)] = tick_label(value)
        return sorted(values.items())

    def providers(self) -> list[str]:
        return list(dict.fromkeys(row["provider"] for row in self.rows))

    def points(self, provider: str) -> list[tuple[float, float]]:
        """(x, value in the unit) of one provider, sorted along the axis."""
        return sorted(
            (axis_position(row["case"][self.axis]), _row_rate(row)) for row in self.rows if row["provider"] == provider
        )


def _infer_axis(rows: Sequence[Mapping]) -> str | None:
    """For a kernel the registry does not know: the first key whose values place on x and vary."""
    for key in rows[0]["case"]:
        values = {_hashable(row["case"].get(key)) for row in rows}
        if len(values) > 1 and all(axis_position(v) is not None for v in values):
            return key
    return None


def _tied_keys(rows: Sequence[Mapping], axis: str) -> tuple[str, ...]:
    keys = [key for key in rows[0]["case"] if key != axis]
    tied = [key for key in keys if all(key in row["case"] and row["case"][key] == row["case"][axis] for row in rows)]
    return tuple(tied) if len({_hashable(row["case"][axis]) for row in rows}) > 1 else ()


def _suffixes(groups: list[PlotGroup]) -> list[PlotGroup]:
    """Name apart the plots of one kernel, dtype and mode by the keys whose values differ between them."""
    if len(groups) < 2:
        return groups
    settings = [dict(group.fixed) for group in groups]
    keys = list(dict.fromkeys(key for setting in settings for key in setting))
    differing = [key for key in keys if len({_hashable(s.get(key, "-")) for s in settings}) > 1]
    named = []
    for group, setting in zip(groups, settings, strict=True):
        parts = [_id_part(key, setting[key]) if key in setting else f"no{key}" for key in differing]
        named.append(PlotGroup(**{**group.__dict__, "suffix": "-" + "-".join(parts)}))
    return named


def plot_groups(rows: Sequence[Mapping], axis_for: Callable[[str], str | None]) -> list[PlotGroup]:
    """Every plot that ``rows`` make, in the order their kernels, dtypes and modes first appear.

    ``axis_for(kernel)`` names a kernel's swept axis (its spec's ``sweep``); None or "" infers it. Rows that are
    not timed, have no value in their unit, or lack the axis are left out."""
    by_kernel: dict[tuple[str, str, str], list[Mapping]] = {}
    for row in rows:
        if _row_rate(row) is not None and isinstance(row.get("case"), Mapping):
            by_kernel.setdefault((row["spec"], row["dtype"], row["mode"]), []).append(row)
    groups = []
    for (spec, dtype, mode), kernel_rows in by_kernel.items():
        axis = axis_for(spec) or _infer_axis(kernel_rows)
        placed = [row for row in kernel_rows if axis and axis_position(row["case"].get(axis)) is not None]
        if not placed:
            continue
        tied = _tied_keys(placed, axis)
        settings: dict[tuple, list[Mapping]] = {}
        for row in placed:
            fixed = tuple((k, _hashable(v)) for k, v in row["case"].items() if k != axis and k not in tied)
            settings.setdefault(fixed, []).append(row)
        plotted = [
            PlotGroup(spec, dtype, mode, axis, tied, fixed, tuple(setting_rows))
            for fixed, setting_rows in settings.items()
            if len({axis_position(row["case"][axis]) for row in setting_rows}) >= 2
        ]
        groups += _suffixes(plotted)
    return groups


def draw(group: PlotGroup, path: Path, ceilings=None) -> Path:
    """Draw one plot as a PNG: a line per provider along the axis, the device ceiling dashed when known.
    ``ceilings``: a :class:`tritonkit.bench.cost.Ceilings` (device, bandwidth_gbps, matmul_tflops) or None."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    unit = group.unit
    figure, axes = plt.subplots(figsize=(7, 4.5))
    highest = 0.0
    peers = 0
    for provider in group.providers():
        points = group.points(provider)
        highest = max(highest, *(y for _, y in points))
        style = STYLES.get(provider)
        if style is None:
            style, peers = PEER_STYLES[peers % len(PEER_STYLES)], peers + 1
        axes.plot([x for x, _ in points], [y for _, y in points], label=provider, markersize=6, **style)
    top = highest
    if ceilings is not None:
        # A TFLOP/s row names the dtype whose ceiling judged it (8-bit operands with a bf16 output); rows written
        # before rows named it take the checked dtype's.
        matmul_key = group.rows[0].get("ceiling_dtype") or group.dtype
        ceiling = ceilings.matmul_tflops.get(matmul_key) if unit == "TFLOP/s" else ceilings.bandwidth_gbps
        if ceiling and ceiling <= CEILING_SCALE * highest:
            axes.axhline(ceiling, linestyle="--", color="grey", label=f"device ceiling {ceiling:.0f} {unit}")
            top = max(top, ceiling)
        elif ceiling:
            axes.plot([], [], " ", label=f"device ceiling {ceiling:.0f} {unit} (off the scale)")
    axes.set_xscale("log", base=2)
    ticks = group.ticks()
    step = max(1, math.ceil(len(ticks) / MAX_TICKS))
    axes.set_xticks([x for x, _ in ticks][::step], [label for _, label in ticks][::step])
    axes.minorticks_off()
    if any(len(label) > 6 for _, label in ticks):
        axes.tick_params(axis="x", labelrotation=20)
    axes.set_xlabel(group.axis_label())
    axes.set_ylabel(unit)
    axes.set_ylim(bottom=0, top=TOP_MARGIN * top if top > 0 else None)  # the ceiling's line never on the frame
    title = f"{group.spec} {group.dtype} {group.mode}" + (f" on {ceilings.device}" if ceilings is not None else "")
    axes.set_title(title + (f"\n{group.setting()}" if group.fixed else ""), fontsize=11)
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def matplotlib_missing() -> str | None:
    """Why plots cannot be drawn here (matplotlib is an optional dependency), or None when they can."""
    try:
        import matplotlib  # noqa: F401 - imported only to see that it can be
    except ImportError:
        return "matplotlib is not installed (pip install 'tritonkit[bench]')"
    return None
