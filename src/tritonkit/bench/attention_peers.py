"""Other implementations of :func:`tritonkit.ops.attention` for benchmarks: PyTorch's scaled_dot_product_attention
with one backend forced (FlashAttention-2, cuDNN), and FlexAttention compiled.

Each factory returns a callable with attention's signature (q, k, v and the keyword-only options ``causal``,
``scale``, ``window``, ``softcap``, ``layout``, ``return_lse``, ``deterministic``), returning the output in q's layout,
so that a spec can name them as peers (``tritonkit.bench.providers.PEERS``) and a benchmark can time them on the same
inputs. ``deterministic`` is taken and left, as tritonkit's own op does (its backward is always deterministic); a
peer's backward is the one its backend has.

A case a peer cannot compute as tritonkit defines it raises :class:`Unsupported` (a ValueError) with the reason, on
the call, before any work: a benchmark records the refusal instead of timing something else. The semantics to
match: causal aligns the diagonal bottom-right when Sq != Sk (flash-attn 2); ``window=(left, right)``, -1
unbounded, lets query i (after that alignment) see keys i - left <= j <= i + right, and causal sets right to 0;
``softcap > 0`` maps scores s to softcap * tanh(s / softcap) after scaling.

This module is imported only by the specs' peer factories and benchmark scripts, never by an op.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable

import torch

LAYOUTS = ("bhsd", "bshd")


class Unsupported(ValueError):
    """A peer cannot compute this case with tritonkit's semantics."""


def visible_window(causal: bool, window: tuple[int, int]) -> tuple[int, int]:
    """(left, right) of the keys a query sees around its aligned position, -1 unbounded: causal sets right to 0."""
    left, right = (int(w) for w in window)
    return left, 0 if causal else right


def _heads_first(q, k, v, layout: str):
    """q, k, v as (B, H, S, D). A (B, S, H, D) input is transposed as a view, never copied here: SDPA's flash and
    cuDNN backends and FlexAttention's kernels take strides, and a copy a backend makes for a memory order it does
    not take happens inside the timed call, as it would in a model."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if layout == "bshd":
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    return q, k, v


def _gqa(q, k) -> bool:
    return q.shape[1] != k.shape[1]


# ---------------------------------------------------------------- SDPA with one backend


def sdpa_is_causal(name: str, sq: int, sk: int, causal: bool, window: tuple[int, int]) -> bool:
    """SDPA's ``is_causal`` for tritonkit's mask, or Unsupported: SDPA masks only causally, and its causal
    diagonal starts at the top-left corner, which is tritonkit's bottom-right one only when Sq == Sk."""
    left, right = visible_window(causal, window)
    if left >= 0 or right > 0:
        raise Unsupported(f"{name}: SDPA has no sliding window (window=({left}, {right}))")
    if right < 0:
        return False
    if sq != sk:
        raise Unsupported(
            f"{name}: SDPA's is_causal aligns the diagonal top-left, tritonkit's causal bottom-right; they differ "
            f"when Sq != Sk (here {sq} and {sk})"
        )
    return True


def _sdpa(name: str, backend_name: str) -> Callable:
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = getattr(SDPBackend, backend_name)

    def run(q, k, v, *, causal=False, scale=None, window=(-1, -1), softcap=0.0, layout="bhsd", return_lse=False,
            deterministic=True):  # fmt: skip
        q, k, v = _heads_first(q, k, v, layout)
        is_causal = sdpa_is_causal(name, q.shape[2], k.shape[2], causal, window)
        if softcap:
            raise Unsupported(f"{name}: SDPA has no softcap (softcap={softcap})")
        if return_lse:
            raise Unsupported(f"{name}: SDPA returns no log-sum-exp")
        # Grouped heads go to the backend as they are (enable_gqa); a backend without GQA raises its own error.
        # Repeating k and v to Hq heads instead would put the copy inside the timed call.
        gqa = {"enable_gqa": True} if _gqa(q, k) else {}
        # Forcing one backend: SDPA raises instead of falling back to another when this one cannot run the case.
        with sdpa_kernel(backend):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale, **gqa)
        return out.transpose(1, 2) if layout == "bshd" else out

    run.__name__ = name.replace("-", "_")
    return run


def sdpa_flash() -> Callable:
    """``F.scaled_dot_product_attention`` under ``sdpa_kernel(SDPBackend.FLASH_ATTENTION)`` (FlashAttention-2 on
    CUDA). Refuses windows, softcap, lse, and causal with Sq != Sk."""
    return _sdpa("sdpa-flash", "FLASH_ATTENTION")


