"""cross_entropy and fused_linear_cross_entropy in the registry: float64 references, typed cases, cost, peers."""

import functools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tritonkit._core.checks import FLOAT_DTYPES
from tritonkit._core.ints import cdiv
from tritonkit._core.loss_chunks import fused_chunk_plan
from tritonkit.ops.loss.op import cross_entropy, fused_linear_cross_entropy
from tritonkit.registry import TOLERANCES, Case, Inputs, KernelSpec, Tolerance, register


@dataclass(frozen=True)
class _LossCase(Case):
    """The targets and options both losses take."""

    ignored: bool = False  # every third target is ignore_index
    all_ignored: bool = False
    ignore_index: int = -100
    label_smoothing: float = 0.0
    z_loss: float = 0.0
    softcap: float | None = None
    reduction: str = "mean"
    class_weights: bool = False  # torch's weight= (the fused op's ce_weight=), positive, no gradient
    return_z_loss: bool = False
    accuracy: bool = False  # return_token_accuracy; each row's argmax planted, the target's for half the rows
    fp32_loss: bool = False  # loss_dtype=torch.float32: the loss (and z-term) unrounded, its upstream gradient fp32


@dataclass(frozen=True, kw_only=True)
class CrossEntropyCase(_LossCase):
    tokens: int
    vocab: int
    scale: float = 3.0  # the logits' standard deviation: peaked rows, so the softmax term of the gradient matters
    batched: bool = False  # logits (2, tokens / 2, V): leading dimensions
    inplace_backward: bool = False


@dataclass(frozen=True, kw_only=True)
class FusedLinearCrossEntropyCase(_LossCase):
    tokens: int
    hidden: int
    vocab: int
    bias: bool = False
    weight_dtype_accum: bool = False  # accum_dtype = the case's dtype: d(weight), d(bias) summed over chunks in it


def _cross_entropy_reference(logits, target, weight=None, *, ignore_index=-100, label_smoothing=0.0, z_loss=0.0,
                             softcap=None, reduction="mean", inplace_backward=False, return_z_loss=False,
                             return_token_accuracy=False, loss_dtype=None):  # fmt: skip
    """torch's cross_entropy per row (class weights too) on the softcapped logits, plus z_loss * lse^2, reduced over
    the non-ignored rows: a mean divides the cross-entropy by the targets' weights (their count without weights) and
    the z-term by the count, each 1 where it is 0 (torch gives 0/0). With a return flag: the loss, then the z-term
    reduced alike and the fraction of rows whose argmax (of the logits as given) is the target, per row for "none".
    ``inplace_backward`` changes only where the op's gradient lives and ``loss_dtype`` only the result's rounding, so
    the reference takes them and stays out of place, in float64."""
    first_argmax = logits.reshape(-1, logits.shape[-1]).argmax(-1)
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    rows, flat_target = logits.reshape(-1, logits.shape[-1]), target.reshape(-1)
    valid = flat_target != ignore_index
    loss = F.cross_entropy(rows, flat_target, weight=weight, ignore_index=ignore_index,
                           label_smoothing=label_smoothing, reduction="none")  # fmt: skip
    z_term = torch.where(valid, z_loss * torch.logsumexp(rows, -1) ** 2, 0.0)
    count = valid.sum().clamp_min(1)
    denominator = count
    if weight is not None:
        total = torch.where(valid, weight[flat_target.clamp(0, weight.shape[0] - 1)], 0.0).sum()
        denominator = torch.where(total == 0, 1.0, total)

    def reduced(rows, denominator):
        if reduction == "none":
            return rows.view(target.shape)
        return rows.sum() / denominator if reduction == "mean" else rows.sum()

    outputs = [reduced(loss, denominator) + reduced(z_term, count)]
    if return_z_loss:
        outputs.append(reduced(z_term, count))
    if return_token_accuracy:
        correct = (valid & (first_argmax == flat_target)).double()
        outputs.append(correct.view(target.shape) if reduction == "none" else correct.sum() / count)
    return outputs[0] if len(outputs) == 1 else tuple(outputs)


