"""Cross-entropy and the fused linear cross-entropy of an LM head (public: tritonkit.ops.cross_entropy,
fused_linear_cross_entropy)."""
