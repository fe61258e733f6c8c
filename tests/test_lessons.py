"""Every lesson of `tritonkit learn` runs under the interpreter (its own asserts check its results).

The greyscale lesson reads matplotlib's sample image and the matmul, fused-kernel and quantization lessons plot
with matplotlib: it comes with the `dev` extra that CI installs, so it is required here, not skipped. The
auto-tuning lesson compiles for sm_90 in a subprocess (Triton's compiler and ptxas run without a GPU).
"""

from __future__ import annotations

import importlib
import re

import pytest

from tritonkit.learn import lessons, run_lesson

LESSONS = lessons()


def test_eleven_lessons_in_order():
    assert [number for number, _ in LESSONS] == list(range(1, 12))


@pytest.mark.parametrize("number", [n for n, _ in LESSONS], ids=[name.rsplit(".", 1)[1] for _, name in LESSONS])
def test_lesson_runs(number, tmp_path, capsys):
    assert run_lesson(number, str(tmp_path)) == 0
    printed = capsys.readouterr().out
    assert importlib.import_module(dict(LESSONS)[number]).__doc__.strip() in printed
    if number == 4:
        assert (tmp_path / "grace_hopper_grey.png").stat().st_size > 10_000
    if number == 5:
        assert (tmp_path / "matmul_ladder.png").stat().st_size > 10_000
        assert "0  2  4  6" in printed  # grouped order: GROUP_SIZE tile-rows walked column by column
    if number == 6:
        assert "b_peak" in printed  # the breakpoint hook printed the kernel's locals
    if number == 7:  # each of the four steps checked against torch, and the causal kernel's skipped blocks
        assert printed.count("max abs error") == 4
        assert "key blocks visited by query blocks 0..6: [1, 2, 3, 4, 5, 6, 7]" in printed
    if number == 8:  # the memory of each step counted, and the timelines plotted
        assert len(re.findall(r"peak +\d+\.\d\d MiB", printed)) == 5 and "(1.00 activations)" in printed
        assert (tmp_path / "fused_kernels_memory.png").stat().st_size > 10_000
    if number == 9:  # the lesson's kernels equal the production ops bit for bit, and the error plot
        for check in (
            "tk.ops.quantize(x, torch.int8, granularity='row'): True",
            "granularity='group'): True",
            "equal to tk.ops.nf4_quantize: True",
            "equal to tk.ops.nf4_dequantize: True",
        ):
            assert check in printed
        assert (tmp_path / "quantization_error.png").stat().st_size > 10_000
    if number == 10:  # the autotuner's runs per key, and the configs compiled for sm_90 on the CPU
        assert "ran 6 configs (6 runs)" in printed and "ran 0 configs (0 runs)" in printed
        assert re.search(r"64x64x32 w4 s3 +24576 B", printed)  # three stages of a 64 x 32 tile of A and of B
    if number == 11:  # TMA loads, or none where the fallback ran; the schedule seen in the kernel's stores; the plot
        assert len(re.findall(r" [1-9]\d* tiles loaded through descriptors", printed)) == 2
        assert len(re.findall(r"\b0 tiles loaded through descriptors", printed)) == 1
        assert "C right, its stores in this order" in printed
        assert "   0/0  2/0  4/0  1/1" in printed  # 2-row groups walked column by column, tile t to program t % 5
        text = importlib.import_module(dict(LESSONS)[number]).__doc__
        assert "persistent 719, cuBLAS 679, autotuned 598" in printed and "719 TFLOP/s, cuBLAS" in text
        assert (tmp_path / "persistent_tma.png").stat().st_size > 10_000


def test_cli_lists_and_prints_source(capsys):
    from tritonkit.cli import main

    assert main(["learn"]) == 0
    listing = capsys.readouterr().out
    assert "6. Debugging inside a kernel with breakpoint_if." in listing
    assert "7. Flash attention forward, built in four steps." in listing
    assert "10. Auto-tuning: what block sizes, num_warps and num_stages change" in listing
    assert "11. The matmul ladder's last rung: a persistent kernel that moves its tiles with TMA." in listing
    assert main(["learn", "2", "--source"]) == 0
    assert "def which_program_kernel" in capsys.readouterr().out
    assert main(["learn", "12"]) == 2


@pytest.mark.gpu
@pytest.mark.parametrize("number", [n for n, _ in LESSONS])
def test_lesson_runs_compiled(number, tmp_path):
    assert run_lesson(number, str(tmp_path)) == 0
