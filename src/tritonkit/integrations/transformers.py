"""Hugging Face transformers: put tritonkit's kernels into one model instance, and take them out again.

    from tritonkit.integrations import transformers as tk_hf
    model = AutoModelForCausalLM.from_config(config)
    tk_hf.apply(model)      # RMSNorm, RoPE, attention, SwiGLU/GeGLU and the loss now run on tritonkit kernels
    tk_hf.revert(model)     # the model's own code again

Only the instance passed in changes: each patched module gets its own ``forward`` in its ``__dict__``
(and the model its own ``loss_function``), so other models in the process, the transformers classes and
torch itself are untouched. That is the difference from patching module-level functions, which changes
every model of the type in the process, including ones built later. The one exception is the attention
implementation, a setting of the model's config: models built from one config object share it.

What each switch replaces, per family (Llama, Mistral, Qwen2, Qwen3, Gemma):

- ``rms_norm``: every ``<Family>RMSNorm`` (Qwen3's per-head q/k norms included) with ``tk.ops.rms_norm``;
  Gemma's ``x * (1 + weight)`` through ``offset=1``.
- ``rope``: every ``<Family>Attention`` with the same attention computed around ``tk.ops.rope``, which
  rotates q and k in the projections' own (batch, token, head, dim) layout.
- ``attention``: the model's attention implementation becomes ``"tritonkit"`` (``tk.ops.attention``, padded and
  packed batches through ``tk.ops.attention_varlen``; see ``transformers_attention``), registered with
  transformers' attention interface by :func:`register_attention`; revert() restores the previous one.
- ``swiglu``: every ``<Family>MLP`` with ``tk.ops.swiglu`` (SiLU) or ``tk.ops.geglu`` (GELU), chosen from
  ``config.hidden_act``.
- ``cross_entropy``: the model's causal-LM loss with ``tk.ops.cross_entropy`` on the logits.
- ``fused_linear_cross_entropy``: in training with labels, the LM head and the loss together with
  ``tk.ops.fused_linear_cross_entropy``, which never materialises the logits (``logits`` is then None in
  the output). Evaluation, or no labels, runs the model's own head.

Versions: the attention forward mirrors transformers' own, so only versions whose attention this was
written against and tested with are accepted (``SUPPORTED_TRANSFORMERS``); others get a clear error.
"""

from __future__ import annotations

import importlib.metadata
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tritonkit import ops
from tritonkit.integrations import transformers_attention
from tritonkit.integrations.transformers_attention import ATTENTION_IMPLEMENTATION

__all__ = [
    "ATTENTION_IMPLEMENTATION",
    "SUPPORTED_MODEL_TYPES",
    "SUPPORTED_TRANSFORMERS",
    "apply",
    "is_patched",
    "register_attention",
    "revert",
]

# [lowest, highest) transformers version whose modeling code the patched forwards mirror.
SUPPORTED_TRANSFORMERS = ("5.0", "6.0")

_PATCHES = "_tritonkit_patches"  # where a patched model keeps what revert() restores
_MISSING = object()


@dataclass(frozen=True)
class _Family:
    """How one model family names and builds the pieces tritonkit replaces."""

    prefix: str  # class names are <prefix>RMSNorm, <prefix>Attention, <prefix>MLP
    eps_attribute: str  # where the RMSNorm keeps its epsilon
    norm_offset: float  # Gemma stores the RMSNorm weight as (scale - 1)
    norm_promotes: bool  # Llama-style norms return weight * x.to(dtype): the promoted dtype
    qk_norm: bool = False  # Qwen3 normalises each head of q and k before the rotation
    sliding_window: Callable[[torch.nn.Module], dict] | None = None  # extra attention-interface kwargs


def _window_from_module(attention):
    return {"sliding_window": attention.sliding_window}


def _window_from_config(attention):
    return {"sliding_window": getattr(attention.config, "sliding_window", None)}


