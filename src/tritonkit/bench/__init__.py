"""Benchmarks: calibrated device ceilings, providers (tritonkit, torch eager, torch.compile, peers),
timing, and reports in roofline units (GB/s, TFLOP/s, % of the measured ceiling).

Pure arithmetic and report writing live in :mod:`.cost`, :mod:`.providers` and :mod:`.report` and
run anywhere; timing (:mod:`.harness`) and calibration (:mod:`.calibrate`) need a CUDA GPU.
"""

MODES = ("fwd", "fwd-train", "bwd", "fwd+bwd")
SIZES = ("small", "default", "sweep")
