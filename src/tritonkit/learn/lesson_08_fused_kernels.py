"""Unsloth-style fused kernels: residual add + RMSNorm, and the chunked cross-entropy, with the memory each saves.

Training memory is mostly activations: what the forward keeps for the backward, and the transient tensors
each step makes. Eager PyTorch runs one kernel per operator, and every operator's output is a full tensor
in memory, kept by autograd if its backward needs it. A fused kernel keeps those intermediates in
registers. The lesson counts the bytes on both sides, on one step of forward and backward.

(a) Residual add + RMSNorm. A pre-norm transformer block starts with

        h = x + residual,   y = h / sqrt(mean(h^2) + eps) * w

    and passes h on as the next residual. In eager torch that is five operators: the add (h), the square
    (h^2), the mean, the rsqrt, and two multiplies (h * rstd, then * w), each writing a (T, N) tensor except
    the mean and rsqrt. Autograd keeps h, h * rstd and rstd for the backward. The fused kernel reads x and
    the residual once and writes y and h; the backward needs only h, w and rstd (one float per row),
    recomputing h * rstd from them. The kernel below is the forward: one program per row, h and its square
    sum in registers.

(b) Chunked cross-entropy. An LM head turns T hidden states of size H into logits over a vocabulary of V
    tokens: (T, V), which for T = 8192 and V = 128256 in bf16 is 2 GiB, before log_softmax (another T x V,
    float32 in torch's autocast) and its gradient (another T x V) in the backward. The chunked version
    never holds more than a chunk of logits: for each chunk of tokens it computes the logits with a
    matrix multiply, then one kernel per row computes the loss and, in the same pass, the gradient of
    the loss with respect to the logits,

        lse = log sum_j exp(z_j),   loss = lse - z_t,   dz_j = (softmax(z)_j - [j = t]) / T,

    written over the logits (the logits are not needed again), and two more multiplies turn dz into this
    chunk's share of d(hidden) = dz W and d(W) += dz^T h. The gradient is ready when the forward ends:
    the backward only scales it. That is how Liger-Kernel's fused linear cross-entropy works; Unsloth's
    cross-entropy kernel likewise writes the gradient over the logits.

How the bytes are counted: on the CPU the lesson watches every torch operator (a TorchDispatchMode) and adds
up the storage of each tensor it allocates, subtracting it when the tensor is freed; a Triton kernel allocates
nothing itself (its launcher allocates the outputs with torch). That gives the peak and a timeline of live
memory. On a GPU the same count runs, and torch.cuda.max_memory_allocated() confirms it. Both leave out the
inputs, which exist before the step. With --out DIR the lesson plots the timelines.

The production ops: tk.ops.rms_norm(x, w, residual=r, prenorm=True) (with the backward, fp32 residuals, bias,
the Gemma offset) and tk.ops.fused_linear_cross_entropy(hidden, weight, target) (token chunks sized to hide the
weight gradient's accumulator, ignore_index, label smoothing, z-loss, softcap, d(weight) summed in fp32 or the
weight's dtype) and tk.ops.cross_entropy for logits you already have.
"""

from __future__ import annotations

import weakref
from pathlib import Path

import torch
import triton
import triton.language as tl
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from tritonkit import debug


