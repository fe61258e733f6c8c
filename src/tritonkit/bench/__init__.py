"""Benchmarks: calibrated device ceilings, providers (tritonkit, torch eager, torch.compile, peers),
timing, and reports in roofline units (GB/s, TFLOP/s, % of the measured ceiling).

Pure arithmetic and report writing live in :mod:`.cost`, :mod:`.providers`, :mod:`.report` and :mod:`.plots`
(which plots a run makes along each spec's swept axis, and drawing them with matplotlib when it is installed) and
run anywhere; timing (:mod:`.harness`) and calibration (:mod:`.calibrate`) need a CUDA GPU.
"""

MODES = ("fwd", "fwd-train", "bwd", "fwd+bwd")
SIZES = ("small", "default", "sweep")
