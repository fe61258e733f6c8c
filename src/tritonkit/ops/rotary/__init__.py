"""Rotary position embedding of q and k, forward and backward (public: tritonkit.ops.rope).

The package is not named rope: the public op tritonkit.ops.rope would shadow it.
"""
