"""Each limitation listed in docs/interpreter.md, verified on the pinned Triton (one test per section).

If an upgrade of Triton fixes one, its test fails here and the document must be updated with it.
"""

import os
import subprocess
import sys
import textwrap

import torch
import triton
import triton.language as tl

from tritonkit import debug


@triton.jit
def _mul_add_kernel(p_x, p_y, p_out, CAST: tl.constexpr, BLOCK: tl.constexpr):
    o = tl.arange(0, BLOCK)
    b_x = tl.load(p_x + o)
    b_y = tl.load(p_y + o)
    if CAST:
        b_x = b_x.to(tl.float32)
        b_y = b_y.to(tl.float32)
    tl.store(p_out + o, (b_x * b_y + b_x).to(p_out.dtype.element_ty))


def test_bf16_arithmetic_without_a_cast_is_wrong():
    x = torch.randn(64, dtype=torch.bfloat16)
    y = torch.randn(64, dtype=torch.bfloat16)
    ref = x.double() * y.double() + x.double()
    errors = {}
    for cast in (False, True):
        out = torch.empty_like(x)
        _mul_add_kernel[(1,)](x, y, out, CAST=cast, BLOCK=64)
        errors[cast] = (out.double() - ref).abs().nan_to_num(nan=float("inf"))
    assert float(errors[False].max()) > 1e3  # garbage, not rounding
    # One bf16 rounding of each value, which the interpreter does by truncation: under one ulp,
    # 2**-7 of the value (an absolute 0.05 failed once a random value passed 8), plus fp32's own
    # rounding of x * y + x where the two terms cancel.
    assert bool((errors[True] <= 2**-7 * ref.abs() + 1e-5).all()), float(errors[True].max())


@triton.jit
def _dot_kernel(p_a, p_b, p_c, CAST: tl.constexpr, PRECISION: tl.constexpr):
    o = tl.arange(0, 16)
    b_a = tl.load(p_a + o[:, None] * 16 + o[None, :])
    b_b = tl.load(p_b + o[:, None] * 16 + o[None, :])
    if CAST:
        b_a = b_a.to(tl.float32)
        b_b = b_b.to(tl.float32)
    tl.store(p_c + o[:, None] * 16 + o[None, :], tl.dot(b_a, b_b, input_precision=PRECISION))


def test_bf16_dot_without_a_cast_is_wrong():
    a = torch.randn(16, 16, dtype=torch.bfloat16)
    b = torch.randn(16, 16, dtype=torch.bfloat16)
    ref = a.double() @ b.double()
    errors = {}
    for cast in (False, True):
        c = torch.empty(16, 16, dtype=torch.float32)
        _dot_kernel[(1,)](a, b, c, CAST=cast, PRECISION="tf32")
        errors[cast] = float((c.double() - ref).abs().nan_to_num(nan=float("inf")).max())
    assert errors[False] > 1e3
    assert errors[True] < 1e-4


def test_fp32_dot_ignores_tf32():
    # On a GPU input_precision="tf32" rounds the inputs to 10 mantissa bits (errors near 1e-2 here);
    # the interpreter computes in full fp32 either way, so TF32 error never shows on the CPU.
    a = torch.randn(16, 16)
    b = torch.randn(16, 16)
    ref = a.double() @ b.double()
    for precision in ("tf32", "ieee"):
        c = torch.empty(16, 16)
        _dot_kernel[(1,)](a, b, c, CAST=False, PRECISION=precision)
        assert float((c.double() - ref).abs().max()) < 1e-4


@triton.jit
def _to_bf16_kernel(p_x, p_out, BLOCK: tl.constexpr):
    o = tl.arange(0, BLOCK)
    tl.store(p_out + o, tl.load(p_x + o).to(tl.bfloat16))


def test_fp32_to_bf16_truncates_instead_of_rounding():
    x = torch.randn(4096)
    out = torch.empty(4096, dtype=torch.bfloat16)
    _to_bf16_kernel[(1,)](x, out, BLOCK=4096)
    truncated = (x.view(torch.int32) & ~0xFFFF).view(torch.float32).to(torch.bfloat16)
    assert torch.equal(out, truncated)  # round toward zero, bit for bit
    assert (out != x.to(torch.bfloat16)).sum() > 1000  # torch (and the GPU) round to nearest even


@triton.jit
def _unmasked_kernel(p_x, p_out, BLOCK: tl.constexpr):
    o = tl.arange(0, BLOCK)
    tl.store(p_out + o, tl.load(p_x + o))


def test_unmasked_out_of_bounds_load_returns_neighbouring_memory_silently():
    storage = torch.arange(32, dtype=torch.float32)
    x = storage[:10]  # the kernel reads 16 elements of a 10-element tensor
    out = torch.empty(16)
    _unmasked_kernel[(1,)](x, out, BLOCK=16)  # no error, no warning
    assert out[10:].tolist() == [10.0, 11.0, 12.0, 13.0, 14.0, 15.0]


def test_unmasked_out_of_bounds_store_overwrites_neighbouring_memory_silently():
    storage = torch.full((32,), -1.0)
    out = storage[:10]
    _unmasked_kernel[(1,)](torch.arange(16, dtype=torch.float32), out, BLOCK=16)
    assert storage[10:16].tolist() == [10.0, 11.0, 12.0, 13.0, 14.0, 15.0]  # a neighbour was overwritten
    report = debug.guard_bounds(
        lambda x, o: _unmasked_kernel[(1,)](x, o, BLOCK=16), torch.arange(16, dtype=torch.float32), torch.empty(10)
    )
    assert report.oob_writes  # the guard sees what the interpreter does not


ORDER: list[tuple[int, int, int]] = []


@triton.jit
def _record_order_kernel(p_x):
    ORDER.append((int(tl.program_id(0)), int(tl.program_id(1)), int(tl.program_id(2))))


def test_programs_run_one_at_a_time_in_grid_order():
    ORDER.clear()
    _record_order_kernel[(2, 2, 2)](torch.empty(1))
    assert [(x, y, z) for x in range(2) for y in range(2) for z in range(2)] == ORDER


def test_python_runs_inside_interpreted_kernels_but_not_compiled_ones(tmp_path):
    # Under the interpreter the kernel above appended to a Python list. The compiler refuses a
    # reference to a Python function even in a branch it would never generate.
    script = textwrap.dedent("""
        import triton, triton.language as tl
        from triton.backends.compiler import GPUTarget
        NEVER = tl.constexpr(False)
        def host_side():
            pass
        @triton.jit
        def kernel(p_x):
            if NEVER:
                host_side()
        source = triton.compiler.ASTSource(fn=kernel, signature={"p_x": "*fp32"})
        try:
            triton.compile(source, target=GPUTarget("cuda", 90, 32))
        except Exception as error:
            print("refused:", error)
    """)
    path = tmp_path / "refused.py"  # @triton.jit needs its source in a file
    path.write_text(script)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, env=env, timeout=300)
    assert "refused:" in result.stdout and "Unsupported function referenced" in result.stdout, result.stderr
