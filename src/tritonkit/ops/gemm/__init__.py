"""Scaled GEMMs: int8 and float8 linear layers with tensor, row, group and block scales, and weight-only ones."""
