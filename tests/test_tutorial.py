"""Tutorial ops beyond the registry sweep: block sizes, strides, exact uint8 rounding, bounds, bad input."""

import pytest
import torch

import tritonkit as tk
from helpers import assert_compiled_matches_eager
from tritonkit import debug


@pytest.mark.parametrize("block_size", [1, 3, 64, 100, 1000, 65536])
def test_copy_any_block_size(block_size, device):
    x = torch.randn(2500, device=device)
    assert torch.equal(tk.ops.copy(x, block_size=block_size), x)


def test_copy_keeps_shape_and_dtype(device):
    x = torch.randint(-100, 100, (4, 5, 6), device=device, dtype=torch.int32)
    y = tk.ops.copy(x, block_size=7)
    assert y.shape == x.shape and y.dtype == torch.int32 and torch.equal(y, x)
    expanded = torch.randn(3, 1, device=device).expand(3, 5)  # stride 0
    assert torch.equal(tk.ops.copy(expanded), expanded)


@pytest.mark.parametrize("op", ["add", "add_relu"])
def test_binary_ops_on_strided_and_expanded_inputs(op, device):
    base = torch.randn(8, 9, device=device)
    x = base.t()  # transposed
    y = torch.randn(9, 1, device=device).expand(9, 8)  # stride 0
    ref = x + y if op == "add" else torch.relu(x + y)
    torch.testing.assert_close(getattr(tk.ops, op)(x, y), ref, rtol=0, atol=0)


def test_add_relu_zeroes_negatives_exactly(device):
    x = torch.tensor([-2.0, -0.5, 0.0, 0.5, 3.0], device=device)
    y = torch.tensor([1.0, 0.25, 0.0, -1.0, 1.0], device=device)
    assert tk.ops.add_relu(x, y).tolist() == [0.0, 0.0, 0.0, 0.0, 4.0]


def test_grey_uint8_rounds_to_nearest_and_stays_in_range(device):
    # 0.2989*r + 0.587*g + 0.114*b for chosen pixels: exact sums 255*0.9999 -> 255, 0.5 -> 1, 0.4989 -> 0
    img = torch.zeros(3, 1, 4, dtype=torch.uint8, device=device)
    img[:, 0, 0] = 255
    img[:, 0, 1] = torch.tensor([0, 0, 0], dtype=torch.uint8)
    img[0, 0, 2] = 1  # 0.2989 -> 0
    img[1, 0, 3] = 1  # 0.587 -> 1
    assert tk.ops.rgb_to_grey(img).tolist() == [[255, 0, 0, 1]]


def test_grey_matches_float_formula(device):
    img = torch.rand(3, 17, 29, device=device)
    ref = 0.2989 * img[0] + 0.5870 * img[1] + 0.1140 * img[2]
    torch.testing.assert_close(tk.ops.rgb_to_grey(img), ref, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    ("name", "make_args"),
    [
        ("copy", lambda d: (torch.randn(1000, device=d),)),
        ("add", lambda d: (torch.randn(999, device=d), torch.randn(999, device=d))),
        (
            "add_relu",
            lambda d: (
                torch.randn(77, device=d, dtype=torch.bfloat16),
                torch.randn(77, device=d, dtype=torch.bfloat16),
            ),
        ),
        ("rgb_to_grey", lambda d: (torch.rand(3, 37, 41, device=d),)),
        ("matmul", lambda d: (torch.randn(45, 33, device=d), torch.randn(33, 70, device=d))),
    ],
)
def test_no_out_of_bounds_reads_reach_outputs(name, make_args, device):
    op = getattr(tk.ops, name)
    debug.guard_bounds(op, *make_args(device)).raise_if_bad()


def _bad(fn, error, match):
    return pytest.param(fn, error, match, id=match[:40])


