"""Single-device training speed and memory of several models on the device at hand, with what
its compiler made of each step: what the predictor needs to calibrate on a GPU (issue 36).

    python benchmarks/single_device.py --out runs/single.json            # the default rows
    python benchmarks/single_device.py --rows 'resnet50:224:bfloat16:256' --seconds 5
    python benchmarks/single_device.py --rows ... --hlo-dir runs/hlo --trace-dir runs/trace

Each row is MODEL:IMAGE:DTYPE:BATCH (IMAGE: the side of a square RGB input, 10 classes of
synthetic data), or MODEL:WIDTH:IMAGE:DTYPE:BATCH for a model at a width multiplier. Per
row: the training step jaxpar runs on one device (run_setup.setup on a (1, 1, 1) mesh, the
data-parallel strategy), compiled once, run for a warm-up and then timed
for about --seconds with the device synchronised at the end (images/sec over the timed steps,
and the median of per-step times synchronised each step); the device's peak memory in use
(`memory_stats`, where the device reports it: GPUs) against what the compiled program says it
needs (arguments + outputs - aliases + temporaries); and the compiled program's operation
classes as jaxpar's predictor reads them (jaxpar/predict/kernels/opclass.py): convolution and matmul
FLOPs, bytes of memory-bound kernels, kernels launched. Writes one JSON record per row to
--out and prints a table. Rows that fail (out of memory, say) are recorded with their error.
The peak is the process's since it started (JAX cannot reset it): list rows by growing
memory, or run one per process, to read each row's own.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

DEFAULT_ROWS = (
    "vgg19:32:float32:128",
    "vgg19:32:float32:512",
    "vgg19:32:bfloat16:128",
    "vgg19:32:bfloat16:512",
    "resnet20:32:float32:128",
    "densenet40:32:float32:64",
    "resnet50:224:bfloat16:64",
    "resnet50:224:bfloat16:128",
    "resnet50:224:bfloat16:256",
    "resnet50:224:float32:128",
    "alexnet:224:float32:128",
    "alexnet:224:bfloat16:256",
    "vgg16:224:bfloat16:64",
    "inception_v3:299:bfloat16:64",
    "resnet152:224:bfloat16:64",
)


def config_for(model: str, image: int, dtype: str, batch: int, width: float = 1.0):
    from configs import base

    config = base.get_config()
    config.model.name = model
    config.model.width = width
    config.model.dtype = dtype
    config.model.batch_norm = True
    config.data.name = "synthetic"
    config.data.image_shape = (image, image, 3)
    config.data.num_classes = 10
    config.global_batch_size = batch
    config.eval_batch_size = batch
    config.mesh_shape = (1, 1, 1)
    config.optimizer.name = "sgd"
    return config


def _file_name(spec: str) -> str:
    return spec.replace(":", "_").replace(".", "p")


def _trace(train, state, batch_data, where: str):
    """Two steps under JAX's profiler, kept as a Perfetto trace (JSON, gzipped) whose GPU
    events are the step's kernels with their device times."""
    import jax

    jax.block_until_ready(state)
    with jax.profiler.trace(where, create_perfetto_trace=True):
        for _ in range(2):
            state, _ = train(state, batch_data)
        jax.block_until_ready(state)
    return state


def run_row(
    spec: str, seconds: float, hlo_dir: str | None = None, trace_dir: str | None = None
) -> dict:
    import jax
    import numpy as np

    from jaxpar import run_setup

    fields = spec.split(":")  # MODEL:IMAGE:DTYPE:BATCH, or MODEL:WIDTH:IMAGE:DTYPE:BATCH
    model, width = fields[0], float(fields[1]) if len(fields) == 5 else 1.0
    image, dtype, batch = int(fields[-3]), fields[-2], int(fields[-1])
    row = {"row": spec, "model": model, "image": image, "dtype": dtype, "batch_size": batch}
    if width != 1.0:
        row["width"] = width
    device = jax.devices()[0]
    config = config_for(model, image, dtype, batch, width)
    setup = run_setup.setup(config, [device])
    state = setup.strategy.init_state(jax.random.key(0))
    batch_data = setup.strategy.put_batch(run_setup.local_train_batch(setup, 0))
    t0 = time.perf_counter()
    setup.strategy.compile(state, batch_data)
    row["compile_s"] = time.perf_counter() - t0
    state, metrics, timed = _timed_steps(setup.strategy.train_step, state, batch_data, seconds)
    if trace_dir:
        state = _trace(
            setup.strategy.train_step, state, batch_data, os.path.join(trace_dir, _file_name(spec))
        )
    row.update(
        steps=timed["steps"],
        images_per_sec=batch * timed["steps"] / timed["elapsed"],
        step_time_s=timed["elapsed"] / timed["steps"],
        step_time_synced_median_s=timed["synced_median"],
        loss=float(np.asarray(metrics["loss"])),
    )
    stats = device.memory_stats() or {}
    row["peak_bytes_in_use"] = stats.get("peak_bytes_in_use")
    row["bytes_limit"] = stats.get("bytes_limit")
    row.update(_program_figures(setup, batch, spec, hlo_dir))
    return row


