"""Reference checks: comparison against float64, running one case, and poisoned allocations.

``tritonkit check`` and the test suite both go through :func:`run_case`, so a kernel passes in one
exactly when it passes in the other. Production code never imports this module.
"""

from __future__ import annotations

import contextlib
import math
import secrets
import sys
from dataclasses import dataclass

import torch

from tritonkit.registry import Case, Inputs, KernelSpec, Tolerance

__all__ = [
    "GRAD_MODES",
    "CaseResult",
    "Comparison",
    "compare",
    "fresh_seed",
    "poison_value",
    "poisoned_allocations",
    "run_case",
    "upcast",
]

# Allocations made by code in these packages are poisoned under poisoned_allocations(): the library's own
# outputs and workspaces, not the inputs tests and benchmarks draw.
_POISONED_PACKAGES = ("tritonkit.ops", "tritonkit._core", "tritonkit.nn", "tritonkit.integrations")
_ALLOCATORS = (("torch", "empty"), ("torch", "empty_like"), ("torch", "empty_strided"), ("Tensor", "new_empty"))
_poison_depth = 0


def poison_value(dtype: torch.dtype):
    """NaN for floating dtypes, True for bool, the largest value for other integers."""
    if dtype.is_floating_point:
        return float("nan")
    if dtype == torch.bool:
        return True
    return torch.iinfo(dtype).max


def _poisoning(allocate):
    def allocate_poisoned(*args, **kwargs):
        out = allocate(*args, **kwargs)
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if caller.startswith(_POISONED_PACKAGES) and not isinstance(out, torch._subclasses.FakeTensor):
            out.fill_(poison_value(out.dtype))
        return out

    return allocate_poisoned


@contextlib.contextmanager
def poisoned_allocations():
    """While active, every ``torch.empty``, ``empty_like``, ``empty_strided`` and ``Tensor.new_empty`` that
    tritonkit's ops make is filled with :func:`poison_value` (NaN for floats): an element a kernel forgot to write
    cannot pass by matching leftover memory. Re-entrant; patches torch's functions for every thread (autograd's
    backward threads too) until the outermost context ends. The test suite wraps every test in it."""
    global _poison_depth
    owners = {"torch": torch, "Tensor": torch.Tensor}
    originals = [(owners[owner], name, getattr(owners[owner], name)) for owner, name in _ALLOCATORS]
    if _poison_depth == 0:
        for owner, name, allocate in originals:
            setattr(owner, name, _poisoning(allocate))
    _poison_depth += 1
    try:
        yield
    finally:
        _poison_depth -= 1
        if _poison_depth == 0:
            for owner, name, allocate in originals:
                setattr(owner, name, allocate)


def upcast(value):
    """Floating tensors to float64 (for references), inside tuples, lists and dicts too; other values
    unchanged."""
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.detach().to(torch.float64)
    if isinstance(value, (tuple, list)):
        return type(value)(upcast(item) for item in value)
    if isinstance(value, dict):
        return {key: upcast(item) for key, item in value.items()}
    return value


@dataclass(frozen=True)
class Comparison:
    max_abs_err: float
    max_rel_err: float
    n_bad: int
    numel: int
    first_bad: tuple[int, ...] | None

    @property
    def ok(self) -> bool:
        return self.n_bad == 0


COMPARE_CHUNK = 1 << 24  # elements compared at a time: a few float64 temporaries of 128 MB, not of the whole output


