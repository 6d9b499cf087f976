"""What does the pipeline bubble cost? Analytic vs measured, per schedule and micro-batch count.

Run:  python benchmarks/pipeline_bubble.py [--stages 4] [--microbatches 1 4 8] [--width 0.25]

For each schedule and M on a (1, K, 1) mesh: the analytic bubble (K-1)/(M+K-1); the bubble of
the schedule's timeline built from each stage's measured forward/backward times (the
dispatcher's critical path: stages that differ in cost add to the analytic figure); the wall
step time (median); the sequential time (all stage work back to back) and their ratio, the
overlap (> 1: stages really ran at the same time); and the peak stored activations per stage.
On simulated CPU devices K stages share the machine's cores, so the overlap is bounded by the
core count; the timeline bubble is the figure that carries over to real devices.

A micro-benchmark beside `python -m jaxpar.bench` (whose default suite has the same rows at
K=2/4/8): it reuses jaxpar.analysis.measure_pipeline and adds the overlap and peak columns.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from jaxpar import configfile, log

configfile.set_host_device_count(8)  # unless XLA_FLAGS already says

import datafile
import jax

from configs import base
from jaxpar import analysis, run_setup


def measure(args, schedule: str, m: int) -> dict:
    config = base.get_config()
    config.model.width, config.model.batch_norm = args.width, False
    config.global_batch_size = args.batch
    config.mesh_shape = (1, args.stages, 1)
    config.pipeline.schedule, config.pipeline.num_microbatches = schedule, m
    config.pipeline.split = args.split
    config.data.name = "synthetic"
    setup = run_setup.setup(config, jax.devices()[: args.stages])
    state = setup.strategy.init_state(jax.random.key(0))
    batch = setup.strategy.put_batch(run_setup.local_train_batch(setup, 0))
    setup.strategy.compile(state, batch)
    for _ in range(2):
        state, metrics = setup.strategy.train_step(state, batch)
    jax.block_until_ready(metrics)
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        state, metrics = setup.strategy.train_step(state, batch)
        jax.block_until_ready((state, metrics))
        times.append(time.perf_counter() - t0)
    figures = analysis.measure_pipeline(setup.strategy, config.global_batch_size)
    wall = statistics.median(times)
    return {
        **figures,
        "wall_step_s": wall,
        "peak": setup.strategy.stored_activation_bytes(config.global_batch_size),
        "overlap": figures["sequential_step_s"] / wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", type=int, default=4)
    parser.add_argument("--microbatches", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--schedules", nargs="+", default=["gpipe", "1f1b"])
    parser.add_argument("--width", type=float, default=0.25)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--split", default="flops")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--out", help="also write the table as data (.csv or .json)")
    args = parser.parse_args()
    print(
        f"VGG19 width {args.width}, global batch {args.batch}, K={args.stages} stages "
        f"(split {args.split}), {jax.device_count()} {jax.default_backend()} devices"
    )
    header = (
        f"{'schedule':>8} {'M':>3} {'analytic':>9} {'measured':>9} {'wall s':>8} "
        f"{'seq. s':>8} {'overlap':>8}  peak stored activations per stage (KB)"
    )
    print(header)
    rows = []
    for schedule in args.schedules:
        for m in args.microbatches:
            r = measure(args, schedule, m)
            peak = " ".join(f"{p / 1024:.0f}" for p in r["peak"])
            rows.append(
                {
                    "schedule": schedule,
                    "microbatches": m,
                    "analytic_bubble": round(r["analytic_bubble"], 3),
                    "measured_bubble": round(r["measured_bubble"], 3),
                    "wall_step_s": round(r["wall_step_s"], 3),
                    "sequential_step_s": round(r["sequential_step_s"], 3),
                    "overlap": round(r["overlap"], 2),
                    "peak_stored_kb_per_stage": peak,
                }
            )
            print(
                f"{schedule:>8} {m:>3} {r['analytic_bubble']:>9.3f} {r['measured_bubble']:>9.3f} "
                f"{r['wall_step_s']:>8.3f} {r['sequential_step_s']:>8.3f} {r['overlap']:>8.2f}  "
                f"{peak}",
                flush=True,
            )
    if args.out:
        datafile.write(args.out, rows)


if __name__ == "__main__":
    log.setup()  # jaxpar's lines (the trainer's) on stdout
    main()
