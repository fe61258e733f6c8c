"""QLoRA training on a Llama-shaped model (random weights, nothing downloaded): LoRA r=16 on the attention and MLP
projections over an NF4 base (tk.nn.LoRALinear, quantize="nf4", double quantization) against the same model with a
bf16 base and PEFT's eager LoRA (a plain torch LoRA where peft is not installed); tokens/s, peak memory and the losses
of the same steps on the same tokens.

    python benchmarks/qlora_training.py [--steps 10] [--batch 4] [--seq 1024] [--out DIR]
    python benchmarks/qlora_training.py --tiny     # a 1-layer fp32 model on the CPU, through the Triton interpreter

Both runs start from the same base weights and the same adapter (A drawn once, B zero) and train the adapters alone
with AdamW on the same random tokens, next-token cross-entropy. The bf16 run goes first; its base weights are then
quantized in place, layer by layer, so the NF4 run's peak memory holds no bf16 projection. The embedding, the norms and
the LM head stay in bf16 in both runs, as QLoRA keeps them. Times cover the optimizer steps after the warm-up steps.
On a GPU the record goes to benchmarks/results/<device>/ (or --out); --tiny writes only with --out.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode_generate import LLAMA_1B, TINY, build_model  # the benchmarks folder is no package: its own path

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
RANK, ALPHA = 16, 32
TINY_ONE_LAYER = {**TINY, "num_hidden_layers": 1}  # --tiny: seconds under the interpreter
RESULTS = Path(__file__).resolve().parent / "results"


class EagerLoRA(torch.nn.Module):
    """PEFT's LoRA layer in plain torch (for machines without peft): base(x) + scaling * B(A(x)), base frozen."""

    def __init__(self, base: torch.nn.Linear, r: int, alpha: float):
        super().__init__()
        self.base_layer, self.scaling = base.requires_grad_(False), alpha / r
        options = {"device": base.weight.device, "dtype": base.weight.dtype}
        self.lora_A = torch.nn.ModuleDict({"default": torch.nn.Linear(base.in_features, r, bias=False, **options)})
        self.lora_B = torch.nn.ModuleDict({"default": torch.nn.Linear(r, base.out_features, bias=False, **options)})
        torch.nn.init.kaiming_uniform_(self.lora_A["default"].weight, a=math.sqrt(5))
        torch.nn.init.zeros_(self.lora_B["default"].weight)

    def forward(self, x):
        return self.base_layer(x) + self.lora_B["default"](self.lora_A["default"](x)) * self.scaling


def _projections(model):
    """(parent module, attribute name) of every decoder projection."""
    for layer in model.model.layers:
        for block in (layer.self_attn, layer.mlp):
            for name in PROJECTIONS:
                if hasattr(block, name):
                    yield block, name


def with_eager_lora(model):
    """``model`` with PEFT's LoRA on its projections (peft's own, or EagerLoRA), the rest frozen; (model, library)."""
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        for block, name in _projections(model):
            setattr(block, name, EagerLoRA(getattr(block, name), RANK, ALPHA))
        return model, "plain torch"
    config = LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0, target_modules=list(PROJECTIONS))
    return get_peft_model(model, config).base_model.model, "peft"


def to_qlora(model) -> None:
    """Each eager LoRA layer replaced, in place, by tk.nn.LoRALinear over an NF4 copy of its base (double
    quantization) with the same adapter weights; the bf16 base weight is freed as its layer goes."""
    import tritonkit as tk

    for block, name in _projections(model):
        eager = getattr(block, name)
        layer = tk.nn.LoRALinear.from_linear(eager.base_layer, RANK, ALPHA, quantize="nf4", double_quant=True)
        with torch.no_grad():
            for side in ("lora_A", "lora_B"):
                getattr(layer, side)["default"].weight.copy_(getattr(eager, side)["default"].weight)
        setattr(block, name, layer)
        del eager


def adapter_snapshot(model) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters() if p.requires_grad]


def restore(model, snapshot: list[torch.Tensor]) -> None:
    with torch.no_grad():
        for parameter, saved in zip((p for p in model.parameters() if p.requires_grad), snapshot, strict=True):
            parameter.copy_(saved)


