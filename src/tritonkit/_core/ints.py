"""Integer helpers for launch grids and block sizes, in plain Python.

Triton 3.6 made ``triton.cdiv`` and ``triton.next_power_of_2`` constexpr functions usable inside
kernels too; a host call to one now costs ~1.8 µs (against ~0.02 µs for the arithmetic), and a
launcher on a hot path pays it on every call.
"""

from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for a >= 0, b > 0."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1)."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def prev_power_of_2(n: int) -> int:
    """The largest power of two <= n, for n >= 1."""
    return 1 << (n.bit_length() - 1)
