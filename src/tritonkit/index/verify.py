"""``tritonkit index verify``: run an external entry's minimal usage against a torch reference.

An entry with a ``[verify]`` table names the module to import, a device, and a reference snippet. When the
module imports (and a CUDA GPU is present if the device is ``cuda``), the entry's usage runs and must assign
``out``; the reference runs in the same namespace and must assign ``ref``; the two are compared within the
entry's tolerances. Every entry gets a result (pass, fail or skipped, with the reason); one entry's crash is
that entry's failure, never the end of the run.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Iterable
from dataclasses import dataclass

from tritonkit.index.schema import Entry

PASS, FAIL, SKIPPED = "pass", "fail", "skipped"


@dataclass(frozen=True)
class Result:
    name: str
    status: str
    reason: str


def _module_available(module: str) -> str | None:
    """None when ``module`` imports, else why not."""
    try:
        if importlib.util.find_spec(module.split(".")[0]) is None:
            return f"package {module.split('.')[0]!r} is not installed"
        importlib.import_module(module)
    except Exception as error:  # an import that crashes is reported, never raised
        return f"import {module} failed: {type(error).__name__}: {error}"
    return None


def _compare(out, ref, atol: float, rtol: float) -> tuple[bool, str]:
    import torch

    outs = out if isinstance(out, (tuple, list)) else (out,)
    refs = ref if isinstance(ref, (tuple, list)) else (ref,)
    if len(outs) != len(refs):
        return False, f"out has {len(outs)} tensors, ref has {len(refs)}"
    worst = 0.0
    for i, (o, r) in enumerate(zip(outs, refs, strict=True)):
        o, r = torch.as_tensor(o), torch.as_tensor(r)
        if o.shape != r.shape:
            return False, f"tensor {i}: shape {tuple(o.shape)} != reference {tuple(r.shape)}"
        o64, r64 = o.detach().to("cpu", torch.float64), r.detach().to("cpu", torch.float64)
        error = (o64 - r64).abs()
        if error.numel():
            worst = max(worst, error.max().item())
        if not torch.allclose(o64, r64, atol=atol, rtol=rtol, equal_nan=False):
            return False, f"tensor {i}: max abs error {error.max().item():.3e} beyond atol={atol}, rtol={rtol}"
    return True, f"max abs error {worst:.3e} (atol={atol}, rtol={rtol})"


def verify_entry(entry: Entry) -> Result:
    """Run one entry's check; never raises."""
    if entry.ours:
        return Result(entry.name, SKIPPED, "our kernel: checked by `tritonkit check`")
    check = entry.verify
    if check is None:
        return Result(entry.name, SKIPPED, "no [verify] table (not an importable package, or no check written)")
    missing = _module_available(check.module)
    if missing:
        return Result(entry.name, SKIPPED, missing)
    if check.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            return Result(entry.name, SKIPPED, "needs a CUDA GPU")
    namespace: dict = {}
    try:
        exec(compile(entry.usage, f"<usage of {entry.name}>", "exec"), namespace)
        exec(compile(check.reference, f"<reference of {entry.name}>", "exec"), namespace)
    except Exception as error:  # the entry's code failing is the entry's failure
        return Result(entry.name, FAIL, f"{type(error).__name__}: {error}")
    if "out" not in namespace or "ref" not in namespace:
        return Result(entry.name, FAIL, "usage must assign `out` and the reference `ref`")
    try:
        ok, detail = _compare(namespace["out"], namespace["ref"], check.atol, check.rtol)
    except Exception as error:
        return Result(entry.name, FAIL, f"comparison failed: {type(error).__name__}: {error}")
    return Result(entry.name, PASS if ok else FAIL, detail)


def verify(entries: Iterable[Entry]) -> list[Result]:
    return [verify_entry(entry) for entry in entries if not entry.ours]
