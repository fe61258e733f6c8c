"""Tutorial ops beyond the registry sweep: block sizes, strides, exact uint8 rounding, bounds, bad input."""

import pytest
import torch

import tritonkit as tk
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
