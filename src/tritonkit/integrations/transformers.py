"""Hugging Face transformers: put tritonkit's kernels into one model instance, and take them out again.

    from tritonkit.integrations import transformers as tk_hf
    model = tk_hf.from_pretrained("meta-llama/Llama-3.2-1B")  # AutoModelForCausalLM.from_pretrained, then apply
    tk_hf.apply(model)      # or on a model you built: RMSNorm, RoPE, attention, SwiGLU/GeGLU and the loss
    tk_hf.revert(model)     # the model's own code again

Only the instance passed in changes: each patched module gets its own ``forward`` in its ``__dict__`` (and the model
its own ``loss_function``), so other models in the process, the transformers classes and torch itself are untouched.
That is the difference from patching module-level functions, which changes every model of the type in the process,
including ones built later. The one exception is the attention implementation, a setting of the model's config:
models built from one config object share it.

``apply`` is atomic: it checks and builds every replacement first, then sets them; if anything fails, what was set is
undone and the model is left exactly as it was. A PEFT model (``get_peft_model``) is patched through the transformers
model it wraps, before or after wrapping. What each switch replaces, per family (``SUPPORTED_MODEL_TYPES``; see
docs/huggingface.md for the table and the reasons):

- ``rms_norm``: every ``<Family>RMSNorm`` (the q/k norms and sandwich norms included) with ``tk.ops.rms_norm``,
  in the variant its own forward computes (checked on a probe at ``apply``).
- ``rope``: every ``<Family>Attention`` gets its class's forward with ``apply_rotary_pos_emb`` bound to
  ``tk.ops.rope`` (nothing else of the attention changes).
- ``attention``: the model's attention implementation becomes ``"tritonkit"`` (``tk.ops.attention``, padded and
  packed batches through ``tk.ops.attention_varlen``; see ``transformers_attention``), registered with
  transformers' attention interface by :func:`register_attention`; revert() restores the previous one.
- ``swiglu``: every dense ``<Family>MLP`` (MoE shared experts included; routed experts stay transformers') with
  ``tk.ops.swiglu`` (SiLU) or ``tk.ops.geglu`` (GELU), chosen from the config's activation.
- ``cross_entropy``: the model's causal-LM loss with ``tk.ops.cross_entropy`` on the logits.
- ``fused_linear_cross_entropy``: in training with labels, the LM head and the loss together with
  ``tk.ops.fused_linear_cross_entropy`` (final-logit softcap and Granite's logit scaling included, MoE routers'
  load-balancing loss added as the model does), which never materialises the logits (``logits`` is then None in
  the output). Evaluation, no labels, or a head that is not a plain ``nn.Linear`` (a PEFT adapter on the head) run
  the model's own head. ``accum_dtype`` (as Liger-Kernel's option of that name) sets the dtype the head's gradient
  is summed in over the loss's token chunks: ``torch.float32`` (the default, the more accurate) or the head's own
  dtype (half the accumulator's memory; Liger-Kernel's default).

Versions: transformers ``SUPPORTED_TRANSFORMERS`` (>= 5.0, < 6), the range the tests run on; others get a clear error.
"""

from __future__ import annotations

import importlib.metadata
import sys
import types

import torch

from tritonkit.integrations import transformers_attention
from tritonkit.integrations import transformers_families as families
from tritonkit.integrations.transformers_attention import ATTENTION_IMPLEMENTATION

__all__ = [
    "ATTENTION_IMPLEMENTATION",
    "SUPPORTED_MODEL_TYPES",
    "SUPPORTED_TRANSFORMERS",
    "apply",
    "from_pretrained",
    "is_patched",
    "register_attention",
    "revert",
]

# [lowest, highest) transformers version the patch is tested with (the CI's pinned and newest sets).
SUPPORTED_TRANSFORMERS = ("5.0", "6.0")
SUPPORTED_MODEL_TYPES = tuple(families.FAMILIES)
SWITCHES = ("rms_norm", "rope", "attention", "swiglu", "cross_entropy", "fused_linear_cross_entropy")

_PATCHES = "_tritonkit_patches"  # where a patched model keeps what revert() restores
_MISSING = object()


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
            f"found {installed}. The patch is tested with those versions' modeling code."
        )


