"""Benchmark suite `sync`: every synchronisation mode, local_sgd periods and async staleness,
on shapes10 with a fixed budget of steps. A suite is a base config, overrides for every row, and
rows (configs/bench/__init__.py).

Run:  python -m jaxpar.bench --suite sync --out /work/sync-bench   (the harness's table, bytes
      and memory from the compiled programs), or
      python benchmarks/sync_study.py --out /work/sync-out  (accuracy study: table, plot)
"""

import ml_collections

from configs.bench import row, suite


def get_config() -> ml_collections.ConfigDict:
    common = {
        "mesh_shape": (4, 1, 1),
        "model.name": "vgg11",
        "model.width": 0.125,
        "global_batch_size": 64,
        "num_train_steps": 300,
        "learning_rate": 0.05,
        "warmup_steps": 10,
        "sync.batch_norm": "local",  # the same BatchNorm policy for every row
        "sync.mode": "allreduce",
    }
    rows = [row("allreduce", {}, group="sync", scaling="none")]
    for mode in ("parameter_server", "sharded", "independent"):
        rows.append(row(mode, {"sync.mode": mode}, group="sync", scaling="none"))
    for p in (1, 4, 16):
        rows.append(
            row(
                f"local_sgd p={p}",
                {"sync.mode": "local_sgd", "sync.period": p},
                group="local_sgd",
                scaling="none",
            )
        )
    rows.append(
        row(
            "async s=0",
            {"sync.mode": "async", "sync.max_staleness": 0},
            group="async",
            scaling="none",
        )
    )
    for s in (2, 4, 8):
        for aware in (False, True):
            name = f"async s={s}" + (" aware" if aware else "")
            overrides = {
                "sync.mode": "async",
                "sync.max_staleness": s,
                "sync.staleness_aware_lr": aware,
            }
            rows.append(row(name, overrides, group="async", scaling="none"))
    return suite("configs/vgg19_sync.py", common, rows)
