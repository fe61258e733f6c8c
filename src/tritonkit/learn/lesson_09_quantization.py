"""Quantization from scratch: INT8 with absmax scales, then NF4, and the error against bits and block size.

A weight or activation in 8 or 4 bits takes a half or a quarter of the memory and of the traffic of bf16.
Each value becomes a small integer code, and a few float32 scales bring the codes back to the values' range.

(a) Absmax quantization to b bits. Cut the values into groups (a whole row, or G consecutive values) and give
    each group one scale:

        qmax = 2^(b-1) - 1  (127 for INT8),   scale = max |x| / qmax  (1 for a group of zeros),
        q = clamp(round(x / scale), -qmax, qmax),   x' = q * scale  (dequantize: one multiply)

    round is to the nearest integer, ties to even (as torch.round): floor(y + 0.5), then one step down where
    y was exactly halfway and the result came out odd. The clamp keeps q in range whatever rounding does;
    the codes stay symmetric (-128 is never used), so 0 is exact. The group's largest value maps to +-qmax
    exactly, and the rounding error of any value is at most scale / 2: a group with one large outlier
    gets a large scale, and all its other values lose precision. Smaller groups confine an outlier to
    fewer neighbours, at the cost of more scales to store (32 bits each: 1 bit per weight at G = 32).
    On a GPU the divisions are tl.math.div_rn: Triton compiles `/` on float32 to an approximate division
    (2 ulp), and the codes would differ from torch's now and then.

(b) NF4 (QLoRA's 4-bit NormalFloat). Trained weights are close to normally distributed, so evenly spaced
    codes waste levels in the tails. NF4's 16 values are quantiles of the standard normal: 8 positive ones
    at probabilities evenly spaced from 0.9677 down to 0.5 (0.5 left out), 7 negative ones mirrored the
    same way, and an exact 0, all divided by the largest so that they span [-1, 1]. Blocks of 64 values share
    one absmax: each value is multiplied by 1 / absmax and becomes the index of the nearest of the 16
    values (the number of midpoints between neighbouring values that lie below it), and two indices share
    a byte, the first in the high nibble. Dequantizing looks the index up in the 16-entry table and
    multiplies by the block's absmax.

The kernels below are small: one program handles several groups as a 2-D block, [groups, values], and a
reduction along the values gives each group its absmax. Under the interpreter the lesson quantizes a
(64, 1000) tensor and a (32, 1024) weight; on a GPU larger ones. With --out DIR it plots the error against
the number of bits and the group size.

The production ops: tk.ops.quantize(x, torch.int8, granularity="row" or "group") and tk.ops.dequantize
(also float8 e4m3/e5m2, per-tensor and 128 x 128 block scales, inf and NaN handled), and tk.ops.nf4_quantize /
tk.ops.nf4_dequantize (bitsandbytes' format bit for bit, double quantization of the absmax values too).
"""

from __future__ import annotations

from pathlib import Path

import torch
import triton
import triton.language as tl

from tritonkit import debug


def values_per_program() -> int:
    """Groups x values in one program's block: few programs under the interpreter, where each costs milliseconds;
    on a GPU 16 values a thread at 4 warps."""
    return 16384 if debug.interpreting() else 2048


NF4_QUANTILE = 0.9677083  # QLoRA's outer probability: the largest NF4 value is the normal quantile at this level


# --------------------------------------------------------------------------------------------------
# (a) absmax quantization to b bits
# --------------------------------------------------------------------------------------------------
@triton.jit
def round_half_even(b_y):
    """The nearest integer to each value, ties to the even one: floor(y + 0.5), one less where y + 0.5 was an odd
    integer (exact for |y| < 2^22, far more than any code needs)."""
    b_r = tl.floor(b_y + 0.5)
    b_odd = b_r - 2.0 * tl.floor(b_r * 0.5) != 0.0
    return tl.where((b_r - b_y == 0.5) & b_odd, b_r - 1.0, b_r)


