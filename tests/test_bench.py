"""tritonkit.bench on the CPU: cost arithmetic, provider selection and skip reasons, report writers.
No timing here: timings come from `tritonkit bench` on a GPU and land in benchmarks/results/."""

import json
import re
from pathlib import Path

import pytest
import torch

import tritonkit as tk
from tritonkit import catalog, cli
from tritonkit._core.text import parse_case_tokens
from tritonkit.bench import calibrate, cost, harness, plots, providers, report
from tritonkit.bench.harness import Measurement
from tritonkit.registry import KernelSpec

H200 = cost.Ceilings("NVIDIA H200", 4000.0, {"bfloat16": 800.0, "float16": 790.0})
REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"


# ---------------------------------------------------------------- cost arithmetic
def test_unit_conversions():
    assert cost.gigabytes_per_second(3_000_000_000, 1.0) == pytest.approx(3000.0, rel=1e-12)
    assert cost.teraflops_per_second(2 * 4096**3, 0.2) == pytest.approx(687.194767360, rel=1e-12)
    assert cost.percent_of(3000.0, 4000.0) == 75.0
    assert cost.percent_of(3000.0, None) is None
    assert cost.speedup(2.0, 0.5) == 4.0 and cost.speedup(None, 0.5) is None


def test_compute_bound_backward_counts_the_backward_arithmetic():
    spec = catalog.get("fused_linear_cross_entropy")
    case = {"tokens": 1024, "hidden": 512, "vocab": 4096}
    total = 6 * 1024 * 512 * 4096  # the logits, d(hidden) and d(weight)
    both = cost.throughput(spec, case, torch.bfloat16, 1.0, H200, "fwd+bwd")
    assert both.tflops == pytest.approx(total / 1e-3 / 1e12)
    assert cost.throughput(spec, case, torch.bfloat16, 1.0, H200, "fwd").tflops == pytest.approx(total / 3 / 1e9)
    # no arithmetic model for softmax's backward: no TFLOP/s at all, not 0
    assert cost.throughput(catalog.get("softmax"), {"rows": 8, "n": 64}, torch.float32, 1.0, H200, "bwd").tflops is None


def test_memory_bound_throughput_against_bandwidth():
    result = cost.throughput(catalog.get("add"), {"n": 1 << 20}, torch.bfloat16, 0.002, H200)
    assert result.unit == "GB/s"
    assert result.gbps == pytest.approx(3145.728, rel=1e-12)  # 3 tensors x 2 MiB in 2 us
    assert result.tflops == pytest.approx(0.524288, rel=1e-12)
    assert result.percent == pytest.approx(78.6432, rel=1e-12)


def test_compute_bound_throughput_against_matmul_ceiling():
    spec = catalog.get("matmul_grouped")
    case = {"m": 4096, "n": 4096, "k": 4096}
    result = cost.throughput(spec, case, torch.bfloat16, 0.2, H200)
    assert result.unit == "TFLOP/s"
    assert result.tflops == pytest.approx(687.194767360, rel=1e-12)
    assert result.percent == pytest.approx(85.899345920, rel=1e-12)
    assert cost.throughput(spec, case, torch.float32, 0.2, H200).percent is None  # no fp32 ceiling measured
    assert cost.throughput(spec, case, torch.bfloat16, 0.2, None).percent is None


@pytest.mark.parametrize(
    ("name", "case", "ceiling"),
    [
        ("scaled_linear", {"x": "e4m3", "w": "e4m3"}, 1600.0),
        ("scaled_linear", {"x": "e5m2", "w": "e4m3"}, 1600.0),  # float8's one rate, measured as e4m3
        ("scaled_linear", {"x": "int8", "w": "int8"}, 1500.0),
        ("scaled_linear", {"w": "int8"}, 800.0),  # weight-only: the products run in x's bf16
        ("dynamic_scaled_linear", {"w": "e4m3"}, 1600.0),  # bf16 x quantized to w's format in the kernel
    ],
)
def test_eight_bit_gemms_are_judged_against_their_operands_ceiling(name, case, ceiling):
    ceilings = cost.Ceilings("NVIDIA H200", 4000.0, {"bfloat16": 800.0, "float8_e4m3fn": 1600.0, "int8": 1500.0})
    result = cost.throughput(catalog.get(name), {"m": 4096, "n": 4096, "k": 4096, **case}, torch.bfloat16, 0.2,
                             ceilings)  # fmt: skip
    assert result.tflops == pytest.approx(687.194767360, rel=1e-12)
    assert result.percent == pytest.approx(100 * 687.194767360 / ceiling, rel=1e-12)


