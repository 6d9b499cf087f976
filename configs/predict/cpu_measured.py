"""Rows measured on this machine with `python -m jaxpar.train` (VGG19 width 0.125, BatchNorm,
shapes10, global batch 64, 20 steps), to compare with the CPU profile's predictions.

Run:  python -m jaxpar.predict --profile configs/hardware/cpu_2core.py --suite configs/predict/cpu_measured.py

Each row ran in its own process with `--config.host_device_count` = its device count.
"""

import ml_collections

PIPE = {"pipeline.schedule": "1f1b", "pipeline.num_microbatches": 4}
ROWS = (
    ("1 device", (1, 1, 1), {}),
    ("data 2", (2, 1, 1), {}),
    ("data 8", (8, 1, 1), {}),
    ("pipeline 4 1f1b M=4", (1, 4, 1), PIPE),
    ("tensor 2", (1, 1, 2), {}),
    ("hybrid (2,2,2) 1f1b M=4", (2, 2, 2), PIPE),
)


def get_config():
    suite = ml_collections.ConfigDict()
    suite.base = "configs/base.py"
    suite.overrides = ml_collections.ConfigDict(allow_dotted_keys=True)  # "model.width": ...
    suite.overrides.update({"model.width": 0.125, "global_batch_size": 64})
    suite.rows = tuple(
        {"name": name, "config": {"mesh_shape": shape, **extra}} for name, shape, extra in ROWS
    )
    return suite
