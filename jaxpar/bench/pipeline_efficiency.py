"""Pipeline efficiency table (issue 12): schedule x remat at K stages, M micro-batches.

Run:  python -m jaxpar.bench.pipeline_efficiency [--width 0.125] [--batch 64] [--steps 3]
          [--split flops time] [--schedules 1f1b zb-h1] [--microbatches 4 8]

Per row (schedule x remat x split x M): the stage bounds, step FLOPs (XLA's cost analysis of
the compiled programs, all stages), peak stored bytes per stage (live buffers, busiest
stage), the analytic bubble, the timeline bubble from this machine's measured per-chunk
F/B/W times, the slowest chunk over the mean (1.00: balanced), and the wall step time (median
of `--steps` timed steps after compilation). With both splits, each time-split row also
gives its wall step time over the flops-split row's, measured in the same run. The same
rows are a harness suite (configs/bench/pipeline_efficiency.py) for wall time, memory and
bubbles; FLOPs come from here.
"""

from __future__ import annotations

import argparse
import atexit
import dataclasses
import json
import shutil
import statistics
import tempfile
import time

import jax

from jaxpar import analysis, configfile, log, run_setup

ROWS = (
    ("gpipe", True, 1),
    ("gpipe", False, 1),
    ("1f1b", True, 1),
    ("1f1b", False, 1),
    ("interleaved", True, 2),
    ("interleaved", False, 2),
    ("zb-h1", False, 1),
    ("zb-v", False, 1),
)


@dataclasses.dataclass(frozen=True)
class Figures:
    """One row's figures (a line of the table, and of --out's JSON beside its setting)."""

    bounds: list[int]  # the stages' layer bounds
    chunk_ms: list[float]  # measured per-chunk time
    predicted_chunk_ms: list[float] | None  # the layer-time model's, where it has one
    imbalance: float  # the slowest chunk over the mean
    step_gflops: float
    stored_mb_per_stage: list[float]
    analytic_bubble: float
    timeline_bubble: float
    wall_step_s: float

    def as_record(self) -> dict:
        return dataclasses.asdict(self)


def measure(config, devices, steps: int, workdir: str | None = None) -> Figures:
    """One row's figures."""
    setup = run_setup.setup(config, devices, workdir)
    strategy = setup.strategy
    state = strategy.init_state(jax.random.key(0))
    batch = strategy.put_batch(run_setup.local_train_batch(setup, 0))
    state, _ = strategy.train_step(state, batch)  # compile every program
    jax.block_until_ready(state)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        state, metrics = strategy.train_step(state, batch)
        jax.block_until_ready((state, metrics))
        times.append(time.perf_counter() - t0)
    batch_size = config.global_batch_size
    line = analysis.measure_pipeline(strategy, batch_size)
    chunk = line["stage_time_s"]
    return Figures(
        bounds=list(strategy.bounds),
        chunk_ms=[1e3 * t for t in chunk],
        predicted_chunk_ms=(
            [1e3 * t for t in setup.model.times.chunk_times(strategy.bounds)]
            if setup.model.times is not None
            else None
        ),
        imbalance=max(chunk) / (sum(chunk) / len(chunk)),
        step_gflops=analysis.step_flops(strategy, batch_size) / 1e9,
        stored_mb_per_stage=[b / 2**20 for b in strategy.stored_activation_bytes(batch_size)],
        analytic_bubble=strategy.analytic_bubble(),
        timeline_bubble=line["measured_bubble"],
        wall_step_s=statistics.median(times),
    )


def main() -> None:
    from configs import base

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=float, default=0.125)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--stages", type=int, default=4)
    parser.add_argument("--microbatches", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--split", nargs="+", default=["flops"], choices=["flops", "time"])
    parser.add_argument("--schedules", nargs="+", default=[], help="only these schedules")
    parser.add_argument("--out", default="")
    parser.add_argument("--xla-cache", default="/tmp/jaxpar-xla-cache")
    args = parser.parse_args()
    # Rows share programs (GPipe and 1F1B run the same ones) and step_flops lowers them again:
    # the persistent cache compiles each once.
    jax.config.update("jax_compilation_cache_dir", args.xla_cache)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    k = args.stages
    configfile.set_host_device_count(k)  # before JAX starts its CPU backend
    header = (
        "| schedule | remat | split | M | bounds | step GFLOPs | stored MB/stage (max) "
        "| analytic | timeline | slowest/mean chunk | wall s | wall / flops split |"
    )
    print(header + "\n|" + "---|" * 12, flush=True)
    records, walls = [], {}
    cache = tempfile.mkdtemp(prefix="jaxpar-layer-times-")  # one profiling pass per M
    atexit.register(shutil.rmtree, cache, ignore_errors=True)
    rows = [r for r in ROWS if not args.schedules or r[0] in args.schedules]
    for m in args.microbatches:
        for schedule, remat, v in rows:
            for split in args.split:
                config = base.get_config()
                config.update_from_flattened_dict(
                    {
                        "model.name": "vgg19",
                        "model.width": args.width,
                        "data.name": "synthetic",
                        "global_batch_size": args.batch,
                        "mesh_shape": (1, k, 1),
                        "pipeline.schedule": schedule,
                        "pipeline.num_microbatches": m,
                        "pipeline.remat": remat,
                        "pipeline.virtual_stages": v,
                        "pipeline.split": split,
                    }
                )
                r = measure(config, jax.devices()[:k], args.steps, cache)
                name = f"{schedule} v={v}" if v > 1 else schedule
                walls[(name, remat, m, split)] = r.wall_step_s
                base_wall = walls.get((name, remat, m, "flops"))
                ratio = f"{r.wall_step_s / base_wall:.2f}" if split != "flops" and base_wall else ""
                setting = {"schedule": name, "remat": remat, "split": split, "M": m}
                records.append(setting | r.as_record())
                print(
                    f"| {name} | {remat} | {split} | {m} | {tuple(r.bounds)} | "
                    f"{r.step_gflops:.2f} | {max(r.stored_mb_per_stage):.2f} | "
                    f"{r.analytic_bubble:.3f} | {r.timeline_bubble:.3f} | "
                    f"{r.imbalance:.2f} | {r.wall_step_s:.3f} | {ratio} |",
                    flush=True,
                )
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(records, f, indent=1)


if __name__ == "__main__":
    log.setup()  # jaxpar's lines (the trainer's) on stdout
    main()
