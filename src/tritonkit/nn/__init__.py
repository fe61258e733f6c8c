"""Thin ``torch.nn.Module`` wrappers over :mod:`tritonkit.ops` (no kernels here); filled by later families."""

__all__: list[str] = []
