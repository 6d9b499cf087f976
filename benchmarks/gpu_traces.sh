#!/bin/bash
# One lent GPU, one short call (issue 36, what docs/predict.md says the model still misses):
# a kernel trace of each row whose one-device speed the H100 profile misses most, with XLA's
# command buffers off so that every kernel names its instruction, then benchmarks/gpu_trace.py
# on each (matrix kernels' rate, memory-bound kernels by class) and on all of them together.
#   OUT=runs/gpu_traces bash benchmarks/gpu_traces.sh      (on the GPU machine, repo root)
# ROWS=MODEL:IMAGE:DTYPE:BATCH ... overrides the rows (MODEL:WIDTH:IMAGE:DTYPE:BATCH as
# single_device.py reads them); ROW_S bounds each row. On a CPU it runs too (a smoke test).
# Needs ml_collections as a wheel in .whl/ where the machine has no package index.
set -u
OUT=$(realpath -m "${OUT:-runs/gpu_traces}"); mkdir -p "$OUT"
TMP=$(mktemp -d); mkdir -p "$TMP/hlo" "$TMP/trace" "$TMP/rows"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$TMP/site" .whl/*.whl && export PYTHONPATH="$TMP/site"
fi
export PYTHONUNBUFFERED=1
export XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_enable_command_buffer="
ROWS=${ROWS:-"densenet40:32:float32:64 inception_v3:299:bfloat16:64 vgg19:32:bfloat16:512"}
pairs=()
for row in $ROWS; do
  name=${row//:/_}; name=${name//./p}
  t0=$SECONDS
  timeout "${ROW_S:-120}" python3 benchmarks/single_device.py --rows "$row" --seconds 0.3 \
    --out "$TMP/rows/$name.json" --hlo-dir "$TMP/hlo" --trace-dir "$TMP/trace" \
    > "$TMP/rows/$name.log" 2>&1
  echo "$row: rc $? in $((SECONDS - t0)) s" | tee -a "$OUT/rows.txt"
  tail -2 "$TMP/rows/$name.log" | tee -a "$OUT/rows.txt"
  hlo=$(ls "$TMP/hlo/"*.hlo.txt.gz 2>/dev/null | grep -F "/$name" | head -1)
  [ -n "$hlo" ] && [ -d "$TMP/trace/$name" ] && pairs+=("$TMP/trace/$name" "$hlo")
done
if [ ${#pairs[@]} -gt 0 ]; then
  python3 benchmarks/gpu_trace.py "${pairs[@]}" --top 15 --csv "$OUT/kernels.csv.gz" \
    > "$OUT/kernels.txt" 2>&1  # kernels.csv.gz: small enough to commit beside the profile
  echo "gpu_trace: rc $?" | tee -a "$OUT/rows.txt"
fi
cat "$TMP"/rows/*.log > "$OUT/rows.log" 2>/dev/null
tar czf "$OUT/hlo.tgz" -C "$TMP" hlo
(cd "$TMP/trace" && find . -name '*.trace.json.gz' | tar czf "$OUT/traces.tgz" -T -)
ls -la "$OUT"
