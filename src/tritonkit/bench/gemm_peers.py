"""Other implementations of :func:`tritonkit.ops.scaled_linear` for benchmarks: ``torch._scaled_mm`` (float8, cuBLASLt),
``torch._int_mm`` with the scales applied after (int8), cuBLAS's bf16 ``F.linear`` on operands of the same shape, and
torchao's Triton block-scaled float8 GEMM.

Each factory returns a callable with scaled_linear's signature (x_q, w_q, x_scale, w_scale, bias=, out_dtype=),
returning (..., N). A case a peer cannot compute raises :class:`~tritonkit.bench.attention_peers.Unsupported` on the
call, before any work.

- ``scaled_mm``: float8 codes with tensor or row scales on both sides, and, where this torch's ``_scaled_mm`` takes
  them, 1 x 128 activation groups with 128 x 128 weight blocks (an error from torch is recorded, not hidden).
- ``int_mm``: int8 codes with tensor or row scales: the int32 product, then one elementwise pass for the scales, the
  bias and the cast, as a model without a fused kernel runs it.
- ``int_mm_bare``: ``torch._int_mm`` alone on int8 codes: the unscaled int32 product, no scales, bias or cast (not
  scaled_linear's result, a floor for timing: what a fused kernel's scales must cost nothing against).
- ``cublas``: the bf16 (or fp16) product of operands of the same shapes: the dense layer the quantized one replaces.
  The operands are dequantized on the first call for a given pair of code tensors and kept, so the timed calls are
  the GEMM alone.

- ``torchao``: torchao's Triton block-scaled float8 GEMM (``torchao.kernel.blockwise_quantization.blockwise_fp8_gemm``,
  DeepSeek-V3's kernel): e4m3 codes with 1 x 128 activation groups and 128 x 128 weight blocks, a bf16 output and
  no bias (other cases are refused before torchao is imported, so the refusals hold on a CPU without it).

This module is imported only by the gemm spec's peer factories and benchmark scripts, never by an op.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from tritonkit._core.scales import expand_scale, granularity_of
from tritonkit.bench.attention_peers import Unsupported

FLOAT8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def _granularity(codes: torch.Tensor, scale: torch.Tensor | None) -> str:
    if scale is None:
        return "none"
    found = granularity_of(tuple(codes.shape), tuple(scale.shape))
    return found[0] if found else "unknown"


def scaled_mm() -> Callable:
    """torch._scaled_mm over the codes (see the module docstring)."""

    def run(x_q, w_q, x_scale, w_scale, *, bias=None, out_dtype=torch.bfloat16, check_inputs=None):
        if x_q.dtype not in FLOAT8 or w_q.dtype not in FLOAT8:
            raise Unsupported("scaled_mm: float8 codes only")
        x_kind, w_kind = _granularity(x_q, x_scale), _granularity(w_q, w_scale)
        rows = x_q.reshape(-1, x_q.shape[-1])
        if x_kind in ("tensor", "row") and w_kind in ("tensor", "row"):
            scale_a = x_scale.reshape(()) if x_kind == "tensor" else x_scale.reshape(-1, 1)
            scale_b = w_scale.reshape(()) if w_kind == "tensor" else w_scale.reshape(1, -1)
            if (x_kind == "row") != (w_kind == "row"):  # _scaled_mm takes both tensorwise or both rowwise
                scale_a = scale_a.expand(rows.shape[0], 1).contiguous()
                scale_b = scale_b.expand(1, w_q.shape[0]).contiguous()
        elif x_kind == "group" and w_kind == "block":
            scale_a, scale_b = x_scale.reshape(-1, x_scale.shape[-1]), w_scale.t()  # blockwise, where torch has it
        else:
            raise Unsupported(f"scaled_mm: no {x_kind} x {w_kind} scales")
        out = torch._scaled_mm(rows, w_q.t(), scale_a=scale_a, scale_b=scale_b, bias=bias, out_dtype=out_dtype)
        return out.reshape(*x_q.shape[:-1], w_q.shape[0])

    run.__name__ = "scaled_mm"
    return run


def int_mm() -> Callable:
    """torch._int_mm, then the scales, bias and cast in one elementwise expression."""

    def run(x_q, w_q, x_scale, w_scale, *, bias=None, out_dtype=torch.bfloat16, check_inputs=None):
        if x_q.dtype != torch.int8 or w_q.dtype != torch.int8:
            raise Unsupported("int_mm: int8 codes only")
        x_kind, w_kind = _granularity(x_q, x_scale), _granularity(w_q, w_scale)
        if x_kind not in ("tensor", "row") or w_kind not in ("tensor", "row"):
            raise Unsupported(f"int_mm: the scales must not vary along K, got {x_kind} x {w_kind}")
        rows = x_q.reshape(-1, x_q.shape[-1])
        product = torch._int_mm(rows, w_q.t())
        out = product * x_scale.reshape(-1, 1) * w_scale.reshape(1, -1)
        if bias is not None:
            out = out + bias
        return out.to(out_dtype).reshape(*x_q.shape[:-1], w_q.shape[0])

    run.__name__ = "int_mm"
    return run


def int_mm_bare() -> Callable:
    """torch._int_mm alone: the int32 product of the codes, unscaled (a timing floor, not scaled_linear's result)."""

    def run(x_q, w_q, x_scale, w_scale, *, bias=None, out_dtype=torch.bfloat16, check_inputs=None):
        if x_q.dtype != torch.int8 or w_q.dtype != torch.int8:
            raise Unsupported("int_mm_bare: int8 codes only")
        return torch._int_mm(x_q.reshape(-1, x_q.shape[-1]), w_q.t())

    run.__name__ = "int_mm_bare"
    return run


# Dequantized operands by their code tensors (kept alive in the key, so that no other tensor takes their id).
_DENSE: dict[tuple, tuple] = {}


def _dense(codes: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    if scale is None:
        return codes.to(dtype)
    granularity, size = granularity_of(tuple(codes.shape), tuple(scale.shape))
    return (codes.float() * expand_scale(scale, tuple(codes.shape), granularity, size)).to(dtype)


def cublas() -> Callable:
    """F.linear in the output dtype (bf16 or fp16) on the dequantized operands (see the module docstring)."""

    def run(x_q, w_q, x_scale, w_scale, *, bias=None, out_dtype=torch.bfloat16, check_inputs=None):
        if out_dtype == torch.float32:
            raise Unsupported("cublas: the dense peer runs in bf16 or fp16")
        key = (x_q, w_q, x_scale, w_scale, out_dtype)
        if key not in _DENSE:
            _DENSE[key] = (_dense(x_q, x_scale, out_dtype), _dense(w_q, w_scale, out_dtype))
        x, w = _DENSE[key]
        return torch.nn.functional.linear(x, w, None if bias is None else bias.to(out_dtype))

    run.__name__ = "cublas"
    return run


TORCHAO_BLOCK = 128  # the group and block size torchao's block-scaled GEMM is written for


def torchao_blockwise() -> Callable:
    """torchao's Triton block-scaled float8 GEMM (see the module docstring)."""

    def run(x_q, w_q, x_scale, w_scale, *, bias=None, out_dtype=torch.bfloat16, check_inputs=None):
        if x_q.dtype != torch.float8_e4m3fn or w_q.dtype != torch.float8_e4m3fn:
            raise Unsupported("torchao: float8 e4m3 codes only")
        x_kind = granularity_of(tuple(x_q.shape), tuple(x_scale.shape)) if x_scale is not None else None
        w_kind = granularity_of(tuple(w_q.shape), tuple(w_scale.shape)) if w_scale is not None else None
        if x_kind != ("group", TORCHAO_BLOCK) or w_kind != ("block", TORCHAO_BLOCK):
            raise Unsupported(f"torchao: 1 x {TORCHAO_BLOCK} groups by {TORCHAO_BLOCK} x {TORCHAO_BLOCK} blocks only, "
                              f"got {x_kind} x {w_kind}")  # fmt: skip
        if bias is not None or out_dtype != torch.bfloat16:
            raise Unsupported("torchao: a bf16 output without a bias only")
        from torchao.kernel.blockwise_quantization import blockwise_fp8_gemm  # after the refusals: see above

        k = x_q.shape[-1]
        out = blockwise_fp8_gemm(x_q.reshape(-1, k).contiguous(), x_scale.reshape(-1, x_scale.shape[-1]).contiguous(),
                                 w_q.contiguous(), w_scale.contiguous(), TORCHAO_BLOCK)  # fmt: skip
        return out.reshape(*x_q.shape[:-1], w_q.shape[0])

    run.__name__ = "torchao_blockwise"
    return run
