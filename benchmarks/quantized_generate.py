"""A Llama-shaped model (random weights, nothing downloaded) with its decoder's linear layers swapped for
tk.nn.QuantizedLinear, against the same model in bf16: greedy tokens for a fixed prompt, how often they agree, and the
speed of transformers' generate with each.

    python benchmarks/quantized_generate.py --out DIR [--steps 32] [--batch 1]
    python benchmarks/quantized_generate.py --tiny     # a 2-layer model on the CPU (TRITON_INTERPRET=1)

Two quantized versions: W8A8 float8 e4m3 with row scales (activations quantized on the fly) and W8A16 int8 with row
scales (weights only). The embedding and the LM head stay in bf16.

Agreement is measured two ways. Free-running greedy tokens part for good at the first step where an argmax flips,
and with random weights the logits are close to flat, so a flip comes early; so the bf16 model's tokens are also fed
to the quantized model (teacher forcing) and each step's argmax compared: the share of steps whose next token agrees,
and the relative error of the logits. Times are transformers' generate (eager, its dynamic cache) from the prompt to
the last token after a warm-up run; at batch 1 a 1.2B model's step is dominated by the host's work per layer, so the
ratio says little about the GEMMs themselves (benchmarks/gemm_table.py measures those).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode_generate import LLAMA_1B, TINY, build_model  # the benchmarks folder is no package: its own path

VERSIONS = {  # name -> QuantizedLinear.from_linear's arguments
    "fp8-row-w8a8": {"dtype": torch.float8_e4m3fn, "granularity": "row", "activations": "dynamic"},
    "int8-row-w8a16": {"dtype": torch.int8, "granularity": "row", "activations": "weight_only"},
}
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def quantized(model, dtype: torch.dtype, granularity: str, activations: str):
    """A copy of ``model`` whose decoder projections are QuantizedLinear layers."""
    import tritonkit as tk

    model = copy.deepcopy(model)
    for layer in model.model.layers:
        for block in (layer.self_attn, layer.mlp):
            for name in PROJECTIONS:
                if hasattr(block, name):
                    setattr(block, name, tk.nn.QuantizedLinear.from_linear(getattr(block, name), dtype,
                                                                           granularity=granularity,
                                                                           activations=activations))  # fmt: skip
    return model


@torch.no_grad()
def greedy(model, prompt: torch.Tensor, steps: int) -> tuple[torch.Tensor, float]:
    """(new tokens (B, steps), seconds) of transformers' greedy generate."""
    if prompt.is_cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    out = model.generate(prompt, max_new_tokens=steps, min_new_tokens=steps, do_sample=False, pad_token_id=0)
    if prompt.is_cuda:
        torch.cuda.synchronize()
    return out[:, prompt.shape[1] :], time.perf_counter() - start


@torch.no_grad()
def teacher_forced(reference, model, prompt: torch.Tensor, tokens: torch.Tensor) -> dict:
    """Both models on the prompt and the reference's tokens: the share of steps whose argmax agrees and the logits'
    relative rms error, over the positions that predict the new tokens."""
    sequence = torch.cat((prompt, tokens[:, :-1]), dim=1)
    positions = slice(prompt.shape[1] - 1, sequence.shape[1])
    ours = model(sequence).logits[:, positions].float()
    theirs = reference(sequence).logits[:, positions].float()
    error = (ours - theirs).pow(2).mean().sqrt() / theirs.pow(2).mean().sqrt()
    return {"next_token_agrees": float((ours.argmax(-1) == theirs.argmax(-1)).float().mean()),
            "logits_relative_rms_error": float(error)}  # fmt: skip


def run(args) -> dict:
    device = "cpu" if args.tiny else "cuda"
    dtype = torch.float32 if args.tiny else torch.bfloat16
    model = build_model(TINY if args.tiny else LLAMA_1B, dtype, device)
    prompt = torch.randint(0, model.config.vocab_size, (args.batch, args.prompt),
                           generator=torch.Generator().manual_seed(0)).to(device)  # fmt: skip
    if device == "cuda":
        greedy(model, prompt, 2)
    reference_tokens, reference_s = greedy(model, prompt, args.steps)
    rows = [{"version": "bf16" if dtype == torch.bfloat16 else "fp32", "tokens_per_s": args.batch * args.steps /
             reference_s}]  # fmt: skip
    for name, options in VERSIONS.items():
        version = quantized(model, **options)
        if device == "cuda":
            greedy(version, prompt, 2)
        tokens, seconds = greedy(version, prompt, args.steps)
        agree = (tokens == reference_tokens).float()
        first_difference = int((agree.min(0).values == 0).nonzero()[0]) if not bool(agree.all()) else args.steps
        row = {"version": name, "tokens_per_s": args.batch * args.steps / seconds,
               "speedup": reference_s / seconds, "free_running_tokens_agree": float(agree.mean()),
               "first_difference_at_step": first_difference,
               **teacher_forced(model, version, prompt, reference_tokens)}  # fmt: skip
        print(json.dumps(row), file=sys.stderr, flush=True)
        rows.append(row)
    return {"model": "tiny" if args.tiny else "Llama-shaped 1.2B (random weights)", "dtype": str(dtype),
            "device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "batch": args.batch,
            "prompt": args.prompt, "steps": args.steps, "rows": rows}  # fmt: skip


def markdown(record: dict) -> str:
    lines = [f"# Greedy generation with QuantizedLinear ({record['model']}, {record['dtype']}, {record['device']}, "
             f"batch {record['batch']}, prompt {record['prompt']}, {record['steps']} steps)", "",
             "| version | tokens/s | speed-up | free-running tokens agree | first difference at step | "
             "teacher-forced next token agrees | logits' relative rms error |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for row in record["rows"]:
        if "speedup" not in row:
            lines.append(f"| {row['version']} (reference) | {row['tokens_per_s']:.1f} | — | — | — | — | — |")
            continue
        lines.append(f"| {row['version']} | {row['tokens_per_s']:.1f} | {row['speedup']:.2f}x | "
                     f"{row['free_running_tokens_agree']:.0%} | {row['first_difference_at_step']} | "
                     f"{row['next_token_agrees']:.0%} | {row['logits_relative_rms_error']:.2%} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--tiny", action="store_true", help="a 2-layer fp32 model on the CPU (TRITON_INTERPRET=1)")
    args = parser.parse_args(argv)
    if args.tiny:
        args.steps, args.prompt = min(args.steps, 6), min(args.prompt, 8)
    elif not torch.cuda.is_available():
        parser.error("timing needs a CUDA GPU (--tiny runs a small model on the CPU)")
    record = run(args)
    print(markdown(record))
    if args.out:
        import datetime

        args.out.mkdir(parents=True, exist_ok=True)
        stem = args.out / f"{datetime.date.today().isoformat()}-quantized-generate"
        stem.with_suffix(".json").write_text(json.dumps(record, indent=2) + "\n")
        stem.with_suffix(".md").write_text(markdown(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
