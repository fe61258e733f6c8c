"""Dropout on the host: the kernels' threshold and scale from p, the seed they read, and their keep mask in torch.

The kernels draw no random state of their own: a mask is a fixed function of a 64-bit seed and each element's
counter (tritonkit._core.jit.dropout), so a backward recomputes the forward's mask from the seed instead of storing
it, and the float64 references and tests compute the very same mask here with :func:`keep_mask`.
"""

from __future__ import annotations

import torch

PHILOX_ROUNDS = 7  # Philox4x32 passes TestU01's BigCrush from 7 rounds (Salmon et al. 2011); 10 only adds margin
KEEP_BITS = 24  # the generator word's top bits compared with the threshold: p resolved to 2**-24
SEED_LIMIT = 2**63  # seeds are int64 values in [0, SEED_LIMIT)
_WORD = 0xFFFFFFFF
_ROUND_A, _ROUND_B = 0xD2511F53, 0xCD9E8D57  # Philox4x32's multipliers
_KEY_A, _KEY_B = 0x9E3779B9, 0xBB67AE85  # its Weyl key increments


def keep_threshold(p: float) -> int:
    """The threshold the top KEEP_BITS bits of an element's word must reach for it to be kept: round(p * 2**24)."""
    return round(p * 2**KEEP_BITS)


def keep_scale(p: float) -> float:
    """What a kept element is multiplied by, 1 / (1 - p), so that the expectation is unchanged."""
    return 1.0 / (1.0 - p)


def seed_tensor(seed: int | None, device: torch.device) -> torch.Tensor:
    """The (1,) int64 seed a kernel loads: ``seed`` itself, or drawn from torch's default generator of ``device``
    when None (``torch.manual_seed`` makes it reproducible). Either way on the device, with no host synchronisation
    (a fill or a draw launch; CUDA-graph capturable)."""
    if seed is None:
        return torch.randint(SEED_LIMIT - 1, (1,), dtype=torch.int64, device=device)
    return torch.full((1,), seed, dtype=torch.int64, device=device)


def _mul_words(a: torch.Tensor, b: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(high, low) 32-bit words of the 64-bit product of 32-bit words ``a`` and ``b``, in int64 arithmetic: the
    product is split in 16-bit halves so that no partial sum passes 2**63."""
    a_high, a_low = a >> 16, a & 0xFFFF
    b_high, b_low = b >> 16, b & 0xFFFF
    low = (a_high * b_low + a_low * b_high) * 65536 + a_low * b_low
    return a_high * b_high + (low >> 32), low & _WORD


def keep_mask(seed: int, counters: torch.Tensor, p: float) -> torch.Tensor:
    """The kernels' keep mask in torch: element with counter c is kept when the top KEEP_BITS bits of the first word
    of Philox4x32-7 at counter (c low word, c high word, 0, 0) under key (seed low word, seed high word) are at least
    keep_threshold(p), exactly as tl.randint computes it. ``counters``: int64, any shape."""
    c0, c1 = counters & _WORD, (counters >> 32) & _WORD
    c2, c3 = torch.zeros_like(c0), torch.zeros_like(c0)
    k0, k1 = seed & _WORD, (seed >> 32) & _WORD
    for _ in range(PHILOX_ROUNDS):
        high_b, low_b = _mul_words(c2, _ROUND_B)
        high_a, low_a = _mul_words(c0, _ROUND_A)
        c0, c1, c2, c3 = high_b ^ c1 ^ k0, low_b, high_a ^ c3 ^ k1, low_a
        k0, k1 = (k0 + _KEY_A) & _WORD, (k1 + _KEY_B) & _WORD
    return (c0 >> (32 - KEEP_BITS)) >= keep_threshold(p)
