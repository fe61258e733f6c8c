"""Gated RMSNorm (public: tritonkit.ops.rms_norm_gated), mamba2's RMSNormGated; in the registry's norm family."""
