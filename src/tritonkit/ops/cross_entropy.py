"""Cross-entropy over a vocabulary, and the fused linear + cross-entropy of a language model's head.

``cross_entropy`` is ``torch.nn.functional.cross_entropy`` on class-last logits with three additions
used in LLM training: ``softcap`` (logits become ``softcap * tanh(logits / softcap)`` first, as in
Gemma 2), ``z_loss`` (``z_loss * lse**2`` per token, lse the row's log-sum-exp, as in PaLM) and an
all-ignored batch giving 0 rather than NaN. One Triton kernel serves every use, with two switches:
``COMPUTE_LOSS`` (one online-softmax pass over the row: lse, the loss terms) and ``WRITE_GRAD`` (one
more pass writing d(loss)/d(logits), scaled per row).

- ``cross_entropy`` reads the logits once in the forward (loss and the fp32 lse, saved) and once in
  the backward, which writes the gradient already multiplied by the upstream gradient: three passes
  over the logits in all, the least a non-destructive op can do. Its only large allocation is the
  gradient itself, and with ``inplace_backward=True`` not even that: the gradient overwrites the logits.
- ``fused_linear_cross_entropy`` never builds the (tokens, vocab) logits. Tokens go through in
  chunks of at most a tenth of them; each chunk's logits come from one GEMM into a reused buffer, the
  kernel overwrites them with their gradient, and two more GEMMs turn that into the chunk's rows of
  d(hidden) and its share of d(weight), summed in fp32 across chunks. For mean and sum reductions this
  all happens in the forward (the upstream gradient is a scalar the backward multiplies in); for
  ``reduction="none"`` the per-token upstream gradient must weight each row before the d(weight)
  GEMM, so the backward recomputes the chunks' logits (one GEMM more).

Nothing here synchronises with the host: the mean divides by ``max(1, count of non-ignored targets)``
computed on the device, so the ops run under torch.compile(fullgraph=True) and in CUDA graphs.
A target outside ``[0, vocab)`` that is not ``ignore_index`` is never used as an address (the load of
its logit is masked): its row's loss and gradient are NaN, which a mean or sum carries to the result.
Checking the range on the host would need a synchronisation.

No ``from __future__ import annotations`` here: torch.library reads the launchers' type hints at runtime.
"""

# ruff: noqa: UP045 - torch.library's schema inference (torch 2.6 and up) is built on typing.Optional

import functools
import math
from typing import Optional

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from tritonkit._core.checks import FLOAT_DTYPES, check_choice, check_device, check_tensor
from tritonkit._core.dispatch import cheapest_path
from tritonkit._core.gemm import addmm_into_fp32
from tritonkit._core.ints import next_power_of_2
from tritonkit._core.layout import as_rows
from tritonkit.ops.softmax import _finite_or_zero
from tritonkit.registry import Inputs, KernelSpec, Tolerance, register
from tritonkit.testing import TOLERANCES

__all__ = ["cross_entropy", "fused_linear_cross_entropy"]

REDUCTIONS = ("mean", "sum", "none")
TARGET_DTYPES = (torch.int64, torch.int32)
MAX_BLOCK_N = 4096  # vocabulary elements per loop step: 16 per thread at 8 warps; not yet tuned on a GPU
CHUNK_ROW_MULTIPLE = 128  # fused chunks: GEMM-tile-friendly row counts once they are this large


@triton.jit
def _softcapped(b_x, softcap, HAS_SOFTCAP: tl.constexpr):
    """softcap * tanh(x / softcap), with tanh(u) = 1 - 2 / (exp(2u) + 1): exact at +-inf (exp
    overflowing to inf gives 1) and within a few fp32 ulp of 1 elsewhere, which is all y needs."""
    if HAS_SOFTCAP:
        b_x = softcap * (1.0 - 2.0 / (tl.exp(2.0 * b_x / softcap) + 1.0))
    return b_x


