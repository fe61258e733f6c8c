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
