"""Packaging and installation: what `pip install tritonkit` and the README's two commands promise.

- one version source (tritonkit.__version__, read by setuptools), a LICENSE with the Apache-2.0 text that
  pyproject names, classifiers, project URLs, one extra per audience;
- dependency bounds that a user's own CUDA torch can satisfy without a reinstall, and that agree with what
  the Makefile pins and CI runs;
- `make test` changes nothing outside the project (no apt-get), never pins a triton against its torch, and
  says how to put `tritonkit` on the PATH; .ci/run installs Chromium itself and runs both sets;
- the wheel carries every data file and the licence.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

import tritonkit

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the base dependencies bring tomli
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]
MAKEFILE = (REPO / "Makefile").read_text()
CI_RUN = (REPO / ".ci" / "run").read_text()

# The triton each torch release on PyPI requires on Linux x86_64 (its Requires-Dist), from
#   pip install --dry-run --no-deps --ignore-installed --report - torch==X.Y.Z
# Extend it when a bound moves; test_torch_and_triton_bounds_agree reads it.
PYPI_TORCH_TRITON = {
    "2.9.1": "3.5.1",
    "2.10.0": "3.6.0",
    "2.11.0": "3.6.0",
    "2.12.1": "3.7.1",
    "2.13.0": "3.7.1",
    "2.14.1": "3.8.0",
    "2.15.0": "3.9.0",
}


def _base(name: str) -> Requirement:
    (req,) = [Requirement(r) for r in PROJECT["dependencies"] if Requirement(r).name == name]
    return req


def _extra(extra: str) -> list[Requirement]:
    return [Requirement(r) for r in PROJECT["optional-dependencies"][extra]]


def _make_variable(name: str) -> str:
    match = re.search(rf"^{name} \?= (\S+)$", MAKEFILE, re.MULTILINE)
    assert match, f"Makefile sets no {name}"
    return match.group(1)


def _recipe_lines(text: str) -> list[str]:
    """The Makefile's commands (tab-indented lines), comments left out."""
    return [line.strip() for line in text.splitlines() if line.startswith("\t") and not line.strip().startswith("@#")]


# ------------------------------------------------------------------ metadata


def test_the_version_is_written_once():
    assert "version" not in PROJECT and "version" in PROJECT["dynamic"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "tritonkit.__version__"}
    assert Version(tritonkit.__version__) >= Version("0.1.0")
    assert '"' + tritonkit.__version__ + '"' not in (REPO / "pyproject.toml").read_text()


def test_the_licence_is_apache_2_0():
    assert PROJECT["license"] == "Apache-2.0"
    text = (REPO / "LICENSE").read_text()
    assert text.split()[:4] == ["Apache", "License", "Version", "2.0,"]
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    assert "END OF TERMS AND CONDITIONS" in text
    assert not any(c.startswith("License ::") for c in PROJECT["classifiers"])  # PEP 639: the expression only


def test_classifiers_and_urls():
    classifiers = PROJECT["classifiers"]
    for minor in ("3.10", "3.11", "3.12"):
        assert f"Programming Language :: Python :: {minor}" in classifiers
    assert PROJECT["requires-python"] == ">=3.10"
    assert {"Homepage", "Source", "Issues", "Documentation"} <= set(PROJECT["urls"])
    assert all(url.startswith("https://") for url in PROJECT["urls"].values())


def test_one_extra_per_audience():
    extras = PROJECT["optional-dependencies"]
    assert {"test", "bench", "hf", "learn", "dev"} <= set(extras)
    assert "matplotlib" in {r.name for r in _extra("learn")}
    assert "matplotlib" in {r.name for r in _extra("bench")}
    assert "transformers" in {r.name for r in _extra("hf")}
    # test: everything the suite imports; dev: the suite and the linter.
    assert {"pytest", "selenium"} <= {r.name for r in _extra("test")}
    assert any(r.name == "tritonkit" and {"bench", "hf", "learn"} <= r.extras for r in _extra("test"))
    assert any(r.name == "tritonkit" and "test" in r.extras for r in _extra("dev"))
    assert "ruff" in {r.name for r in _extra("dev")}


# ------------------------------------------------------------------ bounds


def test_torch_and_triton_bounds_agree():
    """Every torch the bounds allow requires a triton the bounds allow, and the first torch below them does not:
    a user's own CUDA torch inside the range installs tritonkit without pip replacing torch or triton."""
    torch_spec, triton_spec = _base("torch").specifier, _base("triton").specifier
    assert triton_spec.contains("3.6.0") and not triton_spec.contains("3.5.1"), "triton's range starts at 3.6"
    assert any(s.operator == "<" for s in triton_spec), "triton has an upper bound: the newest version CI ran"
    allowed = [v for v in PYPI_TORCH_TRITON if torch_spec.contains(v)]
    assert allowed, "PYPI_TORCH_TRITON knows no torch inside the bounds: extend it"
    for torch_version, triton_version in PYPI_TORCH_TRITON.items():
        assert torch_spec.contains(torch_version) == triton_spec.contains(triton_version), (
            f"torch {torch_version} requires triton {triton_version}: torch's bound {torch_spec} and triton's "
            f"{triton_spec} must admit both or neither"
        )


def test_numpy_ceiling_is_in_the_interpreter_extras_not_the_base():
    """Triton 3.6's interpreter needs numpy < 2.4 (docs/interpreter.md, "Versions"); compiled kernels do not, so a
    GPU user's numpy is not capped."""
    assert not any(s.operator in ("<", "<=", "==", "~=") for s in _base("numpy").specifier)
    (numpy,) = [r for r in _extra("learn") if r.name == "numpy"]
    assert not numpy.specifier.contains("2.4.0") and numpy.specifier.contains("2.3.5")


