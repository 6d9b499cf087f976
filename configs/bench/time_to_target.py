"""Suite `time_to_target`: how long does one network take to reach a target accuracy, at each
global batch, partitioning and sync mode, with a fixed rate rule, with AdaScale and under the
goodput schedule, and does the steps model (jaxpar/target/) predict it from one reference run?

Run:  python -m jaxpar.bench --suite time_to_target --out runs/time_to_target
Expect 14 rows (minutes on 2 CPU cores); time_to_target.md (measured against predicted
steps and time to target, one line per row, Spearman's rank correlation of the times below),
its .json and .csv, and time_to_target.png (steps against batch on the predicted curve; time to
target per setup). docs/time_to_target.md has the figures and what they mean.

Set-up: lenet at width 0.375 without BatchNorm on the embedded digits (60,000 train images;
2,000 test images evaluated every 5 steps), SGD with momentum 0.9 at a constant learning rate
after 10 warmup steps, target test accuracy 0.9, each run stopped at the first evaluation that
reaches it. The fixed rows' rate follows the noise scale's rule (--config.lr_noise_scale,
McCandlish et al. 2018): 0.05 at the reference batch 64, eps(B) = eps_max / (1 + B_noise / B)
with B_noise = NOISE_SCALE, measured at batch 64 (below). The AdaScale
rows and the goodput schedule take 0.05 at batch 64 times AdaScale's gain, step by step.

The first row is the reference: the steps model takes its noise trace alone, and predicts every
other row's steps (x the sync mode's step factor) and its time (predicted steps x the row's own
median step time; the goodput row: its schedule simulated on the fixed rows' step times).
Large batches run each device's share in slices of 16 rows (grad_accum_steps: the same step,
faster on these CPUs).
"""

from __future__ import annotations

import ml_collections

from configs.bench import row, suite

REFERENCE_BATCH = 64
# B_noise at batch 64 (digits, lenet 0.375, to accuracy 0.9), from one run of the reference
# row; the suite prints the reference's own as "one B_noise" (docs/time_to_target.md, "The
# suite"), which moves a little from run to run. A constant, so that the rows' rates are fixed.
NOISE_SCALE = 39.4
TARGET = 0.9
CHUNK = 16  # rows per device per slice of gradient accumulation


def data_row(batch: int, name: str = "", group: str = "data", **extra) -> dict:
    """Data parallelism over 8 devices at `batch`, each device's share in CHUNK-row slices."""
    keys = {
        "mesh_shape": (8, 1, 1),
        "num_devices": 8,
        "global_batch_size": batch,
        "grad_accum_steps": max(1, batch // 8 // CHUNK),
        **extra,
    }
    return row(name or f"data 8, batch {batch}", keys, group=group, scaling="none")


def device_row(batch: int, n: int) -> dict:
    """Seed 002's question: the reference batch on fewer devices (1 device: two accumulation
    slices, so that the step still has two gradient sizes). The same steps; another clock."""
    keys = {
        "mesh_shape": (n, 1, 1),
        "num_devices": n,
        "global_batch_size": batch,
        "grad_accum_steps": 2 if n == 1 else 1,
    }
    return row(f"data {n}, batch {batch}", keys, group="devices", scaling="none")


ADASCALE = {"lr_adaptation": "adascale", "lr_noise_scale": 0.0}  # the gain scales the rate


def adascale_row(batch: int) -> dict:
    """AdaScale at `batch`: the rate at the reference batch times the gain, step by step."""
    return data_row(batch, f"AdaScale, batch {batch}", group="adascale", **ADASCALE)


def goodput_row() -> dict:
    """The goodput schedule from the reference batch: every 20 steps the batch with the most
    progress per second at the noise scale of the moment (lr_base_batch_size x 1/4 .. x 32),
    in CHUNK-row slices, its step time measured on first use."""
    keys = {
        **ADASCALE,
        "mesh_shape": (8, 1, 1),
        "num_devices": 8,
        "global_batch_size": REFERENCE_BATCH,
        "batch_schedule": "goodput",
        "goodput.every_steps": 20,
        "goodput.max_device_rows": CHUNK,
        "log_every_steps": 10,
    }
    return row("goodput schedule, from batch 64", keys, group="goodput", scaling="none")


def rows() -> tuple[dict, ...]:
    b0 = REFERENCE_BATCH
    return (
        data_row(b0, f"data 8, batch {b0} (reference)"),
        data_row(16),
        data_row(256),
        data_row(1024),
        *(adascale_row(b) for b in (16, 256, 1024)),
        goodput_row(),
        row(
            "data 2 x tensor 4, batch 32",
            {"mesh_shape": (2, 1, 4), "num_devices": 8, "global_batch_size": 32},
            group="hybrid",
            scaling="none",
        ),
        data_row(
            b0, f"local SGD period 4, batch {b0}", **{"sync.mode": "local_sgd", "sync.period": 4}
        ),
        data_row(
            b0, f"async staleness 1, batch {b0}", **{"sync.mode": "async", "sync.max_staleness": 1}
        ),
        *(device_row(b0, n) for n in (1, 2, 4)),
    )


def get_config() -> ml_collections.ConfigDict:
    out = suite(
        "configs/base.py",
        {
            "model.name": "lenet",
            "model.width": 0.375,
            "model.batch_norm": False,
            "data.name": "digits",
            "data.num_eval": 2000,
            "target_accuracy": TARGET,
            "stop_at_target": True,
            "eval_every_steps": 5,
            "eval_batch_size": 1000,
            "num_train_steps": 2000,  # a cap: every row stops at the target long before
            "learning_rate": 0.05,
            "lr_base_batch_size": REFERENCE_BATCH,
            "lr_noise_scale": NOISE_SCALE,
            "lr_schedule": "constant",
            "warmup_steps": 10,  # the large batches' first steps repeatable
            "log_every_steps": 100,
            "checkpoint_every_steps": 0,
        },
        rows(),
    )
    out.reference_row = rows()[0]["name"]
    return out
