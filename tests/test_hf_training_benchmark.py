"""benchmarks/hf_training.py: its models are the sizes its tables state, and its toy run trains the MoE model the
same patched and unpatched. The timed runs need a GPU and are the lead's to run (benchmarks/results/)."""

import json
import math

import pytest
import transformers

from helpers import benchmark_script

script = benchmark_script("hf_training")


def _parameters(config: dict) -> tuple[int, int]:
    """All parameters and the routed experts' of a model of the benchmark's families, from its config: tied
    embeddings; per layer the attention's projections (plus Qwen3's q/k norms in the MoE family), two norms, and a
    SwiGLU MLP or the router with its experts; the final norm. Counted, not built on the meta device: under the suite's
    allocation poisoning torch.empty is a wrapper that torch's device context does not redirect, so the full models
    would be initialised for real, a minute of the suite."""
    hidden, heads, kv_heads, head_dim = (config[k] for k in ("hidden_size", "num_attention_heads",
                                                              "num_key_value_heads", "head_dim"))  # fmt: skip
    assert config["tie_word_embeddings"]
    attention = hidden * head_dim * (2 * heads + 2 * kv_heads)
    moe = "num_experts" in config
    experts = config["num_experts"] * 3 * hidden * config["moe_intermediate_size"] if moe else 0
    mlp = experts + config["num_experts"] * hidden if moe else 3 * hidden * config["intermediate_size"]
    layer = attention + (2 * head_dim if moe else 0) + 2 * hidden + mlp
    layers = config["num_hidden_layers"]
    return config["vocab_size"] * hidden + layers * layer + hidden, layers * experts


@pytest.mark.parametrize("name", sorted(script.MODELS))
def test_the_parameter_count_matches_transformers_models(name):
    """The count above, on the toy config of each family, against the model transformers builds."""
    spec = script.MODELS[name]
    model = getattr(transformers, spec.causal_lm_class)(getattr(transformers, spec.config_class)(**spec.tiny_config))
    experts = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    assert _parameters(spec.tiny_config) == (sum(p.numel() for p in model.parameters()), experts)


@pytest.mark.parametrize("name", sorted(script.MODELS))
def test_each_heading_states_the_model_s_parameters(name):
    """In billions; for the MoE model also those one token uses (the experts' scaled by top-k over experts)."""
    spec = script.MODELS[name]
    total, experts = _parameters(spec.config)
    size = f"{total / 1e9:.1f}B"
    if experts:
        active = total - experts * (1 - spec.config["num_experts_per_tok"] / spec.config["num_experts"])
        size += f" ({active / 1e9:.1f}B active)"
    assert spec.size == size


def test_moe_training_on_a_toy_model_agrees_patched_and_unpatched(tmp_path):
    """--tiny: one fp32 step of hf and tritonkit on the CPU; tritonkit's patch (norms, RoPE, attention, fused loss
    with the routers' loss) gives hf's loss to fp32 precision, about the entropy of the random tokens."""
    assert script.main(["--model", "moe", "--tiny", "--out", str(tmp_path)]) == 0
    (record_path,) = tmp_path.glob("*-hf-training-moe-1.7b-tiny.json")
    record = json.loads(record_path.read_text())
    assert record["config"]["num_experts"] == 4 and record["config"]["output_router_logits"]
    hf, tritonkit = record["results"]
    assert (hf["provider"], tritonkit["provider"]) == ("hf", "tritonkit")
    assert len(hf["losses"]) == len(tritonkit["losses"]) == 1
    assert abs(hf["losses"][0] - math.log(record["config"]["vocab_size"])) < 0.5  # random weights and tokens
    assert tritonkit["losses"][0] == pytest.approx(hf["losses"][0], abs=1e-4)
    markdown = (tmp_path / f"{record_path.stem}.md").read_text()
    assert markdown.startswith("# Qwen3-MoE-like toy-sized training, fp32, seq 8, batch 1 (cpu)")
    assert "| tritonkit |" in markdown


def test_tiny_refuses_the_providers_it_cannot_run_in_one_process():
    with pytest.raises(SystemExit):
        script.main(["--tiny", "--providers", "liger"])
