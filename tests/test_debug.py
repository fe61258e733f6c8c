"""The practitioner's toolkit: launch checks, program-id rules, in-kernel printing and breakpoints,
offset/mask helpers inside real kernels, and the out-of-bounds guard."""

import sys

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from tritonkit import debug


# ---------------------------------------------------------------- check_tensors_gpu_ready, cdiv
def test_check_tensors_gpu_ready_accepts_contiguous():
    debug.check_tensors_gpu_ready(torch.ones(3), torch.ones(2, 2))  # CPU is fine under the interpreter


def test_check_tensors_gpu_ready_names_position_and_reason():
    with pytest.raises(ValueError, match=r"tensor 1 is not contiguous \(shape \(3, 2\), strides \(1, 3\)\)"):
        debug.check_tensors_gpu_ready(torch.ones(4), torch.ones(2, 3).t())
    with pytest.raises(ValueError, match=r"tensor 0 is not a torch\.Tensor but list"):
        debug.check_tensors_gpu_ready([1.0])


@pytest.mark.parametrize(("a", "b", "expected"), [(0, 4, 0), (1, 4, 1), (8, 4, 2), (9, 4, 3), (4097, 1024, 5)])
def test_cdiv(a, b, expected):
    assert debug.cdiv(a, b) == expected


def test_cdiv_rejects_bad_operands():
    with pytest.raises(ValueError, match="b must be positive, got 0"):
        debug.cdiv(3, 0)
    with pytest.raises(ValueError, match="a must be non-negative, got -1"):
        debug.cdiv(-1, 3)


# ---------------------------------------------------------------- test_pid_conds
@pytest.mark.parametrize(
    ("conds", "pids", "expected"),
    [
        ("", (5, 6, 7), True),
        ("=0", (0, 9, 9), True),
        ("=0", (1, 0, 0), False),
        ("==2", (2, 0, 0), True),
        (">1", (2, 0, 0), True),
        (">1", (1, 0, 0), False),
        ("<1", (0, 0, 0), True),
        (",>=2", (0, 2, 0), True),
        (",>=2", (9, 1, 0), False),
        ("!=0,<=3", (1, 3, 0), True),
        ("!=0,<=3", (0, 3, 0), False),
        ("!=0,<=3", (1, 4, 0), False),
        (",,=1", (0, 0, 1), True),
        (" >= 10 , , != 2", (10, 5, 3), True),
        ("<=-1", (0, 0, 0), False),
    ],
)
def test_pid_rules(conds, pids, expected):
    assert debug.test_pid_conds(conds, *pids) is expected


@pytest.mark.parametrize(
    "wrap",
    [
        lambda i: i,
        lambda i: [i],
        lambda i: (i,),
        np.array,
        lambda i: np.array([i]),
        np.int64,
        lambda i: torch.tensor([i]),
    ],
    ids=["int", "list", "tuple", "numpy-0d", "numpy-1", "numpy-int", "torch-1"],
)
def test_pid_rules_take_ids_of_one_element_in_any_container(wrap):
    """The guide's own form, test_pid_conds('=0,=1', [0], [1], [0]), used to raise TypeError."""
    assert debug.test_pid_conds("=0,=1", wrap(0), wrap(1), wrap(0)) is True
    assert debug.test_pid_conds("=0,=1", wrap(0), wrap(2), wrap(0)) is False
    assert debug.test_pid_conds(",,>=0", wrap(3), wrap(3), wrap(3)) is True


@pytest.mark.parametrize("ids", [([0, 1], 0, 0), (0, np.array([1, 2]), 0), (0, 0, [])])
def test_pid_rules_refuse_a_block_of_several_ids(ids):
    with pytest.raises(
        ValueError, match=r"pid_\d must be one program id \(an int or a block of one\), got \d elements"
    ):
        debug.test_pid_conds("=0,=0,=0", *ids)


@triton.jit
def _explicit_ids_kernel(p_out):
    i_row, i_col = tl.program_id(0), tl.program_id(1)
    debug.print_if("scalar ids", "=1,=0", i_row, i_col, tl.program_id(2))
    debug.print_if("block ids", "=0,=1", tl.full([1], i_row, tl.int32), tl.arange(0, 1) + i_col, tl.program_id(2))
    tl.store(p_out + i_row * 2 + i_col, i_row * 10 + i_col)