def test_speedups_against_the_fastest_baseline():
    def row(provider, ms, skipped=None):
        return Measurement("add", "tutorial", {"n": 1}, "n1", "bfloat16", "fwd", provider, ms=ms, skipped=skipped)

    rows = [row("tritonkit", 0.5), row("torch", 2.0), row("torch.compile", 1.0), row("liger", None, "not installed")]
    harness.fill_speedups(rows)
    assert [r.speedup_vs_best_baseline for r in rows] == [2.0, 0.5, 1.0, None]


def test_input_rotation_and_size_selection():
    assert harness.input_sets_needed(1 << 20, 60 << 20) == 120
    assert harness.input_sets_needed(1 << 30, 60 << 20) == 1
    assert harness.input_sets_needed(16, 60 << 20) == harness.MAX_INPUT_SETS
    assert harness.input_sets_needed(0, 60 << 20) == 1
    spec = catalog.get("matmul")
    sides = {size: [c["m"] for c in harness.bench_cases(spec, size)] for size in harness.SIZES}
    assert sides == {"small": [256, 512], "default": [2048, 4096, 8192], "sweep": [256, 512, 1024, 2048, 4096, 8192]}


def test_given_cases_are_parsed_and_checked_against_the_kernel():
    case = parse_case_tokens(["rows=65536", "n=1024", "bias=false", "eps=1e-5", "shape=16x4096"])
    assert case == {"rows": 65536, "n": 1024, "bias": False, "eps": 1e-5, "shape": (16, 4096)}
    norm = catalog.get("rms_norm")
    given = [{"rows": 65536, "n": 1024, "bias": False}]
    (parsed,) = harness.bench_cases(norm, "sweep", given)
    assert parsed == norm.parse_case(given[0]) and dict(parsed) == given[0] and parsed.eps == 1e-5  # a default
    assert harness.bench_cases(norm, "sweep", None) == list(norm.bench_cases)
    with pytest.raises(ValueError, match="--case expects KEY=VALUE tokens, got 'rows'"):
        parse_case_tokens(["rows"])
    # A word is a string value (kv=int8); the kernel's case type names a key that wants another type.
    assert parse_case_tokens(["kv=int8", "n=wide"]) == {"kv": "int8", "n": "wide"}
    with pytest.raises(ValueError, match="rms_norm: case key 'n' of NormCase must be int, got 'wide'"):
        harness.bench_cases(norm, "sweep", [{"rows": 8, "n": "wide"}])
    decode = catalog.get("decode_attention")
    (quantized,) = harness.bench_cases(decode, "sweep", [parse_case_tokens(["hq=4", "hk=1", "d=16", "kv=int8"])])
    assert quantized.kv == "int8"
    with pytest.raises(ValueError, match="rms_norm: unknown case key\\(s\\) 'cols' for NormCase; its keys are rows, "):
        harness.bench_cases(norm, "sweep", [{"rows": 8, "cols": 8, "bias": False}])
    with pytest.raises(ValueError, match="rms_norm: NormCase needs 'n'"):
        harness.bench_cases(norm, "sweep", [{"rows": 8}])


