"""The vocabulary-parallel losses in the registry: float64 references, typed cases, cost model.

The registry runs them in one process, a group of one rank: the slice is the whole vocabulary, and the checks cover
the kernels, the combination of statistics and the chunking. Two ranks (slices, all-reduces, DTensor layouts) are
checked by tests/test_distributed.py, which runs a CPU group of two processes.
"""

import math
from dataclasses import dataclass

import torch

from tritonkit._core.checks import FLOAT_DTYPES
from tritonkit.ops.vocab_parallel.op import vocab_parallel_cross_entropy, vocab_parallel_fused_linear_cross_entropy
from tritonkit.registry import TOLERANCES, Case, Inputs, KernelSpec, Tolerance, register


@dataclass(frozen=True, kw_only=True)
class VocabParallelCase(Case):
    tokens: int
    vocab: int
    hidden: int = 0  # the fused op's H; 0 for the logits form
    ignored: bool = False  # every third target is ignore_index
    label_smoothing: float = 0.0
    z_loss: float = 0.0
    softcap: float | None = None
    reduction: str = "mean"
    bias: bool = False
    fp32_loss: bool = False  # loss_dtype=torch.float32


def _loss_reference(logits, target, *, ignore_index=-100, label_smoothing=0.0, z_loss=0.0, softcap=None,
                    reduction="mean", loss_dtype=None):  # fmt: skip
    """loss = lse - (1 - e) y_t - (e / V) sum_j y_j + z lse^2 with y = softcap tanh(logits / softcap), 0 on ignored
    targets; the mean over the non-ignored ones (0 when none). In float64 (``loss_dtype`` rounds only the op's)."""
    y = logits if softcap is None else softcap * torch.tanh(logits / softcap)
    y = y.reshape(-1, y.shape[-1])
    flat = target.reshape(-1)
    keep = flat != ignore_index
    lse = torch.logsumexp(y, dim=-1)
    y_t = y.gather(1, torch.where(keep, flat, 0)[:, None])[:, 0]
    loss = lse - (1 - label_smoothing) * y_t - label_smoothing * y.mean(-1) + z_loss * lse**2
    loss = torch.where(keep, loss, 0.0)
    if reduction == "none":
        return loss.view(target.shape)
    return loss.sum() / keep.sum().clamp_min(1) if reduction == "mean" else loss.sum()


def _fused_reference(hidden, weight, target, bias=None, **options):
    logits = hidden @ weight.t()
    return _loss_reference(logits if bias is None else logits + bias, target, **options)


def _targets(case, device, generator):
    target = torch.randint(0, case.vocab, (case.tokens,), device=device, generator=generator)
    if case.ignored:
        target[::3] = -100
    return target


def _options(case) -> dict:
    options = {"label_smoothing": case.label_smoothing, "z_loss": case.z_loss, "softcap": case.softcap,
               "reduction": case.reduction}  # fmt: skip
    if case.fp32_loss:
        options["loss_dtype"] = torch.float32
    return options


def _logits_inputs(case, device, dtype, generator):
    """Logits of scale 3: peaked rows, so the softmax term of the gradient matters."""
    logits = 3.0 * torch.randn((case.tokens, case.vocab), device=device, generator=generator)
    return Inputs((logits.to(dtype), _targets(case, device, generator)), _options(case))


def _fused_inputs(case, device, dtype, generator):
    """hidden of unit scale, the head scaled by 2 / sqrt(H): logits of scale ~2."""
    hidden = torch.randn((case.tokens, case.hidden), device=device, generator=generator).to(dtype)
    weight = torch.randn((case.vocab, case.hidden), device=device, generator=generator) * (2 / math.sqrt(case.hidden))
    options = _options(case)
    if case.bias:
        options["bias"] = (0.5 * torch.randn((case.vocab,), device=device, generator=generator)).to(dtype)
    return Inputs((hidden, weight.to(dtype), _targets(case, device, generator)), options)


def _logits_tolerance(case, dtype):
    """The table's rtol with an absolute floor of 1e-6: logit gradients are p / tokens, most far below the table's
    atol, which would let a missing softmax term pass."""
    return Tolerance(atol=1e-6, rtol=TOLERANCES[dtype].rtol)


def _fused_tolerance(case, dtype):
    """fp32: GEMM sums of V or H products, rounding near sqrt(V) ulps. 16-bit: the logits are a 16-bit GEMM output
    (as in torch's own 16-bit path), so every gradient carries relative errors near an ulp of the largest logit;
    sums and per-token losses ("sum", "none") are tokens times larger than a mean's."""
    if dtype == torch.float32:
        return Tolerance(atol=max(1e-6, 8 * 2**-24 * math.sqrt(case.vocab)), rtol=1e-5)
    atol = (2.5e-2 if dtype == torch.bfloat16 else 4e-3) * (1 if case.reduction == "mean" else 4)
    return Tolerance(atol=atol, rtol=2 * TOLERANCES[dtype].rtol)


