"""tritonkit.bench.attention_peers on the CPU: SDPA (its CPU flash backend) and FlexAttention (eager) against a
float64 attention written from the definition, the refusals, the masks and score_mod, the peers' registration, and
benchmarks/attention_table.py (a dry run end to end, the comparison from a timed run's rows)."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
import warnings
from pathlib import Path

import pytest
import torch

from tritonkit import catalog
from tritonkit.bench import attention_peers as peers
from tritonkit.bench import plots, providers
from tritonkit.bench.attention_peers import Unsupported

REPO = Path(__file__).resolve().parents[1]


def visibility(sq, sk, causal, window) -> torch.Tensor:
    """[Sq, Sk] from the definition, one pair at a time: query i sits at key i + Sk - Sq and sees keys from
    left before it to right after it (causal: none after it)."""
    left, right = window
    right = 0 if causal else right
    seen = torch.zeros(sq, sk, dtype=torch.bool)
    for i in range(sq):
        for j in range(sk):
            position = i + sk - sq
            seen[i, j] = (left < 0 or j >= position - left) and (right < 0 or j <= position + right)
    return seen


def naive(q, k, v, causal=False, scale=None, window=(-1, -1), softcap=0.0):
    """(out, lse) of (B, H, S, D) float64 tensors; a row that sees no key gives 0 and lse -inf."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = q @ k.transpose(-1, -2) * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    scores = scores.masked_fill(~visibility(q.shape[2], k.shape[2], causal, window), -math.inf)
    lse = torch.logsumexp(scores, dim=-1)
    return torch.exp(scores - lse[..., None]).nan_to_num(0.0) @ v, lse


def tensors(b, hq, hk, sq, sk, d, layout="bhsd"):
    generator = torch.Generator().manual_seed(0)
    shapes = [(b, h, s, d) for h, s in ((hq, sq), (hk, sk), (hk, sk))]
    q, k, v = (torch.randn(shape, generator=generator, dtype=torch.float64) for shape in shapes)
    return (q, k, v) if layout == "bhsd" else tuple(t.transpose(1, 2).contiguous() for t in (q, k, v))


def heads_first(x, layout):
    return x if layout == "bhsd" else x.transpose(1, 2)


SDPA_CASES = [
    pytest.param((1, 2, 2, 17, 23, 16), {}, id="mha-noncausal-sq17-sk23"),
    pytest.param((2, 4, 2, 20, 20, 32), {"causal": True}, id="gqa-causal"),
    pytest.param((1, 4, 1, 9, 9, 8), {"causal": True, "window": (-1, 7), "scale": 0.3}, id="mqa-causal-scale"),
    pytest.param((1, 2, 2, 12, 12, 16), {"window": (-1, 0)}, id="window-right0-is-causal"),
    pytest.param((2, 4, 2, 15, 19, 16), {"layout": "bshd"}, id="bshd"),
]


