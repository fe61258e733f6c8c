"""What tritonkit replaces in each Hugging Face model family, and the replacements themselves.

Nothing here changes a model: :mod:`tritonkit.integrations.transformers` plans with these pieces, then sets them on
one model instance. Two rules keep the patch close to transformers' own code, so that a transformers update either
keeps working or fails loudly at ``apply`` instead of training differently:

- **Checked against the model's own code, not assumed.** Each RMSNorm class is run once on a small probe (a bare
  instance with its own ``forward``, random weights and a bf16 input) and matched to one of the three variants the
  kernel implements (Llama's ``weight * x.to(dtype)``, OLMo 2's ``(weight * x).to(dtype)``, Gemma's
  ``x * (1 + weight)``); each family's ``apply_rotary_pos_emb`` is run on a probe and compared with the rotation
  ``tk.ops.rope`` computes. Anything else raises an error naming the class or function.
- **Attention is not copied.** RoPE is changed by giving each attention module its class's own ``forward`` with one
  global name rebound: the forward's code, defaults and decorators are transformers', and only the
  ``apply_rotary_pos_emb`` it looks up becomes ``tk.ops.rope``. transformers' kernel hooks (``kernels``'
  ``use_kernel_forward_from_hub`` and ``kernelize``) are not used: they do nothing unless the optional ``kernels``
  package is installed before the model's module is imported, map kernels per device from Hub or built kernel
  repositories, and replace the RoPE function through one module shared by every model of the process (see
  docs/huggingface.md).

What remains written here in the model's image: the MLP's one line (``down(act(gate(x)) * up(x))``) and, for the
fused loss only, the causal-LM forward's tail after the decoder (head, softcaps and scalings, the MoE routers' loss).
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tritonkit import ops
from tritonkit._core.distributed import is_dtensor


@dataclass(frozen=True)
class Family:
    """How one model family names the pieces tritonkit replaces, and what its causal-LM forward adds to the logits."""

    prefix: str  # class names are <prefix>RMSNorm, <prefix>Attention, <prefix>MLP
    activation: str = "hidden_act"  # the config attribute naming the MLP's activation
    dense_mlp: bool = True  # False: MLP modules only in some configurations (MoE shared experts, dense layers)
    moe: bool = False  # the causal-LM loss adds router_aux_loss_coef * the routers' load-balancing loss
    final_softcap: bool = False  # logits = cap * tanh(logits / cap), cap = config.final_logit_softcapping
    logits_scaling: bool = False  # logits = logits / config.logits_scaling (Granite)


FAMILIES = {
    "llama": Family("Llama"),
    "mistral": Family("Mistral"),
    "mixtral": Family("Mixtral", dense_mlp=False, moe=True),
    "qwen2": Family("Qwen2"),
    "qwen2_moe": Family("Qwen2Moe", dense_mlp=False, moe=True),
    "qwen3": Family("Qwen3"),
    "qwen3_moe": Family("Qwen3Moe", dense_mlp=False, moe=True),
    "gemma": Family("Gemma"),
    "gemma2": Family("Gemma2", activation="hidden_activation", final_softcap=True),
    "gemma3_text": Family("Gemma3", activation="hidden_activation", final_softcap=True),
    "phi3": Family("Phi3"),
    "olmo2": Family("Olmo2"),
    "granite": Family("Granite", logits_scaling=True),
}

# config activation name -> the fused gated activation.
GATED = {
    "silu": ops.swiglu,
    "swish": ops.swiglu,
    "gelu_pytorch_tanh": lambda gate, up: ops.geglu(gate, up, approximate="tanh"),
    "gelu": lambda gate, up: ops.geglu(gate, up, approximate="none"),
}


# --------------------------------------------------------------------------------------------------
# RMSNorm: three variants, told apart by running the class's own forward on a probe
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class NormVariant:
    formula: str
    offset: float  # the kernel's (offset + weight)
    promotes: bool  # the output takes torch.promote_types(x.dtype, weight.dtype), not x's dtype

    def reference(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
        if self.promotes:
            return weight * normed.to(x.dtype)
        return (normed * (self.offset + weight.float())).to(x.dtype)


NORM_VARIANTS = (
    NormVariant("weight * x.to(dtype)", 0.0, True),
    NormVariant("(weight * x).to(dtype)", 0.0, False),
    NormVariant("x * (1 + weight)", 1.0, False),
)
_EPS_ATTRIBUTES = ("variance_epsilon", "eps")
# bf16 holds 8 bits of mantissa: a variant that rounds once more than another differs by about 2**-8 relative; the
# variants differ by the weight's own size (offset) or by the output dtype.
_PROBE_TOLERANCE = {"atol": 3e-2, "rtol": 3e-2}


def norm_eps_attribute(module: torch.nn.Module) -> str:
    """Which attribute holds the epsilon, checking the module has the one weight vector the kernel takes."""
    name = type(module).__name__
    weight = module._parameters.get("weight")
    extra = sorted(set(module._parameters) - {"weight"})
    if weight is None or weight.dim() != 1 or extra:
        raise ValueError(
            f"tritonkit: {name} is an RMSNorm variant tritonkit does not implement: it expects one 1-D weight "
            f"parameter, found parameters {sorted(module._parameters)}"
        )
    for attribute in _EPS_ATTRIBUTES:
        if isinstance(module.__dict__.get(attribute), float):
            return attribute
    raise ValueError(f"tritonkit: {name} keeps its epsilon in none of {_EPS_ATTRIBUTES}")


def norm_variant(cls: type, eps_attribute: str) -> NormVariant:
    """The variant that the class's own forward computes, from a probe: fp32 weights and a bf16 input, so that the
    output dtype tells Llama's promoting product from the others and the values tell (1 + weight) from weight."""
    generator = torch.Generator().manual_seed(0)
    probe = cls.__new__(cls)
    torch.nn.Module.__init__(probe)
    probe.weight = torch.nn.Parameter(torch.randn(16, generator=generator), requires_grad=False)
    setattr(probe, eps_attribute, 1e-6)
    x = torch.randn(3, 16, generator=generator).to(torch.bfloat16)
    with torch.no_grad():
        got = cls.forward(probe, x)
    for variant in NORM_VARIANTS:
        expected = variant.reference(x, probe.weight, 1e-6)
        if got.dtype == expected.dtype and torch.allclose(got.float(), expected.float(), **_PROBE_TOLERANCE):
            return variant
    raise ValueError(
        f"tritonkit: {cls.__name__} is an RMSNorm variant tritonkit does not implement (its forward matches none of "
        f"{', '.join(v.formula for v in NORM_VARIANTS)}); patch with rms_norm=False"
    )


