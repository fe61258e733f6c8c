"""Compile every kernel the library launches, the puzzles' solutions and the debug helpers, for sm_90 without a GPU.

Run by test_compiled_build.py in a fresh process without TRITON_INTERPRET: the interpreter accepts code the compiler
rejects, so this catches kernels that would only fail on a GPU. Nothing here lists kernels or signatures: every
registered spec's test cases (in bf16 where the spec takes it, forward and backward, with the
cross-program spin-waits allowed and forbidden) and every puzzle's cases run through their launchers on CPU tensors
with each kernel launch recorded instead of run. Of the distinct (kernel, argument types, constexprs, warps, stages)
recorded, a set is compiled for sm_90 in which every argument type, launch option and non-tile constexpr value of
each kernel appears at least once, each at the smallest tiles that reach it (:func:`covering_variants`): what the
compiler rejects comes from a branch a constexpr selects, a type, or operands too narrow for a dot. That is 220 of
485 variants, about 70 s from a cold cache on two cores; the GPU suite compiles every variant it runs. A
``*_kernel`` in a family's kernels.py that no case launches fails the run by name, so a new kernel cannot go
uncompiled. Prints one line per compiled variant and exits non-zero on the first failure.
"""

import importlib
import math
import multiprocessing
import os
import sys

os.environ.pop("TRITON_INTERPRET", None)

import torch
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.runtime.autotuner import Autotuner
from triton.runtime.jit import JITFunction, mangle_type
from triton.tools.tensor_descriptor import TensorDescriptor

import tritonkit
from tritonkit import catalog, debug, puzzles
from tritonkit._core import checks, device
from tritonkit.testing import _with_grad

HOPPER = GPUTarget("cuda", 90, 32)
H100_SMS = 132  # programs the device stand-in reports: enough for the one-launch split-row forms
# The floating dtype compiled (fp16 takes bf16's code paths; fp32, the checking dtype, takes IEEE-precision dots that
# compile to scalar FMAs, half of a cold run's time on CI's two cores: the GPU suite compiles those); integers all.
DTYPES = (torch.bfloat16,)
_TYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.int64: "i64",
          torch.int32: "i32", torch.int16: "i16", torch.int8: "i8", torch.uint8: "u8", torch.bool: "i1",
          torch.float8_e4m3fn: "fp8e4nv", torch.float8_e5m2: "fp8e5"}  # fmt: skip


class Recorder:
    """Stands in for kernel launches: each launch's kernel, argument types and constexprs, once each, with the
    divisibility Triton would specialise them on (``attrs``, by the variant's key): a GPU compiles that code."""

    def __init__(self):
        self.variants = {}
        self.attrs = {}

    def record(self, kernel: JITFunction, args, kwargs) -> None:
        options = {key: kwargs.pop(key) for key in ("num_warps", "num_stages", "maxnreg") if key in kwargs}
        signature, constexprs = {}, {}
        for param, value in zip(kernel.params, [*args, *([None] * (len(kernel.params) - len(args)))], strict=True):
            if param.name in kwargs:
                value = kwargs[param.name]
            elif value is None and param.has_default:
                value = param.default
            if param.is_constexpr or value is None:  # Triton specialises a None argument as a constexpr
                constexprs[param.name] = value
                signature[param.name] = "constexpr"
            else:
                signature[param.name] = _type(value)
        attrs = _divisibility(kernel, args, kwargs)
        key = (kernel.__name__, tuple(signature.items()), tuple(constexprs.items()), tuple(sorted(options.items())),
               tuple(attrs))  # fmt: skip
        self.variants.setdefault(key, (kernel, signature, constexprs, options))
        self.attrs.setdefault(key, attrs)


def _divisibility(kernel: JITFunction, args, kwargs) -> dict:
    """Triton's specialisation of a launch's arguments, as its launcher makes it: tensors whose address and ints whose
    value are multiples of 16 are compiled as such (vector loads and stores follow from it), unless the kernel asks
    not to for that argument."""
    attrs = {}
    for i, param in enumerate(kernel.params):
        value = kwargs[param.name] if param.name in kwargs else (args[i] if i < len(args) else None)
        if param.is_constexpr or value is None or isinstance(value, bool):
            continue
        if isinstance(value, torch.Tensor):
            aligned = value.data_ptr() % 16 == 0 and not param.do_not_specialize_on_alignment
        else:
            aligned = isinstance(value, int) and value % 16 == 0 and not param.do_not_specialize
        if aligned:
            attrs[(i,)] = [["tt.divisibility", 16]]
    return attrs


