"""Shared internals of the kernel families: the autograd factory, validation, device facts, launch helpers, and the
shared @triton.jit pieces (jit/). Imports no family."""