BAD_INPUTS = [
    _bad(lambda d: tk.ops.copy([1, 2]), TypeError, "x must be a torch.Tensor, got list"),
    _bad(lambda d: tk.ops.copy(torch.ones(3, device=d), block_size=0), ValueError, "block_size must be positive"),
    _bad(lambda d: tk.ops.copy(torch.ones(3, device=d), block_size=2.5), TypeError, "block_size must be an int"),
    _bad(lambda d: tk.ops.copy(torch.ones(3, device=d), block_size=1 << 17), ValueError, "at most 65536"),
    _bad(
        lambda d: tk.ops.add(torch.ones(3, device=d, dtype=torch.int32), torch.ones(3, device=d)),
        TypeError,
        r"x must have dtype in \(float32, float16, bfloat16\), got torch.int32",
    ),
    _bad(
        lambda d: tk.ops.add(torch.ones(3, device=d), torch.ones(3, device=d, dtype=torch.float16)),
        TypeError,
        "x and y must have the same dtype, got torch.float32 and torch.float16",
    ),
    _bad(
        lambda d: tk.ops.add_relu(torch.ones(3, device=d), torch.ones(4, device=d)),
        ValueError,
        r"x and y must have the same shape, got \(3,\) and \(4,\)",
    ),
    _bad(
        lambda d: tk.ops.add(torch.ones(3, device=d), torch.ones(3, device="meta")),
        ValueError,
        "x and y must be on the same device",
    ),
    _bad(
        lambda d: tk.ops.rgb_to_grey(torch.ones(4, 5, 5, device=d)),
        ValueError,
        r"img must have shape \(3, H, W\), got \(4, 5, 5\)",
    ),
    _bad(
        lambda d: tk.ops.rgb_to_grey(torch.ones(3, 5, device=d)),
        ValueError,
        r"img must have 3 dimensions, got 2 \(shape \(3, 5\)\)",
    ),
    _bad(
        lambda d: tk.ops.rgb_to_grey(torch.ones(3, 5, 5, device=d, dtype=torch.int16)),
        TypeError,
        "img must have dtype in .*uint8.*got torch.int16",
    ),
]


@pytest.mark.parametrize(("fn", "error", "match"), BAD_INPUTS)
def test_bad_input_is_named(fn, error, match, device):
    with pytest.raises(error, match=match):
        fn(device)


@pytest.mark.gpu
def test_cpu_and_mixed_device_inputs_are_refused_when_compiled():
    with pytest.raises(ValueError, match="x is on cpu, but compiled Triton kernels need CUDA tensors"):
        tk.ops.add(torch.ones(3), torch.ones(3))
    with pytest.raises(ValueError, match="x and y must be on the same device, got cuda:0 and cpu"):
        tk.ops.add(torch.ones(3, device="cuda"), torch.ones(3))


# --------------------------------------------------------------------------------------------------
# Gradients: add, add_relu, copy and float rgb_to_grey are differentiable
# --------------------------------------------------------------------------------------------------
GREY = (0.2989, 0.5870, 0.1140)


def _grey_reference(img):
    return GREY[0] * img[0] + GREY[1] * img[1] + GREY[2] * img[2]


GRADIENT_CASES = {
    "add": (lambda x, y: x + y, lambda d, dt: (torch.randn(7, 9, device=d, dtype=dt), torch.randn(9, 7, device=d,
                                                                                                   dtype=dt).t())),
    "add_relu": (lambda x, y: torch.relu(x + y), lambda d, dt: (torch.randn(123, device=d, dtype=dt),
                                                               torch.randn(123, device=d, dtype=dt))),
    "copy": (lambda x: x.clone(), lambda d, dt: (torch.randn(40, 3, device=d, dtype=dt)[::2],)),
    "rgb_to_grey": (_grey_reference, lambda d, dt: (torch.rand(3, 7, 33, device=d, dtype=dt),)),
}  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", list(GRADIENT_CASES))
def test_tutorial_op_gradients_match_float64(name, dtype, device):
    """Inputs that require grad get their gradient (it used to vanish: the outputs had no graph), right against
    float64 torch under a random upstream gradient, in the inputs' dtype."""
    reference, make = GRADIENT_CASES[name]
    inputs = [t.requires_grad_() for t in make(device, dtype)]
    exact = [t.detach().double().requires_grad_() for t in inputs]
    out = getattr(tk.ops, name)(*inputs)
    expected = reference(*exact)
    assert out.requires_grad and out.grad_fn is not None
    upstream = torch.randn_like(expected).to(dtype)
    ours = torch.autograd.grad(out, inputs, upstream)
    theirs = torch.autograd.grad(expected, exact, upstream.double())
    tolerance = {"rtol": 1e-5, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 8e-3, "atol": 8e-3}
    for grad, exact_grad, t in zip(ours, theirs, inputs, strict=True):
        assert grad.dtype == dtype and grad.shape == t.shape
        torch.testing.assert_close(grad.double(), exact_grad, **tolerance)


