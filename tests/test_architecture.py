"""The floor plan holds: family packages with fixed roles, a leaf registry, no family importing another, production
code importing neither the test helpers nor the debug toolkit, modules of readable length, a CLI help without torch.

Read from the source files (imports as the AST gives them), so a rule broken anywhere fails here by name.
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import tritonkit

PACKAGE = Path(tritonkit.__file__).parent
SOURCES = sorted(PACKAGE.rglob("*.py"))
ROLES = {"__init__.py", "kernels.py", "plan.py", "launch.py", "op.py", "spec.py"}
PRODUCTION = ("tritonkit.ops", "tritonkit._core", "tritonkit.nn", "tritonkit.integrations")
MAX_LINES = 600


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every module a file imports, absolute (``from x import y`` counts as x and x.y)."""
    tree = ast.parse(path.read_text())
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: up node.level - 1 packages from this file's own
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def _family(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "ops" else None


MODULES = {_module_name(path): path for path in SOURCES}
FAMILIES = sorted({_family(name) for name in MODULES} - {None})


def test_families_are_packages_with_the_fixed_roles():
    assert FAMILIES == ["activation", "decoding", "flash_attention", "fourbit", "gated_norm", "gemm", "lora", "loss",
                        "norm", "quant", "rotary", "row_softmax", "tutorial", "vocab_parallel"]  # fmt: skip
    for family in FAMILIES:
        files = {path.name for path in (PACKAGE / "ops" / family).glob("*.py")}
        assert files == ROLES, f"ops/{family}: {sorted(files ^ ROLES)}"
    assert {path.name for path in (PACKAGE / "ops").glob("*.py")} == {"__init__.py"}


def test_registry_is_a_leaf():
    tritonkit_imports = {name for name in _imports(MODULES["tritonkit.registry"]) if name.startswith("tritonkit")}
    assert tritonkit_imports == set()


@pytest.mark.parametrize("module", sorted(name for name in MODULES if name.startswith(PRODUCTION)))
def test_production_code_imports_no_test_helper_debug_toolkit_or_other_family(module):
    imports = {name for name in _imports(MODULES[module]) if name.startswith("tritonkit")}
    assert not {name for name in imports if name.startswith(("tritonkit.testing", "tritonkit.debug"))}, imports
    family = _family(module)
    if module.startswith("tritonkit._core"):
        assert not {name for name in imports if name.startswith("tritonkit.ops")}, imports
    if family is not None:
        foreign = {name for name in imports if name.startswith("tritonkit.ops") and _family(name) != family}
        assert not foreign, f"{module} imports another family: {sorted(foreign)}"
    if family != "tutorial" and module != "tritonkit.ops":  # the guide's kernels: only the public ops list them
        assert not {name for name in imports if _family(name) == "tutorial"}, imports


def test_only_the_catalog_imports_the_families_specs():
    for module, path in MODULES.items():
        specs = {name for name in _imports(path) if name.endswith(".spec") and _family(name)}
        if _family(module) is None:
            assert not specs, f"{module} imports {sorted(specs)}: the catalog finds the families"


@pytest.mark.parametrize("family", FAMILIES)
def test_kernels_modules_hold_only_jit_functions(family):
    """kernels.py: every function is a @triton.jit kernel or helper (constants and autotuned wrappers aside)."""
    tree = ast.parse((PACKAGE / "ops" / family / "kernels.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            decorators = [ast.unparse(d) for d in node.decorator_list]
            assert decorators == ["triton.jit"], f"{family}/kernels.py: {node.name} is decorated {decorators}"
        assert not isinstance(node, ast.ClassDef), f"{family}/kernels.py defines class {node.name}"


@pytest.mark.parametrize("path", SOURCES, ids=lambda path: str(path.relative_to(PACKAGE)))
def test_modules_stay_readable_in_length(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(PACKAGE)} has {lines} lines"


def test_help_does_not_import_torch():
    """`tritonkit --help` (and every subcommand's) answers without importing torch, triton or numpy."""
    script = (
        "import sys\n"
        "from tritonkit.cli import build_parser\n"
        "for argv in (['--help'], ['check', '--help'], ['bench', '--help'], ['puzzles', '--help'], "
        "['index', '--help'], ['learn', '--help']):\n"
        "    try:\n"
        "        build_parser().parse_args(argv)\n"
        "    except SystemExit:\n"
        "        pass\n"
        "print(sorted(m for m in ('torch', 'triton', 'numpy') if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.stdout.splitlines()[-1] == "[]", result.stdout + result.stderr
