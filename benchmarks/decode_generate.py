"""Greedy generation from a Llama-shaped model (random weights, nothing downloaded) with tritonkit's paged KV cache,
each decode step replayed from one CUDA graph, against transformers' own ``generate`` with SDPA, at batch 1, 8 and 64.

    python benchmarks/decode_generate.py --out DIR [--batches 1,8,64] [--prompt 512] [--new 256] [--kv plain]
    python benchmarks/decode_generate.py --tiny      # a 2-layer model on the CPU (TRITON_INTERPRET=1): tokens compared

tritonkit's loop: the prompt runs through the model once (transformers' forward, SDPA), its keys and values are
appended to a paged cache (pages of 64 tokens scattered over the pool, in bf16 or a quantized format: ``--kv int8``,
``fp8``, ``int4``); then each new token runs the model's own layers (norms, projections, rotary embedding, MLP) with
the cache append and the attention replaced by tk.ops.kv_cache_append and tk.ops.decode_attention, the whole step
(every layer, the head and the argmax) captured once in a CUDA graph and replayed. transformers: ``model.generate``
(greedy, its dynamic cache, SDPA), eager. Both are timed from the prompt to the last token, after a warm-up run;
tokens/s counts the new tokens of the whole batch. The KV bytes each step reads per sequence (keys and values of
every layer at the average length, in the cache's format) are reported beside.

The two runs' tokens are compared: with random weights the logits are close to flat, so bf16 rounding can flip an
argmax and the runs part from there; the report gives the share of sequences whose first new token agrees and the
share of all new tokens that agree. ``--tiny`` runs in fp32, where both must agree exactly.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

PAGE = 64
LLAMA_1B = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                num_key_value_heads=8, head_dim=64, vocab_size=128256, max_position_embeddings=8192)  # fmt: skip
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, vocab_size=97, max_position_embeddings=256)  # fmt: skip


def build_model(config: dict, dtype: torch.dtype, device: str):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**config, attn_implementation="sdpa", tie_word_embeddings=False))
    return model.to(device=device, dtype=dtype).eval()


def _layer_kv(cache, layer: int):
    """(keys, values) (B, Hk, S, D) of one layer of transformers' DynamicCache, in its older or newer form."""
    if hasattr(cache, "layers"):
        return cache.layers[layer].keys, cache.layers[layer].values
    return cache.key_cache[layer], cache.value_cache[layer]