def test_only_the_inputs_that_require_grad_get_one(device):
    x, y = torch.randn(10, device=device), torch.randn(10, device=device, requires_grad=True)
    out = tk.ops.add_relu(x, y)
    out.sum().backward()
    assert x.grad is None and torch.equal(y.grad, (x + y.detach() > 0).float())
    with torch.no_grad():
        assert not tk.ops.add(x, y).requires_grad and not tk.ops.copy(y).requires_grad
    assert not tk.ops.add(x, x).requires_grad


def test_add_of_a_tensor_with_itself_sums_both_gradients(device):
    x = torch.randn(6, device=device, requires_grad=True)
    tk.ops.add(x, x).backward(torch.arange(6.0, device=device))
    assert torch.equal(x.grad, 2 * torch.arange(6.0, device=device))


@pytest.mark.parametrize("name", list(GRADIENT_CASES))
def test_tutorial_ops_compile_fullgraph_with_backward(name, device):
    _, make = GRADIENT_CASES[name]
    op = getattr(tk.ops, name)

    def block(*inputs):
        out = op(*(t * 2 for t in inputs))
        return (out * torch.arange(out.shape[-1], device=out.device)).sum()

    assert_compiled_matches_eager(block, [t.requires_grad_() for t in make(device, torch.float32)], device)


# --------------------------------------------------------------------------------------------------
# copy: any dtype, bit for bit
# --------------------------------------------------------------------------------------------------
def _bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes, to compare NaN payloads and dtypes without arithmetic."""
    return t.contiguous().reshape(-1).view(torch.uint8)


COPY_DTYPES = [torch.complex64, torch.complex128, torch.complex32, torch.float64, torch.float8_e4m3fn,
               torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz, torch.bool, torch.int8, torch.uint16,
               torch.uint32, torch.uint64, torch.bits8, torch.bits16]  # fmt: skip


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental:UserWarning")  # torch's, on complex32
@pytest.mark.parametrize("dtype", COPY_DTYPES, ids=lambda dtype: str(dtype).removeprefix("torch."))
@pytest.mark.parametrize("block_size", [1, 3, 1024])
def test_copy_copies_any_dtype_bit_for_bit(dtype, block_size, device):
    """copy is a byte copy: every dtype a dense tensor can hold, 16-byte complex128 included, strided too. (A
    complex64 used to raise KeyError: 'complex64' from inside Triton.)"""
    high = 2 if dtype == torch.bool else 256  # a bool byte is 0 or 1; any other byte pattern is some value's
    raw = torch.randint(0, high, (2, 37 * dtype.itemsize), dtype=torch.uint8, device=device)
    x = raw.view(dtype)[:, ::2]  # arbitrary bytes, NaN payloads included, every other element
    y = tk.ops.copy(x, block_size=block_size)
    assert y.dtype == dtype and y.shape == x.shape and y.is_contiguous()
    assert torch.equal(_bits(y), _bits(x))


def test_copy_of_a_conjugate_view_copies_its_values(device):
    z = torch.randn(5, dtype=torch.complex64, device=device)
    assert torch.equal(tk.ops.copy(z.conj()), z.conj().resolve_conj())
    assert torch.equal(tk.ops.copy(torch.tensor(3 + 4j, device=device)), torch.tensor(3 + 4j, device=device))


@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor:UserWarning")  # torch deprecates making them
def test_copy_refuses_quantized_tensors():
    q = torch.quantize_per_tensor(torch.randn(4), 0.1, 0, torch.qint8)
    with pytest.raises(
        TypeError, match=r"copy: x must be a plain strided tensor, got a quantized tensor of torch.qint8"
    ):
        tk.ops.copy(q)
