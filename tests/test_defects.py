"""Checks across every public op, from reported defects: inputs on a device no kernel can run on are refused by the
shared device check, naming the argument, instead of failing inside torch or Triton."""

import inspect
import re

import pytest
import torch

import tritonkit as tk
from tritonkit import catalog
from tritonkit._core.checks import check_device


# Public ops that no spec calls with its own arguments (a spec checks them through a round trip): their arguments.
def _nf4_dequantize_inputs():
    packed, state = tk.ops.nf4_quantize(torch.randn(8, 64))
    return (packed, tk.ops.NF4State(state.shape, state.dtype, state.blocksize, absmax=state.absmax.to("meta"))), {}


def _nf4_linear_inputs():
    (packed, state), _ = _nf4_dequantize_inputs()
    return (torch.randn(3, 64, device="meta"), packed.to("meta"), state), {}


def _int4_linear_inputs():
    weight = tk.ops.int4_quantize(torch.randn(8, 64), group_size=32)
    return (torch.randn(3, 64, device="meta"), *(t.to("meta") for t in weight)), {"group_size": 32}


_OTHER_INPUTS = {"dequantize_kv": lambda: (tk.ops.quantize_kv(torch.randn(3, 16), "int8"), {}),
                 "nf4_dequantize": _nf4_dequantize_inputs, "nf4_linear": _nf4_linear_inputs,
                 "int4_linear": _int4_linear_inputs}  # fmt: skip


def _meta_inputs(name: str):
    """Valid arguments for ``tk.ops.<name>`` with every tensor on the meta device: the op's spec draws them (on the
    CPU, from its first test case whose tensors are all non-empty) and they move to meta."""
    if name in _OTHER_INPUTS:
        args, kwargs = _OTHER_INPUTS[name]()
    else:
        spec = catalog.get(name)
        for case in spec.test_cases:
            inputs = spec.make_inputs(spec.parse_case(case), torch.device("cpu"), spec.dtypes[0], torch.Generator())
            tensors = [value for _, value in inputs.named() if isinstance(value, torch.Tensor)]
            if all(t.numel() for t in tensors):
                break
        args, kwargs = inputs.args, inputs.kwargs

    def meta(value):
        return value.to("meta") if isinstance(value, torch.Tensor) else value

    return [meta(a) for a in args], {key: meta(value) for key, value in kwargs.items()}


@pytest.mark.parametrize("name", tk.ops.__all__)
def test_every_public_op_refuses_meta_inputs_naming_the_argument(name):
    op = getattr(tk.ops, name)
    args, kwargs = _meta_inputs(name)
    with pytest.raises(ValueError, match=r"(\w+) is on the meta device, which holds shapes but no data") as raised:
        op(*args, **kwargs)
    argument = re.match(r"(?:\w+: )?(\w+) is on the meta device", str(raised.value)).group(1)
    assert argument in inspect.signature(op).parameters, str(raised.value)


def test_the_device_check_names_the_argument_and_the_device():
    with pytest.raises(ValueError, match=r"^x is on the meta device, which holds shapes but no data, so no kernel"):
        check_device(x=torch.ones(2, device="meta"))
    with pytest.raises(ValueError, match=r"^x and y must be on the same device, got cpu and meta"):
        check_device(x=torch.ones(2), y=torch.ones(2, device="meta"))
    assert check_device(x=torch.ones(2), y=torch.ones(2)) == torch.device("cpu")  # the interpreter runs on the CPU
