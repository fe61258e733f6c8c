"""The vocabulary-parallel fused linear cross-entropy on N GPUs against the fused op on one GPU, per token.

    torchrun --nproc-per-node 2 benchmarks/vocab_parallel_ce.py           # N GPUs, NCCL, bf16
    torchrun --nproc-per-node 2 benchmarks/vocab_parallel_ce.py --tiny    # 2 CPU ranks, gloo, interpreter

Every rank holds the same hidden states and targets (tensor parallelism shares them) and 1/N of an LM head's rows
(Llama 3's 128256 classes, H = 4096). Timed: forward and backward of
``tk.ops.vocab_parallel_fused_linear_cross_entropy`` on the group, and, on rank 0 alone while the others wait,
``tk.ops.fused_linear_cross_entropy`` with the whole head: the single-GPU speed. Reported: tokens per second of the
group and per GPU, and the per-GPU rate over the single-GPU rate (the scaling efficiency: 1.0 when N GPUs are N
times as fast). Rank 0 writes JSON and markdown to ``benchmarks/results/<device>/`` (``--out``, ``--no-save``).

NCCL runs keep NVLink multicast off: ``NCCL_NVLS_ENABLE=0`` and ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1`` are set
before NCCL starts, unless the environment sets them already.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="CPU ranks (gloo), Triton interpreter, tiny sizes")
    parser.add_argument("--tokens", type=int, nargs="+", default=None, help="tokens (4096 8192 16384; tiny: 12)")
    parser.add_argument("--vocab", type=int, default=None, help="classes (128256; tiny: 40)")
    parser.add_argument("--hidden", type=int, default=None, help="H (4096; tiny: 8)")
    parser.add_argument("--repeats", type=int, default=None, help="timed calls (20; tiny: 1)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args(argv)
    defaults = {"tokens": [12], "vocab": 40, "hidden": 8, "repeats": 1} if args.tiny else \
               {"tokens": [4096, 8192, 16384], "vocab": 128256, "hidden": 4096, "repeats": 20}  # fmt: skip
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def timed(call, repeats: int, sync) -> float:
    """Seconds per call (forward and backward), after one untimed call."""
    call()
    sync()
    start = time.perf_counter()
    for _ in range(repeats):
        call()
    sync()
    return (time.perf_counter() - start) / repeats


def loss_step(op, hidden, weight, target, losses: dict, key: str) -> None:
    loss = op(hidden, weight, target)
    loss.backward()
    losses[key] = loss.detach()  # read after the timing: no host synchronisation per call


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.tiny:
        os.environ["TRITON_INTERPRET"] = "1"
    else:
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
        os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    import torch
    import torch.distributed as dist

    import tritonkit as tk

    if not args.tiny:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("gloo" if args.tiny else "nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    device, dtype = ("cpu", torch.float32) if args.tiny else ("cuda", torch.bfloat16)

    def sync():
        if not args.tiny:
            torch.cuda.synchronize()
        dist.barrier()

    rows = []
    try:
        generator = torch.Generator().manual_seed(0)  # the same tensors on every rank
        weight = (torch.randn(args.vocab, args.hidden, generator=generator) / args.hidden**0.5).to(device, dtype)
        local_weight = weight.chunk(world)[rank].clone().requires_grad_()
        for tokens in args.tokens:
            hidden = torch.randn(tokens, args.hidden, generator=generator).to(device, dtype).requires_grad_()
            target = torch.randint(0, args.vocab, (tokens,), generator=generator).to(device)
            losses = {}
            step = functools.partial(loss_step, tk.ops.vocab_parallel_fused_linear_cross_entropy, hidden, local_weight,
                                     target, losses, "parallel")  # fmt: skip
            seconds = timed(step, args.repeats, sync)
            single = None
            if rank == 0:
                whole = weight.clone().requires_grad_()
                step = functools.partial(loss_step, tk.ops.fused_linear_cross_entropy, hidden, whole, target, losses,
                                         "single")  # fmt: skip
                single = timed(step, args.repeats, lambda: torch.cuda.synchronize() if not args.tiny else None)
                del whole
            dist.barrier()
            hidden.grad = local_weight.grad = None
            if rank == 0:
                group_rate, single_rate = tokens / seconds, tokens / single
                rows.append({"tokens": tokens, "group_tokens_per_s": group_rate, "per_gpu_tokens_per_s":
                             group_rate / world, "single_gpu_tokens_per_s": single_rate, "efficiency":
                             group_rate / world / single_rate, "loss_parallel": float(losses["parallel"]),
                             "loss_single": float(losses["single"])})  # fmt: skip
        if rank == 0:
            name = "cpu (interpreter)" if args.tiny else torch.cuda.get_device_name()
            lines = [f"# Vocabulary-parallel fused linear cross-entropy, {world} rank(s) of {name}, V {args.vocab}, "
                     f"H {args.hidden}, {dtype}, forward + backward", "",
                     "| tokens | group tokens/s | per GPU | one GPU, whole head | per GPU / one GPU | loss (parallel, "
                     "one GPU) |", "|---|---|---|---|---|---|"]  # fmt: skip
            for r in rows:
                lines.append(f"| {r['tokens']} | {r['group_tokens_per_s']:.0f} | {r['per_gpu_tokens_per_s']:.0f} | "
                             f"{r['single_gpu_tokens_per_s']:.0f} | {r['efficiency']:.2f} | "
                             f"{r['loss_parallel']:.5f}, {r['loss_single']:.5f} |")  # fmt: skip
            text = "\n".join(lines) + "\n"
            print(text)
            if not args.tiny and not args.no_save:
                folder = args.out or RESULTS / "-".join(name.lower().split()[:2])
                folder.mkdir(parents=True, exist_ok=True)
                stem = folder / f"{datetime.date.today()}-vocab-parallel-ce-{world}gpu"
                meta = {"world": world, "vocab": args.vocab, "hidden": args.hidden, "dtype": str(dtype),
                        "repeats": args.repeats, "device": name, "torch": torch.__version__, "rows": rows}  # fmt: skip
                stem.with_suffix(".json").write_text(json.dumps(meta, indent=2))
                stem.with_suffix(".md").write_text(text)
                print(f"wrote {stem}.json and .md")
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
