"""The puzzles: every reference solution passes, every stub fails, and each known mistake fails
with its own diagnosis. The mistakes are small edits of the reference solutions, so they follow
the solutions as those change (each edit asserts that its target text is still there)."""

from __future__ import annotations

import importlib
import re

import pytest
import torch

from helpers import puzzle_mutant as _mutant
from tritonkit.puzzles import all_puzzles, get
from tritonkit.puzzles.checker import check_puzzle, load_file
from tritonkit.puzzles.cli import main as puzzles_main

PUZZLES = all_puzzles()


def _module(puzzle):
    return importlib.import_module(puzzle.module)


def test_there_are_eighteen_puzzles_numbered_in_order_each_with_hints_and_odd_sizes():
    assert [p.number for p in PUZZLES] == list(range(1, 19))
    for puzzle in PUZZLES:
        assert len(puzzle.hints) >= 3, puzzle.title
        assert len(puzzle.cases) >= 3 and puzzle.gpu_cases, puzzle.title
        # At least one case whose sizes are not all powers of two (so not a multiple of the blocks).
        assert any(any(v & (v - 1) for v in case.values()) for case in puzzle.cases), puzzle.title


@pytest.mark.parametrize("puzzle", PUZZLES, ids=lambda p: f"{p.number:02d}-{p.slug}")
def test_reference_solution_passes_and_stub_fails(puzzle, device, tmp_path):
    report = check_puzzle(puzzle, _module(puzzle), device=device)
    failing = [(o.label(), o.seed, o.findings) for o in report.outcomes if not o.ok]
    assert report.ok, failing
    assert len(report.outcomes) == len(puzzle.dtypes) * len(puzzle.gpu_cases if device == "cuda" else puzzle.cases)
    stub = tmp_path / puzzle.file_name
    stub.write_text(puzzle.stub_text())
    stub_report = check_puzzle(puzzle, load_file(stub), device=device, cases=puzzle.cases[-1:])
    assert not stub_report.ok
    assert "never-written" in stub_report.codes or "wrong-values" in stub_report.codes


_SHIFT = ("o_x = i_block * BLOCK + tl.arange(0, BLOCK)", "o_x = tl.arange(0, BLOCK)")
_PID_N = ("o_x = i_block * BLOCK + tl.arange(0, BLOCK)", "o_x = i_block * n + tl.arange(0, BLOCK)")
_NO_MASK = ("m_x = o_x < n", "m_x = None")
_LAUNCH = "    vector_add_kernel[grid](x, y, out, n, BLOCK=BLOCK)"
_CHEAT = (_LAUNCH, "    out.copy_(x + y)")
_EMPTY = ("    tl.store(p_out + o_x, b_x + b_y, mask=m_x)", "    pass")
_NO_CAST = (".to(tl.float32)", "")


@pytest.mark.parametrize(
    ("number", "edits", "code"),
    [
        (1, [_SHIFT], "not-shifted"),
        (1, [_PID_N], "pid-times-n"),
        (1, [_NO_MASK], "missing-mask"),
        (1, [_CHEAT], "never-launched"),
        (1, [_EMPTY], "never-written"),
        (2, [_NO_CAST], "bf16-no-cast"),
        (3, [("o_n = tl.program_id(1) * BLOCK_N", "o_n = 0 * BLOCK_N")], "not-shifted"),
        (4, [("m_hw = (o_h[:, None] < height) & (o_w[None, :] < width)", "m_hw = o_h[:, None] < height")],
         "missing-mask"),
        (12, [("tl.atomic_add(p_counts + b_bins, tl.full([BLOCK], 1, dtype=tl.int32), mask=m_x)",
               "tl.store(p_counts + b_bins, tl.load(p_counts + b_bins, mask=m_x) + 1, mask=m_x)")], "race"),
        (6, [('other=float("-inf")', "other=0.0")], "wrong-values"),
    ],
    ids=["not-shifted", "pid-times-n", "missing-mask", "cheat", "empty-kernel", "bf16-no-cast", "unused-axis",
         "2d-missing-column-mask", "histogram-race", "max-other-zero"],
)  # fmt: skip
def test_known_mistake_fails_with_its_diagnosis(tmp_path, number, edits, code):
    puzzle, module = _mutant(tmp_path, number, *edits)
    report = check_puzzle(puzzle, module)
    assert not report.ok
    assert code in report.codes, report.codes


# Puzzle 13's classic mistakes, each named by the checker from the learner's output on designed inputs.
_NO_MAX = [("b_p = tl.exp(b_s - m_new[:, None])", "b_p = tl.exp(b_s)"),
           ("alpha = tl.exp(m_i - m_new)", "alpha = tl.exp(m_new - m_new)")]  # fmt: skip
