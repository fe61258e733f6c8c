"""Quantization to int8 and float8 with per-tensor, per-row, 1 x G group and G x G block scales, and back."""
