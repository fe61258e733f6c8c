"""The catalog: external entries (one TOML file each in ``entries/``), our kernels (from the registry, with
their latest benchmark) and the kernels still wanted (``wanted.toml``), loaded and validated together."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tritonkit.index import measured
from tritonkit.index.schema import (
    TAGS,
    Entry,
    Problem,
    Wanted,
    entry_from_data,
    validate_entry,
    validate_wanted,
    wanted_from_data,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 reads TOML through the tomli backport (a dependency there)
    import tomli as tomllib

PACKAGE_DIR = Path(__file__).resolve().parent
ENTRIES_DIR = PACKAGE_DIR / "entries"
WANTED_FILE = PACKAGE_DIR / "wanted.toml"
OUR_AUTHOR = "tritonkit contributors"
OUR_LICENSE = "Apache-2.0"


@dataclass(frozen=True)
class Catalog:
    entries: tuple[Entry, ...]
    wanted: tuple[Wanted, ...]
    problems: tuple[Problem, ...]

    def get(self, name: str) -> Entry:
        for entry in self.entries:
            if entry.name == name:
                return entry
        raise KeyError(f"no entry named {name!r}; `tritonkit index search TEXT` finds one")

    def tags(self) -> dict[str, int]:
        """Every known tag with the number of entries that carry it (zero included)."""
        counts = dict.fromkeys(known_tags(), 0)
        for entry in self.entries:
            for tag in entry.tags:
                counts[tag] = counts.get(tag, 0) + 1
        return dict(sorted(counts.items()))


def registry_specs():
    """Every registered kernel spec (importing the families)."""
    from tritonkit import catalog

    return catalog.all_specs()


def known_tags() -> set[str]:
    """The vocabulary: :data:`schema.TAGS` plus every tag and family our registered kernels use."""
    tags = set(TAGS)
    for spec in registry_specs():
        tags.update(spec.tags)
        tags.add(spec.family)
    return tags


def _read_toml(path: Path) -> tuple[dict | None, list[Problem]]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8")), []
    except (OSError, UnicodeDecodeError) as error:
        return None, [Problem(str(path), "(file)", f"cannot be read: {error}")]
    except tomllib.TOMLDecodeError as error:
        return None, [Problem(str(path), "(file)", f"is not valid TOML: {error}")]


def load_external(directory: Path, tags: set[str]) -> tuple[list[Entry], list[Problem]]:
    """Entries from every ``*.toml`` of ``directory``, and the problems of those that are not valid."""
    entries, problems = [], []
    for path in sorted(directory.glob("*.toml")):
        data, read_problems = _read_toml(path)
        problems += read_problems
        if data is None:
            continue
        file_problems = validate_entry(data, str(path), tags)
        problems += file_problems
        if not file_problems:
            entries.append(entry_from_data(data, str(path)))
    return entries, problems


def load_wanted(path: Path, tags: set[str]) -> tuple[list[Wanted], list[Problem]]:
    """The ``[[wanted]]`` tables of ``path``."""
    data, problems = _read_toml(path)
    if data is None:
        return [], problems
    wanted = []
    tables = data.get("wanted")
    if not isinstance(tables, list):
        return [], [Problem(str(path), "wanted", "missing: the file holds an array of [[wanted]] tables")]
    for i, table in enumerate(tables):
        where = f"{path}[wanted {i}]"
        table_problems = validate_wanted(table, where, tags) if isinstance(table, dict) else []
        problems += table_problems
        if not table_problems:
            wanted.append(wanted_from_data(table, str(path)))
    return wanted, problems


def _module_file(spec) -> str:
    """The repository path of the module that defines a spec's public op (its fn may be a functools.partial, or a
    wrapper of the ops it covers): the family's op.py."""
    for obj in (*spec.covers, spec.fn, getattr(spec.fn, "func", None), spec.reference, spec.make_inputs):
        module = getattr(obj, "__module__", None) or ""
        if module.startswith("tritonkit."):
            return f"src/{module.replace('.', '/')}.py"
    return "src/tritonkit/ops"


def _dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def our_entries(results_dir: Path | str | None) -> list[Entry]:
    """One entry per registered kernel, with its measured rows (:func:`tritonkit.index.measured.loader`:
    ``results_dir`` "default" reads the checkout's results, else the summary shipped in the package)."""
    entries = []
    specs = registry_specs()
    measurements = measured.loader(results_dir, specs)
    for spec in specs:
        tags = tuple(dict.fromkeys((spec.family, *spec.tags, *(("backward",) if spec.has_backward else ()))))
        entries.append(
            Entry(
                name=spec.name,
                # A path inside this repository (renderers make it relative to where they write).
                link=_module_file(spec),
                author=OUR_AUTHOR,
                license=OUR_LICENSE,
                tags=tags,
                description=" ".join(part for part in (spec.summary, spec.description) if part),
                usage=spec.usage.strip("\n"),
                triton=f">={spec.min_triton}; tested with 3.6 to 3.9",
                backward=spec.has_backward,
                dtypes=tuple(_dtype_name(d) for d in spec.dtypes),
                notes=spec.notes,
                checked="verified by `tritonkit check` (float64 reference) in this repository's test suite",
                package="tritonkit",
                source="tritonkit",
                status=spec.status,
                limits=spec.limits,
                measurement=measurements(spec.name),
            )
        )
    return entries


def _duplicates(entries: Iterable[Entry], wanted: Iterable[Wanted]) -> list[Problem]:
    seen: dict[str, str] = {}
    problems = []
    for item in [*entries, *wanted]:
        where = item.path or "tritonkit registry"
        if item.name in seen:
            problems.append(Problem(where, "name", f"duplicate name {item.name!r} (also in {seen[item.name]})"))
        else:
            seen[item.name] = where
    return problems


def load(
    entries_dir: Path = ENTRIES_DIR,
    wanted_file: Path = WANTED_FILE,
    results_dir: Path | str | None = "default",
    include_ours: bool = True,
) -> Catalog:
    """The whole catalog and every problem found while loading it (empty when valid). ``results_dir``: where our
    kernels' measurements come from ("default": the checkout's benchmarks/results, or the shipped summary in an
    installed package; None: nowhere)."""
    tags = known_tags()
    external, problems = load_external(entries_dir, tags)
    wanted, wanted_problems = load_wanted(wanted_file, tags) if wanted_file.exists() else ([], [])
    ours = our_entries(results_dir) if include_ours else []
    entries = sorted([*ours, *external], key=lambda e: e.name)
    problems += wanted_problems + _duplicates([*ours, *external], wanted)
    return Catalog(entries=tuple(entries), wanted=tuple(wanted), problems=tuple(problems))
