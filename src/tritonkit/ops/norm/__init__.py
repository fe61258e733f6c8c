"""Fused residual-add + RMSNorm / LayerNorm, forward and backward (public: tritonkit.ops.rms_norm, layer_norm)."""
