"""Puzzle 15: NF4 dequantization (bitsandbytes' 4-bit NormalFloat weights).

    out[i] = code[q_i] * absmax[i // blocksize]

q_i is the 4-bit code of value i: an index into code, the 16-entry code book (the NF4 values,
quantiles of a normal distribution scaled to [-1, 1]). The code book value is what gets scaled,
not the 4-bit number. Two codes share a byte, the first in the high nibble, as bitsandbytes stores
them: packed[j] = q_2j << 4 | q_2j+1 (for an odd n, the low nibble of the last byte is padding).
absmax holds one float32 per block of blocksize consecutive values; the last block may be shorter.

Shapes: packed is (cdiv(n, 2),) uint8, absmax (cdiv(n, blocksize),) float32, code (16,) float32,
out (n,) float32 or bfloat16. blocksize is even (32 or 64 here, a keyword of the launcher).

Blocks: cdiv(n_bytes, BLOCK) programs of BLOCK = 64 bytes, so 2 * BLOCK values each. Byte j holds
values 2j (high nibble) and 2j + 1 (low nibble); a value's block is its value index // blocksize,
not its byte index's.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def nf4_dequantize_kernel(p_packed, p_absmax, p_code, p_out, n, blocksize, BLOCK: tl.constexpr):
    """Values 2j and 2j + 1 of BLOCK bytes j: the code book value of each nibble times its block's absmax."""
    o_byte = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    o_high = 2 * o_byte  # the value in the byte's high nibble; o_high + 1 is in its low nibble
    o_low = o_high + 1
    b_bytes = tl.load(p_packed + o_byte, mask=o_high < n, other=0).to(tl.int32)  # [BLOCK]
    b_absmax_high = tl.load(p_absmax + o_high // blocksize, mask=o_high < n, other=0.0)
    b_absmax_low = tl.load(p_absmax + o_low // blocksize, mask=o_low < n, other=0.0)
    b_high = tl.load(p_code + (b_bytes >> 4)) * b_absmax_high  # codes are 0..15: always inside the code book
    b_low = tl.load(p_code + (b_bytes & 15)) * b_absmax_low
    tl.store(p_out + o_high, b_high, mask=o_high < n)
    tl.store(p_out + o_low, b_low, mask=o_low < n)


def nf4_dequantize(packed: torch.Tensor, absmax: torch.Tensor, code: torch.Tensor, out: torch.Tensor, *,
                   blocksize: int) -> None:  # fmt: skip
    """The launcher (given)."""
    n = out.numel()
    BLOCK = 64
    grid = (triton.cdiv(packed.numel(), BLOCK),)
    nf4_dequantize_kernel[grid](packed, absmax, code, out, n, blocksize, BLOCK=BLOCK)


# ===== checker data: not part of the learner's file =====
from tritonkit._core.fourbit import NF4_CODE  # noqa: E402
from tritonkit.puzzles._base import Mistake, Probe, Puzzle  # noqa: E402

_BLOCK = 64  # the launcher's bytes per program, for a mistake's reference when the learner's launch does not say


def _packed(case, dtype, device, gen):
    """Random codes, two a byte (high nibble first), absmax in [0.1, 3) per block, and the NF4 code book."""
    n, blocksize = case["n"], case["blocksize"]
    codes = torch.randint(0, 16, (n + n % 2,), generator=gen, device=device, dtype=torch.uint8)
    codes[n:] = 0  # the padding nibble of an odd n
    packed = codes[0::2] << 4 | codes[1::2]
    absmax = 0.1 + 2.9 * torch.rand(-(-n // blocksize), generator=gen, device=device)
    return packed, absmax, torch.tensor(NF4_CODE, device=device)


def _nibbles(packed, *, high_first=True):
    """The codes in value order."""
    high, low = (packed >> 4).long(), (packed & 15).long()
    first, second = (high, low) if high_first else (low, high)
    return torch.stack((first, second), dim=1).reshape(-1)


def _values(packed, absmax, code, case, *, high_first=True, block_of=None, scaled=None):
    """code[q_i] * absmax[block_of(i)] in float64; ``scaled(q, code)`` replaces the code book value."""
    n, blocksize = case["n"], case["blocksize"]
    q = _nibbles(packed, high_first=high_first)[:n]
    index = torch.arange(n, device=packed.device)
    blocks = index // blocksize if block_of is None else block_of(index)
    value = code[q] if scaled is None else scaled(q, code)
    return value * absmax[blocks]


def _reference(packed, absmax, code, case):
    return _values(packed, absmax, code, case)


def _bytes_per_program(launch):
    block = launch.get("BLOCK")
    return block if isinstance(block, int) and block > 0 else _BLOCK


_BLOCK_INDEX = "the block of value i is i // blocksize, for the high nibble of byte j i = 2j, for the low one 2j + 1"
_PROBE = Probe(
    case={"n": 301, "blocksize": 32},
    make_inputs=_packed,
    description="random codes with a different absmax in each block of 32",
    mistakes=(
        Mistake(
            "swapped-nibbles",
            "the nibbles are swapped: the first value of a byte is in its high nibble (byte >> 4), the second in "
            "its low nibble (byte & 15), as bitsandbytes packs them",
            lambda packed, absmax, code, case, launch: _values(packed, absmax, code, case, high_first=False),
        ),
        Mistake(
            "wrong-block-index",
            f"each value takes the absmax of the block of its byte index (byte // blocksize): {_BLOCK_INDEX}",
            lambda packed, absmax, code, case, launch: _values(
                packed, absmax, code, case, block_of=lambda i: i // 2 // case["blocksize"]
            ),
        ),
        Mistake(
            "wrong-block-index",
            f"each program uses one absmax for all its values (the program id as the block index): {_BLOCK_INDEX}",
            lambda packed, absmax, code, case, launch: _values(
                packed, absmax, code, case, block_of=lambda i: i // (2 * _bytes_per_program(launch))
            ),
        ),
        Mistake(
            "code-scaled-not-looked-up",
            "the 4-bit code itself is scaled (q * absmax): the code is an index into the code book, whose value is "
            "what gets scaled, tl.load(p_code + q) * absmax",
            lambda packed, absmax, code, case, launch: _values(
                packed, absmax, code, case, scaled=lambda q, code: q.to(code.dtype)
            ),
        ),
        Mistake(
            "absmax-not-applied",
            "the code book values are not scaled: multiply each by the absmax of its block",
            lambda packed, absmax, code, case, launch: _values(packed, torch.ones_like(absmax), code, case),
        ),
    ),
)

PUZZLE = Puzzle(
    title="NF4 dequantization, two codes a byte",
    kernel="nf4_dequantize_kernel",
    launcher="nf4_dequantize",
    make_inputs=_packed,
    reference=_reference,
    reference_takes_case=True,  # the length and the block size come from the case
    out_shape=lambda case: (case["n"],),
    cases=(
        {"n": 1, "blocksize": 32},
        {"n": 101, "blocksize": 32},
        {"n": 300, "blocksize": 64},
        {"n": 777, "blocksize": 32},
    ),
    gpu_cases=({"n": (1 << 24) + 3, "blocksize": 64}, {"n": 1_000_001, "blocksize": 4096}),
    dtypes=(torch.float32, torch.bfloat16),
    launcher_kwargs=lambda case: {"blocksize": case["blocksize"]},
    probes=(_PROBE,),
    hints=(
        "Offsets over bytes, as puzzle 1's: o_byte = pid * BLOCK + tl.arange(0, BLOCK). The values of byte j "
        "are 2j and 2j + 1; mask each with value < n.",
        "Load the bytes and widen them (.to(tl.int32)); the high nibble is bytes >> 4, the low one bytes & 15.",
        "Each nibble is an index into the code book: tl.load(p_code + nibble) gives its value in [-1, 1].",
        "Multiply by tl.load(p_absmax + value // blocksize) and store the high nibbles' values at 2j, the low "
        "ones' at 2j + 1.",
    ),
)