def rms_norm_forward(eps_attribute: str, variant: NormVariant):
    def forward(self, hidden_states):
        out = ops.rms_norm(hidden_states, self.weight, eps=getattr(self, eps_attribute), offset=variant.offset)
        if variant.promotes:  # the model's own norm returns weight * normed.to(x.dtype): the promoted dtype
            out = out.to(torch.promote_types(hidden_states.dtype, self.weight.dtype))
        return out

    return forward


# --------------------------------------------------------------------------------------------------
# MLP
# --------------------------------------------------------------------------------------------------
def mlp_forward(module: torch.nn.Module, gated: Callable):
    """``down(act(gate(x)) * up(x))`` with the fused gated activation; Phi-3's fused ``gate_up_proj`` halves."""
    children = dict(module.named_children())
    if {"gate_proj", "up_proj", "down_proj"} <= children.keys():

        def forward(self, x):
            return self.down_proj(gated(self.gate_proj(x), self.up_proj(x)))

        return forward
    if {"gate_up_proj", "down_proj"} <= children.keys():

        def fused_forward(self, x):
            gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
            return self.down_proj(gated(gate, up))

        return fused_forward
    raise ValueError(
        f"tritonkit: {type(module).__name__} has neither gate_proj/up_proj/down_proj nor gate_up_proj/down_proj "
        f"(it has {sorted(children)}); patch with swiglu=False"
    )


