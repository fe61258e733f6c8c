#!/usr/bin/env bash
# The runs on several GPUs of one host (one call of the lent device, a kind with 2 or more GPUs):
#   bash scripts/gpu_distributed.sh [test|fsdp|vocab|all]   # default: all
# test:  pytest -m gpu tests/test_distributed.py (the two-rank checks with NCCL, compiled)
# fsdp:  benchmarks/fsdp_training.py on every GPU (unpatched and patched, bf16, 50 timed steps)
# vocab: benchmarks/vocab_parallel_ce.py on every GPU (the vocabulary-parallel loss against one GPU)
# Results (.json, .md) and logs land in $OUT (or ./bench-out). NVLink multicast stays off throughout.
set -uo pipefail
part=${1:-all}
out=${OUT:-bench-out}
mkdir -p "$out"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TRITONKIT_CACHE_DIR=/tmp/tritonkit-cache
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
unset TRITON_INTERPRET
gpus=$(nvidia-smi --list-gpus | wc -l)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/device.txt"
status=0
if [ "$part" = test ] || [ "$part" = all ]; then
  python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_distributed.py 2>&1 | tee "$out/test-distributed.log" \
    || status=1
fi
if [ "$part" = fsdp ] || [ "$part" = all ]; then
  python3 -m torch.distributed.run --nproc-per-node "$gpus" benchmarks/fsdp_training.py --out "$out" 2>&1 \
    | tee "$out/fsdp-training.log" || status=1
fi
if [ "$part" = vocab ] || [ "$part" = all ]; then
  python3 -m torch.distributed.run --nproc-per-node "$gpus" benchmarks/vocab_parallel_ce.py --out "$out" 2>&1 \
    | tee "$out/vocab-parallel-ce.log" || status=1
fi
exit $status