_FAMILIES = {
    "llama": _Family("Llama", "variance_epsilon", 0.0, True),
    "mistral": _Family("Mistral", "variance_epsilon", 0.0, True, sliding_window=_window_from_config),
    "qwen2": _Family("Qwen2", "variance_epsilon", 0.0, True, sliding_window=_window_from_module),
    "qwen3": _Family("Qwen3", "variance_epsilon", 0.0, True, qk_norm=True, sliding_window=_window_from_module),
    "gemma": _Family("Gemma", "eps", 1.0, False),
}
SUPPORTED_MODEL_TYPES = tuple(_FAMILIES)

# config.hidden_act -> the fused gated activation.
_GATED = {
    "silu": ops.swiglu,
    "swish": ops.swiglu,
    "gelu_pytorch_tanh": lambda gate, up: ops.geglu(gate, up, approximate="tanh"),
    "gelu": lambda gate, up: ops.geglu(gate, up, approximate="none"),
}


# --------------------------------------------------------------------------------------------------
# Replacement forwards (bound to one module instance each)
# --------------------------------------------------------------------------------------------------
def _rms_norm_forward(family: _Family):
    def forward(self, hidden_states):
        out = ops.rms_norm(
            hidden_states, self.weight, eps=getattr(self, family.eps_attribute), offset=family.norm_offset
        )
        if family.norm_promotes:  # the model's own norm returns weight * normed.to(x.dtype)
            out = out.to(torch.promote_types(hidden_states.dtype, self.weight.dtype))
        return out

    return forward


def _mlp_forward(gated):
    def forward(self, x):
        return self.down_proj(gated(self.gate_proj(x), self.up_proj(x)))

    return forward


def _attention_forward(family: _Family, modeling: types.ModuleType):
    """The family's attention with q and k rotated by tk.ops.rope before the transpose to (b, h, t, d)."""

    def forward(self, hidden_states, position_embeddings=None, attention_mask=None, cache=None, past_key_values=None,
                **kwargs):  # fmt: skip
        cache = cache if cache is not None else past_key_values  # transformers 5.x renamed past_key_values to cache
        if position_embeddings is None:
            raise ValueError(f"{type(self).__name__}: tritonkit's rope needs position_embeddings (cos, sin)")
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        query = self.q_proj(hidden_states).view(hidden_shape)
        key = self.k_proj(hidden_states).view(hidden_shape)
        value = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        if family.qk_norm:
            query, key = self.q_norm(query), self.k_norm(key)
        cos, sin = position_embeddings
        query, key = ops.rope(query, key, cos, sin, layout="bthd")
        query, key = query.transpose(1, 2), key.transpose(1, 2)
        if cache is not None:
            key, value = cache.update(key, value, self.layer_idx)
        attention = modeling.ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, modeling.eager_attention_forward
        )
        extra = family.sliding_window(self) if family.sliding_window is not None else {}
        out, weights = attention(
            self,
            query,
            key,
            value,
            attention_mask,
            dropout=0.0 if not self.training else self.attention_dropout,
            scaling=self.scaling,
            **extra,
            **kwargs,
        )
        return self.o_proj(out.reshape(*input_shape, -1).contiguous()), weights

    return forward


def _shifted_targets(labels, shift_labels, ignore_index):
    """Targets for next-token prediction, flattened: labels moved left by one, the last one ignored."""
    if shift_labels is None:
        shift_labels = F.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    return shift_labels.reshape(-1)


def _mean_or_per_item(loss_fn, num_items_in_batch):
    """transformers' convention: the mean over non-ignored targets, or the sum divided by
    num_items_in_batch when the trainer passes it (gradient accumulation over several batches)."""
    if num_items_in_batch is None:
        return loss_fn("mean")
    total = loss_fn("sum")
    if torch.is_tensor(num_items_in_batch):
        num_items_in_batch = num_items_in_batch.to(device=total.device, dtype=total.dtype)
    return total / num_items_in_batch