@pytest.mark.parametrize(("shape", "options"), SDPA_CASES)
def test_sdpa_flash_matches_float64_attention(shape, options):
    layout = options.get("layout", "bhsd")
    q, k, v = tensors(*shape, layout=layout)
    out = peers.sdpa_flash()(q, k, v, **options)
    assert out.shape == q.shape
    expected, _ = naive(*(heads_first(t, layout) for t in (q, k, v)),
                        **{key: value for key, value in options.items() if key != "layout"})  # fmt: skip
    torch.testing.assert_close(heads_first(out, layout), expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("factory", [peers.sdpa_flash, peers.sdpa_cudnn])
def test_sdpa_refuses_what_it_cannot_compute_as_tritonkit_does(factory):
    run = factory()
    q, k, v = tensors(1, 2, 2, 8, 8, 16)
    q_short = q[:, :, :5]
    with pytest.raises(Unsupported, match="no sliding window \\(window=\\(3, 0\\)\\)"):
        run(q, k, v, causal=True, window=(3, -1))
    with pytest.raises(Unsupported, match="no sliding window"):
        run(q, k, v, window=(-1, 2))
    with pytest.raises(Unsupported, match=r"aligns the diagonal top-left.*here 5 and 8"):
        run(q_short, k, v, causal=True)
    with pytest.raises(Unsupported, match="no softcap"):
        run(q, k, v, softcap=30.0)
    with pytest.raises(Unsupported, match="no log-sum-exp"):
        run(q, k, v, return_lse=True)
    with pytest.raises(ValueError, match="layout must be one of"):
        run(q, k, v, layout="sbhd")
    assert issubclass(Unsupported, ValueError)


def test_sdpa_is_causal_follows_tritonkits_window_rule():
    def is_causal(causal, window, sq=8, sk=8):
        return peers.sdpa_is_causal("sdpa", sq, sk, causal, window)

    assert not is_causal(False, (-1, -1))
    assert is_causal(True, (-1, -1)) and is_causal(True, (-1, 9)) and is_causal(False, (-1, 0))  # causal: right 0
    assert not is_causal(False, (-1, -1), sq=3)  # non-causal: any lengths
    with pytest.raises(Unsupported):
        is_causal(True, (-1, -1), sq=1)  # one query (decoding) sees every key bottom-right, only key 0 top-left


FLEX_CASES = [
    pytest.param((1, 2, 2, 17, 23, 16), {}, id="noncausal"),
    pytest.param((1, 4, 2, 40, 33, 16), {"causal": True}, id="gqa-causal-sq-gt-sk-empty-rows"),
    pytest.param((1, 2, 1, 20, 150, 16), {"causal": True}, id="causal-sq-lt-sk"),
    pytest.param((1, 2, 2, 40, 40, 16), {"window": (5, 3), "softcap": 2.0}, id="window-softcap"),
    pytest.param((2, 4, 1, 30, 30, 8), {"causal": True, "window": (4, -1), "scale": 0.5}, id="mqa-causal-left"),
    pytest.param((1, 4, 2, 19, 25, 16), {"causal": True, "layout": "bshd"}, id="bshd"),
]


@pytest.mark.parametrize(("shape", "options"), FLEX_CASES)
def test_flex_attention_matches_float64_attention(shape, options):
    layout = options.get("layout", "bhsd")
    q, k, v = tensors(*shape, layout=layout)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        out, lse = peers.flex_attention(compiled=False)(q, k, v, return_lse=True, **options)
    expected, expected_lse = naive(*(heads_first(t, layout) for t in (q, k, v)),
                                   **{key: value for key, value in options.items() if key != "layout"})  # fmt: skip
    torch.testing.assert_close(heads_first(out, layout), expected, rtol=1e-10, atol=1e-10)
    assert lse.shape == expected_lse.shape  # (B, Hq, Sq) in both layouts, as tritonkit's
    torch.testing.assert_close(lse.double(), expected_lse, rtol=1e-6, atol=1e-6)  # kept in float32 by flex


def test_eager_flex_attention_takes_a_second_softcap_and_shape():
    """Eager flex traces score_mod with dynamo; a second softcap and shape recompiles, which must not turn the
    softcap into a symbolic float (torch 2.15's flex op refuses one)."""
    for shape, softcap in (((1, 2, 2, 40, 40, 16), 2.0), ((1, 4, 4, 48, 48, 32), 50.0), ((1, 2, 1, 27, 31, 8), 3.0)):
        q, k, v = tensors(*shape)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
            out = peers.flex_attention(compiled=False)(q, k, v, causal=True, window=(8, -1), softcap=softcap)
        expected, _ = naive(q, k, v, causal=True, window=(8, -1), softcap=softcap)
        torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)


MASKS = [(7, 7, True, (-1, -1)), (9, 5, True, (-1, -1)), (5, 9, True, (2, -1)), (8, 8, False, (1, 2)),
         (6, 11, False, (-1, 3)), (6, 6, False, (0, 0)), (10, 4, False, (2, -1))]  # fmt: skip


@pytest.mark.parametrize(("sq", "sk", "causal", "window"), MASKS)
def test_mask_mods_give_the_defined_visibility(sq, sk, causal, window):
    mask_mod = peers.mask_mod_for(sq, sk, causal, window)
    q_idx, kv_idx = torch.arange(sq)[:, None], torch.arange(sk)[None, :]
    got = mask_mod(torch.tensor(0), torch.tensor(0), q_idx, kv_idx).expand(sq, sk)
    assert torch.equal(got, visibility(sq, sk, causal, window))


