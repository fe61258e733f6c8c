"""The practitioner's guide kernels: copy, add, add_relu, rgb_to_grey and the matmul ladder (public: tritonkit.ops.copy,
add, add_relu, rgb_to_grey, matmul). Production code never imports this family.
"""
