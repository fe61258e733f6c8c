"""Training throughput of a Llama-like or an MoE model: unpatched transformers, tritonkit's patch, liger-kernel's.

    python benchmarks/hf_training.py --out benchmarks/results/<device> [--providers hf tritonkit liger hf+compile ...]
    python benchmarks/hf_training.py --model moe --steps 8 --out benchmarks/results/<device>
    python benchmarks/hf_training.py --providers hf tritonkit --profile    # also each step's top GPU kernels
    python benchmarks/hf_training.py --model moe --tiny    # one step of a toy model on the CPU (Triton's interpreter)

Each provider runs in its own process, because liger-kernel's patch replaces module-level functions of
transformers for the whole process (tritonkit's changes one model instance). Every process builds the same
randomly initialised model (seeded; no download; ``use_cache`` off, as in training code, so no provider builds a
KV cache during the step), trains it with AdamW in bf16 on the same random tokens,
and reports tokens per second over the timed steps, peak GPU memory, and the losses (which should agree
between providers to bf16 precision: a check that the patched model trains the same). ``tritonkit-bf16-head`` is
the patch with ``apply(accum_dtype=torch.bfloat16)`` (the fused loss's head gradient summed in bf16, Liger-Kernel's
memory choice). A provider named ``<name>+compile`` is that provider with the whole model under ``torch.compile``
(its compilation falls in the warm-up steps). ``--profile``: one more step under torch.profiler, whose top GPU
kernels by time are printed.

``--model llama`` (the default) is Llama 3.2 1B's shape; ``--model moe`` is Qwen3-MoE's layout at 1.7B parameters,
0.7B of them active per token, trained with the routers' load-balancing loss; its routed experts run in
transformers' default implementation (``grouped_mm``) under hf and tritonkit (whose patch leaves them), and in
liger-kernel's own under liger where its version replaces them (``LigerExperts``, for transformers 5). The record is
``<date>-hf-training-<model>-<size>.{json,md}``. ``--tiny``: the chosen family at toy sizes in fp32 on the CPU
through Triton's interpreter, one step of hf and tritonkit in this process (liger-kernel's patch is process-wide
and its kernels need a GPU; compiling is left to the GPU runs), a check that the script and both patches run; its
record, written only with ``--out``, ends in ``-tiny``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

PROVIDERS = ("hf", "tritonkit", "tritonkit-bf16-head", "liger", "hf+compile", "tritonkit+compile", "liger+compile")
# tritonkit-bf16-head: the patch with apply(accum_dtype=torch.bfloat16), the fused loss's head gradient summed in
# bf16 (half its accumulator's memory) as Liger-Kernel's is.
# About 1.2B parameters: the shape of Llama 3.2 1B with its 128256-token vocabulary.
CONFIG = {
    "vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "max_position_embeddings": 8192,
    "tie_word_embeddings": True, "rope_theta": 500000.0,
}  # fmt: skip
# About 1.7B parameters, 0.7B active per token: Qwen3-MoE's layout (q/k norms, 128-wide heads, 4 KV heads, many
# narrow experts under top-8 routing with normalised weights) at 12 layers of 64 experts, small enough to train at
# sequence 4096 in well under 40 GB (14 GB of bf16 weights, gradients and AdamW states). Qwen3's vocabulary and
# RoPE base; the routers' loss is on, as in training.
MOE_CONFIG = {
    "vocab_size": 151936, "hidden_size": 2048, "num_hidden_layers": 12, "num_attention_heads": 32,
    "num_key_value_heads": 4, "head_dim": 128, "num_experts": 64, "num_experts_per_tok": 8,
    "moe_intermediate_size": 256, "norm_topk_prob": True, "output_router_logits": True,
    "router_aux_loss_coef": 0.001, "max_position_embeddings": 8192, "tie_word_embeddings": True,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
}  # fmt: skip
# --tiny: every size small enough for Triton's interpreter to run a training step in seconds.
TINY_SIZES = {
    "vocab_size": 128, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 1, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": 64,
}  # fmt: skip
TINY_EXPERTS = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16}
TINY_PROVIDERS = ("hf", "tritonkit")


class Model(NamedTuple):
    """One model the benchmark trains: transformers' classes by name (looked up in the process that trains)."""

    config_class: str
    causal_lm_class: str
    config: dict
    tiny_config: dict
    liger_patch: str  # liger_kernel.transformers' function for the family
    name: str  # the table's heading
    size: str  # parameters, as the heading and the record's file name state them (a test counts them)
    stem: str  # the record is <date>-hf-training-<stem>.{json,md}


