"""tritonkit.bench on the CPU: cost arithmetic, provider selection and skip reasons, report writers.
No timing here: timings come from `tritonkit bench` on a GPU and land in benchmarks/results/."""

import json

import pytest
import torch

from tritonkit import catalog, cli
from tritonkit._core.text import parse_case_tokens
from tritonkit.bench import calibrate, cost, harness, providers, report
from tritonkit.bench.harness import Measurement
from tritonkit.registry import KernelSpec

H200 = cost.Ceilings("NVIDIA H200", 4000.0, {"bfloat16": 800.0, "float16": 790.0})


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
    assert cost.throughput(catalog.get("softmax"), {"rows": 8, "n": 64}, torch.float32, 1.0, H200, "bwd").tflops == 0


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
    with pytest.raises(ValueError, match="--case n=wide: expected an integer"):
        parse_case_tokens(["n=wide"])
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


def test_unknown_provider_is_an_error():
    with pytest.raises(ValueError, match=r"unknown providers \['cublas'\]"):
        providers.select_providers(catalog.get("add"), ["cublas"])


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
        "0.52",
        "78.6% GB/s",
        "2.00x",
        "2.0",
        "",
    ]
    assert rows[1][4:10] == ["torch", "0.0040", "1572.9", "0.26", "39.3% GB/s", "1.00x"]  # the best baseline
    assert rows[2][4:] == ["liger", "-", "-", "-", "-", "-", "-", "skipped: liger_kernel is not installed"]
    text = report.terminal_table(_results())
    assert text.splitlines()[0].split()[:6] == ["kernel", "case", "dtype", "mode", "provider", "ms"]


def test_report_files_are_written_and_readable(tmp_path):
    import matplotlib.image

    meta = {
        "device": "NVIDIA H200",
        "torch": "2.11",
        "triton": "3.6.0",
        "date": "2026-11-21",
        "what": "add",
        "command": "tritonkit bench add",
    }
    paths = report.write_all(tmp_path, "2026-11-21-add", _results(), meta, H200)
    assert [p.name for p in paths] == [
        "2026-11-21-add.json",
        "2026-11-21-add.md",
        "2026-11-21-add-add-bfloat16-fwd.png",
    ]
    data = json.loads(paths[0].read_text())
    assert data["meta"] == meta and len(data["results"]) == 6
    assert data["results"][0]["gbps"] == pytest.approx(3145.728) and data["results"][2]["skipped"]
    markdown = paths[1].read_text()
    assert (
        "| add | n1048576 | bfloat16 | fwd | tritonkit | 0.0020 | 3145.7 | 0.52 | 78.6% GB/s | 2.00x | 2.0 |  |"
        in markdown
    )
    assert "Ceilings on NVIDIA H200: copy bandwidth 4000 GB/s; matmul TFLOP/s: bfloat16 800, float16 790." in markdown
    assert "![2026-11-21-add-add-bfloat16-fwd](2026-11-21-add-add-bfloat16-fwd.png)" in markdown
    image = matplotlib.image.imread(paths[2])
    assert image.ndim == 3 and image.shape[0] > 300 and image.shape[1] > 500


def test_single_case_sweeps_get_no_plot(tmp_path):
    rows = _results()[:3]
    assert report.write_plots(tmp_path, "x", rows, H200) == []


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
    assert cost.bytes_for_mode(catalog.get("add"), {"n": 8}, torch.float32, "bwd") is None
    assert cost.throughput(catalog.get("add"), {"n": 8}, torch.float32, 1.0, H200, "bwd") is None


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
