"""Flash attention, forward and backward, dense and packed (public: tritonkit.ops.attention, attention_varlen).

The package is not named attention: the public op tritonkit.ops.attention would shadow it.
"""
