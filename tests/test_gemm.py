"""scaled_linear beyond the registry sweep: every scale combination through small tiles, the split-K GEMV of
weight-only layers (forced splits, both of its product forms, which calls take it, its split heuristic), exact int8
sums, the path from quantize to scaled_linear, torch.compile, the checker's power to catch a wrong GEMM, bad input; on
a GPU a CUDA-graph capture."""

import dataclasses

import pytest
import torch

import tritonkit as tk
from helpers import RecordingKernel, assert_graph_replay_matches_eager
from tritonkit import catalog, testing
from tritonkit._core import row_sync
from tritonkit.ops.gemm import launch
from tritonkit.ops.gemm import plan as plan_module
from tritonkit.ops.gemm.plan import (
    GEMV_FALLBACK,
    GEMV_MEASURED,
    GEMV_NARROW,
    PARTIAL_K_PER_ROW,
    PERSISTENT_CANDIDATES,
    GemmTiles,
    GemvPlan,
    gemm_tiles,
    gemv_plan,
    splits_to_fill,
)
from tritonkit.ops.gemm.spec import FLOAT8_FAST_SUM_ERROR, FLOAT8_SUM_ERROR
from tritonkit.registry import KernelSpec

SPEC = catalog.get("scaled_linear")
SMALL = GemmTiles(16, 16, 16, 4, 1, 2)  # many tiles and K steps (32 for 8-bit codes), grouped order, a ragged edge


def _inputs(case, device="cpu", dtype=torch.float32):
    parsed = SPEC.parse_case(case)
    return SPEC.make_inputs(parsed, torch.device(device), dtype, torch.Generator(device).manual_seed(0))


def _expected(inputs):
    bias = inputs.kwargs["bias"]
    return SPEC.reference(*(t.double() if t is not None and t.is_floating_point() else t for t in inputs.args),
                          bias=None if bias is None else bias.double())  # fmt: skip


COMBINATIONS = [
    {"x": "int8", "w": "int8", "x_scale": "tensor", "w_scale": "row"},
    {"x": "int8", "w": "int8", "x_scale": "row", "w_scale": "tensor", "bias": True},
    {"x": "int8", "w": "int8", "x_scale": "group", "w_scale": "block", "block": 32},
    {"x": "e4m3", "w": "e4m3", "x_scale": "row", "w_scale": "group", "block": 32},
    {"x": "e4m3", "w": "e5m2", "x_scale": "group", "w_scale": "row", "block": 64},
    {"x": "e5m2", "w": "e5m2", "x_scale": "tensor", "w_scale": "block", "block": 32},
    {"w": "int8", "w_scale": "group", "block": 16},
    {"w": "e4m3", "w_scale": "tensor", "bias": True},
]