def _timed_steps(step, state, batch_data, seconds: float):
    """3 warm-up steps, 5 synchronised one by one, then as many as fill about `seconds` back
    to back: (state, last metrics, {steps, elapsed, synced_median})."""
    import jax

    for _ in range(3):  # warm-up
        state, metrics = step(state, batch_data)
    jax.block_until_ready(state)
    each = []
    for _ in range(5):  # synchronised per step
        t = time.perf_counter()
        state, metrics = step(state, batch_data)
        jax.block_until_ready(state)
        each.append(time.perf_counter() - t)
    steps = max(5, int(seconds / max(statistics.median(each), 1e-4)))
    t = time.perf_counter()
    for _ in range(steps):
        state, metrics = step(state, batch_data)
    jax.block_until_ready(state)
    elapsed = time.perf_counter() - t
    timed = {"steps": steps, "elapsed": elapsed, "synced_median": statistics.median(each)}
    return state, metrics, timed


def _program_figures(setup, batch: int, spec: str, hlo_dir: str | None) -> dict:
    """The step program's memory (jaxpar.analysis), operation classes and FLOPs; its HLO
    text written to `hlo_dir` if given."""
    from jaxpar import analysis
    from jaxpar.predict.kernels import opclass

    report = analysis.report(setup.strategy, batch, timing=False)
    row = {
        "memory_bytes_predicted": report["memory_bytes_per_device"],
        "state_bytes": report["state_bytes_per_device"],
        "temp_bytes": report["program_temp_bytes_per_device"],
    }
    (program,) = analysis.programs(setup.strategy, batch)
    text = program.compiled.as_text()
    if hlo_dir:
        import gzip

        os.makedirs(hlo_dir, exist_ok=True)
        with gzip.open(os.path.join(hlo_dir, _file_name(spec) + ".hlo.txt.gz"), "wt") as f:
            f.write(text)
    ops = opclass.classify(text)
    row.update(
        matmul_flops=ops.matmul_flops,
        conv3x3_flops=ops.conv3x3_flops,
        memory_bound_bytes=ops.memory_bytes,
        kernels=ops.kernels,
        xla_flops=analysis.program_flops(program.compiled),
        model_flops_per_image=3 * setup.model.flops_per_example,
    )
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rows",
        default=",".join(DEFAULT_ROWS),
        help="MODEL:IMAGE:DTYPE:BATCH or MODEL:WIDTH:IMAGE:DTYPE:BATCH, ...",
    )
    parser.add_argument("--seconds", type=float, default=4.0, help="timed seconds per row")
    parser.add_argument("--out", help="write the records (JSON) here")
    parser.add_argument("--hlo-dir", help="keep each row's compiled program text here (gzipped)")
    parser.add_argument("--trace-dir", help="trace two more steps of each row here (JAX profiler)")
    args = parser.parse_args(argv)
    import jax

    device = jax.devices()[0]
    head = {
        "device": device.device_kind,
        "platform": device.platform,
        "jax": jax.__version__,
        "python": platform.python_version(),
        "argv": sys.argv,
    }
    print(json.dumps(head), flush=True)
    records = []
    for spec in [r for r in args.rows.split(",") if r]:
        try:
            row = run_row(spec, args.seconds, args.hlo_dir, args.trace_dir)
        except Exception as e:  # noqa: BLE001 - one row's failure is its record
            row = {"row": spec, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
        records.append(row)
        print(json.dumps(row), flush=True)
        if args.out:
            with open(args.out, "w") as f:
                json.dump({**head, "rows": records}, f, indent=1)
    print(
        f"\n{'row':<32} {'img/s':>10} {'step ms':>9} {'peak GiB':>9} {'pred GiB':>9} {'kernels':>8}"
    )
    for r in records:
        if "error" in r:
            print(f"{r['row']:<32} {r['error']}")
            continue
        peak = r["peak_bytes_in_use"] / 2**30 if r["peak_bytes_in_use"] else float("nan")
        print(
            f"{r['row']:<32} {r['images_per_sec']:>10,.0f} {1e3 * r['step_time_s']:>9.2f} "
            f"{peak:>9.2f} {r['memory_bytes_predicted'] / 2**30:>9.2f} {r['kernels']:>8}"
        )
    return 0


if __name__ == "__main__":
    from jaxpar import log

    log.setup()  # jaxpar's lines (the trainer's) on stdout
    raise SystemExit(main())