# --------------------------------------------------------------------------------------------------
# Counting memory
# --------------------------------------------------------------------------------------------------
class MemoryCounter(TorchDispatchMode):
    """Bytes of tensor storage allocated by the torch operators run inside it: ``live``, ``peak`` and the
    ``timeline`` of live bytes after each allocation or free. Views and in-place results share a storage
    already counted (or an input's) and add nothing. Under the interpreter, what Triton does inside a
    kernel launch (its numpy copies) is left out: on a GPU a kernel allocates nothing."""

    def __init__(self):
        super().__init__()
        self.live = self.peak = 0
        self.timeline = [0]
        self._sizes: dict[int, int] = {}
        self._launch = None

    def _allocated(self, storage) -> None:
        key = id(storage)
        if key in self._sizes:
            return
        self._sizes[key] = storage.nbytes()
        self._moved(storage.nbytes())
        weakref.finalize(storage, self._freed, key)

    def _freed(self, key: int) -> None:
        self._moved(-self._sizes.pop(key))

    def _moved(self, nbytes: int) -> None:
        self.live += nbytes
        self.peak = max(self.peak, self.live)
        self.timeline.append(self.live)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {id(t.untyped_storage()) for t in torch.utils._pytree.tree_leaves((args, kwargs))
                  if isinstance(t, torch.Tensor)}  # fmt: skip
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor) and id(t.untyped_storage()) not in inputs:
                self._allocated(t.untyped_storage())
        return out

    def __enter__(self):
        if debug.interpreting():  # the interpreter's own copies are no allocation of the kernel's
            from triton.runtime.interpreter import InterpretedFunction

            self._launch = InterpretedFunction.run

            def run_unwatched(kernel, *args, _run=self._launch, **kwargs):
                with _disable_current_modes():
                    return _run(kernel, *args, **kwargs)

            InterpretedFunction.run = run_unwatched
        return super().__enter__()

    def __exit__(self, *exc):
        if self._launch is not None:
            from triton.runtime.interpreter import InterpretedFunction

            InterpretedFunction.run = self._launch
        return super().__exit__(*exc)


def measure(forward, backward=None) -> dict:
    """Run ``forward()`` and then ``backward(outputs)`` inside a :class:`MemoryCounter`: the peak, the timeline, what
    autograd kept for the backward beyond the outputs (``kept``), the outputs; on a GPU also the peak torch's
    allocator saw above what was allocated before."""
    on_gpu = not debug.interpreting()
    if on_gpu:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    with MemoryCounter() as counter:
        outputs = forward()
        returned = {id(t.untyped_storage()): t.untyped_storage().nbytes() for t in outputs}
        kept = counter.live - sum(returned.values())
        if backward is not None:
            backward(outputs)
    measured = {"peak": counter.peak, "timeline": counter.timeline, "kept": kept,
                "outputs": [t.detach() for t in outputs]}  # fmt: skip
    if on_gpu:
        torch.cuda.synchronize()
        measured["cuda_peak"] = torch.cuda.max_memory_allocated() - before
    return measured


# --------------------------------------------------------------------------------------------------
# (a) residual add + RMSNorm
# --------------------------------------------------------------------------------------------------
@triton.jit
def add_rms_norm_kernel(p_x, p_res, p_w, p_y, p_h, p_rstd, n_cols, eps, BLOCK_N: tl.constexpr):
    """One row: h = x + res, rstd = 1 / sqrt(mean(h^2) + eps), y = h * rstd * w; h, y and rstd stored
    (BLOCK_N >= n_cols: the whole row in one block)."""
    i_r = tl.program_id(0)
    p_row = i_r.to(tl.int64) * n_cols
    o_n = tl.arange(0, BLOCK_N)
    m_n = o_n < n_cols
    b_x = tl.load(p_x + p_row + o_n, mask=m_n, other=0.0).to(tl.float32)  # [BLOCK_N]
    b_h = b_x + tl.load(p_res + p_row + o_n, mask=m_n, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(b_h * b_h, axis=0) / n_cols + eps)  # masked lanes hold 0: they add nothing
    b_w = tl.load(p_w + o_n, mask=m_n, other=0.0).to(tl.float32)
    tl.store(p_h + p_row + o_n, b_h.to(p_h.dtype.element_ty), mask=m_n)
    tl.store(p_y + p_row + o_n, (b_h * rstd * b_w).to(p_y.dtype.element_ty), mask=m_n)
    tl.store(p_rstd + i_r, rstd)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, w: torch.Tensor, eps: float = 1e-6):
    """(y, h, rstd) for contiguous (T, N) x and residual and (N,) w: the forward of the fused op."""
    y, h = torch.empty_like(x), torch.empty_like(x)
    rstd = torch.empty(x.shape[0], dtype=torch.float32, device=x.device)
    add_rms_norm_kernel[(x.shape[0],)](x, residual, w, y, h, rstd, x.shape[1], eps,
                                       BLOCK_N=triton.next_power_of_2(x.shape[1]))  # fmt: skip
    return y, h, rstd


