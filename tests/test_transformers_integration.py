"""Hugging Face patching: per-instance, reversible, and training the same as the model's own code.

The convergence test trains a tiny randomly initialised model of each supported family (built from its
config, nothing downloaded) for a few optimizer steps, once as transformers wrote it and once patched,
and compares the losses, the final parameters and the top-k log-probabilities.
"""

from __future__ import annotations

import copy

import pytest
import torch
import transformers

from tritonkit import testing
from tritonkit.integrations import transformers as tk_hf

_CLASSES = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
    "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
    "gemma": (transformers.GemmaConfig, transformers.GemmaForCausalLM),
}
VOCAB = 96


def _tiny_model(model_type, *, vocab=VOCAB, hidden=32, layers=2, dtype=torch.float32, device="cpu", **overrides):
    config_cls, model_cls = _CLASSES[model_type]
    config = config_cls(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=48, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
        attn_implementation="eager", **overrides,
    )  # fmt: skip
    return model_cls(config).to(device=device, dtype=dtype)


def _batch(generator, *, batch=2, tokens=12, vocab=VOCAB, device="cpu"):
    ids = torch.randint(0, vocab, (batch, tokens), generator=generator, device=generator.device).to(device)
    labels = ids.clone()
    labels[0, :3] = -100  # a prompt whose tokens carry no loss
    return ids, labels


def test_supported_families_are_the_tested_ones():
    assert set(tk_hf.SUPPORTED_MODEL_TYPES) == set(_CLASSES)


@pytest.mark.parametrize("model_type", sorted(_CLASSES))
def test_each_switch_keeps_the_forward_and_the_loss(model_type):
    seed = testing.fresh_seed()
    print(f"seed={seed}")  # shown with a failure, to reproduce it
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    reference = _tiny_model(model_type)
    ids, labels = _batch(generator)
    expected = reference(ids, labels=labels)
    for switch in ("rms_norm", "rope", "swiglu", "cross_entropy"):
        patched = copy.deepcopy(reference)
        flags = dict.fromkeys(("rms_norm", "rope", "swiglu", "cross_entropy", "fused_linear_cross_entropy"), False)
        counts = tk_hf.apply(patched, **{**flags, switch: True})
        assert counts[switch] >= 1
        got = patched(ids, labels=labels)
        torch.testing.assert_close(got.logits, expected.logits, atol=2e-5, rtol=2e-5, msg=switch)
        torch.testing.assert_close(got.loss, expected.loss, atol=2e-6, rtol=2e-6, msg=switch)


def test_patching_touches_one_instance_only():
    torch.manual_seed(testing.fresh_seed())
    patched, other = _tiny_model("llama"), _tiny_model("llama")
    class_forwards = {cls: cls.forward for cls in {type(m) for m in patched.modules()}}
    cross_entropy = torch.nn.functional.cross_entropy
    tk_hf.apply(patched)
    assert "forward" not in other.__dict__
    assert all("forward" not in module.__dict__ for module in other.modules())
    assert {cls: cls.forward for cls in class_forwards} == class_forwards
    assert torch.nn.functional.cross_entropy is cross_entropy
    assert "forward" in patched.model.layers[0].mlp.__dict__


def test_revert_restores_the_models_own_code_exactly():
    torch.manual_seed(testing.fresh_seed())
    model = _tiny_model("qwen3")
    ids, labels = _batch(torch.Generator().manual_seed(testing.fresh_seed()))
    before = model(ids, labels=labels)
    tk_hf.apply(model)
    assert tk_hf.is_patched(model)
    tk_hf.revert(model)
    assert not tk_hf.is_patched(model)
    assert all("forward" not in module.__dict__ for module in model.modules())
    assert "_loss_function" not in model.__dict__
    after = model(ids, labels=labels)
    assert torch.equal(after.logits, before.logits)
    assert torch.equal(after.loss, before.loss)


def test_fused_loss_in_training_skips_the_logits_and_matches():
    torch.manual_seed(testing.fresh_seed())
    reference = _tiny_model("mistral")
    patched = copy.deepcopy(reference)
    tk_hf.apply(patched, rms_norm=False, rope=False, swiglu=False, cross_entropy=False)
    ids, labels = _batch(torch.Generator().manual_seed(testing.fresh_seed()))
    n_items = (labels[:, 1:] != -100).sum() + 5  # as a trainer accumulating several batches passes it
    for kwargs in ({}, {"num_items_in_batch": n_items}):
        expected = reference.train()(ids, labels=labels, **kwargs)
        got = patched.train()(ids, labels=labels, **kwargs)
        assert got.logits is None
        torch.testing.assert_close(got.loss, expected.loss, atol=2e-6, rtol=2e-6)
    assert patched.eval()(ids, labels=labels).logits is not None  # evaluation keeps the model's head


def test_base_model_without_head_patches_the_layers_only():
    config_cls, _ = _CLASSES["llama"]
    config = config_cls(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=8)  # fmt: skip
    counts = tk_hf.apply(transformers.LlamaModel(config))
    assert counts == {"rms_norm": 3, "rope": 1, "swiglu": 1, "cross_entropy": 0, "fused_linear_cross_entropy": 0}