_NO_RESCALE_L = ("l_i = l_i * alpha + ", "l_i = l_i + ")
_NO_RESCALE_ACC = ("b_acc = b_acc * alpha[:, None] + ", "b_acc = b_acc + ")
_CAUSAL_MASK = "m_keys = m_keys & (o_n[None, :] <= o_m[:, None])"
_CAUSAL_END = "end = tl.minimum(seq_len, (i_m + 1) * BLOCK_M)"


@pytest.mark.parametrize(
    ("edits", "code", "phrase"),
    [
        (_NO_MAX, "no-max-subtraction", "subtract the running maximum before exp"),
        ([_NO_RESCALE_L], "no-rescale-sum", "the running sum l is not rescaled"),
        ([_NO_RESCALE_ACC], "no-rescale-acc", "the accumulator acc is not rescaled"),
        ([_NO_RESCALE_L, _NO_RESCALE_ACC], "no-rescale-sum-and-acc", "neither the running sum l nor the accumulator"),
        ([("        m_i = m_new\n", "")], "max-not-updated", "the running maximum is never updated"),
        ([(_CAUSAL_MASK, _CAUSAL_MASK.replace("<=", "<"))], "causal-diagonal-excluded", "leaves out the diagonal"),
        ([(_CAUSAL_MASK, _CAUSAL_MASK.replace("o_m[:, None]", "o_m[:, None] + 1"))], "causal-one-key-too-many",
         "one key too many"),
        ([(_CAUSAL_MASK, "m_keys = m_keys")], "causal-diagonal-block-unmasked", "that block is not masked"),
        ([(_CAUSAL_END, "end = seq_len"),
          (_CAUSAL_MASK, _CAUSAL_MASK.replace("(o_n[None, :] <= o_m[:, None])",
                                              "((o_n[None, :] <= o_m[:, None]) | (start != i_m * BLOCK_M))"))],
         "causal-later-blocks-attended", "key blocks after the diagonal block are attended"),
        ([(_CAUSAL_END, _CAUSAL_END.replace("(i_m + 1)", "i_m"))], "causal-diagonal-block-skipped",
         "stops before the diagonal block"),
        ([("    if CAUSAL:  # keys", "    if False:  # keys"), ("        if CAUSAL:\n", "        if False:\n")],
         "causal-ignored", "causal=True changed nothing"),
    ],
    ids=["no-max-subtraction", "no-rescale-sum", "no-rescale-acc", "no-rescale-either", "max-not-updated",
         "causal-diagonal-excluded", "causal-one-key-too-many", "causal-diagonal-unmasked", "causal-later-blocks",
         "causal-diagonal-block-skipped", "causal-ignored"],
)  # fmt: skip
def test_flash_attention_mistakes_are_named(tmp_path, edits, code, phrase):
    """The checker runs the failing kernel on inputs designed for each mistake and names the one whose output it
    matches: one named mistake, then the wrong values it saw."""
    puzzle, module = _mutant(tmp_path, 13, *edits)
    report = check_puzzle(puzzle, module)
    failing = next(o for o in report.outcomes if not o.ok)
    assert failing.codes == [code, "wrong-values"], (failing.label(), failing.findings)
    assert phrase in failing.findings[0].message
    if code == "no-max-subtraction":  # the scores that overflow come from the case with large scores
        assert failing.case.get("q_scale", 1) > 1
    if code.startswith("causal"):  # every non-causal case passed first
        assert failing.case.get("causal") and all(o.ok for o in report.outcomes if not o.case.get("causal"))


def test_flash_attention_mistakes_are_not_named_for_other_errors(tmp_path):
    """A wrong value with no classic mistake behind it (the scale left out) gets no mistake's name."""
    puzzle, module = _mutant(tmp_path, 13, ("tl.trans(b_k)) * scale", "tl.trans(b_k))"))
    assert check_puzzle(puzzle, module).codes == ["wrong-values"]


def test_a_flash_attention_launcher_from_before_the_causal_cases_still_passes_the_others(tmp_path):
    """A solution written without the causal flag passes every non-causal case and fails the causal ones on the
    launcher's missing parameter, by name."""
    puzzle, module = _mutant(
        tmp_path, 13, (", causal: bool = False) -> None:", ") -> None:"), ("CAUSAL=causal", "CAUSAL=False")
    )
    report = check_puzzle(puzzle, module, dtypes=[torch.float32])
    assert [o.ok for o in report.outcomes] == [not case.get("causal") for case in puzzle.cases[: len(report.outcomes)]]
    (finding,) = report.outcomes[-1].findings
    assert finding.code == "exception" and "unexpected keyword argument 'causal'" in finding.message