def train(model, batches: list[torch.Tensor], warmup: int, device: str) -> dict:
    """AdamW over the trainable parameters, one step a batch: losses, tokens/s after ``warmup`` steps, peak memory."""
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    model.train()
    losses, start = [], None
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    for step, tokens in enumerate(batches):
        if step == warmup:
            if device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
        loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    if device == "cuda":
        torch.cuda.synchronize()
    timed = len(batches) - warmup
    seconds = time.perf_counter() - start if start is not None else float("nan")
    return {
        "losses": losses,
        "tokens_per_s": timed * batches[0].numel() / seconds if timed else float("nan"),
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else float("nan"),
    }


def run(args) -> dict:
    device = "cpu" if args.tiny else "cuda"
    dtype = torch.float32 if args.tiny else torch.bfloat16
    model = build_model(TINY_ONE_LAYER if args.tiny else LLAMA_1B, dtype, device)
    vocab = model.config.vocab_size
    generator = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, vocab, (args.batch, args.seq), generator=generator).to(device)
               for _ in range(args.warmup + args.steps)]  # fmt: skip
    model, library = with_eager_lora(model)
    initial = adapter_snapshot(model)
    eager = train(model, batches, args.warmup, device)
    restore(model, initial)
    to_qlora(model)
    gc.collect()  # PEFT's wrappers and the bf16 projections, before the NF4 run's peak is measured
    if device == "cuda":
        torch.cuda.empty_cache()
    qlora = train(model, batches, args.warmup, device)
    difference = max(abs(a - b) for a, b in zip(eager["losses"], qlora["losses"], strict=True))
    return {"model": "tiny" if args.tiny else "Llama-shaped 1.2B (random weights)", "dtype": str(dtype),
            "device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "torch": torch.__version__,
            "batch": args.batch, "seq": args.seq, "steps": args.steps, "warmup": args.warmup, "rank": RANK,
            "eager_lora": library, "rows": [{"version": f"bf16 base + {library} LoRA", **eager},
                                            {"version": "NF4 base + tk.nn.LoRALinear", **qlora}],
            "largest_loss_difference": difference}  # fmt: skip


def markdown(record: dict) -> str:
    eager, qlora = record["rows"]
    lines = [
        f"# QLoRA training ({record['model']}, {record['dtype']}, {record['device']}, batch {record['batch']} x "
        f"{record['seq']} tokens, r {record['rank']}, {record['steps']} timed steps after {record['warmup']})",
        "",
        "| version | tokens/s | peak memory (GiB) | first loss | last loss |",
        "|---|---|---|---|---|",
    ]
    for row in record["rows"]:
        lines.append(f"| {row['version']} | {row['tokens_per_s']:.0f} | {row['peak_memory_gib']:.2f} | "
                     f"{row['losses'][0]:.4f} | {row['losses'][-1]:.4f} |")  # fmt: skip
    lines += ["", f"NF4 against bf16: {qlora['tokens_per_s'] / eager['tokens_per_s']:.2f}x tokens/s, "
              f"{qlora['peak_memory_gib'] / eager['peak_memory_gib']:.0%} of the peak memory; the largest difference "
              f"between the two runs' losses at one step: {record['largest_loss_difference']:.4f}."]  # fmt: skip
    return "\n".join(lines) + "\n"


def _device_folder() -> Path:
    """benchmarks/results/<device>/, named as the other results' folders (``nvidia-h100``)."""
    words = torch.cuda.get_device_name().lower().split()
    return RESULTS / "-".join(words[:2])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--out", type=Path, help="where the record goes (default: benchmarks/results/<device>/)")
    parser.add_argument("--tiny", action="store_true", help="a 1-layer fp32 model on the CPU (TRITON_INTERPRET=1)")
    args = parser.parse_args(argv)
    if args.tiny:
        from tritonkit._core.env import enable_interpreter_if_no_gpu

        enable_interpreter_if_no_gpu()
        args.steps, args.warmup, args.batch, args.seq = min(args.steps, 1), min(args.warmup, 1), 2, 8
    elif not torch.cuda.is_available():
        parser.error("timing needs a CUDA GPU (--tiny runs a small model on the CPU)")
    record = run(args)
    print(markdown(record))
    out = args.out if args.out or args.tiny else _device_folder()
    if out:
        import datetime

        out.mkdir(parents=True, exist_ok=True)
        stem = out / f"{datetime.date.today().isoformat()}-qlora-training"
        stem.with_suffix(".json").write_text(json.dumps(record, indent=2) + "\n")
        stem.with_suffix(".md").write_text(markdown(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