def test_this_environment_has_no_broken_interpreter_pair():
    """The one pair of versions the base bounds admit but triton's interpreter cannot run: triton 3.6 with numpy 2.4."""
    import numpy
    import triton

    if Version(triton.__version__).release[:2] < (3, 7):
        assert Version(numpy.__version__) < Version("2.4"), (
            f"triton {triton.__version__}'s interpreter fails on numpy {numpy.__version__} (int() of 1-element "
            "arrays): pip install 'numpy<2.4', or triton>=3.7"
        )


def test_the_pinned_set_is_inside_the_bounds():
    torch_pin = Requirement(_make_variable("TORCH_SPEC"))
    triton_pin = Requirement(_make_variable("TRITON_SPEC"))
    numpy_pin = Requirement(_make_variable("NUMPY_SPEC"))
    for pin in (torch_pin, triton_pin, numpy_pin):
        (spec,) = pin.specifier
        assert spec.operator == "==", f"{pin}: the Makefile pins exact versions"
    torch_version = next(iter(torch_pin.specifier)).version
    assert _base("torch").specifier.contains(torch_version)
    # The triton PyPI's build of that torch requires, and the one added beside a CPU build, are both in range.
    assert _base("triton").specifier.contains(PYPI_TORCH_TRITON[torch_version])
    assert _base("triton").specifier.contains(next(iter(triton_pin.specifier)).version)
    numpy_version = next(iter(numpy_pin.specifier)).version
    for req in (_base("numpy"), *[r for r in _extra("learn") if r.name == "numpy"]):
        assert req.specifier.contains(numpy_version)
    # numpy 2.3 has no wheels for Python 3.10, which requires-python admits.
    assert Version(numpy_version) < Version("2.3")


# ------------------------------------------------------------------ Makefile and CI


def test_make_changes_nothing_outside_the_project():
    for word in ("apt-get", "apt ", "sudo", "dpkg", "--user", "--break-system-packages"):
        assert word not in MAKEFILE, f"the Makefile runs {word!r}"
    installs = [line for line in _recipe_lines(MAKEFILE) if " install" in line and "pip" in line]
    assert installs and all("$(PIP)" in line or "$(BIN)" in line for line in installs), installs


def test_make_never_pins_triton_against_torch():
    """torch is installed alone, so pip takes the triton that build requires; TRITON_SPEC only joins a CPU build."""
    lines = _recipe_lines(MAKEFILE)
    installs = [i for i, line in enumerate(lines) if "$(PIP) install" in line]
    for i in installs:
        assert not ("$(TORCH_SPEC)" in lines[i] and "$(TRITON_SPEC)" in lines[i]), lines[i]
    (triton_install,) = [i for i in installs if "$(TRITON_SPEC)" in lines[i]]
    guard = "\n".join(lines[max(0, triton_install - 3) : triton_install])
    assert "pip show torch" in guard.replace("$(PIP)", "pip") and "triton" in guard


def test_make_says_how_to_put_tritonkit_on_the_path():
    assert "source $(VENV)/bin/activate" in MAKEFILE


def test_ci_installs_chromium_and_runs_both_sets():
    apt = CI_RUN[CI_RUN.index("apt-get update") :]
    apt = apt[: apt.index(".log")]  # the apt-get commands, up to the log their output goes to
    assert "apt-get update -qq" in apt and "apt-get install -y -qq" in apt
    assert re.search(r"\bchromium chromium-driver\b", apt)
    assert "make test" in CI_RUN  # the pinned set
    assert '--upgrade-strategy eager -e ".[dev]"' in CI_RUN  # the newest set
    assert "timeout" in CI_RUN and "SUITE_LIMIT:-900" in CI_RUN


# ------------------------------------------------------------------ the wheel


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """Build the wheel from a copy of this checkout, as pip would (no network: the environment's setuptools)."""
    source = tmp_path_factory.mktemp("source")
    shutil.copytree(REPO / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, source / name)
    out = tmp_path_factory.mktemp("dist")
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation", "-q", "-w", str(out)],
        capture_output=True,
        text=True,
    )
    assert build.returncode == 0, build.stderr
    (path,) = out.glob("tritonkit-*.whl")
    return path


def test_the_wheel_carries_the_version_licence_and_bounds(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        info = f"tritonkit-{tritonkit.__version__}.dist-info"
        metadata = Parser().parsestr(archive.read(f"{info}/METADATA").decode())
    assert f"{info}/licenses/LICENSE" in names
    assert metadata["Version"] == tritonkit.__version__
    assert metadata["License-Expression"] == "Apache-2.0"
    requires = [Requirement(r) for r in metadata.get_all("Requires-Dist")]
    base = {r.name: r.specifier for r in requires if r.marker is None}
    assert base["torch"] == SpecifierSet(str(_base("torch").specifier))
    assert base["triton"] == SpecifierSet(str(_base("triton").specifier))
    assert set(metadata.get_all("Provides-Extra")) >= {"test", "bench", "hf", "learn", "dev"}


def test_the_wheel_carries_every_data_file(wheel):
    source = REPO / "src"
    data = {
        path.relative_to(source).as_posix()
        for path in (source / "tritonkit").rglob("*")
        if path.is_file() and path.suffix not in (".py", ".pyc") and "__pycache__" not in path.parts
    }
    assert data, "no data files found under src/tritonkit"
    with zipfile.ZipFile(wheel) as archive:
        shipped = set(archive.namelist())
    assert sorted(data - shipped) == [], "data files missing from the wheel: extend [tool.setuptools.package-data]"
