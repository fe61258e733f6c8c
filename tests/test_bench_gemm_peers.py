"""tritonkit.bench.gemm_peers on the CPU (where torch has _scaled_mm and _int_mm): each peer against the
scaled_linear spec's float64 reference, and the refusals."""

import sys

import pytest
import torch

from tritonkit import catalog
from tritonkit.bench import gemm_peers as peers
from tritonkit.bench.attention_peers import Unsupported

SPEC = catalog.get("scaled_linear")


def _inputs(case, dtype=torch.bfloat16):
    parsed = SPEC.parse_case(case)
    return SPEC.make_inputs(parsed, torch.device("cpu"), dtype, torch.Generator().manual_seed(0))


def _close(out, inputs):
    expected = SPEC.reference(*(t.double() if t is not None and t.is_floating_point() else t for t in inputs.args),
                              bias=inputs.kwargs["bias"])  # fmt: skip
    # bf16 outputs: two bf16 roundings (the product and, for the elementwise peers, the scaled result).
    torch.testing.assert_close(out.double(), expected, rtol=1.6e-2, atol=1.6e-2 * float(expected.abs().mean()))


@pytest.mark.parametrize(
    "case",
    [{"m": 24, "n": 40, "k": 64, "x": "e4m3", "w": "e4m3"},
     {"m": 24, "n": 40, "k": 64, "x": "e4m3", "w": "e4m3", "x_scale": "tensor", "w_scale": "tensor", "bias": True},
     {"m": 24, "n": 40, "k": 64, "x": "e4m3", "w": "e4m3", "x_scale": "tensor", "w_scale": "row"}],
)  # fmt: skip
def test_scaled_mm_matches_the_reference(case):
    inputs = _inputs(case)
    _close(peers.scaled_mm()(*inputs.args, **inputs.kwargs), inputs)


@pytest.mark.parametrize("peer", ["int_mm", "cublas"])
def test_int_mm_and_cublas_match_the_reference(peer):
    inputs = _inputs({"m": 24, "n": 40, "k": 64, "x": "int8", "w": "int8", "bias": True})
    _close(getattr(peers, peer)()(*inputs.args, **inputs.kwargs), inputs)


def test_bare_int_mm_is_the_unscaled_integer_product():
    inputs = _inputs({"m": 24, "n": 40, "k": 64, "x": "int8", "w": "int8", "bias": True})
    x_q, w_q = inputs.args[:2]
    out = peers.int_mm_bare()(*inputs.args, **inputs.kwargs)
    assert out.dtype == torch.int32
    torch.testing.assert_close(out, (x_q.long() @ w_q.long().T).int(), rtol=0, atol=0)


def test_the_refusals():
    int8 = _inputs({"m": 24, "n": 40, "k": 64, "x": "int8", "w": "int8"})
    with pytest.raises(Unsupported, match="float8 codes only"):
        peers.scaled_mm()(*int8.args, **int8.kwargs)
    fp8 = _inputs({"m": 24, "n": 40, "k": 256, "x": "e4m3", "w": "e4m3", "x_scale": "group", "w_scale": "row"})
    with pytest.raises(Unsupported, match="no group x row scales"):
        peers.scaled_mm()(*fp8.args, **fp8.kwargs)
    with pytest.raises(Unsupported, match="int8 codes only"):
        peers.int_mm()(*fp8.args, **fp8.kwargs)
    with pytest.raises(Unsupported, match="int8 codes only"):
        peers.int_mm_bare()(*fp8.args, **fp8.kwargs)
    grouped = _inputs({"m": 24, "n": 40, "k": 256, "x": "int8", "w": "int8", "x_scale": "group", "w_scale": "row"})
    with pytest.raises(Unsupported, match="must not vary along K"):
        peers.int_mm()(*grouped.args, **grouped.kwargs)