_STORE = "tl.store(p_out + o_x, b_x + b_y, mask=m_x)"


@pytest.mark.parametrize(
    ("stored", "wrong"),
    [("(b_x + b_y) * float('nan')", "100 of 100"), ("b_x + b_y + tl.sqrt(b_x) * 0", r"\d+ of 100")],
    ids=["all-nan", "nan-where-x-is-negative"],
)
def test_a_kernel_that_stores_nan_is_told_its_values_are_wrong_not_unwritten(tmp_path, stored, wrong):
    """The checker poisons the output with NaN, but the trace sees which elements were stored: a stored NaN is a
    wrong value (it used to be reported as "the kernel wrote nothing")."""
    puzzle, module = _mutant(tmp_path, 1, (_STORE, _STORE.replace("b_x + b_y", stored)))
    report = check_puzzle(puzzle, module, cases=[{"n": 100}], seed=5)
    assert report.codes == ["wrong-values"], report.outcomes[0].findings
    message = report.outcomes[0].findings[0].message
    assert re.search(rf"^{wrong} outputs are wrong", message) and ", got nan" in message


def test_unwritten_and_nan_outputs_are_told_apart(tmp_path):
    """Half the elements never stored, the other half stored as NaN where x < 0: each named for what it is."""
    mask = "mask=m_x & (o_x % 2 == 0)"
    puzzle, module = _mutant(tmp_path, 1, (_STORE, _STORE.replace("b_x + b_y", "b_x + b_y + tl.sqrt(b_x) * 0")
                                                       .replace("mask=m_x", mask)))  # fmt: skip
    findings = check_puzzle(puzzle, module, cases=[{"n": 100}], seed=5).outcomes[0].findings
    assert [f.code for f in findings] == ["never-written", "wrong-values"]
    assert findings[0].message.startswith("50 of 100 outputs were never written (first at [1], [3], [5]")
    assert "got nan" in findings[1].message


def test_a_launcher_that_overwrites_the_kernels_output_is_caught(tmp_path):
    puzzle, module = _mutant(
        tmp_path,
        1,
        _EMPTY,
        (_LAUNCH, _LAUNCH + "\n    out.copy_(x + y)"),
    )  # fmt: skip
    assert "written-outside-kernel" in check_puzzle(puzzle, module).codes


def test_without_the_trace_the_guard_and_the_output_pattern_still_name_the_mistake(tmp_path, monkeypatch):
    """What the compiled path sees (no interpreter trace): guard_bounds and the shape of the failure."""
    from tritonkit.puzzles import checker

    monkeypatch.setattr(checker.MemoryTrace, "available", staticmethod(lambda: False))
    puzzle, module = _mutant(tmp_path, 1, _NO_MASK)
    report = check_puzzle(puzzle, module, cases=[{"n": 100}])
    assert report.codes == ["out-of-bounds"]
    assert "written outside" in report.outcomes[0].findings[0].message
    puzzle, module = _mutant(tmp_path, 1, _SHIFT)
    assert "first-block-only" in check_puzzle(puzzle, module, cases=[{"n": 1000}]).codes


def test_messages_name_positions_values_and_the_learners_line(tmp_path):
    puzzle, module = _mutant(tmp_path, 1, ("b_x + b_y, mask=m_x)", "b_x - b_y, mask=m_x)"))
    report = check_puzzle(puzzle, module, cases=[{"n": 100}], seed=3)
    (finding,) = report.outcomes[0].findings
    assert finding.code == "wrong-values" and "at [0]: expected" in finding.message and ", got " in finding.message
    puzzle, module = _mutant(tmp_path, 1, ("tl.arange(0, BLOCK)", "tl.arange(0, n)"))
    (finding,) = check_puzzle(puzzle, module, cases=[{"n": 100}]).outcomes[0].findings
    assert finding.code == "exception" and "(line 25: o_x = i_block * BLOCK + tl.arange(0, n))" in finding.message


def test_an_access_far_outside_every_tensor_is_stopped_not_crashing(tmp_path):
    puzzle, module = _mutant(tmp_path, 12, ("mask=m_x, other=0)", "mask=m_x, other=0) + (1 << 30)"))
    report = check_puzzle(puzzle, module, cases=[{"n": 10, "bins": 4}])
    assert report.codes == ["wild-access"]


