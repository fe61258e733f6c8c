"""Training with tritonkit's attention against transformers' sdpa: one Llama-shaped model, one seed, one set of tokens.

    python benchmarks/hf_attention_train.py --out benchmarks/results/<device>/<date>-hf-attention-train.md
    python benchmarks/hf_attention_train.py --packed --attention-only
    python benchmarks/hf_attention_train.py --tiny        # a smoke test on the CPU, under Triton's interpreter

The model is built twice from the same seed (random initialisation, nothing downloaded) and trained with AdamW on
the same random tokens: once as transformers runs it with attn_implementation="sdpa", once patched by
``tritonkit.integrations.transformers.apply(model)`` (every switch; ``--attention-only`` patches the attention
implementation alone). Both runs happen in one process, one after the other: the patch changes one model instance.

Reported: the per-step losses side by side and the largest |difference| (bf16 training: both follow one curve to
within bf16's rounding, drifting apart slowly over the steps), tokens per second over the steps after the warm-up
(which also absorbs Triton's compilation), timed between CUDA synchronisations, and the peak GPU memory.

``--packed``: each step's tokens are one row of sequences of random lengths, position_ids restarting at 0 at each
(padding-free training, as transformers' DataCollatorWithFlattening packs them); the first token of each sequence
carries no label. sdpa then attends through the block-diagonal mask transformers builds; tritonkit runs
``attention_varlen`` over the sequences.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

# About 1.2B parameters: the shape of Llama 3.2 1B with its 128256-token vocabulary (as benchmarks/hf_training.py).
CONFIG = {
    "vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "max_position_embeddings": 8192,
    "tie_word_embeddings": True, "rope_theta": 500000.0,
}  # fmt: skip
# --tiny: small enough for the interpreter to train a few steps in seconds; still GQA (4 query heads, 2 kv heads).
TINY_CONFIG = {
    "vocab_size": 96, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": 128,
}  # fmt: skip
PROVIDERS = ("sdpa", "tritonkit")


def packed_lengths(total: int, shortest: int, longest: int, generator) -> list[int]:
    """Random sequence lengths in [shortest, longest] that fill ``total`` tokens (the last one cut to fit)."""
    import torch

    lengths = []
    while sum(lengths) < total:
        n = int(torch.randint(shortest, longest + 1, (1,), generator=generator))
        lengths.append(min(n, total - sum(lengths)))
    return lengths


def make_batches(args, vocab: int, device: str) -> list[tuple]:
    """(ids, labels, extra forward kwargs, lengths) for every step, drawn once and shared by both runs."""
    import torch

    generator = torch.Generator().manual_seed(args.seed + 1)
    batches = []
    for _ in range(args.warmup + args.steps):
        ids = torch.randint(0, vocab, (args.batch, args.seq), generator=generator)
        labels, kwargs, lengths = ids.clone(), {}, None
        if args.packed:  # every row's tokens in one row, as padding-free training feeds them
            ids, labels = ids.view(1, -1), labels.view(1, -1)
            lengths = packed_lengths(ids.shape[1], max(1, args.seq // 8), args.seq, generator)
            kwargs["position_ids"] = torch.cat([torch.arange(n) for n in lengths])[None].to(device)
            starts = torch.tensor([0, *lengths[:-1]]).cumsum(0)
            labels[0, starts] = -100  # a sequence's first token is not predicted from the one before it
        batches.append((ids.to(device), labels.to(device), kwargs, lengths))
    return batches


def run(provider: str, args, config_kwargs: dict, device: str, dtype, batches) -> dict:
    import torch
    import transformers

    torch.manual_seed(args.seed)
    config = transformers.LlamaConfig(**config_kwargs, attn_implementation="sdpa")
    with torch.device(device):  # initialised where it trains: no 5 GB copy from the host
        model = transformers.LlamaForCausalLM(config)
    model.to(dtype)
    counts = None
    if provider == "tritonkit":
        from tritonkit.integrations import transformers as tk_hf

        switches = {"rms_norm": False, "rope": False, "swiglu": False, "cross_entropy": False,
                    "fused_linear_cross_entropy": False} if args.attention_only else {}  # fmt: skip
        counts = tk_hf.apply(model, **switches)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, fused=device == "cuda")
    cuda = device == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    model.train()
    losses = []
    start = time.perf_counter()
    for index, (ids, labels, kwargs, _) in enumerate(batches):
        if index == args.warmup:
            if cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
        loss = model(ids, labels=labels, use_cache=False, **kwargs).loss  # no cache: sdpa reads packing then
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.detach())
    if cuda:
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    tokens = sum(ids.numel() for ids, *_ in batches[args.warmup :])
    result = {
        "provider": provider,
        "patched": counts,
        "losses": [float(x) for x in torch.stack(losses).float().cpu()],
        "tokens_per_s": tokens / elapsed,
        "ms_per_step": 1e3 * elapsed / args.steps,
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan"),
    }
    del model, optimizer, losses
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return result


def report(args, results: dict, batches, device_name: str, dtype) -> str:
    import torch
    import transformers
    import triton

    sdpa, tk = results["sdpa"], results["tritonkit"]
    differences = [abs(a - b) for a, b in zip(sdpa["losses"], tk["losses"], strict=True)]
    patch = "attention only" if args.attention_only else "apply(model): every switch"
    shape = "tiny" if args.tiny else "Llama-3.2-1B-shaped (1.2B)"
    batch = f"{args.batch} x {args.seq} tokens"
    if args.packed:
        counts = [len(lengths) for *_, lengths in batches]
        batch += f", packed into one row ({min(counts)} to {max(counts)} sequences per step)"
    lines = [
        f"# Training with tritonkit attention vs sdpa: {shape}, {str(dtype).removeprefix('torch.')}, {batch}",
        "",
        f"{device_name}; torch {torch.__version__}, transformers {transformers.__version__}, triton "
        f"{triton.__version__}. AdamW lr {args.lr}, seed {args.seed}; tritonkit patch: {patch}. "
        f"{args.warmup} warm-up steps (not timed), {args.steps} timed.",
        "",
        "| step | sdpa loss | tritonkit loss | abs difference |",
        "|---:|---:|---:|---:|",
    ]
    for step, (a, b, d) in enumerate(zip(sdpa["losses"], tk["losses"], differences, strict=True)):
        warm = " (warm-up)" if step < args.warmup else ""
        lines.append(f"| {step}{warm} | {a:.5f} | {b:.5f} | {d:.2e} |")
    lines += [
        "",
        f"Largest |loss difference|: {max(differences):.3e}",
        "",
        "| provider | tokens/s | ms/step | peak GiB | vs sdpa |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in (sdpa, tk):
        lines.append(f"| {r['provider']} | {r['tokens_per_s']:.0f} | {r['ms_per_step']:.1f} | {r['peak_gib']:.1f} "
                     f"| {r['tokens_per_s'] / sdpa['tokens_per_s']:.2f}x |")  # fmt: skip
    if tk["patched"]:
        lines += ["", f"Patched modules: {tk['patched']}"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=None, help="tokens per row (default 4096; --tiny: 32)")
    parser.add_argument("--batch", type=int, default=None, help="rows per step (default 2)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed first steps (default 3; --tiny: 1)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps (default 10; --tiny: 2)")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--packed", action="store_true", help="one row of packed sequences per step")
    parser.add_argument("--attention-only", action="store_true", help="patch the attention implementation alone")
    parser.add_argument("--tiny", action="store_true", help="a tiny model: a CPU smoke test under the interpreter")
    parser.add_argument("--out", type=Path, default=None, help="markdown file to write the report to")
    args = parser.parse_args(argv)
    defaults = {"seq": 32, "batch": 2, "warmup": 1, "steps": 2} if args.tiny else \
               {"seq": 4096, "batch": 2, "warmup": 3, "steps": 10}  # fmt: skip
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)

    # The interpreter must be on before tritonkit defines its kernels, so before tritonkit is imported.
    from tritonkit._core.env import enable_interpreter_if_no_gpu

    interpreting = enable_interpreter_if_no_gpu()
    import torch

    device = "cpu" if interpreting else "cuda"
    if device == "cpu" and not args.tiny:
        parser.error("without a CUDA GPU (or with TRITON_INTERPRET=1) only --tiny runs: the interpreter is slow")
    dtype = torch.bfloat16 if device == "cuda" else torch.float32  # fp32 on the CPU: the interpreter's exact mode
    config_kwargs = TINY_CONFIG if args.tiny else CONFIG
    batches = make_batches(args, config_kwargs["vocab_size"], device)
    results = {}
    for provider in PROVIDERS:
        results[provider] = run(provider, args, config_kwargs, device, dtype, batches)
        print(f"{provider}: {results[provider]['tokens_per_s']:.0f} tokens/s", flush=True)
    device_name = torch.cuda.get_device_name() if device == "cuda" else "CPU (Triton interpreter)"
    text = report(args, results, batches, device_name, dtype)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
