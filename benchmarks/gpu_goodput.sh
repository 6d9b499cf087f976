#!/bin/bash
# One lent GPU, one call: time to a target on a real device at fixed batches and under the
# goodput schedule (issue 64), all under AdaScale from the same base batch. On one GPU the
# noise scale is measured between two accumulation slices of each step.
#   OUT=runs/gpu_goodput bash benchmarks/gpu_goodput.sh      (on the GPU machine, repo root)
# BATCHES lists the fixed rows; RUN_S bounds each run. Needs ml_collections and tensorboardX
# as wheels in .whl/ where the machine has no package index. On a CPU it runs too (slowly).
set -u
OUT=$(realpath -m "${OUT:-runs/gpu_goodput}"); mkdir -p "$OUT"
TMP=$(mktemp -d)
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$TMP/site" .whl/*.whl && export PYTHONPATH="$TMP/site"
fi
export PYTHONUNBUFFERED=1 JAX_COMPILATION_CACHE_DIR="$TMP/jc"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
python3 -c "import jax; print('jax', jax.__version__, jax.devices())" >> "$OUT/gpu.txt" 2>&1
echo "commit $(git rev-parse --short HEAD 2>/dev/null)" >> "$OUT/gpu.txt"
COMMON=(--config configs/base.py --config.model.name=lenet --config.model.width=0.375
  --config.model.batch_norm=False --config.data.name=digits --config.data.num_eval=2000
  --config.target_accuracy=0.9 --config.stop_at_target=True --config.eval_every_steps=5
  --config.eval_batch_size=1000 --config.learning_rate=0.05 --config.lr_base_batch_size=64
  --config.lr_schedule=constant --config.warmup_steps=10 --config.checkpoint_every_steps=0
  --config.num_train_steps=2000 --config.lr_adaptation=adascale --config.log_every_steps=10
  "--config.mesh_shape=(1,1,1)" --config.num_devices=1)
run() {  # name, then its own flags
  local name=$1; shift; local t0=$SECONDS
  timeout "${RUN_S:-100}" python3 -m jaxpar.train --workdir "$TMP/$name" "${COMMON[@]}" "$@" \
    > "$OUT/$name.log" 2>&1
  echo "$name: rc $? in $((SECONDS - t0)) s" | tee -a "$OUT/gpu.txt"
  cp "$TMP/$name/metrics.jsonl" "$OUT/$name.jsonl" 2>/dev/null
}
for b in ${BATCHES:-64 256 1024 4096}; do
  run "fixed_b$b" --config.global_batch_size="$b" --config.grad_accum_steps=2
done
run goodput --config.global_batch_size=64 --config.grad_accum_steps=2 \
  --config.batch_schedule=goodput --config.goodput.every_steps=10 \
  --config.goodput.max_device_rows=8192 "--config.goodput.batches=(64,256,1024,2048,4096)"
python3 - "$OUT" <<'PY'
import glob, json, os, sys
out = sys.argv[1]
rows = []
for path in sorted(glob.glob(os.path.join(out, "*.jsonl"))):
    summary = [json.loads(l) for l in open(path) if '"summary"' in l]
    if summary:
        s = summary[-1]
        rows.append({k: s.get(k) for k in ("global_batch_size", "steps_to_target",
            "time_to_target_s", "progress_to_target", "mean_gain", "step_time_median_s",
            "schedule_phases", "schedule_moves_s")} | {"row": os.path.basename(path)[:-6]})
json.dump(rows, open(os.path.join(out, "summary.json"), "w"), indent=1)
for r in rows:
    print(r)
PY