def test_cli_init_check_hint_solution(tmp_path, capsys):
    folder = tmp_path / "mine"
    assert puzzles_main(["puzzles", "init", str(folder)]) == 0
    assert len(list(folder.glob("puzzle_*.py"))) == len(PUZZLES)
    # An untouched stub fails with the diagnosis; the solution pasted in passes.
    assert puzzles_main(["puzzles", "check", str(folder), "1"]) == 1
    assert "the kernel never stored anything" in capsys.readouterr().out
    (folder / get(1).file_name).write_text(get(1).solution_text())
    assert puzzles_main(["puzzles", "check", str(folder), "1"]) == 0
    assert "1 passed, 0 failed" in capsys.readouterr().out
    assert puzzles_main(["puzzles", "check", str(folder)]) == 0  # the others are "not started"
    assert f"{len(PUZZLES) - 1} not started" in capsys.readouterr().out
    assert puzzles_main(["puzzles", "hint", "13", "--level", "2"]) == 0
    hints = capsys.readouterr().out
    assert "1. " in hints and "2. " in hints and "3. " not in hints
    assert puzzles_main(["puzzles", "solution", "2"]) == 0
    assert "def add_relu_kernel" in capsys.readouterr().out
    assert puzzles_main(["puzzles", "hint", str(len(PUZZLES) + 1)]) == 2
    capsys.readouterr()
    assert puzzles_main(["puzzles", "list"]) == 0
    assert "flash-attention forward" in capsys.readouterr().out


def test_stub_keeps_the_docstrings_and_the_launcher_and_drops_the_checker_data():
    for puzzle in PUZZLES:
        stub = puzzle.stub_text()
        assert "checker data" not in stub and "PUZZLE" not in stub
        assert f"def {puzzle.launcher}(" in stub and "# TODO" in stub
        compile(stub, puzzle.file_name, "exec")


def test_a_returned_torch_result_of_the_wrong_dtype_is_named(tmp_path):
    puzzle, module = _mutant(tmp_path, 1, (_LAUNCH, "    return (x + y).double()"))
    report = check_puzzle(puzzle, module, cases=[{"n": 10}])
    assert report.codes[:2] == ["never-launched", "dtype-mismatch"]
    assert "torch.float64, expected torch.float32" in report.outcomes[0].findings[1].message


@pytest.mark.parametrize("number", [0, len(PUZZLES) + 1, -1])
def test_cli_check_refuses_a_puzzle_number_out_of_range(tmp_path, capsys, number):
    """`check DIR 0` used to check every puzzle (0 read as "none given")."""
    folder = tmp_path / "mine"
    assert puzzles_main(["puzzles", "init", str(folder)]) == 0
    capsys.readouterr()
    assert puzzles_main(["puzzles", "check", str(folder), str(number)]) == 2
    captured = capsys.readouterr()
    assert captured.err.strip() == f"there is no puzzle {number}: puzzles are numbered 1 to {len(PUZZLES)}"
    assert "Checking" not in captured.out and "Puzzle" not in captured.out


def test_memory_trace_follows_tensor_descriptor_loads_and_stores():
    """The interpreter's tensor-descriptor loads call the builder's masked load with keyword arguments: the trace
    passes them on, and records every element of each tile, per program (a 64 x 64 product in 32 x 32 tiles, 3
    programs: tile t to program t % 3)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    from tritonkit.ops.tutorial.kernels import _matmul_persistent_kernel
    from tritonkit.puzzles.trace import MemoryTrace

    a, b = torch.randn(64, 32), torch.randn(32, 64)
    c = torch.full((64, 64), float("nan"))
    trace = MemoryTrace()
    with trace:
        trace.start_launch({"a": a, "b": b, "c": c}, c)
        _matmul_persistent_kernel[(3,)](*(TensorDescriptor.from_tensor(t, [32, 32]) for t in (a, b, c)), 64, 64, 32,
                                        3, BLOCK_M=32, BLOCK_N=32, BLOCK_K=32, GROUP_SIZE=1, B_TRANSPOSED=False,
                                        SWAP_AB=False, INPUT_PRECISION="ieee", UPCAST=False)  # fmt: skip
    torch.testing.assert_close(c, a @ b, rtol=1e-5, atol=1e-4)
    stores = [x for x in trace.accesses if x.kind == "store"]
    assert sorted(x.pid[0] for x in stores) == [0, 0, 1, 2]  # four tiles over three programs
    assert sorted(int(x.offsets.size) for x in stores) == [1024] * 4
    loaded = {x.tensor for x in trace.accesses if x.kind == "load"}
    assert loaded == {"a", "b"}
