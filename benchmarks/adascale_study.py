"""Does AdaScale make the steps to a target predictable at every batch? Runs each problem at
its reference batch B0 and at multiples of it under lr_adaptation=adascale, several seeds each,
and sets the measured steps to the target beside the steps the trace model predicts from the
reference runs (jaxpar/target/: S(B) integrated over each reference seed's noise trace, the
mean over the seeds) and beside the one-average model's.

    python benchmarks/adascale_study.py --out runs/adascale                   # every problem
    python benchmarks/adascale_study.py --out runs/adascale --problems digits --seeds 0
    python benchmarks/adascale_study.py --out runs/adascale --report-only     # tables only

Every run is a workdir OUT/PROBLEM/bBATCH_sSEED; a finished one is read, not run again, so
the study resumes. At the reference batch AdaScale's gain is 1: those runs are the plain
optimizer's. The tables go to OUT/adascale_study.md and OUT/adascale_study.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from jaxpar import configfile

configfile.set_host_device_count(8)


@dataclasses.dataclass(frozen=True)
class Problem:
    """A network, its data and a target it reaches in a few hundred steps at `batch`."""

    name: str
    batch: int  # B0: the reference batch, and the base batch of AdaScale's rate
    target: float  # test accuracy
    overrides: dict
    max_progress: int  # the run's length in progress (it stops at the target first)


COMMON = {
    "stop_at_target": True,
    "eval_batch_size": 1000,
    "checkpoint_every_steps": 0,
    "lr_schedule": "constant",
    "warmup_steps": 10,
    "log_every_steps": 50,
    "mesh_shape": (8, 1, 1),
    "lr_adaptation": "adascale",
}

PROBLEMS = {
    p.name: p
    for p in (
        Problem(
            "digits",
            64,
            0.9,
            {
                "model.name": "lenet",
                "model.width": 0.375,
                "model.batch_norm": False,
                "data.name": "digits",
                "data.num_eval": 2000,
                "learning_rate": 0.05,
            },
            2000,
        ),
        Problem(
            "shapes10",
            64,
            0.6,
            {
                "model.name": "vgg11",
                "model.width": 0.125,
                "model.batch_norm": False,
                "data.name": "shapes10",
                "data.num_eval": 1000,
                "learning_rate": 0.05,
            },
            4000,
        ),
        Problem(
            "digits-adam",
            64,
            0.95,
            {
                "model.name": "lenet",
                "model.width": 0.375,
                "model.batch_norm": False,
                "data.name": "digits",
                "data.num_eval": 2000,
                "optimizer.name": "adam",
                "learning_rate": 0.002,
            },
            3000,
        ),
    )
}
CHUNK = 32  # rows per device per accumulation slice: the same step, faster on these CPUs


def config_for(problem: Problem, batch: int, seed: int):
    from configs import base

    small = batch < problem.batch
    settings = {
        **COMMON,
        **problem.overrides,
        "seed": seed,
        "global_batch_size": batch,
        "lr_base_batch_size": problem.batch,
        "target_accuracy": problem.target,
        "num_train_steps": problem.max_progress,
        # the target is met somewhere in the eval interval before it is seen: 5 steps on the
        # long small-batch runs, 2 on the short large-batch ones
        "eval_every_steps": 5 if small else 2,
        "grad_accum_steps": max(1, batch // 8 // CHUNK),
    }
    return configfile.override(base.get_config(), settings)


def run(out: str, problem: Problem, batch: int, seed: int) -> dict:
    from jaxpar import metrics, trainer

    workdir = os.path.join(out, problem.name, f"b{batch}_s{seed}")
    done = metrics.last_summary(workdir) if os.path.isdir(workdir) else None
    if done is None:
        print(f"{problem.name} batch {batch} seed {seed}: training in {workdir}", flush=True)
        trainer.train_and_evaluate(config_for(problem, batch, seed), workdir)
    return {"workdir": workdir, "batch": batch, "seed": seed}


def report(out: str, problem: Problem, runs: list[dict]) -> tuple[list[dict], str]:
    """Per batch: the measured steps (each seed's, their mean) against the trace model's and
    the one-average model's predictions from the reference seeds (each seed's S(B), their
    mean)."""
    from jaxpar import metrics
    from jaxpar.target import reading

    refs = [
        reading.load(r["workdir"], problem.target)
        for r in runs
        if r["batch"] == problem.batch and _reached(r)
    ]
    rows = []
    for batch in sorted({r["batch"] for r in runs}):
        mine = [r for r in runs if r["batch"] == batch]
        steps = []
        for r in mine:
            summary = metrics.last_summary(r["workdir"])
            steps.append(summary.steps_to_target if summary is not None else None)
        reached = [s for s in steps if s is not None]
        trace = statistics.mean(ref.steps(batch) for ref in refs) if refs else None
        average = statistics.mean(ref.steps_one_average(batch) for ref in refs) if refs else None
        mean = statistics.mean(reached) if len(reached) == len(steps) else None
        rows.append(
            {
                "problem": problem.name,
                "batch": batch,
                "scale": batch / problem.batch,
                "steps": steps,
                "mean_steps": mean,
                "predicted_trace": trace,
                "error_trace": trace / mean - 1 if mean and trace else None,
                "predicted_one_average": average,
                "error_one_average": average / mean - 1 if mean and average else None,
            }
        )
    return rows, _table(problem, rows, len(refs))


def _reached(r: dict) -> bool:
    from jaxpar import metrics

    summary = metrics.last_summary(r["workdir"])
    return summary is not None and summary.steps_to_target is not None


def _table(problem: Problem, rows: list[dict], refs: int) -> str:
    pct = lambda e: "" if e is None else f"{100 * e:+.0f}%"
    lines = [
        (
            f"**{problem.name}** (B0 {problem.batch}, accuracy {problem.target}; predictions "
            f"from {refs} reference seeds)"
        ),
        "",
        (
            "| batch | scale | steps to target (per seed) | mean | predicted, trace | error | "
            "predicted, one average | error |"
        ),
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        seeds = ", ".join("not reached" if s is None else str(s) for s in r["steps"])
        mean = "" if r["mean_steps"] is None else f"{r['mean_steps']:.0f}"
        trace = "" if r["predicted_trace"] is None else f"{r['predicted_trace']:.0f}"
        avg = "" if r["predicted_one_average"] is None else f"{r['predicted_one_average']:.0f}"
        lines.append(
            f"| {r['batch']} | {r['scale']:g} | {seeds} | {mean} | {trace} | "
            f"{pct(r['error_trace'])} | {avg} | {pct(r['error_one_average'])} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--problems", default=",".join(PROBLEMS))
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--scales", default="1,0.25,4,16,32", help="batches as multiples of B0")
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args(argv)
    from jaxpar import log

    log.setup()
    seeds = [int(s) for s in args.seeds.split(",")]
    scales = [float(s) for s in args.scales.split(",")]
    tables, every = [], []
    for name in args.problems.split(","):
        problem = PROBLEMS[name]
        runs = []
        for scale in scales:
            for seed in seeds:
                batch = int(problem.batch * scale)
                if args.report_only:
                    workdir = os.path.join(args.out, name, f"b{batch}_s{seed}")
                    runs.append({"workdir": workdir, "batch": batch, "seed": seed})
                else:
                    runs.append(run(args.out, problem, batch, seed))
        rows, text = report(args.out, problem, runs)
        tables.append(text)
        every += rows
        print("\n" + text, flush=True)
    with open(os.path.join(args.out, "adascale_study.md"), "w", encoding="utf-8") as f:
        f.write("\n\n".join(tables) + "\n")
    with open(os.path.join(args.out, "adascale_study.json"), "w", encoding="utf-8") as f:
        json.dump(every, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
