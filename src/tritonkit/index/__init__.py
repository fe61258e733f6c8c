"""The index: a searchable, validated catalog of Triton kernels, ours (from the registry, with measured
numbers) and the community's (one TOML file per entry in ``entries/``), plus the kernels still wanted.

``tritonkit index`` (see :mod:`tritonkit.index.cli`) searches, shows, validates, verifies, adds and renders it.
"""

from tritonkit.index.catalog import Catalog, load
from tritonkit.index.schema import Entry, Problem, Wanted

__all__ = ["Catalog", "Entry", "Problem", "Wanted", "load"]
