"""Where kernels run: the Triton interpreter or a CUDA device."""

from __future__ import annotations

import os

_TRUE_WORDS = ("1", "true", "on", "yes")


def interpreting() -> bool:
    """True when Triton runs kernels through its interpreter (``TRITON_INTERPRET=1``).

    Triton reads the variable when ``@triton.jit`` decorates a function, so it must be set before
    kernels are defined; this reads the same variable the same way.
    """
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in _TRUE_WORDS


# interpreting() as it was when tritonkit.ops defined tritonkit's kernels; None until then.
_kernels_interpreted: bool | None = None


def record_kernel_mode() -> None:
    """Remember interpreting() for :func:`kernels_interpreted`: called by tritonkit.ops as it defines the kernels."""
    global _kernels_interpreted
    _kernels_interpreted = interpreting()


def kernels_interpreted() -> bool:
    """Whether tritonkit's own kernels run through the interpreter: :func:`interpreting` as it was when tritonkit.ops
    defined them (Triton fixes a kernel's mode when ``@triton.jit`` runs, so a later change of the variable cannot
    change theirs), or as it is now before then. The launchers ask this several times a launch, and reading
    ``os.environ`` costs about a microsecond each time (a tenth of the Python an attention step adds on the host)."""
    return interpreting() if _kernels_interpreted is None else _kernels_interpreted


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def enable_interpreter_if_no_gpu() -> bool:
    """Turn the interpreter on when no CUDA GPU is present; return whether it is on.

    Must run before any module that defines kernels is imported (the CLI and the test suite call it
    first thing).
    """
    if not interpreting() and not cuda_available():
        os.environ["TRITON_INTERPRET"] = "1"
    return interpreting()


def interpreter_problem() -> str | None:
    """Why Triton's interpreter cannot run with the installed packages, or None. Triton 3.6's interpreter turns a
    loop bound into an int with int() on a one-element array, which NumPy 2.4 made an error (Triton 3.7 fixed it):
    every interpreted kernel with a runtime loop bound would fail (docs/interpreter.md, "Versions")."""
    from importlib.metadata import PackageNotFoundError, version

    def release(package: str) -> tuple[int, ...]:
        try:
            return tuple(int(part) for part in version(package).split(".")[:2])
        except (PackageNotFoundError, ValueError):
            return ()

    triton, numpy = release("triton"), release("numpy")
    if triton and numpy and triton < (3, 7) and numpy >= (2, 4):
        return (
            f"Triton {version('triton')}'s interpreter does not run with NumPy {version('numpy')}: install "
            "numpy<2.4 (pip install 'numpy<2.4', or tritonkit's learn or test extra) or triton 3.7 or newer"
        )
    return None


def upcast_bf16_dots(dtype) -> bool:
    """Whether kernels must take bf16 operands to fp32 before tl.dot: under the interpreter, whose 16-bit dots
    compute wrong values (docs/interpreter.md). On a GPU the tensor cores take them as they are."""
    import torch

    return kernels_interpreted() and dtype == torch.bfloat16