def test_torchao_refuses_what_its_kernel_does_not_compute_before_importing_it():
    """The refusals come before torchao's import, so they hold on a CPU without it."""
    row = _inputs({"m": 24, "n": 40, "k": 256, "x": "e4m3", "w": "e4m3"})
    with pytest.raises(Unsupported, match="1 x 128 groups by 128 x 128 blocks only"):
        peers.torchao_blockwise()(*row.args, **row.kwargs)
    int8 = _inputs({"m": 24, "n": 40, "k": 256, "x": "int8", "w": "int8", "x_scale": "group", "w_scale": "block"})
    with pytest.raises(Unsupported, match="e4m3 codes only"):
        peers.torchao_blockwise()(*int8.args, **int8.kwargs)
    blocks = {"m": 24, "n": 40, "k": 256, "x": "e4m3", "w": "e4m3", "x_scale": "group", "w_scale": "block"}
    with_bias = _inputs({**blocks, "bias": True})
    with pytest.raises(Unsupported, match="without a bias"):
        peers.torchao_blockwise()(*with_bias.args, **with_bias.kwargs)


@pytest.mark.gpu
def test_torchao_blockwise_matches_the_reference():
    """On a GPU with torchao (its wheel carried: a run without it fails, it does not skip)."""
    try:
        import torchao  # noqa: F401
    except ImportError as error:
        pytest.fail(f"torchao is not installed ({error}): carry its wheel to the GPU machine")
    case = SPEC.parse_case({"m": 200, "n": 384, "k": 512, "x": "e4m3", "w": "e4m3", "x_scale": "group",
                            "w_scale": "block"})  # fmt: skip
    inputs = SPEC.make_inputs(case, torch.device("cuda"), torch.bfloat16, torch.Generator("cuda").manual_seed(0))
    _close(peers.torchao_blockwise()(*inputs.args, **inputs.kwargs), inputs)


def test_gemm_table_dry_run_end_to_end(tmp_path):
    import importlib.util
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "gemm_table.py"
    module_spec = importlib.util.spec_from_file_location("gemm_table", path)
    table = importlib.util.module_from_spec(module_spec)
    sys.modules["gemm_table"] = table  # its dataclasses look their module up there
    module_spec.loader.exec_module(table)
    assert table.main(["--dry-run", "--out", str(tmp_path)]) == 0
    (record_path,) = tmp_path.glob("*-gemm-table.json")
    results = json.loads(record_path.read_text())["results"]
    ran = {(r["spec"], r["provider"]) for r in results if r["skipped"].startswith("dry run: ran")}
    assert {("matmul_persistent", "tritonkit"), ("matmul_persistent", "torch"), ("scaled_linear", "tritonkit"),
            ("scaled_linear", "scaled_mm"), ("scaled_linear", "int_mm"), ("scaled_linear", "cublas"),
            ("scaled_linear", "tiled"), ("quantize", "tritonkit"), ("quantize", "torch.compile")} <= ran  # fmt: skip
    peers = (tmp_path / f"{record_path.stem}-peers.md").read_text()
    assert "| fp8 row |" in peers
    assert "| int8 row | 16 | 48 x 256 | (dry run: ran;" in peers  # the W8A16 bandwidth table, on tiny shapes


def test_quantized_generation_script_on_a_tiny_model(tmp_path):
    """The Llama-shaped model with QuantizedLinear projections: both versions run through transformers' generate,
    and under teacher forcing their logits stay within the formats' error of the fp32 model's."""
    import importlib.util
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "quantized_generate.py"
    module_spec = importlib.util.spec_from_file_location("quantized_generate", path)
    script = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(script)
    assert script.main(["--tiny", "--out", str(tmp_path)]) == 0
    (record_path,) = tmp_path.glob("*-quantized-generate.json")
    rows = {row["version"]: row for row in json.loads(record_path.read_text())["rows"]}
    assert set(rows) == {"fp32", "fp8-row-w8a8", "int8-row-w8a16"}
    assert rows["fp8-row-w8a8"]["logits_relative_rms_error"] < 0.08  # e4m3 on both operands: ~2^-4 each at worst
    assert rows["int8-row-w8a16"]["logits_relative_rms_error"] < 0.02  # int8 weights alone
