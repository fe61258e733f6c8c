"""A linear layer with a LoRA adapter, fused, forward and backward (public: tritonkit.ops.lora_linear)."""
