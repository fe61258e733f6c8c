#!/usr/bin/env bash
# Benchmarks for benchmarks/results/, in parts that each fit one call of the lent device:
#   bash scripts/gpu_bench.sh elementwise   # calibration, copy and add sweeps, a CUDA-graph run
#   bash scripts/gpu_bench.sh matmul        # the matmul variants against torch.matmul
#   bash scripts/gpu_bench.sh norm MODE     # rms_norm and layer_norm, MODE fwd, bwd or fwd+bwd (with liger-kernel
#                                           # when the wheel is carried in .whl/)
#   bash scripts/gpu_bench.sh softmax MODE  # softmax and log_softmax, likewise
#   bash scripts/gpu_bench.sh kernels LABEL MODE NAME...  # the named kernels in bf16 at their default (larger)
#                                           # sizes, MODE fwd, bwd or fwd+bwd, with liger-kernel when carried;
#                                           # CUDA_GRAPH=1 times CUDA-graph replays (no host overhead)
#   bash scripts/gpu_bench.sh host          # benchmarks/host_overhead.py --steps (host time of RMSNorm steps)
#   bash scripts/gpu_bench.sh all           # elementwise and matmul
# Each part's files land in $OUT (or ./bench-out) as one tarball, with the logs beside it.
set -uo pipefail
part=${1:?part: elementwise, matmul, norm, softmax, kernels, host or all}
if [ "$part" = all ]; then
  bash "$0" elementwise && bash "$0" matmul
  exit
fi
out=${OUT:-bench-out}
results=$(mktemp -d)
mkdir -p "$out"
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1 TRITONKIT_CACHE_DIR=/tmp/tritonkit-cache
unset TRITON_INTERPRET
if compgen -G ".whl/*.whl" > /dev/null; then  # peer libraries carried as wheels (no network there)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
  export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
tk() { python3 -m tritonkit "$@" 2>&1 | tee -a "$out/bench-$part.log"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$out/device.txt"
case "$part" in
  elementwise)
    tk bench calibrate --out "$results"
    tk bench copy add --dtype bfloat16 --dtype float16 --sizes sweep --out "$results" --label copy-add
    tk bench add --dtype bfloat16 --sizes small --cuda-graph --out "$results" --label add-cuda-graph
    ;;
  matmul)
    tk bench calibrate
    tk bench --tag matmul --dtype bfloat16 --dtype float16 --sizes sweep --out "$results" --label matmul
    ;;
  kernels)
    label=${2:?kernels needs a label}; mode=${3:?kernels needs a mode}; shift 3
    [ -f /tmp/tritonkit-cache/calibration.json ] || tk bench calibrate --out "$results"
    graph=()
    if [ "${CUDA_GRAPH:-0}" = 1 ]; then graph=(--cuda-graph); label="$label-cuda-graph"; fi
    tk bench "$@" --mode "$mode" --dtype bfloat16 --sizes default "${graph[@]}" --out "$results" \
      --label "$label-${mode/+/-}"
    part="$label-${mode/+/-}"
    ;;
  host)
    python3 benchmarks/host_overhead.py --steps 2>&1 | tee "$out/host-steps.log"
    ;;
  norm|softmax)
    mode=${2:?$part needs a mode: fwd, bwd or fwd+bwd}
    if [ "$part" = norm ]; then names="rms_norm layer_norm"; else names="softmax log_softmax"; fi
    [ -f /tmp/tritonkit-cache/calibration.json ] || tk bench calibrate --out "$results"
    tk bench $names --mode "$mode" --dtype bfloat16 --dtype float32 --sizes sweep --out "$results" \
      --label "$part-${mode/+/-}"
    part="$part-${mode/+/-}"
    ;;
esac
tar czf "$out/results-$part.tgz" -C "$results" .