class PagedDecoder:
    """The model's layers with tritonkit's paged cache: one cache per layer, pages scattered over the pool."""

    def __init__(self, model, batch: int, capacity: int, kv: str, device: str):
        import tritonkit as tk

        self.tk, self.model, self.kv = tk, model, kv
        config = model.config
        self.heads_q, self.heads_k = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = config.head_dim
        pages_per_sequence = -(-capacity // PAGE)
        n_pages = batch * pages_per_sequence
        generator = torch.Generator().manual_seed(1)
        self.table = torch.randperm(n_pages, generator=generator).view(batch, -1).int().to(device)
        self.lengths = torch.zeros(batch, dtype=torch.int32, device=device)
        shape = (n_pages, PAGE, self.heads_k, self.head_dim)
        dtype = next(model.parameters()).dtype
        self.caches = []
        for _ in range(config.num_hidden_layers):
            layer = {}
            for name in ("k", "v"):
                zeros = torch.zeros(shape, dtype=dtype, device=device)
                if kv == "plain":
                    layer[f"{name}_cache"], layer[f"{name}_scales"] = zeros, None
                else:
                    layer[f"{name}_cache"], layer[f"{name}_scales"] = tk.ops.quantize_kv(zeros, kv)
            self.caches.append(layer)

    def kv_bytes_per_token(self, length: float) -> float:
        """Bytes of keys and values one decode step reads per sequence at ``length`` tokens, every layer."""
        layer = self.caches[0]
        per_row = sum(t[0, 0, 0].numel() * t.element_size() for t in layer.values() if t is not None) / 2
        return 2 * per_row * self.heads_k * length * len(self.caches)

    def _append(self, layer: dict, k, v) -> None:
        self.tk.ops.kv_cache_append(k, v, layer["k_cache"], layer["v_cache"], self.lengths, block_table=self.table,
                                    k_scales=layer["k_scales"], v_scales=layer["v_scales"])  # fmt: skip

    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The prompt through the model (transformers, SDPA); its keys and values into the paged cache; the first
        new token (greedy)."""
        out = self.model(input_ids, use_cache=True)
        for index, layer in enumerate(self.caches):
            keys, values = _layer_kv(out.past_key_values, index)
            self._append(layer, keys.transpose(1, 2), values.transpose(1, 2))
        self.lengths += input_ids.shape[1]
        return out.logits[:, -1].argmax(-1)

    @torch.no_grad()
    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """One token per sequence through every layer; the next tokens (greedy). Lengths advance in place."""
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        inner = self.model.model
        batch = tokens.shape[0]
        hidden = inner.embed_tokens(tokens[:, None])
        cos, sin = inner.rotary_emb(hidden, self.lengths.long()[:, None])
        for decoder, layer in zip(inner.layers, self.caches, strict=True):
            attention = decoder.self_attn
            x = decoder.input_layernorm(hidden)
            q = attention.q_proj(x).view(batch, 1, self.heads_q, self.head_dim).transpose(1, 2)
            k = attention.k_proj(x).view(batch, 1, self.heads_k, self.head_dim).transpose(1, 2)
            v = attention.v_proj(x).view(batch, 1, self.heads_k, self.head_dim)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            self._append(layer, k.transpose(1, 2), v)
            o = self.tk.ops.decode_attention(q.transpose(1, 2), layer["k_cache"], layer["v_cache"], self.lengths + 1,
                                             block_table=self.table, k_scales=layer["k_scales"],
                                             v_scales=layer["v_scales"])  # fmt: skip
            hidden = hidden + attention.o_proj(o.reshape(batch, 1, -1))
            hidden = hidden + decoder.mlp(decoder.post_attention_layernorm(hidden))
        self.lengths += 1
        return self.model.lm_head(inner.norm(hidden))[:, -1].argmax(-1)


def generate_paged(model, prompt: torch.Tensor, new: int, kv: str, graph: bool) -> torch.Tensor:
    """Greedy tokens (B, new) with the paged cache; the decode step replayed from a CUDA graph when ``graph``."""
    decoder = PagedDecoder(model, prompt.shape[0], prompt.shape[1] + new, kv, str(prompt.device))
    tokens = [decoder.prefill(prompt)]
    if not graph:
        for _ in range(new - 1):
            tokens.append(decoder.step(tokens[-1]))
        return torch.stack(tokens, dim=1)
    current = tokens[0].clone()
    saved = decoder.lengths.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        decoder.step(current)  # warm-up: compilation, allocations; its token is written again by the first replay
    torch.cuda.current_stream().wait_stream(stream)
    decoder.lengths.copy_(saved)
    cuda_graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(cuda_graph):
        following = decoder.step(current)
    for _ in range(new - 1):
        cuda_graph.replay()
        tokens.append(following.clone())
        current.copy_(following)
    return torch.stack(tokens, dim=1)


def generate_transformers(model, prompt: torch.Tensor, new: int) -> torch.Tensor:
    out = model.generate(prompt, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)
    return out[:, prompt.shape[1] :]


def _timed(fn, device: str):
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    result = fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return result, time.perf_counter() - start


def agreement(ours: torch.Tensor, theirs: torch.Tensor) -> dict:
    return {"first_token": float((ours[:, 0] == theirs[:, 0]).float().mean()),
            "all_tokens": float((ours == theirs).float().mean())}  # fmt: skip


def run(args) -> dict:
    device = "cpu" if args.tiny else "cuda"
    dtype = torch.float32 if args.tiny else torch.bfloat16
    model = build_model(TINY if args.tiny else LLAMA_1B, dtype, device)
    vocab = model.config.vocab_size
    rows = []
    for batch in args.batches:
        prompt = torch.randint(0, vocab, (batch, args.prompt), generator=torch.Generator().manual_seed(batch))
        prompt = prompt.to(device)
        graph = device == "cuda"
        if graph:  # warm-up runs: compilation, cuBLAS handles, the allocator
            generate_paged(model, prompt, 4, args.kv, graph)
            generate_transformers(model, prompt, 4)
        ours, ours_s = _timed(lambda p=prompt, g=graph: generate_paged(model, p, args.new, args.kv, g), device)
        theirs, theirs_s = _timed(lambda p=prompt: generate_transformers(model, p, args.new), device)
        decoder_bytes = PagedDecoder(model, 1, args.prompt + args.new, args.kv, device).kv_bytes_per_token(
            args.prompt + args.new / 2)  # fmt: skip
        row = {"batch": batch, "prompt": args.prompt, "new": args.new, "kv": args.kv,
               "tritonkit_tokens_per_s": batch * args.new / ours_s,
               "transformers_tokens_per_s": batch * args.new / theirs_s,
               "speedup": theirs_s / ours_s, "kv_bytes_per_token_per_sequence": decoder_bytes,
               "agreement": agreement(ours, theirs)}  # fmt: skip
        print(json.dumps(row), file=sys.stderr, flush=True)
        rows.append(row)
    return {"model": "tiny" if args.tiny else "Llama-shaped 1.2B (random weights)", "dtype": str(dtype),
            "device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "page_size": PAGE,
            "timing": "wall time from the prompt to the last token, after a warm-up run; tritonkit's steps replay "
                      "one CUDA graph, transformers' generate runs eagerly" if device == "cuda"
                      else "a check on the CPU under the interpreter: eager steps, times mean nothing",
            "rows": rows}  # fmt: skip


def markdown(record: dict) -> str:
    lines = [f"# Greedy generation: tritonkit's paged cache against transformers' generate ({record['model']}, "
             f"{record['dtype']}, {record['device']})", "", record["timing"] + ".", "",
             "| batch | prompt | new | KV format | tritonkit tokens/s | transformers tokens/s | speed-up | "
             "KV bytes per step per sequence | first tokens agree | all tokens agree |",
             "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for row in record["rows"]:
        lines.append(f"| {row['batch']} | {row['prompt']} | {row['new']} | {row['kv']} | "
                     f"{row['tritonkit_tokens_per_s']:.0f} | {row['transformers_tokens_per_s']:.0f} | "
                     f"{row['speedup']:.2f}x | {row['kv_bytes_per_token_per_sequence'] / 1e6:.1f} MB | "
                     f"{row['agreement']['first_token']:.0%} | {row['agreement']['all_tokens']:.0%} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="write <date>-decode-generate-<kv>.json and .md here")
    parser.add_argument("--batches", default="1,8,64")
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--new", type=int, default=256)
    parser.add_argument("--kv", choices=("plain", "int8", "fp8", "int4"), default="plain")
    parser.add_argument("--tiny", action="store_true", help="a 2-layer fp32 model on the CPU (TRITON_INTERPRET=1)")
    args = parser.parse_args(argv)
    args.batches = [int(b) for b in args.batches.split(",")]
    if args.tiny:
        args.batches, args.prompt, args.new = [2], 9, 5
    elif not torch.cuda.is_available():
        parser.error("timing needs a CUDA GPU (--tiny runs a small model on the CPU)")
    record = run(args)
    print(markdown(record))
    if args.out:
        import datetime

        args.out.mkdir(parents=True, exist_ok=True)
        stem = args.out / f"{datetime.date.today().isoformat()}-decode-generate-{args.kv}"
        stem.with_suffix(".json").write_text(json.dumps(record, indent=2) + "\n")
        stem.with_suffix(".md").write_text(markdown(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
