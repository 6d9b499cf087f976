#!/bin/bash
# One lent GPU, one call of about 8 minutes (issue 36): what the predictor still misses,
# measured kernel by kernel. In order of need, each bounded, skipped past DEADLINE seconds:
#   1. benchmarks/conv_micro.py: Inception-v3's 43 convolution shapes (1x7, 7x1, 1x3, 3x1
#      among them) and ResNet-50's, each kernel timed from a trace against the profile's price
#      (is Inception's 17% on the H100 in its convolutions?), written as kernel tables;
#   2. benchmarks/reduce_micro.py: reductions by length and results (rule 9's lane rate);
#   3. benchmarks/window_micro.py: pooling windows by size, stride and map.
#   OUT=runs/gpu_micro bash benchmarks/gpu_micro.sh      (on the GPU machine, repo root)
# On a CPU it runs too, each step with --small (a smoke test: SMALL=1).
# Needs ml_collections as a wheel in .whl/ where the machine has no package index.
set -u
OUT=$(realpath -m "${OUT:-runs/gpu_micro}"); mkdir -p "$OUT"
TMP=$(mktemp -d)
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$TMP/site" .whl/*.whl && export PYTHONPATH="$TMP/site"
fi
export PYTHONUNBUFFERED=1
export XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_enable_command_buffer="
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
echo "commit $(git rev-parse --short HEAD 2>/dev/null)" >> "$OUT/gpu.txt"
small=(); [ -n "${SMALL:-}" ] && small=(--small)
step() {  # name, seconds allowed, command...
  local name=$1 limit=$2; shift 2
  if [ $((SECONDS + limit)) -gt "${DEADLINE:-480}" ]; then
    echo "$name: skipped (deadline)" | tee -a "$OUT/gpu.txt"; return
  fi
  local t0=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.txt" 2>&1
  echo "$name: rc $? in $((SECONDS - t0)) s" | tee -a "$OUT/gpu.txt"
  tail -8 "$OUT/$name.txt"
}
step conv_inception "${CONV_S:-200}" python3 benchmarks/conv_micro.py "${small[@]}" \
  --rows inception_v3:1:299:bfloat16:64 --out "$OUT/conv_inception.json" \
  --table "$OUT/inception_v3_bf16_64_kernels.csv"
step conv_resnet50 "${CONV_S:-120}" python3 benchmarks/conv_micro.py "${small[@]}" \
  --rows resnet50:1:224:bfloat16:128 --out "$OUT/conv_resnet50.json" \
  --table "$OUT/resnet50_bf16_128_kernels.csv"
step reduce "${MICRO_S:-90}" python3 benchmarks/reduce_micro.py "${small[@]}" --out "$OUT/reduce.json"
step window "${MICRO_S:-90}" python3 benchmarks/window_micro.py "${small[@]}" --out "$OUT/window.json"
ls -la "$OUT"
