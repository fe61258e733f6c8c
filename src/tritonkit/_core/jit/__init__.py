"""Shared ``@triton.jit`` pieces: offsets and masks, fast math, online-softmax steps, GEMM tile order, the row sync.

Kernels of several families call these; a family's own helpers stay in its ``kernels.py``. Like every module that
defines kernels, these are imported only after the interpreter is chosen (see tritonkit/__init__.py).
"""