MODELS = {
    "llama": Model("LlamaConfig", "LlamaForCausalLM", CONFIG, {**CONFIG, **TINY_SIZES}, "apply_liger_kernel_to_llama",
                   "Llama-like", "1.2B", "llama-1b"),
    "moe": Model("Qwen3MoeConfig", "Qwen3MoeForCausalLM", MOE_CONFIG, {**MOE_CONFIG, **TINY_SIZES, **TINY_EXPERTS},
                 "apply_liger_kernel_to_qwen3_moe", "Qwen3-MoE-like", "1.7B (0.7B active)", "moe-1.7b"),
}  # fmt: skip


def run_one(provider: str, seq: int, batch: int, warmup: int, steps: int, profile: bool = False,
            model_name: str = "llama", tiny: bool = False) -> dict:  # fmt: skip
    import torch
    import transformers

    spec = MODELS[model_name]
    device, dtype = ("cpu", torch.float32) if tiny else ("cuda", torch.bfloat16)
    on_gpu = device == "cuda"
    torch.manual_seed(0)
    config_class = getattr(transformers, spec.config_class)
    config = config_class(**(spec.tiny_config if tiny else spec.config), attn_implementation="sdpa", use_cache=False)
    model = getattr(transformers, spec.causal_lm_class)(config).to(device=device, dtype=dtype)
    patch, compiled = provider.removesuffix("+compile"), provider.endswith("+compile")
    if patch.startswith("tritonkit"):
        from tritonkit.integrations import transformers as tk_hf

        tk_hf.apply(model, accum_dtype=dtype if patch == "tritonkit-bf16-head" else torch.float32)
    elif patch == "liger":
        import liger_kernel.transformers as liger

        getattr(liger, spec.liger_patch)(model=model)
    forward = torch.compile(model) if compiled else model
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    generator = torch.Generator(device=device).manual_seed(1)
    batches = [
        torch.randint(0, config.vocab_size, (batch, seq), device=device, generator=generator)
        for _ in range(warmup + steps)
    ]
    model.train()
    losses = []
    if on_gpu:
        torch.cuda.reset_peak_memory_stats()
    for index, ids in enumerate(batches):
        if index == warmup:
            if on_gpu:
                torch.cuda.synchronize()
            start = time.perf_counter()
        losses.append(_train_step(forward, optimizer, ids))
    if on_gpu:
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    top_kernels = _profile_step(forward, optimizer, batches[-1]) if profile else None
    return {
        "top_kernels": top_kernels,
        "provider": provider,
        "tokens_per_s": steps * batch * seq / elapsed,
        "ms_per_step": 1e3 * elapsed / steps,
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if on_gpu else None,
        "losses": [float(x) for x in torch.stack(losses).float().cpu()],
        "device": torch.cuda.get_device_name() if on_gpu else "cpu",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }


