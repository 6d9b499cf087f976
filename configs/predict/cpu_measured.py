"""Rows measured on this machine with `python -m jaxpar.train` (VGG19 width 0.125, BatchNorm,
shapes10, global batch 64, 20 steps), to compare with the CPU profile's predictions.

Run:  python -m jaxpar.predict --profile configs/hardware/cpu_2core.py --suite configs/predict/cpu_measured.py

Each row ran in its own process, 8 simulated devices, the first N used (the 2-device row
deadlocked in XLA:CPU's all-reduce rendezvous under load when the process had only 2
simulated devices), via `trainer.train_and_evaluate(config, workdir, jax.devices()[:N])`.
Two rounds, rows interleaved; the machine was shared with other jobs (load average 8-13).
"""

from configs.bench import suite

PIPE = {"pipeline.schedule": "1f1b", "pipeline.num_microbatches": 4}
# (name, mesh, overrides, measured images/sec: mean of two runs, each the median of 20 steps)
ROWS = (
    ("1 device", (1, 1, 1), {}, (323.4 + 363.6) / 2),
    ("data 2", (2, 1, 1), {}, (494.1 + 437.1) / 2),
    ("data 8", (8, 1, 1), {}, (514.8 + 181.7) / 2),
    ("pipeline 4 1f1b M=4", (1, 4, 1), PIPE, (219.3 + 416.6) / 2),
    ("tensor 2", (1, 1, 2), {}, (423.5 + 400.3) / 2),
    ("hybrid (2,2,2) 1f1b M=4", (2, 2, 2), PIPE, (267.6 + 252.3) / 2),
)


def get_config():
    rows = (
        {"name": name, "config": {"mesh_shape": shape, **extra}, "reference": measured}
        for name, shape, extra, measured in ROWS
    )
    return suite("configs/base.py", {"model.width": 0.125, "global_batch_size": 64}, rows)
