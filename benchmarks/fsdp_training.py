"""FSDP2 training of a Llama-shaped model on N ranks, unpatched and with tritonkit's Hugging Face patch.

    torchrun --nproc-per-node 2 benchmarks/fsdp_training.py            # N GPUs, NCCL, bf16 mixed precision
    torchrun --nproc-per-node 2 benchmarks/fsdp_training.py --tiny     # 2 CPU ranks, gloo, Triton interpreter
    python benchmarks/fsdp_training.py --tiny                          # one CPU rank

Each rank builds the same randomly initialised model (transformers' LlamaConfig, seeded: nothing is downloaded;
``use_cache`` off, as in training code),
shards it with ``fully_shard`` (each decoder layer, then the root; the LM head stays in the root's unit) and trains
it with AdamW on its own random tokens (seeded by rank, the same for both providers), once as transformers wrote it
(``hf``, SDPA attention) and once after ``tritonkit.integrations.transformers.apply`` (``tritonkit``). On GPUs the
parameters stay fp32 and FSDP2's ``MixedPrecisionPolicy`` computes in bf16 and reduces gradients in fp32; ``--tiny``
stays fp32 on the CPU. Reported per provider: tokens per second per GPU over the timed steps (each rank's tokens
over the wall time), the peak memory (the largest over ranks), and the loss of every step averaged over the ranks,
which should agree between the providers to bf16 precision. On GPUs rank 0 writes JSON and markdown to
``benchmarks/results/<device>/`` (``--out`` to change, ``--no-save`` to skip).

NCCL runs keep NVLink multicast (NVLS) off: this script sets ``NCCL_NVLS_ENABLE=0`` and
``TORCH_SYMM_MEM_DISABLE_MULTICAST=1`` before NCCL starts, unless the environment sets them already. The lent
multi-GPU machines must not use multicast objects.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import hf_training  # this folder's one-GPU benchmark (torchrun and python put the script's folder on sys.path)

PROVIDERS = ("hf", "tritonkit")
# About 1.2B parameters: Llama 3.2 1B's shape with its 128256-token vocabulary, as in the one-GPU benchmark.
CONFIG = hf_training.CONFIG
# Small enough for the interpreter: a few seconds a step on a CPU.
TINY_CONFIG = {
    "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 1, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": 64, "tie_word_embeddings": True,
}  # fmt: skip
RESULTS = Path(__file__).parent / "results"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="CPU ranks (gloo), Triton interpreter, tiny model")
    parser.add_argument("--providers", nargs="+", default=list(PROVIDERS), choices=PROVIDERS)
    parser.add_argument("--seq", type=int, default=None, help="tokens per sequence (4096; tiny: 8)")
    parser.add_argument("--batch", type=int, default=None, help="sequences per rank and step (2; tiny: 1)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps first (5; tiny: 1)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps (50; tiny: 2)")
    parser.add_argument("--out", type=Path, default=None, help="results folder (GPU default: results/<device>)")
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args(argv)
    defaults = {"seq": 8, "batch": 1, "warmup": 1, "steps": 2} if args.tiny else \
               {"seq": 4096, "batch": 2, "warmup": 5, "steps": 50}  # fmt: skip
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def set_environment(tiny: bool) -> None:
    """Before torch starts NCCL (or tritonkit defines a kernel): NVLink multicast off; the interpreter for --tiny."""
    if tiny:
        os.environ["TRITON_INTERPRET"] = "1"
    else:
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
        os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")


def init_distributed(tiny: bool):
    """torchrun's group, or a world of one (a FileStore in a temporary folder) when run without torchrun."""
    import torch
    import torch.distributed as dist

    backend = "gloo" if tiny else "nccl"
    if "RANK" in os.environ:
        if not tiny:
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group(backend, timeout=datetime.timedelta(minutes=10))
    else:
        if not tiny:
            torch.cuda.set_device(0)
        store = dist.FileStore(str(Path(tempfile.mkdtemp()) / "store"), 1)
        dist.init_process_group(backend, store=store, rank=0, world_size=1)
    return dist.get_rank(), dist.get_world_size()


def build(provider: str, config_values: dict, tiny: bool, mesh):
    import torch
    import transformers
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    torch.manual_seed(0)  # the same weights on every rank and for both providers
    config = transformers.LlamaConfig(**config_values, attn_implementation="sdpa", bos_token_id=None,
                                      eos_token_id=None, use_cache=False)  # fmt: skip
    with torch.device("cpu" if tiny else "cuda"):  # initialised on the GPU: seconds, not a minute, for 1.2B
        model = transformers.LlamaForCausalLM(config)
    if provider == "tritonkit":
        from tritonkit.integrations import transformers as tk_hf

        tk_hf.apply(model)
    policy = {} if tiny else {"mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)}
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, **policy)
    fully_shard(model, mesh=mesh, **policy)
    return model


