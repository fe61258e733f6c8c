"""quantize and dequantize beyond the registry sweep: infinities and NaN, zero regions, the granularity read back
from a scale's shape, strided inputs, torch.compile, the checker's power to catch a wrong quantizer, bad input; on a
GPU a CUDA-graph capture."""

import dataclasses
import math

import pytest
import torch

import tritonkit as tk
from helpers import RecordingKernel, assert_graph_replay_matches_eager
from tritonkit import catalog, testing
from tritonkit._core.scales import granularity_of
from tritonkit.ops.quant import launch as quant_launch
from tritonkit.ops.quant import plan as quant_plan
from tritonkit.ops.quant.launch import quantize_fwd
from tritonkit.ops.quant.plan import FourBitDequantizePlan, QuantPlan
from tritonkit.registry import KernelSpec

REFERENCE = catalog.get("quantize").reference
FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
QMAX = {torch.int8: 127.0, torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}


@pytest.mark.parametrize("dtype", [torch.int8, *FP8])
def test_infinities_saturate_and_nan_is_documented(device, dtype):
    x = torch.tensor([[1.0, -2.0, math.inf, -math.inf, math.nan, 0.5]], device=device)
    xq, scale = tk.ops.quantize(x, dtype)
    assert scale.item() == pytest.approx(2.0 / QMAX[dtype])  # from the finite values only
    codes = xq.float()
    assert codes[0, 2] == QMAX[dtype] and codes[0, 3] == -QMAX[dtype]
    assert codes[0, 4] == 0 if dtype == torch.int8 else torch.isnan(codes[0, 4])
    assert codes[0, 1] == -QMAX[dtype]


@pytest.mark.parametrize("granularity", ["tensor", "row", "group", "block"])
def test_zero_regions_get_scale_one_and_no_nan(device, granularity):
    x = torch.zeros(40, 64, device=device)
    x[20:, 32:] = torch.randn(20, 32, device=device)
    for dtype in (torch.int8, *FP8):
        xq, scale = tk.ops.quantize(x, dtype, granularity=granularity, block_size=16)
        back = tk.ops.dequantize(xq, scale, dtype=torch.float32)
        assert not torch.isnan(back).any() and torch.all(back[:20] == 0)
        if granularity != "tensor":
            assert torch.all(scale.flatten()[0] == 1)


@pytest.mark.parametrize("granularity", ["tensor", "row", "group", "block"])
@pytest.mark.parametrize("shape", [(0, 64), (40, 0), (0, 0)], ids=["no-rows", "no-columns", "none"])
def test_empty_inputs_get_scale_one(device, granularity, shape):
    """Empty regions are regions of zeros: every scale there is 1 (a row of no values too), never left unwritten."""
    xq, scale = tk.ops.quantize(torch.zeros(shape, device=device), torch.float8_e4m3fn, granularity=granularity,
                                block_size=16)  # fmt: skip
    assert xq.shape == shape
    assert torch.equal(scale, torch.ones_like(scale))


def test_the_granularity_is_read_from_the_scale_shape():
    assert granularity_of((7, 300), ()) == ("tensor", 0)
    assert granularity_of((7, 300), (7, 1)) == ("row", 0)
    assert granularity_of((7, 300), (7, 3)) == ("group", 128)  # 300 = 2 x 128 + 44
    assert granularity_of((7, 300), (7, 19)) == ("group", 16)
    assert granularity_of((300, 300), (3, 3)) == ("block", 128)
    assert granularity_of((300, 300), (3, 5)) is None  # no one block size cuts both dims so
    assert granularity_of((2, 7, 300), (2, 7, 3)) == ("group", 128)
    assert granularity_of((7, 300), (7, 7)) is None  # 300 / 7 is no power of two's count


