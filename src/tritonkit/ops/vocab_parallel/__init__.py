"""Cross-entropy over a vocabulary split across the ranks of a tensor-parallel group, and its fused form with a
vocabulary-parallel LM head, without gathering the logits (public: tritonkit.ops.vocab_parallel_cross_entropy,
vocab_parallel_fused_linear_cross_entropy)."""
