#!/usr/bin/env bash
# Verify on a CUDA machine: the compiled test suite (`pytest -m gpu`) and a compiled `tritonkit check`.
# The whole suite takes longer than one call of the lent device (10 minutes), so it runs in parts:
#   bash scripts/gpu_verify.sh core        # tutorial kernels, matmul (autotuning is the slow part), debug
#   bash scripts/gpu_verify.sh norm        # rms_norm, layer_norm, the nn modules
#   bash scripts/gpu_verify.sh softmax     # softmax, log_softmax
#   bash scripts/gpu_verify.sh activation  # gelu, silu
#   bash scripts/gpu_verify.sh lora        # lora_linear, LoRALinear (autotunes two GEMM kernels)
#   bash scripts/gpu_verify.sh rope        # rope (the shape, CUDA-graph capture)
#   bash scripts/gpu_verify.sh ce          # cross_entropy, fused_linear_cross_entropy (peak memory checks)
#   bash scripts/gpu_verify.sh attention   # attention, attention_varlen (determinism, CUDA-graph capture)
#   bash scripts/gpu_verify.sh decoding    # decode_attention, kv_cache_append, the KV formats (a captured step)
#   bash scripts/gpu_verify.sh quant       # quantize, dequantize
#   bash scripts/gpu_verify.sh gemm        # scaled_linear (tiled and split-K GEMV), QuantizedLinear
#   bash scripts/gpu_verify.sh fourbit     # nf4_linear, int4_linear, Linear4bit, LoRALinear over 4-bit bases
#   bash scripts/gpu_verify.sh options     # the norms' dropout/rowscale/parallel input, rms_norm_gated, the losses' options
#   bash scripts/gpu_verify.sh vocab       # vocab_parallel_* on one GPU (two ranks: scripts/gpu_distributed.sh)
#   bash scripts/gpu_verify.sh hf          # Hugging Face patching: bf16 training against unpatched
#   bash scripts/gpu_verify.sh learn       # puzzle solutions and lessons, compiled
#   bash scripts/gpu_verify.sh check       # tritonkit check over the catalog, compiled
#   bash scripts/gpu_verify.sh all         # every part in turn (on a machine without the time limit)
#   bash scripts/gpu_verify.sh parallel SECONDS PART...  # the parts at once (Triton compiles on the CPU cores, so
#                                          # parts overlap well), each stopped after SECONDS; a summary line each
#   A test part written PART:I/N runs only its I-th of N shards (pytest --shard), so that one slow part can run
#   as N processes: bash scripts/gpu_verify.sh parallel 500 attention:0/3 attention:1/3 attention:2/3
# Runs from a checkout without installing (PYTHONPATH=src); logs go to $OUT or ./gpu-logs.
set -uo pipefail
part=${1:?part: core, norm, softmax, activation, lora, rope, ce, attention, decoding, quant, gemm, fourbit, options, vocab, hf, learn, check or all}
if [ "$part" = all ]; then
  rc=0
  for p in core norm softmax activation lora rope ce attention decoding quant gemm fourbit options vocab hf learn check; do bash "$0" "$p" || rc=1; done
  exit $rc
fi
if [ "$part" = parallel ]; then
  limit=${2:?parallel needs a time limit in seconds}; shift 2
  top=${OUT:-gpu-logs}
  export OUT="$top/logs"  # the parts' logs, packed into one file at the end (the device returns 8 files)
  mkdir -p "$OUT"
  summary=$OUT/parallel-summary.txt
  for p in "$@"; do
    ( start=$SECONDS; timeout "$limit" bash "$0" "$p" > /dev/null 2>&1; rc=$?
      echo "$p: exit $rc after $((SECONDS - start)) s" >> "$summary" ) &
  done
  wait
  cat "$summary"
  failed=$(grep -cv ": exit 0 " "$summary")
  tar czf "$top/gpu-logs.tgz" -C "$OUT" . && rm -rf "$OUT"
  exit $((failed > 0))
fi
shard=()
log_name=$part
if [[ "$part" == *:* ]]; then  # PART:I/N
  shard=(--shard "${part#*:}")
  log_name="${part%%:*}-${part#*:}"; log_name=${log_name//\//-of-}
  part=${part%%:*}
fi
out=${OUT:-gpu-logs}
mkdir -p "$out"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1  # after src: wheels a run carried (--target dirs)
unset TRITON_INTERPRET
export TRITONKIT_AUTOTUNE=quick  # two autotune configs, not ten: the tests check results, not speed
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, triton, numpy; print('torch', torch.__version__, 'triton', triton.__version__, 'numpy', numpy.__version__)"
} | tee "$out/device.txt"
case "$part" in
  core) selection="not norm and not softmax and not gelu and not silu and not activation and not lora and not rope"
        selection="$selection and not cross_entropy and not attention and not transformers and not puzzles"
        selection="$selection and not lessons and not decod and not kv_cache and not quant and not scaled_linear"
        selection="$selection and not gemm and not fourbit and not nf4_linear and not int4_linear and not qlora"
        selection="$selection and not options and not gated and not vocab_parallel and not distributed" ;;
  norm) selection="norm" ;;
  softmax) selection="softmax" ;;
  activation) selection="gelu or silu or activation" ;;
  lora) selection="lora" ;;
  rope) selection="rope" ;;
  ce) selection="cross_entropy" ;;
  attention) selection="attention and not decod" ;;
  decoding) selection="decod or kv_cache or quantize_kv" ;;
  quant) selection="quant and not quantize_kv and not decod and not quantized_linear" ;;
  gemm) selection="scaled_linear or gemm or quantized_linear" ;;
  fourbit) selection="fourbit or nf4_linear or int4_linear or qlora" ;;
  options) selection="options or gated" ;;
  vocab) selection="vocab_parallel" ;;
  hf) selection="transformers" ;;
  learn) selection="puzzles or lessons" ;;
  check)  # one kernel at a time, so that a run stopped at its time limit still leaves each finished table
    rc=0
    for name in $(python3 -c "from tritonkit import catalog; print(*(s.name for s in catalog.all_specs()))"); do
      python3 -m tritonkit check "$name" >> "$out/check-gpu.log" 2>&1 || rc=1
    done
    exit $rc
    ;;
  *) echo "unknown part: $part" >&2; exit 2 ;;
esac
# test_notebooks holds no GPU test, and nbformat is not installed on the lent machines
python3 -m pytest -m gpu -q -p no:cacheprovider --ignore=tests/test_notebooks.py -k "$selection" "${shard[@]}" -rf \
  --durations=8 2>&1 | tee "$out/pytest-gpu-$log_name.log"
exit "${PIPESTATUS[0]}"