def compare(out: torch.Tensor, ref: torch.Tensor, tol: Tolerance) -> Comparison:
    """Compare ``out`` with a higher-precision ``ref`` elementwise.

    NaN in ``out`` passes only where ``ref`` is NaN too, infinities only where ``ref`` has the same one
    or overflows ``out``'s dtype in that direction.
    The relative error is reported over elements whose reference is not tiny (|ref| above the absolute
    tolerance, ``rms_atol`` included). Works through the elements COMPARE_CHUNK at a time, on the reference's
    device (on a GPU many times faster than on the host), so that a GPU-sized output needs no full-size temporaries.
    """
    if out.shape != ref.shape:
        raise AssertionError(f"output shape {tuple(out.shape)} differs from the reference's {tuple(ref.shape)}")
    if out.numel() == 0:
        return Comparison(0.0, 0.0, 0, 0, None)
    flat_out, flat_ref = out.detach().reshape(-1), ref.detach().reshape(-1)
    chunks = range(0, flat_out.numel(), COMPARE_CHUNK)

    def pair(start):
        out64 = flat_out[start : start + COMPARE_CHUNK].to(device=ref.device, dtype=torch.float64)
        ref64 = flat_ref[start : start + COMPARE_CHUNK].to(dtype=torch.float64)
        if out.dtype.is_floating_point and out.dtype != torch.float64:
            # An exact value beyond the output dtype's range rounds to infinity: that is the right answer
            # (seen: a float16 log_softmax gradient of 1 - 262144 * p over a 262144-wide row).
            overflow = ref64.abs() > torch.finfo(out.dtype).max
            ref64 = torch.where(overflow, ref64.sign() * math.inf, ref64)
        return out64, ref64, torch.isfinite(out64) & torch.isfinite(ref64)

    atol = tol.atol
    if tol.rms_atol:
        square_sum, finite = 0.0, 0
        for start in chunks:
            _, ref64, both_finite = pair(start)
            square_sum += float(ref64[both_finite].square().sum())
            finite += int(both_finite.sum())
        if finite:
            atol += tol.rms_atol * math.sqrt(square_sum / finite)
    max_abs = max_rel = 0.0
    n_bad, first_bad = 0, None
    for start in chunks:
        out64, ref64, both_finite = pair(start)
        close = torch.isclose(out64, ref64, rtol=tol.rtol, atol=atol, equal_nan=True)
        abs_err = torch.where(both_finite, (out64 - ref64).abs(), torch.zeros_like(out64))
        abs_err = torch.where(close | both_finite, abs_err, torch.full_like(abs_err, math.inf))
        significant = both_finite & (ref64.abs() > atol)
        rel_err = torch.where(significant, abs_err / ref64.abs().clamp_min(1e-300), torch.zeros_like(abs_err))
        bad = ~close
        chunk_bad = int(bad.sum())
        if chunk_bad and first_bad is None:
            flat_index = start + int(bad.nonzero()[0])
            first_bad = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat_index), out.shape))
        n_bad += chunk_bad
        max_abs, max_rel = max(max_abs, float(abs_err.max())), max(max_rel, float(rel_err.max()))
    return Comparison(max_abs, max_rel, n_bad, out.numel(), first_bad)


@dataclass(frozen=True)
class CaseResult:
    spec: str
    case_id: str
    dtype: torch.dtype
    seed: int
    comparisons: tuple[Comparison, ...]

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.comparisons)

    @property
    def max_abs_err(self) -> float:
        return max((c.max_abs_err for c in self.comparisons), default=0.0)

    @property
    def max_rel_err(self) -> float:
        return max((c.max_rel_err for c in self.comparisons), default=0.0)

    def explain(self) -> str:
        lines = [f"{self.spec} [{self.case_id}, {self.dtype}] seed={self.seed}"]
        for index, c in enumerate(self.comparisons):
            status = "ok" if c.ok else f"{c.n_bad}/{c.numel} elements off, first at {c.first_bad}"
            lines.append(f"  output {index}: max abs {c.max_abs_err:.3g}, max rel {c.max_rel_err:.3g}: {status}")
        return "\n".join(lines)


def fresh_seed() -> int:
    return secrets.randbits(31)


def _as_tuple(value) -> tuple:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


GRAD_MODES = ("random", "sum")


