"""Other ways to compute :func:`tritonkit.ops.nf4_linear` and :func:`tritonkit.ops.int4_linear`, for benchmarks.

Each factory returns a callable with the specs' ``fn`` signature: (x, packed, *state tensors, shape=, blocksize=,
dtype=, bias=) for NF4 and (x, qweight, scales, zeros, group_size=, dtype=, bias=) for INT4, returning (..., N).

- ``cublas``: F.linear on the full-precision weight (dequantized on the first call for these codes and kept, so the
  timed calls are cuBLAS's GEMM alone): the layer the 4-bit one replaces, reading four times the weight's bytes.
- ``dequantize_cublas``: tritonkit's nf4_dequantize / int4_dequantize, then F.linear, each call: what QLoRA does with
  bitsandbytes' kernels (the weight written and read back in full precision).
- ``compiled_dequantize``: torch.compile of the dequantization written plainly in torch, then F.linear (NF4's lookup
  tables passed in as tensors: made inside the graph, they were host copies that no CUDA graph captures).
- ``bitsandbytes``: ``bitsandbytes.matmul_4bit`` on the same NF4 codes (a QuantState built from them; NF4 only).

This module is imported only by the fourbit spec's peer factories and benchmark scripts, never by an op.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from tritonkit._core.fourbit import NF4State, int4_weight, nf4_tables, nf4_weight
from tritonkit.bench.attention_peers import Unsupported


def _weight(args: tuple, kwargs: dict) -> torch.Tensor:
    """The fp32 weight of a call's 4-bit tensors (torch, from the format's definition)."""
    if "shape" in kwargs:
        return nf4_weight(*args, shape=kwargs["shape"], blocksize=kwargs["blocksize"], tables=kwargs.get("tables"))
    return int4_weight(*args, group_size=kwargs["group_size"])


# Dense weights by their code tensors (kept alive in the key, so that no other tensor takes their id).
_DENSE: dict[tuple, torch.Tensor] = {}


def cublas() -> Callable:
    """F.linear on the weight dequantized once (see the module docstring)."""

    def run(x, *weight, dtype=None, bias=None, **kwargs):
        key = (*weight, x.dtype)
        if key not in _DENSE:
            _DENSE[key] = _weight(weight, kwargs).to(x.dtype)
        return torch.nn.functional.linear(x, _DENSE[key], bias)

    run.__name__ = "cublas"
    return run


def dequantize_cublas() -> Callable:
    """tritonkit's dequantization then F.linear, every call."""
    from tritonkit import ops

    def run(x, *weight, dtype=None, bias=None, **kwargs):
        if "shape" in kwargs:
            packed, *tensors = weight
            state = _state(tensors, kwargs["shape"], kwargs["blocksize"], x.dtype)
            dense = ops.nf4_dequantize(packed, state, dtype=x.dtype)
        else:
            dense = ops.int4_dequantize(*weight, group_size=kwargs["group_size"], dtype=x.dtype)
        return torch.nn.functional.linear(x, dense, bias)

    run.__name__ = "dequantize_cublas"
    return run


def compiled_dequantize() -> Callable:
    """torch.compile of the plain torch dequantization and F.linear."""

    def linear(x, weight, kwargs, bias):
        return torch.nn.functional.linear(x, _weight(weight, kwargs).to(x.dtype), bias)

    compiled = torch.compile(linear, dynamic=False)

    def run(x, *weight, dtype=None, bias=None, **kwargs):
        if "shape" in kwargs:  # NF4's lookup tables as inputs of the graph (module docstring)
            kwargs = {**kwargs, "tables": nf4_tables(x.device)}
        return compiled(x, weight, kwargs, bias)

    run.__name__ = "compiled_dequantize"
    return run


def _state(tensors: list, shape, blocksize: int, dtype) -> NF4State:
    if len(tensors) == 1:
        return NF4State(tuple(shape), dtype, blocksize, absmax=tensors[0])
    codes, scales, offset = tensors
    return NF4State(tuple(shape), dtype, blocksize, absmax_codes=codes, absmax_scales=scales, offset=offset)


def bitsandbytes() -> Callable:
    """bitsandbytes.matmul_4bit over a QuantState of the same NF4 tensors."""
    import bitsandbytes as bnb
    from bitsandbytes.functional import QuantState

    from tritonkit._core.fourbit import NESTED_BLOCK, dynamic_code, nf4_tables

    states: dict[tuple, QuantState] = {}

    def run(x, *weight, dtype=None, bias=None, **kwargs):
        if "shape" not in kwargs:
            raise Unsupported("bitsandbytes: NF4 weights only")
        key = (*weight, x.dtype)
        if key not in states:
            packed, *tensors = weight
            code = nf4_tables(packed.device)[0]
            common = {"shape": torch.Size(kwargs["shape"]), "code": code, "blocksize": kwargs["blocksize"],
                      "quant_type": "nf4", "dtype": x.dtype}  # fmt: skip
            if len(tensors) == 1:
                states[key] = QuantState(absmax=tensors[0], **common)
            else:
                codes, scales, offset = tensors
                inner = QuantState(absmax=scales, code=dynamic_code().to(packed.device), blocksize=NESTED_BLOCK,
                                   dtype=torch.float32)  # fmt: skip
                states[key] = QuantState(absmax=codes, offset=offset, state2=inner, **common)
        packed = weight[0].reshape(-1, 1)
        return bnb.matmul_4bit(x, packed.t(), states[key], bias=bias)

    run.__name__ = "bitsandbytes"
    return run
