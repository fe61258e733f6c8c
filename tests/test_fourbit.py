"""The 4-bit linear layers beyond the registry sweep: the same result as dequantize + F.linear on quantized weights,
bitsandbytes' (n / 2, 1) codes, every plan (split-K forced, the other tiles), a deterministic split sum, torch.compile
with the backward, the frozen weight, the benchmark peers, bad input; on a GPU a CUDA-graph capture."""

import dataclasses
import functools
import re
import struct
from types import SimpleNamespace

import pytest
import torch

import tritonkit as tk
from helpers import assert_compiled_matches_eager, assert_graph_replay_matches_eager
from tritonkit import catalog
from tritonkit._core.fourbit import int4_weight
from tritonkit.ops.fourbit import launch
from tritonkit.ops.fourbit.plan import (
    DEQUANTIZE_FIRST_ROWS,
    FALLBACK,
    DequantizeFirst,
    Gemv4Tiles,
    Linear4Tiles,
    choose_splits,
    linear4_plan,
)


def _weight(n=40, k=96, device="cpu"):
    return torch.randn(n, k, device=device) * k**-0.5


@pytest.mark.parametrize("double_quant", [False, True])
def test_nf4_linear_is_dequantize_then_linear(device, double_quant):
    w = _weight(device=device)
    packed, state = tk.ops.nf4_quantize(w, blocksize=32, double_quant=double_quant)
    x = torch.randn(3, 5, 96, device=device, dtype=torch.bfloat16)
    bias = torch.randn(40, device=device, dtype=torch.bfloat16)
    # In fp32, rounded by torch: the interpreter's own conversion to bf16 truncates (docs/interpreter.md).
    dense = tk.ops.nf4_dequantize(packed, state, dtype=torch.float32).bfloat16()
    expected = x.double() @ dense.double().t() + bias.double()
    ours = tk.ops.nf4_linear(x, packed.reshape(-1, 1), state, bias=bias)  # bitsandbytes keeps its codes (n / 2, 1)
    assert ours.shape == (3, 5, 40) and ours.dtype == torch.bfloat16
    torch.testing.assert_close(ours.double(), expected, rtol=8e-3, atol=8e-3)


def test_int4_linear_is_dequantize_then_linear(device):
    w = _weight(device=device)
    qweight, scales, zeros = tk.ops.int4_quantize(w, group_size=32)
    x = torch.randn(7, 96, device=device, dtype=torch.float16)
    dense = tk.ops.int4_dequantize(qweight, scales, zeros, group_size=32, dtype=torch.float32).half()
    expected = x.double() @ dense.double().t()
    ours = tk.ops.int4_linear(x, qweight, scales, zeros, group_size=32)
    torch.testing.assert_close(ours.double(), expected, rtol=2e-3, atol=1e-3)


def _nf4_case(m, n=24, k=100, device="cpu", dtype=torch.float32):
    x = torch.randn(m, k, device=device, dtype=dtype)
    packed, state = tk.ops.nf4_quantize(_weight(n, k, device), blocksize=32, double_quant=True)
    dense = tk.ops.nf4_dequantize(packed, state, dtype=dtype).double()
    return x, packed, state, dense


PLANS = [
    Linear4Tiles(16, 64, 32, 4, 1, 1, splits=3),  # split-K forced: three partial sums over K (or over N for dx)
    *(tiles for _, tiles in FALLBACK),
    Linear4Tiles(32, 16, 32, 2, 2, 4),  # the smallest tile: tl.dot's 16 on every side
    DequantizeFirst(),  # many rows: the weight written once, then cuBLAS
    DequantizeFirst(block_n=16, block_k=32),  # K = 100 in steps of 32: a partial last step
    Linear4Tiles(16, 64, 128, 4, 3, 1, nf4_decode="gather"),  # NF4's other lookups ("prmt" is the select tree here)
    Linear4Tiles(16, 64, 128, 4, 3, 1, nf4_decode="prmt"),
    DequantizeFirst(nf4_decode="select"),
    DequantizeFirst(block_n=16, block_k=32, k_tiles=3),  # K = 100: 4 tiles, the second program's two past K
]