def _type(value) -> str:
    if isinstance(value, torch.Tensor):
        return "*" + _TYPES[value.dtype]
    if isinstance(value, TensorDescriptor):  # Triton's own name: "tensordesc<bf16[128, 64]>"
        return mangle_type(value)
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -(2**31) <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"no Triton type for a launch argument {value!r}")


def _recording(recorder: Recorder):
    def run(self, *args, grid, warmup, **kwargs):
        recorder.record(self, args, dict(kwargs))

    def autotuned_run(self, *args, **kwargs):  # the smallest tile stands for the search (see _size)
        config = min(self.configs, key=lambda c: math.prod(v for k, v in c.kwargs.items() if _is_tile(k, v)))
        return self.fn.run(*args, **{**kwargs, **config.all_kwargs()})

    return run, autotuned_run


def _launch_specs() -> None:
    """Every spec's test cases through its public op, forward and (where it has one) backward."""
    for spec in catalog.all_specs():
        for dtype in (d for d in spec.dtypes if d in DTYPES or not d.is_floating_point):
            for case in spec.test_cases:
                inputs = spec.make_inputs(case, torch.device("cpu"), dtype, torch.Generator().manual_seed(0))
                if spec.has_backward:
                    inputs = _with_grad(inputs, upcast_to_float64=False)
                outputs = spec.fn(*inputs.args, **inputs.kwargs)
                outputs = [t for t in (outputs if isinstance(outputs, tuple) else (outputs,)) if t.requires_grad]
                if outputs:
                    torch.autograd.backward(outputs, [torch.ones_like(t) for t in outputs])


def _launch_puzzles() -> None:
    for puzzle in puzzles.all_puzzles():
        module = importlib.import_module(puzzle.module)
        for dtype in puzzle.dtypes:
            for case in puzzle.cases:
                inputs = puzzle.make_inputs(case, dtype, "cpu", torch.Generator().manual_seed(0))
                outs = [torch.empty(shape, dtype=out_dtype) for _, shape, out_dtype in puzzle.output_specs(case, dtype)]
                getattr(module, puzzle.launcher)(*inputs, *outs, **puzzle.launcher_kwargs(case))


def _library_kernels() -> set[str]:
    """Every ``*_kernel`` jit function of the families' kernels.py."""
    names = set()
    for package in catalog.family_packages():
        module = importlib.import_module(f"tritonkit.ops.{package}.kernels")
        kernels = {name for name, obj in vars(module).items() if isinstance(obj, JITFunction)}
        names |= {name for name in kernels if name.endswith("_kernel")}
    return names


