"""Flash decoding: split-KV attention over a paged, quantized KV cache; the cache append; the KV formats."""