def run(provider: str, args, rank: int, world: int, mesh) -> dict:
    import torch
    import torch.distributed as dist

    device = "cpu" if args.tiny else "cuda"
    config_values = TINY_CONFIG if args.tiny else CONFIG
    model = build(provider, config_values, args.tiny, mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    generator = torch.Generator().manual_seed(1000 + rank)  # each rank its own data; the same for both providers
    batches = [torch.randint(0, config_values["vocab_size"], (args.batch, args.seq), generator=generator).to(device)
               for _ in range(args.warmup + args.steps)]  # fmt: skip
    model.train()
    losses = []
    if not args.tiny:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    for index, ids in enumerate(batches):
        if index == args.warmup:
            dist.barrier()
            if not args.tiny:
                torch.cuda.synchronize()
            start = time.perf_counter()
        loss = model(ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.detach().float())
    if not args.tiny:
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    mean_losses = torch.stack(losses)
    dist.all_reduce(mean_losses)
    mean_losses /= world
    peak = torch.tensor([torch.cuda.max_memory_allocated() / 2**30 if not args.tiny else 0.0], device=device)
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    del model, optimizer
    return {
        "provider": provider,
        "tokens_per_s_per_gpu": args.steps * args.batch * args.seq / elapsed,
        "ms_per_step": 1e3 * elapsed / args.steps,
        "peak_gib": float(peak),
        "losses": [float(x) for x in mean_losses.cpu()],
    }


def device_name(tiny: bool) -> str:
    import torch

    return "cpu (interpreter)" if tiny else torch.cuda.get_device_name()


def report(results: list[dict], args, world: int) -> str:
    base = next((r["tokens_per_s_per_gpu"] for r in results if r["provider"] == "hf"), None)
    lines = [
        f"# FSDP2 training, Llama-shaped, {world} rank(s) of {device_name(args.tiny)}, seq {args.seq}, "
        f"batch {args.batch} per rank, {args.steps} timed steps after {args.warmup}",
        "",
        "| provider | tokens/s per GPU | ms/step | peak GiB | vs hf | first / last loss |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        ratio = f"{r['tokens_per_s_per_gpu'] / base:.2f}x" if base else "-"
        lines.append(f"| {r['provider']} | {r['tokens_per_s_per_gpu']:.0f} | {r['ms_per_step']:.1f} | "
                     f"{r['peak_gib']:.1f} | {ratio} | {r['losses'][0]:.4f} / {r['losses'][-1]:.4f} |")  # fmt: skip
    if len(results) > 1:
        lines += ["", "Loss per step (mean over ranks; the first " + str(args.warmup) + " untimed):", "",
                  "| step | " + " | ".join(r["provider"] for r in results) + " |",
                  "|---|" + "---|" * len(results)]  # fmt: skip
        for step in range(len(results[0]["losses"])):
            lines.append(f"| {step} | " + " | ".join(f"{r['losses'][step]:.4f}" for r in results) + " |")
        gap = max(abs(a - b) for a, b in zip(results[0]["losses"], results[1]["losses"], strict=True))
        lines += ["", f"Largest loss difference between {results[0]['provider']} and {results[1]['provider']}: "
                      f"{gap:.2e}"]  # fmt: skip
    return "\n".join(lines) + "\n"


def save(text: str, results: list[dict], args, world: int) -> None:
    import torch
    import transformers

    folder = args.out or RESULTS / "-".join(device_name(False).lower().split()[:2])
    folder.mkdir(parents=True, exist_ok=True)
    stem = folder / f"{datetime.date.today()}-fsdp-training-{world}gpu"
    meta = {"config": CONFIG, "world": world, "seq": args.seq, "batch": args.batch, "warmup": args.warmup,
            "steps": args.steps, "device": device_name(False), "torch": torch.__version__,
            "transformers": transformers.__version__, "results": results}  # fmt: skip
    stem.with_suffix(".json").write_text(json.dumps(meta, indent=2))
    stem.with_suffix(".md").write_text(text)
    print(f"wrote {stem}.json and .md")


def main(argv=None) -> int:
    args = parse_args(argv)
    set_environment(args.tiny)
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    rank, world = init_distributed(args.tiny)
    try:
        mesh = init_device_mesh("cpu" if args.tiny else "cuda", (world,))
        results = [run(provider, args, rank, world, mesh) for provider in args.providers]
        if rank == 0:
            text = report(results, args, world)
            print(text)
            if not args.tiny and not args.no_save:
                save(text, results, args, world)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