def _causal_lm_loss(logits, labels, vocab_size, num_items_in_batch=None, ignore_index=-100, shift_labels=None, **_):
    target = _shifted_targets(labels, shift_labels, ignore_index).to(logits.device)
    flat = logits.reshape(-1, vocab_size)

    def loss(reduction):
        return ops.cross_entropy(flat, target, ignore_index=ignore_index, reduction=reduction).float()

    return _mean_or_per_item(loss, num_items_in_batch)


def _cache_name(output_type) -> str:
    """What the model's forward and outputs call the KV cache: transformers 5.x renamed past_key_values to cache."""
    return "cache" if "cache" in output_type.__dataclass_fields__ else "past_key_values"


def _causal_lm_forward(original_forward, output_type):
    """The model's forward, with the head and the loss fused when training with labels."""
    cache_name = _cache_name(output_type)

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None,
                inputs_embeds=None, labels=None, use_cache=None, logits_to_keep=0, **kwargs):  # fmt: skip
        if cache is not None:  # by position or by name: handed on under the name this version's forward takes
            kwargs[cache_name] = cache
        if labels is None or not self.training:
            return original_forward(
                input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                inputs_embeds=inputs_embeds, labels=labels, use_cache=use_cache, logits_to_keep=logits_to_keep,
                **kwargs,
            )  # fmt: skip
        outputs = self.model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
            inputs_embeds=inputs_embeds, use_cache=use_cache, **kwargs,
        )  # fmt: skip
        hidden = outputs.last_hidden_state
        ignore_index = kwargs.get("ignore_index", -100)
        target = _shifted_targets(labels, kwargs.get("shift_labels"), ignore_index).to(hidden.device)
        head = self.lm_head
        flat = hidden.reshape(-1, hidden.shape[-1])

        def loss(reduction):
            return ops.fused_linear_cross_entropy(
                flat, head.weight, target, bias=head.bias, ignore_index=ignore_index, reduction=reduction
            ).float()

        return output_type(
            loss=_mean_or_per_item(loss, kwargs.get("num_items_in_batch")),
            logits=None,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
            **{cache_name: getattr(outputs, cache_name)},
        )

    return forward


# --------------------------------------------------------------------------------------------------
# apply / revert
# --------------------------------------------------------------------------------------------------
def _installed_transformers() -> str:
    """The installed distribution's version (transformers swaps its lazy module object in sys.modules
    when first used, so the metadata is the one stable place to read it)."""
    try:
        return importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError as error:
        raise ImportError(
            "tritonkit's Hugging Face patching needs transformers: pip install 'tritonkit[hf]'"
        ) from error


def _check_transformers():
    from packaging.version import Version  # a dependency of transformers

    installed = _installed_transformers()
    low, high = (Version(v) for v in SUPPORTED_TRANSFORMERS)
    if not low <= Version(installed) < high:
        raise RuntimeError(
            f"tritonkit.integrations.transformers supports transformers >= {low}, < {high}; "
            f"found {installed}. The patched attention mirrors those versions' code."
        )