@triton.jit
def absmax_quantize_kernel(
    p_x, p_q, p_scale, n_groups, group_size, QMAX: tl.constexpr, GROUPS: tl.constexpr, BLOCK: tl.constexpr
):
    """GROUPS groups of group_size consecutive values of the flattened x (BLOCK >= group_size):

    scale = max |x| / QMAX  (1 for a group of zeros),   q = clamp(round_half_even(x / scale), -QMAX, QMAX)
    """
    o_g = tl.program_id(0) * GROUPS + tl.arange(0, GROUPS)
    o_v = tl.arange(0, BLOCK)
    m_g = o_g < n_groups
    m_x = m_g[:, None] & (o_v < group_size)[None, :]
    o_x = o_g.to(tl.int64)[:, None] * group_size + o_v[None, :]
    b_x = tl.load(p_x + o_x, mask=m_x, other=0.0).to(tl.float32)  # [GROUPS, BLOCK]; masked lanes: |0| adds nothing
    amax = tl.max(tl.abs(b_x), axis=1)  # [GROUPS]
    scale = tl.where(amax > 0.0, tl.math.div_rn(amax, QMAX), 1.0)
    b_q = round_half_even(tl.math.div_rn(b_x, scale[:, None]))
    b_q = tl.minimum(tl.maximum(b_q, -QMAX), QMAX)
    tl.store(p_q + o_x, b_q.to(tl.int8), mask=m_x)
    tl.store(p_scale + o_g, scale, mask=m_g)