def _train_step(forward, optimizer, ids):
    loss = forward(ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def _profile_step(forward, optimizer, ids) -> str:
    """Where one more step's time goes: the host's time to issue it (a step that waits on the device inside shows
    the device's time here), the operations that synchronised with the device, the top Python functions by own
    time, and torch.profiler's table of its GPU kernels, the most time first."""
    import cProfile
    import io
    import pstats
    import warnings

    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    start = time.perf_counter()
    _train_step(forward, optimizer, ids)
    issued = time.perf_counter() - start
    torch.cuda.synchronize()
    device = time.perf_counter() - start
    torch.cuda.set_sync_debug_mode("warn")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        python = cProfile.Profile()
        python.enable()
        _train_step(forward, optimizer, ids)
        python.disable()
    torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    syncs = [f"{w.filename}:{w.lineno}: {str(w.message)[:100]}" for w in caught if "synchroniz" in str(w.message)]
    top = io.StringIO()
    pstats.Stats(python, stream=top).sort_stats("tottime").print_stats(25)
    with profile(activities=[ProfilerActivity.CUDA]) as profiler:
        _train_step(forward, optimizer, ids)
        torch.cuda.synchronize()
    kernels = profiler.key_averages().table(sort_by="self_cuda_time_total", row_limit=40, max_name_column_width=90)
    return (f"host issued the step in {1e3 * issued:.1f} ms, the device finished it at {1e3 * device:.1f} ms; "
            f"{len(syncs)} synchronising operations:\n" + "\n".join(syncs[:20]) + "\n" + top.getvalue()
            + kernels)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=MODELS, default="llama", help="llama: 1.2B dense; moe: 1.7B Qwen3-MoE")
    parser.add_argument("--providers", nargs="+", default=None, choices=PROVIDERS,
                        help=f"default: all ({' '.join(TINY_PROVIDERS)} with --tiny)")  # fmt: skip
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--profile", action="store_true", help="print each provider's top GPU kernels of one step")
    parser.add_argument("--tiny", action="store_true", help="one step of a toy model in fp32 on the CPU")
    parser.add_argument("--child", choices=PROVIDERS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    spec = MODELS[args.model]
    if args.child:
        print(json.dumps(run_one(args.child, args.seq, args.batch, args.warmup, args.steps, args.profile,
                                 args.model)))  # fmt: skip
        return 0
    if args.tiny:
        providers = args.providers or list(TINY_PROVIDERS)
        if set(providers) - set(TINY_PROVIDERS) or args.profile:
            parser.error(f"--tiny runs {' and '.join(TINY_PROVIDERS)} on the CPU, without --profile")
        from tritonkit._core.env import enable_interpreter_if_no_gpu

        enable_interpreter_if_no_gpu()  # before tritonkit's kernels are imported
        args.seq, args.batch, args.warmup, args.steps = 8, 1, 0, 1
    else:
        providers = args.providers or list(PROVIDERS)
    results = []
    for provider in providers:
        if args.tiny:  # both patches change one model instance: no process of their own needed
            result = run_one(provider, args.seq, args.batch, args.warmup, args.steps, model_name=args.model, tiny=True)
        else:
            result = _run_child(provider, args)
        top_kernels = result.pop("top_kernels", None)
        if top_kernels:
            print(f"## {provider}: one step's GPU kernels\n{top_kernels}")
        results.append(result)
    table = _table(results)
    print(table)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        stem = f"{datetime.date.today()}-hf-training-{spec.stem}{'-tiny' if args.tiny else ''}"
        record = {"config": spec.tiny_config if args.tiny else spec.config, "seq": args.seq, "batch": args.batch,
                  "results": results}  # fmt: skip
        (args.out / f"{stem}.json").write_text(json.dumps(record, indent=2))
        device = next((r["device"] for r in results if "device" in r), "unknown device")
        model = f"{spec.name} toy-sized" if args.tiny else f"{spec.name} {spec.size}"
        (args.out / f"{stem}.md").write_text(
            f"# {model} training, {'fp32' if args.tiny else 'bf16'}, seq {args.seq}, batch {args.batch} ({device})"
            f"\n\n{table}\n"
        )
    return 0


def _run_child(provider: str, args: argparse.Namespace) -> dict:
    """run_one in a process of its own (liger-kernel's patch changes transformers for the whole process)."""
    command = [sys.executable, __file__, "--child", provider, "--seq", str(args.seq), "--batch", str(args.batch),
               "--warmup", str(args.warmup), "--steps", str(args.steps), "--model", args.model]  # fmt: skip
    command += ["--profile"] if args.profile else []
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        return {"provider": provider, "skipped": done.stderr.strip().splitlines()[-1:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _table(results: list[dict]) -> str:
    """Markdown: each provider's speed and memory, its speed against hf's in the same mode, its first and last loss."""
    lines = ["| provider | tokens/s | ms/step | peak GiB | vs hf (same mode) | first/last loss |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    speeds = {r["provider"]: r["tokens_per_s"] for r in results if "tokens_per_s" in r}
    for r in results:
        if "tokens_per_s" not in r:
            lines.append(f"| {r['provider']} | skipped: {r['skipped']} | | | | |")
            continue
        base = speeds.get("hf+compile" if r["provider"].endswith("+compile") else "hf")
        ratio = f"{r['tokens_per_s'] / base:.2f}x" if base else "-"
        peak = "-" if r["peak_gib"] is None else f"{r['peak_gib']:.1f}"
        lines.append(f"| {r['provider']} | {r['tokens_per_s']:.0f} | {r['ms_per_step']:.1f} | {peak} "
                     f"| {ratio} | {r['losses'][0]:.4f} / {r['losses'][-1]:.4f} |")  # fmt: skip
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