def _family_of(model) -> _Family:
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in _FAMILIES:
        raise ValueError(
            f"tritonkit: model type {model_type!r} ({type(model).__name__}) is not supported; "
            f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    return _FAMILIES[model_type]


def _modules_named(model, class_name):
    return [module for module in model.modules() if type(module).__name__ == class_name]


def _set(record, owner, name, value):
    """Put ``value`` in ``owner.__dict__[name]``, remembering in ``record`` how to undo it."""
    previous = owner.__dict__.get(name, _MISSING)

    def undo():
        if previous is _MISSING:
            del owner.__dict__[name]
        else:
            owner.__dict__[name] = previous

    record.append(undo)
    owner.__dict__[name] = value


def _undo(record) -> None:
    for undo in reversed(record):
        undo()


def register_attention() -> str:
    """Make ``"tritonkit"`` a valid ``attn_implementation`` in this process (for any model whose attention calls
    transformers' attention interface), e.g. for ``from_pretrained(..., attn_implementation="tritonkit")``.
    :func:`apply` calls it. Registering again is harmless; returns the name."""
    _check_transformers()
    return transformers_attention.register()


def _use_tritonkit_attention(model, record) -> None:
    """Switch ``model``'s attention implementation to tritonkit's, remembering the previous one for revert()."""
    previous = model.config._attn_implementation
    model.set_attn_implementation(register_attention())
    if model.config._attn_implementation != ATTENTION_IMPLEMENTATION:  # transformers only warns when it cannot
        model.set_attn_implementation(previous)
        raise ValueError(
            f"tritonkit: attention=True, but {type(model).__name__} kept attn_implementation="
            f"{model.config._attn_implementation!r} (it does not take a registered attention function)"
        )
    record.append(lambda: model.set_attn_implementation(previous))


def is_patched(model) -> bool:
    return _PATCHES in model.__dict__


def apply(model, *, rms_norm=True, rope=True, attention=True, swiglu=True, cross_entropy=True,
          fused_linear_cross_entropy=True):  # fmt: skip
    """Patch ``model`` (and only it) to run on tritonkit kernels. Returns how many modules each switch
    patched, e.g. ``{"rms_norm": 9, "rope": 2, "attention": 2, "swiglu": 2, "cross_entropy": 1, ...}``.

    Raises ValueError for an unsupported model type, a model already patched, or a switch that finds
    nothing to patch where its family has that piece (the model's structure is not the expected one);
    RuntimeError for an unsupported transformers version. Loss switches are skipped (count 0) on a
    model without a language-model head, such as ``LlamaModel``. A failing switch leaves the model as it was.
    """
    _check_transformers()
    family = _family_of(model)
    if is_patched(model):
        raise ValueError(f"tritonkit: this {type(model).__name__} is already patched; call revert(model) first")
    modeling = sys.modules[type(model).__module__]
    record: list = []
    counts = {}

    def modules_named(switch, class_name):
        modules = _modules_named(model, class_name)
        if not modules:
            raise ValueError(f"tritonkit: {switch}=True, but the model has no {class_name} module to patch")
        counts[switch] = len(modules)
        return modules

    def patch_modules(switch, class_name, forward):
        for module in modules_named(switch, class_name):
            _set(record, module, "forward", types.MethodType(forward, module))

    try:
        if rms_norm:
            patch_modules("rms_norm", f"{family.prefix}RMSNorm", _rms_norm_forward(family))
        if rope:
            patch_modules("rope", f"{family.prefix}Attention", _attention_forward(family, modeling))
        if attention:
            modules_named("attention", f"{family.prefix}Attention")
            _use_tritonkit_attention(model, record)
        if swiglu:
            hidden_act = model.config.hidden_act
            if hidden_act not in _GATED:
                raise ValueError(
                    f"tritonkit: swiglu=True, but config.hidden_act={hidden_act!r} has no fused kernel; "
                    f"supported: {', '.join(_GATED)}"
                )
            patch_modules("swiglu", f"{family.prefix}MLP", _mlp_forward(_GATED[hidden_act]))
    except BaseException:
        _undo(record)
        raise

    has_head = hasattr(model, "lm_head") and hasattr(model, "model")
    counts["cross_entropy"] = counts["fused_linear_cross_entropy"] = 0
    if cross_entropy and has_head:
        _set(record, model, "_loss_function", _causal_lm_loss)  # what the loss_function setter writes
        counts["cross_entropy"] = 1
    if fused_linear_cross_entropy and has_head:
        forward = _causal_lm_forward(model.forward, modeling.CausalLMOutputWithPast)
        _set(record, model, "forward", types.MethodType(forward, model))
        counts["fused_linear_cross_entropy"] = 1
    model.__dict__[_PATCHES] = record
    return counts


def revert(model) -> None:
    """Undo :func:`apply` on ``model``: every patched module gets back exactly what it had, and the model its
    previous attention implementation."""
    if not is_patched(model):
        raise ValueError(f"tritonkit: this {type(model).__name__} is not patched by tritonkit")
    _undo(model.__dict__.pop(_PATCHES))