def eager_add_rms_norm(x, residual, w, eps=1e-6):
    h = x + residual
    return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * w, h


# --------------------------------------------------------------------------------------------------
# (b) chunked linear cross-entropy
# --------------------------------------------------------------------------------------------------
@triton.jit
def cross_entropy_rows_kernel(p_logits, p_target, p_loss, n_cols, grad_scale, BLOCK: tl.constexpr):
    """One row z of logits with target t, in two passes over blocks of the row:

    pass 1 (online logsumexp): m' = max(m, max z_blk), s' = s exp(m - m') + sum exp(z_blk - m'); lse = m + log s
    loss = lse - z_t
    pass 2: dz_j = grad_scale * (exp(z_j - lse) - [j = t]), written over z.
    """
    i_r = tl.program_id(0)
    p_row = p_logits + i_r.to(tl.int64) * n_cols
    m = tl.full([], float("-inf"), tl.float32)
    s = tl.zeros([], tl.float32)
    for start in range(0, n_cols, BLOCK):
        o_v = start + tl.arange(0, BLOCK)
        b_z = tl.load(p_row + o_v, mask=o_v < n_cols, other=float("-inf")).to(tl.float32)  # [BLOCK]
        m_new = tl.maximum(m, tl.max(b_z, axis=0))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(b_z - m_new), axis=0)
        m = m_new
    lse = m + tl.log(s)
    target = tl.load(p_target + i_r)
    tl.store(p_loss + i_r, lse - tl.load(p_row + target).to(tl.float32))
    for start in range(0, n_cols, BLOCK):
        o_v = start + tl.arange(0, BLOCK)
        m_v = o_v < n_cols
        b_z = tl.load(p_row + o_v, mask=m_v, other=0.0).to(tl.float32)
        b_dz = (tl.exp(b_z - lse) - (o_v == target).to(tl.float32)) * grad_scale
        tl.store(p_row + o_v, b_dz.to(p_logits.dtype.element_ty), mask=m_v)


def chunked_linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, chunk: int):
    """mean cross_entropy(hidden @ weight.T, target) and its gradients (d hidden, d weight in fp32), computed chunk
    by chunk: at most ``chunk`` rows of logits exist at a time. hidden (T, H), weight (V, H), target (T,)."""
    n_tokens, vocab = hidden.shape[0], weight.shape[0]
    loss_rows = torch.empty(n_tokens, dtype=torch.float32, device=hidden.device)
    grad_hidden = torch.empty_like(hidden)
    grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
    logits = torch.empty(min(chunk, n_tokens), vocab, dtype=hidden.dtype, device=hidden.device)
    for start in range(0, n_tokens, chunk):
        rows = slice(start, min(start + chunk, n_tokens))
        z = logits[: rows.stop - start]
        torch.mm(hidden[rows], weight.t(), out=z)
        cross_entropy_rows_kernel[(z.shape[0],)](z, target[rows], loss_rows[rows], vocab, 1.0 / n_tokens,
                                                 BLOCK=min(triton.next_power_of_2(vocab), 1024))  # fmt: skip
        torch.mm(z, weight, out=grad_hidden[rows])  # z now holds d(loss)/d(logits)
        grad_weight.add_(z.t() @ hidden[rows])
    return loss_rows.mean(), grad_hidden, grad_weight


# --------------------------------------------------------------------------------------------------
# The lesson
# --------------------------------------------------------------------------------------------------
def _mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:7.2f} MiB"


