"""The ``"tritonkit"`` attention implementation of Hugging Face transformers: ``tk.ops.attention`` behind the
attention interface that transformers' models call, padded and packed batches run as packed (varlen) sequences.

    from tritonkit.integrations import transformers as tk_hf
    tk_hf.register_attention()  # the name "tritonkit" becomes valid in this process
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="tritonkit")
    # or tk_hf.apply(model), which registers it and switches one model to it (tk_hf.revert switches back)

tritonkit's kernel keeps flash-attn's conventions (causal aligned bottom-right, (left, right) windows, packed
sequences with cu_seqlens), so the function follows transformers' flash-attention path:

- Masks: the name is registered with a mask builder that returns what transformers builds for flash-attention, so
  the model hands over a 2-D padding mask (batch, keys), or None when nothing is padded. A padded batch is unpadded
  into packed sequences, run through ``tk.ops.attention_varlen`` and padded again (padded query rows get zeros, as
  with flash-attn). With fewer queries than keys (decoding with a cache), the mask's last columns are the queries'
  (left padding, as transformers assumes). A 4-D mask (a custom pattern) is refused: the kernel takes no mask.
- Packed batches (padding-free training): the ``cu_seq_lens_q/k`` and ``max_length_q/k`` keyword arguments when all
  four are given; else the sequences that ``position_ids`` mark, a token starting a new one where its position is not
  the previous token's plus one (sequences restarting at 0). transformers reads these at batch 1 only under
  flash-attention; here every row is read, as transformers' eager and sdpa masks do. Each sequence attends only to
  itself. Under torch.compile position ids are not read (it would break the graph in every layer): packed batches
  need the four arguments, and position ids that restart within a row without them raise on the device.
- ``sliding_window=w`` becomes flash-attn's ``window_size=(w - 1, w - 1)``, as transformers converts it, and only when
  the keys are longer than w; a causal call keeps the left side only (flash-attn ignores the right one under causal):
  a query sees itself and the w - 1 keys before it, the mask transformers builds for eager and sdpa.
- ``scaling`` and ``softcap`` pass through; ``is_causal`` comes from the call, else from ``module.is_causal``.
- Refused with a ValueError rather than ignored: dropout > 0 (the kernel has none), ``output_attentions`` (no weights
  are formed), attention sinks (``s_aux``), position biases, static caches (slots not written yet would be read) and
  mask patterns beyond causal, sliding window and padding.

Finding packed sequences in a mask or in position ids reads their values on the host (a synchronisation; the launch
grid needs ``max_seqlen`` as an int). Every layer of a forward passes the same tensor, so what was read is kept for
the last few tensors seen and used again until the tensor is freed or changed in place: once per forward, not once
per layer.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tritonkit import ops

__all__ = ["ATTENTION_IMPLEMENTATION", "register", "tritonkit_attention"]

ATTENTION_IMPLEMENTATION = "tritonkit"


@dataclass(frozen=True)
class _Ragged:
    """Where a batch's sequences lie once packed."""

    rows: torch.Tensor | None  # the kept rows of the (batch * seq) flattened rows; None: all, in order
    cu_seqlens: torch.Tensor  # int32 (sequences + 1,)
    max_seqlen: int


# (what, ..., id of the source tensor) -> (weak reference to the source, its version, what was read). A model with
# two mask kinds (full and sliding-window layers) alternates between two sources in one forward.
_read: dict[tuple, tuple] = {}
_READ_KEPT = 8


def _version(tensor: torch.Tensor) -> int | None:
    """The in-place version counter, or None where there is none to trust (inference tensors, tracing)."""
    if torch.compiler.is_compiling() or tensor.is_inference():
        return None
    return tensor._version


# id -> (weak reference, version) of the tensors default_inputs_hook passed: position ids known to hold one sequence
# per row, and all-ones attention masks known to pad nothing, both without a host read.
_defaults: dict[int, tuple] = {}