@pytest.mark.parametrize("granularity", ["tensor", "row", "group", "block"])
@pytest.mark.parametrize("dtype", [torch.int8, torch.float8_e4m3fn], ids=["int8", "e4m3"])
@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("stored", [(96, 200), (600, 70)], ids=["wide", "tall"])
def test_strided_input(device, granularity, dtype, x_dtype, stored):
    """A transposed operand (the transpose of a row-major tensor of shape ``stored``) gives the reference's codes and
    scales: row and tensor scales from the stored tensor read along its rows (its column amax over 256 rows a
    program, so the tall one's three programs a column combine; its codes in 64 x 64 tiles transposed in registers,
    partial ones at the edges), groups read where they lie (columns_plan), blocks from a copy."""
    generator = torch.Generator(device).manual_seed(0)
    x = torch.randn(*stored, device=device, generator=generator).to(x_dtype).t()
    x = x * torch.logspace(-3, 3, stored[1], device=device).to(x_dtype)[:, None]  # rows of many sizes
    assert x.stride() == (1, stored[1])
    xq, scale = tk.ops.quantize(x, dtype, granularity=granularity, block_size=32)
    codes, expected = REFERENCE(x.double(), dtype, granularity=granularity, block_size=32)
    assert torch.equal(scale, expected) and torch.equal(xq.float(), codes.float())


LAYOUTS = {  # (stored shape, view of the stored tensor)
    "columns-expanded": ((50, 1), lambda t: t.expand(50, 70)),  # stride (1, 0): read down its columns
    "rows-expanded": ((1, 70), lambda t: t.expand(50, 70)),  # stride (0, 1)
    "one-strided-row": ((70, 1), lambda t: t.t()),
    "one-strided-column": ((1, 50), lambda t: t.t()),
    "sliced": ((80, 200), lambda t: t[::2, ::3]),  # neither stride 1: copied
}


