#!/bin/bash
# One lent GPU, one call (issue 36): `--calibrate-here` as a user runs it, then jaxpar's
# one-device step on more models, one process per row (each row's own peak memory), keeping
# each row's compiled GPU program and, for some, a profiler trace of two steps (kernel times).
#   OUT=runs/gpu_cal bash benchmarks/gpu_calibration.sh     (on the GPU machine, repo root)
# Needs ml_collections as a wheel in .whl/ where the machine has no package index.
set -u
OUT=$(realpath -m "${OUT:-runs/gpu_cal}"); mkdir -p "$OUT" /tmp/rows /tmp/hlo /tmp/trace
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONUNBUFFERED=1 JAX_COMPILATION_CACHE_DIR=/tmp/jc JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv > "$OUT/gpu.txt" 2>&1
echo "commit $(git rev-parse --short HEAD 2>/dev/null)" >> "$OUT/gpu.txt"
t0=$SECONDS
timeout "${HERE_S:-360}" python3 -m jaxpar.predict --calibrate-here "$OUT/gpu_here.py" > "$OUT/here.log" 2>&1
echo "calibrate-here: rc $? in $((SECONDS - t0)) s" | tee -a "$OUT/gpu.txt"
ROWS=${ROWS:-"resnet50:224:bfloat16:128:trace inception_v3:299:bfloat16:64:trace resnet152:224:bfloat16:64 alexnet:224:bfloat16:256 vgg16:224:bfloat16:64 resnet50:224:float32:128 densenet40:32:float32:64"}
for spec in $ROWS; do  # rows that could not finish before DEADLINE seconds are skipped
  [ $((SECONDS + ${ROW_S:-75})) -gt "${DEADLINE:-500}" ] && { echo "$spec: skipped (deadline)" | tee -a "$OUT/gpu.txt"; continue; }
  row=${spec%:trace}; trace=(); [ "$row" != "$spec" ] && trace=(--trace-dir /tmp/trace)
  t0=$SECONDS
  timeout "${ROW_S:-75}" python3 benchmarks/single_device.py --rows "$row" --seconds 2 \
    --out "/tmp/rows/${row//:/_}.json" --hlo-dir /tmp/hlo "${trace[@]}" > "/tmp/rows/${row//:/_}.log" 2>&1
  echo "$row: rc $? in $((SECONDS - t0)) s" | tee -a "$OUT/gpu.txt"
  tail -3 "/tmp/rows/${row//:/_}.log"
done
cat /tmp/rows/*.log > "$OUT/rows.log"
python3 - "$OUT/rows.json" /tmp/rows/*.json <<'PY'
import json, sys
rows = []
for f in sys.argv[2:]:
    d = json.load(open(f)); rows += d.pop("rows"); head = d
json.dump({**head, "rows": rows}, open(sys.argv[1], "w"), indent=1) if rows else None
PY
tar czf "$OUT/hlo.tgz" -C /tmp hlo
(cd /tmp/trace && find . -name '*.trace.json.gz' | tar czf "$OUT/traces.tgz" -T -)
ls -la "$OUT"