def _fused_linear_cross_entropy_reference(hidden, weight, target, bias=None, ce_weight=None, accum_dtype=None,
                                          **options):  # fmt: skip
    """``accum_dtype`` changes only the rounding of the weight's gradients: the reference stays in float64."""
    logits = hidden @ weight.t()
    return _cross_entropy_reference(logits + bias if bias is not None else logits, target, ce_weight, **options)


def _present(op):
    """``op`` with the outputs not asked for (None) left out, as the reference returns them: the spec's fn."""

    @functools.wraps(op)
    def call(*args, **kwargs):
        result = op(*args, **kwargs)
        return tuple(t for t in result if t is not None) if isinstance(result, tuple) else result

    return call


def _randn(shape, device, generator, scale=1.0):
    return scale * torch.randn(shape, device=device, generator=generator, dtype=torch.float32)


def _targets(case: _LossCase, device, generator, vocab):
    """Random classes; every third token ignored with ``ignored``, all of them with ``all_ignored``."""
    target = torch.randint(0, vocab, (case.tokens,), device=device, generator=generator)
    if case.ignored:
        target[::3] = case.ignore_index
    if case.all_ignored:
        target[:] = case.ignore_index
    return target


def _options(case: _LossCase) -> dict:
    options = {key: getattr(case, key) for key in ("ignore_index", "label_smoothing", "z_loss", "softcap", "reduction")}
    if case.return_z_loss:
        options["return_z_loss"] = True
    if case.accuracy:
        options["return_token_accuracy"] = True
    if case.fp32_loss:
        options["loss_dtype"] = torch.float32
    return options


def _class_weights(case: _LossCase, vocab, device, generator, dtype):
    """Positive class weights in [0.5, 1.5), or None."""
    if not case.class_weights:
        return None
    return (0.5 + torch.rand((vocab,), device=device, generator=generator)).to(dtype)


def _planted_classes(target, vocab):
    """Each row's planted argmax: its target on even rows, the next class on odd ones (ignored rows: any)."""
    classes = target.clamp(0, vocab - 1).clone()
    classes[1::2] = (classes[1::2] + 1) % vocab
    return classes


