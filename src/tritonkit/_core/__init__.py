"""Shared internals: validation, environment queries, output allocation and dtype maps."""
