"""tk.nn.LoRALinear over a 4-bit base (QLoRA) and PEFT: the forward and the adapter's gradients against PEFT's layer
on the dequantized weight, adapters saved by PEFT loaded into ours and back, dropout, merge and unmerge, a model cast
to bf16, torch.compile, bad input."""

from collections import OrderedDict

import pytest
import torch
from peft import LoraConfig, get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict

import tritonkit as tk
import tritonkit.nn.fourbit as fourbit_layer
from helpers import assert_compiled_matches_eager, benchmark_script


def _peft_model(linear: torch.nn.Linear, r=4, lora_alpha=8, lora_dropout=0.0):
    model = torch.nn.Sequential(OrderedDict(proj=linear))
    return get_peft_model(model, LoraConfig(r=r, lora_alpha=lora_alpha, lora_dropout=lora_dropout,
                                            target_modules=["proj"]))  # fmt: skip


def _trained(layer) -> None:
    """A trained-looking adapter (PEFT and we both start B at zero, which would test nothing)."""
    with torch.no_grad():
        layer.lora_B["default"].weight.normal_(std=0.3)


def test_full_precision_layer_loads_a_peft_layers_state_dict_and_back():
    peft_layer = _peft_model(torch.nn.Linear(24, 40)).base_model.model.proj
    _trained(peft_layer)
    ours = tk.nn.LoRALinear(24, 40, r=4, lora_alpha=8)
    ours.load_state_dict(peft_layer.state_dict())  # strict: the very same names
    x = torch.randn(3, 24)
    torch.testing.assert_close(ours(x), peft_layer(x), rtol=1e-5, atol=1e-5)
    _trained(ours)
    peft_layer.load_state_dict(ours.state_dict())
    torch.testing.assert_close(peft_layer(x), ours(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("quantize", ["nf4", "int4"])
def test_4bit_base_matches_peft_on_the_dequantized_weight(quantize):
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 48)
    ours = tk.nn.LoRALinear.from_linear(linear, r=4, lora_alpha=8, quantize=quantize, group_size=32)
    _trained(ours)
    dense = torch.nn.Linear(64, 48)
    with torch.no_grad():
        dense.weight.copy_(ours.base_layer.dequantize())
        dense.bias.copy_(linear.bias)
    peft_layer = _peft_model(dense).base_model.model.proj
    peft_layer.load_state_dict({k: v for k, v in ours.state_dict().items() if "lora_" in k}, strict=False)
    x = torch.randn(2, 5, 64, requires_grad=True)
    y_ours, y_peft = ours(x), peft_layer(x)
    torch.testing.assert_close(y_ours, y_peft, rtol=1e-5, atol=1e-5)
    dy = torch.randn_like(y_ours)
    ours_grads = torch.autograd.grad(y_ours, [x, ours.lora_A["default"].weight, ours.lora_B["default"].weight], dy)
    peft_grads = torch.autograd.grad(y_peft, [x, peft_layer.lora_A["default"].weight,
                                              peft_layer.lora_B["default"].weight], dy)  # fmt: skip
    for a, b in zip(ours_grads, peft_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert all(not t.requires_grad for t in ours.base_layer.parameters())


def test_adapters_saved_by_peft_load_into_our_model_and_ours_into_peft():
    torch.manual_seed(0)
    peft_model = _peft_model(torch.nn.Linear(64, 32))
    _trained(peft_model.base_model.model.proj)
    saved = get_peft_model_state_dict(peft_model)  # what adapter_model.safetensors holds
    ours = torch.nn.Sequential(OrderedDict(proj=tk.nn.LoRALinear.from_linear(
        peft_model.base_model.model.proj.base_layer, r=4, lora_alpha=8, quantize="nf4")))  # fmt: skip
    assert set(tk.nn.adapter_state_dict(ours)) == set(saved)
    tk.nn.load_adapter_state_dict(ours, saved)
    for key, value in tk.nn.adapter_state_dict(ours).items():
        assert torch.equal(value, saved[key])
    _trained(ours.proj)
    fresh = _peft_model(torch.nn.Linear(64, 32))
    set_peft_model_state_dict(fresh, tk.nn.adapter_state_dict(ours))
    assert torch.equal(fresh.base_model.model.proj.lora_B["default"].weight, ours.proj.lora_B["default"].weight)
    with pytest.raises(KeyError, match="keys of no LoRALinear layer"):
        tk.nn.load_adapter_state_dict(ours, {**saved, "base_model.model.other.lora_A.weight": torch.ones(1)})


def test_dropout_applies_to_the_adapters_input_in_training_only():
    layer = tk.nn.LoRALinear.from_linear(torch.nn.Linear(32, 16), r=4, lora_dropout=0.5, quantize="nf4")
    _trained(layer)
    assert isinstance(layer.lora_dropout["default"], torch.nn.Dropout)
    x = torch.randn(8, 32)
    layer.eval()
    base = layer.base_layer(x)
    adapter = (x @ layer.lora_A["default"].weight.t()) @ layer.lora_B["default"].weight.t() * layer.scaling
    torch.testing.assert_close(layer(x), base + adapter, rtol=1e-5, atol=1e-5)
    layer.train()
    torch.manual_seed(1)
    dropped = torch.nn.functional.dropout(x, 0.5, training=True)
    torch.manual_seed(1)
    y = layer(x)
    adapter = (dropped @ layer.lora_A["default"].weight.t()) @ layer.lora_B["default"].weight.t() * layer.scaling
    torch.testing.assert_close(y, base + adapter, rtol=1e-5, atol=1e-5)


def _step(base) -> torch.Tensor:
    """Per weight, the largest rounding step of its quantization: half the widest gap between neighbouring NF4
    values times the block's absmax, or an INT4 scale (half a step, and one where the zero point rounds too)."""
    if base.quantize == "nf4":
        blocksize = base.options["blocksize"]
        return 0.5 * (1 - 0.6961928009986877) * base.absmax.repeat_interleave(blocksize).view(48, 64)
    return base.scales.repeat_interleave(32, dim=1)


@pytest.mark.parametrize("quantize", [None, "nf4", "int4"])
def test_merge_adds_the_adapter_and_unmerge_takes_it_out(quantize):
    torch.manual_seed(0)
    options = {} if quantize is None else {"quantize": quantize, **({"group_size": 32} if quantize == "int4" else {})}
    layer = tk.nn.LoRALinear.from_linear(torch.nn.Linear(64, 48), r=4, lora_alpha=8, **options)
    _trained(layer)
    x = torch.randn(5, 64)
    before, state = layer(x), {key: value.clone() for key, value in layer.state_dict().items()}
    exact = (layer.weight if quantize is None else layer.base_layer.dequantize()).detach().float() + layer._delta()
    layer.merge()
    assert layer.merged
    if quantize is None:
        torch.testing.assert_close(layer(x), before, rtol=1e-5, atol=1e-5)  # the base alone, its weight merged
    else:  # requantized: each merged weight within one rounding step of the exact sum
        assert torch.all((layer.base_layer.dequantize() - exact).abs() <= _step(layer.base_layer) * (1 + 1e-5))
    layer.unmerge()
    assert not layer.merged
    torch.testing.assert_close(layer(x), before, rtol=1e-5, atol=1e-5)
    if quantize is not None:  # the original codes, exactly
        assert all(torch.equal(value, state[key]) for key, value in layer.state_dict().items())


def test_a_model_cast_to_bf16_keeps_the_4bit_state_in_fp32():
    layer = tk.nn.LoRALinear.from_linear(torch.nn.Linear(64, 32), r=4, quantize="nf4", double_quant=True)
    layer.to(torch.bfloat16)
    assert layer.base_layer.absmax_scales.dtype == torch.float32 and layer.base_layer.offset.dtype == torch.float32
    assert layer.base_layer.absmax_codes.dtype == torch.uint8 and layer.lora_A["default"].weight.dtype == torch.bfloat16
    assert layer(torch.randn(3, 64, dtype=torch.bfloat16)).dtype == torch.bfloat16


def test_compiles_fullgraph_with_backward(device):
    layer = tk.nn.LoRALinear.from_linear(torch.nn.Linear(64, 32, device=device), r=4, quantize="nf4")
    _trained(layer)

    def block(x):
        return (layer(x) ** 2).sum()

    assert_compiled_matches_eager(block, [torch.randn(2, 3, 64, device=device, requires_grad=True)], device)


@pytest.mark.parametrize("quantize", ["nf4", "int4"])
def test_a_4bit_base_checks_its_codes_once_and_again_when_they_change(quantize, monkeypatch):
    """The codes are checked on the first call and again only when a buffer changes (new codes loaded, moved, its
    .data swapped), and each call multiplies by the codes held then; x is still checked every call."""
    checks = []
    name = f"checked_{quantize}_weight"
    real = getattr(fourbit_layer, name)
    monkeypatch.setattr(fourbit_layer, name, lambda *args: checks.append(1) or real(*args))
    torch.manual_seed(0)
    options = {"group_size": 32} if quantize == "int4" else {"double_quant": True}
    base = tk.nn.Linear4bit.from_linear(torch.nn.Linear(64, 24), quantize, **options)
    x = torch.randn(3, 64)

    def expected():
        return x.double() @ base.dequantize().double().t() + base.bias.double()

    for _ in range(3):
        torch.testing.assert_close(base(x).double(), expected(), rtol=1e-5, atol=1e-5)
    assert len(checks) == 1
    base.load_codes(tk.nn.Linear4bit.quantized(torch.randn(24, 64), quantize, base.options))
    torch.testing.assert_close(base(x).double(), expected(), rtol=1e-5, atol=1e-5)
    assert len(checks) == 2
    base.weight.data = base.weight.data.flip(0)  # the same buffer object, other codes
    torch.testing.assert_close(base(x).double(), expected(), rtol=1e-5, atol=1e-5)
    assert len(checks) == 3
    with pytest.raises(ValueError, match="x's last dimension must equal the weight's in_features 64"):
        base(torch.randn(3, 32))


def test_bad_input_names_the_argument():
    with pytest.raises(ValueError, match="quantize must be one of"):
        tk.nn.LoRALinear.from_linear(torch.nn.Linear(4, 4), quantize="fp4")
    with pytest.raises(ValueError, match=r"\['group_size'\] apply to quantize="):
        tk.nn.LoRALinear.from_linear(torch.nn.Linear(4, 4), group_size=32)
    with pytest.raises(ValueError, match="lora_dropout must be in"):
        tk.nn.LoRALinear(4, 4, lora_dropout=1.0)
    with pytest.raises(TypeError, match=r"linear must be a torch\.nn\.Linear"):
        tk.nn.LoRALinear.from_linear(torch.nn.Conv1d(4, 4, 1))


def test_qlora_training_script_on_a_tiny_model(tmp_path):
    """benchmarks/qlora_training.py --tiny: both runs train the same adapters on the same tokens, and the NF4 base's
    losses stay within its quantization error of the fp32 base's."""
    import json

    script = benchmark_script("qlora_training")
    assert script.main(["--tiny", "--out", str(tmp_path)]) == 0
    (record_path,) = tmp_path.glob("*-qlora-training.json")
    record = json.loads(record_path.read_text())
    eager, qlora = record["rows"]
    assert record["eager_lora"] == "peft" and len(eager["losses"]) == len(qlora["losses"]) == 2
    assert abs(eager["losses"][0] - 4.57) < 0.5  # random weights: about log(97), the vocabulary's entropy
    assert record["largest_loss_difference"] < 0.05
    assert (tmp_path / f"{record_path.stem}.md").read_text().startswith("# QLoRA training (tiny")
