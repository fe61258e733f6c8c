"""tritonkit.bench.decoding_peers on the CPU: SDPA and FlexAttention (eager) with decode_attention's signature
against the spec's float64 reference, paged caches through the block mask, the refusals, and the slot owners."""

import warnings

import pytest
import torch

from tritonkit import catalog
from tritonkit.bench import decoding_peers as peers
from tritonkit.bench.attention_peers import Unsupported

SPEC = catalog.get("decode_attention")


def _inputs(case):
    parsed = SPEC.parse_case(case)
    return SPEC.make_inputs(parsed, torch.device("cpu"), torch.float32, torch.Generator().manual_seed(0))


def _reference(inputs):
    return SPEC.reference(*(a.double() if a.is_floating_point() else a for a in inputs.args), **inputs.kwargs)


FLEX_CASES = [
    pytest.param({"lens": (37, 5, 0), "hq": 4, "hk": 2, "d": 16, "page_size": 16}, id="paged-empty-sequence"),
    pytest.param({"lens": (40, 21), "hq": 4, "hk": 1, "d": 16, "sq": 3, "window": 6, "softcap": 3.0},
                 id="contiguous-window-softcap"),
    pytest.param({"lens": (33, 12), "hq": 4, "hk": 2, "d": 16, "page_size": 16, "sq": 2, "causal": False},
                 id="paged-noncausal"),
    pytest.param({"lens": (9, 4), "hq": 2, "hk": 2, "d": 16, "page_size": 1, "sq": 2}, id="pages-of-one"),
]  # fmt: skip


@pytest.mark.parametrize("case", FLEX_CASES)
def test_flex_decode_matches_the_reference(case):
    inputs = _inputs(case)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        out = peers.flex_decode(compiled=False)(*inputs.args, **inputs.kwargs)
    torch.testing.assert_close(out.double(), _reference(inputs), atol=1e-6, rtol=1e-6)