def test_print_if_with_ids_given_as_interpreter_blocks(capsys):
    out = torch.full((4,), -1, dtype=torch.int32)
    _explicit_ids_kernel[(2, 2)](out)
    assert out.tolist() == [0, 1, 10, 11]
    assert capsys.readouterr().out.splitlines() == ["[pid 0,1,0] block ids", "[pid 1,0,0] scalar ids"]


@pytest.mark.parametrize("conds", ["=>1", "<<2", "1", "=a", "!1", ",,,", ">= ", "=0,=1,=2,=3"])
def test_pid_rules_invalid_quote_the_rule(conds):
    with pytest.raises(ValueError, match="program-id rule"):
        debug.test_pid_conds(conds, 0, 0, 0)


def test_pid_rules_outside_a_kernel_need_ids():
    with pytest.raises(ValueError, match="not given and no interpreted kernel is running"):
        debug.test_pid_conds("=0")
    assert debug.test_pid_conds("")  # an empty rule needs no ids


# ---------------------------------------------------------------- print_if / breakpoint_if in kernels
@triton.jit
def _traced_kernel(p_x, p_out, n, BLOCK: tl.constexpr):
    i_block = tl.program_id(0)
    o_x = debug.offsets_1d(BLOCK, i_block)
    m_x = debug.mask_1d(o_x, n)
    b_x = tl.load(p_x + o_x, mask=m_x)
    debug.print_if("block loaded", ">=2")
    debug.print_if(b_x, "=1")
    debug.breakpoint_if("!=0,=0")
    tl.store(p_out + o_x, b_x + 1, mask=m_x)


def test_print_and_breakpoint_act_in_selected_programs(capsys, monkeypatch):
    stops = []
    monkeypatch.setattr(sys, "breakpointhook", lambda *a, **k: stops.append(debug._current_program_ids()))
    x = torch.arange(10, dtype=torch.float32)
    out = torch.full_like(x, float("nan"))
    _traced_kernel[(4,)](x, out, 10, BLOCK=4)
    assert torch.equal(out, x + 1)
    printed = capsys.readouterr().out.splitlines()
    assert printed == ["[pid 1,0,0] [4. 5. 6. 7.]", "[pid 2,0,0] block loaded", "[pid 3,0,0] block loaded"]
    assert stops == [(1, 0, 0), (2, 0, 0), (3, 0, 0)]


def test_print_if_with_explicit_ids(capsys):
    debug.print_if("hello", "=1,=2", pid_0=1, pid_1=2, pid_2=0)
    debug.print_if("silent", "=1", pid_0=0, pid_1=0, pid_2=0)
    assert capsys.readouterr().out == "[pid 1,2,0] hello\n"


# ---------------------------------------------------------------- offset and mask helpers
@triton.jit
def _tile_kernel(
    p_x, p_out, n_rows, n_cols, stride_x_row, stride_x_col, stride_out_row, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr
):
    o_r = debug.offsets_1d(BLOCK_R, tl.program_id(0))
    o_c = debug.offsets_1d(BLOCK_C, tl.program_id(1))
    m_rc = debug.mask_2d(o_r, o_c, n_rows, n_cols)
    b_x = tl.load(p_x + debug.offsets_2d(o_r, o_c, stride_x_row, stride_x_col), mask=m_rc)  # [BLOCK_R, BLOCK_C]
    tl.store(p_out + debug.offsets_2d(o_r, o_c, stride_out_row), b_x * 2, mask=m_rc)


@pytest.mark.parametrize(("rows", "cols"), [(1, 1), (5, 7), (16, 16), (33, 9)])
def test_offset_and_mask_helpers_in_a_2d_kernel(rows, cols, device):
    x = torch.randn(cols, rows, device=device).t()  # strided input
    out = torch.full((rows, cols), float("nan"), device=device)
    grid = (debug.cdiv(rows, 8), debug.cdiv(cols, 4))
    _tile_kernel[grid](x, out, rows, cols, *x.stride(), out.stride(0), BLOCK_R=8, BLOCK_C=4)
    assert torch.equal(out, x * 2)


@pytest.mark.parametrize("n", [1, 7, 8, 29])
def test_1d_helpers_in_a_kernel(n, device, capsys, monkeypatch):
    monkeypatch.setattr(sys, "breakpointhook", lambda *a, **k: None)  # the kernel carries a breakpoint_if
    x = torch.randn(n, device=device)
    out = torch.full_like(x, float("nan"))
    _traced_kernel[(debug.cdiv(n, 8),)](x, out, n, BLOCK=8)
    assert torch.equal(out, x + 1)