def _report(name: str, measured: dict, unit: int, unit_name: str) -> None:
    line = f"    {name:<34} peak {_mib(measured['peak'])}  ({measured['peak'] / unit:4.1f} x {unit_name})"
    if "cuda_peak" in measured:
        line += f"   torch.cuda.max_memory_allocated: {_mib(measured['cuda_peak'])}"
    print(line)


def _max_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    return (got.double() - expected.double()).abs().max().item()


def _norm_part(device, dtype, generator) -> dict:
    import tritonkit as tk

    tokens, hidden = (32, 1024) if device == "cpu" else (8192, 4096)
    x, residual = (torch.randn(tokens, hidden, device=device, generator=generator).to(dtype) for _ in range(2))
    w = (1 + 0.1 * torch.randn(hidden, device=device, generator=generator)).to(dtype)
    unit = x.numel() * x.element_size()
    print(f"(a) residual add + RMSNorm, x and the residual ({tokens}, {hidden}) {str(dtype)[6:]}: one activation "
          f"is {_mib(unit).strip()}")  # fmt: skip

    y, h, _ = add_rms_norm(x, residual, w)
    expected_y, expected_h = eager_add_rms_norm(x.double(), residual.double(), w.double())
    errors = (_max_error(y, expected_y), _max_error(h, expected_h))
    print(f"    the lesson's kernel against float64 torch: max abs error {errors[0]:.1e} (y), {errors[1]:.1e} (h)")
    assert max(errors) < (1e-5 if dtype == torch.float32 else 5e-2), errors

    grad_y = torch.randn_like(x)
    leaves = [t.detach().requires_grad_() for t in (x, residual, w)]
    steps = (("eager torch", lambda: eager_add_rms_norm(*leaves)),
             ("tk.ops.rms_norm (fused)", lambda: tk.ops.rms_norm(leaves[0], leaves[2], residual=leaves[1],
                                                                  prenorm=True)))  # fmt: skip
    print("    one forward and backward, every byte allocated (gradients included):")
    measured = {}
    for name, forward in steps:
        measured[name] = measure(forward, lambda outputs: outputs[0].backward(grad_y))
        _report(name, measured[name], unit, "activation")
    print("    of which kept by autograd between the forward and the backward, besides y and h:")
    for name, values in measured.items():
        print(f"    {name:<34} {_mib(values['kept'])}  ({values['kept'] / unit:4.2f} activations)")
    eager_kept, fused_kept = (values["kept"] for values in measured.values())
    assert eager_kept >= unit and fused_kept < unit / 10, (eager_kept, fused_kept)
    y_tk, h_tk = measured["tk.ops.rms_norm (fused)"]["outputs"]
    errors = (_max_error(y_tk, y), _max_error(h_tk, h))
    print(f"    tk.ops.rms_norm(x, w, residual=r, prenorm=True) against the lesson's kernel: {max(errors):.1e}")
    assert max(errors) < (1e-5 if dtype == torch.float32 else 5e-2), errors
    return measured