@pytest.mark.parametrize("granularity", ["tensor", "row", "group"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_expanded_and_sliced_inputs(device, layout, granularity):
    stored, view = LAYOUTS[layout]
    x = view(torch.randn(stored, device=device, generator=torch.Generator(device).manual_seed(0)))
    xq, scale = tk.ops.quantize(x, torch.float8_e4m3fn, granularity=granularity, block_size=32)
    codes, expected = REFERENCE(x.double(), torch.float8_e4m3fn, granularity=granularity, block_size=32)
    assert torch.equal(scale, expected) and torch.equal(xq.float(), codes.float())


@pytest.mark.parametrize("granularity", ["tensor", "row", "group"])
@pytest.mark.parametrize("transposed", [False, True], ids=["rows", "transposed"])
def test_inf_to_nan_gives_infinities_the_nan_code(device, granularity, transposed):
    """The launcher's inf_to_nan (float8 training's GEMM operands): +-inf and NaN get the NaN code, every other value
    the public op's code and the scales its scales (from the finite values); int8 (no NaN code) and block scales are
    refused."""
    generator = torch.Generator(device).manual_seed(0)
    x = torch.randn(70, 300, device=device, generator=generator)
    x = x.t().contiguous().t() if transposed else x  # the transposed operand's kernels too
    x[3, 5], x[7, 200], x[11, 13] = math.inf, -math.inf, math.nan
    codes, scale = quant_launch.quantize_fwd(x, torch.float8_e4m3fn, granularity, 128, inf_to_nan=True)
    saturated, expected_scale = tk.ops.quantize(x, torch.float8_e4m3fn, granularity=granularity)
    special = ~torch.isfinite(x)
    assert torch.equal(scale, expected_scale)
    assert torch.isnan(codes.float()).equal(special)
    assert torch.equal(codes.view(torch.uint8)[~special], saturated.view(torch.uint8)[~special])
    with pytest.raises(ValueError, match="inf_to_nan"):
        quant_launch.quantize_fwd(x, torch.int8, granularity, 128, inf_to_nan=True)
    with pytest.raises(ValueError, match="inf_to_nan"):
        quant_launch.quantize_fwd(x, torch.float8_e4m3fn, "block", 128, inf_to_nan=True)


def _grid_values(dtype: torch.dtype) -> torch.Tensor:
    """Values at a scale of 1 that probe the rounding: every int8 tie (k + 1/2) or every float8 value and the
    midpoint of each pair of neighbours (ties, subnormals among them), with the fp32 values one ulp either side of
    each midpoint, both signs, and -0."""
    if dtype == torch.int8:
        points = torch.arange(-127, 127, dtype=torch.float32) + 0.5
    else:
        grid = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dtype).float()
        grid = grid[torch.isfinite(grid) & (grid >= 0)].unique()  # sorted
        points = torch.cat([grid, (grid[1:] + grid[:-1]) / 2])
        points = torch.cat([points, -points])
    above = torch.nextafter(points, torch.full_like(points, math.inf))
    below = torch.nextafter(points, torch.full_like(points, -math.inf))
    values = torch.cat([points, above, below, torch.tensor([-0.0, 0.0, -1e-30, 1e-30])])
    return values[values.abs() <= QMAX[dtype]]  # none above qmax: the scale stays 1


BLOCK = 32  # groups and blocks of the bit-for-bit tests
TWO_PASS = QuantPlan(8, 16, 4, hardware_rounding=True)  # chunks of 8 rows x 16 columns: every region read twice


def _assert_codes_at_ties(device, dtype, granularity, plan):
    """Every region's amax is qmax (a column of them every 16), so its scale is 1 and x / scale is x: the codes of
    ties, their neighbours, subnormals, +-0, +-inf and NaN are compared by their bits with torch's conversion."""
    torch.manual_seed(0)
    values = _grid_values(dtype)
    x = values[torch.randint(0, values.numel(), (2 * BLOCK, 128))]
    x[:, ::16] = QMAX[dtype]
    x[3, 5], x[7, 9], x[11, 13] = math.inf, -math.inf, math.nan
    x = x.to(device)
    xq, scale = quantize_fwd(x, dtype, granularity, BLOCK, plan=plan)
    codes, expected_scale = REFERENCE(x, dtype, granularity=granularity, block_size=BLOCK)
    assert torch.equal(scale, expected_scale) and torch.all(scale == 1)
    nan = torch.isnan(codes.float())
    assert torch.equal(torch.isnan(xq.float()), nan)
    bits, expected_bits = xq.view(torch.uint8), codes.view(torch.uint8)
    assert torch.equal(bits[~nan], expected_bits[~nan])


@pytest.mark.parametrize("two_pass", [False, True], ids=["one-pass", "two-pass"])
@pytest.mark.parametrize("granularity", ["row", "group", "block"])
@pytest.mark.parametrize("dtype", [torch.int8, *FP8], ids=["int8", "e4m3", "e5m2"])
def test_codes_equal_the_definition_bit_for_bit_at_every_tie(device, dtype, granularity, two_pass):
    """The plan's kernels (regions read once; float8 rounded by the conversion on a GPU, in fp32 arithmetic under
    the interpreter) and regions read twice."""
    _assert_codes_at_ties(device, dtype, granularity, TWO_PASS if two_pass else None)


@pytest.mark.parametrize("dtype", [torch.int8, *FP8], ids=["int8", "e4m3", "e5m2"])
@pytest.mark.parametrize("exponents", [(-12, 25), (-37, -22), (32, 37)], ids=["reciprocal", "small", "large"])
def test_quotients_near_ties_at_many_scales_are_the_definitions(device, dtype, exponents):
    """Each row's scale is its own (amax from 10^lo to 10^hi: inside the range where the quotient comes from the
    scale's reciprocal, and past either end of it, where it divides), and its values are _grid_values' times it:
    x / scale is then within an ulp of a tie of the format or of its neighbours, where a quotient from the reciprocal
    without its correction would round the other way (checked here). Codes by their bits against the definition's
    (torch's divisions)."""
    torch.manual_seed(0)
    rows, cols, top = 64, 96, QMAX[dtype]
    amax = ((torch.rand(rows, dtype=torch.float64) + 1) * 10.0 ** torch.linspace(*exponents, rows)).float()
    scale = amax / torch.full_like(amax, top)  # the kernel's: fp32 amax, one IEEE division
    values = _grid_values(dtype)
    values = values[values.abs() < top]  # below qmax: the row's amax stays its own
    x = (values[torch.randint(0, values.numel(), (rows, cols))].double() * scale.double()[:, None]).float()
    x[:, 0] = amax  # the row's amax sets its scale
    codes, expected_scale = REFERENCE(x, dtype, granularity="row")
    assert torch.equal(expected_scale[:, 0], scale)
    naive = (x * (1 / scale)[:, None]).clamp(-top, top)
    naive = torch.round(naive).to(torch.int8) if dtype == torch.int8 else naive.to(dtype)
    assert not torch.equal(naive.view(torch.uint8), codes.view(torch.uint8))  # the construction has teeth
    xq, got_scale = tk.ops.quantize(x.to(device), dtype, granularity="row")
    assert torch.equal(got_scale.cpu(), expected_scale)
    assert torch.equal(xq.cpu().view(torch.uint8), codes.view(torch.uint8))


@pytest.mark.gpu
@pytest.mark.parametrize("granularity", ["row", "group", "block"])
@pytest.mark.parametrize("dtype", FP8, ids=["e4m3", "e5m2"])
def test_float8_rounded_in_fp32_arithmetic_gives_the_same_codes(dtype, granularity):
    """The plans' other float8 rounding (fp32 arithmetic, then an exact conversion), compiled."""
    default = (quant_plan.blocks_plan("sm90", BLOCK) if granularity == "block" else
               quant_plan.groups_plan("sm90", BLOCK if granularity == "group" else 128))  # fmt: skip
    assert default.hardware_rounding
    _assert_codes_at_ties("cuda", dtype, granularity, dataclasses.replace(default, hardware_rounding=False))


def test_quantize_and_dequantize_compile_fullgraph(device):
    x = torch.randn(33, 260, device=device)

    def round_trip(x):
        xq, scale = tk.ops.quantize(x * 2, torch.float8_e4m3fn, granularity="group")
        return tk.ops.dequantize(xq, scale, dtype=torch.float32) + 1

    eager = round_trip(x)
    torch._dynamo.reset()
    backend = "inductor" if device == "cuda" else "aot_eager"
    torch.testing.assert_close(torch.compile(round_trip, fullgraph=True, backend=backend)(x), eager, rtol=0, atol=0)


# ---------------------------------------------------------------- the checker catches a wrong quantizer


def _broken(fn) -> KernelSpec:
    spec = catalog.get("quantize")
    return KernelSpec(**{**spec.__dict__, "fn": fn, "name": f"broken-{spec.name}"})


def _truncating(x, dtype, **kw):
    """int8 codes rounded toward zero instead of to nearest (row scales, (M, 1))."""
    _, scale = tk.ops.quantize(x, dtype, **kw)
    return (x.float() / scale).trunc().clamp(-127, 127).to(torch.int8), scale


@pytest.mark.parametrize(
    ("label", "fn", "case"),
    [
        ("scale from amax / 126", lambda x, dtype, **kw: (lambda q, s: (q, s * 127 / 126))(*tk.ops.quantize(x, dtype,
                                                                                                           **kw)),
         {"shape": (9, 64), "fmt": "int8"}),
        ("codes truncated", _truncating, {"shape": (9, 64), "fmt": "int8"}),
        ("e5m2 for e4m3", lambda x, dtype, **kw: (lambda q, s: (q.float().to(dtype), s))(*tk.ops.quantize(
            x, torch.float8_e5m2, **kw)), {"shape": (9, 64), "fmt": "e4m3"}),
        ("one scale for the row's four groups", lambda x, dtype, granularity, **kw: (lambda q, s: (
            q, s.expand(-1, 4).contiguous()))(*tk.ops.quantize(x, dtype, granularity="row", **kw)),
         {"shape": (9, 512), "fmt": "int8", "granularity": "group"}),
    ],
)  # fmt: skip
def test_checker_catches_wrong_quantization(label, fn, case):
    result = testing.run_case(_broken(fn), case, torch.float32, "cpu")
    assert not result.ok, f"{label} passed the check"


# ---------------------------------------------------------------- bad input

BAD = [
    (lambda x: tk.ops.quantize(x, torch.int16), TypeError, r"dtype must be one of int8, float8_e4m3fn, float8_e5m2"),
    (lambda x: tk.ops.quantize(x.int(), torch.int8), TypeError, "quantize: x must have dtype"),
    (lambda x: tk.ops.quantize(x, torch.int8, granularity="col"), ValueError, "granularity must be one of"),
    (lambda x: tk.ops.quantize(x, torch.int8, block_size=24), ValueError, "block_size must be a power of two >= 16"),
    (lambda x: tk.ops.quantize(x, torch.int8, block_size=8), ValueError, "block_size must be a power of two >= 16"),
    (lambda x: tk.ops.quantize(x[None], torch.int8, granularity="block"), ValueError, "'block' takes a 2-D x"),
    (lambda x: tk.ops.dequantize(x.bfloat16(), torch.ones(())), TypeError, "dequantize: xq must have dtype"),
    (lambda x: tk.ops.dequantize(x.to(torch.int8), torch.ones(4, 3)), ValueError,
     r"scale of shape \(4, 3\) matches no granularity"),
    (lambda x: tk.ops.dequantize(x.to(torch.int8), torch.ones(()).double()), TypeError, "scale must have dtype"),
    (lambda x: tk.ops.dequantize(x.to(torch.int8), torch.ones(()), dtype=torch.int8), TypeError,
     "dtype must be one of float32"),
    (lambda x: tk.ops.quantize(x.requires_grad_(), torch.int8), ValueError, "quantize has no gradient"),
]  # fmt: skip


@pytest.mark.parametrize(("call", "error", "match"), BAD)
def test_bad_input_names_the_argument(call, error, match):
    with pytest.raises(error, match=match):
        call(torch.randn(4, 64))


# ---------------------------------------------------------------- GPU


@pytest.mark.gpu
def test_captures_in_a_cuda_graph():
    def step(x):
        outs = []
        for granularity in ("tensor", "row", "group"):
            xq, scale = tk.ops.quantize(x, torch.float8_e4m3fn, granularity=granularity)
            outs += [xq.float(), scale, tk.ops.dequantize(xq, scale)]
        return outs

    assert_graph_replay_matches_eager(step, [torch.randn(512, 7168, device="cuda", dtype=torch.bfloat16)])


@pytest.mark.parametrize(("granularity", "block_size"), [("tensor", 128), ("row", 128), ("group", 32), ("group", 128),
                                                     ("block", 32), ("block", 64)])  # fmt: skip
@pytest.mark.parametrize("block_c", [16, 64, 256], ids=["tile-inside-a-group", "groups-of-a-tile", "wide-tile"])
@pytest.mark.parametrize("stored", ["rows", "columns"])
def test_dequantize_every_granularity_at_every_tile_width(monkeypatch, device, granularity, block_size, block_c,
                                                          stored):  # fmt: skip
    """Each granularity's scale reaches every value, whether a tile lies inside one group (its scale one load a
    row), holds whole groups (one load a group, spread in registers) or runs past the last, ragged group: the
    scales expanded to the codes' shape, times the codes, exactly; codes stored down their columns (a transposed
    view) are read where they lie, not copied."""
    from tritonkit._core.scales import expand_scale

    x = torch.randn(37, 200, device=device)
    xq, scale = tk.ops.quantize(x, torch.int8, granularity=granularity, block_size=block_size)
    if stored == "columns":
        xq = xq.t().contiguous().t()
    found = granularity_of(tuple(xq.shape), tuple(scale.shape))
    expected = xq.float() * expand_scale(scale, tuple(xq.shape), *found)
    launched = []
    monkeypatch.setattr(quant_launch, "_dequantize_kernel", RecordingKernel(
        quant_launch._dequantize_kernel, launched, lambda grid, kwargs: kwargs["COLUMN_STRIDED"]))  # fmt: skip
    out = quant_launch.dequantize_fwd(xq, scale, torch.float32, plan=QuantPlan(4, block_c, 4))
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    assert launched == [stored == "columns"]


# ---------------------------------------------------------------- NF4

NF4_REFERENCE = catalog.get("nf4_quantize").reference


def test_the_dynamic_code_is_bitsandbytes_table():
    from tritonkit._core.fourbit import dynamic_code

    code = dynamic_code()
    assert code.shape == (256,) and torch.all(code[1:] >= code[:-1])
    assert code[0] == -code[-2] and code[-1] == 1.0 and (code == 0).sum() == 1
    assert torch.equal(code[code > 0][:-1], -code[code < 0].flip(0))  # the two signs, then 1
    assert code[code > 0].min().item() == pytest.approx(0.55e-6, rel=1e-6)  # the midpoint of 0.1 and 1, times 1e-6


@pytest.mark.parametrize("fmt", ["nf4", "nf4-double", "int4"])
def test_fourbit_dequantize_tiles_are_a_plan(device, fmt):
    """Other tiles (two NF4 blocks or 64 int4 columns a program, one warp), given as plan=, give the default tiles'
    values bit for bit, at sizes that end mid-tile."""
    small = FourBitDequantizePlan(values=128, columns=64, warps=1)
    w = torch.randn(37, 320, device=device) * 0.02
    if fmt == "int4":
        qweight, scales, zeros = tk.ops.int4_quantize(w, group_size=32)
        default = tk.ops.int4_dequantize(qweight, scales, zeros, group_size=32, dtype=torch.float32)
        tiled = quant_launch.int4_dequantize_fwd(qweight, scales, zeros, 32, torch.float32, plan=small)
    else:
        packed, state = tk.ops.nf4_quantize(w, blocksize=64, double_quant=fmt == "nf4-double")
        default = tk.ops.nf4_dequantize(packed, state, dtype=torch.float32)
        offset = None if state.offset is None else state.offset.reshape(1)
        tiled = quant_launch.nf4_dequantize_fwd(packed.reshape(-1), state.absmax, state.absmax_codes,
                                                state.absmax_scales, offset, state.nested_code, w.numel(), 64,
                                                torch.float32, plan=small).view(w.shape)  # fmt: skip
    assert torch.equal(tiled, default)


@pytest.mark.parametrize("double_quant", [False, True])
def test_nf4_state_from_a_bitsandbytes_quant_state(device, double_quant):
    """bitsandbytes' QuantState carries the same tensors under its own names; its packed data is (n / 2, 1)."""
    from types import SimpleNamespace

    w = torch.randn(300, 64, device=device) * 0.02
    tensors = NF4_REFERENCE(w, blocksize=64, double_quant=double_quant)
    packed = tensors[0].reshape(-1, 1)
    common = {"quant_type": "nf4", "shape": torch.Size(w.shape), "dtype": torch.bfloat16, "blocksize": 64}
    if double_quant:
        from tritonkit._core.fourbit import dynamic_code

        inner = SimpleNamespace(absmax=tensors[2], code=dynamic_code().to(device), blocksize=256)
        state = SimpleNamespace(**common, nested=True, absmax=tensors[1], offset=tensors[3].item(), state2=inner)
    else:
        state = SimpleNamespace(**common, nested=False, absmax=tensors[1])
    converted = tk.ops.NF4State.from_bitsandbytes(state)
    ours = tk.ops.nf4_dequantize(packed, converted, dtype=torch.float32)
    expected = catalog.get("nf4_dequantize").reference(tensors[0], *tensors[1:], shape=w.shape, blocksize=64,
                                                       dtype=torch.float32)  # fmt: skip
    assert torch.equal(ours.double(), expected)
    assert (ours - w).abs().max() <= 0.2 * w.abs().max()  # NF4: 16 values per block


def test_nf4_bad_input_names_the_argument():
    w = torch.randn(8, 64)
    with pytest.raises(ValueError, match=r"blocksize must be one of \(32, 64"):
        tk.ops.nf4_quantize(w, blocksize=48)
    with pytest.raises(TypeError, match="double_quant must be a bool"):
        tk.ops.nf4_quantize(w, double_quant=1)
    with pytest.raises(TypeError, match="nf4_quantize: w must have dtype"):
        tk.ops.nf4_quantize(w.int())
    packed, state = tk.ops.nf4_quantize(w)
    with pytest.raises(ValueError, match=r"packed holds 255 bytes, but state.shape \(8, 64\) needs 256"):
        tk.ops.nf4_dequantize(packed[:-1], state)
    with pytest.raises(TypeError, match="state must be an NF4State"):
        tk.ops.nf4_dequantize(packed, {"absmax": state.absmax})
    with pytest.raises(TypeError, match="dtype must be one of"):
        tk.ops.nf4_dequantize(packed, state, dtype=torch.int8)
    with pytest.raises(ValueError, match=r"state\.absmax must hold one value per block of 64"):
        tk.ops.nf4_dequantize(packed, tk.ops.NF4State((8, 64), torch.float32, 64, absmax=state.absmax[:-1]))
    _, nested = tk.ops.nf4_quantize(w, double_quant=True)
    with pytest.raises(ValueError, match="needs its offset"):
        tk.ops.nf4_dequantize(packed, tk.ops.NF4State((8, 64), torch.float32, 64, absmax_codes=nested.absmax_codes,
                                                      absmax_scales=nested.absmax_scales))  # fmt: skip
    from types import SimpleNamespace

    with pytest.raises(ValueError, match="must be an nf4 QuantState, got quant_type 'fp4'"):
        tk.ops.NF4State.from_bitsandbytes(SimpleNamespace(quant_type="fp4"))


# ---------------------------------------------------------------- INT4 weights


@pytest.mark.parametrize("symmetric", [False, True])
def test_int4_round_trip_is_within_half_a_step(device, symmetric):
    """Half a step, and one at the top code when both the zero point and the largest value round up. Groups of one
    sign included: the short last group (8 values) of 64 rows is all positive in some of them."""
    torch.manual_seed(0)
    w = torch.randn(64, 200, device=device) * 0.02
    w[:4, 192:] = w[:4, 192:].abs()  # groups of one sign, whatever the seed
    qweight, scales, zeros = tk.ops.int4_quantize(w, group_size=64, symmetric=symmetric)
    back = tk.ops.int4_dequantize(qweight, scales, zeros, group_size=64, dtype=torch.float32)
    step = scales.repeat_interleave(64, dim=1)[:, :200]
    assert torch.all((back - w).abs() <= (0.5 if symmetric else 1.0) * step * (1 + 1e-5))
    if symmetric:
        assert torch.all(zeros == 8)


def test_int4_bad_input_names_the_argument():
    w = torch.randn(8, 64)
    with pytest.raises(ValueError, match=r"w's K \(dim 1\) must be even"):
        tk.ops.int4_quantize(w[:, :63])
    with pytest.raises(ValueError, match="group_size must be a power of two >= 16, got 48"):
        tk.ops.int4_quantize(w, group_size=48)
    with pytest.raises(ValueError, match="w must have 2 dimensions"):
        tk.ops.int4_quantize(w[None])
    with pytest.raises(TypeError, match="symmetric must be a bool"):
        tk.ops.int4_quantize(w, symmetric="yes")
    qweight, scales, zeros = tk.ops.int4_quantize(w, group_size=32)
    with pytest.raises(ValueError, match=r"scales must have shape \(8, 4\)"):
        tk.ops.int4_dequantize(qweight, scales, zeros, group_size=16)
    with pytest.raises(TypeError, match="zeros must have dtype"):
        tk.ops.int4_dequantize(qweight, scales, zeros.float(), group_size=32)
    with pytest.raises(TypeError, match="qweight must have dtype"):
        tk.ops.int4_dequantize(qweight.to(torch.int32), scales, zeros, group_size=32)
