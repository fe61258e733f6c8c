"""Puzzles 14 to 18 (INT8 and NF4 quantization, split-K matmul with atomics and in two passes, the paged-cache
gather): each classic mistake, written as a small edit of the reference solution, is named by the checker. Each test
checks float32 on the case where the mistake first shows, so the file stays quick under the interpreter."""

from __future__ import annotations

import pytest
import torch

from helpers import puzzle_mutant
from tritonkit.puzzles.checker import check_puzzle

_ABSMAX = 'absmax = tl.max(tl.where(b_abs < float("inf"), b_abs, 0.0), axis=1)'
_ROUND = "b_q = tl.floor(b_y + 0.5)"
_CLAMP = "tl.clamp(b_x / scale[:, None], -127.0, 127.0)"
_SCALE = "scale = tl.where(absmax > 0.0, absmax / 127.0, 1.0)"
_ROWS = {"m": 7, "k": 37}
_ZEROS = {"m": 6, "k": 30, "zeros": 1}
_INF = {"m": 9, "k": 50, "inf": 1}


@pytest.mark.parametrize(
    ("edits", "case", "code", "phrase"),
    [
        ([(_ABSMAX, _ABSMAX.replace(", axis=1)", ")")), ("scale[:, None]", "scale")], _ROWS, "per-tensor-scale",
         "one scale for several rows"),
        ([(_ROUND, "b_q = b_y")], _ROWS, "truncated-not-rounded", "truncated toward zero"),
        ([(_ROUND, "b_q = tl.floor(b_y)")], _ROWS, "floored-not-rounded", "rounded down"),
        ([(_CLAMP, "b_x / scale[:, None]")], _INF, "missing-clamp", "not clamped to [-127, 127]"),
        ([(_SCALE, "scale = absmax / 127.0")], _ZEROS, "zero-row-nan", "a row of zeros gets scale 0"),
        ([('tl.where(b_abs < float("inf"), b_abs, 0.0)', "b_abs")], _INF, "inf-in-absmax", "an inf sets the scale"),
    ],
    ids=["per-tensor-scale", "truncated", "floored", "missing-clamp", "zero-row-nan", "inf-in-absmax"],
)  # fmt: skip
def test_int8_quantization_mistakes_are_named(tmp_path, edits, case, code, phrase):
    puzzle, module = puzzle_mutant(tmp_path, 14, *edits)
    (outcome,) = check_puzzle(puzzle, module, cases=[case], dtypes=[torch.float32]).outcomes
    assert outcome.codes[0] == code and set(outcome.codes[1:]) == {"wrong-values"}, outcome.findings
    assert phrase in outcome.findings[0].message


def test_int8_quantization_names_the_output_that_was_never_written(tmp_path):
    """Two outputs: the codes were stored, the scales never were, and the message says which."""
    puzzle, module = puzzle_mutant(tmp_path, 14, ("    tl.store(p_scale + o_m, scale, mask=o_m < n_rows)\n", ""))
    (outcome,) = check_puzzle(puzzle, module, cases=[_ROWS], dtypes=[torch.float32]).outcomes
    assert outcome.codes == ["never-written"]
    assert outcome.findings[0].message.startswith("scale: the kernel wrote nothing")


_HIGH, _LOW = "(b_bytes >> 4)", "(b_bytes & 15)"
_ABSMAX_HIGH = "tl.load(p_absmax + o_high // blocksize, mask=o_high < n, other=0.0)"
_ABSMAX_LOW = "tl.load(p_absmax + o_low // blocksize, mask=o_low < n, other=0.0)"
_PER_PROGRAM = "tl.load(p_absmax + tl.program_id(0))"
_CODE_SCALED = [(f"tl.load(p_code + {nibble})", f"{nibble}.to(tl.float32)") for nibble in (_HIGH, _LOW)]


@pytest.mark.parametrize(
    ("edits", "code", "phrase"),
    [
        ([(_HIGH, "(HIGH)"), (_LOW, _HIGH), ("(HIGH)", _LOW)], "swapped-nibbles", "the nibbles are swapped"),
        ([("o_high // blocksize", "o_byte // blocksize"), ("o_low // blocksize", "o_byte // blocksize")],
         "wrong-block-index", "the block of its byte index"),
        ([(_ABSMAX_HIGH, _PER_PROGRAM), (_ABSMAX_LOW, _PER_PROGRAM)], "wrong-block-index",
         "one absmax for all its values"),
        (_CODE_SCALED, "code-scaled-not-looked-up", "the 4-bit code itself is scaled"),
        ([(" * b_absmax_high", ""), (" * b_absmax_low", "")], "absmax-not-applied", "code book values are not scaled"),
    ],
    ids=["swapped-nibbles", "byte-index-block", "program-id-block", "code-scaled", "absmax-not-applied"],
)  # fmt: skip
def test_nf4_dequantization_mistakes_are_named(tmp_path, edits, code, phrase):
    puzzle, module = puzzle_mutant(tmp_path, 15, *edits)
    (outcome,) = check_puzzle(puzzle, module, cases=[{"n": 101, "blocksize": 32}], dtypes=[torch.float32]).outcomes
    assert outcome.codes == [code, "wrong-values"], outcome.findings
    assert phrase in outcome.findings[0].message


_ATOMIC = "tl.atomic_add(p_c + o_m[:, None] * stride_cm + o_n[None, :] * stride_cn, b_acc, mask=m_c)"
_READ_ADD_STORE = (
    "p_tile = p_c + o_m[:, None] * stride_cm + o_n[None, :] * stride_cn\n"
    "    tl.store(p_tile, tl.load(p_tile, mask=m_c) + b_acc, mask=m_c)"
)
_SMALL = {"m": 3, "n": 20, "k": 100}


