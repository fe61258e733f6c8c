"""A faster Triton interpreter for kernels that call ``@triton.jit`` helpers.

Under ``TRITON_INTERPRET=1`` Triton runs each launch by patching ``triton.language`` (a few hundred attributes, found
with ``inspect.getmembers``) so that its functions compute with NumPy, running the kernel once per program, then
restoring it. It also repatches the same modules on every call of a ``@triton.jit`` helper inside the kernel, about a
millisecond each time, and a kernel that calls helpers in a loop pays it per iteration and per program: the norm
backward spent about three quarters of its interpreted time there. The repatch changes nothing, since the launch
has already patched those modules with the same builder, so :func:`skip_redundant_patches` makes a helper call skip
it when the enclosing launch covers the modules the helper sees. A helper that sees a module the launch did not patch
(``triton.language.core`` imported by name, say) is patched as before. The Triton internals this relies on are
checked first; where they differ (another Triton release), nothing is changed and the interpreter runs as shipped.
"""

from __future__ import annotations

import functools
import inspect

_INSTALLED = "_tritonkit_skips_redundant_patches"


class _NothingToRestore:
    def restore(self) -> None:
        pass


def _can_install(interpreter) -> bool:
    """Whether this Triton's interpreter has the shape the shortcut was written for: a module-level ``_patch_lang``
    that launches (``GridExecutor.__call__``) and helper calls (``InterpretedFunction.__call__``) both call."""
    try:
        helper_call = inspect.getsource(interpreter.InterpretedFunction.__call__)
        launch = inspect.getsource(interpreter.GridExecutor.__call__)
    except (AttributeError, OSError, TypeError):
        return False
    return callable(getattr(interpreter, "_patch_lang", None)) and all(
        "_patch_lang(self.fn)" in source for source in (helper_call, launch)
    )


def skip_redundant_patches() -> bool:
    """Install the shortcut in Triton's interpreter (once); return whether it is installed."""
    from triton.runtime import interpreter

    if getattr(interpreter, _INSTALLED, False):
        return True
    if not _can_install(interpreter):
        return False
    import triton.language as tl

    patch_lang = interpreter._patch_lang
    launch = interpreter.GridExecutor.__call__
    # One entry per launch in progress: the modules it has patched so far (None until the launch's own patch).
    covered: list[frozenset[int] | None] = []

    def languages(fn) -> frozenset[int]:
        return frozenset(id(value) for value in fn.__globals__.values() if value is tl or value is tl.core)

    def patch_unless_covered(fn):
        seen = languages(fn)
        if covered and covered[-1] is not None and seen <= covered[-1]:
            return _NothingToRestore()
        scope = patch_lang(fn)
        if covered:
            covered[-1] = seen | (covered[-1] or frozenset())
        return scope

    @functools.wraps(launch)
    def launch_tracking_patches(self, *args, **kwargs):
        covered.append(None)
        try:
            return launch(self, *args, **kwargs)
        finally:
            covered.pop()

    interpreter._patch_lang = patch_unless_covered
    interpreter.GridExecutor.__call__ = launch_tracking_patches
    setattr(interpreter, _INSTALLED, True)
    return True


def speed_up_if_interpreting() -> None:
    """Install the shortcut when kernels run through the interpreter; called where tritonkit's kernels (``ops``),
    the puzzle checker and the debug helpers are imported."""
    from tritonkit._core.env import interpreting

    if interpreting():
        skip_redundant_patches()
