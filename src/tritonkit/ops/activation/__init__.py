"""GELU, SiLU, SwiGLU and GeGLU, forward and backward (public: tritonkit.ops.gelu, silu, swiglu, geglu)."""