@triton.jit
def _every_helper_kernel(p_x, p_out, n_rows, n_cols, stride_row, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    o_r = debug.offsets_1d(BLOCK_R, tl.program_id(0))
    o_c = debug.offsets_1d(BLOCK_C, tl.program_id(1))
    m_rc = debug.mask_2d(o_r, o_c, n_rows, n_cols)
    b_x = tl.load(p_x + debug.offsets_2d(o_r, o_c, stride_row), mask=m_rc)
    debug.print_if("tile", "=0,>=1")
    debug.print_if(b_x, "!=0")
    debug.breakpoint_if("<=3,,=0")
    b_first = tl.load(p_x + o_c, mask=debug.mask_1d(o_c, n_cols))
    tl.store(p_out + debug.offsets_2d(o_r, o_c, stride_row), b_x + b_first[None, :], mask=m_rc)


def _features(variant) -> frozenset:
    """What a recorded variant compiles that needs covering: each argument's type, each launch option, and the value
    of each constexpr other than a tile size (a branch taken). Tile sizes are left to :func:`_size`, which picks
    the smallest (where a dot's operands too narrow would fail); the GPU suite compiles the large ones."""
    _, signature, constexprs, options = variant
    types = {("type", name, kind) for name, kind in signature.items() if kind != "constexpr"}
    values = {("constexpr", name, repr(value)) for name, value in constexprs.items() if not _is_tile(name, value)}
    return frozenset(types | values | {("option", name, value) for name, value in options.items()})


def _is_tile(name, value) -> bool:
    return name.startswith("BLOCK") and isinstance(value, int)


def _size(variant) -> int:
    """A stand-in for how long a variant takes to compile: its tiles' elements (the product of its BLOCK_*
    constexprs)."""
    return math.prod(value for name, value in variant[2].items() if _is_tile(name, value))


def covering_variants(variants: dict) -> dict:
    """A subset of the recorded variants in which every feature (:func:`_features`) that any variant of a kernel has
    appears at least once for that kernel: greedily, the variant with the most features not yet covered per unit of
    :func:`_size` first (the first recorded among equals, so the choice is the same every run)."""
    by_kernel: dict = {}
    for key, variant in variants.items():
        by_kernel.setdefault(variant[0], []).append((key, variant))
    chosen = {}
    for candidates in by_kernel.values():
        features = {key: _features(variant) for key, variant in candidates}
        uncovered = frozenset().union(*features.values())
        while uncovered:
            key, variant = max(candidates, key=lambda c: len(features[c[0]] & uncovered) / max(_size(c[1]), 1))
            uncovered -= features[key]
            chosen[key] = variant
    return chosen


def compile_one(name, fn, signature, constexprs, attrs=None, **options) -> str:
    source = triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    compiled = triton.compile(source, target=HOPPER, options=options or None)
    return f"{name}: {len(compiled.asm['cubin'])} bytes of sm_90 code"


_VARIANTS: list = []  # the recorded variants, read by the forked workers


def _compile_variant(index: int) -> str:
    name, kernel, signature, constexprs, options, attrs = _VARIANTS[index]
    label = ", ".join(f"{k}={v}" for k, v in constexprs.items())
    return compile_one(f"{kernel.__module__}.{name} [{label}]", kernel, signature, constexprs, attrs, **options)


# Library kernels that only a forced plan launches on sm90, with where they are compiled instead.
FORCED_PLAN_ONLY = {
    "_split_k_reduce_kernel": "plans_for_hopper.py (sm90's GEMV plans sum their splits in the GEMV's last split)",
}


def main() -> int:
    recorder = Recorder()
    JITFunction.run, Autotuner.run = _recording(recorder)
    checks.kernels_interpreted = lambda: True  # CPU tensors pass the device check; the launches are only recorded
    device._INTERPRETER_PROGRAMS = H100_SMS
    for spin_waits in (True, False):
        with tritonkit.set_spin_waits(spin_waits):
            _launch_specs()
    library = {key[0] for key in recorder.variants}
    missing = sorted(_library_kernels() - library - set(FORCED_PLAN_ONLY))
    if missing:
        print(f"no test case of any spec launches {', '.join(missing)}: give it one", file=sys.stderr)
        return 1
    _launch_puzzles()
    print(compile_one("debug helpers", _every_helper_kernel,
                      {"p_x": "*fp32", "p_out": "*fp32", "n_rows": "i32", "n_cols": "i32", "stride_row": "i32",
                       "BLOCK_R": "constexpr", "BLOCK_C": "constexpr"}, {"BLOCK_R": 16, "BLOCK_C": 32}))  # fmt: skip
    covering = covering_variants(recorder.variants)
    _VARIANTS.extend((key[0], *variant, recorder.attrs[key]) for key, variant in covering.items())
    # Compiling is CPU-bound and independent per variant: forked workers (which inherit the recorded variants) on
    # every core; the lines come back in the recorded order, and the first failure fails the run.
    with multiprocessing.get_context("fork").Pool(min(os.cpu_count() or 1, 8)) as pool:
        for line in pool.imap(_compile_variant, range(len(_VARIANTS))):
            print(line, flush=True)
    print(f"{len(covering)} of the {len(recorder.variants)} recorded variants of {len(library)} library kernels and "
          "the puzzles' solutions", file=sys.stderr)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