def test_sdpa_decode_matches_the_reference_on_full_caches():
    inputs = _inputs({"b": 3, "s": 40, "hq": 8, "hk": 2, "d": 16, "capacity": 40})
    out = peers.sdpa_decode()(*inputs.args, **inputs.kwargs)
    torch.testing.assert_close(out.double(), _reference(inputs), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize(
    ("case", "match"),
    [
        ({"b": 2, "s": 40, "hq": 4, "hk": 2, "d": 16, "page_size": 16}, "no paged KV cache"),
        ({"b": 2, "s": 40, "hq": 4, "hk": 2, "d": 16, "kv": "int8", "capacity": 40}, "no quantized KV cache"),
        ({"b": 2, "s": 40, "hq": 4, "hk": 2, "d": 16, "window": 8, "capacity": 40}, "no sliding window"),
        ({"b": 2, "s": 40, "hq": 4, "hk": 2, "d": 16, "sq": 2, "capacity": 40}, "top-left"),
        ({"lens": (40, 30), "hq": 4, "hk": 2, "d": 16, "capacity": 40}, "no per-sequence lengths"),
    ],
)
def test_sdpa_refuses_what_it_cannot_compute(case, match):
    inputs = _inputs(case)
    with pytest.raises(Unsupported, match=match):
        peers.sdpa_decode()(*inputs.args, **inputs.kwargs)


def test_flex_refuses_quantized_caches():
    inputs = _inputs({"lens": (20,), "hq": 2, "hk": 1, "d": 16, "kv": "fp8"})
    with pytest.raises(Unsupported, match="no quantized KV cache"):
        peers.flex_decode(compiled=False)(*inputs.args, **inputs.kwargs)


def test_slot_owners_follow_the_table():
    """Pages 2 and 0 belong to sequence 0 (positions 0-3, 4-7), page 3 to sequence 1; page 1 and the -1 entry
    belong to no one."""
    table = torch.tensor([[2, 0], [3, -1]], dtype=torch.int32)
    owner, position = peers._slot_owners(table, n_pages=4, page_size=4)
    assert owner.tolist() == [0] * 4 + [-1] * 4 + [0] * 4 + [1] * 4
    assert position[:4].tolist() == [4, 5, 6, 7] and position[8:].tolist() == [0, 1, 2, 3, 0, 1, 2, 3]


def test_the_decoding_peers_are_registered():
    from tritonkit.bench import providers

    names = [p.name for p in providers.select_providers(SPEC, ("tritonkit", "sdpa", "flex"))]
    assert names == ["tritonkit", "sdpa", "flex"]
    assert all(p.fn is not None for p in providers.select_providers(SPEC, ("sdpa", "flex")))


def _script(name):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_decode_table_dry_run_end_to_end(tmp_path):
    table = _script("decode_table")
    assert table.main(["--dry-run", "--out", str(tmp_path)]) == 0
    (record_path,) = tmp_path.glob("*-decode-table.json")
    import json

    results = json.loads(record_path.read_text())["results"]
    by = {(r["case_id"], r["provider"]): r["skipped"] for r in results}
    ran = [text for (_, provider), text in by.items() if provider != "xformers" and text.startswith("dry run: ran")]
    assert {provider for _, provider in by} == {"tritonkit", "sdpa", "flex", "xformers"}
    assert len(ran) == sum(provider != "xformers" for _, provider in by)
    assert {text for (_, provider), text in by.items() if provider == "xformers"} == {
        "xFormers' split-K kernel runs on a CUDA GPU only"
    }
    errors = [float(text.split("error ")[1].split()[0]) for text in ran]
    assert max(errors) < 1e-5
    assert "| B | S | tritonkit paged GB/s |" in (tmp_path / f"{record_path.stem}-peers.md").read_text()


def test_the_generation_example_matches_transformers_greedy_tokens(tmp_path):
    """The paged decoder (transformers' layers, tritonkit's cache append and decode attention) generates the same
    greedy tokens as transformers' generate, in fp32 on a tiny model."""
    generate = _script("decode_generate")
    assert generate.main(["--tiny", "--out", str(tmp_path)]) == 0
    import json

    (record_path,) = tmp_path.glob("*-decode-generate-plain.json")
    (row,) = json.loads(record_path.read_text())["rows"]
    assert row["agreement"] == {"first_token": 1.0, "all_tokens": 1.0}


@pytest.mark.parametrize(
    ("case", "dtype", "match"),
    [
        ({"b": 2, "s": 40, "hq": 4, "hk": 2, "d": 16, "kv": "int8", "page_size": 16}, torch.bfloat16,
         "no quantized KV cache"),
        ({"b": 2, "s": 40, "hq": 4, "hk": 2, "d": 16, "window": 8}, torch.bfloat16, "no sliding window"),
        ({"b": 2, "s": 40, "hq": 4, "hk": 2, "d": 16, "softcap": 5.0}, torch.bfloat16, "softcap"),
        ({"b": 2, "s": 40, "hq": 4, "hk": 2, "d": 16, "lse": True}, torch.bfloat16, "lse"),
        ({"b": 2, "s": 40, "hq": 4, "hk": 2, "d": 16}, torch.float32, "fp16 or bf16"),
    ],
)  # fmt: skip
def test_xformers_refuses_what_it_cannot_compute_before_importing_it(case, dtype, match):
    """The refusals come before xFormers' import, so they hold on a CPU without it."""
    parsed = SPEC.parse_case(case)
    inputs = SPEC.make_inputs(parsed, torch.device("cpu"), dtype, torch.Generator().manual_seed(0))
    with pytest.raises(Unsupported, match=match):
        peers.xformers_decode()(*inputs.args, **inputs.kwargs)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "case",
    [
        pytest.param({"lens": (300, 64, 1), "hq": 8, "hk": 2, "d": 128}, id="contiguous-gqa"),
        pytest.param({"lens": (200, 130), "hq": 4, "hk": 4, "d": 64, "page_size": 64, "sq": 3}, id="paged-3-tokens"),
    ],
)  # fmt: skip
def test_xformers_decode_matches_the_reference(case):
    """On a GPU with xFormers (its wheel carried: a run without it fails, it does not skip)."""
    try:
        import xformers  # noqa: F401
    except ImportError as error:
        pytest.fail(f"xformers is not installed ({error}): carry its wheel to the GPU machine")
    parsed = SPEC.parse_case(case)
    inputs = SPEC.make_inputs(parsed, torch.device("cuda"), torch.bfloat16, torch.Generator("cuda").manual_seed(0))
    out = peers.xformers_decode()(*inputs.args, **inputs.kwargs)
    expected = SPEC.reference(*(a.double() if a.is_floating_point() else a for a in inputs.args), **inputs.kwargs)
    torch.testing.assert_close(out.double(), expected, atol=2e-2, rtol=2e-2)
