"""Checks that need the compiled (non-interpreted) path, run on the CPU in fresh processes."""

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent


def _run_without_interpreter(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, timeout=600)


def test_every_kernel_and_debug_helper_compiles_for_hopper():
    """The script derives what it compiles from the registry's cases and the puzzles (it fails naming any library
    kernel no case launches): every library kernel and puzzle solution compiles, in every variant the cases reach."""
    result = _run_without_interpreter(str(HERE / "compile_for_hopper.py"))
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert all("bytes of sm_90 code" in line for line in lines), result.stdout
    compiled = {line.split(" [")[0].split(":")[0] for line in lines}
    from tritonkit import catalog, puzzles

    kernels = {name for name in compiled if name.startswith("tritonkit.ops.")}
    assert {name.split(".")[2] for name in kernels} == set(catalog.family_packages())
    assert sum(name.startswith("tritonkit.puzzles.") for name in compiled) == sum(
        len(puzzle.kernels) for puzzle in puzzles.all_puzzles()
    )


def test_cpu_tensors_without_the_interpreter_are_refused_by_name():
    script = (
        "import torch, tritonkit as tk\n"
        "for call in (lambda: tk.ops.add(torch.ones(3), torch.ones(3)),\n"
        "             lambda: tk.ops.matmul(torch.ones(2, 2), torch.ones(2, 2)),\n"
        "             lambda: tk.ops.rgb_to_grey(torch.ones(3, 2, 2))):\n"
        "    try:\n"
        "        call()\n"
        "    except ValueError as error:\n"
        "        print(error)\n"
    )
    result = _run_without_interpreter("-c", script)
    lines = result.stdout.splitlines()
    assert len(lines) == 3, result.stdout + result.stderr
    for line, name in zip(lines, ("x", "a", "img"), strict=True):
        assert line.startswith(f"{name} is on cpu, but compiled Triton kernels need CUDA tensors"), line


def test_variants_only_a_forced_plan_reaches_compile_for_hopper():
    """Kernel variants that compile_for_hopper.py's recorded cases do not reach (plans_for_hopper.py lists them)
    compile for sm_90 too."""
    result = _run_without_interpreter(str(HERE / "plans_for_hopper.py"))
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert len(lines) == 9, result.stdout
    assert all("bytes of sm_90 code" in line for line in lines), result.stdout
    assert sum(line.startswith(("_decode_kernel [PDL]", "_decode_reduce_kernel [PDL]")) for line in lines) == 4
    assert sum(line.startswith("_decode_kernel [PDL] [") and "by halves]" in line for line in lines) == 2
    gemv = [line for line in lines if line.startswith("_gemv_")]
    assert len(gemv) == 3 and all("[two launches]" in line for line in gemv), result.stdout
    assert sum(line.startswith("_gemv_int8_words_kernel") for line in gemv) == 1, result.stdout
    assert sum(line.startswith("_split_k_reduce_kernel") for line in lines) == 2, result.stdout
