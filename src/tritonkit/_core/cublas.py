"""cuBLAS products of 16-bit operands kept in fp32: the weight-gradient GEMMs of the fused ops.

A plain ``a @ b`` of bf16 or fp16 tensors sums its products in fp32 but rounds the result to 16 bits,
and cuBLAS may also sum split-K partial results in 16 bits (torch's default
``allow_bf16_reduced_precision_reduction``). Where the result is summed further (across chunks, or the
halves of a split operand), that rounding is paid again and again. torch 2.8 added ``out_dtype`` to
``mm``/``addmm`` on CUDA, which keeps the result, and every partial sum, in fp32.
"""

from __future__ import annotations

import contextlib

import torch


def _fp32_output_supported(t: torch.Tensor, overload) -> bool:
    """Whether this torch has the out_dtype ``overload`` (e.g. ``aten.mm.dtype``) and t is on CUDA."""
    return t.device.type == "cuda" and overload is not None


def mm_fp32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b in fp32. 16-bit operands on CUDA: one GEMM with an fp32 result (older torch: the product
    rounded once to the operands' dtype, then widened). On the CPU the operands are widened first: its
    16-bit GEMM does not round once (measured: 5 ulps off in bf16 over a 56-long sum)."""
    if a.dtype == torch.float32:
        return a @ b
    if a.device.type != "cuda":
        return a.float() @ b.float()
    if _fp32_output_supported(a, getattr(torch.ops.aten.mm, "dtype", None)):
        return torch.mm(a, b, out_dtype=torch.float32)
    return (a @ b).float()


@contextlib.contextmanager
def _fp32_reductions():
    """cuBLAS without 16-bit split-K reductions (torch allows them by default), restored after."""
    matmul = torch.backends.cuda.matmul
    saved = matmul.allow_bf16_reduced_precision_reduction, matmul.allow_fp16_reduced_precision_reduction
    matmul.allow_bf16_reduced_precision_reduction = matmul.allow_fp16_reduced_precision_reduction = False
    try:
        yield
    finally:
        matmul.allow_bf16_reduced_precision_reduction, matmul.allow_fp16_reduced_precision_reduction = saved


def mm_rounded(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """a @ b (+ bias) in a's dtype, the products summed in fp32 and rounded once. On CUDA, cuBLAS's
    16-bit GEMM with its split-K reductions kept in fp32: with torch's default it summed partials in
    bf16 (seen on the H200: dx off by up to 8 ulps at 3000 x 3017 x 1000). On the CPU, whose 16-bit GEMM
    does not round once, through fp32."""
    if a.dtype == torch.float32:
        return a @ b if bias is None else torch.addmm(bias, a, b)
    if a.device.type == "cuda":
        with _fp32_reductions():
            return a @ b if bias is None else torch.addmm(bias, a, b)
    product = mm_fp32(a, b)
    return (product if bias is None else product + bias.float()).to(a.dtype)


def mm_rounded_into(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """out = a @ b in out's dtype, a's, rounded once (:func:`mm_rounded`'s product, written into ``out``)."""
    if a.dtype == torch.float32:
        torch.mm(a, b, out=out)
    elif a.device.type == "cuda":
        with _fp32_reductions():
            torch.mm(a, b, out=out)
    else:
        out.copy_(mm_fp32(a, b))


def mm_into_fp32(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """out (fp32) = a @ b (:func:`mm_fp32`'s product, written into ``out``: one GEMM where this torch has the
    out_dtype form)."""
    if a.dtype == torch.float32:
        torch.mm(a, b, out=out)
    elif _fp32_output_supported(out, getattr(torch.ops.aten.mm, "dtype_out", None)):
        torch.mm(a, b, out_dtype=torch.float32, out=out)
    else:
        out.copy_(mm_fp32(a, b))


def addmm_rounded_(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """acc += a @ b in acc's dtype, a's: the products and acc summed in fp32 and rounded once to acc's dtype. On CUDA,
    cuBLAS's addmm (its epilogue reads acc) with split-K reductions kept in fp32; on the CPU, whose 16-bit GEMM
    does not round once, the product in fp32 added to acc, one rounding."""
    if a.dtype == torch.float32:
        acc.addmm_(a, b)
    elif a.device.type == "cuda":
        with _fp32_reductions():
            acc.addmm_(a, b)
    else:
        acc.add_(mm_fp32(a, b))


def addmm_into_fp32(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """acc (fp32) += a @ b. 16-bit operands on CUDA: cuBLAS reads and writes acc in its epilogue (one
    GEMM, no 16-bit rounding). Elsewhere the product is rounded once to 16 bits and added in fp32, still
    never accumulated in 16 bits across calls."""
    if a.dtype == torch.float32:
        acc.addmm_(a, b)
    elif _fp32_output_supported(acc, getattr(torch.ops.aten.addmm, "dtype_out", None)):  # the out= form
        torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)
    else:
        acc.add_(a @ b)