def test_graph_replays_cover_enough_work():
    # A replay of the cycle of steps is repeated until it covers GRAPH_REPLAY_MS, within MAX_GRAPH_REPEATS.
    replay_ms, most = harness.GRAPH_REPLAY_MS, harness.MAX_GRAPH_REPEATS
    assert harness.graph_repeats(replay_ms / 10) == 10
    assert harness.graph_repeats(replay_ms / 10 + 1e-9) == 10
    assert harness.graph_repeats(replay_ms * 3) == 1
    assert harness.graph_repeats(replay_ms / (10 * most)) == most
    assert harness.graph_repeats(0.0) == 1


# ---------------------------------------------------------------- providers
def _with_peers(peers):
    return KernelSpec(**{**catalog.get("add").__dict__, "name": "add_with_peers", "peers": peers})


def test_base_providers():
    spec = catalog.get("add")
    chosen = providers.select_providers(spec)
    assert [p.name for p in chosen] == ["tritonkit", "torch", "torch.compile"]
    assert chosen[0].fn is spec.fn and chosen[1].fn is spec.reference
    assert [p.is_baseline for p in chosen] == [False, True, True]
    assert all(p.skip_reason is None for p in chosen)
    assert [p.name for p in providers.select_providers(spec, ["torch"])] == ["torch"]


def test_an_in_place_op_checked_on_copies_is_timed_in_place():
    """kv_cache_append is checked through a form that clones the cache and reads it back dequantized (two to three
    times the append's own time): the benchmark's tritonkit provider is the op itself."""
    spec = catalog.get("kv_cache_append")
    (ours,) = providers.select_providers(spec, ["tritonkit"])
    assert spec.fn is not tk.ops.kv_cache_append and ours.fn is tk.ops.kv_cache_append


def test_skip_reasons(monkeypatch):
    monkeypatch.setattr(providers, "_module_available", lambda module: False)
    chosen = providers.select_providers(_with_peers({"liger": lambda: None, "acme": lambda: None}))
    assert [(p.name, p.fn, p.skip_reason) for p in chosen[3:]] == [
        ("liger", None, "liger_kernel is not installed"),
        ("acme", None, "no peer named 'acme' is known to tritonkit.bench"),
    ]
    (unlisted,) = providers.select_providers(catalog.get("add"), ["liger"])
    assert unlisted.skip_reason == "add does not list liger as a peer"


def test_available_peer_is_used(monkeypatch):
    def peer_fn(x, y):
        return x + y

    monkeypatch.setattr(providers, "_module_available", lambda module: True)
    liger = providers.select_providers(_with_peers({"liger": lambda: peer_fn}))[-1]
    assert liger.fn is peer_fn and liger.skip_reason is None


def test_peer_that_fails_capture_is_not_tried_under_cuda_graphs(monkeypatch):
    def peer_fn(x, y):
        return x + y

    peer_fn.fails_graph_capture = "acme's op reads values on the host"
    monkeypatch.setattr(providers, "_module_available", lambda module: True)
    spec = _with_peers({"liger": lambda: peer_fn})
    assert providers.select_providers(spec)[-1].fn is peer_fn  # timed without CUDA graphs
    graphed = providers.select_providers(spec, cuda_graph=True)[-1]
    assert graphed.fn is None and graphed.skip_reason == (
        "not timed under CUDA graphs: acme's op reads values on the host; time it without --cuda-graph"
    )


def test_unknown_provider_is_an_error():
    with pytest.raises(ValueError, match=r"unknown providers \['cutlass'\]"):
        providers.select_providers(catalog.get("add"), ["cutlass"])


# ---------------------------------------------------------------- steps per mode (run on the CPU, not timed)
def test_forward_step():
    from tritonkit.registry import Inputs

    x, y = torch.randn(5), torch.randn(5)
    step = harness.make_step(torch.mul, Inputs((x, y)), "fwd")
    assert torch.equal(step(), x * y) and not x.requires_grad


def test_training_forward_step_builds_the_autograd_graph():
    from tritonkit.registry import Inputs

    x, y = torch.randn(5), torch.randn(5)
    step = harness.make_step(torch.mul, Inputs((x, y)), "fwd-train")
    out = step()
    torch.testing.assert_close(out.detach(), x.detach() * y.detach())
    assert out.requires_grad and out.grad_fn is not None  # what a backward reads is saved, as in training
    assert x.grad is None