def _plan_id(plan) -> str:
    if isinstance(plan, DequantizeFirst):
        return f"dequantize-first-{plan.block_n}x{plan.block_k}x{plan.k_tiles}-{plan.nf4_decode}"
    return f"{plan.block_m}x{plan.block_n}x{plan.block_k}-s{plan.splits}-{plan.nf4_decode}"


@pytest.mark.parametrize("k", [100, 128], ids=["blocks-across-rows", "blocks-within-rows"])  # the two weight loaders
@pytest.mark.parametrize("plan", PLANS, ids=_plan_id)
def test_every_plan_gives_the_product_and_its_input_gradient(plan, k):
    x, packed, state, dense = _nf4_case(m=20, k=k)
    args = launch.nf4_arguments(packed, state)
    dy = torch.randn(20, 24)
    y = launch.nf4_linear_fwd(x, None, *args, plan=plan)
    dx, dbias = launch.nf4_linear_bwd(dy, *args, True, False, plan=plan)
    torch.testing.assert_close(y.double(), x.double() @ dense.t(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dx.double(), dy.double() @ dense, rtol=1e-5, atol=1e-5)
    assert dbias.numel() == 0


def test_few_rows_split_k_and_the_split_sum_is_deterministic(monkeypatch):
    launched = []
    real = launch._sum_splits

    def spy(part, bias, out):
        launched.append(part.shape[0])
        real(part, bias, out)

    monkeypatch.setattr(launch, "_sum_splits", spy)
    x, packed, state, _ = _nf4_case(m=1, k=512)
    first = tk.ops.nf4_linear(x, packed, state)
    assert launched and launched[0] > 1  # one row: K split across programs
    assert torch.equal(first, tk.ops.nf4_linear(x, packed, state))
    launched.clear()
    x, packed, state, _ = _nf4_case(m=200, n=300, k=64)
    tk.ops.nf4_linear(x, packed, state)
    assert launched == []  # many rows, many tiles: one split, no sum kernel


def test_many_rows_dequantize_the_weight_once(monkeypatch):
    """From DEQUANTIZE_FIRST_ROWS rows the weight is dequantized by its own kernel, and the fused ones do not run;
    odd K (NF4 pairs across rows) and INT4 too."""
    launched = []
    real = launch._dequantized

    def spy(*args):
        launched.append(args[-1])
        return real(*args)

    monkeypatch.setattr(launch, "_dequantized", spy)
    m = DEQUANTIZE_FIRST_ROWS
    x, packed, state, dense = _nf4_case(m=m, n=20, k=33)
    torch.testing.assert_close(tk.ops.nf4_linear(x, packed, state).double(), x.double() @ dense.t(), rtol=1e-5,
                               atol=1e-5)  # fmt: skip
    qweight, scales, zeros = tk.ops.int4_quantize(_weight(20, 64), group_size=32)
    x = torch.randn(m, 64)
    expected = x.double() @ tk.ops.int4_dequantize(qweight, scales, zeros, group_size=32, dtype=x.dtype).double().t()
    torch.testing.assert_close(tk.ops.int4_linear(x, qweight, scales, zeros, group_size=32).double(), expected,
                               rtol=1e-5, atol=1e-5)  # fmt: skip
    assert launched == [DequantizeFirst(), DequantizeFirst()]


GEMV_CASES = [  # (plan, rows, K): rows from one to the kernel's most, both NF4 loaders, splits chosen and forced
    (Gemv4Tiles(), 1, 128),
    (Gemv4Tiles(16, 32, splits=3), 3, 100),  # three partial sums; blocks across rows, odd K tail
    (Gemv4Tiles(8, 64, 2, splits=1, nf4_decode="gather"), 16, 128),  # one split: bias and output in the kernel
    (Gemv4Tiles(16, 32, 2, splits=2, products="dot"), 3, 100),  # on the tensor cores: x's rows padded to 16
]


@pytest.mark.parametrize(("plan", "m", "k"), GEMV_CASES, ids=lambda v: str(v) if isinstance(v, int) else None)
def test_the_few_rows_gemv_gives_the_product_and_hands_the_gradient_to_the_dot_tiles(plan, m, k):
    x, packed, state, dense = _nf4_case(m=m, k=k)
    args = launch.nf4_arguments(packed, state)
    bias = torch.randn(24)
    y = launch.nf4_linear_fwd(x, bias, *args, plan=plan)
    torch.testing.assert_close(y.double(), x.double() @ dense.t() + bias.double(), rtol=1e-5, atol=1e-5)
    dy = torch.randn(m, 24)
    dx, _ = launch.nf4_linear_bwd(dy, *args, True, False, plan=plan)  # no GEMV backward: the dot tiles run it
    torch.testing.assert_close(dx.double(), dy.double() @ dense, rtol=1e-5, atol=1e-5)


def test_the_gemv_reads_strided_rows_of_x_for_int4():
    qweight, scales, zeros = tk.ops.int4_quantize(_weight(20, 64), group_size=32)
    x = torch.randn(64, 2).t()  # rows 1 apart, columns 2 apart
    dense = tk.ops.int4_dequantize(qweight, scales, zeros, group_size=32, dtype=x.dtype).double()
    y = launch.int4_linear_fwd(x, None, qweight, scales, zeros, 32, plan=Gemv4Tiles(8, 32, splits=2))
    torch.testing.assert_close(y.double(), x.double() @ dense.t(), rtol=1e-5, atol=1e-5)


WORD_CASES = [  # (plan, rows, K, group): a step inside a group, several groups a step, K past the last step, splits
    (Gemv4Tiles(128, 128, 4), 1, 1024, 128),
    (Gemv4Tiles(16, 64, splits=3), 1, 520, 256),  # 64-column steps within 256-column groups; K not a multiple of 64
    (Gemv4Tiles(8, 256, 2, splits=2), 3, 776, 16),  # sixteen groups a step, three rows of x
    (Gemv4Tiles(32, 32, 1, splits=1), 1, 200, 32),  # one split: bias and output in the kernel
]


@pytest.mark.parametrize(("plan", "m", "k", "group"), WORD_CASES, ids=lambda v: str(v) if isinstance(v, int) else None)
def test_int4_codes_read_as_words_multiply_by_the_exact_weight(monkeypatch, device, plan, m, k, group):
    """INT4's GEMV over int32 words: y = sum_g scale sum_k x (q - zero), the weight exact. fp32 x: within fp32 sums
    of the float64 product; bf16 x: the output's one rounding of it. x's magnitudes span 2^-100 to 2^100 (each
    product exact: x is scaled by 2^-16 at most). Codes that cannot be read as words (rows one byte off 4-byte
    alignment) take the byte GEMV, rounded weights and all, and still give the product."""
    launched = []
    real = launch._int4_forward_by_words
    monkeypatch.setattr(launch, "_int4_forward_by_words", lambda *args: launched.append(args[-2]) or real(*args))
    n = 40
    qweight, scales, zeros = tk.ops.int4_quantize(_weight(n, k, device), group_size=group)
    exact = int4_weight(qweight, scales, zeros, group_size=group).double()
    bias = torch.randn(n, device=device)
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(m, k, device=device) * torch.tensor([2.0**-100, 1.0, 2.0**100], device=device)[
            torch.arange(k, device=device) % 3]  # fmt: skip
        x = x.to(dtype)
        y = launch.int4_linear_fwd(x, bias.to(dtype), qweight, scales, zeros, group, plan=plan).double()
        expected = x.double() @ exact.t() + bias.to(dtype).double()
        magnitude = x.double().abs() @ exact.abs().t() + bias.to(dtype).double().abs()
        bound = 4 * torch.finfo(torch.float32).eps * magnitude + torch.finfo(dtype).eps * expected.abs()
        assert ((y - expected).abs() <= bound).all(), (dtype, ((y - expected).abs() / magnitude).max().item())
    assert launched == [plan, plan]
    # K steps narrower than a word (4 columns), and rows 4-byte aligned but the tensor one byte off: no words, the
    # byte GEMV.
    narrow = dataclasses.replace(plan, block_k=4)
    x = torch.randn(m, k, device=device)
    y = launch.int4_linear_fwd(x, None, qweight, scales, zeros, group, plan=narrow)
    torch.testing.assert_close(y.double(), x.double() @ exact.t(), rtol=1e-5, atol=1e-5)
    store = torch.empty(n * k // 2 + 1, dtype=torch.uint8, device=device)
    shifted = store[1:].view(n, k // 2)
    shifted.copy_(qweight)
    x = torch.randn(m, k, device=device)
    y = launch.int4_linear_fwd(x, None, shifted, scales, zeros, group, plan=plan)
    torch.testing.assert_close(y.double(), x.double() @ exact.t(), rtol=1e-5, atol=1e-5)
    assert launched == [plan, plan]  # neither of the last two took the words


_ONE_ROW = Gemv4Tiles(32, 256, warps=4, stages=1, products="fma")  # the measured choices (plan.GEMV_FALLBACK)
_INT4_ONE_ROW = Gemv4Tiles(128, 128, warps=4, stages=1, products="fma")
_ROWS_ON_TENSOR_CORES = Gemv4Tiles(32, 256, warps=2, products="dot")
_DOT_TILE = Linear4Tiles(16, 64, 128, 4, 3, 1)
PLAN_BY_FORMAT_AND_ROWS = [  # (format, rows, the forward's plan but for NF4's lookup)
    ("int4", 1, _INT4_ONE_ROW),
    ("nf4", 1, _ONE_ROW),
    ("int4", 2, _ROWS_ON_TENSOR_CORES),
    ("int4", 16, _ROWS_ON_TENSOR_CORES),
    ("nf4", 2, _DOT_TILE),
    ("nf4", 8, _DOT_TILE),
    ("nf4", 9, _ROWS_ON_TENSOR_CORES),
    ("nf4", 16, _ROWS_ON_TENSOR_CORES),
    ("int4", DEQUANTIZE_FIRST_ROWS, DequantizeFirst()),
    ("nf4", DEQUANTIZE_FIRST_ROWS, DequantizeFirst()),
]


@pytest.mark.parametrize("arch", ["sm90", "sm80"])
@pytest.mark.parametrize(("fmt", "m", "expected"), PLAN_BY_FORMAT_AND_ROWS, ids=lambda v: str(v)[:12])
def test_each_format_and_row_count_gets_its_measured_plan(arch, fmt, m, expected):
    """One row: the GEMV on the CUDA cores; INT4 from 2 to 16 rows the GEMV on the tensor cores; NF4 the dot tile
    from 2 to 8 rows and the GEMV on the tensor cores from 9 to 16; dequantize first from 17. sm90 decodes NF4 by
    byte permutes (the fused kernels; DequantizeFirst gathers), other architectures by the select
    tree. The input gradient never takes the GEMV."""
    plan = linear4_plan(arch, fmt, m)
    decode = "gather" if isinstance(expected, DequantizeFirst) else "prmt" if arch == "sm90" else "select"
    assert plan == dataclasses.replace(expected, nf4_decode=decode)
    backward = linear4_plan(arch, fmt, m, forward=False)
    assert backward == (plan if m >= DEQUANTIZE_FIRST_ROWS else dataclasses.replace(_DOT_TILE, nf4_decode=decode))


def test_the_launchers_pass_the_weights_format_to_the_plan(monkeypatch):
    """nf4_linear and int4_linear launch the kernel their format's plan names: at 4 rows the GEMV for INT4, the dot
    tile for NF4; at one row the GEMV for both, INT4's reading its codes as words."""
    launched = []
    real, real_words = launch._forward_split_k, launch._int4_forward_by_words

    def spy(kernel, *args, **kwargs):
        launched.append((kernel.__name__, args[-1]))
        real(kernel, *args, **kwargs)

    def spy_words(*args):
        launched.append(("_int4_gemv_words_kernel", args[-2]))
        real_words(*args)

    monkeypatch.setattr(launch, "_forward_split_k", spy)
    monkeypatch.setattr(launch, "_int4_forward_by_words", spy_words)
    qweight, scales, zeros = tk.ops.int4_quantize(_weight(24, 64), group_size=32)
    packed, state = tk.ops.nf4_quantize(_weight(24, 64), blocksize=32)
    for m in (1, 4):
        x = torch.randn(m, 64)
        tk.ops.int4_linear(x, qweight, scales, zeros, group_size=32)
        tk.ops.nf4_linear(x, packed, state)
    assert [(name, type(tiles).__name__, getattr(tiles, "products", None)) for name, tiles in launched] == [
        ("_int4_gemv_words_kernel", "Gemv4Tiles", "fma"),
        ("_linear4_gemv_kernel", "Gemv4Tiles", "fma"),
        ("_linear4_gemv_kernel", "Gemv4Tiles", "dot"),
        ("_linear4_fwd_kernel", "Linear4Tiles", None),
    ]


def test_gemv_plans_are_checked():
    x, packed, state, _ = _nf4_case(m=launch.MAX_GEMV_ROWS + 1, k=64)
    with pytest.raises(ValueError, match="Gemv4Tiles: x may have at most 16 rows, got 17"):
        launch.nf4_linear_fwd(x, None, *launch.nf4_arguments(packed, state), plan=Gemv4Tiles())
    with pytest.raises(ValueError, match="Gemv4Tiles: block_k must be a power of two >= 2, got 96"):
        Gemv4Tiles(block_k=96)
    with pytest.raises(ValueError, match="Gemv4Tiles: block_n must be a power of two >= 16, got 8"):
        Gemv4Tiles(block_n=8, products="dot")
    with pytest.raises(ValueError, match="Gemv4Tiles: products must be one of"):
        Gemv4Tiles(products="wgmma")
    with pytest.raises(ValueError, match=r"linear4_plan: fmt must be one of \('nf4', 'int4'\), got 'int8'"):
        linear4_plan("sm90", "int8", 1)


def test_tiles_below_the_dots_smallest_side_are_refused():
    with pytest.raises(ValueError, match="block_m, block_n and block_k / 2 must be >= 16"):
        Linear4Tiles(16, 64, 16, 4, 3, 1)
    with pytest.raises(ValueError, match=r"DequantizeFirst: nf4_decode must be one of .*, got 'table'"):
        DequantizeFirst(nf4_decode="table")
    with pytest.raises(ValueError, match="DequantizeFirst: block_k must be a power of two >= 2, got 96"):
        DequantizeFirst(block_k=96)
    with pytest.raises(ValueError, match="DequantizeFirst: k_tiles must be an int >= 1, got 0"):
        DequantizeFirst(k_tiles=0)


_ALU = {"mov": lambda a: a, "shr": lambda a, b: a >> b, "and": lambda a, b: a & b, "or": lambda a, b: a | b}


def _run_ptx(asm: str, registers: dict) -> dict:
    """A model of the .b32 PTX instructions the NF4 prmt lookup uses (mov, shr, and, or, and prmt in its default
    mode: byte i of the result is byte c_i of {b, a}, c_i the i-th nibble of c, whose bit 3 would ask for a sign
    fill, refused here): the registers after running it."""
    registers = dict(registers)
    for line in asm.splitlines():
        match = re.fullmatch(r"(mov|shr|and|or|prmt)\.b32 (.+);", line.strip())
        if match is None:
            assert line.strip() in ("{", "}") or line.strip().startswith(".reg"), line
            continue
        target, *sources = (operand.strip() for operand in match.group(2).split(","))
        a = [int(operand, 0) if operand[0].isdigit() else registers[operand] for operand in sources]
        if match.group(1) == "prmt":
            pool, result = a[0] | a[1] << 32, 0
            for i in range(4):
                selector = a[2] >> 4 * i & 15
                assert selector < 8, "the sign-fill mode"
                result |= (pool >> 8 * selector & 0xFF) << 8 * i
        else:
            result = _ALU[match.group(1)](*a)
        registers[target] = result & 0xFFFFFFFF
    return registers


def test_the_prmt_lookup_gives_each_nibble_its_nf4_value():
    """The PTX of the "prmt" NF4 lookup (run on a GPU only), through a model of its instructions: every byte, at every
    position of the 4-byte word, gives the fp32 bits of NF4_CODE of its high nibble ($0-$3) and low nibble ($4-$7)."""
    from tritonkit._core.fourbit import NF4_CODE
    from tritonkit._core.jit.nf4 import _prmt_lookup_asm

    asm = _prmt_lookup_asm()
    bits = [struct.unpack("<I", struct.pack("<f", value))[0] for value in NF4_CODE]
    generator = torch.Generator().manual_seed(0)
    words = [[(4 * w + i * 67) % 256 for i in range(4)] for w in range(64)]  # each byte at each position
    words += torch.randint(0, 256, (64, 4), generator=generator).tolist()
    for word in words:
        out = _run_ptx(asm, {"$8": sum(byte << 8 * i for i, byte in enumerate(word))})
        assert [out[f"${i}"] for i in range(8)] == [bits[b >> 4] for b in word] + [bits[b & 15] for b in word]


def test_choose_splits_fills_the_gpu_within_the_steps():
    assert choose_splits(tiles=224, steps=32, outputs=14336, sm_count=132) == 4  # M = 1, N 14336 in tiles of 64
    assert choose_splits(tiles=1024, steps=64, outputs=1 << 20, sm_count=132) == 1
    assert choose_splits(tiles=1, steps=3, outputs=64, sm_count=132) == 3  # never more splits than steps
    assert choose_splits(tiles=1, steps=100, outputs=64, sm_count=132) == 15  # 16 wanted; 15 splits of 7 steps


@pytest.mark.parametrize("fmt", ["nf4", "int4"])
def test_compiles_fullgraph_with_backward(fmt, device):
    w = _weight(device=device)
    if fmt == "nf4":
        packed, state = tk.ops.nf4_quantize(w, double_quant=True)

        def layer(x, bias):
            return tk.ops.nf4_linear(x, packed, state, bias=bias)
    else:
        qweight, scales, zeros = tk.ops.int4_quantize(w, group_size=32)

        def layer(x, bias):
            return tk.ops.int4_linear(x, qweight, scales, zeros, group_size=32, bias=bias)

    def block(x, bias):
        return (layer(x * 2, bias).float() ** 2).sum()

    inputs = [torch.randn(2, 5, 96, device=device), torch.randn(40, device=device)]
    assert_compiled_matches_eager(block, [t.requires_grad_() for t in inputs], device)


def test_the_weight_gets_no_gradient_and_dx_alone_runs_without_dbias(monkeypatch):
    x, packed, state, dense = _nf4_case(m=6)
    x.requires_grad_()
    y = tk.ops.nf4_linear(x, packed, state)
    (dx,) = torch.autograd.grad(y, x, torch.ones_like(y))  # an upstream gradient of ones
    torch.testing.assert_close(dx.double(), torch.ones(6, 24, dtype=torch.float64) @ dense, rtol=1e-5, atol=1e-5)
    bias = torch.zeros(24, requires_grad=True)
    (dbias,) = torch.autograd.grad(tk.ops.nf4_linear(x.detach(), packed, state, bias=bias).sum(), bias)
    assert torch.equal(dbias, torch.full((24,), 6.0))


@pytest.mark.parametrize("peer", ["cublas", "dequantize_cublas"])
@pytest.mark.parametrize("name", ["nf4_linear", "int4_linear"])
def test_benchmark_peers_compute_the_same_product(peer, name):
    from tritonkit.bench import fourbit_peers

    spec = catalog.get(name)
    case = spec.parse_case({"m": 3, "n": 20, "k": 64, "bias": True})
    inputs = spec.make_inputs(case, torch.device("cpu"), torch.float32, torch.Generator().manual_seed(0))
    ours = spec.fn(*inputs.args, **inputs.kwargs)
    theirs = getattr(fourbit_peers, peer)()(*inputs.args, **inputs.kwargs)
    torch.testing.assert_close(theirs, ours, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- bad input


def _nf4(**changes):
    w = _weight(8, 64)
    packed, state = tk.ops.nf4_quantize(w)
    args = {"x": torch.randn(3, 64), "packed": packed, "state": state, "bias": None, **changes}
    return tk.ops.nf4_linear(args.pop("x"), args.pop("packed"), args.pop("state"), **args)


def _int4(**changes):
    qweight, scales, zeros = tk.ops.int4_quantize(_weight(8, 64), group_size=32)
    args = {"x": torch.randn(3, 64), "qweight": qweight, "scales": scales, "zeros": zeros, "group_size": 32,
            **changes}  # fmt: skip
    return tk.ops.int4_linear(args.pop("x"), args.pop("qweight"), args.pop("scales"), args.pop("zeros"), **args)


@functools.cache
def _made() -> SimpleNamespace:
    """Valid states to break, made on first use: at import a GPU run (no interpreter) cannot quantize CPU tensors."""
    _, nf4 = tk.ops.nf4_quantize(_weight(8, 64))
    _, nested = tk.ops.nf4_quantize(_weight(8, 64), double_quant=True)
    qweight, scales, zeros = tk.ops.int4_quantize(_weight(8, 64), group_size=32)
    return SimpleNamespace(nf4=nf4, nested=nested, qweight=qweight, scales=scales, zeros=zeros)


BAD = [
    (lambda: _nf4(x=torch.randn(3, 63)), ValueError, r"x's last dimension must equal the weight's in_features 64"),
    (lambda: _nf4(packed=_made().qweight), ValueError,
     r"packed must hold NF4's flat codes, \(256,\) or bitsandbytes' \(256, 1\), got shape \(8, 32\); a 2-D"),
    (lambda: _nf4(state=tk.ops.NF4State((2, 4, 64), torch.float32, 64, absmax=_made().nf4.absmax)), ValueError,
     r"state.shape must be a linear layer's weight \(N, K\), got \(2, 4, 64\)"),
    (lambda: _nf4(state=tk.ops.NF4State((8, 64), torch.float32, 64, absmax=_made().nf4.absmax.half())), TypeError,
     r"state.absmax must have dtype in \(float32\), got torch.float16"),
    (lambda: _nf4(state=tk.ops.NF4State((8, 64), torch.float32, 48, absmax=_made().nf4.absmax)), ValueError,
     r"state.blocksize must be one of"),
    (lambda: _nf4(state=tk.ops.NF4State((8, 64), torch.float32, 64, absmax_codes=_made().nested.absmax_codes,
                                        offset=_made().nested.offset)), ValueError,
     r"a double-quantized state needs state.absmax_scales, its second level, got None"),
    (lambda: _nf4(state=tk.ops.NF4State((8, 64), torch.float32, 64)), ValueError,
     "state has neither absmax nor the double-quantized absmax_codes"),
    (lambda: _nf4(state=(_made().scales, _made().zeros)), TypeError, "state must be an NF4State"),
    (lambda: _nf4(state=tk.ops.NF4State((8, 64), torch.float32, 64,
                                        absmax=_made().nf4.absmax.clone().requires_grad_())),
     ValueError, "the 4-bit weight is frozen .* state.absmax requires grad"),
    (lambda: _nf4(bias=torch.randn(8).half()), TypeError, "bias must have x's dtype torch.float32"),
    (lambda: _nf4(bias=torch.randn(9)), ValueError, r"bias must have shape \(8,\)"),
    (lambda: _int4(x=torch.randn(3, 63)), ValueError, "x's last dimension K must be even"),
    (lambda: _int4(group_size=16), ValueError, r"scales must have shape \(8, 4\) \(N, ceil\(K / group_size\)\)"),
    (lambda: _int4(group_size=48), ValueError, "group_size must be a power of two >= 16, got 48"),
    (lambda: _int4(scales=_made().nf4), TypeError, "got an NF4State; NF4 codes go to the NF4 ops"),
    (lambda: _int4(qweight=_made().qweight.reshape(-1)), ValueError, "qweight must have 2 dimensions"),
    (lambda: _int4(zeros=_made().zeros.float()), TypeError, "zeros must have dtype"),
    (lambda: _int4(scales=_made().scales.clone().requires_grad_()), ValueError, "frozen .* scales requires grad"),
    (lambda: _int4(x=torch.ones(3, 64, dtype=torch.int32)), TypeError, "int4_linear: x must have dtype"),
]  # fmt: skip


@pytest.mark.parametrize(("call", "error", "match"), BAD, ids=[m[:40] for _, _, m in BAD])
def test_bad_input_names_the_argument(call, error, match):
    with pytest.raises(error, match=match):
        call()


# ---------------------------------------------------------------- GPU


@pytest.mark.gpu
def test_captures_in_a_cuda_graph():
    packed, state = tk.ops.nf4_quantize(_weight(4096, 4096, "cuda"), double_quant=True)
    qweight, scales, zeros = tk.ops.int4_quantize(_weight(4096, 4096, "cuda"))

    def step(x):
        x.requires_grad_()
        ys = [tk.ops.nf4_linear(x, packed, state), tk.ops.int4_linear(x, qweight, scales, zeros)]
        (dx,) = torch.autograd.grad(sum(y.float().sum() for y in ys), x)
        return [*ys, dx]

    assert_graph_replay_matches_eager(step, [torch.randn(4, 4096, device="cuda", dtype=torch.bfloat16)])


@pytest.mark.gpu
def test_quantizers_capture_in_a_cuda_graph():
    """The weights' quantizers too (NF4 with its double quantization, whose 8-bit code once came from the host on
    every call, and INT4): no host synchronisation, the replay's codes and states those of an eager call."""

    def step(w):
        packed, state = tk.ops.nf4_quantize(w, double_quant=True)
        return [packed, *state.tensors().values(), *tk.ops.int4_quantize(w)]

    assert_graph_replay_matches_eager(step, [_weight(512, 1024, "cuda")])


@pytest.mark.gpu
@pytest.mark.parametrize("k", [100, 4096], ids=["blocks-across-rows", "blocks-within-rows"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_every_nf4_decode_gives_the_same_weight_and_products(k, dtype):
    """The NF4 lookups ("gather", "select", "prmt") in every kernel. Bit for bit: the dequantized weight (elementwise),
    and the kernels whose sums are dots (the dot tiles both ways, the GEMV on the tensor cores): the compiler gives a
    dot one encoding whatever computed its operands, and an MMA, or a dot of scalar FMAs (IEEE fp32) adding each
    output's products in K's order, sums the same values in the same order. The GEMV on the CUDA cores sums with
    tl.sum, whose order follows the layout the compiler gives the products, and that layout follows the decode (for
    sm_90: a gathered code's layout holds 64 consecutive columns a thread, the select tree's spreads them over a
    warp's lanes): its fp32 sums may differ by the roundings of another order, each at most half an ulp of a partial
    sum no larger than sum_k |x w| (on an H200 about a tenth of an ulp of it), so it is held to 2 ulps of that, plus
    one rounding of the output to its dtype."""
    packed, state = tk.ops.nf4_quantize(_weight(300, k, "cuda"), blocksize=64, double_quant=True)
    args = launch.nf4_arguments(packed, state)
    x = torch.randn(16, k, device="cuda", dtype=dtype)
    dy = torch.randn(16, 300, device="cuda", dtype=dtype)
    few_rows = FALLBACK[0][1]
    exact, gemv = {}, {}
    for decode in ("gather", "select", "prmt"):
        tiles = dataclasses.replace(few_rows, nf4_decode=decode)
        on_tensor_cores = Gemv4Tiles(32, 256, 2, products="dot", nf4_decode=decode)
        exact[decode] = (launch.nf4_linear_fwd(x, None, *args, plan=tiles),
                         launch.nf4_linear_fwd(x[:3], None, *args, plan=on_tensor_cores),
                         launch.nf4_linear_bwd(dy, *args, True, False, plan=tiles)[0],
                         launch._dequantized(launch._nf4_weight(*args[:6], k, 64), 300, k, dtype, x.device,
                                             DequantizeFirst(nf4_decode=decode)))  # fmt: skip
        gemv[decode] = launch.nf4_linear_fwd(x[:3], None, *args, plan=Gemv4Tiles(nf4_decode=decode))
    weight = exact["gather"][3].double()
    sum_of_magnitudes = x[:3].double().abs() @ weight.abs().t()
    for decode in ("select", "prmt"):
        for ours, theirs in zip(exact[decode], exact["gather"], strict=True):
            assert torch.equal(ours, theirs), decode
        ours, theirs = gemv[decode].double(), gemv["gather"].double()
        bound = 2 * torch.finfo(torch.float32).eps * sum_of_magnitudes + torch.finfo(dtype).eps * theirs.abs()
        assert ((ours - theirs).abs() <= bound).all(), (decode, (ours - theirs).abs().max().item())


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["nf4_linear", "int4_linear"])
def test_compiled_dequantize_peer_computes_the_same_product(name):
    from tritonkit.bench import fourbit_peers

    spec = catalog.get(name)
    case = spec.parse_case({"m": 16, "n": 256, "k": 512})
    inputs = spec.make_inputs(case, torch.device("cuda"), torch.bfloat16, torch.Generator("cuda").manual_seed(0))
    torch._dynamo.reset()
    theirs = fourbit_peers.compiled_dequantize()(*inputs.args, **inputs.kwargs)
    torch.testing.assert_close(theirs, spec.fn(*inputs.args, **inputs.kwargs), rtol=8e-3, atol=8e-3)