def _transformers_model(model):
    """The transformers model itself: a PEFT model's base model (LoRA and the other adapters that wrap the model),
    else ``model``."""
    get_base_model = getattr(model, "get_base_model", None)
    if callable(get_base_model) and type(model).__module__.startswith("peft."):
        return get_base_model()
    return model


def _family_of(model) -> families.Family:
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in families.FAMILIES:
        raise ValueError(
            f"tritonkit: model type {model_type!r} ({type(model).__name__}) is not supported; "
            f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    return families.FAMILIES[model_type]


def _set(record, owner, name, value):
    """Put ``value`` in ``owner.__dict__[name]``, remembering in ``record`` how to undo it."""
    previous = owner.__dict__.get(name, _MISSING)

    def undo():
        if previous is _MISSING:
            owner.__dict__.pop(name, None)
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
    record.append(lambda: model.set_attn_implementation(previous))  # first: a switch that fails half-way is undone
    model.set_attn_implementation(register_attention())
    if model.config._attn_implementation != ATTENTION_IMPLEMENTATION:  # transformers only warns when it cannot
        raise ValueError(
            f"tritonkit: attention=True, but {type(model).__name__} kept attn_implementation="
            f"{model.config._attn_implementation!r} (it does not take a registered attention function)"
        )
    decoder = model.get_decoder() if callable(getattr(model, "get_decoder", None)) else model
    hook = decoder.register_forward_pre_hook(transformers_attention.default_inputs_hook, with_kwargs=True)
    record.append(hook.remove)


def is_patched(model) -> bool:
    return _PATCHES in _transformers_model(model).__dict__


def _check_accum_dtype(model, accum_dtype, fused_loss: bool) -> None:
    """accum_dtype is a dtype the fused loss takes for this model's head; a 16-bit one where no fused loss runs
    (switched off, or no LM head) would silently do nothing, so it is refused."""
    if not isinstance(accum_dtype, torch.dtype):
        raise TypeError(f"tritonkit: accum_dtype must be a torch.dtype, got {type(accum_dtype).__name__}")
    if accum_dtype == torch.float32:
        return
    if not fused_loss or not _has_lm_head(model):
        why = "fused_linear_cross_entropy=False" if not fused_loss else f"this {type(model).__name__} has no LM head"
        raise ValueError(f"tritonkit: accum_dtype={accum_dtype} sets the fused loss's head gradient, but {why}")
    if accum_dtype != model.lm_head.weight.dtype:
        raise ValueError(f"tritonkit: accum_dtype must be torch.float32 or the LM head's dtype "
                         f"{model.lm_head.weight.dtype}, got {accum_dtype}")  # fmt: skip


def _has_lm_head(model) -> bool:
    """A causal LM (its decoder under ``model``, its head ``lm_head``), whose loss switches patch something."""
    return hasattr(model, "lm_head") and hasattr(model, "model")


def _plan(model, family: families.Family, switches: dict,
          accum_dtype: torch.dtype = torch.float32) -> tuple[list, dict]:  # fmt: skip
    """Every (module, attribute, value) that the switches set, and the counts apply() returns; raises before anything
    is changed when a piece is missing or is not what tritonkit implements."""
    modeling = sys.modules[type(model).__module__]
    plan: list = []
    counts = dict.fromkeys(SWITCHES, 0)

    def named(switch, suffix, required=True):
        class_name = family.prefix + suffix
        modules = [module for module in model.modules() if type(module).__name__ == class_name]
        if not modules and required:
            raise ValueError(f"tritonkit: {switch}=True, but the model has no {class_name} module to patch")
        counts[switch] = len(modules)
        return modules

    def bind(modules, make_forward):
        forwards = {}  # one function per class (and variant), bound to each module
        for module in modules:
            forward = forwards.get(type(module)) or make_forward(module)
            forwards[type(module)] = forward
            plan.append((module, "forward", types.MethodType(forward, module)))

    if switches["rms_norm"]:
        norms = named("rms_norm", "RMSNorm")
        variants = {}
        for norm in norms:
            eps_attribute = families.norm_eps_attribute(norm)
            key = (type(norm), eps_attribute)
            if key not in variants:
                variant = families.norm_variant(type(norm), eps_attribute)
                variants[key] = families.rms_norm_forward(eps_attribute, variant)
            plan.append((norm, "forward", types.MethodType(variants[key], norm)))
    if switches["rope"]:
        bind(named("rope", "Attention"), lambda module: families.rope_forward(type(module)))
    if switches["attention"]:
        named("attention", "Attention")
    if switches["swiglu"]:
        mlps = named("swiglu", "MLP", required=family.dense_mlp)
        if mlps:
            activation = getattr(model.config, family.activation)
            if activation not in families.GATED:
                raise ValueError(
                    f"tritonkit: swiglu=True, but config.{family.activation}={activation!r} has no fused kernel; "
                    f"supported: {', '.join(families.GATED)}"
                )
            bind(mlps, lambda module: families.mlp_forward(module, families.GATED[activation]))
    has_head = _has_lm_head(model)
    if switches["cross_entropy"] and has_head:
        plan.append((model, "_loss_function", families.causal_lm_loss))  # what the loss_function setter writes
        counts["cross_entropy"] = 1
    if switches["fused_linear_cross_entropy"] and has_head:
        forward = families.causal_lm_forward(model.forward, family, modeling, accum_dtype)
        plan.append((model, "forward", types.MethodType(forward, model)))
        counts["fused_linear_cross_entropy"] = 1
    return plan, counts


def apply(model, *, rms_norm=True, rope=True, attention=True, swiglu=True, cross_entropy=True,
          fused_linear_cross_entropy=True, accum_dtype=torch.float32):  # fmt: skip
    """Patch ``model`` (and only it) to run on tritonkit kernels. Returns how many modules each switch
    patched, e.g. ``{"rms_norm": 9, "rope": 2, "attention": 2, "swiglu": 2, "cross_entropy": 1, ...}``.

    ``model``: a causal LM or base model of a supported family, or a PEFT model wrapping one. Raises ValueError for
    an unsupported model type, a model already patched, a switch that finds nothing to patch where its family has
    that piece, or a piece that is not what tritonkit implements (an RMSNorm or RoPE variant, an activation: the
    message names it); RuntimeError for an unsupported transformers version. Loss switches are skipped (count 0) on
    a model without a language-model head, such as ``LlamaModel``; the MLP switch on an MoE model whose layers are
    all routed experts. ``accum_dtype``: the fused loss's d(weight) accumulator (module docstring); TypeError for a
    non-dtype, ValueError for another dtype than float32 or the head's. On any error the model is left exactly as it
    was.
    """
    _check_transformers()
    model = _transformers_model(model)
    family = _family_of(model)
    if is_patched(model):
        raise ValueError(f"tritonkit: this {type(model).__name__} is already patched; call revert(model) first")
    switches = dict(zip(SWITCHES, (rms_norm, rope, attention, swiglu, cross_entropy, fused_linear_cross_entropy),
                        strict=True))  # fmt: skip
    _check_accum_dtype(model, accum_dtype, bool(fused_linear_cross_entropy))
    plan, counts = _plan(model, family, switches, accum_dtype)
    record: list = []
    try:
        for owner, name, value in plan:
            _set(record, owner, name, value)
        if attention:
            _use_tritonkit_attention(model, record)
        _set(record, model, _PATCHES, record)
    except BaseException:
        _undo(record)
        raise
    return counts


def revert(model) -> None:
    """Undo :func:`apply` on ``model`` (or the PEFT model wrapping it): every patched module gets back exactly what
    it had, and the model its previous attention implementation."""
    inner = _transformers_model(model)
    if not is_patched(inner):
        raise ValueError(
            f"tritonkit: this {type(model).__name__} was never patched by tritonkit (or was reverted already): "
            "nothing to revert"
        )
    _undo(inner.__dict__[_PATCHES])


def from_pretrained(name_or_path, *args, **kwargs):
    """``transformers.AutoModelForCausalLM.from_pretrained(name_or_path, *args, **kwargs)``, then :func:`apply`.

    The switches of :func:`apply` (``rms_norm=``, ``rope=``, ``attention=``, ...) and its ``accum_dtype=`` may be given
    here and go to it; every other argument goes to transformers. Returns the patched model.

    Example: ``model = tk_hf.from_pretrained("Qwen/Qwen3-0.6B", dtype=torch.bfloat16, attention=False)``.
    """
    _check_transformers()
    import transformers

    switches = {name: kwargs.pop(name) for name in (*SWITCHES, "accum_dtype") if name in kwargs}
    model = transformers.AutoModelForCausalLM.from_pretrained(name_or_path, *args, **kwargs)
    apply(model, **switches)
    return model
