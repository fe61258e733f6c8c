"""The 4-bit layers' code-decoding variants at few rows: one GPU, CUDA-graph GPU time
(triton.testing.do_bench_cudagraph), N 14336 and K 4096 in bf16, NF4 double-quantized (blocks of 64) and INT4
(groups of 128), 1 and 16 rows.

- NF4 through each code lookup of the plans (nf4_decode "select", the default, "prmt" and "gather"), the fused
  few-row kernel at its default split count; and the dequantize-first kernel alone (the weight written in bf16,
  QLoRA's path from 17 rows) with each lookup.
- INT4 through its default plan (codes to floats by their bits).
- Peers: cuBLAS bf16 F.linear on the unquantized weight, and bitsandbytes' matmul_4bit on the same NF4 codes where
  bitsandbytes is installed.

    python benchmarks/fourbit_variants.py --out DIR

Prints a table and writes ``<date>-fourbit-variants.json`` into DIR: milliseconds and the GB/s of what each run must
read of the weight (the packed codes and their scales; cuBLAS: the bf16 weight).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
from pathlib import Path

import torch
import triton.testing

import tritonkit as tk
from tritonkit.bench import report
from tritonkit.ops.fourbit import launch
from tritonkit.ops.fourbit.plan import FALLBACK, NF4_DECODES, DequantizeFirst

N, K = 14336, 4096
ROWS = (1, 16)


def _bitsandbytes():
    """bitsandbytes' NF4 GEMV as a callable of the spec's arguments, or None where it is not installed."""
    try:
        from tritonkit.bench import fourbit_peers

        return fourbit_peers.bitsandbytes()
    except ImportError:
        return None


@dataclasses.dataclass(frozen=True)
class _Layers:
    """The weight in each format, once: NF4 codes and state, INT4 codes, scales and zeros, the bf16 weight."""

    nf4: tuple
    int4: tuple
    dense: torch.Tensor

    @classmethod
    def of(cls, weight: torch.Tensor) -> _Layers:
        packed, state = tk.ops.nf4_quantize(weight, blocksize=64, double_quant=True)
        return cls((packed, state), tk.ops.int4_quantize(weight, group_size=128), weight.to(torch.bfloat16))


def _bytes(*tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _runs(x: torch.Tensor, layers: _Layers) -> list[tuple[str, int, object]]:
    """(label, weight bytes read, callable) for x's rows: the fused few-row kernels by lookup, and the peers."""
    packed, state = layers.nf4
    nf4_bytes = _bytes(packed, *state.tensors().values())
    nf4_args = launch.nf4_arguments(packed, state)
    few_rows = FALLBACK[0][1]
    runs = [(f"nf4 {decode}", nf4_bytes,
             functools.partial(launch.nf4_linear_fwd, x, None, *nf4_args,
                               plan=dataclasses.replace(few_rows, nf4_decode=decode)))
            for decode in NF4_DECODES]  # fmt: skip
    runs.append(("int4", _bytes(*layers.int4), functools.partial(launch.int4_linear_fwd, x, None, *layers.int4, 128)))
    runs.append(("cublas bf16", _bytes(layers.dense), functools.partial(torch.nn.functional.linear, x, layers.dense)))
    theirs = _bitsandbytes()
    if theirs is not None:
        tensors = [t for t in (state.absmax_codes, state.absmax_scales, state.offset) if t is not None]
        runs.append(("bitsandbytes nf4", nf4_bytes,
                     functools.partial(theirs, x, packed, *tensors, shape=state.shape, blocksize=64)))  # fmt: skip
    return runs


def _dequantize_runs(layers: _Layers) -> list[tuple[str, int, object]]:
    """The dequantize-first kernel alone (NF4 to bf16, N x K) by lookup: it reads the codes and writes bf16."""
    packed, state = layers.nf4
    nf4 = launch._nf4_weight(*launch.nf4_arguments(packed, state)[:6], K, 64)
    moved = _bytes(packed, *state.tensors().values()) + _bytes(layers.dense)
    return [(f"nf4 dequantize {decode}", moved,
             functools.partial(launch._dequantized, nf4, N, K, torch.bfloat16, packed.device,
                               DequantizeFirst(nf4_decode=decode)))
            for decode in NF4_DECODES]  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.manual_seed(0)
    layers = _Layers.of(torch.randn(N, K, device="cuda") * K**-0.5)
    rows = []

    def measure(label: str, m: int | None, weight_bytes: int, run) -> None:
        ms = triton.testing.do_bench_cudagraph(run)
        gb_s = weight_bytes / ms / 1e6
        rows.append({"run": label, "m": m, "ms": ms, "gb_s": gb_s})
        print(f"{label:22} m={m!s:<4} {ms * 1e3:8.1f} us  {gb_s:7.0f} GB/s", flush=True)

    for m in ROWS:
        x = torch.randn(m, K, device="cuda", dtype=torch.bfloat16)
        for label, weight_bytes, run in _runs(x, layers):
            try:
                measure(label, m, weight_bytes, run)
            except Exception as error:  # a peer's own failure (bitsandbytes' build) costs its row only
                if not label.startswith("bitsandbytes"):
                    raise
                print(f"{label}: {type(error).__name__}: {error}", flush=True)
    for label, moved, run in _dequantize_runs(layers):
        measure(label, None, moved, run)
    record = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "n": N, "k": K, "rows": rows}
    report.write_record(args.out, "fourbit-variants", record)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