def sdpa_cudnn() -> Callable:
    """``F.scaled_dot_product_attention`` under ``sdpa_kernel(SDPBackend.CUDNN_ATTENTION)``. Refuses as
    :func:`sdpa_flash`."""
    return _sdpa("sdpa-cudnn", "CUDNN_ATTENTION")


# ---------------------------------------------------------------- FlexAttention


def mask_mod_for(sq: int, sk: int, causal: bool, window: tuple[int, int]) -> Callable | None:
    """FlexAttention's mask_mod for tritonkit's visibility (None: every key visible). Query i sits at key position
    i + Sk - Sq (the bottom-right alignment); it sees keys from position - left to position + right."""
    left, right = visible_window(causal, window)
    offset = sk - sq

    def after_left(b, h, q_idx, kv_idx):
        return kv_idx >= q_idx + offset - left

    def before_right(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx + offset + right

    def between(b, h, q_idx, kv_idx):
        return after_left(b, h, q_idx, kv_idx) & before_right(b, h, q_idx, kv_idx)

    if left >= 0 and right >= 0:
        return between
    if left >= 0:
        return after_left
    if right >= 0:
        return before_right
    return None


@functools.cache
def softcap_score_mod(softcap: float) -> Callable:
    """FlexAttention's score_mod for a softcap (scores arrive scaled). One function per value: torch.compile guards
    on the function, and a new one per call would recompile."""

    def score_mod(score, b, h, q_idx, kv_idx):
        return softcap * torch.tanh(score / softcap)

    return score_mod


# Block masks by (Sq, Sk, left, right, device): building one runs its mask_mod over the whole grid, which costs far
# more than the attention of small cases and must stay outside the timed calls. Benchmarks warm up before they time
# (and capture CUDA graphs), so the first call builds it and every timed call finds it here.
_BLOCK_MASKS: dict[tuple, object] = {}


def block_mask_for(sq: int, sk: int, causal: bool, window: tuple[int, int], device) -> object | None:
    """The cached BlockMask of :func:`mask_mod_for` (None: every key visible)."""
    from torch.nn.attention.flex_attention import create_block_mask

    left, right = visible_window(causal, window)
    key = (sq, sk, left, right, str(torch.device(device)))
    if key not in _BLOCK_MASKS:
        mask_mod = mask_mod_for(sq, sk, causal, window)
        _BLOCK_MASKS[key] = None if mask_mod is None else create_block_mask(mask_mod, None, None, sq, sk, device=device)
    return _BLOCK_MASKS[key]


def flex_shapes(compiled: bool):
    """The context a FlexAttention call runs in. Eager flex_attention traces score_mod with dynamo; after a recompile
    (a new shape or softcap), automatic dynamic makes the softcap a closure holds a SymFloat, which torch 2.15's flex
    op refuses: eager calls run with static shapes, which keep it a constant. The compiled path is static already
    (dynamic=False)."""
    return contextlib.nullcontext() if compiled else torch._dynamo.config.patch(automatic_dynamic_shapes=False)


@functools.cache
def _compiled_flex_attention() -> Callable:
    """One torch.compile of flex_attention per process (compiling is what makes it a fused kernel). Static shapes:
    each case compiles its own kernels during warm-up, as a model with fixed shapes would."""
    from torch.nn.attention.flex_attention import flex_attention as flex

    return torch.compile(flex, dynamic=False)


def flex_attention(compiled: bool = True) -> Callable:
    """FlexAttention with tritonkit's semantics: a block mask for causal (bottom-right) and windows, a score_mod for
    softcap, grouped heads through ``enable_gqa``, the lse through ``return_aux``. ``compiled=False`` runs the eager
    implementation (it forms every score: for checking on a CPU, never for timing)."""
    from torch.nn.attention import flex_attention as flex_module

    def run(q, k, v, *, causal=False, scale=None, window=(-1, -1), softcap=0.0, layout="bhsd", return_lse=False,
            deterministic=True):  # fmt: skip
        fn = _compiled_flex_attention() if compiled else flex_module.flex_attention
        q, k, v = _heads_first(q, k, v, layout)
        options = {
            "score_mod": softcap_score_mod(float(softcap)) if softcap else None,
            "block_mask": block_mask_for(q.shape[2], k.shape[2], causal, window, q.device),
            "scale": scale,
            "enable_gqa": _gqa(q, k),
        }
        with flex_shapes(compiled):
            if return_lse:
                out, aux = fn(q, k, v, **options, return_aux=flex_module.AuxRequest(lse=True))
                lse = aux.lse
            else:
                out, lse = fn(q, k, v, **options), None
        out = out.transpose(1, 2) if layout == "bshd" else out
        return (out, lse) if return_lse else out

    run.__name__ = "flex_attention" if compiled else "flex_attention_eager"
    return run