def test_no_mask_when_every_key_is_visible_and_block_masks_are_cached():
    assert peers.mask_mod_for(8, 8, False, (-1, -1)) is None
    assert peers.block_mask_for(8, 8, False, (-1, -1), "cpu") is None
    first = peers.block_mask_for(40, 33, True, (-1, -1), "cpu")
    assert first is not None and peers.block_mask_for(40, 33, True, (-1, 5), torch.device("cpu")) is first
    assert peers.block_mask_for(40, 33, True, (4, -1), "cpu") is not first


def test_softcap_score_mod():
    score_mod = peers.softcap_score_mod(5.0)
    assert peers.softcap_score_mod(5.0) is score_mod  # one function per value: no recompiles
    scores = torch.tensor([-100.0, -1.0, 0.0, 2.0, 100.0], dtype=torch.float64)
    zero = torch.tensor(0)
    torch.testing.assert_close(score_mod(scores, zero, zero, zero, zero), 5.0 * torch.tanh(scores / 5.0))


def test_the_attention_peers_are_registered_and_set_up(monkeypatch):
    assert {providers.PEERS[name] for name in ("sdpa-flash", "sdpa-cudnn", "flex")} == {"torch"}
    assert "flex" in providers.COMPILED
    assert {"sdpa-flash", "sdpa-cudnn", "flex"} <= plots.STYLES.keys()
    attention = catalog.get("attention")
    wanted = ["tritonkit", "sdpa-flash", "sdpa-cudnn", "flex"]
    chosen = {p.name: p for p in providers.select_providers(attention, wanted)}
    assert [name for name, p in chosen.items() if p.fn is None] == []
    assert chosen["flex"].fn.__name__ == "flex_attention" and chosen["sdpa-cudnn"].fn.__name__ == "sdpa_cudnn"

    def broken():
        raise ImportError("no FlexAttention in this torch")

    monkeypatch.setitem(attention.peers, "flex", broken)
    (flex,) = providers.select_providers(attention, ["flex"])
    assert (flex.fn, flex.skip_reason) == (None, "could not be set up: ImportError: no FlexAttention in this torch")


# ---------------------------------------------------------------- benchmarks/attention_table.py