# ---------------------------------------------------------------- guard_bounds
@triton.jit
def _unmasked_copy(p_x, p_out, n, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(p_out + o, tl.load(p_x + o))  # no mask: reads and writes past n


@triton.jit
def _read_past_end(p_x, p_out, n, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    b = tl.load(p_x + o)  # unmasked read ...
    tl.store(p_out + o, b, mask=o < n)  # ... but a masked write


@triton.jit
def _masked_copy(p_x, p_out, n, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(p_out + o, tl.load(p_x + o, mask=o < n), mask=o < n)


@triton.jit
def _sum_neighbours(p_x, p_out, n, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    b = tl.load(p_x + o, mask=o < n) + tl.load(p_x + o + 1, mask=o < n)  # off by one at the last element
    tl.store(p_out + o, b, mask=o < n)


def _launcher(kernel, n, block=8):
    def launch(x, out):
        kernel[(debug.cdiv(n, block),)](x, out, n, BLOCK=block)

    return launch


def test_guard_passes_a_correct_kernel(device):
    n = 13
    report = debug.guard_bounds(
        _launcher(_masked_copy, n), torch.randn(n, device=device), torch.empty(n, device=device)
    )
    assert report.ok and str(report) == "no out-of-bounds access detected"
    report.raise_if_bad()


def test_guard_reports_writes_and_reads(device):
    n = 13
    report = debug.guard_bounds(
        _launcher(_unmasked_copy, n), torch.randn(n, device=device), torch.empty(n, device=device)
    )
    assert report.oob_writes == [
        "tensor 1: 3 elements written outside it (first at element offsets [13, 14, 15] from its start)"
    ]
    assert report.oob_reads == []  # what was read out of bounds was written out of bounds too
    with pytest.raises(debug.OutOfBoundsError, match="out-of-bounds write: tensor 1: 3 elements"):
        report.raise_if_bad()


def test_guard_reports_a_read_that_reached_the_output(device):
    n = 13
    report = debug.guard_bounds(
        _launcher(_sum_neighbours, n), torch.randn(n, device=device), torch.empty(n, device=device)
    )
    assert report.oob_writes == []
    assert report.oob_reads == ["tensor 1: 1 of 13 elements depend on memory outside the inputs (first at [[12]])"]


def test_guard_ignores_out_of_bounds_reads_that_are_discarded(device):
    n = 13
    report = debug.guard_bounds(
        _launcher(_read_past_end, n), torch.randn(n, device=device), torch.empty(n, device=device)
    )
    assert report.ok


def test_guard_sees_gaps_of_strided_views(device):
    # a stride-2 view owns every other element; the kernel writes contiguously, into the gaps
    n = 6
    x = torch.randn(n, device=device)
    out = torch.empty(2 * n, device=device)[::2]
    report = debug.guard_bounds(_launcher(_masked_copy, n), x, out)
    assert report.oob_writes and report.oob_writes[0].startswith("tensor 1: 3 elements written outside it")


def test_guard_compares_returned_tensors_and_integer_tensors(device):
    def launch(x):
        out = torch.empty(5, dtype=torch.int32, device=x.device)
        _sum_neighbours[(1,)](x, out, 5, BLOCK=8)  # the last element reads one past the end
        return out

    report = debug.guard_bounds(launch, torch.arange(5, dtype=torch.int32, device=device))
    assert report.oob_writes == []
    assert report.oob_reads == [
        "returned tensor 0: 1 of 5 elements depend on memory outside the inputs (first at [[4]])"
    ]


def test_guard_rejects_non_tensors():
    with pytest.raises(TypeError, match=r"argument 1 must be a torch\.Tensor"):
        debug.guard_bounds(lambda x: x, [1, 2])


@pytest.mark.gpu
def test_check_tensors_gpu_ready_compiled():
    debug.check_tensors_gpu_ready(torch.ones(3, device="cuda"))
    with pytest.raises(ValueError, match="tensor 1 is on cpu, not on a CUDA device"):
        debug.check_tensors_gpu_ready(torch.ones(3, device="cuda"), torch.ones(3))
    assert not debug.interpreting()