def test_training_forward_counts_the_forward_bytes():
    spec, case = catalog.get("rms_norm"), {"rows": 8, "n": 64}
    train = cost.bytes_for_mode(spec, case, torch.bfloat16, "fwd-train")
    assert train == cost.bytes_for_mode(spec, case, torch.bfloat16, "fwd") == 2 * 8 * 64 * 2 + 2 * 64 * 2


def test_forward_backward_step_returns_gradients_without_accumulating():
    from tritonkit.registry import Inputs

    x, y = torch.randn(5), torch.randn(5)
    step = harness.make_step(torch.mul, Inputs((x, y)), "fwd+bwd")
    dx, dy = step()
    # for x * y under any upstream g: dx = g * y and dy = g * x, so dx * x == dy * y
    torch.testing.assert_close(dx * x.detach(), dy * y.detach())
    assert not torch.equal(dx, y.detach())  # the upstream gradient is random, not ones
    again = step()
    torch.testing.assert_close(again[0], dx)  # the same upstream each step, and no .grad kept
    assert x.grad is None and y.grad is None


def test_backward_step_reuses_one_forward():
    from tritonkit.registry import Inputs

    x, y = torch.randn(5), torch.randn(5)
    step = harness.make_step(torch.mul, Inputs((x, y)), "bwd")
    first = step()[0]
    second = step()[0]  # the graph is kept, so the backward alone can be timed again and again
    torch.testing.assert_close(second, first)
    assert x.grad is None


# ---------------------------------------------------------------- reports
def _results():
    rows = []
    for n, ms_tk, ms_torch in ((1 << 20, 0.002, 0.004), (1 << 22, 0.006, 0.012)):
        for provider, ms in (("tritonkit", ms_tk), ("torch", ms_torch)):
            case = {"n": n}
            through = cost.throughput(catalog.get("add"), case, torch.bfloat16, ms, H200)
            rows.append(
                Measurement(
                    "add",
                    "tutorial",
                    case,
                    f"n{n}",
                    "bfloat16",
                    "fwd",
                    provider,
                    ms=ms,
                    gbps=through.gbps,
                    tflops=through.tflops,
                    unit="GB/s",
                    percent_of_ceiling=through.percent,
                    peak_mib=2.0,
                )
            )
        rows.append(
            Measurement(
                "add",
                "tutorial",
                {"n": n},
                f"n{n}",
                "bfloat16",
                "fwd",
                "liger",
                skipped="liger_kernel is not installed",
            )
        )
        harness.fill_speedups(rows[-3:])
    return rows


def test_terminal_table_rows():
    rows = report.rows_for_table(_results())
    assert rows[0] == [
        "add",
        "n1048576",
        "bfloat16",
        "fwd",
        "tritonkit",
        "0.0020",
        "3145.7",
        "-",
        "78.6% GB/s",
        "2.00x",
        "2.0",
        "",
    ]  # a memory-bound kernel shows GB/s only: its TFLOP/s cell is "-", never 0.52 or 0.00
    assert rows[1][4:10] == ["torch", "0.0040", "1572.9", "-", "39.3% GB/s", "1.00x"]  # the best baseline
    assert rows[2][4:] == ["liger", "-", "-", "-", "-", "-", "-", "skipped: liger_kernel is not installed"]
    text = report.terminal_table(_results())
    assert text.splitlines()[0].split()[:6] == ["kernel", "case", "dtype", "mode", "provider", "ms"]


META = {
    "device": "NVIDIA H200",
    "torch": "2.11",
    "triton": "3.6.0",
    "date": "2026-11-21",
    "what": "add",
    "command": "tritonkit bench add",
}