def default_inputs_hook(module, args, kwargs):
    """A forward pre-hook for the decoder of a model that runs tritonkit attention. Where the caller gives no
    position ids and no cache, it passes transformers' own (0, 1, ..., seq - 1 in one row, what the decoder would
    make) and remembers them, so that the attention knows each row holds one sequence without reading the ids on
    the host: that read waits for the device to finish the previous step and leaves it idle while the host catches
    up, about a seventh of a 1B model's training step. Where the caller gives no attention mask either, it passes an
    all-ones one (nothing padded) and remembers it: without a mask or a cache transformers itself looks for packed
    sequences in the position ids, a host read of its own, and the mask builder (_padding_mask) drops the remembered
    mask unread. Position ids the caller gives (packed sequences) are read once per forward as before. Under
    torch.compile nothing is read on the host, so the hook leaves the call as it is."""
    if torch.compiler.is_compiling() or len(args) > 1:
        return None
    if any(kwargs.get(name) is not None for name in ("position_ids", "past_key_values", "cache", "cache_position")):
        return None
    tokens = kwargs.get("inputs_embeds")
    if tokens is None:
        tokens = args[0] if args else kwargs.get("input_ids")
    if tokens is None or tokens.dim() < 2:
        return None
    for key in [key for key, (ref, _) in _defaults.items() if ref() is None]:
        del _defaults[key]  # the tensors of earlier forwards, freed
    given = {"position_ids": _remember(torch.arange(tokens.shape[1], device=tokens.device).unsqueeze(0))}
    if kwargs.get("attention_mask") is None:
        # bool on the tokens' device: transformers' own conversion of a 2-D mask then returns this very tensor.
        given["attention_mask"] = _remember(torch.ones(tokens.shape[:2], dtype=torch.bool, device=tokens.device))
    return args, {**kwargs, **given}


def _remember(tensor: torch.Tensor) -> torch.Tensor:
    _defaults[id(tensor)] = (weakref.ref(tensor), _version(tensor))
    return tensor


