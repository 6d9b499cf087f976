"""Benchmark suite `sync`: every synchronisation mode, local_sgd periods and async staleness,
on shapes10 with a fixed budget of steps. A suite is a base config, overrides for every row, and
rows of (name, overrides).

Run:  python benchmarks/sync_study.py --out /work/sync-out    (table, JSON lines, plot)
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
    suite = ml_collections.ConfigDict()
    suite.base = "configs/vgg19_sync.py"
    # (key, value) pairs: ConfigDict keys cannot hold dots.
    suite.overrides = (
        ("mesh_shape", (4, 1, 1)),
        ("model.name", "vgg11"),
        ("model.width", 0.125),
        ("global_batch_size", 64),
        ("num_train_steps", 300),
        ("learning_rate", 0.05),
        ("warmup_steps", 10),
        ("sync.batch_norm", "local"),  # the same BatchNorm policy for every row
        ("sync.mode", "allreduce"),
    )
    mode = lambda m: ("sync.mode", m)
    rows = [
        ("allreduce", ()),
        ("parameter_server", (mode("parameter_server"),)),
        ("sharded", (mode("sharded"),)),
        ("independent", (mode("independent"),)),
    ]
    rows += [(f"local_sgd p={p}", (mode("local_sgd"), ("sync.period", p))) for p in (1, 4, 16)]
    rows += [("async s=0", (mode("async"), ("sync.max_staleness", 0)))]
    for s in (2, 4, 8):
        for aware in (False, True):
            name = f"async s={s}" + (" aware" if aware else "")
            pairs = (mode("async"), ("sync.max_staleness", s), ("sync.staleness_aware_lr", aware))
            rows.append((name, pairs))
    suite.rows = tuple(rows)
    return suite