def test_unsupported_model_type_is_named():
    config = transformers.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=4)
    with pytest.raises(ValueError, match=r"model type 'gpt2' \(GPT2LMHeadModel\) is not supported"):
        tk_hf.apply(transformers.GPT2LMHeadModel(config))


def test_unsupported_transformers_version_is_named(monkeypatch):
    monkeypatch.setattr(tk_hf, "_installed_transformers", lambda: "4.44.0")
    with pytest.raises(RuntimeError, match=r"supports transformers >= 5.0, < 6.0; found 4.44.0"):
        tk_hf.apply(_tiny_model("llama"))


def test_unsupported_activation_and_double_patching_are_refused():
    with pytest.raises(ValueError, match=r"hidden_act='relu' has no fused kernel"):
        tk_hf.apply(_tiny_model("llama", hidden_act="relu"))
    model = _tiny_model("gemma")
    tk_hf.apply(model)
    with pytest.raises(ValueError, match="already patched"):
        tk_hf.apply(model)
    tk_hf.revert(model)
    with pytest.raises(ValueError, match="not patched"):
        tk_hf.revert(model)


LEARNING_RATE = 0.2


def _train(model, batches, steps, lr=LEARNING_RATE):
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    losses = []
    model.train()
    for ids, labels in batches[:steps]:
        loss = model(ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.detach().double())
    return torch.stack(losses)


def _top_log_probs(model, ids, k=5):
    model.eval()
    with torch.no_grad():
        log_probs = torch.log_softmax(model(ids).logits.double(), dim=-1)
    return log_probs.topk(k, dim=-1)


# Tolerances of the convergence test, fp32 under the interpreter. Largest differences measured: at
# lr 0.5, 6 seeds x 5 families: loss 6.7e-7 relative, parameters 1.2e-6, top-5 log-probs 6.7e-5, but
# some seeds overshot into loss spikes that amplify them (one qwen2 run failed); at lr 0.2 (now), 14
# qwen2 seeds: 2.3e-7, 1.2e-7 and 2.5e-6, every loss falling smoothly.
CONVERGENCE_TOLERANCE = {"loss": 1e-5, "parameters": 1e-5, "log_probs": 5e-4}


@pytest.mark.parametrize("model_type", sorted(_CLASSES))
def test_training_matches_unpatched(model_type):
    """N AdamW steps patched and unpatched from the same initial weights and batches.

    fp32 kernels agree with the model's own code to a few ulp per op. The optimizer is SGD with momentum:
    its step is linear in the gradient, so those differences stay ulp-sized in the weights. (Adam divides
    by the gradient's RMS and turns a sign flip of a near-zero gradient into a full step: a test with it
    would measure Adam, not the kernels.) A real mistake (a wrong rotation sign, a missing norm offset,
    a mis-shifted label) moves the first loss by orders of magnitude more.
    """
    steps = 4
    seed = testing.fresh_seed()
    print(f"seed={seed}")  # shown with a failure, to reproduce it
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    reference = _tiny_model(model_type)
    patched = copy.deepcopy(reference)
    tk_hf.apply(patched)
    batches = [_batch(generator)] * steps  # one batch again and again: the loss must fall as it is learnt
    losses_ref, losses_tk = _train(reference, batches, steps), _train(patched, batches, steps)
    torch.testing.assert_close(losses_tk, losses_ref, atol=0, rtol=CONVERGENCE_TOLERANCE["loss"])
    # It is training, not sitting at a fixed point: the loss falls well below its start (by about 1.6
    # over the 4 steps in the qwen2 seeds measured; checked on the lowest later loss, not the last).
    assert losses_ref[1:].min() < losses_ref[0] - 0.1
    for (name, mine), (_, theirs) in zip(patched.named_parameters(), reference.named_parameters(), strict=True):
        torch.testing.assert_close(mine, theirs, atol=CONVERGENCE_TOLERANCE["parameters"], rtol=0, msg=name)
    eval_ids, _ = _batch(generator)
    top_ref, top_tk = _top_log_probs(reference, eval_ids), _top_log_probs(patched, eval_ids)
    torch.testing.assert_close(top_tk.values, top_ref.values, atol=CONVERGENCE_TOLERANCE["log_probs"], rtol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("model_type", sorted(_CLASSES))
def test_training_matches_unpatched_bf16_on_gpu(model_type):
    """bf16 on the GPU: each op rounds differently from the model's own (fp32 inside, one rounding), so
    the comparison is of the loss curve, within bf16's few-ulp spread over a handful of steps."""
    steps = 6
    generator = torch.Generator(device="cuda").manual_seed(testing.fresh_seed())
    torch.manual_seed(testing.fresh_seed())
    reference = _tiny_model(model_type, vocab=1024, hidden=256, layers=2, dtype=torch.bfloat16, device="cuda")
    patched = copy.deepcopy(reference)
    tk_hf.apply(patched)
    batches = [_batch(generator, batch=4, tokens=256, vocab=1024, device="cuda") for _ in range(steps)]
    losses_ref, losses_tk = _train(reference, batches, steps, lr=0.05), _train(patched, batches, steps, lr=0.05)
    torch.testing.assert_close(losses_tk, losses_ref, atol=0, rtol=2e-2)
