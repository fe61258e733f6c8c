"""tritonkit: verified, fast Triton kernels for LLM training and serving.

Use as ``import tritonkit as tk``; the kernels live in ``tk.ops``. Submodules are imported on first
use, so that a tool (the CLI, the test suite) can switch the Triton interpreter on before any kernel
is defined: Triton decides between compiled and interpreted kernels when ``@triton.jit`` runs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

# The one version source: pyproject.toml reads it ([tool.setuptools.dynamic]), without importing tritonkit.
__version__ = "0.1.0"

_SUBMODULES = ("ops", "nn", "debug", "testing", "registry", "catalog")
# Settings, each a function of the module named here (imported on first use, like the submodules).
_SETTINGS = {"set_spin_waits": "tritonkit._core.row_sync"}

if TYPE_CHECKING:  # pragma: no cover - for type checkers and editors only
    from . import catalog, debug, nn, ops, registry, testing
    from ._core.row_sync import set_spin_waits


def __getattr__(name: str):
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name in _SETTINGS:
        return getattr(importlib.import_module(_SETTINGS[name]), name)
    raise AttributeError(f"module 'tritonkit' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_SUBMODULES, *_SETTINGS])


__all__ = ["__version__", "catalog", "debug", "nn", "ops", "registry", "set_spin_waits", "testing"]