def _is_default(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is one default_inputs_hook passed, unchanged since."""
    entry = _defaults.get(id(tensor))
    return entry is not None and entry[0]() is tensor and entry[1] == _version(tensor)


def _read_once(key: tuple, source: torch.Tensor, read: Callable[[torch.Tensor], _Ragged | None]) -> _Ragged | None:
    """``read(source)``, reused while ``source`` is alive and unchanged in place since it was read under ``key``."""
    version = _version(source)
    if version is None:
        return read(source)
    key = (*key, id(source))
    entry = _read.get(key)
    if entry is not None and entry[0]() is source and entry[1] == version:  # the id alone may be a freed tensor's
        return entry[2]
    value = read(source)
    _read.pop(key, None)
    while len(_read) >= _READ_KEPT:
        del _read[next(iter(_read))]  # the oldest
    _read[key] = (weakref.ref(source), version, value)
    return value


def _from_mask(mask: torch.Tensor) -> _Ragged:
    """Sequences of a (batch, seq) padding mask, nonzero where a token is real."""
    mask = mask.bool()
    lengths = mask.sum(dim=-1, dtype=torch.int32)
    rows = torch.nonzero(mask.flatten()).flatten()
    cu_seqlens = F.pad(torch.cumsum(lengths, dim=0, dtype=torch.int32), (1, 0))
    return _Ragged(rows, cu_seqlens, int(lengths.max()))


def _from_positions(positions: torch.Tensor) -> _Ragged | None:
    """Sequences packed along the rows of (batch, seq) position ids, or None when each row holds one sequence."""
    starts = torch.ones_like(positions, dtype=torch.bool)
    starts[:, 1:] = positions[:, 1:] != positions[:, :-1] + 1
    first = torch.nonzero(starts.flatten()).flatten()
    if first.numel() == positions.shape[0]:
        return None
    cu_seqlens = torch.cat([first, first.new_tensor([positions.numel()])]).to(torch.int32)
    return _Ragged(None, cu_seqlens, int(cu_seqlens.diff().max()))


def _window(sliding_window: int | None, key_length: int, causal: bool) -> tuple[int, int]:
    """transformers' ``sliding_window`` as tk.ops.attention's (left, right) window (see the module docstring)."""
    if sliding_window is None or key_length <= sliding_window:
        return (-1, -1)
    side = int(sliding_window) - 1
    return (side, 0 if causal else side)


def _refuse_unsupported(name: str, dropout: float, kwargs: dict) -> None:
    if dropout:
        raise ValueError(
            f"{name}: tritonkit attention has no dropout, got dropout={dropout} (the model's attention_dropout, in "
            "training); set config.attention_dropout = 0.0, or use attn_implementation='sdpa'"
        )
    if kwargs.get("output_attentions"):
        raise ValueError(
            f"{name}: output_attentions=True asks for the attention weights, which tritonkit attention never forms; "
            "use attn_implementation='eager'"
        )
    for option in ("s_aux", "position_bias"):
        if kwargs.get(option) is not None:
            raise ValueError(
                f"{name}: tritonkit attention does not support {option} (it changes the scores); "
                "use attn_implementation='eager' or 'sdpa'"
            )


def _rows(x: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
    """(batch, seq, heads, dim) -> the kept rows of (batch * seq, heads, dim)."""
    flat = x.reshape(-1, *x.shape[2:])
    return flat if rows is None else flat.index_select(0, rows)


def _unpacked(out: torch.Tensor, rows: torch.Tensor | None, shape: torch.Size) -> torch.Tensor:
    """Packed rows back to (batch, seq, heads, dim), zeros in the rows that were not kept."""
    if rows is None:
        return out.view(shape)
    return out.new_zeros((shape[0] * shape[1], *shape[2:])).index_copy(0, rows, out).view(shape)


def _padded(name: str, q, k, v, mask: torch.Tensor, options: dict) -> torch.Tensor:
    """Attention over a padded batch: unpad, attention_varlen, pad again."""
    if mask.dim() != 2:
        raise ValueError(
            f"{name}: tritonkit attention takes a 2-D padding mask (batch, keys), as transformers builds it for "
            f"this implementation; got a {mask.dim()}-D mask of shape {tuple(mask.shape)} (a custom mask "
            "pattern): use attn_implementation='sdpa' or 'eager' for it"
        )
    batch, q_len = q.shape[:2]
    if tuple(mask.shape) != (batch, k.shape[1]):
        raise ValueError(
            f"{name}: the padding mask must be (batch, keys) = {(batch, k.shape[1])}, got {tuple(mask.shape)}"
        )
    keys = _read_once(("keys",), mask, _from_mask)
    if q_len == k.shape[1]:
        queries = keys
    elif q_len == 1:  # decoding: one query per sequence, the last token of each
        queries = _Ragged(None, torch.arange(batch + 1, dtype=torch.int32, device=q.device), 1)
    else:  # fewer queries than keys: they are the last ones (left padding)
        queries = _read_once(("queries", q_len), mask, lambda m: _from_mask(m[:, -q_len:]))
    out = ops.attention_varlen(
        _rows(q, queries.rows), _rows(k, keys.rows), _rows(v, keys.rows),
        queries.cu_seqlens, keys.cu_seqlens, queries.max_seqlen, keys.max_seqlen, **options,
    )  # fmt: skip
    return _unpacked(out, queries.rows, q.shape)


_VARLEN_KWARGS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")
_PACKED_UNDER_COMPILE = (
    "tritonkit attention: under torch.compile, position_ids that restart within a row (packed sequences) must come "
    "with the cu_seq_lens_q/k and max_length_q/k arguments (DataCollatorWithFlattening(return_flash_attn_kwargs=True))"
)


def _packed(name: str, q, k, kwargs: dict) -> tuple | None:
    """(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k) of a packed batch, or None for a dense one."""
    given = [kwargs.get(key) for key in _VARLEN_KWARGS]
    if all(value is not None for value in given):
        cu_q, cu_k, max_q, max_k = given
        return cu_q.to(torch.int32), cu_k.to(torch.int32), int(max_q), int(max_k)
    positions = kwargs.get("position_ids")
    batch, q_len = q.shape[:2]
    if positions is None or q_len == 1:
        return None
    if positions.dim() != 2 or positions.shape[0] not in (1, batch) or positions.shape[1] != q_len:
        raise ValueError(
            f"{name}: tritonkit attention reads packed sequences from position_ids of shape (batch, seq) = "
            f"{(batch, q_len)} (or (1, seq)), got {tuple(positions.shape)}"
        )
    if torch.compiler.is_compiling():
        # Finding the sequences reads values on the host: a graph break in every layer. Under compile a packed batch
        # comes through the cu_seq_lens_* arguments; position ids without them must run on by one in each row, which
        # the device checks without a synchronisation (a packed batch fails here rather than attending across).
        runs_on = (positions[:, 1:] == positions[:, :-1] + 1).all()
        torch._assert_async(runs_on, _PACKED_UNDER_COMPILE)
        return None
    if _is_default(positions):
        return None
    ragged = _read_once(("positions", batch), positions, lambda p: _from_positions(p.expand(batch, -1)))
    if ragged is None:
        return None
    if k.shape[1] != q_len:
        raise ValueError(
            f"{name}: position_ids restart within a row (packed sequences), but the keys ({k.shape[1]}) are not "
            f"the queries ({q_len}): packed sequences cannot continue a cache"
        )
    return ragged.cu_seqlens, ragged.cu_seqlens, ragged.max_seqlen, ragged.max_seqlen


def tritonkit_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function interface over ``tk.ops.attention`` and ``tk.ops.attention_varlen``.

    query (batch, heads, q_len, head_dim), key and value (batch, kv_heads, k_len, head_dim), as the models pass
    them (GQA: heads a multiple of kv_heads). Returns ``(output, None)``: output (batch, q_len, heads, head_dim),
    contiguous, in query's dtype; no attention weights are formed. See the module docstring for masks, packed
    sequences and windows.
    """
    name = type(module).__name__
    _refuse_unsupported(name, dropout, kwargs)
    if value.shape[-1] != key.shape[-1]:
        raise ValueError(f"{name}: tritonkit attention needs value's head dim to be key's, got "
                         f"{value.shape[-1]} and {key.shape[-1]}")  # fmt: skip
    causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
    options = {
        "causal": causal,
        "scale": scaling,
        "window": _window(sliding_window, key.shape[2], causal),
        "softcap": float(softcap or 0.0),
    }
    q, k, v = (x.transpose(1, 2) for x in (query, key, value))  # (batch, seq, heads, dim): flash-attn's layout
    if attention_mask is not None:
        return _padded(name, q, k, v, attention_mask, options), None
    packed = _packed(name, q, k, kwargs)
    if packed is None:
        return ops.attention(q, k, v, layout="bshd", **options), None
    out = ops.attention_varlen(_rows(q, None), _rows(k, None), _rows(v, None), *packed, **options)
    return out.view(q.shape), None


def _padding_mask(batch_size, q_length=None, kv_length=None, q_offset=0, kv_offset=0, mask_function=None,
                  attention_mask=None, cache_position=None, **kwargs):  # fmt: skip
    """The mask builder transformers calls for this implementation: its flash-attention one (the 2-D padding mask,
    or None when nothing is padded), after refusing what a padding mask cannot carry."""
    from transformers import masking_utils

    if attention_mask is not None and _is_default(attention_mask):
        attention_mask = None  # default_inputs_hook's all-ones mask: nothing padded, known without reading it
    where = {"q_length": q_length, "q_offset": q_offset}
    if cache_position is not None:  # earlier 5.x versions pass the queries' positions instead of their count and offset
        where = {"cache_position": cache_position}
        q_length = cache_position.shape[0]
        # Without a cache the keys are the queries: nothing to read. With one (generation), the first position is
        # read once per step to tell a static cache's unwritten slots from keys already seen.
        q_offset = 0 if kv_offset + kv_length == q_length else int(cache_position[0])
    # In causal masks, keys beyond the tokens seen so far are a static cache's unwritten slots (static layers also
    # keep the offset on the device). Bidirectional masks (encoders, cross-attention) have keys of their own length.
    causal = "allow_is_bidirectional_skip" not in kwargs
    if isinstance(q_offset, torch.Tensor) or (causal and kv_offset + kv_length > q_offset + q_length):
        seen = "kept on the device" if isinstance(q_offset, torch.Tensor) else q_offset + q_length
        raise ValueError(
            f"tritonkit attention runs with dynamic caches only: this cache holds {kv_offset + kv_length} key slots "
            f"for {seen} tokens seen (a static cache, such as cache_implementation='static'), and a kernel without "
            "a mask would read the unwritten ones; use attn_implementation='sdpa' for it"
        )
    if kwargs.get("use_vmap"):  # set by transformers where an or/and mask function joins the pattern
        raise ValueError(
            "tritonkit attention supports causal, sliding-window and padding masks; this model adds another pattern "
            "(an or/and mask function, such as bidirectional image tokens): use attn_implementation='sdpa'"
        )
    return masking_utils.flash_attention_mask(
        batch_size=batch_size, kv_length=kv_length, kv_offset=kv_offset, mask_function=mask_function,
        attention_mask=attention_mask, **where, **kwargs,
    )  # fmt: skip


def register() -> str:
    """Make ``"tritonkit"`` a valid ``attn_implementation`` in this process: the attention function and its mask
    builder. Registering again is harmless. Returns the name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTENTION_IMPLEMENTATION, tritonkit_attention)
    AttentionMaskInterface.register(ATTENTION_IMPLEMENTATION, _padding_mask)
    return ATTENTION_IMPLEMENTATION