# Each option alone and together, reductions, ignored rows, odd vocabularies (1, 33, 5000: several loop steps).
_LOGITS_TESTS = (
    {"tokens": 5, "vocab": 7},
    {"tokens": 3, "vocab": 1},
    {"tokens": 6, "vocab": 33, "ignored": True, "label_smoothing": 0.1, "z_loss": 1e-2, "softcap": 5.0},
    {"tokens": 6, "vocab": 33, "ignored": True, "reduction": "sum"},
    {"tokens": 6, "vocab": 20, "ignored": True, "label_smoothing": 0.2, "reduction": "none"},
    {"tokens": 2, "vocab": 5000, "z_loss": 1e-3, "softcap": 20.0},
    {"tokens": 6, "vocab": 20, "ignored": True, "reduction": "none", "fp32_loss": True},
)
_LOGITS_GPU = (
    {"tokens": 4096, "vocab": 64128, "ignored": True},
    {"tokens": 2048, "vocab": 131072, "label_smoothing": 0.1, "z_loss": 1e-4, "softcap": 30.0, "reduction": "none"},
)
# One rank's half of Llama 3's 128256 classes.
_LOGITS_BENCH = ({"tokens": 2048, "vocab": 64128}, {"tokens": 8192, "vocab": 64128})

_FUSED_TESTS = (
    {"tokens": 5, "vocab": 7, "hidden": 16},
    {"tokens": 12, "vocab": 33, "hidden": 8, "bias": True, "ignored": True},  # one-token chunks
    {"tokens": 25, "vocab": 20, "hidden": 8, "label_smoothing": 0.2, "z_loss": 1e-2, "softcap": 5.0},
    {"tokens": 10, "vocab": 20, "hidden": 8, "bias": True, "ignored": True, "reduction": "sum"},
    {"tokens": 10, "vocab": 20, "hidden": 8, "bias": True, "label_smoothing": 0.1, "reduction": "none"},
    {"tokens": 10, "vocab": 20, "hidden": 8, "ignored": True, "fp32_loss": True},
)
_FUSED_GPU = (
    {"tokens": 4096, "vocab": 64128, "hidden": 2048, "ignored": True},
    {"tokens": 2048, "vocab": 32000, "hidden": 1024, "bias": True, "reduction": "none"},
)
_FUSED_BENCH = ({"tokens": 2048, "vocab": 64128, "hidden": 4096}, {"tokens": 8192, "vocab": 64128, "hidden": 4096})

_COMMON = dict(family="vocab_parallel", sweep="tokens", case_type=VocabParallelCase, dtypes=FLOAT_DTYPES,
               has_backward=True, status="experimental")  # fmt: skip

register(KernelSpec(
    name="vocab_parallel_cross_entropy",
    summary="Cross-entropy of logits split along the vocabulary across ranks, never gathered.",
    description="Per row, each rank's slice gives its maximum, sum of exps, target logit and sum of logits; two "
                "all-reduces combine them into the lse and loss every rank agrees on, and each rank writes its "
                "slice's gradient from the lse alone. Megatron's layout with process_group=, or DTensor Shard(-1).",
    usage="loss = tk.ops.vocab_parallel_cross_entropy(local_logits, labels, process_group=tp_group)",
    tags=("loss", "distributed", "memory-bound", "backward"),
    limits="Class-last logits (..., n) per rank; int64/int32 targets equal on every rank.",
    fn=vocab_parallel_cross_entropy,
    reference=_loss_reference,
    make_inputs=_logits_inputs,
    test_cases=_LOGITS_TESTS,
    gpu_cases=_LOGITS_GPU,
    bench_cases=_LOGITS_BENCH,
    bytes_moved=lambda case, dtype: case.tokens * case.vocab * dtype.itemsize,
    bytes_moved_bwd=lambda case, dtype: 2 * case.tokens * case.vocab * dtype.itemsize,
    flops=lambda case, dtype: 6 * case.tokens * case.vocab,
    tolerance=_logits_tolerance,
    **_COMMON,
))  # fmt: skip

register(KernelSpec(
    name="vocab_parallel_fused_linear_cross_entropy",
    summary="LM-head matmul and cross-entropy with the head split along the vocabulary across ranks.",
    description="Tokens in chunks: a GEMM makes the chunk's slice of logits, the slice's statistics are "
                "all-reduced, the kernel overwrites the logits with their gradient and two GEMMs add the chunk's "
                "d(hidden) and this slice's d(weight) (fp32); d(hidden) is summed over the group once.",
    usage="loss = tk.ops.vocab_parallel_fused_linear_cross_entropy(hidden, lm_head.weight, labels)",
    tags=("loss", "fused", "distributed", "compute-bound", "backward"),
    limits="hidden (..., H) and targets equal on every rank; weight (n, H) or a DTensor Shard(0); one float dtype.",
    fn=vocab_parallel_fused_linear_cross_entropy,
    reference=_fused_reference,
    make_inputs=_fused_inputs,
    test_cases=_FUSED_TESTS,
    gpu_cases=_FUSED_GPU,
    bench_cases=_FUSED_BENCH,
    bytes_moved=lambda case, dtype: 2 * (case.tokens + case.vocab) * case.hidden * dtype.itemsize,
    bytes_moved_bwd=lambda case, dtype: 2 * (case.tokens + case.vocab) * case.hidden * dtype.itemsize,
    flops=lambda case, dtype: 2 * case.tokens * case.hidden * case.vocab,
    flops_bwd=lambda case, dtype: 4 * case.tokens * case.hidden * case.vocab,
    tolerance=_fused_tolerance,
    **_COMMON,
))  # fmt: skip
