"""Host time of the 1B Llama training step's ops, tritonkit's against transformers' own, at the step's shapes.

    python benchmarks/training_host.py --out benchmarks/results/<device>
    python benchmarks/training_host.py --steps --out benchmarks/results/<device>

A training step is as fast as the slower of the GPU and the host that issues its kernels. Here the GPU is kept busy by
a sleep kernel while an op is called 20 times back to back, so each line is the host's own time per call (µs): the
forward, the forward and backward (the backward runs on autograd's device thread), and the same with autograd's
multithreading off (the backward on the calling thread). Shapes: 4096 tokens, hidden 2048, intermediate 8192, 32:8
heads of 64, bf16 (``hf_training.py --model llama``). Also the attention launchers alone, the forward with and without
tensor descriptors. Writes ``<date>-training-host-costs.txt``.

``--steps``: whole training steps of the 1B Llama (``hf_training.py``'s model and step, one batch of random tokens
used at every step) in one process: transformers, tritonkit's patch, the patch with autograd's multithreading off,
and the patch with each of its switches off in turn; per line the wall time per step over 8 steps, the host's
time to issue one step right after a synchronisation (best of 3), and the GPU's busy time per step (kernels, under
torch.profiler). Writes ``<date>-training-step-host.txt``.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F

import tritonkit as tk
from tritonkit.ops.flash_attention import launch as attention_launch
from tritonkit.ops.flash_attention.plan import attention_plan

TOKENS, HIDDEN, INTERMEDIATE, HEADS_Q, HEADS_KV, HEAD_DIM = 4096, 2048, 8192, 32, 8, 64
SLEEP_CYCLES = int(3e8)  # about 150 ms of GPU time: longer than any 20 calls take to issue
CALLS = 20


class _Nothing(torch.autograd.Function):
    """A Python autograd Function that launches nothing: what any such op pays before its kernels."""

    @staticmethod
    def forward(ctx, a):
        return a.view_as(a)

    @staticmethod
    def backward(ctx, grad):
        return grad


def _cases() -> dict:
    from transformers.models.llama.modeling_llama import LlamaRMSNorm, apply_rotary_pos_emb

    def leaf(*shape):
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)

    x, norm = leaf(TOKENS, HIDDEN), LlamaRMSNorm(HIDDEN).to("cuda", torch.bfloat16)
    q_bhtd, k_bhtd = leaf(1, HEADS_Q, TOKENS, HEAD_DIM), leaf(1, HEADS_KV, TOKENS, HEAD_DIM)
    cos, sin = (torch.randn(1, TOKENS, HEAD_DIM, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    q, k, v = (leaf(1, TOKENS, heads, HEAD_DIM) for heads in (HEADS_Q, HEADS_KV, HEADS_KV))
    v_bhtd = leaf(1, HEADS_KV, TOKENS, HEAD_DIM)
    gate, up = leaf(TOKENS, INTERMEDIATE), leaf(TOKENS, INTERMEDIATE)
    return {
        "python Function (no kernel)": lambda: _Nothing.apply(x),
        "rms_norm tritonkit": lambda: tk.ops.rms_norm(x, norm.weight, eps=1e-5),
        "rms_norm transformers": lambda: norm(x),
        "rope tritonkit": lambda: tk.ops.rope(q_bhtd, k_bhtd, cos, sin, layout="bhtd"),
        "rope transformers": lambda: apply_rotary_pos_emb(q_bhtd, k_bhtd, cos, sin),
        "attention tritonkit": lambda: tk.ops.attention(q, k, v, causal=True, layout="bshd"),
        "attention sdpa": lambda: F.scaled_dot_product_attention(
            q_bhtd, k_bhtd, v_bhtd, is_causal=True, enable_gqa=True
        ),
        "swiglu tritonkit": lambda: tk.ops.swiglu(gate, up),
        "swiglu transformers": lambda: F.silu(gate) * up,
    }


def _step(fn, backward: bool) -> None:
    out = fn()
    if backward:
        outs = out if isinstance(out, tuple) else (out,)
        torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])


def host_us(fn, backward: bool = False, reps: int = 3) -> float:
    """The host's time per call (best of ``reps`` runs of CALLS calls) while the GPU sleeps."""
    best = float("inf")
    for _ in range(reps):
        torch.cuda.synchronize()
        torch.cuda._sleep(SLEEP_CYCLES)
        start = time.perf_counter()
        for _ in range(CALLS):
            _step(fn, backward)
        best = min(best, (time.perf_counter() - start) / CALLS * 1e6)
    torch.cuda.synchronize()
    return best


