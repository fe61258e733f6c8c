"""Softmax and log-softmax along any dimension, forward and backward (public: tritonkit.ops.softmax, log_softmax).

The package is not named softmax: the public op tritonkit.ops.softmax would shadow it.
"""
