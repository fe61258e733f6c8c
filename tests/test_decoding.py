"""Flash decoding beyond the registry sweep: the KV formats against torch written from their definition, the
append bit-exact with quantize_kv, every split count, empty sequences and splits, strided inputs, a decode step
compiled with torch.compile, the checker's power to catch wrong decoding, bad input; on a GPU determinism, unchecked
out-of-range pages, and a decode step captured in a CUDA graph."""

import dataclasses
import math

import pytest
import torch

import tritonkit as tk
from helpers import assert_graph_replay_matches_eager
from tritonkit import catalog, testing
from tritonkit.ops.decoding import launch
from tritonkit.ops.decoding.plan import DecodePlan, choose_splits
from tritonkit.registry import TOLERANCES, KernelSpec

REFERENCE = catalog.get("decode_attention").reference
SMALL = DecodePlan(block_n=16, warps=4, stages=1, max_rows=16)  # many key blocks and row blocks at small sizes


# ---------------------------------------------------------------- the formats


def _inverse(amax, top):
    """top / amax where amax > 0, else 0. Every division here is tensor by tensor, which torch computes as IEEE
    division, as the kernels do; torch divides by a number (or a number by a tensor) through a reciprocal, an ulp
    away at times."""
    return torch.where(amax > 0, torch.full_like(amax, top) / torch.where(amax > 0, amax, 1), 0)


def _int8_from_definition(x):
    amax = x.float().abs().amax(-1)
    inverse = _inverse(amax, 127.0)
    codes = torch.round(x.float() * inverse[..., None]).clamp(-127, 127).to(torch.int8)
    return codes, amax / torch.full_like(amax, 127)


def _fp8_from_definition(x):
    amax = x.float().abs().amax(-1)
    inverse = _inverse(amax, 448.0)
    codes = (x.float() * inverse[..., None]).clamp(-448, 448).to(torch.float8_e4m3fn)
    return codes, amax / torch.full_like(amax, 448)


def _int4_from_definition(x, group):
    groups = x.float().unflatten(-1, (-1, group))
    low, high = groups.amin(-1), groups.amax(-1)
    scale16, zero16 = ((high - low) / torch.full_like(low, 15)).half(), low.half()
    scale, zero = scale16.float()[..., None], zero16.float()[..., None]
    inverse = _inverse(scale, 1.0)
    codes = torch.round((groups - zero) * inverse).clamp(0, 15).to(torch.uint8).flatten(-2)
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return packed, torch.stack((scale16, zero16), dim=-1)


def _values(x, scale=1.0, zeros_row=True):
    torch.manual_seed(x)
    values = torch.randn(3, 5, 64) * scale * torch.logspace(-4, 1, 64)  # every magnitude, e4m3's subnormals too
    if zeros_row:
        values[1, 2] = 0  # a row of zeros: scale 0, codes 0, no NaN
    return values


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_and_fp8_match_their_definition_bit_for_bit(device, dtype):
    x = _values(0).to(device=device, dtype=dtype)
    for fmt, definition in (("int8", _int8_from_definition), ("fp8", _fp8_from_definition)):
        data, scales = tk.ops.quantize_kv(x, fmt)
        codes, expected_scales = definition(x)
        # As values: the interpreter's conversion to fp8 drops the sign of -0, the GPU's keeps it.
        assert data.dtype == codes.dtype and torch.equal(data.float(), codes.float()), fmt
        assert torch.equal(scales, expected_scales), fmt


@pytest.mark.parametrize("group", [2, 8, 32, 64])
def test_int4_matches_its_definition(device, group):
    """Bit for bit but where the GPU's and torch's fp32 divisions may part by an ulp at a rounding tie (one code)."""
    x = _values(1).to(device)
    data, scales = tk.ops.quantize_kv(x, "int4", group_size=group)
    packed, expected_scales = _int4_from_definition(x, group)
    assert torch.equal(scales, expected_scales)
    codes = torch.stack((data & 15, data >> 4), -1).int()
    expected = torch.stack((packed & 15, packed >> 4), -1).int()
    assert (codes - expected).abs().max() <= 1 and (codes != expected).float().mean() < 1e-3


@pytest.mark.parametrize(("fmt", "bound"), [("int8", 0.5 / 127), ("fp8", 2.0**-4), ("int4", 0.5 / 15)])
def test_round_trip_error_is_the_formats_rounding(device, fmt, bound):
    """int8: half a step of max|x| / 127; fp8: 2^-4 of the value (half of e4m3's 3-bit fraction) or half the step of
    the subnormals; int4: half a step of (max - min) / 15, plus the fp16 rounding of the zero."""
    x = _values(2).to(device)
    data, scales = tk.ops.quantize_kv(x, fmt)
    back = tk.ops.dequantize_kv(data, scales, torch.float32)
    assert not back.isnan().any() and torch.all(back[1, 2] == 0)
    error = (back - x).abs()
    if fmt == "int8":
        assert torch.all(error <= bound * x.abs().amax(-1, keepdim=True) * (1 + 1e-6))
    elif fmt == "fp8":
        subnormal_step = 2.0**-9 * x.abs().amax(-1, keepdim=True) / 448
        assert torch.all(error <= torch.maximum(bound * x.abs(), subnormal_step / 2) * (1 + 1e-6))
    else:
        groups = x.unflatten(-1, (-1, 32))
        span = (groups.amax(-1) - groups.amin(-1)).repeat_interleave(32, -1)
        zero_rounding = 2.0**-11 * groups.amin(-1).abs().repeat_interleave(32, -1)
        assert torch.all(error <= bound * span * (1 + 1e-3) + 2 * zero_rounding + 1e-7)


