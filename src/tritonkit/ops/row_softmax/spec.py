"""softmax and log_softmax in the registry: float64 references, typed cases, cost model."""

import functools
import math
from dataclasses import dataclass

import torch

from tritonkit._core.checks import FLOAT_DTYPES
from tritonkit.ops.row_softmax.op import log_softmax, softmax
from tritonkit.registry import Case, Inputs, KernelSpec, Tolerance, register


@dataclass(frozen=True)
class SoftmaxCase(Case):
    rows: int
    n: int  # the softmax dimension's size
    scale: float = 3.0  # standard deviation of the logits
    masked: bool = False  # -inf above the diagonal (causal), and one fully masked row
    transposed: bool = False  # column-major: the softmax dimension is strided
    dim: int = -1  # where the softmax dimension sits in x


def _softmax_reference(x, dim=-1):
    return torch.softmax(x, dim)


def _log_softmax_reference(x, dim=-1):
    return torch.log_softmax(x, dim)


def _softmax_inputs(case: SoftmaxCase, device, dtype, generator):
    rows, n = case.rows, case.n
    x = (case.scale * torch.randn(rows, n, device=device, generator=generator)).to(dtype)
    if case.masked:  # a causal-style mask: -inf above the diagonal, and one fully masked row
        x = x.masked_fill(torch.ones(rows, n, dtype=torch.bool, device=device).triu(1), float("-inf"))
        x[0] = float("-inf")
    if case.transposed:
        x = x.t().contiguous().t()  # same values, column-major: dim -1 is strided
    if case.dim != -1:
        x = x.movedim(-1, case.dim).contiguous()
    return Inputs((x,), {"dim": case.dim})


def _softmax_bytes(case: SoftmaxCase, dtype, backward=False):
    return (3 if backward else 2) * case.rows * case.n * dtype.itemsize


_TESTS = (
    {"rows": 1, "n": 1},
    {"rows": 5, "n": 7},
    {"rows": 33, "n": 128},
    {"rows": 3, "n": 1000, "transposed": True},
    {"rows": 6, "n": 16, "masked": True},
    {"rows": 2, "n": 40000},  # rows split across programs
    {"rows": 3, "n": 20000},  # a 32768 block: the 16-bit backward's 32-warp single pass
    {"rows": 2, "n": 40000, "masked": True},
    {"rows": 0, "n": 16},
    {"rows": 4, "n": 9, "dim": 0},
    {"rows": 4, "n": 64, "scale": 30.0},  # large logits: exp would overflow without the max shift
)
_GPU = (
    {"rows": 4096, "n": 4096},
    {"rows": 1024, "n": 262144},
    {"rows": 1000, "n": 50257, "masked": True},
    {"rows": 2048, "n": 4096, "transposed": True},
    {"rows": 8, "n": 4096},
    {"rows": 256, "n": 16384},  # fp32's backward: a whole row on 32 warps
    {"rows": 256, "n": 32768},  # fp32's backward: rows split into 4096-column slices
)
# The small case, the width sweep, then rows split across programs (the bytes of 16384 x 16384).
_BENCH = (
    {"rows": 8, "n": 4096},
    *({"rows": 16384, "n": n} for n in (1024, 2048, 4096, 8192, 32768)),
    {"rows": 4096, "n": 65536},
)


def _log_softmax_tolerance(case, dtype):
    """fp32 needs an absolute bound that grows with the row: the gradient g - exp(y) * sum(g) sums n
    upstream values of unit scale (|sum| ~ sqrt(n)), and where exp(y) is near 1 the subtraction cancels,
    leaving the sum's rounding, a few ulp of sqrt(n), as absolute error. Measured: at most 5.7 * 2**-24 *
    sqrt(n) over 12 seeds each at n = 40000 and 100000 (torch's own fp32 CPU backward: 39). Softmax's gradient
    p * (g - sum(p * g)) sums a weighted mean instead and keeps the table's bound."""
    if dtype != torch.float32:
        return None
    return Tolerance(atol=max(1e-5, 16 * 2**-24 * math.sqrt(case.n)), rtol=1e-5)


for _name, _fn, _ref, _tolerance in (
    ("softmax", softmax, _softmax_reference, None),
    ("log_softmax", log_softmax, _log_softmax_reference, _log_softmax_tolerance),
):
    register(KernelSpec(
        name=_name,
        family="softmax",
        sweep="n",
        case_type=SoftmaxCase,
        summary=f"{'Log-softmax' if _name == 'log_softmax' else 'Softmax'} along any dimension, forward and backward.",
        description="Rows up to 32768 in registers; longer rows split across programs, which combine their "
                    "slices' maxima and rescaled sums once all have published them, each holding its slice in "
                    "registers meanwhile: one read of each element. fp32 arithmetic; -inf handled as torch.",
        usage=f"p = tk.ops.{_name}(x, dim=-1)",
        tags=("softmax", "memory-bound", "backward"),
        limits="Any shape, dim and strides (a strided dim costs one torch copy); rows of any length.",
        fn=_fn,
        reference=_ref,
        make_inputs=_softmax_inputs,
        test_cases=_TESTS,
        gpu_cases=_GPU,
        bench_cases=_BENCH,
        bytes_moved=_softmax_bytes,
        bytes_moved_bwd=functools.partial(_softmax_bytes, backward=True),
        flops=lambda case, dtype: 5 * case.rows * case.n,
        dtypes=FLOAT_DTYPES,
        has_backward=True,
        tolerance=_tolerance,
        status="experimental",
    ))  # fmt: skip