def test_report_files_are_written_and_readable(tmp_path):
    import matplotlib.image

    paths = report.write_all(tmp_path, "2026-11-21-add", _results(), META, H200)
    assert [p.name for p in paths] == [
        "2026-11-21-add.json",
        "2026-11-21-add.md",
        "2026-11-21-add-add-bfloat16-fwd.png",
    ]
    data = json.loads(paths[0].read_text())
    time = data["meta"].pop("time")  # when it was written: it orders the runs of one day for the index
    assert data["meta"] == META and time.startswith("20") and time.endswith("+00:00")
    # the ceilings travel with the rows: the file alone redraws its plots (benchmarks/replot.py)
    assert data["ceilings"] == {"device": "NVIDIA H200", "bandwidth_gbps": 4000.0,
                                "matmul_tflops": {"bfloat16": 800.0, "float16": 790.0}}  # fmt: skip
    assert len(data["results"]) == 6
    assert data["results"][0]["gbps"] == pytest.approx(3145.728) and data["results"][2]["skipped"]
    markdown = paths[1].read_text()
    assert (
        "| add | n1048576 | bfloat16 | fwd | tritonkit | 0.0020 | 3145.7 | - | 78.6% GB/s | 2.00x | 2.0 |  |"
        in markdown
    )
    assert "Ceilings on NVIDIA H200: copy bandwidth 4000 GB/s; matmul TFLOP/s: bfloat16 800, float16 790." in markdown
    assert "![2026-11-21-add-add-bfloat16-fwd](2026-11-21-add-add-bfloat16-fwd.png)" in markdown
    image = matplotlib.image.imread(paths[2])
    assert image.ndim == 3 and image.shape[0] > 300 and image.shape[1] > 500


def test_without_matplotlib_the_json_and_markdown_are_still_written(tmp_path, monkeypatch, capsys):
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    paths = report.write_all(tmp_path, "2026-11-21-add", _results(), META, H200)
    assert [p.name for p in paths] == ["2026-11-21-add.json", "2026-11-21-add.md"]
    assert len(json.loads(paths[0].read_text())["results"]) == 6
    markdown = paths[1].read_text()
    assert "| add | n4194304 | bfloat16 | fwd | tritonkit | 0.0060 |" in markdown
    assert "Plots skipped: matplotlib is not installed" in markdown and ".png" not in markdown
    assert "plots skipped: matplotlib is not installed" in capsys.readouterr().err
    assert list(tmp_path.glob("*.png")) == []


def _row(spec, case, provider="tritonkit", unit="GB/s", rate=100.0, mode="fwd", dtype="bfloat16", **extra):
    return {"spec": spec, "case": case, "case_id": "-".join(f"{k}{v}" for k, v in case.items()), "dtype": dtype,
            "mode": mode, "provider": provider, "ms": 1.0, "unit": unit, "gbps": rate if unit == "GB/s" else 1.0,
            "tflops": rate if unit == "TFLOP/s" else 0.1, **extra}  # fmt: skip


def test_rate_cells_show_the_row_unit_only():
    def cells(**fields):
        return report.rate_cells(Measurement("k", "f", {}, "c", "bfloat16", "fwd", "tritonkit", ms=1.0, **fields))

    assert cells(gbps=3000.0, tflops=0.5, unit="GB/s", percent_of_ceiling=75.0) == ("3000.0", "-", "75.0% GB/s")
    assert cells(gbps=90.0, tflops=500.0, unit="TFLOP/s", percent_of_ceiling=69.4) == ("-", "500.00", "69.4% TFLOP/s")
    # no arithmetic model for the mode: "-" everywhere, whether the row says None or (written before) 0.0
    assert cells(gbps=90.0, tflops=None, unit="TFLOP/s") == ("-", "-", "-")
    assert cells(gbps=91.3, tflops=0.0, unit="TFLOP/s", percent_of_ceiling=0.0) == ("-", "-", "-")
    assert cells(gbps=None, tflops=None) == ("-", "-", "-")


