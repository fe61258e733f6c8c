"""The `tritonkit` command: list, show, check, help and exit codes."""

import dataclasses
import subprocess
import sys

import pytest

from tritonkit import catalog, cli, registry
from tritonkit.registry import KernelSpec


def test_list_prints_every_kernel(capsys):
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["name", "family", "tags", "backward", "status"]
    for spec in catalog.all_specs():
        assert f"\n{spec.name} " in out


def test_list_by_tag(capsys):
    assert cli.main(["list", "--tag", "image"]) == 0
    rows = capsys.readouterr().out.splitlines()[2:]
    assert [row.split()[0] for row in rows] == ["rgb_to_grey"]


def test_show(capsys):
    assert cli.main(["show", "rgb_to_grey"]) == 0
    out = capsys.readouterr().out
    assert "usage:        grey = tk.ops.rgb_to_grey(img)" in out
    assert "dtypes:       float32, float16, bfloat16, uint8" in out
    assert "bench cases:  h256-w256; h512-w512; " in out
    assert "case keys:    h, w, channels_last=False" in out  # the keys `--case` takes, with their defaults


def test_show_unknown_name(capsys):
    assert cli.main(["show", "nope"]) == 2
    assert "no kernel named 'nope'" in capsys.readouterr().err


def test_check_selected_kernels(capsys):
    assert cli.main(["check", "add", "copy", "--dtype", "bfloat16", "--seed", "7"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("No CUDA GPU in use: running through the Triton interpreter")
    rows = [line for line in out.splitlines() if line.startswith(("add ", "copy "))]
    # a row per case, and a "+grad" row per case with every gradient checked too
    assert len(rows) == 2 * (len(catalog.get("add").test_cases) + len(catalog.get("copy").test_cases))
    assert all("bfloat16" in row.split() and row.endswith("pass") for row in rows)
    assert out.rstrip().endswith(f"{len(rows)} passed, 0 failed")


def test_check_by_tag_runs_only_that_family(capsys):
    assert cli.main(["check", "--tag", "matmul", "--dtype", "float16"]) == 0
    rows = [line.split()[0] for line in capsys.readouterr().out.splitlines() if line.startswith("matmul")]
    assert set(rows) == {"matmul", "matmul_naive", "matmul_grouped", "matmul_autotuned", "matmul_persistent"}


def test_check_fails_on_a_wrong_kernel(capsys, monkeypatch):
    add = catalog.get("add")
    broken = KernelSpec(**{**add.__dict__, "name": "broken_add", "fn": lambda x, y: x - y})
    monkeypatch.setitem(registry._REGISTRY, "broken_add", broken)
    assert cli.main(["check", "broken_add", "--dtype", "float32"]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "elements off" in out
    assert out.rstrip().endswith("2 passed, 8 failed")  # only the empty case passes, forward and gradients


def test_check_reports_a_crashing_kernel(capsys, monkeypatch):
    add = catalog.get("add")

    def crash(x, y):
        raise RuntimeError("boom")

    monkeypatch.setitem(
        registry._REGISTRY, "crashing_add", KernelSpec(**{**add.__dict__, "name": "crashing_add", "fn": crash})
    )
    assert cli.main(["check", "crashing_add", "--dtype", "float16"]) == 1
    assert "raised RuntimeError('boom')" in capsys.readouterr().out


def test_check_given_cases(capsys):
    assert cli.main(["check", "rms_norm", "--dtype", "float32", "--case", "rows=3", "n=70", "residual=true",
                     "--case", "rows=2", "n=5", "bias=false"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    labels = [line.split()[1] for line in out.splitlines() if line.startswith("rms_norm ")]
    assert labels == ["rows3-n70-residualTrue", "rows3-n70-residualTrue", "rows2-n5-biasFalse", "rows2-n5-biasFalse"]
    assert out.rstrip().endswith("4 passed, 0 failed")


def test_check_defers_a_case_that_runs_out_of_memory(monkeypatch):
    """Beside other workers a GPU case may not fit: it leaves no row, is named, and runs again by its label alone."""
    import torch

    from tritonkit import check, testing

    run_case = testing.run_case

    def short_of_memory(spec, case, dtype, device, seed=None, grad_mode=None):
        if grad_mode is not None:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 7.83 GiB.")
        return run_case(spec, case, dtype, device, seed=seed, grad_mode=grad_mode)

    monkeypatch.setattr(testing, "run_case", short_of_memory)
    job = check.Job("add", ("float32",), ({"n": 5}, {"n": 7}), 0, "cpu", False)
    rows, _, deferred = check.check_kernel(job, defer_out_of_memory=True)
    assert [row.label for row in rows] == ["n5", "n7"] and all(row.ok for row in rows)
    assert deferred == ("n5 +grad", "n7 +grad")
    monkeypatch.setattr(testing, "run_case", run_case)
    rows, _, deferred = check.check_kernel(dataclasses.replace(job, only=deferred))
    assert [(row.label, row.ok) for row in rows] == [("n5 +grad", True), ("n7 +grad", True)] and deferred == ()


def test_check_reports_out_of_memory_when_not_deferring(monkeypatch):
    import torch

    from tritonkit import check, testing

    def short_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory.")

    monkeypatch.setattr(testing, "run_case", short_of_memory)
    rows, _, deferred = check.check_kernel(check.Job("add", ("float32",), ({"n": 5},), 0, "cpu", False))
    assert [row.ok for row in rows] == [False, False] and "out of memory" in rows[0].detail and deferred == ()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["check", "rms_norm", "--case", "rows=3", "n=8", "resdual=true"], "rms_norm: unknown case key(s) 'resdual'"),
        (["check", "--tag", "norm", "--case", "rows=3"], "layer_norm: NormCase needs 'n'"),
        (["check", "add", "--case", "n=7", "stride=0.5"], "case key 'stride' of VectorCase must be int, got 0.5"),
        (["check", "add", "--case", "n"], "--case expects KEY=VALUE tokens, got 'n'"),
    ],
)
def test_check_refuses_a_misspelt_case_key(argv, message, capsys):
    assert cli.main(argv) == 2
    assert message in capsys.readouterr().err


def test_check_streams_rows_and_times_each_family(capsys):
    """The header first, then each case's row as it finishes, then the time each family took and the totals."""
    assert cli.main(["check", "add", "rgb_to_grey", "--dtype", "float32"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split() == ["kernel", "case", "dtype", "max", "abs", "err", "max", "rel", "err", "result"]
    rows = [line.split()[0] for line in lines[3:-3]]
    assert rows == ["add"] * 2 * len(catalog.get("add").test_cases) + ["rgb_to_grey"] * 2 * len(
        catalog.get("rgb_to_grey").test_cases
    )
    assert lines[-3].startswith("time by family (1 worker, ") and "tutorial " in lines[-3]
    assert lines[-2].startswith("slowest: ") and "add float32 " in lines[-2] and "rgb_to_grey float32 " in lines[-2]
    assert lines[-1] == f"{len(rows)} passed, 0 failed"


def test_check_in_worker_processes(capsys):
    """--jobs 2: each kernel checked in a process of its own (spawned, so CUDA would work there), same rows."""
    assert cli.main(["check", "add", "copy", "--dtype", "float16", "--jobs", "2", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    rows = [line.split()[0] for line in out.splitlines() if line.startswith(("add ", "copy "))]
    assert sorted(rows) == sorted(
        ["add"] * 2 * len(catalog.get("add").test_cases) + ["copy"] * 2 * len(catalog.get("copy").test_cases)
    )
    assert "time by family (2 workers, " in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["check", "rms_norm", "--dtype", "uint8"], "--dtype uint8: no selected kernel takes it (rms_norm: float32, "),
        (["list", "--tag", "nosuch"], "no kernel is tagged 'nosuch' or of that family; tags: "),
        (["bench", "nosuch"], "no kernel named 'nosuch'"),
        (["bench", "--tag", "nosuch"], "nothing to benchmark: no kernel is tagged 'nosuch'"),
    ],
)
def test_an_empty_or_impossible_selection_is_named(argv, message, capsys):
    assert cli.main(argv) == 2
    assert message in capsys.readouterr().err


def test_check_unknown_kernel_exits_2(capsys):
    assert cli.main(["check", "nope"]) == 2


def test_check_empty_selection_exits_2(capsys):
    assert cli.main(["check", "--tag", "no-such-tag"]) == 2
    assert "nothing to check: no kernel is tagged 'no-such-tag'" in capsys.readouterr().err


@pytest.mark.parametrize("command", [[], ["list"], ["show"], ["check"]])
def test_help_on_every_command(command):
    result = subprocess.run(
        [sys.executable, "-m", "tritonkit", *command, "--help"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0 and result.stdout.startswith("usage: tritonkit")
