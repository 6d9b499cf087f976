"""Run:  python -m jaxpar.bench --suite batch_size --out runs/batch_size

Seed 002's study: eval accuracy after a fixed number of epochs against the global batch
size, with linear learning-rate scaling (lr x batch / 256) on and off, on 8 data-parallel
devices. shapes10 by default; any prepared TFDS dataset with --config.data.name=cifar10.

A fixed number of epochs means fewer steps at larger batches: steps = epochs x N / batch.
"""

from __future__ import annotations

import ml_collections

from configs.bench import partitionings, row

EPOCHS = 2
NUM_TRAIN = 4096
BATCHES = (32, 64, 128, 256, 512)


def rows() -> tuple[dict, ...]:
    out = []
    for linear in (False, True):
        label = "linear lr" if linear else "fixed lr"
        for batch in BATCHES:
            overrides = {
                "mesh_shape": (8, 1, 1),
                "global_batch_size": batch,
                "num_train_steps": EPOCHS * NUM_TRAIN // batch,
                "lr_linear_scaling": linear,
                "log_every_steps": max(1, EPOCHS * NUM_TRAIN // batch // 4),
            }
            out.append(row(f"{label} batch {batch}", overrides, group=label, scaling="none"))
    return tuple(out)


def get_config() -> ml_collections.ConfigDict:
    suite = partitionings.get_config()
    suite.overrides.update(
        {
            "data.num_train": NUM_TRAIN,
            "learning_rate": 0.05,
            "lr_schedule": "cosine",
            "warmup_steps": 5,
        }
    )
    suite.rows = rows()
    return suite
