"""Finds the kernel families and the specs they register: the only module that imports them all.

A family is a package ``tritonkit.ops.<package>`` with a ``spec.py``; importing that module registers its
specs in :mod:`tritonkit.registry`. Nothing keeps a list of families or ops: a new package is found here.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import pkgutil
from collections.abc import Sequence

from tritonkit import registry
from tritonkit.registry import KernelSpec

OPS_PACKAGE = "tritonkit.ops"


@functools.cache
def family_packages() -> tuple[str, ...]:
    """The names of the packages under tritonkit.ops that hold a family (a ``spec`` module), sorted."""
    ops = importlib.import_module(OPS_PACKAGE)
    names = []
    for info in pkgutil.iter_modules(ops.__path__):
        if info.ispkg and importlib.util.find_spec(f"{OPS_PACKAGE}.{info.name}.spec") is not None:
            names.append(info.name)
    return tuple(sorted(names))


@functools.cache
def _load_families() -> None:
    for package in family_packages():
        importlib.import_module(f"{OPS_PACKAGE}.{package}.spec")


def all_specs() -> list[KernelSpec]:
    """Every registered spec, in name order."""
    _load_families()
    specs = registry.registered()
    return [specs[name] for name in sorted(specs)]


def get(name: str) -> KernelSpec:
    _load_families()
    specs = registry.registered()
    try:
        return specs[name]
    except KeyError:
        raise KeyError(f"no kernel named {name!r}; registered: {', '.join(sorted(specs))}") from None


def select(names: Sequence[str] = (), tag: str | None = None) -> list[KernelSpec]:
    """Specs by name (all when empty), keeping those tagged ``tag`` (or of that family) when given."""
    specs = [get(name) for name in names] if names else all_specs()
    if tag is not None:
        specs = [spec for spec in specs if tag in spec.tags or spec.family == tag]
    return specs
