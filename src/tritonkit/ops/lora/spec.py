"""lora_linear in the registry: the float64 reference, typed cases, cost model."""

import math
from dataclasses import dataclass

import torch

from tritonkit._core.checks import FLOAT_DTYPES
from tritonkit.ops.lora.op import lora_linear
from tritonkit.ops.lora.plan import FUSED_MAX_TOKENS
from tritonkit.registry import TOLERANCES, Case, Inputs, KernelSpec, Tolerance, register


@dataclass(frozen=True)
class LoraCase(Case):
    k: int  # in_features
    n: int  # out_features
    r: int  # rank
    m: int = 1  # tokens, unless lead gives x's leading shape
    lead: tuple[int, ...] | None = None
    bias: bool = False
    scale: float = 2.0
    x_transposed: bool = False  # x stored (K, ...): strided rows
    frozen: bool = False  # the base weight is not trained (no dW)
    frozen_x: bool = False  # nor is the input (a first layer): dA without the dx kernel


def _lora_reference(x, weight, lora_a, lora_b, scale, bias=None):
    """What PEFT's eager LoRA computes: two GEMMs and a low-rank product, unfused."""
    y = x @ weight.t() + scale * ((x @ lora_a.t()) @ lora_b.t())
    return y + bias if bias is not None else y


def _lora_inputs(case: LoraCase, device, dtype, generator):
    k, n, r = case.k, case.n, case.r
    lead = _lead(case)

    def randn(*shape, std=1.0):
        return (std * torch.randn(shape, device=device, generator=generator, dtype=torch.float32)).to(dtype)

    # Initialisations that keep every output near unit size: W and A ~ 1/sqrt(K) (as nn.Linear's),
    # B ~ 1/sqrt(r) (a trained adapter; PEFT starts it at zero, which would test nothing).
    x = randn(k, *lead).movedim(0, -1) if case.x_transposed else randn(*lead, k)
    weight = randn(n, k, std=max(k, 1) ** -0.5)
    lora_a = randn(r, k, std=max(k, 1) ** -0.5)
    lora_b = randn(n, r, std=r**-0.5)
    bias = randn(n, std=0.1) if case.bias else None
    # "frozen": the base weight is not trained; "frozen_x": nor is the input (a first layer).
    frozen = frozenset(i for i, flag in ((0, case.frozen_x), (1, case.frozen)) if flag)
    return Inputs((x, weight, lora_a, lora_b, case.scale), {"bias": bias}, frozen)


def _lead(case: LoraCase) -> tuple[int, ...]:
    return case.lead if case.lead is not None else (case.m,)


def _tokens(case: LoraCase) -> int:
    return math.prod(_lead(case))


def _lora_bytes(case, dtype, backward=False):
    """Fewest bytes moved. Forward: x, W, A, B (and bias) in, y out. Backward: dy, x, W, A, B in, dx,
    dA, dB (and dW unless frozen) out."""
    m, k, n, r = _tokens(case), case.k, case.n, case.r
    forward = m * k + n * k + r * (k + n) + m * n
    if not backward:
        return forward * dtype.itemsize
    dw = 0 if case.frozen else n * k
    return (m * n + m * k + n * k + 2 * r * (k + n) + m * k + dw) * dtype.itemsize


def _lora_flops(case, dtype):
    m, k, n, r = _tokens(case), case.k, case.n, case.r
    return 2 * m * (n * k + r * (k + n))


def _lora_flops_bwd(case, dtype):
    """dx and, unless frozen, dW (each the forward's GEMM), plus the rank-r products of dA and dB."""
    m, k, n, r = _tokens(case), case.k, case.n, case.r
    base_gemms = 1 if case.frozen else 2
    return 2 * m * (base_gemms * n * k + 2 * r * (k + n))


LORA_RMS_ATOL = 1e-4


def _lora_tolerance(case, dtype):
    """The table's entry for the dtype, plus 1e-4 of each output's rms (``Tolerance.rms_atol``).

    Every output is a long sum (over K, or over every token for dA, dB, dW), and its rounding error
    scales with the partial sums, not with the result: measured on the H200 at 4096 tokens x 4096 x 4096
    (r 16), an exactly summed fp32 dA was off by 5.7e-6 of its rms where an element cancels to near
    zero, and the 16-bit hi + lo split of dy B adds about as much (6e-6). Per element, the outputs
    are rounded once from fp32 (0.88 of the bf16 entry and 0.47 of the fp16 entry at most, interpreter,
    30 seeds). What the bound still rejects: a 16-bit result or 16-bit split-K partial sums in a
    weight gradient (measured 2.8e-2 of the rms for cuBLAS's bf16 dW = dy^T x), TF32 (about 5e-4) and
    torch's eager LoRA, which rounds x A^T and dy B to the dtype (tests/test_lora.py checks it).
    """
    base = TOLERANCES[dtype]
    return Tolerance(atol=base.atol, rtol=base.rtol, rms_atol=LORA_RMS_ATOL)