def test_dequantize_kv_keeps_the_leading_dims_and_dtype(device):
    x = torch.randn(2, 3, 4, 16, device=device)
    for fmt in ("int8", "fp8", "int4"):
        data, scales = tk.ops.quantize_kv(x, fmt)
        assert tk.ops.dequantize_kv(data, scales).shape == x.shape
        assert tk.ops.dequantize_kv(data, scales).dtype == torch.bfloat16
        assert tk.ops.dequantize_kv(data, scales, torch.float16).dtype == torch.float16


@pytest.mark.parametrize("fmt", ["plain", "int8", "fp8", "int4"])
@pytest.mark.parametrize("page_size", [0, 1, 16])
def test_append_writes_what_quantize_kv_makes(device, fmt, page_size):
    """kv_cache_append's codes and scales equal quantize_kv's of the same values, bit for bit; the other slots are
    untouched; with pages, the tokens land on the table's pages."""
    torch.manual_seed(page_size)
    batch, heads, dim, new, capacity = 3, 2, 32, 4, 48
    dtype = torch.bfloat16
    if page_size:
        n_pages = batch * (capacity // page_size) + 1
        shape = (n_pages, page_size, heads, dim)
        table = torch.randperm(n_pages)[: batch * (capacity // page_size)].view(batch, -1).int().to(device)
    else:
        shape, table = (batch, capacity, heads, dim), None
    values = torch.randn(shape, device=device).to(dtype)
    if fmt == "plain":
        k_cache, v_cache, k_scales, v_scales = values.clone(), values.clone(), None, None
    else:
        k_cache, k_scales = tk.ops.quantize_kv(values, fmt)
        v_cache, v_scales = k_cache.clone(), k_scales.clone()
    before = (k_cache.clone(), None if k_scales is None else k_scales.clone())
    k_new = torch.randn(batch, new, heads, dim, device=device).to(dtype)
    v_new = torch.randn(batch, new, heads, dim, device=device).to(dtype)
    lengths = torch.tensor([0, 17, capacity - new], dtype=torch.int32, device=device)
    tk.ops.kv_cache_append(k_new, v_new, k_cache, v_cache, lengths, block_table=table, k_scales=k_scales,
                           v_scales=v_scales)  # fmt: skip
    written = torch.zeros(k_cache.shape[:3], dtype=torch.bool, device=device)
    for new_values, cache, scales in ((k_new, k_cache, k_scales), (v_new, v_cache, v_scales)):
        expected = (new_values, None) if fmt == "plain" else tk.ops.quantize_kv(new_values, fmt)
        for b, length in enumerate(lengths.tolist()):
            for t in range(new):
                position = length + t
                where = (b, position) if table is None else (int(table[b, position // page_size]), position % page_size)
                written[where] = True
                assert torch.equal(cache[where].view(torch.uint8), expected[0][b, t].view(torch.uint8))
                if scales is not None:
                    assert torch.equal(scales[where], expected[1][b, t])
    assert torch.equal(k_cache[~written].view(torch.uint8), before[0][~written].view(torch.uint8))
    if k_scales is not None:
        assert torch.equal(k_scales[~written], before[1][~written])


# ---------------------------------------------------------------- attention


def _problem(device, lens=(70, 3, 0, 33), hq=4, hk=2, d=16, sq=2, page_size=16, dtype=torch.float32, fmt="plain"):
    case = {"lens": lens, "hq": hq, "hk": hk, "d": d, "sq": sq, "page_size": page_size, "kv": fmt}
    spec = catalog.get("decode_attention")
    return spec.make_inputs(spec.parse_case(case), torch.device(device), dtype, torch.Generator(device).manual_seed(0))


@pytest.mark.parametrize("splits", [1, 2, 3, 4, 7, 16])
def test_every_split_count_matches_the_reference(splits):
    """Split counts that leave splits empty (the length-3 and length-0 sequences) or partly filled; small tiles so
    that a split spans several key blocks and the 16 rows of each key head take two row blocks."""
    inputs = _problem("cpu", hq=32, hk=2, sq=2)
    q, k_cache, v_cache, lengths = inputs.args
    options = inputs.kwargs
    out, lse = launch.decode_attention_fwd(q, k_cache, v_cache, lengths, options["block_table"], None, None,
                                           1 / math.sqrt(q.shape[-1]), True, -1, 0.0, splits, plan=SMALL)  # fmt: skip
    expected, expected_lse = REFERENCE(*(x.double() if x.is_floating_point() else x for x in inputs.args),
                                       block_table=options["block_table"], return_lse=True)  # fmt: skip
    torch.testing.assert_close(out, expected.float(), atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(lse, expected_lse.float(), atol=2e-6, rtol=1e-5)
    assert torch.all(out[2] == 0) and torch.all(lse[2] == -math.inf)  # the empty sequence


# int8 and fp8 with the codes converted straight to the products' dtype, and read by halves of the head dim; the other
# tests take the default plan.
QUANTIZED_VARIANTS = [
    ("int8", {"direct_codes": True}),
    ("fp8", {"direct_codes": True}),
    ("int8", {"code_halves": True}),
    ("fp8", {"code_halves": True}),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize(("fmt", "variant"), QUANTIZED_VARIANTS,
                         ids=[f"{fmt}-{'-'.join(variant)}" for fmt, variant in QUANTIZED_VARIANTS])  # fmt: skip
def test_quantized_plan_variants_match_the_reference(device, fmt, variant, dtype):
    """The plan's other way of reading int8 and fp8 caches, against the reference on the dequantized cache: head
    dim 96, an empty sequence, splits with no keys (three splits of the length-3 sequence's one key block; one split
    is the other tests' default path)."""
    inputs = _problem(device, lens=(70, 3, 0, 33), hq=8, hk=2, d=96, dtype=dtype, fmt=fmt)
    q, k_cache, v_cache, lengths = inputs.args
    options = inputs.kwargs
    plan = dataclasses.replace(SMALL, **variant)
    k_scales, v_scales = options.get("k_scales"), options.get("v_scales")
    out, lse = launch.decode_attention_fwd(q, k_cache, v_cache, lengths, options["block_table"], k_scales, v_scales,
                                           1 / math.sqrt(q.shape[-1]), True, -1, 0.0, 3, plan=plan)  # fmt: skip
    expected, expected_lse = REFERENCE(q.double(), k_cache.double() if fmt == "fp8" else k_cache,
                                       v_cache.double() if fmt == "fp8" else v_cache, lengths,
                                       block_table=options["block_table"], k_scales=k_scales, v_scales=v_scales,
                                       return_lse=True)  # fmt: skip
    tol = TOLERANCES[dtype]
    torch.testing.assert_close(out.double(), expected, atol=tol.atol, rtol=tol.rtol)
    # The products of exact codes give scores, and so the lse, to fp32's rounding in every dtype.
    torch.testing.assert_close(lse.double(), expected_lse, atol=1e-5, rtol=1e-5)
    assert torch.all(out[2] == 0) and torch.all(lse[2] == -math.inf)  # the empty sequence


@pytest.mark.parametrize("fmt", ["int8", "fp8"])
def test_code_halves_with_a_window_and_a_softcap(device, fmt):
    """Caches read by halves under a window of 9 keys and a softcap of 5 (its scores' scale folded with q's row
    factors), two new tokens, bf16 q, against the reference on the dequantized cache."""
    inputs = _problem(device, lens=(70, 3, 0, 33), hq=8, hk=2, d=64, dtype=torch.bfloat16, fmt=fmt)
    q, k_cache, v_cache, lengths = inputs.args
    options = inputs.kwargs
    plan = dataclasses.replace(SMALL, code_halves=True)
    k_scales, v_scales = options["k_scales"], options["v_scales"]
    out, lse = launch.decode_attention_fwd(q, k_cache, v_cache, lengths, options["block_table"], k_scales, v_scales,
                                           1 / math.sqrt(q.shape[-1]), True, 9, 5.0, 3, plan=plan)  # fmt: skip
    expected, expected_lse = REFERENCE(q.double(), k_cache.double() if fmt == "fp8" else k_cache,
                                       v_cache.double() if fmt == "fp8" else v_cache, lengths,
                                       block_table=options["block_table"], k_scales=k_scales, v_scales=v_scales,
                                       window=9, softcap=5.0, return_lse=True)  # fmt: skip
    tol = TOLERANCES[torch.bfloat16]
    torch.testing.assert_close(out.double(), expected, atol=tol.atol, rtol=tol.rtol)
    torch.testing.assert_close(lse.double(), expected_lse, atol=1e-5, rtol=1e-5)


def test_short_splits_read_whole_tiles(device):
    """DecodePlan.code_halves_min_blocks: int8 caches are read by halves only where each split spans that many key
    blocks of the capacity (here 5 pages of 16 keys, 80 keys, in blocks of 16)."""
    inputs = _problem(device, lens=(70, 3, 0, 33), hq=8, hk=2, d=64, dtype=torch.bfloat16, fmt="int8")
    q, k_cache, v_cache, _ = inputs.args
    k_scales, v_scales, table = inputs.kwargs["k_scales"], inputs.kwargs["v_scales"], inputs.kwargs["block_table"]
    cache = launch.describe_cache(k_cache, table, k_scales, q.dtype, 64)
    plan = dataclasses.replace(SMALL, code_halves=True, code_halves_min_blocks=3)
    parts = [launch._code_parts(cache, k_cache, v_cache, k_scales, v_scales, q.dtype, 64, plan, "sm90", splits)[0]
             for splits in (1, 2, 3)]  # fmt: skip
    assert parts == [2, 2, 0]  # 5, 3 and 2 blocks a split


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("fmt", ["int8", "fp8"])
def test_code_halves_keep_value_scales_of_any_magnitude(device, fmt, dtype):
    """Caches read by halves take fp16 products: the probabilities times the value scales reach fp16 relative to the
    block's largest scale, so that value scales far outside fp16's range (bf16 q: 2^-60 and 2^60 times the usual;
    fp16 q: 2^-12, where p v_scale itself would be subnormal in fp16) keep their precision, against the reference
    on the dequantized cache, each sequence compared in its own units."""
    inputs = _problem(device, lens=(70, 3, 0, 33), hq=8, hk=2, d=64, dtype=dtype, fmt=fmt)
    q, k_cache, v_cache, lengths = inputs.args
    options = inputs.kwargs
    k_scales, v_scales, table = options["k_scales"], options["v_scales"], options["block_table"]
    units = torch.tensor([2.0**-60, 1.0, 1.0, 2.0**60] if dtype == torch.bfloat16 else [2.0**-12, 1.0, 1.0, 2.0**-4])
    v_scales = v_scales.clone()
    for b, unit in enumerate(units.tolist()):
        pages = table[b][table[b] >= 0]  # the sequence's own pages
        v_scales[pages] *= unit
    plan = dataclasses.replace(SMALL, code_halves=True)
    out, _ = launch.decode_attention_fwd(q, k_cache, v_cache, lengths, table, k_scales, v_scales,
                                         1 / math.sqrt(q.shape[-1]), True, -1, 0.0, 3, plan=plan)  # fmt: skip
    expected = REFERENCE(q.double(), k_cache.double() if fmt == "fp8" else k_cache,
                         v_cache.double() if fmt == "fp8" else v_cache, lengths, block_table=table,
                         k_scales=k_scales, v_scales=v_scales)  # fmt: skip
    in_units = units.to(device, torch.float64)[:, None, None, None]
    tol = TOLERANCES[dtype]
    torch.testing.assert_close(out.double() / in_units, expected / in_units, atol=tol.atol, rtol=tol.rtol)


@pytest.mark.parametrize("halfwords", [True, False], ids=["as-halfwords", "as-bytes"])
def test_int4_queries_beyond_fp16s_range_and_both_readings(device, halfwords):
    """bf16 queries reach int4 caches' fp16 products scaled row by row: rows 2^40 and 2^-40 times larger than usual,
    far outside fp16's range, against the reference on the dequantized cache. A cache whose rows do not start on
    2-byte boundaries (a view 1 byte into its storage) is read byte by byte, with the same result."""
    inputs = _problem(device, lens=(70, 3, 0, 33), hq=8, hk=2, d=64, dtype=torch.bfloat16, fmt="int4")
    q, k_cache, v_cache, lengths = inputs.args
    options = inputs.kwargs
    q = q.clone()
    q[0, :, 1] *= 2.0**40
    q[3, :, 5] *= 2.0**-40
    if not halfwords:
        k_cache = torch.cat([k_cache.new_zeros(1), k_cache.flatten()])[1:].view(k_cache.shape)
        v_cache = torch.cat([v_cache.new_zeros(1), v_cache.flatten()])[1:].view(v_cache.shape)
    k_scales, v_scales = options["k_scales"], options["v_scales"]
    cache = launch.describe_cache(k_cache, options["block_table"], k_scales, q.dtype, 64)
    parts = launch._code_parts(cache, k_cache, v_cache, k_scales, v_scales, q.dtype, 64, SMALL, "sm90")[0]
    assert parts == (4 if halfwords else 0)
    out, lse = launch.decode_attention_fwd(q, k_cache, v_cache, lengths, options["block_table"], k_scales, v_scales,
                                           1 / math.sqrt(q.shape[-1]), True, -1, 0.0, 3)  # fmt: skip
    expected, expected_lse = REFERENCE(q.double(), k_cache, v_cache, lengths, block_table=options["block_table"],
                                       k_scales=k_scales, v_scales=v_scales, return_lse=True)  # fmt: skip
    tol = TOLERANCES[torch.bfloat16]
    torch.testing.assert_close(out.double(), expected, atol=tol.atol, rtol=tol.rtol)
    torch.testing.assert_close(lse.double(), expected_lse, atol=tol.atol, rtol=tol.rtol)
    assert torch.all(out[2] == 0) and torch.all(lse[2] == -math.inf)  # the empty sequence


@pytest.mark.parametrize("fmt", ["plain", "int8", "int4"])
def test_programmatic_dependent_launches_change_nothing(device, fmt):
    """DecodePlan.pdl: on a GPU the decode kernel and the reduction launch as programmatic dependents, each waiting
    for its predecessor inside the kernel; their outputs are the plain launches' bit for bit, and a CUDA graph
    captures them. (Under the interpreter there are no launches to overlap: the flag is off there.)"""
    inputs = _problem(device, lens=(70, 3, 0, 33), hq=8, hk=2, d=64, dtype=torch.bfloat16, fmt=fmt)
    q, k_cache, v_cache, lengths = inputs.args
    options = inputs.kwargs
    rest = (options["block_table"], options.get("k_scales"), options.get("v_scales"), 0.125, True, -1, 0.0, 3)

    def decode(q, plan):
        return launch.decode_attention_fwd(q, k_cache, v_cache, lengths, *rest, plan=plan)

    out, lse = decode(q, SMALL)
    out_pdl, lse_pdl = decode(q, dataclasses.replace(SMALL, pdl=True))
    assert torch.equal(out_pdl, out) and torch.equal(lse_pdl, lse)
    if device == "cuda":
        assert_graph_replay_matches_eager(lambda q: decode(q, dataclasses.replace(SMALL, pdl=True)), (q,))


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("fmt", ["plain", "int8", "int4"])
def test_pages_smaller_than_a_key_block_match_the_reference(device, fmt, page_size):
    """Key blocks of 64 over pages of 1 and 16 keys: the blocks every row sees whole take one lookup a page, gathered
    to its rows (the 300-key sequence has such blocks in both splits; the 129-key one in its first); the others take
    the key-by-key path. Pages scattered out of order, an empty split at the 5-key sequence."""
    inputs = _problem(device, lens=(300, 129, 5), hq=4, hk=2, d=64, sq=2, page_size=page_size, fmt=fmt)
    q, k_cache, v_cache, lengths = inputs.args
    options = inputs.kwargs
    k_scales, v_scales = options.get("k_scales"), options.get("v_scales")
    plan = DecodePlan(block_n=64, warps=4, stages=2, max_rows=16)
    out, lse = launch.decode_attention_fwd(q, k_cache, v_cache, lengths, options["block_table"], k_scales, v_scales,
                                           1 / math.sqrt(q.shape[-1]), True, -1, 0.0, 2, plan=plan)  # fmt: skip
    expected, expected_lse = REFERENCE(*(x.double() if x.is_floating_point() else x for x in inputs.args),
                                       block_table=options["block_table"], k_scales=k_scales, v_scales=v_scales,
                                       return_lse=True)  # fmt: skip
    torch.testing.assert_close(out.double(), expected, atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(lse.double(), expected_lse, atol=2e-6, rtol=1e-5)


def test_splits_are_chosen_from_the_shape():
    assert choose_splits(programs=1024, max_keys=4096, sm_count=132) == 1  # the batch fills the GPU
    assert choose_splits(programs=8, max_keys=131072, sm_count=132) == 33  # batch 1, 8 key heads: split the keys
    assert choose_splits(programs=8, max_keys=1024, sm_count=132) == 2  # but no split shorter than 512 keys
    assert choose_splits(programs=1, max_keys=1 << 24, sm_count=132) == 128  # at most MAX_SPLITS
    wider = dataclasses.replace(SMALL, programs_per_sm=4, min_keys_per_split=2048)  # a plan's own heuristic
    assert choose_splits(programs=8, max_keys=131072, sm_count=132, plan=wider) == 64  # 66 wanted, 64 of 2048 keys
    assert choose_splits(programs=8, max_keys=8192, sm_count=132, plan=wider) == 4  # 8192 / 2048
    assert choose_splits(programs=128, max_keys=1 << 20, sm_count=132) == 2  # 264 // 128: a third would start a wave
    at_least_two = dataclasses.replace(SMALL, min_splits=2)
    assert choose_splits(programs=1024, max_keys=4096, sm_count=132, plan=at_least_two) == 2
    assert choose_splits(programs=1024, max_keys=512, sm_count=132, plan=at_least_two) == 1  # but not under 512 keys


def test_strided_q_and_expanded_lengths(device):
    inputs = _problem(device, lens=(40, 40, 40), page_size=0)
    q, k_cache, v_cache, _ = inputs.args
    wide = torch.randn(q.shape[0], q.shape[1], q.shape[2], 2 * q.shape[3], device=device)[..., ::2]  # strided D
    lengths = torch.tensor([40], dtype=torch.int32, device=device).expand(3)  # stride 0
    out = tk.ops.decode_attention(wide, k_cache, v_cache, lengths)
    expected = REFERENCE(wide.double(), k_cache.double(), v_cache.double(), lengths)
    torch.testing.assert_close(out, expected.float(), atol=2e-6, rtol=1e-5)


def test_matches_dense_attention_on_the_same_keys(device):
    """One sequence, Sq new tokens at the end: decode_attention is attention with causal bottom-right alignment."""
    torch.manual_seed(0)
    q = torch.randn(1, 5, 8, 32, device=device)
    k, v = torch.randn(1, 50, 2, 32, device=device), torch.randn(1, 50, 2, 32, device=device)
    lengths = torch.tensor([50], dtype=torch.int32, device=device)
    ours = tk.ops.decode_attention(q, k, v, lengths, window=7, softcap=3.0, num_splits=3)
    dense = tk.ops.attention(q, k, v, causal=True, window=(7, 0), softcap=3.0, layout="bshd")
    torch.testing.assert_close(ours, dense, atol=2e-6, rtol=1e-5)


def test_refuses_inputs_that_require_grad():
    q, k_cache, v_cache, lengths = _problem("cpu", page_size=0).args
    with pytest.raises(ValueError, match=r"forward only.*q requires grad"):
        tk.ops.decode_attention(q.requires_grad_(), k_cache, v_cache, lengths)
    with torch.no_grad():
        tk.ops.decode_attention(q, k_cache, v_cache, lengths)


def test_a_decode_step_compiles_fullgraph(device):
    """Append, then attend over the grown cache, under torch.compile(fullgraph=True): the in-place append is a
    mutating custom op that the graph keeps in order (on the CPU through aot_eager)."""
    torch.manual_seed(0)
    batch, heads_q, heads_k, dim, pages, page_size = 2, 4, 2, 16, 8, 16
    k_cache = torch.randn(pages, page_size, heads_k, dim, device=device)
    v_cache = torch.randn(pages, page_size, heads_k, dim, device=device)
    k_data, k_scales = tk.ops.quantize_kv(k_cache, "int8")
    v_data, v_scales = tk.ops.quantize_kv(v_cache, "int8")
    table = torch.tensor([[3, 0, 5], [7, 1, 2]], dtype=torch.int32, device=device)
    lengths = torch.tensor([20, 33], dtype=torch.int32, device=device)
    q = torch.randn(batch, 1, heads_q, dim, device=device)
    k_new = torch.randn(batch, 1, heads_k, dim, device=device)
    v_new = torch.randn(batch, 1, heads_k, dim, device=device)

    def step(q, k_new, v_new, k_data, v_data, k_scales, v_scales, lengths):
        tk.ops.kv_cache_append(k_new, v_new, k_data, v_data, lengths, block_table=table, k_scales=k_scales,
                               v_scales=v_scales)  # fmt: skip
        return tk.ops.decode_attention(q, k_data, v_data, lengths + 1, block_table=table, k_scales=k_scales,
                                       v_scales=v_scales)  # fmt: skip

    state = [k_data, v_data, k_scales, v_scales]
    eager_state = [x.clone() for x in state]
    eager = step(q, k_new, v_new, *eager_state, lengths)
    torch._dynamo.reset()
    backend = "inductor" if device == "cuda" else "aot_eager"
    compiled = torch.compile(step, fullgraph=True, backend=backend)(q, k_new, v_new, *state, lengths)
    torch.testing.assert_close(compiled, eager, atol=1e-6, rtol=1e-6)
    for ours, theirs in zip(state, eager_state, strict=True):
        assert torch.equal(ours.view(torch.uint8), theirs.view(torch.uint8))


# ---------------------------------------------------------------- the checker catches wrong decoding


def _broken(fn) -> KernelSpec:
    spec = catalog.get("decode_attention")
    return KernelSpec(**{**spec.__dict__, "fn": fn, "name": f"broken-{spec.name}"})


def _one_key_short(q, k_cache, v_cache, lengths, **kw):
    return tk.ops.decode_attention(q, k_cache, v_cache, (lengths - 1).clamp(min=0), **kw)


def _window_one_wider(q, k_cache, v_cache, lengths, *, window=-1, **kw):
    return tk.ops.decode_attention(q, k_cache, v_cache, lengths, window=window + 1, **kw)


def _new_tokens_at_the_front(q, k_cache, v_cache, lengths, **kw):
    """Causal aligned top-left: query t at position t, not L - Sq + t."""
    return tk.ops.decode_attention(q, k_cache, v_cache, torch.full_like(lengths, q.shape[1]), **kw)


def _scales_ignored(q, k_cache, v_cache, lengths, *, k_scales=None, v_scales=None, **kw):
    return tk.ops.decode_attention(q, k_cache, v_cache, lengths, k_scales=torch.ones_like(k_scales),
                                   v_scales=v_scales, **kw)  # fmt: skip


@pytest.mark.parametrize(
    ("label", "fn", "case"),
    [
        ("scale off by 4%", lambda q, *a, **kw: tk.ops.decode_attention(q, *a, scale=1.04 / math.sqrt(q.shape[-1]),
                                                                        **kw),
         {"lens": (37, 20), "hq": 4, "hk": 2, "d": 16}),
        ("one key short", _one_key_short, {"lens": (37, 20), "hq": 4, "hk": 2, "d": 16, "page_size": 16}),
        ("window one key wider", _window_one_wider, {"lens": (37,), "hq": 4, "hk": 2, "d": 16, "window": 5}),
        ("new tokens at the front", _new_tokens_at_the_front,
         {"lens": (30, 25), "hq": 2, "hk": 1, "d": 16, "sq": 4}),
        ("key scales ignored", _scales_ignored, {"lens": (30,), "hq": 2, "hk": 1, "d": 16, "kv": "int8"}),
    ],
)  # fmt: skip
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_checker_catches_wrong_decoding(label, fn, case, dtype):
    result = testing.run_case(_broken(fn), case, dtype, "cpu")
    assert not result.ok, f"{label} passed the check"


# ---------------------------------------------------------------- bad input


def _good(device="cpu", fmt="plain", paged=True):
    inputs = _problem(device, fmt=fmt, page_size=16 if paged else 0)
    q, k_cache, v_cache, lengths = inputs.args
    return {"q": q, "k_cache": k_cache, "v_cache": v_cache, "cache_seqlens": lengths, **inputs.kwargs}


def _call(arguments):
    arguments = dict(arguments)
    return tk.ops.decode_attention(arguments.pop("q"), arguments.pop("k_cache"), arguments.pop("v_cache"),
                                   arguments.pop("cache_seqlens"), **arguments)  # fmt: skip


def _with_page(table, page):
    table = table.clone()
    table[0, 1] = page  # the first sequence (70 tokens) reads its second page
    return table


BAD = [
    ("q 3-D", lambda a: {"q": a["q"][0]}, ValueError, "q must have 4 dimensions"),
    ("q int", lambda a: {"q": a["q"].int()}, TypeError, "q must have dtype"),
    ("17 new tokens", lambda a: {"q": a["q"][:, :1].expand(-1, 17, -1, -1)}, ValueError, "at most 16"),
    ("head dims differ", lambda a: {"q": a["q"][..., :8]}, ValueError, "last dim must be 8"),
    ("heads not a multiple", lambda a: {"q": a["q"][:, :, :3]}, ValueError, "multiple of the cache's heads"),
    ("k and v differ", lambda a: {"v_cache": a["v_cache"][:, :, :1]}, ValueError, "one shape and dtype"),
    ("page size 8", lambda a: {"k_cache": a["k_cache"][:, :8], "v_cache": a["v_cache"][:, :8]}, ValueError,
     "page_size .* must be 1 or a multiple of 16"),
    ("table int64", lambda a: {"block_table": a["block_table"].long()}, TypeError, "block_table must have dtype"),
    ("table rows", lambda a: {"block_table": a["block_table"][:2]}, ValueError, "one row per sequence"),
    ("page past the pool", lambda a: {"block_table": _with_page(a["block_table"], 99)}, ValueError,
     "block_table row 0 points at page 99, outside the pool"),
    ("page -1 in use", lambda a: {"block_table": _with_page(a["block_table"], -1)}, ValueError,
     "points at page -1"),
    ("length past the capacity", lambda a: {"cache_seqlens": a["cache_seqlens"] + 1000}, ValueError,
     "must be in \\[0, 80\\]"),
    ("negative length", lambda a: {"cache_seqlens": a["cache_seqlens"] - 100}, ValueError, "must be in \\[0, 80\\]"),
    ("lengths int64", lambda a: {"cache_seqlens": a["cache_seqlens"].long()}, TypeError,
     "cache_seqlens must have dtype"),
    ("scales for plain", lambda a: {"k_scales": torch.ones(a["k_cache"].shape[:3])}, ValueError,
     "k_scales was given for a cache that is not quantized"),
    ("window -2", lambda a: {"window": -2}, ValueError, "window must be in"),
    ("softcap negative", lambda a: {"softcap": -1.0}, ValueError, "softcap must be >= 0"),
    ("splits 1000", lambda a: {"num_splits": 1000}, ValueError, "num_splits must be in \\[0, 128\\]"),
    ("causal None", lambda a: {"causal": None}, TypeError, "causal must be a bool"),
]  # fmt: skip


@pytest.mark.parametrize(("label", "change", "error", "match"), BAD, ids=[row[0] for row in BAD])
def test_bad_input_names_the_argument(label, change, error, match):
    arguments = _good()
    arguments.update(change(arguments))
    with pytest.raises(error, match=match):
        _call(arguments)


def test_bad_quantized_caches_name_the_argument():
    arguments = _good(fmt="int8")
    with pytest.raises(ValueError, match="a int8 cache needs v_scales"):
        _call({**arguments, "v_scales": None})
    with pytest.raises(TypeError, match="k_scales must have dtype"):
        _call({**arguments, "k_scales": arguments["k_scales"].half()})
    with pytest.raises(ValueError, match="one scale per token and head"):
        _call({**arguments, "k_scales": arguments["k_scales"][..., :1]})
    int4 = _good(fmt="int4")
    with pytest.raises(ValueError, match="int4 cache must have shape"):
        _call({**int4, "k_scales": int4["k_scales"][..., 0]})
    with pytest.raises(TypeError, match=r"k_cache must have dtype torch.float32 .* int8, float8_e4m3fn or uint8"):
        _call({**arguments, "k_cache": arguments["k_cache"].short(), "v_cache": arguments["v_cache"].short()})


def test_bad_append_and_quantize_input_names_the_argument():
    arguments = _good(paged=False)
    k_cache, v_cache, lengths = arguments["k_cache"], arguments["v_cache"], arguments["cache_seqlens"]
    new = torch.randn(4, 1, 2, 16)
    with pytest.raises(ValueError, match="k_new has 1 heads"):
        tk.ops.kv_cache_append(new[:, :, :1], new[:, :, :1], k_cache, v_cache, lengths)
    with pytest.raises(TypeError, match=r"k_cache must have dtype torch\.bfloat16"):
        tk.ops.kv_cache_append(new.bfloat16(), new.bfloat16(), k_cache, v_cache, lengths)
    with pytest.raises(ValueError, match="cache_seqlens \\+ the new tokens of sequence 0 must be in \\[0, 75\\]"):
        tk.ops.kv_cache_append(new, new, k_cache, v_cache, torch.full_like(lengths, 75))
    with pytest.raises(ValueError, match="k_new and v_new must have one shape"):
        tk.ops.kv_cache_append(new, new[:2], k_cache, v_cache, lengths)
    with pytest.raises(ValueError, match="dtype must be one of \\('int8', 'fp8', 'int4'\\), got 'int3'"):
        tk.ops.quantize_kv(new, "int3")
    with pytest.raises(ValueError, match="group_size must be an even power of two dividing head_dim 16, got 3"):
        tk.ops.quantize_kv(new, "int4", group_size=3)
    with pytest.raises(ValueError, match="head_dim must be even"):
        tk.ops.quantize_kv(new[..., :15], "int4")
    with pytest.raises(TypeError, match="data must be quantize_kv's"):
        tk.ops.dequantize_kv(new, new)
    data, scales = tk.ops.quantize_kv(new, "int4")
    with pytest.raises(ValueError, match="scales of int4 data"):
        tk.ops.dequantize_kv(data, scales[..., 0, :])


def test_lengths_are_checked_on_request_only_on_a_gpu(monkeypatch):
    """Reading lengths would synchronise: on CUDA tensors only check_inputs=True or TRITONKIT_DEBUG=1 reads them
    (on CPU tensors always)."""
    lengths = torch.tensor([5, 10])
    assert launch.wants_value_checks("x", None, lengths)
    monkeypatch.setenv("TRITONKIT_DEBUG", "0")
    cuda_like = torch.empty(2, device="meta")
    assert not launch.wants_value_checks("x", None, cuda_like)
    assert launch.wants_value_checks("x", True, cuda_like)
    monkeypatch.setenv("TRITONKIT_DEBUG", "1")
    assert launch.wants_value_checks("x", None, cuda_like)


# ---------------------------------------------------------------- GPU


@pytest.mark.gpu
def test_deterministic_and_independent_of_the_split_count():
    inputs = _problem("cuda", lens=(20000, 3, 4097), hq=32, hk=8, d=128, sq=1, dtype=torch.bfloat16)
    q, k_cache, v_cache, lengths = inputs.args
    table = inputs.kwargs["block_table"]
    runs = [tk.ops.decode_attention(q, k_cache, v_cache, lengths, block_table=table, num_splits=s)
            for s in (0, 0, 1, 7, 64)]  # fmt: skip
    assert torch.equal(runs[0], runs[1])
    for run in runs[2:]:
        torch.testing.assert_close(run, runs[0], atol=8e-3, rtol=8e-3)


@pytest.mark.gpu
def test_unchecked_pages_outside_the_pool_count_as_no_key(monkeypatch):
    """Without value checks a bad table must not crash the GPU: keys on pages outside the pool are skipped."""
    monkeypatch.setenv("TRITONKIT_DEBUG", "0")
    inputs = _problem("cuda", lens=(64,), hq=4, hk=2, d=64, sq=1, page_size=16)
    q, k_cache, v_cache, lengths = inputs.args
    table = inputs.kwargs["block_table"].clone()
    table[0, 3] = 10**6  # keys 48..63
    out = tk.ops.decode_attention(q, k_cache, v_cache, lengths, block_table=table)
    expected = tk.ops.decode_attention(q, k_cache, v_cache, lengths - 16, block_table=table, causal=False)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["plain", "int8", "int4"])
def test_a_decode_step_captures_in_a_cuda_graph(fmt):
    """Append then attend, captured once; replays on new queries and keys advance the cache as eager steps do."""
    torch.manual_seed(0)
    batch, heads_q, heads_k, dim, page_size, pages = 4, 32, 8, 128, 16, 64
    values = torch.randn(pages, page_size, heads_k, dim, device="cuda", dtype=torch.bfloat16)
    if fmt == "plain":
        cache = [values.clone(), values.clone(), None, None]
    else:
        k_data, k_scales = tk.ops.quantize_kv(values, fmt)
        cache = [k_data, k_data.clone(), k_scales, k_scales.clone()]
    table = torch.randperm(pages, device="cuda")[: batch * 16].view(batch, 16).int()
    lengths = torch.tensor([100, 1, 37, 200], dtype=torch.int32, device="cuda")
    q = torch.randn(batch, 1, heads_q, dim, device="cuda", dtype=torch.bfloat16)
    k_new, v_new = (torch.randn(batch, 1, heads_k, dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))

    def step(state, lengths):
        tk.ops.kv_cache_append(k_new, v_new, state[0], state[1], lengths, block_table=table, k_scales=state[2],
                               v_scales=state[3])  # fmt: skip
        out = tk.ops.decode_attention(q, state[0], state[1], lengths + 1, block_table=table, k_scales=state[2],
                                      v_scales=state[3])  # fmt: skip
        lengths += 1
        return out

    eager_cache = [None if x is None else x.clone() for x in cache]
    eager_lengths = lengths.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step([None if x is None else x.clone() for x in cache], lengths.clone())  # warm-up on copies
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step(cache, lengths)
    for _ in range(3):
        q.copy_(torch.randn_like(q))
        k_new.copy_(torch.randn_like(k_new))
        v_new.copy_(torch.randn_like(v_new))
        graph.replay()
        expected = step(eager_cache, eager_lengths)
        torch.cuda.synchronize()
        assert torch.equal(captured, expected)
    assert torch.equal(lengths, eager_lengths)


def test_a_grid_of_lone_programs_takes_the_plans_one_wave_warps():
    """DecodePlan.one_wave_warps: a grid of at most one program per multiprocessor takes them; a larger grid, or a
    plan without them, takes the plan's warps."""
    plan = DecodePlan(64, 2, 3, 64, one_wave_warps=4)
    assert [plan.warps_for(programs, 132) for programs in (1, 128, 132, 133, 512)] == [4, 4, 4, 2, 2]
    assert DecodePlan(64, 2, 3, 64).warps_for(8, 132) == 2


def test_short_splits_take_their_own_pipeline_depth():
    """A plan's short-split rule: a split of at most the first pair's key blocks runs that pair's stages deep, else
    the next pair's, else the plan's own (a 1024-key cache in 16, 8, 6, 4 and 1 splits: splits of 1, 2, 3, 4 and 16
    blocks of 64)."""
    plan = DecodePlan(64, 2, 3, 64, short_split_stages=((2, 1), (3, 2)))
    assert [plan.stages_for(1024, splits) for splits in (16, 8, 6, 4, 1)] == [1, 1, 2, 3, 3]
    assert DecodePlan(64, 4, 3, 64).stages_for(1024, 16) == 3