def _loss_part(device, dtype, generator) -> dict:
    import tritonkit as tk

    # The fp32 d(weight) every method allocates is V H 4 bytes, and each of the lesson's chunks adds a V H product in
    # x's dtype into it: a hidden size well below the tokens keeps both small beside the logits, so that what is
    # measured is the logits (at H 1024 on a GPU, they and one chunk outgrew half the logits). 16384 tokens on a GPU:
    # tk.ops.fused_linear_cross_entropy's chunks hold up to 1 GiB of logits (4096 tokens here), half of 8192 tokens'.
    tokens, hidden_size, vocab = (128, 16, 1000) if device == "cpu" else (16384, 512, 128256)
    chunk = tokens // 8
    hidden = (torch.randn(tokens, hidden_size, device=device, generator=generator) / 4).to(dtype)
    weight = (torch.randn(vocab, hidden_size, device=device, generator=generator) / 4).to(dtype)
    target = torch.randint(0, vocab, (tokens,), device=device, generator=generator)
    unit = tokens * vocab * hidden.element_size()
    print(f"\n(b) LM head + cross-entropy: {tokens} tokens, hidden size {hidden_size}, vocabulary {vocab}, "
          f"{str(dtype)[6:]}: the logits are {_mib(unit).strip()}")  # fmt: skip

    leaves = [t.detach().requires_grad_() for t in (hidden, weight)]
    steps = (
        ("eager torch", lambda: [torch.nn.functional.cross_entropy(leaves[0] @ leaves[1].t(), target)]),
        (f"the lesson's chunks of {chunk} tokens", lambda: chunked_linear_cross_entropy(hidden, weight, target, chunk)),
        ("tk.ops.fused_linear_cross_entropy", lambda: [tk.ops.fused_linear_cross_entropy(*leaves, target)]),
    )
    print("    one forward and backward, every byte allocated (gradients included):")
    measured = {}
    for name, forward in steps:
        backward = None if name.startswith("the lesson") else (lambda outputs: outputs[0].backward())
        measured[name] = measure(forward, backward)
        _report(name, measured[name], unit, "logits")
    eager, lesson, fused = measured.values()
    assert eager["peak"] > 2 * unit and max(lesson["peak"], fused["peak"]) < unit / 2, (eager, lesson, fused)

    loss, grad_hidden, grad_weight = lesson["outputs"]
    h64, w64 = hidden.double().requires_grad_(), weight.double().requires_grad_()
    expected = torch.nn.functional.cross_entropy(h64 @ w64.t(), target)
    expected.backward()
    errors = (_max_error(loss, expected), _max_error(grad_hidden, h64.grad), _max_error(grad_weight, w64.grad))
    print(f"    the lesson's chunks against float64 torch: max abs error {errors[0]:.1e} (loss), {errors[1]:.1e} "
          f"(d hidden), {errors[2]:.1e} (d weight)")  # fmt: skip
    assert max(errors) < (1e-4 if dtype == torch.float32 else 5e-2), errors
    tk_error = _max_error(fused["outputs"][0], loss)
    print(f"    tk.ops.fused_linear_cross_entropy against the lesson's loss: {tk_error:.1e}")
    assert tk_error < (1e-5 if dtype == torch.float32 else 5e-2), tk_error
    return measured


def plot(parts: list[tuple[str, dict]], out_dir: str) -> Path:
    from tritonkit.learn import pyplot, save_figure

    plt = pyplot()

    fig, axes = plt.subplots(1, len(parts), figsize=(6 * len(parts), 4.2))
    for ax, (title, measured) in zip(axes, parts, strict=True):
        for name, values in measured.items():
            timeline = [b / 2**20 for b in values["timeline"]]
            ax.step(range(len(timeline)), timeline, where="post", label=f"{name} (peak {max(timeline):.1f} MiB)")
        ax.set_xlabel("allocations and frees, in order")
        ax.set_ylabel("live MiB (inputs not counted)")
        ax.set_title(title)
        ax.legend(fontsize=8)
    return save_figure(fig, out_dir, "fused_kernels_memory.png")


def run(out_dir: str | None = None) -> None:
    device = "cpu" if debug.interpreting() else "cuda"
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    generator = torch.Generator(device=device).manual_seed(0)
    norm = _norm_part(device, dtype, generator)
    loss = _loss_part(device, dtype, generator)
    if out_dir:
        plot([("residual add + RMSNorm: forward and backward", norm),
              ("LM head + cross-entropy: forward and backward", loss)], out_dir)  # fmt: skip
    else:
        print("\n(pass --out DIR to plot live memory through each step)")
    print(
        "\nThe production ops: tk.ops.rms_norm (docs/kernels/norm.md) and tk.ops.fused_linear_cross_entropy "
        "(docs/kernels/loss.md)."
    )


if __name__ == "__main__":
    run()