_LORA_TESTS = (
    {"m": 1, "k": 1, "n": 1, "r": 1},
    {"m": 7, "k": 33, "n": 70, "r": 8, "bias": True},
    {"lead": (2, 5), "k": 40, "n": 24, "r": 16, "frozen": True},
    {"lead": (3, 4), "k": 70, "n": 33, "r": 1, "bias": True, "frozen": True},
    {"m": 66, "k": 48, "n": 80, "r": 20, "scale": 0.5},  # r padded to 32; two tile-rows
    {"lead": (4, 6), "k": 36, "n": 20, "r": 8, "x_transposed": True, "bias": True},
    {"m": 9, "k": 20, "n": 30, "r": 4, "frozen": True, "frozen_x": True},  # dA without the dx kernel
    {"m": 0, "k": 16, "n": 8, "r": 4, "bias": True},
    {"m": 5, "k": 0, "n": 9, "r": 2, "bias": True},
    # Up to FUSED_MAX_TOKENS, the fused path: 18 tile-rows of the interpreter's 64, past a group of 8 (a short last
    # group), and 18 token steps of the thin-gradient kernel, the last short.
    {"m": 1100, "k": 40, "n": 24, "r": 8, "bias": True},
    # More tokens than FUSED_MAX_TOKENS: the cuBLAS path, forward and dx.
    {"m": 2054, "k": 40, "n": 24, "r": 8, "bias": True},
    {"lead": (2, 1100), "k": 33, "n": 70, "r": 20, "x_transposed": True, "frozen": True},
)
_LORA_GPU = (
    {"m": 4096, "k": 4096, "n": 4096, "r": 16, "frozen": True},
    {"lead": (3, 1000), "k": 1000, "n": 3001, "r": 8, "bias": True},
    {"m": 2048, "k": 2048, "n": 1024, "r": 64, "x_transposed": True},
    {"m": 127, "k": 4095, "n": 257, "r": 1, "bias": True, "frozen": True},
    {"m": 513, "k": 513, "n": 513, "r": 128},
)
# The small cases first (`--sizes small`: decoding, and the fused kernel's largest), then Llama-7B
# projections over 8192 tokens.
_LORA_BENCH = (
    {"m": 16, "k": 4096, "n": 4096, "r": 16, "frozen": True},
    {"m": 2048, "k": 4096, "n": 4096, "r": 16, "frozen": True},  # the most tokens the fused kernel takes
    {"m": 8192, "k": 4096, "n": 4096, "r": 16, "frozen": True},
    {"m": 8192, "k": 4096, "n": 11008, "r": 16, "frozen": True},
    {"m": 8192, "k": 4096, "n": 4096, "r": 64, "frozen": True},
)

register(
    KernelSpec(
        name="lora_linear",
        family="lora",
        sweep="m",
        case_type=LoraCase,
        summary="Linear layer with a LoRA adapter, x W^T + scale (x A^T) B^T + bias, fused; forward and backward.",
        description=f"Up to {FUSED_MAX_TOKENS} tokens, one Triton GEMM accumulates x W^T and x A^T from the "
        "same tiles of x and adds the adapter's product and the bias before its single store; "
        "dx = dy W + scale (dy B) A is the same kernel. Beyond, where the GEMM is compute-bound, one cuBLAS "
        "GEMM over the inner dimension extended by the adapter. dA and dB are one Triton kernel each over the "
        "same tokens (cuBLAS matmuls with fp32 results beyond); dW (only for a weight that requires grad) and "
        "dbias run in torch. Benchmarked against torch eager (the unfused path PEFT runs) and torch.compile.",
        usage="y = tk.ops.lora_linear(x, weight, lora_a, lora_b, scale=alpha / r, bias=bias)",
        tags=("lora", "gemm", "fused", "compute-bound", "backward"),
        limits="One dtype for all tensors (fp32, fp16, bf16); rank 1 to 128; any leading shape and strides.",
        notes="H200, 8192 tokens, bf16 fwd+bwd: the fused kernel lost to cuBLAS (3.10 against 2.63 ms for "
        f"torch eager), so many tokens take cuBLAS; the {FUSED_MAX_TOKENS}-token crossover lies between measured "
        "points (faster fused at 2048, slower at 4096). The fused GEMM autotunes per (M, N, K) on first use, like "
        "tk.ops.matmul.",
        status="experimental",
        fn=lora_linear,
        reference=_lora_reference,
        make_inputs=_lora_inputs,
        test_cases=_LORA_TESTS,
        gpu_cases=_LORA_GPU,
        bench_cases=_LORA_BENCH,
        bytes_moved=_lora_bytes,
        bytes_moved_bwd=lambda case, dtype: _lora_bytes(case, dtype, backward=True),
        flops=_lora_flops,
        flops_bwd=_lora_flops_bwd,
        dtypes=FLOAT_DTYPES,
        has_backward=True,
        tolerance=_lora_tolerance,
    )
)
