"""Suite `input_pipeline`: when does the loader, not the devices, limit throughput?

A cheap model (LeNet at width 0.25) on three loaders, at 1, 2, 4 and 8 data-parallel devices:
`synthetic` (a pool of random images: one gather per batch), `shapes10 augmented` (the embedded
dataset with pad-crop-flip on the host) and `cifar10` from TFDS (records read and PNG-decoded
per batch). Each row reports its loader's capacity (global batch / host batch time) against
the images/sec it reached and whether it was input-bound (docs/results.md, "What the input pipeline
costs"). The cifar10 rows need it prepared (`--config.data.data_dir=DIR`); where it is not,
they are recorded as failed with the one-line reason and the other rows run.

Run:  python -m jaxpar.bench --suite input_pipeline --out runs/input
Expect 12 rows in about 1.5 minutes on 2 CPU cores (the cifar10 rows fail in seconds where it
is not prepared).
"""

from __future__ import annotations

import ml_collections

from configs.bench import row, suite

LOADERS = {
    "synthetic": {"data.name": "synthetic"},
    "shapes10 augmented": {"data.name": "shapes10", "data.augment": True},
    "cifar10": {"data.name": "cifar10", "data.augment": True},
}
DEVICES = (1, 2, 4, 8)


def rows() -> tuple[dict, ...]:
    out = []
    for loader, keys in LOADERS.items():
        for n in DEVICES:
            name = f"{loader} {n}"
            overrides = {**keys, "mesh_shape": (n, 1, 1)}
            out.append(row(name, overrides, group=loader, baseline=f"{loader} 1"))
    return tuple(out)


def get_config() -> ml_collections.ConfigDict:
    return suite(
        "configs/base.py",
        {
            "model.name": "lenet",
            "model.width": 0.25,
            "model.batch_norm": False,
            "global_batch_size": 256,
            "num_train_steps": 20,
            "learning_rate": 0.02,
            "lr_schedule": "constant",
            "warmup_steps": 0,
            "log_every_steps": 10,
            "eval_every_steps": 0,
            "checkpoint_every_steps": 0,
            "data.num_train": 4096,
            "data.num_eval": 256,
        },
        rows(),
    )