def _grad_leaves(inputs: Inputs) -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) for every floating, non-frozen tensor argument: the ones a backward must differentiate."""
    return [(f"arg{key}" if isinstance(key, int) else key, t) for key, t in inputs.trainable()]


def _with_grad(inputs: Inputs, upcast_to_float64: bool) -> Inputs:
    """Fresh leaf copies (upcast for the reference) of the floating tensors; the trainable ones
    require grad, frozen ones stay constant; other values unchanged."""
    trainable = {key for key, _ in inputs.trainable()}

    def leaf(key, value):
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            value = value.detach().to(torch.float64) if upcast_to_float64 else value.detach().clone()
            return value.requires_grad_(key in trainable)
        return value

    return Inputs(
        tuple(leaf(i, a) for i, a in enumerate(inputs.args)),
        {k: leaf(k, v) for k, v in inputs.kwargs.items()},
        inputs.frozen,
    )


def _upstream(outputs: tuple, mode: str, generator: torch.Generator) -> list[torch.Tensor]:
    """One upstream gradient per output: fresh random values, or what ``out.sum().backward()`` sends
    (ones expanded from a scalar, all strides 0)."""
    grads = []
    for out in outputs:
        if mode == "sum":
            grads.append(torch.ones((), dtype=out.dtype, device=out.device).expand(out.shape))
        else:
            grads.append(torch.randn(out.shape, generator=generator, device=out.device, dtype=torch.float32))
    return grads


def run_case(
    spec: KernelSpec,
    case: Case,
    dtype: torch.dtype,
    device: torch.device | str,
    seed: int | None = None,
    grad_mode: str | None = None,
) -> CaseResult:
    """Draw fresh inputs for ``case``, run ``spec.fn`` with poisoned outputs, compare to the reference.

    With ``grad_mode`` ("random" or "sum") and a spec that has a backward, every floating input's
    gradient (but the frozen inputs') is compared too, under a random upstream gradient or
    the stride-0 one of ``sum()``.
    """
    device = torch.device(device)
    case = spec.parse_case(case)
    seed = fresh_seed() if seed is None else seed
    generator = torch.Generator(device=device).manual_seed(seed)
    inputs: Inputs = spec.make_inputs(case, device, dtype, generator)
    # A case whose inputs carry no gradient (a uint8 image) checks the forward alone.
    backward = grad_mode is not None and spec.has_backward and bool(inputs.trainable())
    if grad_mode is not None and grad_mode not in GRAD_MODES:
        raise ValueError(f"grad_mode must be one of {GRAD_MODES}, got {grad_mode!r}")
    ours = _with_grad(inputs, upcast_to_float64=False) if backward else inputs
    theirs = (
        _with_grad(inputs, upcast_to_float64=True) if backward else Inputs(upcast(inputs.args), upcast(inputs.kwargs))
    )
    with poisoned_allocations():
        outputs = _as_tuple(spec.fn(*ours.args, **ours.kwargs))
    references = _as_tuple(spec.reference(*theirs.args, **theirs.kwargs))
    if len(outputs) != len(references):
        raise AssertionError(f"{spec.name}: {len(outputs)} outputs but {len(references)} reference outputs")
    tol = spec.tolerance_for(case, dtype)
    comparisons = [compare(out, ref, tol) for out, ref in zip(outputs, references, strict=True)]
    if backward:
        # The reference gets exactly the upstream gradient the kernel got, rounded to the output dtype. Outputs
        # that carry no gradient (a statistic such as a log-sum-exp) get none, on both sides.
        carried = [i for i, out in enumerate(outputs) if out.requires_grad]
        mine, exact = [outputs[i] for i in carried], [references[i] for i in carried]
        upstream = [g.to(o.dtype) for g, o in zip(_upstream(mine, grad_mode, generator), mine, strict=True)]
        with poisoned_allocations():
            torch.autograd.backward(mine, upstream)
        torch.autograd.backward(exact, [g.to(torch.float64) for g in upstream])
        for (name, mine), (_, exact) in zip(_grad_leaves(ours), _grad_leaves(theirs), strict=True):
            if exact.grad is None:
                continue  # the reference does not depend on this input (an unused optional)
            if mine.grad is None:
                raise AssertionError(f"{spec.name}: no gradient reached {name}")
            comparisons.append(compare(mine.grad, exact.grad, tol))
    return CaseResult(spec.name, spec.case_id(case), dtype, seed, tuple(comparisons))
