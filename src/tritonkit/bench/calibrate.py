"""Measure a GPU's ceilings once and cache them per device name.

* Bandwidth: tritonkit's own copy kernel (SM-driven loads and stores; the copy engine behind
  ``cudaMemcpy`` reads low) over 2 GiB, counting bytes read plus bytes written, best block size.
* Matmul: dense ``torch.matmul`` on random data in bf16, fp16 and fp32, fp8 (e4m3) through
  ``torch._scaled_mm`` and int8 through ``torch._int_mm`` where this torch and GPU have them; the best of
  4096^3 and 8192^3, because the longer product runs at lower clocks (seen on the H200: 706 against 677
  TFLOP/s in bf16).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from tritonkit.bench.cost import Ceilings, gigabytes_per_second, teraflops_per_second

COPY_ELEMENTS = 1 << 28  # 1 GiB of fp32 read, 1 GiB written
COPY_BLOCK_SIZES = (1024, 2048, 4096, 8192, 16384)
MATMUL_SIZES = (4096, 8192)


def cache_path() -> Path:
    root = os.environ.get("TRITONKIT_CACHE_DIR") or Path.home() / ".cache" / "tritonkit"
    return Path(root) / "calibration.json"


def load(device_name: str, path: Path | None = None) -> Ceilings | None:
    path = path or cache_path()
    if not path.exists():
        return None
    entry = json.loads(path.read_text()).get(device_name)
    if entry is None:
        return None
    return Ceilings(device_name, entry["bandwidth_gbps"], entry["matmul_tflops"])


def save(ceilings: Ceilings, path: Path | None = None) -> Path:
    path = path or cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.loads(path.read_text()) if path.exists() else {}
    data[ceilings.device] = {"bandwidth_gbps": ceilings.bandwidth_gbps, "matmul_tflops": ceilings.matmul_tflops}
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return path


def _median_ms(fn) -> float:
    import triton.testing

    fn()
    torch.cuda.synchronize()
    return triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="median")


def measure_bandwidth() -> tuple[float, dict[int, float]]:
    """Best GB/s (read + written) of tk.ops.copy over the block sizes, and each block size's GB/s."""
    from tritonkit.ops import copy

    x = torch.randn(COPY_ELEMENTS, device="cuda")
    by_block = {}
    for block in COPY_BLOCK_SIZES:
        ms = _median_ms(lambda block=block: copy(x, block_size=block))
        by_block[block] = gigabytes_per_second(2 * x.numel() * x.element_size(), ms)
    return max(by_block.values()), by_block


def _matmul_tflops(dtype: torch.dtype, n: int) -> float:
    """TFLOP/s (TOP/s for int8) of one dense n^3 product in ``dtype`` (fp8 through torch._scaled_mm, int8 through
    torch._int_mm, whose int32 output is the product unscaled)."""
    if dtype == torch.int8:
        a = torch.randint(-127, 128, (n, n), device="cuda", dtype=dtype)
        b = torch.randint(-127, 128, (n, n), device="cuda", dtype=dtype).t()  # a weight in F.linear's layout
        ms = _median_ms(lambda: torch._int_mm(a, b))
    elif dtype == torch.float8_e4m3fn:
        a = torch.randn(n, n, device="cuda").to(dtype)
        b = torch.randn(n, n, device="cuda").to(dtype).t()  # _scaled_mm wants B column-major
        one = torch.ones((), device="cuda")
        ms = _median_ms(lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16))
    else:
        a = torch.randn(n, n, device="cuda", dtype=dtype)
        b = torch.randn(n, n, device="cuda", dtype=dtype)
        ms = _median_ms(lambda: a @ b)
    return teraflops_per_second(2 * n**3, ms)


def measure_matmul() -> dict[str, float]:
    """Best TFLOP/s over MATMUL_SIZES by dtype name; fp8 and int8 only where torch._scaled_mm and torch._int_mm
    run."""
    results = {}
    for dtype in (torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn, torch.int8):
        try:
            results[str(dtype).removeprefix("torch.")] = max(_matmul_tflops(dtype, n) for n in MATMUL_SIZES)
        except (RuntimeError, AttributeError, TypeError):  # no 8-bit matmul on this torch or GPU
            if dtype not in (torch.float8_e4m3fn, torch.int8):
                raise
    return results


def calibrate() -> tuple[Ceilings, dict[int, float]]:
    bandwidth, by_block = measure_bandwidth()
    return Ceilings(torch.cuda.get_device_name(), bandwidth, measure_matmul()), by_block


def load_or_calibrate() -> Ceilings:
    ceilings = load(torch.cuda.get_device_name())
    if ceilings is None:
        ceilings, _ = calibrate()
        save(ceilings)
    return ceilings