@pytest.fixture(scope="module")
def table():
    spec = importlib.util.spec_from_file_location("attention_table", REPO / "benchmarks" / "attention_table.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up while the class is made
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def test_table_rows_and_their_selection(table):
    names = [row.name for row in table.ROWS]
    assert len(names) == len(set(names)) == 16
    assert [row.name for row in table.select_rows(True, None)] == [
        "fwd-noncausal", "fwd+bwd-noncausal", "fwd-causal", "fwd+bwd-causal", "fwd-gqa", "fwd-window",
        "fwd+bwd-window"]  # fmt: skip
    assert [row.name for row in table.select_rows(False, "*varlen,fwd-d64")] == ["fwd-d64", "fwd-varlen",
                                                                                  "fwd+bwd-varlen"]  # fmt: skip
    with pytest.raises(SystemExit, match="matches none"):
        table.select_rows(False, "nothing")
    attention = catalog.get("attention")
    for row in table.ROWS:  # every row is a valid case of the spec, and its tiny form keeps GQA and the window
        attention.parse_case(row.case)
        small = table.tiny(row)
        assert small.case["hq"] // small.case["hk"] == row.case["hq"] // row.case["hk"]
        assert (small.case.get("left", -1) >= 0) == (row.case.get("left", -1) >= 0)
    (varlen,) = [row for row in table.ROWS if row.name == "fwd-varlen"]
    tokens = varlen.case["b"] * varlen.case["sq"]
    assert sum(varlen.varlen) == tokens and len(varlen.varlen) == 4
    catalog.get("attention_varlen").parse_case(table.varlen_case(varlen))


def test_dry_run_end_to_end(table, tmp_path, capsys):
    assert table.main(["--dry-run", "--out", str(tmp_path), "--rows", "fwd-window,fwd+bwd-varlen"]) == 0
    (record_path,) = tmp_path.glob("*-attention-table.json")
    record = json.loads(record_path.read_text())
    assert record["meta"]["dry_run"]
    assert [row["name"] for row in record["meta"]["rows"]] == ["fwd-window", "fwd+bwd-varlen"]
    by = {(r["spec"], r["mode"], r["provider"]): r["skipped"] for r in record["results"]}
    assert by["attention", "fwd", "tritonkit"].startswith("dry run: ran; max abs error")
    assert by["attention", "fwd", "flex"].startswith("dry run: ran; max abs error")
    assert by["attention", "fwd", "sdpa-flash"] == "failed: Unsupported: sdpa-flash: SDPA has no sliding window " \
                                                   "(window=(8, 0))"  # fmt: skip
    assert by["attention_varlen", "fwd+bwd", "tritonkit"] == "dry run: ran; 3 gradients, finite"
    assert by["attention", "fwd+bwd", "sdpa-flash"] == "dry run: ran; 3 gradients, finite"
    errors = [float(text.split("error ")[1].split()[0]) for text in by.values() if "error" in text]
    assert errors and max(errors) < 1e-4
    peers_md = (record_path.parent / f"{record_path.stem}-peers.md").read_text()
    assert "refused: sdpa-flash: SDPA has no sliding window" in peers_md
    assert "| varlen 4 × 4096, causal, H32 d128 (peers: dense B4) | fwd+bwd | ran; 3 gradients, finite |" in peers_md
    assert "Attention against its peers" in capsys.readouterr().out


def _timed_row(spec, case_id, mode, provider, ms, tflops=None, skipped=None):
    return {"spec": spec, "case_id": case_id, "mode": mode, "provider": provider, "ms": ms, "tflops": tflops,
            "skipped": skipped}  # fmt: skip


def test_comparison_ratios_footnotes_and_charts(table, tmp_path):
    rows = [
        {"name": "fwd-causal", "label": "causal", "mode": "fwd", "case_id": "c"},
        {"name": "fwd-window", "label": "window", "mode": "fwd", "case_id": "w"},
        {"name": "fwd-varlen", "label": "varlen", "mode": "fwd", "case_id": "c", "varlen_case_id": "v"},
    ]
    results = [
        _timed_row("attention", "c", "fwd", "tritonkit", 1.0, 500.0),
        _timed_row("attention", "c", "fwd", "sdpa-flash", 1.5, 333.0),
        _timed_row("attention", "c", "fwd", "sdpa-cudnn", 0.8, 625.0),
        _timed_row("attention", "c", "fwd", "flex", 2.0, 250.0),
        _timed_row("attention", "w", "fwd", "tritonkit", 0.5, 300.0),
        _timed_row("attention", "w", "fwd", "sdpa-flash", None, skipped="failed: Unsupported: SDPA has no window"),
        _timed_row("attention", "w", "fwd", "sdpa-cudnn", None, skipped="failed: Unsupported: SDPA has no window"),
        _timed_row("attention", "w", "fwd", "flex", 1.0, 150.0),
        _timed_row("attention_varlen", "v", "fwd", "tritonkit", 1.1, 455.0),
    ]
    lines, notes = table.comparison(results, rows)
    assert [(line["vs_cudnn"], line["vs_flex"]) for line in lines] == [("0.80×", "2.00×"), ("-", "2.00×"),
                                                                       ("0.73×", "1.82×")]  # fmt: skip
    assert lines[0]["cells"]["tritonkit"] == "1.000 ms, 500 TFLOP/s"
    assert lines[1]["cells"]["sdpa-flash"] == "n/a [1]" and lines[1]["cells"]["sdpa-cudnn"] == "n/a [2]"
    assert notes == ["SDPA FA2: refused: SDPA has no window", "SDPA cuDNN: refused: SDPA has no window"]
    assert lines[2]["cells"]["tritonkit"] == "1.100 ms, 455 TFLOP/s"  # the varlen op against the dense peers
    assert lines[2]["note"] == "dense tritonkit 1.000 ms; varlen / dense 1.10"
    meta = {"rows": rows, "device": "GPU X", "dtype": "bfloat16", "command": "attention_table.py --out x"}
    written = table.write_comparison(tmp_path, "run", results, meta)
    assert [path.name for path in written] == ["run-peers.md", "run-peers-fwd.png"]
    text = written[0].read_text()
    assert "| causal | fwd | 1.000 ms, 500 TFLOP/s | 1.500 ms, 333 TFLOP/s | 0.800 ms, 625 TFLOP/s |" in text
    assert "[1] SDPA FA2: refused: SDPA has no window" in text and "![run-peers-fwd](run-peers-fwd.png)" in text
    assert written[1].read_bytes()[:4] == b"\x89PNG"
