"""The fused linear losses' token chunks: how many tokens each chunk of the head's GEMMs takes, and the dtype
d(weight) and d(bias) are summed in. One rule for the single-GPU op (ops/loss) and the vocabulary-parallel one
(ops/vocab_parallel, on its slice of the head), which share it here since no family imports another.

The chunk (tokens per chunk) trades speed for transient memory. Each chunk's d(weight) GEMM reads and writes the
whole (V, H) accumulator: 2 * a * V * H bytes (a its element size) against the GEMM's 2 * rows * V * H FLOP, so that
traffic costs a * (FLOP rate / bandwidth) / rows of the GEMM's time, whatever V and H. On a GPU a chunk takes the
fewest rows that keep it within ACCUMULATOR_SHARE, unless its logits (rows * V) would pass MAX_CHUNK_LOGIT_BYTES, the
memory cap, which wins: see fused_chunk_plan. Where all the tokens' logits take no more memory than that accumulator
and chunk (a d(weight) written once in the weight's dtype beside them), one chunk takes every token: no accumulator
at all, and its three GEMMs are whole. docs/kernels/loss.md has the measurements.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from tritonkit._core.device import arch as device_arch  # fused_chunk_plan's parameter is named arch

CHUNK_ROW_MULTIPLE = 128  # fused chunks: GEMM-tile-friendly row counts once they are this large
# The GPU's bf16 tensor-core FLOP rate over its memory bandwidth, as cuBLAS reaches them: the H100's ~670 TFLOP/s
# over 3.35 TB/s is 200, the H200's ~700 over 4.8 TB/s 146; between the two. Unmeasured architectures take sm90's.
FLOP_PER_BYTE = {"sm90": 170.0}
ACCUMULATOR_SHARE = 1 / 6  # d(weight)'s accumulator traffic at most a sixth of its GEMM: ~5% of the three GEMMs
MAX_CHUNK_LOGIT_BYTES = 1 << 30  # a chunk's logits: half the fp32 dW of a 128256 x 4096 head, ~1% of an H100
# CPU tensors (the interpreter's tests) keep a tenth of the tokens a chunk: the CPU's GEMMs have no accumulator
# traffic worth hiding, and several chunks a call are what exercises the chunk loop there.
CPU_CHUNK_FRACTION = 10


@dataclass(frozen=True)
class FusedChunkPlan:
    rows: int  # tokens per chunk (the last chunk takes the remainder)

    def __post_init__(self) -> None:
        if isinstance(self.rows, bool) or not isinstance(self.rows, int) or self.rows < 1:
            raise ValueError(f"FusedChunkPlan: rows must be an int >= 1, got {self.rows!r}")


def _whole_tiles(rows: int) -> int:
    """rows rounded down to a multiple of CHUNK_ROW_MULTIPLE once that large, at least 1."""
    return max(1, rows - rows % CHUNK_ROW_MULTIPLE if rows >= CHUNK_ROW_MULTIPLE else rows)


@functools.lru_cache(maxsize=256)
def fused_chunk_plan(n_tokens: int, n_vocab: int, logit_bytes: int, accum_bytes: int, arch: str, *,
                     hidden_size: int = 0, weight_bytes: int = 0) -> FusedChunkPlan:  # fmt: skip
    """Tokens per chunk of the fused op, for logits of ``logit_bytes`` per element and a d(weight) accumulator of
    ``accum_bytes`` (4 for fp32, 2 for the weight's 16-bit dtype); ``arch`` as :func:`tritonkit._core.device.arch`,
    or "cpu" for CPU tensors. ``hidden_size`` and ``weight_bytes`` (the weight's element size) where a d(weight) is
    made, 0 where none is.

    On a GPU: the fewest rows whose d(weight) GEMM keeps the accumulator's read and write within ACCUMULATOR_SHARE
    of its time, accum_bytes * FLOP_PER_BYTE / ACCUMULATOR_SHARE, rounded up to whole GEMM tiles (4096 rows for
    fp32 on sm90, 2048 for bf16); but no more rows than keep the chunk's logits within MAX_CHUNK_LOGIT_BYTES
    (4096 rows at V = 128256 in bf16, 2048 at V = 262144), nor more than the tokens. Every token in one chunk where
    a d(weight) is made and the peak allows it (:func:`whole_batch_fits`). On the CPU a tenth of the tokens. At
    least 1."""
    if arch == "cpu":
        return FusedChunkPlan(rows=_whole_tiles(min(n_tokens, max(1, n_tokens // CPU_CHUNK_FRACTION))))
    hiding = accum_bytes * FLOP_PER_BYTE.get(arch, FLOP_PER_BYTE["sm90"]) / ACCUMULATOR_SHARE
    hiding_rows = -(-int(hiding) // CHUNK_ROW_MULTIPLE) * CHUNK_ROW_MULTIPLE
    rows = max(1, min(hiding_rows, _whole_tiles(MAX_CHUNK_LOGIT_BYTES // max(1, n_vocab * logit_bytes))))
    if weight_bytes and whole_batch_fits(n_tokens, rows, hidden_size, logit_bytes, weight_bytes, accum_bytes):
        return FusedChunkPlan(rows=max(1, n_tokens))
    return FusedChunkPlan(rows=max(1, min(rows, n_tokens)))


def whole_batch_fits(n_tokens: int, chunk_rows: int, hidden_size: int, logit_bytes: int, weight_bytes: int,
                     accum_bytes: int) -> bool:  # fmt: skip
    """Whether one chunk of every token peaks no higher than chunks of ``chunk_rows``, per class (vocabulary row):
    all the logits and d(weight) in the weight's dtype (one GEMM rounds once, as an fp32 accumulator's final cast
    does), against the accumulator and, the larger of the two, a chunk of logits or, where the accumulator is
    wider than the weight, the cast copy the backward makes beside it. At V = 128256, H = 4096 in bf16 with an fp32
    accumulator: up to 8192 tokens (2 GiB of logits against 2 GiB of fp32 d(weight) and 1 GiB of chunk)."""
    whole = n_tokens * logit_bytes + hidden_size * weight_bytes
    cast_copy = hidden_size * weight_bytes if accum_bytes != weight_bytes else 0
    return whole <= hidden_size * accum_bytes + max(chunk_rows * logit_bytes, cast_copy)


def chunk_plan(hidden: torch.Tensor, weight: torch.Tensor, accum_dtype: torch.dtype, need_weight: bool = False, *,
               n_classes: int | None = None) -> FusedChunkPlan:  # fmt: skip
    """The fused op's chunks for these operands on their device (:func:`fused_chunk_plan`; "cpu" for CPU tensors);
    ``need_weight``: a d(weight) is made (which may let one chunk take every token). ``n_classes``: the classes the
    rule plans for, weight.shape[0] unless given (the vocabulary-parallel op gives its largest slice's, so that every
    rank plans the same chunks)."""
    device = hidden.device
    key = device_arch(device) if device.type == "cuda" else "cpu"
    n_classes = weight.shape[0] if n_classes is None else n_classes
    sizes = (hidden.shape[0], n_classes, hidden.element_size(), accum_dtype.itemsize, key)
    hidden_size, weight_bytes = (weight.shape[1], weight.element_size()) if need_weight else (0, 0)
    # Symbolic sizes (torch.compile's dynamic shapes, in the fakes) cannot key the plan's cache.
    concrete = all(isinstance(size, int) for size in (*sizes[:2], hidden_size))
    plan_for = fused_chunk_plan if concrete else fused_chunk_plan.__wrapped__
    return plan_for(*sizes, hidden_size=hidden_size, weight_bytes=weight_bytes)


def plan_and_accum(hidden: torch.Tensor, weight: torch.Tensor, accum_dtype: torch.dtype, need_weight: bool,
                   plan: FusedChunkPlan | None, *,
                   n_classes: int | None = None) -> tuple[FusedChunkPlan, torch.dtype]:  # fmt: skip
    """The chunks (``plan``, else chunk_plan's) and the dtype d(weight) and d(bias) are summed in: the weight's
    own where one chunk takes every token (one GEMM sums in fp32 and rounds once, as the fp32 accumulator's cast
    would), else ``accum_dtype``. The fakes call it too, so that compiled and eager calls agree. Without a
    d(weight) (a frozen head, or the forward of "none") no accumulator needs hiding: fp32's rule, the larger chunks.
    ``n_classes`` as :func:`chunk_plan`'s."""
    if plan is None:
        accum_for_plan = accum_dtype if need_weight else torch.float32
        plan = chunk_plan(hidden, weight, accum_for_plan, need_weight, n_classes=n_classes)
    return plan, (weight.dtype if plan.rows >= hidden.shape[0] else accum_dtype)
