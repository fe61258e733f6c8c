#!/usr/bin/env bash
# Verify on a CUDA machine in one go: the compiled test suite (`pytest -m gpu`) and a compiled
# `tritonkit check` over the whole catalog. Runs from a checkout without installing (PYTHONPATH=src);
# logs go to $OUT (the lent device's output folder) or ./gpu-logs.
set -uo pipefail
out=${OUT:-gpu-logs}
mkdir -p "$out"
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, triton, numpy; print('torch', torch.__version__, 'triton', triton.__version__, 'numpy', numpy.__version__)"
} | tee "$out/device.txt"
python3 -m pytest -m gpu -q -p no:cacheprovider 2>&1 | tee "$out/pytest-gpu.log"
tests_rc=${PIPESTATUS[0]}
python3 -m tritonkit check 2>&1 | tee "$out/check-gpu.log"
check_rc=${PIPESTATUS[0]}
echo "pytest -m gpu: exit $tests_rc; tritonkit check: exit $check_rc"
[ "$tests_rc" -eq 0 ] && [ "$check_rc" -eq 0 ]