# --------------------------------------------------------------------------------------------------
# RoPE: the attention class's own forward, with apply_rotary_pos_emb looked up as tk.ops.rope
# --------------------------------------------------------------------------------------------------
ROPE_FUNCTION = "apply_rotary_pos_emb"


def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    """transformers' ``apply_rotary_pos_emb`` on ``tk.ops.rope``: the first ``cos.shape[-1]`` columns of each head
    rotated (all of them, or Phi-3's partial rotary), the rest copied; q and k in (b, h, t, d) with
    ``unsqueeze_dim=1``, (b, t, h, d) with 2."""
    if unsqueeze_dim not in (1, 2):
        raise ValueError(f"tritonkit rope: unsqueeze_dim must be 1 (b, h, t, d) or 2 (b, t, h, d), got {unsqueeze_dim}")
    return ops.rope(q, k, cos, sin, layout="bhtd" if unsqueeze_dim == 1 else "bthd", rotary_dim=cos.shape[-1])


def _rotated(x, cos, sin):
    width = cos.shape[-1]
    rot, rest = x[..., :width], x[..., width:]
    half = torch.cat((-rot[..., width // 2 :], rot[..., : width // 2]), dim=-1)
    return torch.cat((rot * cos + half * sin, rest), dim=-1)


def check_rope_function(function: Callable, where: str) -> None:
    """``function(q, k, cos, sin)`` must be the rotate-half rotation tk.ops.rope computes (on all of head_dim, and
    on the first columns where the function takes a narrower cos, as Phi-3's does)."""
    generator = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 2, 3, 8, generator=generator), torch.randn(1, 1, 3, 8, generator=generator)
    for width in (8, 4):
        cos, sin = torch.randn(2, 1, 3, width, generator=generator).unbind(0)
        try:
            got = function(q, k, cos, sin)
        except RuntimeError:  # shapes it cannot broadcast: a function for full-width rotations only
            if width == 8:
                raise
            continue
        expected = (_rotated(q, cos[:, None], sin[:, None]), _rotated(k, cos[:, None], sin[:, None]))
        if not all(torch.allclose(a, b, atol=1e-5, rtol=1e-5) for a, b in zip(got, expected, strict=True)):
            raise ValueError(
                f"tritonkit: {where} is a RoPE variant tritonkit does not implement (not the rotate-half rotation of "
                f"the first cos.shape[-1] columns); patch with rope=False"
            )


def _rebound(function: Callable, replacements: dict, where: str) -> Callable:
    """A copy of ``function`` whose global lookups find ``replacements`` first. Decorators made with functools.wraps
    are copied too, each holding the copy of what it wraps, so that they keep working (keyword renames, ...)."""
    inner = getattr(function, "__wrapped__", None)
    closure = function.__closure__
    if inner is None:
        namespace = {**function.__globals__, **replacements}
    else:
        copy = _rebound(inner, replacements, where)
        cells = [cell for cell in closure or () if _holds(cell, inner)]
        if not cells:
            raise ValueError(
                f"tritonkit: cannot rebind {where}: its decorator {function.__qualname__} does not hold what it wraps "
                f"in a closure; patch with rope=False"
            )
        closure = tuple(types.CellType(copy) if _holds(cell, inner) else cell for cell in closure)
        namespace = function.__globals__
    rebound = types.FunctionType(function.__code__, namespace, function.__name__, function.__defaults__, closure)
    rebound.__kwdefaults__ = function.__kwdefaults__
    rebound.__dict__.update(function.__dict__)
    rebound.__qualname__ = function.__qualname__
    if inner is not None:
        rebound.__wrapped__ = copy
    return rebound


def _holds(cell, value) -> bool:
    try:
        return cell.cell_contents is value
    except ValueError:  # an empty cell
        return False


def rope_forward(cls: type) -> Callable:
    """``cls.forward`` with ``apply_rotary_pos_emb`` bound to tritonkit's; checks the forward calls it and that the
    function it calls today is the rotation tritonkit computes."""
    code = cls.forward
    while hasattr(code, "__wrapped__"):
        code = code.__wrapped__
    if ROPE_FUNCTION not in code.__code__.co_names or ROPE_FUNCTION not in code.__globals__:
        raise ValueError(
            f"tritonkit: {cls.__name__}.forward does not call a module-level {ROPE_FUNCTION}, so tritonkit's rope "
            f"cannot be put in its place; patch with rope=False"
        )
    check_rope_function(code.__globals__[ROPE_FUNCTION], f"{code.__module__}.{ROPE_FUNCTION}")
    return _rebound(cls.forward, {ROPE_FUNCTION: apply_rotary_pos_emb}, f"{cls.__name__}.forward")


# --------------------------------------------------------------------------------------------------
# The loss
# --------------------------------------------------------------------------------------------------
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


def causal_lm_loss(logits, labels, vocab_size, num_items_in_batch=None, ignore_index=-100, shift_labels=None, **_):
    """transformers' ``ForCausalLMLoss`` on ``tk.ops.cross_entropy``: the loss in fp32, unrounded, as transformers'
    own (which upcasts the logits) gives it for a 16-bit model."""
    target = _shifted_targets(labels, shift_labels, ignore_index).to(logits.device)
    flat = logits.reshape(-1, vocab_size)

    def loss(reduction):
        return ops.cross_entropy(flat, target, ignore_index=ignore_index, reduction=reduction,
                                 loss_dtype=torch.float32)  # fmt: skip

    return _mean_or_per_item(loss, num_items_in_batch)


def _linear_loss(head: torch.nn.Linear, hidden, target, *, accum_dtype=torch.float32, **options):
    """The fused loss of a linear head: vocabulary-parallel when tensor parallelism made its weight a DTensor
    split along the vocabulary (``ColwiseParallel``; its d(weight) is summed in fp32), else on the whole weight
    (d(weight) summed in ``accum_dtype``)."""
    if is_dtensor(head.weight):
        if accum_dtype != torch.float32:
            raise ValueError(f"tritonkit: accum_dtype={accum_dtype} for a vocabulary-parallel LM head (a DTensor "
                             "weight): its fused loss sums d(weight) in torch.float32 only")  # fmt: skip
        return ops.vocab_parallel_fused_linear_cross_entropy(hidden, head.weight, target, head.bias, **options)
    return ops.fused_linear_cross_entropy(hidden, head.weight, target, head.bias, accum_dtype=accum_dtype, **options)


_HEAD_LOSS = "_tritonkit_fused_loss"  # the method of an FSDP2-sharded head that FSDP runs as a forward


def head_loss(head: torch.nn.Linear, hidden, target, **options):
    """The fused loss of ``head``, which the patched forward computes instead of calling the head.

    FSDP2 gathers a module's parameters only around its forward (or a method registered as one). A head inside a
    larger FSDP unit (the model's root, or a group with the final norm) has been gathered by then; a head sharded on
    its own has not, so the loss runs as a forward method of it, registered once with
    ``register_fsdp_forward_method`` (the head keeps that method after revert(): it is only ever called from here).
    """
    if _is_fsdp_module(head):
        if _HEAD_LOSS not in head.__dict__:
            from torch.distributed.fsdp import register_fsdp_forward_method

            head.__dict__[_HEAD_LOSS] = types.MethodType(_linear_loss, head)
            register_fsdp_forward_method(head, _HEAD_LOSS)
        return getattr(head, _HEAD_LOSS)(hidden, target, **options)
    return _linear_loss(head, hidden, target, **options)


def _is_fsdp_module(module) -> bool:
    fsdp = sys.modules.get("torch.distributed.fsdp")  # not imported: no module can be sharded by it
    return fsdp is not None and isinstance(module, fsdp.FSDPModule)


def _plain_linear(module) -> bool:
    """An ``nn.Linear`` itself, also once FSDP2 has sharded it (``fully_shard`` swaps its class for ``FSDPLinear``, a
    subclass of FSDPModule and nn.Linear); not a subclass such as a PEFT adapter or a quantized layer."""
    cls = type(module)
    if _is_fsdp_module(module):
        cls = cls.__bases__[-1]
    return cls is torch.nn.Linear


def _cache_name(output_type) -> str:
    """What the model's forward and outputs call the KV cache: transformers 5.x renamed past_key_values to cache."""
    return "cache" if "cache" in output_type.__dataclass_fields__ else "past_key_values"


def causal_lm_forward(original_forward: Callable, family: Family, modeling: types.ModuleType,
                      accum_dtype: torch.dtype = torch.float32):  # fmt: skip
    """The model's forward, with the head and the loss fused when training with labels and a plain linear head (a
    head wrapped by PEFT, or quantized, runs the model's own forward); the head's gradient summed in
    ``accum_dtype``."""
    from transformers import modeling_outputs

    output_type = modeling_outputs.MoeCausalLMOutputWithPast if family.moe else modeling_outputs.CausalLMOutputWithPast
    cache_name = _cache_name(output_type)
    balancing_loss = modeling.load_balancing_loss_func if family.moe else None

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None,
                inputs_embeds=None, labels=None, use_cache=None, logits_to_keep=0, **kwargs):  # fmt: skip
        if cache is not None:  # by position or by name: handed on under the name this version's forward takes
            kwargs[cache_name] = cache
        head = self.lm_head
        if labels is None or not self.training or not _plain_linear(head):
            return original_forward(
                input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                inputs_embeds=inputs_embeds, labels=labels, use_cache=use_cache, logits_to_keep=logits_to_keep,
                **kwargs,
            )  # fmt: skip
        return_dict = kwargs.pop("return_dict", None)
        if family.moe:
            routers = kwargs.pop("output_router_logits", None)
            kwargs["output_router_logits"] = self.config.output_router_logits if routers is None else routers
        outputs = self.model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
            inputs_embeds=inputs_embeds, use_cache=use_cache, **kwargs,
        )  # fmt: skip
        hidden = outputs.last_hidden_state
        if family.logits_scaling:
            hidden = hidden / self.config.logits_scaling  # (h W^T) / s = (h / s) W^T
        softcap = self.config.final_logit_softcapping if family.final_softcap else None
        ignore_index = kwargs.get("ignore_index", -100)
        target = _shifted_targets(labels, kwargs.get("shift_labels"), ignore_index).to(hidden.device)
        flat = hidden.reshape(-1, hidden.shape[-1])

        def loss(reduction):
            return head_loss(head, flat, target, ignore_index=ignore_index, softcap=softcap, reduction=reduction,
                             loss_dtype=torch.float32, accum_dtype=accum_dtype)  # fmt: skip

        fields = {
            "loss": _mean_or_per_item(loss, kwargs.get("num_items_in_batch")),
            "logits": None,
            "hidden_states": outputs.hidden_states,
            "attentions": outputs.attentions,
            cache_name: getattr(outputs, cache_name),
        }
        if family.moe:
            fields["router_logits"] = outputs.router_logits
            if kwargs["output_router_logits"]:
                aux = balancing_loss(outputs.router_logits, self.num_experts, self.num_experts_per_tok, attention_mask)
                fields["aux_loss"] = aux
                fields["loss"] = fields["loss"] + self.router_aux_loss_coef * aux.to(fields["loss"].device)
        output = output_type(**fields)
        if return_dict is None:
            return_dict = self.config.return_dict
        return output if return_dict else output.to_tuple()

    return forward