def test_fused_linear_cross_entropy_has_no_zero_teraflops_cells():
    spec = catalog.get("fused_linear_cross_entropy")
    case = {"tokens": 8192, "hidden": 4096, "vocab": 128256}
    through = cost.throughput(spec, case, torch.bfloat16, 48.98, H200, "fwd+bwd")
    row = Measurement(spec.name, spec.family, case, spec.case_id(spec.parse_case(case)), "bfloat16", "fwd+bwd",
                      "tritonkit", ms=48.98, gbps=through.gbps, tflops=through.tflops, unit=through.unit,
                      percent_of_ceiling=through.percent)  # fmt: skip
    (cells,) = report.rows_for_table([row])
    assert cells[6:9] == ["-", f"{6 * 8192 * 4096 * 128256 / 48.98e-3 / 1e12:.2f}", f"{through.percent:.1f}% TFLOP/s"]
    assert through.percent == pytest.approx(100 * through.tflops / 800.0)


def test_every_spec_declares_a_swept_axis_its_bench_cases_vary():
    for spec in catalog.all_specs():
        assert spec.sweep, f"{spec.name} declares no swept axis"
        assert all(spec.sweep in case for case in spec.bench_cases), spec.name
        values = {plots.axis_position(case[spec.sweep]) for case in spec.bench_cases}
        assert len(values) >= 2, f"{spec.name}: its bench cases do not vary {spec.sweep}"


def test_a_plot_per_setting_of_the_other_keys_along_the_axis():
    rows = [
        _row("rms_norm", {"rows": 16384, "n": n, "bias": False}, provider=provider, rate=rate)
        for n, rate in ((4096, 3000.0), (1024, 1000.0), (2048, 2000.0))
        for provider in ("tritonkit", "torch")
    ]
    rows += [
        _row("rms_norm", {"rows": 8, "n": 4096, "bias": False}),  # one point at this setting: no plot
        _row("rms_norm", {"rows": 4096, "n": 65536, "bias": False}),
        _row("rms_norm", {"rows": 16384, "n": 8192, "bias": False}, ms=None),  # not timed: left out
    ]
    (group,) = plots.plot_groups(rows, {"rms_norm": "n"}.get)
    assert (group.axis, group.tied, group.fixed, group.suffix) == ("n", (), (("rows", 16384), ("bias", False)), "")
    assert group.filename("2026-11-22-norm") == "2026-11-22-norm-rms_norm-bfloat16-fwd.png"
    assert group.providers() == ["tritonkit", "torch"]
    assert group.points("tritonkit") == [(1024.0, 1000.0), (2048.0, 2000.0), (4096.0, 3000.0)]  # sorted along n
    assert group.ticks() == [(1024.0, "1024"), (2048.0, "2048"), (4096.0, "4096")]
    assert group.setting() == "rows=16384, bias=False" and group.axis_label() == "n"


def test_shapes_sit_at_their_element_count_and_settings_name_their_plots():
    shapes = ([16384, 1024], [16384, 4096], [16384, 16384])  # as a results file gives them: lists
    rows = [_row("gelu", {"shape": shape, "approximate": a}) for a in ("none", "tanh") for shape in shapes]
    rows.append(_row("gelu", {"shape": [8, 8], "approximate": "exact"}))  # alone at its setting
    groups = plots.plot_groups(rows, {"gelu": "shape"}.get)
    assert [g.filename("r") for g in groups] == ["r-gelu-bfloat16-fwd-approximatenone.png",
                                                 "r-gelu-bfloat16-fwd-approximatetanh.png"]  # fmt: skip
    assert groups[0].axis_label() == "shape (elements)"
    assert groups[0].ticks() == [(16384.0 * 1024, "16384x1024"), (16384.0 * 4096, "16384x4096"),
                                 (16384.0 * 16384, "16384x16384")]  # fmt: skip