@triton.jit
def _cross_entropy_kernel(
    p_x, p_target, p_loss, p_lse, p_scale, p_dx,
    n_cols, stride_x_row, stride_target, stride_scale, stride_dx_row,
    ignore_index, label_smoothing, z_loss, softcap,
    COMPUTE_LOSS: tl.constexpr, WRITE_GRAD: tl.constexpr, HAS_SMOOTHING: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """One program per row of x (n_cols logits), target t, smoothing e, z-loss z, softcap c.

    y = c * tanh(x / c) (or x), lse = log(sum_j exp(y_j)), p = exp(y - lse);
    loss = lse - (1 - e) * y_t - (e / n_cols) * sum_j y_j + z * lse^2  (0 where t == ignore_index);
    d(loss)/dy_j = p_j * (1 + 2 z lse) - (1 - e) [j == t] - e / n_cols,  dy/dx = 1 - (y / c)^2.
    COMPUTE_LOSS: one online pass (running max m, sum s of exp(y - m) rescaled when m grows) stores
    loss and lse (fp32); otherwise lse is loaded. WRITE_GRAD: a second pass stores
    scale_row * d(loss)/dx into dx (dx may be x itself: each block is read before it is written).
    A target outside [0, n_cols) other than ignore_index is never dereferenced; its row gets NaN.
    """
    i_row = tl.program_id(0).to(tl.int64)
    p_x_row = p_x + i_row * stride_x_row
    target = tl.load(p_target + i_row * stride_target).to(tl.int64)
    ignored = target == ignore_index
    in_range = (target >= 0) & (target < n_cols)
    if COMPUTE_LOSS:
        m = tl.full((), float("-inf"), tl.float32)
        s = tl.zeros((), tl.float32)
        sum_y = tl.zeros((), tl.float32)
        for start in range(0, n_cols, BLOCK_N):
            o_n = start + tl.arange(0, BLOCK_N)
            m_n = o_n < n_cols
            b_x = tl.load(p_x_row + o_n, mask=m_n, other=0.0).to(tl.float32)
            b_y = tl.where(m_n, _softcapped(b_x, softcap, HAS_SOFTCAP), float("-inf"))  # [BLOCK_N]
            m_new = tl.maximum(m, tl.max(b_y, axis=0))
            m_safe = _finite_or_zero(m_new)
            s = s * tl.exp(m - m_safe) + tl.sum(tl.exp(b_y - m_safe), axis=0)
            m = m_new
            if HAS_SMOOTHING:
                sum_y += tl.sum(tl.where(m_n, b_y, 0.0), axis=0)
        lse = _finite_or_zero(m) + tl.log(s)
        x_t = tl.load(p_x_row + target, mask=in_range & ~ignored, other=0.0).to(tl.float32)
        loss = lse - (1.0 - label_smoothing) * _softcapped(x_t, softcap, HAS_SOFTCAP) + z_loss * lse * lse
        if HAS_SMOOTHING:
            loss -= label_smoothing / n_cols * sum_y
        loss = tl.where(ignored, 0.0, tl.where(in_range, loss, float("nan")))
        tl.store(p_loss + i_row, loss)
        tl.store(p_lse + i_row, lse)
    else:
        lse = tl.load(p_lse + i_row)
    if WRITE_GRAD:
        scale = tl.load(p_scale + i_row * stride_scale).to(tl.float32)
        scale = tl.where(in_range | ignored, scale, float("nan"))
        grad_factor = 1.0 + 2.0 * z_loss * lse
        p_dx_row = p_dx + i_row * stride_dx_row
        for start in range(0, n_cols, BLOCK_N):
            o_n = start + tl.arange(0, BLOCK_N)
            m_n = o_n < n_cols
            b_y = _softcapped(tl.load(p_x_row + o_n, mask=m_n, other=0.0).to(tl.float32), softcap, HAS_SOFTCAP)
            b_dy = tl.exp(b_y - lse) * grad_factor - tl.where(o_n == target, 1.0 - label_smoothing, 0.0)
            if HAS_SMOOTHING:
                b_dy -= label_smoothing / n_cols
            if HAS_SOFTCAP:
                b_dy *= 1.0 - (b_y / softcap) * (b_y / softcap)
            b_dx = tl.where(ignored, 0.0, b_dy * scale)  # [BLOCK_N]
            tl.store(p_dx_row + o_n, b_dx.to(p_dx.dtype.element_ty), mask=m_n)


# --------------------------------------------------------------------------------------------------
# Launchers (tensors in, tensors out)
# --------------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=256)
def cross_entropy_launch_plan(n_cols: int) -> tuple[int, int]:
    """(BLOCK_N, warps): whole short rows in one step, MAX_BLOCK_N-wide steps over long ones."""
    block_n = min(next_power_of_2(n_cols), MAX_BLOCK_N)
    return block_n, 4 if block_n <= 1024 else 8


def _launch_rows(x, target, loss, lse, scale, dx, options, compute_loss, write_grad):
    """Run the kernel over every row of x (rows, V), unit column stride. ``options`` is
    (ignore_index, label_smoothing, z_loss, softcap), softcap 0 for none. Absent tensors may be any
    tensor: the switches keep the kernel from touching them."""
    ignore_index, label_smoothing, z_loss, softcap = options
    n_rows, n_cols = x.shape
    if n_rows == 0:
        return
    block_n, warps = cross_entropy_launch_plan(n_cols)
    _cross_entropy_kernel[(n_rows,)](
        x, target, loss, lse, scale, dx,
        n_cols, x.stride(0), target.stride(0), scale.stride(0) if scale.dim() else 0, dx.stride(0),
        ignore_index, label_smoothing, z_loss, softcap,
        COMPUTE_LOSS=compute_loss, WRITE_GRAD=write_grad, HAS_SMOOTHING=label_smoothing != 0.0,
        HAS_SOFTCAP=softcap != 0.0, BLOCK_N=block_n, num_warps=warps,
    )  # fmt: skip


def _n_valid(target: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """Non-ignored targets, at least 1 (so an all-ignored mean is 0 / 1 = 0), as a 0-d fp32 tensor
    on the device: no synchronisation."""
    return (target != ignore_index).sum().clamp_min(1).to(torch.float32)


def _reduce(loss_rows: torch.Tensor, target: torch.Tensor, ignore_index: int, reduction: str, dtype) -> torch.Tensor:
    """fp32 per-row losses (0 on ignored rows) to the reduction's result in ``dtype``."""
    if reduction == "none":
        return loss_rows.to(dtype)
    total = loss_rows.sum()
    return (total / _n_valid(target, ignore_index) if reduction == "mean" else total).to(dtype)


def _row_scale(grad_loss: torch.Tensor, target: torch.Tensor, ignore_index: int, reduction: str) -> torch.Tensor:
    """What each row's d(loss)/d(logits) is multiplied by: the upstream gradient (per row for "none",
    possibly expanded with stride 0), divided by the count of non-ignored targets for "mean"."""
    if reduction == "none":
        return grad_loss.reshape(-1)
    grad_loss = grad_loss.reshape(())
    return grad_loss.float() / _n_valid(target, ignore_index) if reduction == "mean" else grad_loss


def cross_entropy_fwd_launch(
    logits: torch.Tensor, target: torch.Tensor, ignore_index: int, label_smoothing: float, z_loss: float,
    softcap: float, reduction: str,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """logits: (rows, V) with unit column stride; target: (rows,). Returns the reduced loss (logits'
    dtype; 0-d, or (rows,) for "none") and the fp32 row lse the backward needs."""
    n_rows = logits.shape[0]
    loss_rows = torch.empty((n_rows,), dtype=torch.float32, device=logits.device)
    lse = torch.empty((n_rows,), dtype=torch.float32, device=logits.device)
    options = (ignore_index, label_smoothing, z_loss, softcap)
    _launch_rows(logits, target, loss_rows, lse, lse, logits, options, compute_loss=True, write_grad=False)
    return _reduce(loss_rows, target, ignore_index, reduction, logits.dtype), lse


def cross_entropy_bwd_launch(grad_loss: torch.Tensor, logits: torch.Tensor, target: torch.Tensor, lse: torch.Tensor,
                             ignore_index: int, label_smoothing: float, z_loss: float, softcap: float,
                             reduction: str, *, in_place: bool = False) -> torch.Tensor:  # fmt: skip
    """d(loss)/d(logits), (rows, V) in logits' dtype, already multiplied by ``grad_loss``; written over
    ``logits`` itself when ``in_place`` (the kernel reads each block before writing it)."""
    dx = logits if in_place else torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
    scale = _row_scale(grad_loss, target, ignore_index, reduction)
    options = (ignore_index, label_smoothing, z_loss, softcap)
    _launch_rows(logits, target, lse, lse, scale, dx, options, compute_loss=False, write_grad=True)
    return dx


def fused_chunk_rows(n_tokens: int) -> int:
    """Tokens per chunk of the fused op: a tenth of them, so a chunk's logits are at most 10% of the
    full logits; a multiple of CHUNK_ROW_MULTIPLE once that large (GEMM tiles), at least 1."""
    rows = max(1, n_tokens // 10)
    return rows - rows % CHUNK_ROW_MULTIPLE if rows >= CHUNK_ROW_MULTIPLE else rows


def _fused_chunks(hidden, weight, bias, target, options, loss_rows, lse, scale, grad_hidden, grad_weight,
                  grad_bias):  # fmt: skip
    """The chunk loop of the fused op. With ``loss_rows`` the kernel computes loss and lse (forward),
    without it it reads lse (the recomputing backward of "none"). With a ``scale`` it writes each
    chunk's logit gradient over its logits and adds the chunk's share to whichever of grad_hidden
    (hidden's dtype), grad_weight and grad_bias (fp32 accumulators, zeroed) are given."""
    n_tokens = hidden.shape[0]
    chunk = fused_chunk_rows(n_tokens)
    buffer = torch.empty((min(chunk, n_tokens), weight.shape[0]), dtype=hidden.dtype, device=hidden.device)
    write_grad = scale is not None
    for start in range(0, n_tokens, chunk):
        end = min(start + chunk, n_tokens)
        rows = slice(start, end)
        h_chunk, logits = hidden[rows], buffer[: end - start]
        if bias is None:
            torch.mm(h_chunk, weight.t(), out=logits)
        else:
            torch.addmm(bias, h_chunk, weight.t(), out=logits)
        row_scale = scale[rows] if write_grad and scale.dim() else scale
        _launch_rows(
            logits, target[rows], loss_rows[rows] if loss_rows is not None else lse[rows], lse[rows],
            row_scale if write_grad else lse, logits, options, compute_loss=loss_rows is not None,
            write_grad=write_grad,
        )  # fmt: skip
        if grad_hidden is not None:
            torch.mm(logits, weight, out=grad_hidden[rows])
        if grad_weight is not None:
            addmm_into_fp32(grad_weight, logits.t(), h_chunk)
        if grad_bias is not None:
            grad_bias.add_(logits.sum(0, dtype=torch.float32))


def _grad_buffers(hidden, weight, bias, need_hidden, need_weight, need_bias):
    """grad_hidden (hidden's dtype: each row is one full GEMM, rounded once) and fp32 accumulators for
    grad_weight and grad_bias, or None where not needed."""
    grad_hidden = torch.empty_like(hidden) if need_hidden else None
    grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_weight else None
    grad_bias = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) if need_bias else None
    return grad_hidden, grad_weight, grad_bias


def _or_empty(t: Optional[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    """Custom ops cannot return None: an absent output is an empty tensor."""
    return t if t is not None else like.new_empty((0,))


def fused_linear_cross_entropy_fwd_launch(
    hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, bias: Optional[torch.Tensor],
    ignore_index: int, label_smoothing: float, z_loss: float, softcap: float, reduction: str,
    need_hidden: bool, need_weight: bool, need_bias: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """hidden: (tokens, H); weight: (V, H); bias: (V,) or None; target: (tokens,).

    Returns (loss, lse, grad_hidden, grad_weight, grad_bias). For "mean" and "sum" the gradients asked
    for by the need_* flags are computed here, for an upstream gradient of 1 (grad_weight and
    grad_bias in fp32); absent ones, and all of them for "none", are empty tensors.
    """
    n_tokens = hidden.shape[0]
    loss_rows = torch.empty((n_tokens,), dtype=torch.float32, device=hidden.device)
    lse = torch.empty((n_tokens,), dtype=torch.float32, device=hidden.device)
    now = reduction != "none" and (need_hidden or need_weight or need_bias)
    grads = _grad_buffers(hidden, weight, bias, need_hidden and now, need_weight and now, need_bias and now)
    scale = None
    if now:
        ones = torch.ones((), dtype=torch.float32, device=hidden.device)
        scale = _row_scale(ones, target, ignore_index, reduction)
    options = (ignore_index, label_smoothing, z_loss, softcap)
    _fused_chunks(hidden, weight, bias, target, options, loss_rows, lse, scale, *grads)
    loss = _reduce(loss_rows, target, ignore_index, reduction, hidden.dtype)
    return loss, lse, *(_or_empty(g, lse) for g in grads)


def fused_linear_cross_entropy_bwd_launch(
    grad_loss: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
    bias: Optional[torch.Tensor], lse: torch.Tensor, ignore_index: int, label_smoothing: float, z_loss: float,
    softcap: float, need_hidden: bool, need_weight: bool, need_bias: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """The backward of reduction="none": recompute each chunk's logits, write their gradient weighted
    by the per-token ``grad_loss``, and project it. Returns grad_hidden, grad_weight, grad_bias (the
    last two fp32; absent ones empty)."""
    grads = _grad_buffers(hidden, weight, bias, need_hidden, need_weight, need_bias)
    options = (ignore_index, label_smoothing, z_loss, softcap)
    _fused_chunks(hidden, weight, bias, target, options, None, lse, grad_loss.reshape(-1), *grads)
    return tuple(_or_empty(g, lse) for g in grads)


# --------------------------------------------------------------------------------------------------
# Autograd, shared by the eager path (an autograd.Function) and the compiled path (a torch custom op);
# _core.dispatch.cheapest_path picks one per call
# --------------------------------------------------------------------------------------------------
def _save_ce(ctx, logits, target, lse, options):
    ctx.save_for_backward(logits, target, lse)
    ctx.options = options


def _ce_grad(ctx, grad_loss, backward_launch):
    logits, target, lse = ctx.saved_tensors
    return backward_launch(grad_loss, logits, target, lse, *ctx.options)


class _CrossEntropyFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target, ignore_index, label_smoothing, z_loss, softcap, reduction):
        loss, lse = cross_entropy_fwd_launch(logits, target, ignore_index, label_smoothing, z_loss, softcap, reduction)
        _save_ce(ctx, logits, target, lse, (ignore_index, label_smoothing, z_loss, softcap, reduction))
        ctx.mark_non_differentiable(lse)
        ctx.set_materialize_grads(False)  # no zero gradient for lse (see softmax's Function)
        return loss, lse

    @staticmethod
    def backward(ctx, grad_loss, grad_lse):
        return _ce_grad(ctx, grad_loss, cross_entropy_bwd_launch), None, None, None, None, None, None


class _CrossEntropyInPlaceFunction(_CrossEntropyFunction):
    """The eager path of ``inplace_backward=True``: the backward overwrites the saved logits with their
    gradient and returns that memory as the gradient, so the op allocates nothing of the logits' size.

    The version bump makes the overwrite safe: any other node that saved these logits for its own
    backward (or a second backward through this one) finds them modified and autograd raises, instead
    of silently reading gradients as logits.
    """

    @staticmethod
    def backward(ctx, grad_loss, grad_lse):
        grad = _ce_grad(ctx, grad_loss, functools.partial(cross_entropy_bwd_launch, in_place=True))
        torch.autograd.graph.increment_version(grad)  # grad is the saved logits, overwritten
        return grad, None, None, None, None, None, None


@torch.library.custom_op("tritonkit::cross_entropy_fwd", mutates_args=())
def cross_entropy_fwd(logits: torch.Tensor, target: torch.Tensor, ignore_index: int, label_smoothing: float,
                      z_loss: float, softcap: float, reduction: str) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    return cross_entropy_fwd_launch(logits, target, ignore_index, label_smoothing, z_loss, softcap, reduction)


@cross_entropy_fwd.register_fake
def _(logits, target, ignore_index, label_smoothing, z_loss, softcap, reduction):
    n_rows = logits.shape[0]
    loss_shape = (n_rows,) if reduction == "none" else ()
    return logits.new_empty(loss_shape), logits.new_empty((n_rows,), dtype=torch.float32)


@torch.library.custom_op("tritonkit::cross_entropy_bwd", mutates_args=())
def cross_entropy_bwd(grad_loss: torch.Tensor, logits: torch.Tensor, target: torch.Tensor, lse: torch.Tensor,
                      ignore_index: int, label_smoothing: float, z_loss: float, softcap: float,
                      reduction: str) -> torch.Tensor:  # fmt: skip
    return cross_entropy_bwd_launch(grad_loss, logits, target, lse, ignore_index, label_smoothing, z_loss, softcap,
                                    reduction)  # fmt: skip


@cross_entropy_bwd.register_fake
def _(grad_loss, logits, target, lse, ignore_index, label_smoothing, z_loss, softcap, reduction):
    return torch.empty_like(logits)


def _ce_setup_context(ctx, inputs, output):
    logits, target, *options = inputs
    _save_ce(ctx, logits, target, output[1], tuple(options))


def _ce_custom_op_backward(ctx, grad_loss, grad_lse):
    return _ce_grad(ctx, grad_loss, cross_entropy_bwd), None, None, None, None, None, None


cross_entropy_fwd.register_autograd(_ce_custom_op_backward, setup_context=_ce_setup_context)


_SCALE_CHUNK = 1 << 24  # elements per piece of _scaled: a 64 MB fp32 temporary at most


def _scaled(grad: torch.Tensor, grad_loss: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """grad * grad_loss (a 0-d upstream gradient) in ``dtype``, one rounding, without mutating grad.

    In pieces: torch's mul into an output of another dtype first computes into a temporary of the
    input's dtype (torch's profiler shows a full fp32 copy), which for a whole fp32 dW would add
    2.1 GB at 128256 x 4096.
    """
    out = torch.empty(grad.shape, dtype=dtype, device=grad.device)
    factor = grad_loss.reshape(()).float()
    flat_grad, flat_out = grad.reshape(-1), out.view(-1)
    for start in range(0, flat_grad.numel(), _SCALE_CHUNK):
        piece = slice(start, start + _SCALE_CHUNK)
        torch.mul(flat_grad[piece], factor, out=flat_out[piece])
    return out


def _save_flce(ctx, hidden, weight, target, bias, lse, grads, options, needs):
    """mean/sum keep the forward's gradients; "none" keeps what the recomputing backward reads."""
    ctx.options, ctx.needs = options, needs
    ctx.dtypes = (hidden.dtype, weight.dtype, bias.dtype if bias is not None else None)
    ctx.recompute = options[-1] == "none"
    ctx.has_bias = bias is not None
    if ctx.recompute:
        ctx.save_for_backward(hidden, weight, target, bias, lse)
    else:
        ctx.save_for_backward(*grads)


def _flce_grads(ctx, grad_loss, backward_launch):
    """(grad_hidden, grad_weight, grad_bias), None where not needed."""
    if ctx.recompute:
        hidden, weight, target, bias, lse = ctx.saved_tensors
        grads = backward_launch(grad_loss, hidden, weight, target, bias, lse, *ctx.options[:-1], *ctx.needs)
        return tuple(g.to(dtype) if need else None for g, dtype, need in zip(grads, ctx.dtypes, ctx.needs, strict=True))
    return tuple(
        _scaled(g, grad_loss, dtype) if need else None
        for g, dtype, need in zip(ctx.saved_tensors, ctx.dtypes, ctx.needs, strict=True)
    )


class _FusedLinearCrossEntropyFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, target, bias, ignore_index, label_smoothing, z_loss, softcap, reduction,
                need_hidden, need_weight, need_bias):  # fmt: skip
        options = (ignore_index, label_smoothing, z_loss, softcap, reduction)
        needs = (need_hidden, need_weight, need_bias)
        loss, lse, *grads = fused_linear_cross_entropy_fwd_launch(hidden, weight, target, bias, *options, *needs)
        _save_flce(ctx, hidden, weight, target, bias, lse, grads, options, needs)
        ctx.mark_non_differentiable(lse, *grads)
        # The gradients are outputs only so that the custom op can save them; left to its default,
        # autograd would hand backward a zero tensor for each, 2.1 GB for a 128256 x 4096 fp32 dW
        # (H200: backward peak 5.2 GB against 3.2 GB held and made).
        ctx.set_materialize_grads(False)
        return loss, lse, *grads

    @staticmethod
    def backward(ctx, grad_loss, *unused):
        if grad_loss is None:  # only lse or the gradients were used downstream: nothing flows back
            return (None,) * 12
        grad_hidden, grad_weight, grad_bias = _flce_grads(ctx, grad_loss, fused_linear_cross_entropy_bwd_launch)
        return grad_hidden, grad_weight, None, grad_bias, *([None] * 8)


@torch.library.custom_op("tritonkit::fused_linear_cross_entropy_fwd", mutates_args=())
def fused_linear_cross_entropy_fwd(
    hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, bias: Optional[torch.Tensor],
    ignore_index: int, label_smoothing: float, z_loss: float, softcap: float, reduction: str,
    need_hidden: bool, need_weight: bool, need_bias: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    return fused_linear_cross_entropy_fwd_launch(hidden, weight, target, bias, ignore_index, label_smoothing, z_loss,
                                                 softcap, reduction, need_hidden, need_weight, need_bias)  # fmt: skip


@fused_linear_cross_entropy_fwd.register_fake
def _(hidden, weight, target, bias, ignore_index, label_smoothing, z_loss, softcap, reduction, need_hidden,
      need_weight, need_bias):  # fmt: skip
    n_tokens = hidden.shape[0]
    now = reduction != "none"
    return (
        hidden.new_empty((n_tokens,) if reduction == "none" else ()),
        hidden.new_empty((n_tokens,), dtype=torch.float32),
        *_fake_grads(hidden, weight, bias, need_hidden and now, need_weight and now, need_bias and now),
    )


def _fake_grads(hidden, weight, bias, need_hidden, need_weight, need_bias):
    """Shapes and dtypes of _grad_buffers' results as the custom ops return them (absent: empty fp32)."""
    fp32 = torch.float32
    return (
        hidden.new_empty(hidden.shape) if need_hidden else hidden.new_empty((0,), dtype=fp32),
        hidden.new_empty(weight.shape if need_weight else (0,), dtype=fp32),
        hidden.new_empty(bias.shape if need_bias else (0,), dtype=fp32),
    )


@torch.library.custom_op("tritonkit::fused_linear_cross_entropy_bwd", mutates_args=())
def fused_linear_cross_entropy_bwd(
    grad_loss: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
    bias: Optional[torch.Tensor], lse: torch.Tensor, ignore_index: int, label_smoothing: float, z_loss: float,
    softcap: float, need_hidden: bool, need_weight: bool, need_bias: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    return fused_linear_cross_entropy_bwd_launch(grad_loss, hidden, weight, target, bias, lse, ignore_index,
                                                 label_smoothing, z_loss, softcap, need_hidden, need_weight,
                                                 need_bias)  # fmt: skip


@fused_linear_cross_entropy_bwd.register_fake
def _(grad_loss, hidden, weight, target, bias, lse, ignore_index, label_smoothing, z_loss, softcap, need_hidden,
      need_weight, need_bias):  # fmt: skip
    return _fake_grads(hidden, weight, bias, need_hidden, need_weight, need_bias)


def _flce_setup_context(ctx, inputs, output):
    hidden, weight, target, bias, *rest = inputs
    options, needs = tuple(rest[:5]), tuple(rest[5:])
    _save_flce(ctx, hidden, weight, target, bias, output[1], output[2:], options, needs)


def _flce_custom_op_backward(ctx, grad_loss, *unused):
    grad_hidden, grad_weight, grad_bias = _flce_grads(ctx, grad_loss, fused_linear_cross_entropy_bwd)
    return grad_hidden, grad_weight, None, grad_bias, *([None] * 8)


fused_linear_cross_entropy_fwd.register_autograd(_flce_custom_op_backward, setup_context=_flce_setup_context)


# --------------------------------------------------------------------------------------------------
# Public functions
# --------------------------------------------------------------------------------------------------
def _check_options(name, ignore_index, label_smoothing, z_loss, softcap, reduction) -> tuple:
    """Validated options as the kernels take them (softcap None -> 0.0)."""
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        raise TypeError(f"{name}: ignore_index must be an int, got {type(ignore_index).__name__}")
    if not isinstance(label_smoothing, (int, float)) or not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"{name}: label_smoothing must be a number in [0, 1], got {label_smoothing!r}")
    if not isinstance(z_loss, (int, float)) or not math.isfinite(z_loss) or z_loss < 0:
        raise ValueError(f"{name}: z_loss must be a finite number >= 0, got {z_loss!r}")
    if softcap is not None and (not isinstance(softcap, (int, float)) or not math.isfinite(softcap) or softcap <= 0):
        raise ValueError(f"{name}: softcap must be None or a finite number > 0, got {softcap!r}")
    check_choice("reduction", reduction, REDUCTIONS)
    return int(ignore_index), float(label_smoothing), float(z_loss), float(softcap or 0.0), reduction


def _check_target(name: str, target, expected_shape: tuple) -> None:
    check_tensor("target", target, dtypes=TARGET_DTYPES)
    if tuple(target.shape) != expected_shape:
        raise ValueError(f"{name}: target must have shape {expected_shape}, got {tuple(target.shape)}")


def _needs_grad(t: Optional[torch.Tensor]) -> bool:
    return t is not None and torch.is_grad_enabled() and t.requires_grad


def cross_entropy(
    logits: torch.Tensor, target: torch.Tensor, *, ignore_index: int = -100, label_smoothing: float = 0.0,
    z_loss: float = 0.0, softcap: Optional[float] = None, reduction: str = "mean", inplace_backward: bool = False,
) -> torch.Tensor:  # fmt: skip
    """Cross-entropy of class-last ``logits`` (..., V) against integer ``target`` (...).

    ``torch.nn.functional.cross_entropy(y, target, ignore_index=..., label_smoothing=...,
    reduction=...) + z_loss * logsumexp(y)**2`` (the z-term reduced like the loss), with
    ``y = softcap * tanh(logits / softcap)`` when ``softcap`` is given, else ``y = logits``. "mean"
    divides by the number of non-ignored targets; an all-ignored batch gives 0 loss and 0 gradient
    (torch gives NaN). Returns a 0-d tensor ("mean", "sum") or target's shape ("none"), in logits'
    dtype. logits fp32/fp16/bf16, any vocabulary size; target int64/int32. A target outside [0, V)
    other than ``ignore_index`` makes its row's loss and gradient NaN (no host-side check: that would
    synchronise). Differentiable in logits; the backward allocates only the gradient.

    ``inplace_backward=True`` (eager mode) makes the backward write the gradient over the logits'
    memory and return it, allocating nothing of their size: for logits that a layer produced and that
    nothing reads after the loss (an LM head's output). Autograd raises if another op saved those
    logits for its backward and runs after this one. Under torch.compile the flag is ignored and the
    compiler plans the gradient's memory.

    Example: ``loss = tk.ops.cross_entropy(logits.view(-1, V), labels.view(-1), z_loss=1e-4)``.
    """
    options = _check_options("cross_entropy", ignore_index, label_smoothing, z_loss, softcap, reduction)
    if not isinstance(inplace_backward, bool):
        raise TypeError(f"cross_entropy: inplace_backward must be a bool, got {type(inplace_backward).__name__}")
    check_tensor("logits", logits, dtypes=FLOAT_DTYPES)
    if logits.dim() == 0 or logits.shape[-1] == 0:
        raise ValueError(f"cross_entropy: logits must be (..., V) with V >= 1 classes, got shape {tuple(logits.shape)}")
    _check_target("cross_entropy", target, tuple(logits.shape[:-1]))
    check_device(logits=logits, target=target)
    rows, target_rows = as_rows(logits), target.reshape(-1)
    function = _CrossEntropyInPlaceFunction if inplace_backward else _CrossEntropyFunction
    call = cheapest_path(cross_entropy_fwd, function, cross_entropy_fwd_launch, (rows,))
    loss, _ = call(rows, target_rows, *options)
    return loss.view(target.shape) if reduction == "none" else loss


def fused_linear_cross_entropy(
    hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, bias: Optional[torch.Tensor] = None, *,
    ignore_index: int = -100, label_smoothing: float = 0.0, z_loss: float = 0.0, softcap: Optional[float] = None,
    reduction: str = "mean",
) -> torch.Tensor:  # fmt: skip
    """``cross_entropy(hidden @ weight.T + bias, target, ...)`` without building the logits.

    hidden: (..., H); weight: (V, H) (the LM head's weight, passed at call time so that a gathered
    FSDP weight, a tied embedding or any view works); bias: (V,) or None; target: hidden's leading
    shape. hidden, weight and bias share one float dtype. Options and result as :func:`cross_entropy`
    (the loss in hidden's dtype). Tokens are processed in chunks of at most a tenth of them, so the
    transient logits stay within 10% of the full (tokens, V) logits; d(weight) and d(bias) are summed
    over chunks in fp32 and cast once. The GEMMs are torch's (cuBLAS on CUDA).

    Example: ``loss = tk.ops.fused_linear_cross_entropy(h.view(-1, H), lm_head.weight, labels.view(-1))``.
    """
    name = "fused_linear_cross_entropy"
    options = _check_options(name, ignore_index, label_smoothing, z_loss, softcap, reduction)
    check_tensor("hidden", hidden, dtypes=FLOAT_DTYPES)
    check_tensor("weight", weight, ndim=2, dtypes=FLOAT_DTYPES)
    if hidden.dim() == 0 or hidden.shape[-1] != weight.shape[1]:
        raise ValueError(f"{name}: hidden must be (..., H) with H = weight.shape[1] = {weight.shape[1]}, "
                         f"got shape {tuple(hidden.shape)}")  # fmt: skip
    if weight.shape[0] == 0:
        raise ValueError(f"{name}: weight must have at least one row (class), got shape {tuple(weight.shape)}")
    if bias is not None:
        check_tensor("bias", bias, ndim=1, dtypes=FLOAT_DTYPES)
        if bias.shape[0] != weight.shape[0]:
            raise ValueError(f"{name}: bias must have shape ({weight.shape[0]},), got {tuple(bias.shape)}")
    for other, value in (("weight", weight), ("bias", bias)):
        if value is not None and value.dtype != hidden.dtype:
            raise TypeError(f"{name}: {other} must have hidden's dtype {hidden.dtype}, got {value.dtype}")
    _check_target(name, target, tuple(hidden.shape[:-1]))
    check_device(hidden=hidden, weight=weight, target=target, **({"bias": bias} if bias is not None else {}))
    rows, target_rows = hidden.reshape(-1, hidden.shape[-1]), target.reshape(-1)
    needs = (_needs_grad(hidden), _needs_grad(weight), _needs_grad(bias))
    call = cheapest_path(
        fused_linear_cross_entropy_fwd, _FusedLinearCrossEntropyFunction, fused_linear_cross_entropy_fwd_launch,
        (hidden, weight, bias),
    )  # fmt: skip
    loss = call(rows, weight, target_rows, bias, *options, *needs)[0]
    return loss.view(target.shape) if reduction == "none" else loss


# --------------------------------------------------------------------------------------------------
# References (float64) and registry specs
# --------------------------------------------------------------------------------------------------
def _cross_entropy_reference(logits, target, *, ignore_index=-100, label_smoothing=0.0, z_loss=0.0, softcap=None,
                             reduction="mean", inplace_backward=False):  # fmt: skip
    """torch's cross_entropy per row on the softcapped logits, plus z_loss * lse^2, reduced over the
    non-ignored rows (an all-ignored mean is 0, where torch gives 0/0). ``inplace_backward`` changes
    only where the op's gradient lives, so the reference takes it and stays out of place."""
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    rows, flat_target = logits.reshape(-1, logits.shape[-1]), target.reshape(-1)
    valid = flat_target != ignore_index
    loss = F.cross_entropy(rows, flat_target, ignore_index=ignore_index, label_smoothing=label_smoothing,
                           reduction="none")  # fmt: skip
    loss = loss + torch.where(valid, z_loss * torch.logsumexp(rows, -1) ** 2, 0.0)
    if reduction == "none":
        return loss.view(target.shape)
    return loss.sum() / valid.sum().clamp_min(1) if reduction == "mean" else loss.sum()


def _fused_linear_cross_entropy_reference(hidden, weight, target, bias=None, **options):
    logits = hidden @ weight.t()
    return _cross_entropy_reference(logits + bias if bias is not None else logits, target, **options)


_OPTION_KEYS = ("ignore_index", "label_smoothing", "z_loss", "softcap", "reduction")


def _randn(shape, device, generator, scale=1.0):
    return scale * torch.randn(shape, device=device, generator=generator, dtype=torch.float32)


def _targets(case, device, generator, vocab):
    """Random classes; every third token ignored with ``ignored``, all of them with ``all_ignored``."""
    tokens = case["tokens"]
    target = torch.randint(0, vocab, (tokens,), device=device, generator=generator)
    ignore_index = case.get("ignore_index", -100)
    if case.get("ignored"):
        target[::3] = ignore_index
    if case.get("all_ignored"):
        target[:] = ignore_index
    return target


def _options(case):
    return {key: case[key] for key in _OPTION_KEYS if key in case}


def _ce_inputs(case, device, dtype, generator):
    """Logits of scale 3 (peaked rows: the softmax term of the gradient matters), optionally shaped
    (2, tokens / 2, V) to test leading dimensions."""
    tokens, vocab = case["tokens"], case["vocab"]
    logits = _randn((tokens, vocab), device, generator, case.get("scale", 3.0)).to(dtype)
    target = _targets(case, device, generator, vocab)
    if case.get("batched"):
        logits, target = logits.view(2, tokens // 2, vocab), target.view(2, tokens // 2)
    options = _options(case)
    if case.get("inplace_backward"):
        options["inplace_backward"] = True
    return Inputs((logits, target), options)


def _flce_inputs(case, device, dtype, generator):
    """hidden of unit scale, weight scaled by 2 / sqrt(H) so that logits have scale ~2."""
    tokens, hidden_size, vocab = case["tokens"], case["hidden"], case["vocab"]
    hidden = _randn((tokens, hidden_size), device, generator).to(dtype)
    weight = _randn((vocab, hidden_size), device, generator, 2.0 / math.sqrt(hidden_size)).to(dtype)
    bias = _randn((vocab,), device, generator, 0.5).to(dtype) if case.get("bias") else None
    target = _targets(case, device, generator, vocab)
    return Inputs((hidden, weight, target), {"bias": bias, **_options(case)} if bias is not None else _options(case))


def _ce_bytes(case, dtype, backward=False):
    """Forward: the logits read once. Backward: read again, gradient written."""
    return (2 if backward else 1) * case["tokens"] * case["vocab"] * dtype.itemsize


def _flce_bytes(case, dtype, backward=False):
    """hidden and weight read, and (the gradients being made in the forward) d(hidden) and d(weight)
    written; the backward only scales them: read and write once more."""
    elements = (case["tokens"] + case["vocab"]) * case["hidden"]
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
    size of a dropped term (the softmax term alone is ~1/tokens)."""
    if dtype == torch.float32:
        return Tolerance(atol=max(1e-6, 8 * 2**-24 * math.sqrt(case["vocab"])), rtol=1e-5)
    summed = case.get("reduction", "mean") != "mean"
    atol = (2.5e-2 if dtype == torch.bfloat16 else 4e-3) * (4 if summed else 1)
    return Tolerance(atol=atol, rtol=2 * TOLERANCES[dtype].rtol)


def _liger_cross_entropy():
    from liger_kernel.ops.cross_entropy import LigerCrossEntropyFunction

    def call(logits, target, *, ignore_index=-100, label_smoothing=0.0, z_loss=0.0, softcap=None, reduction="mean",
             inplace_backward=True):  # fmt: skip
        # liger-kernel always writes the gradient over the logits (its forward does, in fact)
        rows, targets = logits.view(-1, logits.shape[-1]), target.view(-1)
        options = (ignore_index, z_loss, label_smoothing, reduction, softcap)  # liger's positional order
        loss, *_ = LigerCrossEntropyFunction.apply(rows, targets, None, *options)
        return loss

    return call


def _liger_fused_linear_cross_entropy():
    from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction

    def call(hidden, weight, target, bias=None, *, ignore_index=-100, label_smoothing=0.0, z_loss=0.0, softcap=None,
             reduction="mean"):  # fmt: skip
        loss, *_ = LigerFusedLinearCrossEntropyFunction.apply(hidden, weight, target, bias, None, ignore_index, z_loss,
                                                              label_smoothing, reduction, softcap)  # fmt: skip
        return loss

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
)
_CE_GPU = (
    {"tokens": 4096, "vocab": 32000, "ignored": True},
    {"tokens": 1024, "vocab": 262144, "ignored": True, "label_smoothing": 0.1, "z_loss": 1e-4},
    {"tokens": 2048, "vocab": 128256, "softcap": 30.0, "reduction": "none"},
    {"tokens": 8192, "vocab": 128256},
    {"tokens": 7, "vocab": 32001, "all_ignored": True},
)
# The last case is the memory comparison with liger-kernel, which always overwrites the logits.
_CE_BENCH = (
    {"tokens": 8, "vocab": 128256},
    {"tokens": 8192, "vocab": 32000},
    {"tokens": 8192, "vocab": 128256},
    {"tokens": 8192, "vocab": 128256, "inplace_backward": True},
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
)  # fmt: skip
_FLCE_GPU = (
    {"tokens": 4096, "hidden": 2048, "vocab": 32000, "ignored": True},
    {"tokens": 2048, "hidden": 1024, "vocab": 128256, "ignored": True, "bias": True, "reduction": "none"},
    {"tokens": 1000, "hidden": 512, "vocab": 32001, "label_smoothing": 0.1, "z_loss": 1e-4, "softcap": 30.0},
)
_FLCE_BENCH = (
    {"tokens": 8, "hidden": 4096, "vocab": 128256},
    {"tokens": 8192, "hidden": 4096, "vocab": 128256},
)

register(KernelSpec(
    name="cross_entropy",
    family="loss",
    summary="Cross-entropy with ignore_index, label smoothing, z-loss and softcap; forward and backward.",
    description="One online-softmax pass per row gives the loss and an fp32 log-sum-exp; the backward reads "
                "the logits once more and writes the gradient already scaled by the upstream gradient, "
                "over the logits themselves with inplace_backward=True (no allocation of their size). "
                "Mean over non-ignored targets counted on the device (no host sync); all-ignored batches give 0.",
    usage="loss = tk.ops.cross_entropy(logits, labels, ignore_index=-100, label_smoothing=0.1, z_loss=1e-4)",
    tags=("loss", "memory-bound", "backward"),
    limits="Class-last logits (..., V), any V >= 1; int64/int32 targets; no per-class weights.",
    fn=cross_entropy,
    reference=_cross_entropy_reference,
    make_inputs=_ce_inputs,
    test_cases=_CE_TESTS,
    gpu_cases=_CE_GPU,
    bench_cases=_CE_BENCH,
    bytes_moved=_ce_bytes,
    bytes_moved_bwd=functools.partial(_ce_bytes, backward=True),
    flops=lambda case, dtype: 6 * case["tokens"] * case["vocab"],
    dtypes=FLOAT_DTYPES,
    has_backward=True,
    tolerance=_ce_tolerance,
    peers={"liger": _liger_cross_entropy},
    status="experimental",
))  # fmt: skip

register(KernelSpec(
    name="fused_linear_cross_entropy",
    family="loss",
    summary="LM-head matmul fused with cross-entropy, never building the full logits; fp32 weight gradient.",
    description="Tokens in chunks of at most 10% of them: a cuBLAS GEMM makes a chunk's logits, the "
                "cross-entropy kernel overwrites them with their gradient, two more GEMMs add the chunk's "
                "d(hidden) rows and its share of d(weight) (summed in fp32). The backward only scales, "
                "except for reduction='none', which recomputes the chunks.",
    usage="loss = tk.ops.fused_linear_cross_entropy(hidden, lm_head.weight, labels, z_loss=1e-4)",
    tags=("loss", "fused", "compute-bound", "backward"),
    limits="hidden (..., H), weight (V, H), bias (V,) of one float dtype; int64/int32 targets.",
    fn=fused_linear_cross_entropy,
    reference=_fused_linear_cross_entropy_reference,
    make_inputs=_flce_inputs,
    test_cases=_FLCE_TESTS,
    gpu_cases=_FLCE_GPU,
    bench_cases=_FLCE_BENCH,
    bytes_moved=_flce_bytes,
    bytes_moved_bwd=functools.partial(_flce_bytes, backward=True),
    flops=lambda case, dtype: 2 * case["tokens"] * case["hidden"] * case["vocab"],  # the logits
    flops_bwd=lambda case, dtype: 4 * case["tokens"] * case["hidden"] * case["vocab"],  # d(hidden), d(weight)
    dtypes=FLOAT_DTYPES,
    has_backward=True,
    tolerance=_flce_tolerance,
    peers={"liger": _liger_fused_linear_cross_entropy},
    status="experimental",
))  # fmt: skip