def _attention_launchers() -> list[str]:
    """The forward launcher with the sm90 plan's tiles, with and without tensor descriptors, and the backward's."""
    q, k, v = (torch.randn(1, TOKENS, h, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
               for h in (HEADS_Q, HEADS_KV, HEADS_KV))  # fmt: skip
    plan = attention_plan("sm90", HEAD_DIM, 2)
    with_descriptors = replace(plan, forward=replace(plan.forward, descriptors=True))
    without = replace(plan, forward=replace(plan.forward, descriptors=False))
    options = (None, None, TOKENS, TOKENS, 2, HEAD_DIM**-0.5, attention_launch.UNBOUNDED, 0, 0.0)
    out, lse = attention_launch.attention_fwd(q, k, v, *options)
    grad_out = torch.randn_like(out)
    forward, backward = attention_launch.attention_fwd, attention_launch.attention_bwd
    calls = {
        "attention_fwd launcher, descriptors": lambda: forward(q, k, v, *options, plan=with_descriptors),
        "attention_fwd launcher, pointer loads": lambda: forward(q, k, v, *options, plan=without),
        "attention_bwd launcher (the plan's)": lambda: backward(grad_out, q, k, v, out, lse, *options),
    }
    lines = []
    for name, fn in calls.items():
        for _ in range(3):  # compile
            fn()
        lines.append(f"{name:40} {host_us(fn):8.1f}")
    return lines


def _device_busy_ms(step, steps: int) -> float:
    """Milliseconds per step in which the GPU runs a kernel (the union of the kernels' spans, torch.profiler's CUDA
    activity only): the step's device time, which its wall time exceeds where the host cannot keep up."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as profiler:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    spans = sorted((e.time_range.start, e.time_range.end) for e in profiler.events()
                   if e.device_type == torch.autograd.DeviceType.CUDA)  # fmt: skip
    busy, end = 0.0, float("-inf")
    for start, stop in spans:
        busy += max(0.0, stop - max(start, end))
        end = max(end, stop)
    return busy / 1e3 / steps  # the profiler's times are in µs


def _step_lines() -> list[str]:
    import gc

    import transformers
    from hf_training import MODELS, _train_step

    from tritonkit.integrations import transformers as tk_hf

    spec = MODELS["llama"]
    config = getattr(transformers, spec.config_class)(**spec.config, attn_implementation="sdpa", use_cache=False)
    ids = torch.randint(0, config.vocab_size, (1, TOKENS), device="cuda",
                        generator=torch.Generator(device="cuda").manual_seed(1))  # fmt: skip

    def run(label: str, switches: dict | None, one_thread: bool = False) -> str:
        torch.manual_seed(0)
        model = getattr(transformers, spec.causal_lm_class)(config).to(device="cuda", dtype=torch.bfloat16)
        if switches is not None:
            tk_hf.apply(model, **switches)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        model.train()
        torch.autograd.set_multithreading_enabled(not one_thread)
        for _ in range(3):  # compile, autotune
            _train_step(model, optimizer, ids)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(8):
            _train_step(model, optimizer, ids)
        torch.cuda.synchronize()
        per_step = (time.perf_counter() - start) / 8
        issued = float("inf")
        for _ in range(3):
            torch.cuda.synchronize()
            start = time.perf_counter()
            _train_step(model, optimizer, ids)
            issued = min(issued, time.perf_counter() - start)
        torch.cuda.synchronize()
        busy = _device_busy_ms(functools.partial(_train_step, model, optimizer, ids), steps=2)
        torch.autograd.set_multithreading_enabled(True)
        del model, optimizer
        gc.collect()
        torch.cuda.empty_cache()
        line = f"{label:48} {1e3 * per_step:8.1f} {1e3 * issued:10.1f} {busy:9.1f}"
        print(line, flush=True)
        return line

    every = dict.fromkeys(tk_hf.SWITCHES, True)
    lines = [f"{'step':48} {'ms/step':>8} {'issued ms':>10} {'GPU busy':>9}", run("transformers", None),
             run("tritonkit", every),
             run("tritonkit, autograd on one thread", every, one_thread=True)]  # fmt: skip
    lines += [run(f"tritonkit without {switch}", {**every, switch: False}) for switch in tk_hf.SWITCHES
              if switch != "cross_entropy"]  # fmt: skip
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--steps", action="store_true", help="whole training steps, switches off one at a time")
    args = parser.parse_args()
    if args.steps:
        text = "\n".join([f"# {torch.cuda.get_device_name()}, torch {torch.__version__}: 1B Llama training steps",
                          *_step_lines()]) + "\n"  # fmt: skip
        _write(args.out, "training-step-host", text)
        return 0
    lines = [f"# {torch.cuda.get_device_name()}, torch {torch.__version__}: host µs per call, the GPU kept busy",
             f"{'op':40} {'fwd':>8} {'fwd+bwd':>8} {'fwd+bwd, one thread':>20}"]  # fmt: skip
    for name, fn in _cases().items():
        for _ in range(3):  # compile, autotune
            _step(fn, True)
        forward, both = host_us(fn), host_us(fn, backward=True)
        torch.autograd.set_multithreading_enabled(False)
        one_thread = host_us(fn, backward=True)
        torch.autograd.set_multithreading_enabled(True)
        lines.append(f"{name:40} {forward:8.1f} {both:8.1f} {one_thread:20.1f}")
        print(lines[-1], flush=True)
    lines += ["", f"{'launcher alone (no autograd)':40} {'µs':>8}", *_attention_launchers()]
    text = "\n".join(lines) + "\n"
    print(text)
    _write(args.out, "training-host-costs", text)
    return 0


def _write(out: Path | None, stem: str, text: str) -> None:
    if out:
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"{datetime.date.today()}-{stem}.txt"
        path.write_text(text)
        print(f"wrote {path}")


if __name__ == "__main__":
    raise SystemExit(main())