def test_keys_equal_to_the_axis_move_with_it():
    rows = [_row("matmul", {"m": s, "n": s, "k": s}, unit="TFLOP/s", rate=s / 16) for s in (256, 1024, 4096)]
    (group,) = plots.plot_groups(rows, {"matmul": "m"}.get)
    assert (group.tied, group.fixed, group.axis_label()) == (("n", "k"), (), "m = n = k")
    assert [x for x, _ in group.points("tritonkit")] == [256.0, 1024.0, 4096.0]
    # a line along m at a fixed n and k (LoRA) keeps them as the setting
    rows = [_row("lora_linear", {"m": m, "k": 4096, "n": 4096, "r": 16}, unit="TFLOP/s") for m in (16, 1024, 8192)]
    rows.append(_row("lora_linear", {"m": 8192, "k": 4096, "n": 11008, "r": 16}, unit="TFLOP/s"))
    (group,) = plots.plot_groups(rows, {"lora_linear": "m"}.get)
    assert group.fixed == (("k", 4096), ("n", 4096), ("r", 16)) and len(group.ticks()) == 3


def test_rows_without_a_rate_and_cases_at_one_x_draw_nothing():
    # fwd+bwd of the fused linear cross-entropy as committed: one case, 0.0 TFLOP/s (no model then)
    rows = [_row("fused_linear_cross_entropy", {"tokens": 8192, "hidden": 4096, "vocab": 128256}, provider=p,
                 unit="TFLOP/s", rate=0.0, mode="fwd+bwd") for p in ("tritonkit", "torch")]  # fmt: skip
    assert plots.plot_groups(rows, {"fused_linear_cross_entropy": "tokens"}.get) == []
    # the in-place cross-entropy run: both cases at vocab 128256, told apart by a flag, not by the axis
    rows = [_row("cross_entropy", {"tokens": 8192, "vocab": 128256, **flag}) for flag in ({}, {"inplace": True})]
    assert plots.plot_groups(rows, {"cross_entropy": "vocab"}.get) == []


def test_single_case_sweeps_get_no_plot(tmp_path):
    rows = _results()[:3]
    assert report.write_plots(tmp_path, "x", rows, H200) == []