@pytest.mark.parametrize("combination", COMBINATIONS, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_every_scale_combination_with_small_tiles(combination):
    inputs = _inputs({"m": 37, "n": 45, "k": 100, **combination})
    x, w, x_scale, w_scale = inputs.args
    bias = inputs.kwargs["bias"]
    out = launch.scaled_linear_fwd(x, w, x_scale, w_scale, bias, torch.float32, False, plan=SMALL)
    torch.testing.assert_close(out.double(), _expected(inputs), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("combination", [COMBINATIONS[0], COMBINATIONS[2], COMBINATIONS[3]],
                         ids=["int8-row", "int8-blocks", "e4m3-groups"])  # fmt: skip
def test_codes_with_k_off_sixteen_reach_the_kernel_padded_with_zeros(combination, monkeypatch, device):
    """K = 100: the codes' rows reach the kernel 112 wide (16-byte rows, no K mask inside a 16-value run), the zeros
    adding nothing to any product or scale group's sum."""
    seen, real = [], launch._tiled
    monkeypatch.setattr(launch, "_tiled", lambda rows, w, *args, **kwargs: seen.append((rows.shape[1], w.shape[1],
                        rows.stride(0), w.stride(0))) or real(rows, w, *args, **kwargs))  # fmt: skip
    inputs = _inputs({"m": 37, "n": 45, "k": 100, **combination}, device)
    x, w, x_scale, w_scale = inputs.args
    out = launch.scaled_linear_fwd(x, w, x_scale, w_scale, inputs.kwargs["bias"], torch.float32, False, plan=SMALL)
    assert seen == [(112, 112, 112, 112)]
    torch.testing.assert_close(out.double(), _expected(inputs), rtol=1e-5, atol=1e-5)


def test_codes_off_16_byte_boundaries_reach_the_kernel_aligned(monkeypatch, device):
    """K 64, but x's rows a column slice of 65-byte rows (each starting off 16 bytes): copied to 64-byte rows; w as
    it is (already aligned)."""
    seen, real = [], launch._tiled
    monkeypatch.setattr(launch, "_tiled", lambda rows, w, *args, **kwargs: seen.append((rows.stride(0),
                        rows.data_ptr() % 16, w.data_ptr())) or real(rows, w, *args, **kwargs))  # fmt: skip
    inputs = _inputs({"m": 37, "n": 45, "k": 64, **COMBINATIONS[0]}, device)
    x, w, x_scale, w_scale = inputs.args
    wide = torch.zeros(37, 65, dtype=x.dtype, device=device)
    wide[:, 1:] = x
    out = launch.scaled_linear_fwd(wide[:, 1:], w, x_scale, w_scale, None, torch.float32, False, plan=SMALL)
    assert seen == [(64, 0, w.data_ptr())]
    torch.testing.assert_close(out.double(), _expected(inputs), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- the persistent TMA kernel

PERSISTENT_SMALL = GemmTiles(16, 16, 32, 4, 1, 2, persistent=True)  # 9 tiles for the interpreter's 4 programs
ROW_SCALED = [
    {"x": "int8", "w": "int8", "x_scale": "tensor", "w_scale": "row", "bias": True},
    {"x": "int8", "w": "int8", "x_scale": "row", "w_scale": "tensor"},
    {"x": "e4m3", "w": "e4m3", "x_scale": "row", "w_scale": "row", "bias": True},
    {"x": "e5m2", "w": "e4m3", "x_scale": "tensor", "w_scale": "tensor"},
]
# Scales that vary along K (groups and blocks of 32 and 64): each K step of 32 scaled as it is added.
STEP_SCALED = [
    {"x": "int8", "w": "int8", "x_scale": "group", "w_scale": "block", "block": 64},  # two K steps a group
    {"x": "e4m3", "w": "e4m3", "x_scale": "group", "w_scale": "block", "block": 32, "bias": True},
    {"x": "int8", "w": "int8", "x_scale": "row", "w_scale": "group", "block": 32},
    {"x": "e4m3", "w": "e5m2", "x_scale": "group", "w_scale": "tensor", "block": 32},
]


def _count_persistent(monkeypatch) -> list:
    calls = []
    original = launch._persistent
    monkeypatch.setattr(launch, "_persistent", lambda *args, **kwargs: calls.append(1) or original(*args, **kwargs))
    return calls


@pytest.mark.parametrize("split_store", [False, True], ids=["whole-store", "split-store"])
@pytest.mark.parametrize("combination", ROW_SCALED + STEP_SCALED,
                         ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))  # fmt: skip
def test_persistent_kernel_walks_every_tile(combination, split_store, monkeypatch):
    """37 x 48 outputs in 16 x 16 tiles: 9 tiles over 4 programs, a ragged tile-row, K = 80 a ragged last step (of a
    ragged last group)."""
    calls = _count_persistent(monkeypatch)
    inputs = _inputs({"m": 37, "n": 48, "k": 80, **combination})
    x, w, x_scale, w_scale = inputs.args
    plan = GemmTiles(16, 32 if split_store else 16, 32, 4, 1, 2, persistent=True, split_store=split_store)
    out = launch.scaled_linear_fwd(x, w, x_scale, w_scale, inputs.kwargs["bias"], torch.float32, False, plan=plan)
    assert calls == [1]
    torch.testing.assert_close(out.double(), _expected(inputs), rtol=1e-5, atol=1e-5)


def test_large_products_of_codes_take_the_persistent_kernel_on_hopper():
    assert gemm_tiles("sm90", 1024, n=1024).persistent
    assert not gemm_tiles("sm90", 1023, n=8192).persistent  # under one wave of 128 x 128 tiles
    assert not gemm_tiles("sm90", 8192, n=1023).persistent
    assert not gemm_tiles("sm90", 8192, n=8192, weight_only=True).persistent
    assert not gemm_tiles("sm90", 8192, n=8192, per_step=True).persistent  # group and block scales: measured tiled
    assert not gemm_tiles("sm80", 8192, n=8192).persistent  # no TMA before Hopper: the fallback's tiled kernel


def test_wide_outputs_of_65_to_128_rows_take_the_wide_tiles():
    assert gemm_tiles("sm90", 128, n=14336) == plan_module.WIDE["sm90"]
    assert gemm_tiles("sm90", 65, n=12288) == plan_module.WIDE["sm90"]
    assert gemm_tiles("sm90", 128, n=7168).block_m == 64  # narrower outputs keep the narrow tiles
    assert gemm_tiles("sm90", 64, n=14336).block_m == 64 and gemm_tiles("sm90", 129, n=14336).block_n == 64
    assert gemm_tiles("sm90", 128, n=14336, weight_only=True) == plan_module.FALLBACK[-1][1]
    assert gemm_tiles("sm80", 128, n=14336) == plan_module.FALLBACK[-1][1]


@pytest.mark.parametrize(
    "case",
    [
        {"m": 37, "n": 44, "k": 64, "x": "e4m3", "w": "e4m3"},  # an output row of 44 x 2 bytes (bf16)
        {"m": 37, "n": 48, "k": 64, "w": "int8"},  # weight-only
    ],
    ids=["unaligned-out", "weight-only"],
)
def test_calls_the_persistent_kernel_cannot_take_run_tiled(case, monkeypatch):
    calls = _count_persistent(monkeypatch)
    inputs = _inputs(case)
    x, w, x_scale, w_scale = inputs.args
    out = launch.scaled_linear_fwd(x, w, x_scale, w_scale, None, torch.bfloat16, False, plan=PERSISTENT_SMALL)
    assert calls == []
    expected = _expected(inputs)
    torch.testing.assert_close(out.double(), expected, rtol=2**-7, atol=2**-7 * expected.abs().max().item())


def test_codes_of_72_bytes_a_row_reach_the_persistent_kernel_padded(monkeypatch):
    """Rows of 72 bytes, which no tensor descriptor can address, are padded to 80 and take the persistent kernel."""
    calls = _count_persistent(monkeypatch)
    inputs = _inputs({"m": 37, "n": 48, "k": 72, "x": "int8", "w": "int8"})
    x, w, x_scale, w_scale = inputs.args
    out = launch.scaled_linear_fwd(x, w, x_scale, w_scale, None, torch.float32, False, plan=PERSISTENT_SMALL)
    assert calls == [1]
    torch.testing.assert_close(out.double(), _expected(inputs), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("persistent", [False, True], ids=["tiled", "persistent"])
def test_group_scales_stored_k_major_reach_the_kernels_row_major(persistent, monkeypatch):
    """x's 1 x 32 group scales stored K-major (each group's column contiguous, DeepGEMM's layout) reach the kernels
    copied to unit stride along K (read in place they were slower), and give what the row-major layout gives: the
    reference's output."""
    inputs = _inputs({"m": 37, "n": 48, "k": 80, "x": "e4m3", "w": "e4m3", "x_scale": "group", "w_scale": "block",
                      "block": 32, "bias": True})  # fmt: skip
    x, w, x_scale, w_scale = inputs.args
    k_major = x_scale.t().contiguous().t()
    assert k_major.stride() == (1, 37) and torch.equal(k_major, x_scale)
    read, calls = [], _count_persistent(monkeypatch)
    as_read = launch._scale_rows

    def spy(scale, granularity):
        rows, stride = as_read(scale, granularity)
        if scale is x_scale or scale is k_major:
            read.append((rows.data_ptr() == scale.data_ptr(), rows.stride()))
        return rows, stride

    monkeypatch.setattr(launch, "_scale_rows", spy)
    plan = GemmTiles(16, 16, 32, 4, 1, 2, persistent=persistent)
    expected = _expected(inputs)
    for scale in (x_scale, k_major):
        out = launch.scaled_linear_fwd(x, w, scale, w_scale, inputs.kwargs["bias"], torch.float32, False, plan=plan)
        torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)
    assert read == [(True, (3, 1)), (False, (3, 1))]  # 3 groups of 32 over K = 80; the K-major form copied
    assert calls == ([1, 1] if persistent else [])


def _candidate_id(plan: GemmTiles) -> str:
    return f"{plan.block_n}-wide-{plan.stages}-stages"


@pytest.mark.gpu
@pytest.mark.parametrize("plan", PERSISTENT_CANDIDATES, ids=_candidate_id)
@pytest.mark.parametrize("codes", ["e4m3", "int8", "e4m3-blocks"])
def test_persistent_candidates_match_the_reference(plan, codes, monkeypatch):
    """Each tile benchmarks/fp8_persistent.py times, compiled, on ragged M, N and K with a bias; row scales, or 1 x 128
    by 128 x 128 scales (a ragged last group)."""
    calls = _count_persistent(monkeypatch)
    kind = codes.removesuffix("-blocks")
    case = {"m": 1100, "n": 1288, "k": 1040, "x": kind, "w": kind, "bias": True}
    if codes.endswith("blocks"):
        case.update(x_scale="group", w_scale="block", block=128)
    inputs = _inputs(case, "cuda", torch.bfloat16)
    x, w, x_scale, w_scale = inputs.args
    out = launch.scaled_linear_fwd(x, w, x_scale, w_scale, inputs.kwargs["bias"], torch.bfloat16, False, plan=plan)
    assert calls == [1]
    report = testing.compare(out, _expected(inputs), SPEC.tolerance_for(case, torch.bfloat16))
    assert report.ok, report


# ---------------------------------------------------------------- the split-K GEMV (weight-only, a few rows)

ONE_ROW = GemvPlan(1, 16, 32, 4, 1, 4, 512, splits=3)  # 3 splits of whole 32-wide steps, the last one short
DOT_ROWS = GemvPlan(16, 16, 32, 4, 2, 4, 512, splits=3)
WEIGHTS = [
    {"w": "int8", "w_scale": "row", "bias": True},
    {"w": "e4m3", "w_scale": "tensor"},
    {"w": "int8", "w_scale": "group", "block": 32},  # K = 100: the last group holds 4 values
    {"w": "e5m2", "w_scale": "block", "block": 16, "bias": True},  # block_k 16: 7 steps, split 3 / 3 / 1
]


@pytest.mark.parametrize(
    ("plan", "m"),
    [(ONE_ROW, 1), (ONE_ROW, 3), (DOT_ROWS, 1), (DOT_ROWS, 3), (DOT_ROWS, 20)],  # 3 rows of one; 20: 2 blocks of 16
    ids=["one-row-1", "one-row-3", "dot-1", "dot-3", "dot-20"],
)
@pytest.mark.parametrize("weights", WEIGHTS, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_gemv_splits_match_the_reference(plan, m, weights):
    inputs = _inputs({"m": m, "n": 37, "k": 100, **weights})
    x, w, x_scale, w_scale = inputs.args
    out = launch.scaled_linear_fwd(x, w, x_scale, w_scale, inputs.kwargs["bias"], torch.float32, False, plan=plan)
    torch.testing.assert_close(out.double(), _expected(inputs), rtol=1e-5, atol=1e-5)


WORDS = dataclasses.replace(ONE_ROW, words=True)


@pytest.mark.parametrize(("plan", "m"), [(ONE_ROW, 3), (DOT_ROWS, 20), (WORDS, 3), (WORDS, 1)],
                         ids=["one-row-3", "dot-20", "words-3", "words-1"])  # fmt: skip
@pytest.mark.parametrize("weights", WEIGHTS[:2] + WEIGHTS[3:], ids=["int8-row", "e4m3-tensor", "e5m2-block"])
def test_last_split_sums_the_partials_as_the_reduction_does(monkeypatch, device, plan, m, weights):
    """GemvPlan.last_split_sums: each tile's last split to finish sums the partials in split order and writes out,
    no second launch; the same bits as the reduction kernel's, and the float64 reference."""
    reductions = []
    monkeypatch.setattr(launch, "_split_k_reduce_kernel", RecordingKernel(launch._split_k_reduce_kernel, reductions))
    inputs = _inputs({"m": m, "n": 37, "k": 100, **weights}, device)
    x, w, x_scale, w_scale = inputs.args
    bias = inputs.kwargs["bias"]
    two_launches = launch.scaled_linear_fwd(x, w, x_scale, w_scale, bias, torch.float32, False, plan=plan)
    assert len(reductions) == 1
    one_launch = launch.scaled_linear_fwd(x, w, x_scale, w_scale, bias, torch.float32, False,
                                          plan=dataclasses.replace(plan, last_split_sums=True))  # fmt: skip
    assert len(reductions) == 1
    assert torch.equal(one_launch, two_launches)
    torch.testing.assert_close(one_launch.double(), _expected(inputs), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("m", [1, 3])
@pytest.mark.parametrize(("k", "splits"), [(100, 3), (100, 1), (4104, 0)], ids=["k100-3", "k100-1", "k4104-plan"])
@pytest.mark.parametrize("weights", [{"w_scale": "row", "bias": True}, {"w_scale": "tensor"}], ids=["row", "tensor"])
def test_gemv_int8_words_match_the_reference(monkeypatch, device, m, k, splits, weights):
    """GemvPlan.words: int8 codes read as int32 words of four and made floats by their bits; every split form (3
    splits of whole 32-wide steps, the last one short; one; the splits the plan picks at K 4104), rows of x in
    their own programs, tensor and row scales, with a bias; against float64."""
    plan = dataclasses.replace(WORDS, splits=splits)
    launched = []
    kernel = launch._gemv_int8_words_kernel
    monkeypatch.setattr(launch, "_gemv_int8_words_kernel", RecordingKernel(kernel, launched))
    case = {"m": m, "n": 37, "k": k, "w": "int8", **weights}
    inputs = _inputs(case, device)
    x, w, x_scale, w_scale = inputs.args
    out = launch.scaled_linear_fwd(x, w, x_scale, w_scale, inputs.kwargs.get("bias"), torch.float32, False, plan=plan)
    assert launched
    report = testing.compare(out, _expected(inputs), SPEC.tolerance_for(case, torch.float32))
    assert report.ok, report


@pytest.mark.parametrize("case", ["k-not-a-multiple-of-4", "group-scales", "float8", "unaligned-rows"])
def test_gemv_int8_words_leave_what_they_cannot_read_to_the_byte_loop(monkeypatch, device, case):
    launched = []
    monkeypatch.setattr(launch, "_gemv_int8_words_kernel", RecordingKernel(launch._gemv_int8_words_kernel, launched))
    weights = {"k-not-a-multiple-of-4": {"k": 101, "w": "int8", "w_scale": "row"},
               "group-scales": {"k": 100, "w": "int8", "w_scale": "group", "block": 32},
               "float8": {"k": 100, "w": "e4m3", "w_scale": "row"},
               "unaligned-rows": {"k": 100, "w": "int8", "w_scale": "row"}}[case]  # fmt: skip
    inputs = _inputs({"m": 1, "n": 37, **weights}, device)
    x, w, x_scale, w_scale = inputs.args
    if case == "unaligned-rows":  # rows 102 bytes apart, 100 of them used: no int32 view
        w = torch.zeros(37, 102, dtype=torch.int8, device=device).copy_(torch.nn.functional.pad(w, (0, 2)))[:, :100]
    out = launch.scaled_linear_fwd(x, w, x_scale, w_scale, None, torch.float32, False, plan=WORDS)
    assert launched == []
    expected = launch.scaled_linear_fwd(x, w.contiguous(), x_scale, w_scale, None, torch.float32, False,
                                        plan=dataclasses.replace(WORDS, words=False))  # fmt: skip
    torch.testing.assert_close(out, expected, rtol=0, atol=0)  # the byte loop itself


@pytest.mark.parametrize("plan", [ONE_ROW, DOT_ROWS], ids=["one-row", "dot"])
def test_gemv_reads_strided_rows_and_a_batch_of_single_tokens(plan):
    """x (3, 1, K) cut from a wider tensor: rows 2K apart, K not contiguous in the source (copied once)."""
    torch.manual_seed(0)
    w, w_scale = tk.ops.quantize(torch.randn(29, 77), torch.int8)
    source = torch.randn(3, 2, 2 * 77)
    for x in (source[:, :1, :77], source[:, :1, ::2]):
        out = launch.scaled_linear_fwd(x, w, None, w_scale, None, torch.float32, False, plan=plan)
        expected = x.double() @ (w.double() * w_scale.double()).T
        torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)


def test_gemv_int8_words_take_bf16_rows(monkeypatch, device):
    """bf16 x (the W8A16 layer's activations) through the words kernel, each row in fp32 lanes; sums in fp32."""
    launched = []
    monkeypatch.setattr(launch, "_gemv_int8_words_kernel", RecordingKernel(launch._gemv_int8_words_kernel, launched))
    case = {"m": 5, "n": 37, "k": 200, "w": "int8", "w_scale": "row", "bias": True}
    inputs = _inputs(case, device, torch.bfloat16)
    x, w, x_scale, w_scale = inputs.args
    out = launch.scaled_linear_fwd(x, w, x_scale, w_scale, inputs.kwargs["bias"], torch.bfloat16, False, plan=WORDS)
    assert launched
    report = testing.compare(out, _expected(inputs), SPEC.tolerance_for(SPEC.parse_case(case), torch.bfloat16))
    assert report.ok, report


def test_words_read_one_row_a_program():
    with pytest.raises(ValueError, match="words reads one row a program"):
        GemvPlan(16, 64, 128, 4, 3, 4, 512, words=True)


def test_weight_only_calls_of_few_rows_take_the_gemv():
    cpu = torch.device("cpu")
    assert isinstance(launch.choose_plan(True, 1, 64, cpu), GemvPlan)
    assert isinstance(launch.choose_plan(True, 16, 64, cpu), GemvPlan)
    assert isinstance(launch.choose_plan(True, 17, 64, cpu), GemmTiles)
    assert isinstance(launch.choose_plan(False, 1, 64, cpu), GemmTiles)  # codes x (W8A8): the tiled kernel


def test_one_row_outputs_that_fill_the_gpu_unsplit_take_the_narrow_plan():
    """gemv_plan: one row whose 16-column tiles give each of 132 multiprocessors one to two programs (N 2112 to
    4224) takes sm90's unsplit narrow plan; fewer or more tiles, more rows and other GPUs do not."""
    narrow, ((_, one_row), (_, few_rows)) = GEMV_NARROW["sm90"], GEMV_MEASURED["sm90"]
    assert narrow.splits == 1
    assert [gemv_plan("sm90", 1, n, 132) for n in (2112, 4096, 4224)] == [narrow] * 3
    assert [gemv_plan("sm90", 1, n, 132) for n in (2096, 4240, 14336)] == [one_row] * 3
    assert gemv_plan("sm90", 2, 4096, 132) == few_rows
    assert gemv_plan("sm80", 1, 4096, 132) == GEMV_FALLBACK[0][1]


def test_a_forced_tiled_plan_gives_the_gemvs_result():
    inputs = _inputs({"m": 1, "n": 50, "k": 1100, "w": "int8", "w_scale": "group", "block": 64, "bias": True})
    x, w, _, w_scale = inputs.args
    bias = inputs.kwargs["bias"]
    gemv = launch.scaled_linear_fwd(x, w, None, w_scale, bias, torch.float32, False)  # 2 splits under the interpreter
    tiled = launch.scaled_linear_fwd(x, w, None, w_scale, bias, torch.float32, False, plan=gemm_tiles("sm90", 1))
    torch.testing.assert_close(gemv, tiled, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gemv.double(), _expected(inputs), rtol=1e-5, atol=1e-5)


H100_SMS = 132


@pytest.mark.parametrize(("m", "plan"), [(1, GEMV_FALLBACK[0][1]), (16, GEMV_FALLBACK[1][1])], ids=["one", "16"])
@pytest.mark.parametrize(("n", "k"), [(4096, 4096), (14336, 4096), (28672, 8192), (1024, 8192), (4096, 700)])
def test_splits_fill_the_multiprocessors_within_their_limits(m, plan, n, k):
    splits = splits_to_fill(n, k, m, H100_SMS, plan)
    programs = -(-n // plan.block_n) * splits
    shortest = max(plan.min_split_k, PARTIAL_K_PER_ROW * m)
    assert splits == 1 or k // splits >= shortest  # no split shorter than the plan allows
    assert programs >= plan.programs_per_sm * H100_SMS or (splits + 1) * shortest > k  # full, or K runs out
    assert splits == 1 or (splits - 1) * -(-n // plan.block_n) < plan.programs_per_sm * H100_SMS  # no more than that


def test_forced_splits_stop_at_one_step_each():
    plan = GemvPlan(1, 32, 64, 4, 1, 4, 512, splits=50)
    assert splits_to_fill(100, 640, 1, H100_SMS, plan) == 10


def test_int8_sums_are_exact(device):
    """Unit scales and integer codes: every output is an integer below 2^24, computed exactly."""
    x = torch.randint(-127, 128, (50, 300), dtype=torch.int8, device=device)
    w = torch.randint(-127, 128, (60, 300), dtype=torch.int8, device=device)
    one = torch.ones((), device=device)
    out = tk.ops.scaled_linear(x, w, one, one, out_dtype=torch.float32)
    assert torch.equal(out, (x.double() @ w.double().T).float())


def test_from_quantize_to_scaled_linear(device):
    """Activations quantized per 1 x 128 group and weights per 128 x 128 block in float8: the product is within the
    quantization's error of the bf16 one."""
    torch.manual_seed(0)
    x, w = torch.randn(64, 512, device=device), torch.randn(96, 512, device=device) / 20
    xq, x_scale = tk.ops.quantize(x, torch.float8_e4m3fn, granularity="group")
    wq, w_scale = tk.ops.quantize(w, torch.float8_e4m3fn, granularity="block")
    out = tk.ops.scaled_linear(xq, wq, x_scale, w_scale, out_dtype=torch.float32)
    exact = x @ w.T
    assert (out - exact).pow(2).mean().sqrt() < 0.05 * exact.pow(2).mean().sqrt()  # e4m3: 2^-4 per operand at worst
    dequantized = (
        tk.ops.dequantize(xq, x_scale, dtype=torch.float32) @ tk.ops.dequantize(wq, w_scale, dtype=torch.float32).T
    )
    # Within the tensor cores' float8 sums (FLOAT8_SUM_ERROR of the rms; under the interpreter fp32's).
    bound = FLOAT8_SUM_ERROR * dequantized.pow(2).mean().sqrt().item()
    torch.testing.assert_close(out, dequantized, rtol=0, atol=bound)


@pytest.mark.parametrize(
    "case",
    [{"m": 20, "n": 30, "k": 64, "x": "e4m3", "w": "e4m3", "x_scale": "group", "w_scale": "block", "block": 32,
      "bias": True},
     {"m": 1, "n": 30, "k": 1100, "w": "int8", "w_scale": "group", "block": 64, "bias": True}],  # GEMV, 2 splits
    ids=["w8a8-blocks", "weight-only-gemv"],
)  # fmt: skip
def test_compiles_fullgraph(device, case):
    inputs = _inputs(case, device)

    def block(x, w, x_scale, w_scale, bias):
        return tk.ops.scaled_linear(x, w, x_scale, w_scale * 2, bias=bias, out_dtype=torch.float32) + 1

    args = (*inputs.args, inputs.kwargs["bias"])
    eager = block(*args)
    torch._dynamo.reset()
    backend = "inductor" if device == "cuda" else "aot_eager"
    torch.testing.assert_close(torch.compile(block, fullgraph=True, backend=backend)(*args), eager, rtol=0, atol=0)


# ---------------------------------------------------------------- the checker catches a wrong GEMM


def _broken(fn) -> KernelSpec:
    return KernelSpec(**{**SPEC.__dict__, "fn": fn, "name": f"broken-{SPEC.name}"})


def _first_group_scale_everywhere(x, w, x_scale, w_scale, **kw):
    return tk.ops.scaled_linear(x, w, x_scale[..., :1].contiguous(), w_scale, **kw)


@pytest.mark.parametrize(
    ("label", "fn", "case"),
    [
        ("bias dropped", lambda *a, bias=None, **kw: tk.ops.scaled_linear(*a, **kw),
         {"m": 9, "n": 20, "k": 64, "x": "int8", "w": "int8", "bias": True}),
        ("x's group scales read as row scales", _first_group_scale_everywhere,
         {"m": 9, "n": 20, "k": 256, "x": "e4m3", "w": "e4m3", "x_scale": "group", "block": 64}),
        ("the last K value dropped", lambda x, w, *a, **kw: tk.ops.scaled_linear(
            torch.cat((x[..., :-1], torch.zeros_like(x[..., -1:])), -1), w, *a, **kw),
         {"m": 9, "n": 20, "k": 64, "x": "int8", "w": "int8"}),
        ("a weight-only row's second K split lost", lambda x, *a, **kw: tk.ops.scaled_linear(
            torch.cat((x[..., :768], torch.zeros_like(x[..., 768:])), -1), *a, **kw),
         {"m": 1, "n": 20, "k": 1100, "w": "int8"}),  # the GEMV splits K at 768 here
    ],
)  # fmt: skip
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_checker_catches_wrong_gemms(label, fn, case, dtype):
    result = testing.run_case(_broken(fn), case, dtype, "cpu")
    assert not result.ok, f"{label} passed the check"


# ---------------------------------------------------------------- bad input


def _good():
    inputs = _inputs({"m": 8, "n": 16, "k": 64, "x": "e4m3", "w": "e4m3", "x_scale": "group", "w_scale": "block",
                      "block": 32})  # fmt: skip
    return dict(zip(("x_q", "w_q", "x_scale", "w_scale"), inputs.args, strict=True))


BAD = [
    ({"w_q": lambda a: a["w_q"].bfloat16()}, TypeError, "w_q must have dtype"),
    ({"x_q": lambda a: a["x_q"].view(torch.int8)}, TypeError, "x_q and w_q must both be int8 or both float8"),
    ({"w_q": lambda a: a["w_q"][:, :32]}, ValueError, r"x_q's last dim and w_q's dim 1 \(K\) must match"),
    ({"x_scale": lambda a: a["x_scale"][:, :1].expand(8, 3).contiguous()}, ValueError,
     r"x_scale of shape \(8, 3\) is no tensor/row/group scale"),
    ({"x_scale": lambda a: torch.ones(1, 2)}, ValueError, "x_scale of shape"),
    ({"w_scale": lambda a: torch.ones(3, 3)}, ValueError, r"w_scale of shape \(3, 3\) is no"),
    ({"w_scale": lambda a: torch.ones(1, 1, dtype=torch.float64)}, TypeError, "w_scale must have dtype"),
    ({"x_scale": lambda a: None}, ValueError, "so x_scale is needed"),
    ({"w_scale": lambda a: torch.ones(1, 4)}, ValueError, r"groups \(32\) and w_scale's \(16\)"),
    ({"x_scale": lambda a: torch.ones(8, 4), "w_scale": lambda a: torch.ones(1, 4)}, ValueError,
     "groups and blocks of 16 K values are too short for 8-bit codes"),
    ({"x_scale": lambda a: a["x_scale"].masked_fill(a["x_scale"] > 0, float("inf"))}, ValueError,
     "x_scale holds a non-finite value"),
]  # fmt: skip


@pytest.mark.parametrize(("changes", "error", "match"), BAD)
def test_bad_input_names_the_argument(changes, error, match):
    arguments = _good()
    arguments.update({key: change(arguments) for key, change in changes.items()})
    with pytest.raises(error, match=match):
        tk.ops.scaled_linear(arguments.pop("x_q"), arguments.pop("w_q"), arguments.pop("x_scale"),
                             arguments.pop("w_scale"), **arguments)  # fmt: skip


def test_bad_options_name_the_argument():
    arguments = _good()
    args = (arguments["x_q"], arguments["w_q"], arguments["x_scale"], arguments["w_scale"])
    with pytest.raises(ValueError, match="bias must have w_q's 16 output features, got 3"):
        tk.ops.scaled_linear(*args, bias=torch.ones(3))
    with pytest.raises(TypeError, match="out_dtype must be one of"):
        tk.ops.scaled_linear(*args, out_dtype=torch.int8)
    with pytest.raises(TypeError, match="use_fast_accum must be a bool, got int"):
        tk.ops.scaled_linear(*args, use_fast_accum=1)
    with pytest.raises(ValueError, match="weight-only"):
        tk.ops.scaled_linear(torch.randn(8, 64), args[1], args[2], args[3])


def test_bad_plans_name_the_argument():
    arguments = _good()
    args = (arguments["x_q"], arguments["w_q"], arguments["x_scale"], arguments["w_scale"], None, torch.float32, False)
    with pytest.raises(TypeError, match="plan must be a GemmTiles or a GemvPlan, got dict"):
        launch.scaled_linear_fwd(*args, plan={"block_m": 16})
    with pytest.raises(ValueError, match="plan: the split-K GEMV takes weight-only calls"):
        launch.scaled_linear_fwd(*args, plan=DOT_ROWS)
    with pytest.raises(ValueError, match="block_m must be 1 or a power of two >= 16"):
        GemvPlan(8, 32, 64, 4, 1, 4, 512)


# ---------------------------------------------------------------- GPU


@pytest.mark.gpu
def test_captures_in_a_cuda_graph():
    inputs = _inputs({"m": 512, "n": 1024, "k": 1024, "x": "e4m3", "w": "e4m3", "x_scale": "group",
                      "w_scale": "block"}, "cuda", torch.bfloat16)  # fmt: skip
    x, w, x_scale, w_scale = inputs.args

    def step(x_scale, activations, token):  # token: one row, the split-K GEMV with its workspace
        return [tk.ops.scaled_linear(x, w, x_scale, w_scale), tk.ops.scaled_linear(activations, w, None, w_scale),
                tk.ops.scaled_linear(token, w, None, w_scale)]  # fmt: skip

    activations = torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16)
    assert_graph_replay_matches_eager(step, [x_scale, activations, activations[:1].clone()])


@pytest.mark.gpu
@pytest.mark.parametrize("plan", [dataclasses.replace(ONE_ROW, words=True), DOT_ROWS], ids=["words", "dot"])
def test_split_gemv_counters_are_kept_per_stream_and_left_at_zero(plan):
    """With last_split_sums each tile's last split sets its arrival counter back to zero: the calls on a stream reuse
    its counters (grown for more tiles), a capture on a stream that has them takes them, one on a stream that has
    too few zeroes its own in the graph; each result is the reference's and every kept counter reads zero after."""
    plan = dataclasses.replace(plan, last_split_sums=True)
    row_sync._KEPT.clear()

    def call(n, seed):
        case = SPEC.parse_case({"m": 3, "n": n, "k": 100, "w": "int8", "w_scale": "row", "bias": True})
        inputs = SPEC.make_inputs(case, torch.device("cuda"), torch.float32, torch.Generator("cuda").manual_seed(seed))
        x, w, x_scale, w_scale = inputs.args
        return inputs, lambda: launch.scaled_linear_fwd(x, w, x_scale, w_scale, inputs.kwargs["bias"], torch.float32,
                                                        False, plan=plan)  # fmt: skip

    def assert_counters_zero():
        torch.cuda.synchronize()
        assert row_sync._KEPT and all(not counters.any() for counters in row_sync._KEPT.values())

    for n, seed in [(37, 1), (37, 2), (200, 3), (37, 4)]:  # 200: more tiles than kept, the counters grow
        inputs, run = call(n, seed)
        torch.testing.assert_close(run().double(), _expected(inputs), rtol=1e-5, atol=1e-5)
        assert_counters_zero()
    for warm in (False, True):  # a capture stream without counters kept, then one with them
        row_sync._KEPT.clear()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        inputs, run = call(200, 5)
        with torch.cuda.stream(stream):
            if warm:
                run()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                out = run()
        assert bool(row_sync._KEPT) == warm  # a capture keeps none of its own
        for _ in range(3):
            out.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            torch.testing.assert_close(out.double(), _expected(inputs), rtol=1e-5, atol=1e-5)
        if warm:
            assert_counters_zero()


@pytest.mark.gpu
def test_weight_only_layer_runs_under_compiled_cuda_graphs():
    """torch.compile's CUDA graphs (mode reduce-overhead) record and replay the split GEMV, whose arrival counters are
    kept per stream: every replay on new tokens gives the eager layer's output."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(4096, 1024, device="cuda", dtype=torch.bfloat16)
    layer = tk.nn.QuantizedLinear.from_linear(linear, torch.int8, activations="weight_only")
    compiled = torch.compile(layer, mode="reduce-overhead", fullgraph=True)
    with torch.no_grad():
        for _ in range(5):
            x = torch.randn(1, 1, 4096, device="cuda", dtype=torch.bfloat16)
            torch.testing.assert_close(compiled(x).clone(), layer(x), rtol=0, atol=0)


# ---------------------------------------------------------------- QuantizedLinear


@pytest.mark.parametrize(
    ("dtype", "granularity", "activations"),
    [(torch.int8, "row", "dynamic"), (torch.float8_e4m3fn, "block", "dynamic"), (torch.float8_e4m3fn, "tensor",
                                                                                 "dynamic"),
     (torch.int8, "row", "weight_only"), (torch.float8_e4m3fn, "block", "weight_only")],
)  # fmt: skip
def test_quantized_linear_follows_its_linear(device, dtype, granularity, activations):
    """The layer's output is the scaled GEMM of its quantized operands exactly, and close to the bf16 layer."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(256, 96, device=device)
    layer = tk.nn.QuantizedLinear.from_linear(linear, dtype, granularity=granularity, activations=activations)
    x = torch.randn(3, 7, 256, device=device)
    with torch.no_grad():
        out, exact = layer(x), linear(x)
    assert out.shape == (3, 7, 96) and out.dtype == x.dtype
    assert (out - exact).pow(2).mean().sqrt() < 0.05 * exact.pow(2).mean().sqrt()
    assert set(layer.state_dict()) == {"weight_codes", "weight_scale", "bias"}


@pytest.mark.parametrize("dtype", [torch.int8, torch.float8_e4m3fn])
def test_weight_only_layer_decodes_through_the_gemv(device, dtype):
    """A decode step's x (batch, 1, K): the layer's output is the tiled kernel's, and close to the float layer."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(1100, 40, device=device)
    layer = tk.nn.QuantizedLinear.from_linear(linear, dtype, activations="weight_only")
    x = torch.randn(4, 1, 1100, device=device)
    with torch.no_grad():
        out, exact = layer(x), linear(x)
    tiles = gemm_tiles("sm90", 4)
    tiled = launch.scaled_linear_fwd(x, layer.weight_codes, None, layer.weight_scale, layer.bias, x.dtype, False,
                                     plan=tiles)  # fmt: skip
    torch.testing.assert_close(out, tiled, rtol=1e-5, atol=1e-5)
    assert (out - exact).pow(2).mean().sqrt() < 0.05 * exact.pow(2).mean().sqrt()


def test_quantized_linear_refuses_training_and_bad_options():
    linear = torch.nn.Linear(64, 32)
    with pytest.raises(ValueError, match="granularity must be one of"):
        tk.nn.QuantizedLinear.from_linear(linear, torch.int8, granularity="group")
    with pytest.raises(ValueError, match="activations must be one of"):
        tk.nn.QuantizedLinear.from_linear(linear, torch.int8, activations="static")
    layer = tk.nn.QuantizedLinear.from_linear(linear, torch.int8)
    with pytest.raises(ValueError, match="QuantizedLinear is for inference"):
        layer(torch.randn(2, 64, requires_grad=True))


def _record_fast_accumulation(monkeypatch) -> list:
    """FP8_FAST_ACC of each launch of the tiled and persistent kernels, in order."""
    flags = []
    for name in ("_scaled_linear_kernel", "_scaled_linear_persistent_kernel"):
        recording = RecordingKernel(getattr(launch, name), flags, lambda grid, kwargs: kwargs["FP8_FAST_ACC"])
        monkeypatch.setattr(launch, name, recording)
    return flags


@pytest.mark.parametrize("persistent", [False, True], ids=["tiled", "persistent"])
def test_float8_fast_accumulation_keeps_the_product(device, persistent, monkeypatch):
    """use_fast_accum (the tensor cores sum across all of K) changes only the sums' rounding, within
    FLOAT8_FAST_SUM_ERROR of the rms, in both kernels; scales that vary along K keep their per-step sums and int8
    its exact ones, so neither asks the kernel for it. The interpreter sums in fp32 either way: on the CPU this
    checks what reaches the kernel."""
    calls, flags = _count_persistent(monkeypatch), _record_fast_accumulation(monkeypatch)
    plan = GemmTiles(64, 64, 32, 4, 3, 8, persistent=persistent)  # five K steps of 32
    for case in ({"x": "e4m3", "x_scale": "row", "w_scale": "tensor", "bias": True},
                 {"x": "e4m3", "x_scale": "group", "w_scale": "block"}, {"x": "int8", "w": "int8"}):  # fmt: skip
        inputs = _inputs({"m": 37, "n": 48, "k": 160, "w": case["x"] if "w" in case else "e5m2", "block": 32, **case},
                         device)  # fmt: skip
        x, w, x_scale, w_scale = inputs.args
        out = launch.scaled_linear_fwd(x, w, x_scale, w_scale, inputs.kwargs["bias"], torch.float32, True, plan=plan)
        expected = _expected(inputs)
        bound = FLOAT8_FAST_SUM_ERROR * expected.pow(2).mean().sqrt().item()
        torch.testing.assert_close(out.double(), expected, rtol=0, atol=bound)
    assert flags == [True, False, False]
    assert calls == ([1, 1, 1] if persistent else [])


def test_use_fast_accum_reaches_the_kernel_eager_compiled_and_from_quantized_linear(device, monkeypatch):
    flags = _record_fast_accumulation(monkeypatch)
    inputs = _inputs({"m": 20, "n": 30, "k": 64, "x": "e4m3", "w": "e4m3", "bias": True}, device)
    expected = _expected(inputs)
    bound = FLOAT8_FAST_SUM_ERROR * expected.pow(2).mean().sqrt().item()

    def block(x, w, x_scale, w_scale, bias):
        return tk.ops.scaled_linear(x, w, x_scale, w_scale, bias=bias, out_dtype=torch.float32, use_fast_accum=True)

    args = (*inputs.args, inputs.kwargs["bias"])
    torch.testing.assert_close(block(*args).double(), expected, rtol=0, atol=bound)
    torch._dynamo.reset()
    backend = "inductor" if device == "cuda" else "aot_eager"
    compiled = torch.compile(block, fullgraph=True, backend=backend)(*args)
    torch.testing.assert_close(compiled.double(), expected, rtol=0, atol=bound)
    assert flags == [True, True]

    linear = torch.nn.Linear(64, 32).to(device)
    fast = tk.nn.QuantizedLinear.from_linear(linear, torch.float8_e4m3fn, use_fast_accum=True)
    precise = tk.nn.QuantizedLinear.from_linear(linear, torch.float8_e4m3fn)
    x = torch.randn(5, 64, device=device)
    with torch.no_grad():
        out, reference = fast(x), precise(x)
    torch.testing.assert_close(out, reference, rtol=0, atol=FLOAT8_FAST_SUM_ERROR * reference.abs().max().item())
    assert flags[2:] == [True, False]
    assert "use_fast_accum=True" in repr(fast)
    with pytest.raises(TypeError, match="use_fast_accum must be a bool, got str"):
        tk.nn.QuantizedLinear.from_linear(linear, torch.float8_e4m3fn, use_fast_accum="yes")


@pytest.mark.parametrize("promote", [0, 32])
def test_float8_promotion_keeps_the_product(device, promote):
    """GemmTiles.fp8_promote (fp32 promotions inside a K step of float8 products) changes only the sums' rounding."""
    inputs = _inputs({"m": 40, "n": 33, "k": 256, "x": "e4m3", "w": "e4m3", "bias": True}, device)
    x, w, x_scale, w_scale = inputs.args
    plan = GemmTiles(64, 64, 128, 4, 3, 8, fp8_promote=promote)
    out = launch.scaled_linear_fwd(x, w, x_scale, w_scale, inputs.kwargs["bias"], torch.float32, False, plan=plan)
    expected = _expected(inputs)
    bound = FLOAT8_SUM_ERROR * expected.pow(2).mean().sqrt().item()
    torch.testing.assert_close(out.double(), expected, rtol=0, atol=bound)


def test_gemv_plans_sweep_runs_every_candidate_dry(tmp_path, capsys):
    """benchmarks/gemv_plans.py's CPU check: every candidate GemvPlan through plan= matches the float64 reference,
    and its summary's shares of the copy bandwidth."""
    from helpers import benchmark_script

    script = benchmark_script("gemv_plans")
    assert script.main(["--dry-run", "--out", str(tmp_path)]) == 0
    assert capsys.readouterr().out.count("max abs error") == len(script.CANDIDATES)
    n, k = script.GEMV_NK[0]
    # The spec's bytes of one row (x, the int8 weight and its row scales, the output), moved in 1 ms a call.
    codes = catalog.get("scaled_linear").bytes_moved(catalog.get("scaled_linear").parse_case(
        {"m": 1, "n": n, "k": k, "w": "int8"}), torch.bfloat16)  # fmt: skip
    rows = [{"case": {"m": 1, "n": n, "k": k}, "provider": p, "ms": 1.0} for p in ("tritonkit", "cublas")]
    summary = script.summary({"results": rows, "copy_gbps": codes / 1e-3 / 1e9})  # the ceiling: our GB/s
    assert "| 1 | tritonkit | 100% | 1 |" in summary
    assert f"| 1 | {n} | {k} | tritonkit | 100% | 1.00x | 1.00x |" in summary


def test_code_tiles_sweep_runs_every_candidate_dry(tmp_path, capsys):
    """benchmarks/code_tiles.py's CPU check: every candidate tile through plan= matches the float64 reference, and
    its summary's ratios to _scaled_mm."""
    from helpers import benchmark_script

    script = benchmark_script("code_tiles")
    assert script.main(["--dry-run", "--out", str(tmp_path)]) == 0
    assert capsys.readouterr().out.count("max abs error") == len(script.PEERS) * len(script.CANDIDATES)
    n, k = script.NK[0]
    times = {"tritonkit": 2.0, "scaled_mm": 1.0, "64x64x128 w4 s4": 0.5}
    rows = [{"case": {"m": 128, "n": n, "k": k}, "provider": p, "ms": ms} for p, ms in times.items()]
    summary = script.summary_of("e4m3")({"results": rows})
    assert "| 128 | tritonkit | 0.50x | 1 |" in summary
    assert f"| 128 | {n} | {k} | 64x64x128 w4 s4 | 2.00x | 0.50x |" in summary


def test_a_nan_code_makes_its_products_nan(device):
    """An e4m3 NaN code (0x7F) in x or w makes the outputs that read it NaN and no other, on a GPU (the tensor cores)
    and under the interpreter alike (its conversion would decode the code as 480: dot_fp32 reads the bits)."""
    generator = torch.Generator(device).manual_seed(0)
    x = torch.randn(20, 96, device=device, generator=generator)
    w = torch.randn(30, 96, device=device, generator=generator)
    x_q, x_scale = tk.ops.quantize(x, torch.float8_e4m3fn)
    w_q, w_scale = tk.ops.quantize(w, torch.float8_e4m3fn)
    nan_code = torch.tensor(0x7F, dtype=torch.uint8, device=device).view(torch.float8_e4m3fn)
    x_q[4, 10], w_q[7, 50] = nan_code, nan_code
    out = tk.ops.scaled_linear(x_q, w_q, x_scale, w_scale, out_dtype=torch.float32)
    expected = torch.zeros(20, 30, dtype=torch.bool, device=device)
    expected[4, :], expected[:, 7] = True, True
    assert torch.equal(out.isnan(), expected)
