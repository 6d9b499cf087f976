"""The synchronisation study: every `sync.mode` on shapes10 with a fixed budget of steps.

For each row of the suite configs/bench/sync.py: images/sec (median step, device synchronised,
compile and 3 warm-up steps excluded), bytes each device receives per step read from the
compiled program (largest and smallest device), optimizer state per device, and eval accuracy
after the budget (independent: replica 0, with the replicas' range).

    python benchmarks/sync_study.py --out /work/sync-out [--rows allreduce,async] [--steps N]
    python benchmarks/sync_study.py --out /work/sync-out --plot docs/sync_study.png  # plot only
    python benchmarks/sync_study.py --out /work/sync-out/lr0.02 --set learning_rate=0.02

Results go to OUT/results.jsonl (one line per row, appended as rows finish) and a markdown
table is printed at the end.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from jaxpar import configfile, log


def load(path: str):
    """A config or suite file, by its path from the repository root."""
    return configfile.load(os.path.join(ROOT, path))


def run_row(name: str, config, devices) -> dict:
    import jax
    import numpy as np

    from jaxpar import analysis, axes, run_setup
    from jaxpar.parallel.sync import traffic

    setup = run_setup.setup(config, devices)
    n = axes.num_replicas(dict(setup.mesh.shape))
    state = setup.strategy.init_state(jax.random.key(config.seed))
    batch = setup.strategy.put_batch(run_setup.local_train_batch(setup, 0))
    programs = analysis.programs(setup.strategy, config.global_batch_size)
    text = "\n".join(p.compiled.as_text() for p in programs)
    period = config.sync.period if config.sync.mode == "local_sgd" else 1
    received = traffic.bytes_per_step(text, n, period)
    opt = {}
    for leaf in jax.tree.leaves(state.opt_state):
        for shard in leaf.addressable_shards:
            opt[shard.device] = opt.get(shard.device, 0) + shard.data.nbytes
    times = []
    for i in range(config.num_train_steps):
        t0 = time.perf_counter()
        state, metrics = setup.strategy.train_step(state, batch)
        jax.block_until_ready(state)
        times.append(time.perf_counter() - t0)
        if i + 1 < config.num_train_steps:
            batch = setup.strategy.put_batch(run_setup.local_train_batch(setup, i + 1))
    evaluation = run_setup.evaluate(setup, state)
    return {
        "row": name,
        "learning_rate": config.learning_rate,
        "mode": config.sync.mode,
        "period": period,
        "staleness": config.sync.max_staleness if config.sync.mode == "async" else 0,
        "aware": bool(config.sync.staleness_aware_lr) if config.sync.mode == "async" else False,
        "images_per_sec": config.global_batch_size / float(np.median(times[3:])),
        "bytes_per_step_max": max(received),
        "bytes_per_step_min": min(received),
        "param_bytes": 4 * setup.model.num_params,
        "opt_bytes_per_device": max(opt.values()) if opt else 0,
        "final_loss": float(metrics["loss"]),
        **{f"eval_{k}": v for k, v in evaluation.items()},
    }


def table(results: list[dict]) -> str:
    mib = lambda b: f"{b / 2**20:.2f}"
    out = [
        "| row | img/s | MiB received/device/step (max / min) | optimizer MiB/device "
        + "| eval accuracy |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        acc = f"{r['eval_accuracy']:.3f}"
        if "eval_accuracy_min" in r:
            acc += f" (replicas {r['eval_accuracy_min']:.3f}-{r['eval_accuracy_max']:.3f})"
        out.append(
            f"| {r['row']} | {r['images_per_sec']:.0f} | {mib(r['bytes_per_step_max'])} / "
            f"{mib(r['bytes_per_step_min'])} | {mib(r['opt_bytes_per_device'])} | {acc} |"
        )
    return "\n".join(out)


def plot(results: list[dict], path: str) -> None:
    """Accuracy against local_sgd's period and against async staleness, one line per peak
    learning rate in `results`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    rates = sorted({r.get("learning_rate", 0.05) for r in results}, reverse=True)
    for i, lr in enumerate(rates):
        rows = [r for r in results if r.get("learning_rate", 0.05) == lr]
        color = f"C{i}"
        local = sorted((r["period"], r["eval_accuracy"]) for r in rows if r["mode"] == "local_sgd")
        if local:
            left.plot(*zip(*local), "o-", c=color, label=f"local_sgd, lr {lr}")
        for r in rows:
            if r["mode"] in ("allreduce", "independent"):
                style = "--" if r["mode"] == "allreduce" else ":"
                left.axhline(
                    r["eval_accuracy"], ls=style, c=color, lw=1, label=f"{r['mode']}, lr {lr}"
                )
        for aware, marker in ((False, "o-"), (True, "s--")):
            pts = sorted(
                (r["staleness"], r["eval_accuracy"])
                for r in rows
                if r["mode"] == "async" and (r["aware"] == aware or r["staleness"] == 0)
            )
            if pts:
                label = f"{'staleness-aware' if aware else 'plain'} lr {lr}"
                right.plot(*zip(*pts), marker, c=color, label=label)
    left.set(
        xscale="log",
        xlabel="sync.period (steps between averages)",
        ylabel="eval accuracy",
        title="Periodic parameter averaging (local_sgd)",
    )
    left.set_xticks([1, 4, 16], ["1", "4", "16"])
    right.set(
        xlabel="sync.max_staleness S (delays spread 0..S over 4 replicas)",
        ylabel="eval accuracy",
        title="Stale gradients (async)",
    )
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.set_ylim(0, 1)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--suite", default="configs/bench/sync.py")
    parser.add_argument("--out", default="/tmp/sync-out")
    parser.add_argument("--rows", default="", help="comma-separated row names (default: all)")
    parser.add_argument("--steps", type=int, default=0, help="override the suite's budget")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override every row, e.g. --set learning_rate=0.02",
    )
    parser.add_argument("--plot", default="", help="write the plot of OUT/results.jsonl here")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    results_path = os.path.join(args.out, "results.jsonl")
    if not args.plot or not os.path.exists(results_path):
        configfile.set_host_device_count(8)  # unless XLA_FLAGS already says
        import jax

        suite = load(args.suite)
        wanted = set(filter(None, args.rows.split(",")))
        for entry in suite.rows:
            name = entry["name"]
            if wanted and name not in wanted:
                continue
            config = configfile.override(load(suite.base), dict(suite.overrides))
            configfile.override(config, dict(entry["config"]))
            settings, _ = configfile.split_overrides(f"--config.{item}" for item in args.set)
            configfile.override(config, settings)
            if args.steps:
                config.num_train_steps = args.steps
            config.eval_every_steps = 0
            sizes = tuple(config.mesh_shape)  # the devices the row's mesh names, any axes
            n = math.prod(sizes) if -1 not in sizes else len(jax.devices())
            result = run_row(name, config, jax.devices()[:n])
            print(json.dumps(result), flush=True)
            with open(results_path, "a") as f:
                f.write(json.dumps(result) + "\n")
    with open(results_path) as f:
        results = [json.loads(line) for line in f]
    print(table(results))
    if args.plot:
        extra = []
        for name in sorted(os.listdir(args.out)):  # other sweeps kept in subfolders of OUT
            more = os.path.join(args.out, name, "results.jsonl")
            if os.path.exists(more):
                with open(more) as f:
                    extra += [json.loads(line) for line in f]
        plot(results + extra, args.plot)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    log.setup()  # jaxpar's lines (the trainer's) on stdout
    main()
