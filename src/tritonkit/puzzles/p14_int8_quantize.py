"""Puzzle 14: INT8 quantization with one scale per row.

    absmax_r = max over c of |x[r, c]|, finite values only   (an inf sets no scale)
    scale_r  = absmax_r / 127, or 1 when absmax_r = 0       (a row of zeros)
    q[r, c]  = clamp(round(x[r, c] / scale_r), -127, 127)    as int8

so that q * scale gives x back to within half a step. round is to the nearest integer; the cases
have no ties (x / scale never falls halfway between two integers), so round half up, half away
from zero or half to even all do. Converting with .to(tl.int8) alone truncates toward zero, which
is not rounding. +inf and -inf (an activation that overflowed) set no scale, and the clamp saturates
them to +127 and -127. A row of zeros has absmax 0, and 0 / 0 is NaN: its scale is 1 and its codes
0 (the convention of tritonkit.ops.quantize).

Shapes: x is (M, K), float32 or float16, rows contiguous (strides passed); q is (M, K) int8 and
scale (M,) float32. K goes up to 300.

Blocks: cdiv(M, BLOCK_M) programs of BLOCK_M = 4 rows each, BLOCK_K = next power of two >= K, so a
program loads its rows as one [BLOCK_M, BLOCK_K] tile. The absmax is per row: reduce along axis 1,
one scale for each of the BLOCK_M rows, not one for the tile.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def quantize_rows_kernel(
    p_x, p_q, p_scale, n_rows, n_cols, stride_x_row, stride_q_row, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr
):  # fmt: skip
    """int8 codes and a float32 scale for each of BLOCK_M rows, each row one block."""
    o_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    o_k = tl.arange(0, BLOCK_K)
    m_x = (o_m[:, None] < n_rows) & (o_k[None, :] < n_cols)
    b_x = tl.load(p_x + o_m[:, None] * stride_x_row + o_k[None, :], mask=m_x, other=0.0).to(tl.float32)  # [M, K]
    b_abs = tl.abs(b_x)
    absmax = tl.max(tl.where(b_abs < float("inf"), b_abs, 0.0), axis=1)  # [BLOCK_M]
    scale = tl.where(absmax > 0.0, absmax / 127.0, 1.0)
    b_y = tl.clamp(b_x / scale[:, None], -127.0, 127.0)
    b_q = tl.floor(b_y + 0.5)  # to the nearest integer (no ties in the cases)
    tl.store(p_q + o_m[:, None] * stride_q_row + o_k[None, :], b_q.to(tl.int8), mask=m_x)
    tl.store(p_scale + o_m, scale, mask=o_m < n_rows)


def quantize_rows(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> None:
    """The launcher (given)."""
    n_rows, n_cols = x.shape
    BLOCK_M = 4
    grid = (triton.cdiv(n_rows, BLOCK_M),)
    quantize_rows_kernel[grid](
        x, q, scale, n_rows, n_cols, x.stride(0), q.stride(0), BLOCK_M=BLOCK_M, BLOCK_K=triton.next_power_of_2(n_cols)
    )


# ===== checker data: not part of the learner's file =====
from tritonkit.puzzles._base import Mistake, Probe, Puzzle  # noqa: E402
from tritonkit.registry import Tolerance  # noqa: E402

_BLOCK_M = 4  # the launcher's rows per program, for a mistake's reference when the learner's launch does not say
_UNDEFINED = float("nan")  # in a mistake's codes: a value the int8 cast leaves to the machine (NaN or beyond +-127)


def _rows(case, dtype, device, gen):
    """x[r, c] = (code + k / 16) * 2**e_r: random codes in [-126, 126], 1 <= |k| <= 6 (far from a tie, so float32 and
    float16 arithmetic round as float64 does), a power of two per row, and one element per row at +-127 * 2**e_r (its
    absmax). All exact in float16. Case flags: zeros (row 0 all zeros), inf (+-inf at every 7th element but the
    absmax's), spread (one power of two drawn for every row, row r's times 2**(4r - 4): rows of very different
    sizes)."""
    m, k = case["m"], case["k"]

    def ints(low, high, shape):
        return torch.randint(low, high, shape, generator=gen, device=device)

    sixteenths = ints(1, 7, (m, k)) * (ints(0, 2, (m, k)) * 2 - 1)
    if case.get("spread"):  # one size drawn for all rows, so that row r's 2**(4r - 4) keeps them apart
        exponents = ints(-4, 5, (1, 1)).double() + 4 * torch.arange(m, device=device)[:, None] - 4
    else:
        exponents = ints(-4, 5, (m, 1)).double()
    x = (ints(-126, 127, (m, k)) + sixteenths / 16) * 2.0**exponents
    top = ints(0, k, (m,))
    rows = torch.arange(m, device=device)
    x[rows, top] = (ints(0, 2, (m,)) * 2 - 1) * 127 * 2.0 ** exponents[:, 0]
    if case.get("inf"):
        columns = torch.arange(k, device=device)
        infinite = (columns[None, :] % 7 == 3) & (columns[None, :] != top[:, None])
        x = torch.where(infinite, torch.sign(x) * float("inf"), x)
    if case.get("zeros"):
        x[0] = 0
    return (x.to(dtype),)


def _finite_absmax(x):
    return torch.where(torch.isfinite(x), x.abs(), torch.zeros_like(x)).amax(dim=1)


def _codes(x, scale, *, rounding=torch.round, clamp=True):
    """The codes of x at a scale per row, in float64; without the clamp, codes beyond int8 are undefined."""
    y = x / scale[:, None]
    codes = rounding(y.clamp(-127, 127) if clamp else y)
    return codes if clamp else torch.where(codes.abs() <= 127, codes, _UNDEFINED)


def _row_scale(absmax):
    return torch.where(absmax > 0, absmax / 127, torch.ones_like(absmax))


def _reference(x):
    scale = _row_scale(_finite_absmax(x))
    return _codes(x, scale), scale


def _shared_scale(rows_per_scale):
    """One scale for every rows_per_scale(launch) rows (the whole tensor, or a program's rows): their largest absmax."""

    def reference(x, case, launch):
        group = rows_per_scale(x, launch)
        absmax = _finite_absmax(x)
        padded = torch.nn.functional.pad(absmax, (0, -len(absmax) % group))
        shared = padded.view(-1, group).amax(dim=1).repeat_interleave(group)[: len(absmax)]
        scale = _row_scale(shared)
        return _codes(x, scale), scale

    return reference


def _rows_per_program(x, launch):
    rows = launch.get("BLOCK_M")
    return rows if isinstance(rows, int) and rows > 0 else _BLOCK_M


def _rounded_with(rounding):
    def reference(x, case, launch):
        scale = _row_scale(_finite_absmax(x))
        return _codes(x, scale, rounding=rounding), scale

    return reference


def _without_clamp(x, case, launch):
    scale = _row_scale(_finite_absmax(x))
    return _codes(x, scale, clamp=False), scale


def _inf_in_absmax(x, case, launch):
    """absmax over every value: inf in a row with one, so its scale is inf, its finite values code 0 and its infinities
    inf / inf = NaN (undefined once cast)."""
    absmax = x.abs().amax(dim=1)
    scale = _row_scale(absmax)
    codes = torch.where(torch.isfinite(x), _codes(x, scale), _UNDEFINED)
    return codes, scale


def _zero_row_nan(x, case, launch):
    """scale = absmax / 127 = 0 for a row of zeros, and its codes 0 / 0 = NaN (undefined once cast)."""
    absmax = _finite_absmax(x)
    scale = absmax / 127
    codes = torch.where((absmax > 0)[:, None], _codes(x, _row_scale(absmax)), _UNDEFINED)
    return codes, scale


_PER_TENSOR = (
    "one scale for several rows (the whole tensor, or the rows of a program's tile): each row has its own absmax, "
    "tl.max(|x|, axis=1), a [BLOCK_M] vector, not tl.max over the whole tile"
)
_SPREAD = Probe(
    case={"m": 3, "k": 40, "spread": 1},
    make_inputs=_rows,
    description="rows whose sizes differ by 2**4 and more",
    mistakes=(
        Mistake("per-tensor-scale", _PER_TENSOR, _shared_scale(lambda x, launch: x.shape[0])),
        Mistake("per-tensor-scale", _PER_TENSOR, _shared_scale(_rows_per_program)),
        Mistake(
            "truncated-not-rounded",
            "the codes are truncated toward zero, not rounded: .to(tl.int8) drops the fraction (2.8 becomes 2, "
            "-2.8 becomes -2). Round first: tl.floor(y + 0.5), then convert",
            _rounded_with(torch.trunc),
        ),
        Mistake(
            "floored-not-rounded",
            "the codes are rounded down (tl.floor(y): 2.8 becomes 2), not to the nearest integer: tl.floor(y + 0.5)",
            _rounded_with(torch.floor),
        ),
    ),
)
_INFINITIES = Probe(
    case={"m": 3, "k": 40, "inf": 1},
    make_inputs=_rows,
    description="rows holding +-inf",
    mistakes=(
        Mistake(
            "missing-clamp",
            "the codes are not clamped to [-127, 127]: inf / scale is inf, and converting it to int8 gives whatever "
            "the machine gives (here not +-127). Clamp before converting: tl.clamp(y, -127.0, 127.0)",
            _without_clamp,
        ),
        Mistake(
            "inf-in-absmax",
            "an inf sets the scale: the absmax must be over the finite values (tl.where(|x| < inf, |x|, 0.0)), "
            "else the scale is inf and every finite value of the row codes to 0",
            _inf_in_absmax,
        ),
    ),
)
_ZERO_ROW = Probe(
    case={"m": 3, "k": 40, "zeros": 1},
    make_inputs=_rows,
    description="a row of zeros",
    mistakes=(
        Mistake(
            "zero-row-nan",
            "a row of zeros gets scale 0 (absmax 0 / 127), and its codes 0 / 0 = NaN, which int8 cannot hold. Where "
            "the absmax is 0 the scale is 1 (tl.where(absmax > 0, absmax / 127, 1.0)), so the codes are 0",
            _zero_row_nan,
        ),
    ),
)

PUZZLE = Puzzle(
    title="INT8 quantization, a scale per row",
    kernel="quantize_rows_kernel",
    launcher="quantize_rows",
    make_inputs=_rows,
    reference=_reference,
    outputs=("q", "scale"),
    out_shape=lambda case: ((case["m"], case["k"]), (case["m"],)),
    out_dtype=lambda dtype: (torch.int8, torch.float32),
    cases=(
        {"m": 1, "k": 1},
        {"m": 7, "k": 37},
        {"m": 6, "k": 300, "zeros": 1},
        {"m": 9, "k": 50, "inf": 1},
        {"m": 5, "k": 20, "zeros": 1, "inf": 1},
    ),
    gpu_cases=({"m": 4096, "k": 4096}, {"m": 1000, "k": 3000, "zeros": 1, "inf": 1}),
    dtypes=(torch.float32, torch.float16),
    # The codes are exact (no ties); a scale computed as absmax * (1 / 127) may be an ulp off.
    tolerance=lambda case, dtype, device: Tolerance(atol=0.0, rtol=1e-6),
    probes=(_SPREAD, _INFINITIES, _ZERO_ROW),
    hints=(
        "Start as puzzle 9 does, with a tile of BLOCK_M rows: o_m from tl.program_id(0), o_k = tl.arange(0, "
        "BLOCK_K), a mask on both, and load x as float32.",
        "absmax = tl.max(|x|, axis=1): one per row. Infinities must not count: take tl.where(|x| < inf, |x|, 0.0) "
        "first.",
        "scale = tl.where(absmax > 0, absmax / 127, 1.0); y = x / scale[:, None].",
        "Clamp, then round: tl.floor(tl.clamp(y, -127.0, 127.0) + 0.5), and .to(tl.int8) on the store. Store "
        "the codes with the tile's mask and the scales with o_m < n_rows.",
    ),
)
