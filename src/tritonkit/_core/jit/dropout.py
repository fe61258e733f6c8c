"""Dropout's keep mask inside kernels, from a counter-based generator: the same mask wherever, and however often, it
is computed (a backward recomputes its forward's; the host's mirror is tritonkit._core.dropout.keep_mask)."""

import triton
import triton.language as tl

from tritonkit._core.dropout import KEEP_BITS, PHILOX_ROUNDS

_ROUNDS = tl.constexpr(PHILOX_ROUNDS)
_DROPPED_BITS = tl.constexpr(32 - KEEP_BITS)


@triton.jit
def keep_mask(p_seed, o_counter, threshold):
    """Which elements dropout keeps: the first word of Philox4x32-7 at counters ``o_counter`` (int64, any shape)
    under the int64 seed at ``p_seed``, its top KEEP_BITS bits compared with ``threshold`` (round(p * 2**24)): each
    element dropped with probability p, to within 2**-25. An integer comparison, so that the host's mirror gives the
    same mask bit for bit."""
    b_bits = tl.randint(tl.load(p_seed), o_counter, n_rounds=_ROUNDS)
    return (b_bits >> _DROPPED_BITS).to(tl.int32) >= threshold