def _ce_inputs(case, device, dtype, generator):
    """Logits of scale 3 (peaked rows: the softmax term of the gradient matters), optionally shaped
    (2, tokens / 2, V) to test leading dimensions."""
    tokens, vocab = case.tokens, case.vocab
    logits = _randn((tokens, vocab), device, generator, case.scale)
    target = _targets(case, device, generator, vocab)
    if case.accuracy:  # a clear argmax: ties of 16-bit logits would leave the accuracy to their order
        classes = _planted_classes(target, vocab)
        logits[torch.arange(tokens, device=device), classes] = logits.amax(-1) + 2.0
    logits = logits.to(dtype)
    if case.batched:
        logits, target = logits.view(2, tokens // 2, vocab), target.view(2, tokens // 2)
    options = _options(case)
    if case.inplace_backward:
        options["inplace_backward"] = True
    weight = _class_weights(case, vocab, device, generator, dtype)
    if weight is None:
        return Inputs((logits, target), options)
    return Inputs((logits, target), {"weight": weight, **options}, frozen=frozenset({"weight"}))


def _flce_inputs(case, device, dtype, generator):
    """hidden of unit scale, weight scaled by 2 / sqrt(H) so that logits have scale ~2."""
    tokens, hidden_size, vocab = case.tokens, case.hidden, case.vocab
    hidden = _randn((tokens, hidden_size), device, generator)
    weight = _randn((vocab, hidden_size), device, generator, 2.0 / math.sqrt(hidden_size))
    bias = _randn((vocab,), device, generator, 0.5).to(dtype) if case.bias else None
    target = _targets(case, device, generator, vocab)
    if case.accuracy:  # head rows of norm 2 and hidden rows along the planted class's: a clear argmax
        if vocab <= hidden_size:  # orthogonal rows: a margin of 4 in the logits
            weight = torch.linalg.qr(weight.t())[0].t() * 2.0
        else:  # more rows than dimensions (QR would keep only H of them): random rows, |cos| ~ 1 / sqrt(H) apart
            weight = weight * (2.0 / weight.norm(dim=1, keepdim=True))
        hidden = 0.1 * hidden + weight[_planted_classes(target, vocab)]
    hidden, weight = hidden.to(dtype), weight.to(dtype)
    kwargs = {"bias": bias} if bias is not None else {}
    if case.weight_dtype_accum:
        kwargs["accum_dtype"] = dtype
    ce_weight = _class_weights(case, vocab, device, generator, dtype)
    frozen = frozenset()
    if ce_weight is not None:
        kwargs["ce_weight"], frozen = ce_weight, frozenset({"ce_weight"})
    return Inputs((hidden, weight, target), {**kwargs, **_options(case)}, frozen)


def _ce_bytes(case, dtype, backward=False):
    """Forward: the logits read once. Backward: read again, gradient written."""
    return (2 if backward else 1) * case.tokens * case.vocab * dtype.itemsize


def _flce_bytes(case, dtype, backward=False):
    """hidden and weight read, and (the gradients being made in the forward) d(hidden) and d(weight)
    written; the backward only scales them: read and write once more."""
    elements = (case.tokens + case.vocab) * case.hidden
    return 2 * elements * dtype.itemsize


def _ce_tolerance(case, dtype):
    """The table's rtol, but an absolute floor of 1e-6 instead of the table's: logit gradients are
    p / n_tokens, mostly far below the table's atol, which would let a missing softmax term pass.
    fp32 arithmetic gives them a relative error near 1e-7 and a 16-bit store a relative error below
    the table's rtol; fp16 subnormals (below 6e-5) round to 6e-8 absolute."""
    return Tolerance(atol=1e-6, rtol=TOLERANCES[dtype].rtol)


def _flce_tolerance(case, dtype):
    """fp32: the d(hidden) GEMM sums V products; with one-token chunks the CPU runs it as a GEMV whose
    rounding grows like sqrt(V) (measured 9.3e-6 at V = 32001 over 20 runs, torch's one GEMM 6.6e-7),
    hence an atol of 8 * 2**-24 * sqrt(V). 16-bit: the logits are a 16-bit GEMM output, as in torch's
    own 16-bit path, so probabilities and every gradient carry relative errors near 2**-8 * |logit|
    (bf16). Over 10 seeds x 2 upstream modes per case ours reached 1.7e-2 (bf16) and 3.2e-3 (fp16)
    absolute with mean reduction, 4.5e-2 / 1.2e-2 with sum or none (gradients ~tokens times larger),
    torch's own 16-bit path 5.7e-2 / 1.4e-2. The bounds below sit above both, and far below the
    size of a dropped term (the softmax term alone is ~1/tokens).
    ``weight_dtype_accum`` rounds the running d(weight) and d(bias) to 16 bits once a chunk: up to half an ulp
    (2**-9 relative in bf16, 2**-12 in fp16) of the sum each time, so the rtol grows by that per chunk: as many as
    the CPU's plan makes (a tenth of the tokens a chunk: 13 chunks of 2 at 25 tokens); a GPU's chunks are larger."""
    if dtype == torch.float32:
        return Tolerance(atol=max(1e-6, 8 * 2**-24 * math.sqrt(case.vocab)), rtol=1e-5)
    summed = case.reduction != "mean"
    atol = (2.5e-2 if dtype == torch.bfloat16 else 4e-3) * (4 if summed else 1)
    rtol = 2 * TOLERANCES[dtype].rtol
    if case.weight_dtype_accum:
        chunks = cdiv(case.tokens, fused_chunk_plan(case.tokens, case.vocab, 2, 2, "cpu").rows)
        rtol += chunks * (2**-9 if dtype == torch.bfloat16 else 2**-12)
    return Tolerance(atol=atol, rtol=rtol)


def _liger_cross_entropy():
    from liger_kernel.ops.cross_entropy import LigerCrossEntropyFunction

    def call(logits, target, *, ignore_index=-100, label_smoothing=0.0, z_loss=0.0, softcap=None, reduction="mean",
             inplace_backward=True):  # fmt: skip
        # liger-kernel always writes the gradient over the logits (its forward does, in fact)
        rows, targets = logits.view(-1, logits.shape[-1]), target.view(-1)
        options = (ignore_index, z_loss, label_smoothing, reduction, softcap)  # liger's positional order
        loss, *_ = LigerCrossEntropyFunction.apply(rows, targets, None, *options)
        return loss

    # Measured with liger-kernel 0.8.5 on the H200 (tritonkit bench --cuda-graph, 2026-11-29): the capture fails with "a
    # previous error during capture" and leaves the process unable to capture the next case.
    call.fails_graph_capture = "liger-kernel's cross-entropy fails CUDA-graph capture"
    return call


def _liger_fused_linear_cross_entropy():
    from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction

    def call(hidden, weight, target, bias=None, *, ignore_index=-100, label_smoothing=0.0, z_loss=0.0, softcap=None,
             reduction="mean", accum_dtype=None):  # fmt: skip
        # accum_dtype: liger-kernel sums d(weight) in the weight's dtype, as ours does with accum_dtype=that dtype
        loss, *_ = LigerFusedLinearCrossEntropyFunction.apply(hidden, weight, target, bias, None, ignore_index, z_loss,
                                                              label_smoothing, reduction, softcap)  # fmt: skip
        return loss

    # Measured with liger-kernel 0.8.5 on the H200 (benchmarks/flce_speed.py, tritonkit bench --cuda-graph).
    call.fails_graph_capture = "liger-kernel's fused linear cross-entropy fails CUDA-graph capture"
    return call


# Each option alone and all together, reductions, ignored and all-ignored rows, odd vocabularies
# (1, 7, 32001: more than one loop step), one token, leading dimensions. Small for the interpreter.
_CE_TESTS = (
    {"tokens": 5, "vocab": 7},
    {"tokens": 4, "vocab": 1},
    {"tokens": 1, "vocab": 33},
    {"tokens": 3, "vocab": 32001},
    {"tokens": 6, "vocab": 40, "ignored": True},
    {"tokens": 6, "vocab": 40, "ignored": True, "ignore_index": 3},
    {"tokens": 4, "vocab": 40, "all_ignored": True},
    {"tokens": 6, "vocab": 40, "label_smoothing": 0.1},
    {"tokens": 6, "vocab": 40, "z_loss": 1e-2},
    {"tokens": 6, "vocab": 40, "softcap": 5.0},
    {"tokens": 6, "vocab": 40, "ignored": True, "label_smoothing": 0.2, "z_loss": 1e-2, "softcap": 5.0},
    {"tokens": 6, "vocab": 40, "ignored": True, "reduction": "sum"},
    {"tokens": 6, "vocab": 40, "ignored": True, "label_smoothing": 0.1, "softcap": 5.0, "reduction": "none"},
    {"tokens": 6, "vocab": 9, "batched": True, "ignored": True, "reduction": "none"},
    {"tokens": 2, "vocab": 5000, "label_smoothing": 0.1, "z_loss": 1e-3, "softcap": 20.0},
    # class weights, the z-term returned, the token accuracy (Liger-Kernel's options)
    {"tokens": 6, "vocab": 40, "ignored": True, "class_weights": True},
    {"tokens": 6, "vocab": 40, "ignored": True, "class_weights": True, "label_smoothing": 0.2, "z_loss": 1e-2,
     "softcap": 5.0},
    {"tokens": 6, "vocab": 40, "ignored": True, "class_weights": True, "label_smoothing": 0.1, "reduction": "sum"},
    {"tokens": 6, "vocab": 40, "ignored": True, "class_weights": True, "z_loss": 1e-2, "return_z_loss": True,
     "reduction": "none"},
    {"tokens": 6, "vocab": 40, "ignored": True, "z_loss": 1e-2, "return_z_loss": True},
    {"tokens": 8, "vocab": 40, "ignored": True, "accuracy": True},
    {"tokens": 8, "vocab": 9, "batched": True, "ignored": True, "accuracy": True, "return_z_loss": True,
     "z_loss": 1e-3, "reduction": "none"},
    {"tokens": 3, "vocab": 5000, "class_weights": True, "label_smoothing": 0.1, "z_loss": 1e-3, "accuracy": True},
    {"tokens": 4, "vocab": 40, "all_ignored": True, "class_weights": True, "return_z_loss": True, "accuracy": True},
    # the loss returned in fp32 whatever the logits' dtype (an fp32 upstream gradient per row for "none")
    {"tokens": 6, "vocab": 40, "ignored": True, "fp32_loss": True},
    {"tokens": 6, "vocab": 9, "batched": True, "ignored": True, "z_loss": 1e-2, "reduction": "none", "fp32_loss": True},
    {"tokens": 6, "vocab": 40, "ignored": True, "class_weights": True, "z_loss": 1e-2, "return_z_loss": True,
     "reduction": "sum", "fp32_loss": True},
)  # fmt: skip
_CE_GPU = (
    {"tokens": 4096, "vocab": 32000, "ignored": True},
    {"tokens": 1024, "vocab": 262144, "ignored": True, "label_smoothing": 0.1, "z_loss": 1e-4},
    {"tokens": 2048, "vocab": 128256, "softcap": 30.0, "reduction": "none"},
    {"tokens": 8192, "vocab": 128256},
    {"tokens": 7, "vocab": 32001, "all_ignored": True},
    {"tokens": 2048, "vocab": 128256, "ignored": True, "class_weights": True, "label_smoothing": 0.1, "z_loss": 1e-4,
     "return_z_loss": True, "accuracy": True},
    {"tokens": 1024, "vocab": 32000, "class_weights": True, "softcap": 30.0, "reduction": "none", "accuracy": True},
)  # fmt: skip
# inplace_backward has no case here: it refuses the leaf logits the harness times (an LM head's output is not one);
# its time and memory were measured with produced logits (docs/kernels/loss.md).
_CE_BENCH = (
    {"tokens": 8, "vocab": 128256},
    {"tokens": 8192, "vocab": 32000},
    {"tokens": 8192, "vocab": 128256},
)

_FLCE_TESTS = (
    {"tokens": 5, "hidden": 16, "vocab": 7},
    {"tokens": 1, "hidden": 8, "vocab": 1},
    {"tokens": 12, "hidden": 16, "vocab": 33, "bias": True},  # 12 chunks of 1 token
    {"tokens": 25, "hidden": 8, "vocab": 33, "ignored": True},  # 2-token chunks and a remainder
    {"tokens": 6, "hidden": 8, "vocab": 20, "all_ignored": True, "bias": True},
    {"tokens": 10, "hidden": 8, "vocab": 20, "ignored": True, "label_smoothing": 0.2, "z_loss": 1e-2,
     "softcap": 5.0},
    {"tokens": 10, "hidden": 8, "vocab": 20, "ignored": True, "bias": True, "reduction": "sum"},
    {"tokens": 10, "hidden": 8, "vocab": 20, "ignored": True, "bias": True, "label_smoothing": 0.1,
     "reduction": "none"},
    {"tokens": 3, "hidden": 8, "vocab": 32001},
    {"tokens": 10, "hidden": 8, "vocab": 20, "ignored": True, "class_weights": True, "label_smoothing": 0.2,
     "z_loss": 1e-2, "softcap": 5.0},
    {"tokens": 10, "hidden": 8, "vocab": 20, "ignored": True, "bias": True, "class_weights": True,
     "label_smoothing": 0.1, "reduction": "none"},
    {"tokens": 12, "hidden": 32, "vocab": 20, "ignored": True, "accuracy": True, "return_z_loss": True,
     "z_loss": 1e-2},
    {"tokens": 10, "hidden": 32, "vocab": 20, "class_weights": True, "accuracy": True, "reduction": "sum"},
    {"tokens": 10, "hidden": 32, "vocab": 20, "ignored": True, "class_weights": True, "accuracy": True,
     "return_z_loss": True, "z_loss": 1e-2, "reduction": "none"},
    {"tokens": 10, "hidden": 8, "vocab": 20, "ignored": True, "fp32_loss": True},
    {"tokens": 10, "hidden": 8, "vocab": 20, "ignored": True, "bias": True, "reduction": "none", "fp32_loss": True},
    {"tokens": 10, "hidden": 32, "vocab": 20, "ignored": True, "class_weights": True, "return_z_loss": True,
     "z_loss": 1e-2, "reduction": "none", "fp32_loss": True},
    {"tokens": 24, "hidden": 64, "vocab": 300, "ignored": True, "accuracy": True},  # more classes than dimensions
    # d(weight) and d(bias) summed over the chunks in the weight's dtype (fp32 cases: the default's accumulator)
    {"tokens": 25, "hidden": 16, "vocab": 33, "ignored": True, "bias": True, "weight_dtype_accum": True},
    {"tokens": 10, "hidden": 8, "vocab": 20, "ignored": True, "bias": True, "reduction": "none",
     "weight_dtype_accum": True},
    {"tokens": 10, "hidden": 32, "vocab": 20, "ignored": True, "bias": True, "class_weights": True, "z_loss": 1e-2,
     "reduction": "sum", "weight_dtype_accum": True},
)  # fmt: skip
_FLCE_GPU = (
    {"tokens": 4096, "hidden": 2048, "vocab": 32000, "ignored": True},
    {"tokens": 2048, "hidden": 1024, "vocab": 128256, "ignored": True, "bias": True, "reduction": "none"},
    {"tokens": 1000, "hidden": 512, "vocab": 32001, "label_smoothing": 0.1, "z_loss": 1e-4, "softcap": 30.0},
    {"tokens": 4096, "hidden": 2048, "vocab": 32000, "ignored": True, "class_weights": True, "label_smoothing": 0.1,
     "z_loss": 1e-4, "return_z_loss": True, "accuracy": True},
    {"tokens": 1000, "hidden": 512, "vocab": 500, "class_weights": True, "reduction": "none", "accuracy": True},
    # several chunks on a GPU (4096 tokens each with the fp32 accumulator, 2048 with a 16-bit one) and a remainder
    {"tokens": 9000, "hidden": 1024, "vocab": 32000, "ignored": True, "bias": True},
    {"tokens": 9000, "hidden": 1024, "vocab": 32000, "ignored": True, "bias": True, "weight_dtype_accum": True},
    {"tokens": 5000, "hidden": 512, "vocab": 32001, "bias": True, "reduction": "none", "weight_dtype_accum": True},
)  # fmt: skip
_FLCE_BENCH = (
    {"tokens": 8, "hidden": 4096, "vocab": 128256},
    {"tokens": 8192, "hidden": 4096, "vocab": 128256},
    {"tokens": 8192, "hidden": 4096, "vocab": 128256, "weight_dtype_accum": True},
)

register(KernelSpec(
    name="cross_entropy",
    family="loss",
    sweep="vocab",
    case_type=CrossEntropyCase,
    summary="Cross-entropy with ignore_index, label smoothing, z-loss, softcap and class weights; forward and "
            "backward.",
    description="One online-softmax pass per row gives the loss and an fp32 log-sum-exp; the backward reads "
                "the logits once more and writes the gradient already scaled by the upstream gradient, "
                "over the logits themselves with inplace_backward=True (no allocation of their size). "
                "Mean over non-ignored targets counted on the device (no host sync); all-ignored batches give 0. "
                "Class weights as torch's; the z-term on its own and the token accuracy (argmax == target) from the "
                "same pass, as Liger-Kernel's return_z_loss and return_token_accuracy.",
    usage="loss = tk.ops.cross_entropy(logits, labels, ignore_index=-100, label_smoothing=0.1, z_loss=1e-4)",
    tags=("loss", "memory-bound", "backward"),
    limits="Class-last logits (..., V), any V >= 1; int64/int32 targets; class weights take no gradient.",
    fn=_present(cross_entropy),
    covers=(cross_entropy,),
    reference=_cross_entropy_reference,
    make_inputs=_ce_inputs,
    test_cases=_CE_TESTS,
    gpu_cases=_CE_GPU,
    bench_cases=_CE_BENCH,
    bytes_moved=_ce_bytes,
    bytes_moved_bwd=functools.partial(_ce_bytes, backward=True),
    flops=lambda case, dtype: 6 * case.tokens * case.vocab,
    dtypes=FLOAT_DTYPES,
    has_backward=True,
    tolerance=_ce_tolerance,
    peers={"liger": _liger_cross_entropy},
    status="experimental",
))  # fmt: skip

register(KernelSpec(
    name="fused_linear_cross_entropy",
    family="loss",
    sweep="tokens",
    case_type=FusedLinearCrossEntropyCase,
    summary="LM-head matmul fused with cross-entropy, never building the full logits; fp32 or 16-bit weight "
            "gradient accumulation.",
    description="Tokens in chunks large enough to hide the weight gradient's accumulator traffic (4096 on a GPU "
                "with fp32 accumulation, 2048 with 16-bit), their logits capped at 1 GiB: a cuBLAS GEMM makes a "
                "chunk's logits, the cross-entropy kernel overwrites them with their gradient, two more GEMMs add "
                "the chunk's d(hidden) rows and its share of d(weight) (summed in fp32, or in the weight's dtype "
                "with accum_dtype, half the memory). The backward only scales, except for reduction='none', which "
                "recomputes the chunks. Class weights (ce_weight), the z-term and the token accuracy as "
                "cross_entropy's.",
    usage="loss = tk.ops.fused_linear_cross_entropy(hidden, lm_head.weight, labels, z_loss=1e-4)",
    tags=("loss", "fused", "compute-bound", "backward"),
    limits="hidden (..., H), weight (V, H), bias (V,) of one float dtype; int64/int32 targets.",
    fn=_present(fused_linear_cross_entropy),
    covers=(fused_linear_cross_entropy,),
    reference=_fused_linear_cross_entropy_reference,
    make_inputs=_flce_inputs,
    test_cases=_FLCE_TESTS,
    gpu_cases=_FLCE_GPU,
    bench_cases=_FLCE_BENCH,
    bytes_moved=_flce_bytes,
    bytes_moved_bwd=functools.partial(_flce_bytes, backward=True),
    flops=lambda case, dtype: 2 * case.tokens * case.hidden * case.vocab,  # the logits
    flops_bwd=lambda case, dtype: 4 * case.tokens * case.hidden * case.vocab,  # d(hidden), d(weight)
    dtypes=FLOAT_DTYPES,
    has_backward=True,
    tolerance=_flce_tolerance,
    peers={"liger": _liger_fused_linear_cross_entropy},
    status="experimental",
))  # fmt: skip
