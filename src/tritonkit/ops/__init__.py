"""Public ops. Each family module holds kernels -> launchers -> public functions -> registry specs."""

from tritonkit.ops.matmul import matmul
from tritonkit.ops.tutorial import add, add_relu, copy, rgb_to_grey

__all__ = ["add", "add_relu", "copy", "matmul", "rgb_to_grey"]