def absmax_quantize(x: torch.Tensor, group_size: int, bits: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes int8 of x's shape, scales fp32 (numel / group_size,)) of a contiguous x whose numel is a multiple of
    group_size (group_size = the last dimension: one scale per row)."""
    q = torch.empty(x.shape, dtype=torch.int8, device=x.device)
    scale = torch.empty(x.numel() // group_size, dtype=torch.float32, device=x.device)
    block = triton.next_power_of_2(group_size)
    groups = max(1, values_per_program() // block)
    absmax_quantize_kernel[(triton.cdiv(scale.numel(), groups),)](
        x, q, scale, scale.numel(), group_size, QMAX=2 ** (bits - 1) - 1, GROUPS=groups, BLOCK=block
    )
    return q, scale


def absmax_dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x' = q * scale (fp32), each group's scale repeated over its values."""
    return (q.view(scale.numel(), -1).float() * scale[:, None]).view(q.shape)


# --------------------------------------------------------------------------------------------------
# (b) NF4
# --------------------------------------------------------------------------------------------------
def nf4_values_from_the_normal() -> torch.Tensor:
    """The 16 NF4 values computed as QLoRA defines them (float64): normal quantiles at 8 evenly spaced
    probabilities from NF4_QUANTILE to 0.5 (the positive half, 0.5 itself left out), 7 for the negative half,
    an exact 0, all divided by the largest."""
    quantile = torch.special.ndtri
    positive = quantile(torch.linspace(NF4_QUANTILE, 0.5, 9, dtype=torch.float64)[:-1])
    negative = -quantile(torch.linspace(NF4_QUANTILE, 0.5, 8, dtype=torch.float64)[:-1])
    values = torch.cat([positive, torch.zeros(1, dtype=torch.float64), negative]).sort().values
    return values / values.max()


@triton.jit
def nearest_nf4(b_x, p_code):
    """The index of the NF4 value nearest each x in [-1, 1]: the number of midpoints (code[j] + code[j + 1]) / 2
    below x (on a midpoint, the lower index), found by a branch-free binary search over the 15 sorted midpoints:
    four steps of 8, 4, 2 and 1, each comparing x with the midpoint just below the candidate index."""
    b_index = tl.zeros(b_x.shape, tl.int32)
    for step in tl.static_range(3, -1, -1):
        b_probe = b_index + (1 << step) - 1  # the midpoint between code[probe] and code[probe + 1]
        b_mid = (tl.load(p_code + b_probe) + tl.load(p_code + b_probe + 1)) * 0.5
        b_index += tl.where(b_x > b_mid, 1 << step, 0)
    return b_index


@triton.jit
def nf4_quantize_kernel(p_w, p_packed, p_absmax, p_code, n, BLOCKSIZE: tl.constexpr, BLOCKS: tl.constexpr):
    """BLOCKS blocks of BLOCKSIZE values of the flattened w: absmax = max |w| per block; each value times 1 / absmax
    (in [-1, 1]) becomes the index of the nearest code value (:func:`nearest_nf4`); values 2i and 2i + 1 share byte
    i, 2i in the high nibble."""
    o_block = tl.program_id(0) * BLOCKS + tl.arange(0, BLOCKS)
    o_pair = tl.arange(0, BLOCKSIZE // 2)
    o_even = o_block.to(tl.int64)[:, None] * BLOCKSIZE + 2 * o_pair[None, :]  # [BLOCKS, BLOCKSIZE / 2]
    b_even = tl.load(p_w + o_even, mask=o_even < n, other=0.0).to(tl.float32)
    b_odd = tl.load(p_w + o_even + 1, mask=o_even + 1 < n, other=0.0).to(tl.float32)
    absmax = tl.maximum(tl.max(tl.abs(b_even), axis=1), tl.max(tl.abs(b_odd), axis=1))  # [BLOCKS]
    tl.store(p_absmax + o_block, absmax, mask=o_block * BLOCKSIZE < n)
    inverse = tl.where(absmax > 0.0, tl.math.div_rn(1.0, absmax), 0.0)[:, None]  # a block of zeros stays 0
    b_high = nearest_nf4(b_even * inverse, p_code)
    b_low = nearest_nf4(b_odd * inverse, p_code)
    o_byte = o_block.to(tl.int64)[:, None] * (BLOCKSIZE // 2) + o_pair[None, :]
    tl.store(p_packed + o_byte, ((b_high << 4) | b_low).to(tl.uint8), mask=o_even < n)


@triton.jit
def nf4_dequantize_kernel(p_packed, p_absmax, p_code, p_out, n, BLOCKSIZE: tl.constexpr, PAIRS: tl.constexpr):
    """PAIRS bytes: w[2i] = code[byte >> 4] * absmax, w[2i + 1] = code[byte & 15] * absmax, absmax of the block of
    2i."""
    o_pair = tl.program_id(0).to(tl.int64) * PAIRS + tl.arange(0, PAIRS)
    o_even = 2 * o_pair
    m_pair = o_even < n
    b_byte = tl.load(p_packed + o_pair, mask=m_pair, other=0).to(tl.int32)  # [PAIRS]
    b_absmax = tl.load(p_absmax + o_even // BLOCKSIZE, mask=m_pair, other=0.0)
    tl.store(p_out + o_even, tl.load(p_code + (b_byte >> 4)) * b_absmax, mask=m_pair)
    tl.store(p_out + o_even + 1, tl.load(p_code + (b_byte & 15)) * b_absmax, mask=o_even + 1 < n)


def nf4_quantize(w: torch.Tensor, code: torch.Tensor, blocksize: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """(packed uint8 (ceil(numel / 2),), absmax fp32 (one per block)) of a contiguous w; ``code``: the 16 values."""
    n = w.numel()
    packed = torch.empty((n + 1) // 2, dtype=torch.uint8, device=w.device)
    absmax = torch.empty(triton.cdiv(n, blocksize), dtype=torch.float32, device=w.device)
    blocks = max(1, values_per_program() // blocksize)
    grid = (triton.cdiv(absmax.numel(), blocks),)
    nf4_quantize_kernel[grid](w, packed, absmax, code, n, BLOCKSIZE=blocksize, BLOCKS=blocks)
    return packed, absmax


def nf4_dequantize(packed, absmax, code, shape, blocksize: int = 64) -> torch.Tensor:
    n = int(torch.Size(shape).numel())
    out = torch.empty(shape, dtype=torch.float32, device=packed.device)
    pairs = values_per_program() // 2
    nf4_dequantize_kernel[(triton.cdiv(packed.numel(), pairs),)](packed, absmax, code, out, n, BLOCKSIZE=blocksize,
                                                                 PAIRS=pairs)  # fmt: skip
    return out


# --------------------------------------------------------------------------------------------------
# The lesson
# --------------------------------------------------------------------------------------------------
def relative_error(approx: torch.Tensor, exact: torch.Tensor) -> float:
    """||approx - exact|| / ||exact||, the relative RMS error."""
    return ((approx.double() - exact.double()).norm() / exact.double().norm()).item()


def _int8_part(device, generator) -> None:
    import tritonkit as tk

    rows, cols = (64, 1000) if device == "cpu" else (4096, 4000)
    x = torch.randn(rows, cols, device=device, generator=generator)
    x[3, 17] = 40.0  # an outlier: row 3's scale grows, its other values lose precision
    x[5] = 0.0  # a row of zeros: scale 1, codes 0, no division by zero
    print(f"(a) INT8 with one absmax scale per row, x ({rows}, {cols}) float32 (an outlier in row 3, row 5 zeros)")
    q, scale = absmax_quantize(x, cols)
    tk_q, tk_scale = tk.ops.quantize(x, torch.int8, granularity="row")
    same = torch.equal(q, tk_q) and torch.equal(scale, tk_scale.view(-1))
    print(f"    codes and scales equal to tk.ops.quantize(x, torch.int8, granularity='row'): {same}")
    assert same
    print(f"    scale of row 3: {scale[3].item():.4f} (40 / 127); of row 4: {scale[4].item():.4f}; of row 5: "
          f"{scale[5].item():.0f}")  # fmt: skip
    x_back = absmax_dequantize(q, scale)
    worst = (x_back.double() - x.double()).abs().amax(dim=1) / scale.double()
    print(f"    largest error of a value, in units of its row's scale: {worst.max().item():.3f} (at most 1/2)")
    # 1/2 from the rounding to a code, plus x' = q * scale's own float32 rounding: half an ulp of up to 127 scales.
    assert worst.max() <= 0.5 + 127 * 2.0**-24, worst.max().item()
    print(f"    relative error of row 3: {relative_error(x_back[3], x[3]):.2e}, of row 4: "
          f"{relative_error(x_back[4], x[4]):.2e}: the outlier costs its row")  # fmt: skip
    q, scale = absmax_quantize(x[:, :896].contiguous(), 128)
    tk_q, tk_scale = tk.ops.quantize(x[:, :896].contiguous(), torch.int8, granularity="group", block_size=128)
    same = torch.equal(q, tk_q) and torch.equal(scale, tk_scale.reshape(-1))
    print(f"    groups of 128 along each row: equal to tk.ops.quantize(..., granularity='group'): {same}")
    assert same


def _nf4_part(device, generator) -> torch.Tensor:
    import tritonkit as tk
    from tritonkit._core.fourbit import NF4_CODE

    derived = nf4_values_from_the_normal()
    table = torch.tensor(NF4_CODE, dtype=torch.float32)
    print("\n(b) NF4: the 16 values, from the normal distribution's quantiles")
    print("    " + " ".join(f"{v:+.4f}" for v in derived.tolist()))
    gap = (derived - table.double()).abs().max().item()
    print(f"    the format's float32 table (bitsandbytes', tk's) differs by at most {gap:.1e}; the kernels use it")
    assert gap < 1e-6
    code = table.to(device)
    rows, cols = (32, 1024) if device == "cpu" else (4096, 4096)
    w = torch.randn(rows, cols, device=device, generator=generator) * 0.02
    packed, absmax = nf4_quantize(w, code)
    tk_packed, state = tk.ops.nf4_quantize(w, blocksize=64)
    same = torch.equal(packed, tk_packed) and torch.equal(absmax, state.absmax)
    print(f"    w ({rows}, {cols}), blocks of 64: bytes and absmax equal to tk.ops.nf4_quantize: {same}; "
          f"{packed.numel()} bytes + {absmax.numel()} scales for {w.numel()} values")  # fmt: skip
    assert same
    w_back = nf4_dequantize(packed, absmax, code, w.shape)
    same = torch.equal(w_back, tk.ops.nf4_dequantize(tk_packed, state, dtype=torch.float32))
    print(f"    dequantized: equal to tk.ops.nf4_dequantize: {same}; relative error {relative_error(w_back, w):.3f}")
    assert same
    return code


def error_sweep(device, generator, code) -> dict:
    """Relative error of a normal weight quantized with absmax to 2..8 bits and with NF4, per group size."""
    rows, cols = (32, 1024) if device == "cpu" else (1024, 4096)
    w = torch.randn(rows, cols, device=device, generator=generator)
    sizes = (32, 64, 128, 256, cols)
    sweep = {"bits": list(range(2, 9)), "sizes": sizes, "absmax": {}, "nf4": {}}
    for size in sizes:
        sweep["absmax"][size] = [relative_error(absmax_dequantize(*absmax_quantize(w, size, bits)), w)
                                 for bits in sweep["bits"]]  # fmt: skip
        sweep["nf4"][size] = relative_error(nf4_dequantize(*nf4_quantize(w, code, size), code, w.shape, size), w)
    return sweep


def plot(sweep: dict, out_dir: str) -> Path:
    from tritonkit.learn import pyplot, save_figure

    plt = pyplot()

    fig, (by_bits, by_storage) = plt.subplots(1, 2, figsize=(12, 4.5))
    for index, size in enumerate(sweep["sizes"]):
        colour = f"C{index}"
        label = f"groups of {size}" if size != sweep["sizes"][-1] else f"one per row ({size})"
        by_bits.plot(sweep["bits"], sweep["absmax"][size], marker="o", color=colour, label=f"absmax, {label}")
        by_bits.plot([4], [sweep["nf4"][size]], marker="*", markersize=12, color=colour, linestyle="none")
        stored = [bits + 32 / size for bits in sweep["bits"]]  # each group's fp32 scale, spread over its values
        by_storage.plot(stored, sweep["absmax"][size], marker="o", color=colour, label=f"absmax, {label}")
        by_storage.plot([4 + 32 / size], [sweep["nf4"][size]], marker="*", markersize=12, color=colour,
                        linestyle="none")  # fmt: skip
    by_bits.plot([], [], marker="*", color="grey", linestyle="none", markersize=12, label="NF4 (4 bits)")
    for ax in (by_bits, by_storage):
        ax.set_yscale("log")
        ax.set_ylabel("relative RMS error (normal weights)")
        ax.grid(True, which="both", alpha=0.3)
    by_bits.set_xlabel("bits per code")
    by_bits.set_title("error halves with each bit; smaller groups help")
    by_bits.legend(fontsize=8)
    by_storage.set_xlabel("bits stored per weight (the code + its share of an fp32 scale)")
    by_storage.set_title("what a group's scale costs")
    return save_figure(fig, out_dir, "quantization_error.png")


def run(out_dir: str | None = None) -> None:
    device = "cpu" if debug.interpreting() else "cuda"
    generator = torch.Generator(device=device).manual_seed(0)
    _int8_part(device, generator)
    code = _nf4_part(device, generator)
    sweep = error_sweep(device, generator, code)
    print("\n(c) relative error of a normal weight, absmax codes of 2 to 8 bits and NF4, by group size:")
    print("    group   " + "".join(f"{bits:>8} b" for bits in sweep["bits"]) + "     NF4")
    for size in sweep["sizes"]:
        print(
            f"    {size:>5}   " + "".join(f"{e:>10.4f}" for e in sweep["absmax"][size]) + f"{sweep['nf4'][size]:>8.4f}"
        )
    four = sweep["bits"].index(4)
    for size in sweep["sizes"]:  # NF4 beats evenly spaced 4-bit codes on normal data, at every group size
        assert sweep["nf4"][size] < sweep["absmax"][size][four], size
    each_bit = [a / b for a, b in zip(sweep["absmax"][64][1:], sweep["absmax"][64][2:], strict=False)]
    print(f"    each bit from 3 to 8 divides the error by {min(each_bit):.2f} to {max(each_bit):.2f} (groups of 64)")
    if out_dir:
        plot(sweep, out_dir)
    else:
        print("    (pass --out DIR to plot it)")


if __name__ == "__main__":
    run()
