"""Training throughput of a Llama-like model: unpatched transformers, tritonkit's patch, liger-kernel's.

    python benchmarks/hf_training.py --out benchmarks/results/<device> [--providers hf tritonkit liger hf+compile ...]
    python benchmarks/hf_training.py --providers hf tritonkit --profile    # also each step's top GPU kernels

Each provider runs in its own process, because liger-kernel's patch replaces module-level functions of
transformers for the whole process (tritonkit's changes one model instance). Every process builds the same
randomly initialised model (seeded; no download), trains it with AdamW in bf16 on the same random tokens,
and reports tokens per second over the timed steps, peak GPU memory, and the losses (which should agree
between providers to bf16 precision: a check that the patched model trains the same). A provider named
``<name>+compile`` is that provider with the whole model under ``torch.compile`` (its compilation falls in the
warm-up steps). ``--profile``: one more step under torch.profiler, whose top GPU kernels by time are printed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import time
from pathlib import Path

PROVIDERS = ("hf", "tritonkit", "liger", "hf+compile", "tritonkit+compile", "liger+compile")
# About 1.2B parameters: the shape of Llama 3.2 1B with its 128256-token vocabulary.
CONFIG = {
    "vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "max_position_embeddings": 8192,
    "tie_word_embeddings": True, "rope_theta": 500000.0,
}  # fmt: skip


def run_one(provider: str, seq: int, batch: int, warmup: int, steps: int, profile: bool = False) -> dict:
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(**CONFIG, attn_implementation="sdpa")
    model = transformers.LlamaForCausalLM(config).to(device="cuda", dtype=torch.bfloat16)
    patch, compiled = provider.removesuffix("+compile"), provider.endswith("+compile")
    if patch == "tritonkit":
        from tritonkit.integrations import transformers as tk_hf

        tk_hf.apply(model)
    elif patch == "liger":
        from liger_kernel.transformers import apply_liger_kernel_to_llama

        apply_liger_kernel_to_llama(model=model)
    forward = torch.compile(model) if compiled else model
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    generator = torch.Generator(device="cuda").manual_seed(1)
    batches = [
        torch.randint(0, config.vocab_size, (batch, seq), device="cuda", generator=generator)
        for _ in range(warmup + steps)
    ]
    model.train()
    losses = []
    torch.cuda.reset_peak_memory_stats()
    for index, ids in enumerate(batches):
        if index == warmup:
            torch.cuda.synchronize()
            start = time.perf_counter()
        losses.append(_train_step(forward, optimizer, ids))
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    top_kernels = _profile_step(forward, optimizer, batches[-1]) if profile else None
    return {
        "top_kernels": top_kernels,
        "provider": provider,
        "tokens_per_s": steps * batch * seq / elapsed,
        "ms_per_step": 1e3 * elapsed / steps,
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
        "losses": [float(x) for x in torch.stack(losses).float().cpu()],
        "device": torch.cuda.get_device_name(),
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
    parser.add_argument("--providers", nargs="+", default=list(PROVIDERS), choices=PROVIDERS)
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--profile", action="store_true", help="print each provider's top GPU kernels of one step")
    parser.add_argument("--child", choices=PROVIDERS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(run_one(args.child, args.seq, args.batch, args.warmup, args.steps, args.profile)))
        return 0
    results = []
    for provider in args.providers:
        command = [sys.executable, __file__, "--child", provider, "--seq", str(args.seq), "--batch",
                   str(args.batch), "--warmup", str(args.warmup), "--steps", str(args.steps)]  # fmt: skip
        command += ["--profile"] if args.profile else []
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            results.append({"provider": provider, "skipped": done.stderr.strip().splitlines()[-1:]})
            continue
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
        top_kernels = results[-1].pop("top_kernels")
        if top_kernels:
            print(f"## {provider}: one step's GPU kernels\n{top_kernels}")
    lines = ["| provider | tokens/s | ms/step | peak GiB | vs hf (same mode) | first/last loss |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    speeds = {r["provider"]: r["tokens_per_s"] for r in results if "tokens_per_s" in r}
    for r in results:
        if "tokens_per_s" not in r:
            lines.append(f"| {r['provider']} | skipped: {r['skipped']} | | | | |")
            continue
        base = speeds.get("hf+compile" if r["provider"].endswith("+compile") else "hf")
        ratio = f"{r['tokens_per_s'] / base:.2f}x" if base else "-"
        lines.append(f"| {r['provider']} | {r['tokens_per_s']:.0f} | {r['ms_per_step']:.1f} | {r['peak_gib']:.1f} "
                     f"| {ratio} | {r['losses'][0]:.4f} / {r['losses'][-1]:.4f} |")  # fmt: skip
    table = "\n".join(lines)
    print(table)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        stem = args.out / f"{datetime.date.today()}-hf-training-llama-1b"
        stem.with_suffix(".json").write_text(json.dumps({"config": CONFIG, "seq": args.seq, "batch": args.batch,
                                                         "results": results}, indent=2))  # fmt: skip
        device = next((r["device"] for r in results if "device" in r), "unknown device")
        stem.with_suffix(".md").write_text(
            f"# Llama-like 1.2B training, bf16, seq {args.seq}, batch {args.batch} ({device})\n\n{table}\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