# ---------------------------------------------------------------- committed results and their replot
def _replot_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("replot", REPO / "benchmarks" / "replot.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_replot_redraws_from_the_json_alone(tmp_path, capsys):
    replot = _replot_module()
    device = tmp_path / "nvidia-h200"
    report.write_all(device, "2026-11-21-add", _results(), META, H200)
    record = json.loads((device / "2026-11-21-add.json").read_text())
    del record["ceilings"]  # as in files written before the record: rebuilt from the rows' percentages
    (device / "2026-11-21-add.json").write_text(json.dumps(record, indent=2) + "\n")
    rebuilt = replot.ceilings_of(record, device / "2026-11-21-add.md")
    assert rebuilt.device == "NVIDIA H200" and rebuilt.bandwidth_gbps == pytest.approx(4000.0)
    assert rebuilt.matmul_tflops == {"bfloat16": 800.0, "float16": 790.0}  # from the markdown's ceilings line
    (device / "2026-11-21-add-add-bfloat16-fwd.png").unlink()
    (device / "2026-11-21-add-add-bfloat16-fwd-stale.png").write_bytes(b"an old plot")
    cited = "2026-11-22-matmul-matmul_naive-bfloat16-fwd.png"  # benchmarks/results/README.md names it
    (device / cited).write_bytes(b"an old plot a document names")
    header = (device / "2026-11-21-add.md").read_text().split("| kernel |")[0]
    assert replot.main([str(tmp_path), "--prune"]) == 0
    assert sorted(p.name for p in device.glob("*.png")) == ["2026-11-21-add-add-bfloat16-fwd.png", cited]
    markdown = (device / "2026-11-21-add.md").read_text()
    assert markdown.startswith(header) and markdown.count("![") == 1
    out = capsys.readouterr().out
    assert "deleted nvidia-h200/2026-11-21-add-add-bfloat16-fwd-stale.png" in out and "a document names it" in out


def _committed_runs():
    replot = _replot_module()
    for device in sorted(p for p in RESULTS.iterdir() if p.is_dir()):
        for json_path, record in replot.benchmark_runs(device):
            yield json_path, replot.measurements(record)


def test_committed_plots_are_what_the_plotting_rule_draws():
    """Every committed PNG is one the current rule draws from a committed JSON (a line per provider along the
    spec's axis, two x values or more), and each run's markdown links exactly its plots. `python
    benchmarks/replot.py --prune` brings the folder back in line."""
    readme = (REPO / "README.md").read_text()
    drawn, runs = set(), 0
    for json_path, results in _committed_runs():
        runs += 1
        planned = report.planned_plots(json_path.stem, results)
        for name, group in planned:
            assert len(group.ticks()) >= 2 and all(len(group.points(p)) >= 1 for p in group.providers()), name
            assert (json_path.parent / name).is_file(), f"{name} is not drawn: run benchmarks/replot.py"
        drawn |= {json_path.parent.name + "/" + name for name, _ in planned}
        links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", json_path.with_suffix(".md").read_text())
        assert links == [name for name, _ in planned], json_path.name
    assert runs >= 60
    committed = {p.parent.name + "/" + p.name for p in RESULTS.glob("*/*.png")}
    assert {name for name in committed - drawn if name.split("/")[1] not in readme} == set()


# ---------------------------------------------------------------- calibration cache, CLI without a GPU
def test_calibration_cache_round_trip(tmp_path):
    path = tmp_path / "calibration.json"
    assert calibrate.load("NVIDIA H200", path) is None
    calibrate.save(H200, path)
    calibrate.save(cost.Ceilings("NVIDIA H100 80GB HBM3", 3000.0, {"bfloat16": 790.0}), path)
    assert calibrate.load("NVIDIA H200", path) == H200
    assert set(json.loads(path.read_text())) == {"NVIDIA H200", "NVIDIA H100 80GB HBM3"}


@pytest.mark.parametrize("argv", [["bench"], ["bench", "add", "--sizes", "small"], ["bench", "calibrate"]])
def test_bench_without_a_gpu_says_so_and_exits_2(argv, capsys):
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err == "tritonkit bench needs a CUDA GPU; none was found\n" and captured.out == ""


def test_backward_cost_model_of_norms():
    spec = catalog.get("rms_norm")
    case = {"rows": 1024, "n": 4096, "bias": False}
    elements_bytes = 1024 * 4096 * 2
    assert cost.bytes_for_mode(spec, case, torch.bfloat16, "fwd") == 2 * elements_bytes + 2 * 4096 * 2
    assert cost.bytes_for_mode(spec, case, torch.bfloat16, "bwd") == 3 * elements_bytes + 2 * 4096 * 2
    assert cost.bytes_for_mode(spec, case, torch.bfloat16, "fwd+bwd") == 5 * elements_bytes + 4 * 4096 * 2
    fused = {**case, "residual": True, "prenorm": True}
    # x, residual, dy, dh in; one gradient out, which serves as both dx and dresidual
    assert cost.bytes_for_mode(spec, fused, torch.bfloat16, "bwd") == 5 * elements_bytes + 2 * 4096 * 2
    forward_only = KernelSpec(**{**catalog.get("add").__dict__, "has_backward": False, "bytes_moved_bwd": None})
    assert cost.bytes_for_mode(forward_only, {"n": 8}, torch.float32, "bwd") is None
    assert cost.throughput(forward_only, {"n": 8}, torch.float32, 1.0, H200, "bwd") is None


def test_norms_name_liger_and_explain_what_it_cannot_run(monkeypatch):
    monkeypatch.setattr(providers, "_module_available", lambda module: False)
    for name in ("rms_norm", "layer_norm"):
        liger = providers.select_providers(catalog.get(name))[-1]
        assert (liger.name, liger.skip_reason) == ("liger", "liger_kernel is not installed")


def test_backward_flows_from_every_output_and_skips_frozen_inputs():
    from tritonkit.registry import Inputs

    x, y, c = torch.randn(5), torch.randn(5), torch.randn(5)
    step = harness.make_step(lambda x, y, c: (x * c, y * c), Inputs((x, y), {"c": c}, frozenset({"c"})), "fwd+bwd")
    dx, dy = step()
    assert not c.requires_grad
    assert dx is not None and dy is not None  # the second output's backward ran too