@pytest.mark.parametrize(
    ("edits", "phrase"),
    [([(_ATOMIC, _ATOMIC.replace("tl.atomic_add", "tl.store"))], "programs that differ only in tl.program_id(2)"),
     ([(_ATOMIC, _READ_ADD_STORE)], "programs that differ only in tl.program_id(2)")],
    ids=["plain-store", "load-add-store"],
)  # fmt: skip
def test_splitk_plain_store_is_named_lost_updates(tmp_path, edits, phrase):
    """A plain store loses the other splits' parts (wrong values); a load, add and store passes under the interpreter,
    which runs one program at a time, and would lose updates on a GPU: the trace names both."""
    puzzle, module = puzzle_mutant(tmp_path, 16, *edits)
    (outcome,) = check_puzzle(puzzle, module, cases=[_SMALL], dtypes=[torch.float32]).outcomes
    assert outcome.codes[0] == "lost-updates" and set(outcome.codes[1:]) <= {"wrong-values"}, outcome.findings
    assert phrase in outcome.findings[0].message and "tl.atomic_add" in outcome.findings[0].message


@pytest.mark.parametrize("traced", [True, False], ids=["interpreter-trace", "without-trace"])
def test_splitk_output_not_zeroed_is_named(tmp_path, monkeypatch, traced):
    """The atomics add into the poison the checker fills c with: seen at the launch, so without the trace too."""
    from tritonkit.puzzles import checker

    if not traced:
        monkeypatch.setattr(checker.MemoryTrace, "available", staticmethod(lambda: False))
    puzzle, module = puzzle_mutant(tmp_path, 16, ("    c.zero_()\n", ""))
    (outcome,) = check_puzzle(puzzle, module, cases=[_SMALL], dtypes=[torch.float32]).outcomes
    assert outcome.codes[0] == "not-zeroed", outcome.findings
    assert "zero it first" in outcome.findings[0].message.lower()


def test_histogram_counts_not_zeroed_are_named(tmp_path):
    puzzle, module = puzzle_mutant(tmp_path, 12, ("    counts.zero_()\n", ""))
    assert check_puzzle(puzzle, module, cases=[{"n": 300, "bins": 10}]).codes[0] == "not-zeroed"


@pytest.mark.parametrize(
    ("edits", "code"),
    [([("tl.store(p_c + o_e, b_sum, mask=m_e)", "tl.atomic_add(p_c + o_e, b_sum, mask=m_e)")],
      "atomics-not-deterministic"),
     ([("tl.store(p_partials + i_k * M * N +", "tl.store(p_partials +")], "lost-updates")],
    ids=["atomics", "one-slice-for-every-split"],
)  # fmt: skip
def test_splitk_two_pass_mistakes_are_named(tmp_path, edits, code):
    puzzle, module = puzzle_mutant(tmp_path, 17, *edits)
    (outcome,) = check_puzzle(puzzle, module, cases=[_SMALL], dtypes=[torch.float32]).outcomes
    assert outcome.codes[0] == code, outcome.findings
    if code == "lost-updates":  # the buffer of a deterministic puzzle: no atomics suggested
        assert "p_partials" in outcome.findings[0].message and "atomic" not in outcome.findings[0].message


def test_a_file_without_one_of_the_kernels_is_told_so(tmp_path):
    puzzle, module = puzzle_mutant(tmp_path, 17, ("splitk_partial_kernel", "partial_kernel"))
    (outcome,) = check_puzzle(puzzle, module, cases=[_SMALL], dtypes=[torch.float32]).outcomes
    assert outcome.codes == ["no-kernel"] and "splitk_partial_kernel" in outcome.findings[0].message


_PAGE_INDEX = "o_t // page_size, mask=m_t"
_MASK = "m_t = o_t < seq_len"
_LOADED = "mask=m_t[:, None] & m_d, other=0.0)"
_DISCARDED = (_LOADED, _LOADED + "\n    b_rows = tl.where((o_t < seq_len)[:, None], b_rows, 0.0)")


@pytest.mark.parametrize(
    ("edits", "code", "phrase"),
    [
        ([(_PAGE_INDEX, "o_t // page_size + 1, mask=m_t")], "page-off-by-one", "the next page"),
        ([(_PAGE_INDEX, "(o_t + page_size - 1) // page_size, mask=m_t")], "page-off-by-one", "rounded up"),
        ([("b_pages.to(tl.int64)[:, None] * stride_page", "b_pages.to(tl.int64)[:, None] * stride_slot")],
         "offset-without-page-size", "not multiplied by the page size"),
        ([("(o_t % page_size)[:, None] * stride_slot", "o_t[:, None] * stride_slot")], "offset-without-page-size",
         "not t % page_size"),
        ([(_MASK, "m_t = o_t < max_len")], "reads-past-length", "read the cache"),
        ([(_MASK, "m_t = o_t < max_len"), _DISCARDED], "reads-past-length", "even if their values are dropped"),
    ],
    ids=["next-page", "page-rounded-up", "page-not-times-page-size", "slot-not-modulo", "past-length",
         "past-length-discarded"],
)  # fmt: skip
def test_paged_gather_mistakes_are_named(tmp_path, edits, code, phrase):
    """Wrong pages and offsets are named from the output on random pages; loads past a sequence's length from the
    trace too, when the kernel drops what it read (right values, rows it must not read)."""
    puzzle, module = puzzle_mutant(tmp_path, 18, *edits)
    case = {"b": 3, "max_len": 37, "page_size": 8, "d": 20}
    (outcome,) = check_puzzle(puzzle, module, cases=[case], dtypes=[torch.float32]).outcomes
    assert outcome.codes[0] == code and set(outcome.codes[1:]) <= {"wrong-values"}, outcome.findings
    assert phrase in outcome.findings[0].message
