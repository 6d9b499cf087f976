"""Suite `batch_size`: seed 002's study. Does accuracy hold as the global batch grows, and which
large-batch recipe recovers what it loses?

Run:  python -m jaxpar.bench --suite batch_size --out runs/batch_size
Expect 21 rows (most of an hour on 2 CPU cores; `--only '^(fixed lr|LARS)'` runs 15 of
them), then the study table (accuracy.md: the seed's format, its
figures beside jaxpar's) and accuracy_vs_batch.png. On the real MNIST: --config.data.name=mnist
(TFDS, prepared; its first 20,000 train images). The seed's full 60,000 images: set NUM_TRAIN
below (the rows' step counts are derived from it), about three times as long.

Seed 002 trained Keras' mnist_cnn (lenet here, with its dropouts) for 12 epochs at global batch
128 to 4096 on 1-8 GPUs. Here: the embedded digits (MNIST-shaped), 12 epochs of 20,000 train
images (a third of MNIST, so that the study fits on 2 cores: a batch of 4096 then gets 58 steps
where the seed's had 176), the full 10,000 test images, lenet at width 0.375 (channels 12, 24, dense 48), SGD with Nesterov
momentum 0.9, weight decay 1e-3, cosine decay, on 8 data-parallel devices (data parallelism
computes the one-device function, so the device count changes only the clock: the `devices`
rows show it). Recipes, each row's learning rate from the same base (0.05 at batch 128):
  fixed lr         0.05 at every batch (the seed's setting: its optimizer kept one rate);
  linear           0.05 x batch / 128 (Goyal et al. 2017), no warmup;
  linear + warmup  the same, rising from 0 over the first 2 epochs (Goyal et al.'s warmup);
  LARS + warmup    optax.lars (You et al. 2017), lr 15 (trust coefficient 0.001), 2 epochs
                   of warmup.
The baseline (fixed lr, 128) and the largest batch under LARS run 3 seeds each, so a loss can be
told from noise. Each row also evaluates 5,000 train images in inference mode: the train/test
gap.
"""

from __future__ import annotations

import ml_collections

from configs.bench import row, suite

EPOCHS = 12
NUM_TRAIN = 20_000
BASE_BATCH = 128
BASE_LR = 0.05
LARS_LR = 15.0
WARMUP_EPOCHS = 2
DEVICES = 8
SEEDS = (0, 1, 2)
CHUNK = 16  # rows per device per slice of gradient accumulation

# Seed 002's validation accuracy (Keras mnist_cnn, 12 epochs, 60,000 MNIST images), the range
# over its infrastructures where it ran a setting more than once: by batch, and at batch 128 by
# GPU count.
SEED_BY_BATCH = {
    128: (0.9884, 0.9905),
    512: 0.9872,
    1024: (0.9844, 0.9852),
    2048: (0.9765, 0.9790),
    4096: 0.9633,
}
SEED_AT_128_BY_GPUS = {
    1: (0.9884, 0.9901),
    2: (0.9891, 0.9901),
    4: (0.9891, 0.9905),
    8: (0.9895, 0.9899),
}

RECIPES = {
    "fixed lr": ({}, (128, 512, 1024, 2048, 4096)),
    "linear": ({"lr_linear_scaling": True}, (512, 1024)),
    "linear + warmup": ({"lr_linear_scaling": True, "warmup": True}, (512, 1024, 2048, 4096)),
    "LARS + warmup": (
        {"optimizer.name": "lars", "learning_rate": LARS_LR, "warmup": True},
        (1024, 2048, 4096),
    ),
}
REPEATED = {("fixed lr", 128), ("LARS + warmup", 4096)}


def steps(batch: int, num_train: int = NUM_TRAIN, epochs: int = EPOCHS) -> int:
    """Steps of `epochs` epochs at `batch` (the last partial batch of the run dropped)."""
    return epochs * num_train // batch


def recipe(
    keys: dict,
    batch: int,
    devices: int = DEVICES,
    num_train: int = NUM_TRAIN,
    epochs: int = EPOCHS,
    chunk: int = CHUNK,
) -> dict:
    """The overrides of one recipe at one batch: `epochs` epochs of `num_train` images, each
    device's batch in slices of `chunk` rows (0: in one piece)."""
    keys = dict(keys)
    warmup = keys.pop("warmup", False)
    n = steps(batch, num_train, epochs)
    return {
        **keys,
        "mesh_shape": (devices, 1, 1),
        "num_devices": devices,
        "global_batch_size": batch,
        "num_train_steps": n,
        "warmup_steps": max(1, round(n * WARMUP_EPOCHS / epochs)) if warmup else 0,
        "log_every_steps": max(1, n // 4),
        # The same step in slices of 16 rows per device: on this CPU a convolution over 512
        # rows runs at a quarter of the per-image rate of one over 16 (cache), see docs/results.md.
        "grad_accum_steps": max(1, batch // devices // chunk) if chunk else 1,
    }


def rows(
    recipes=None,
    device_counts=(1, 2, 4),
    num_train: int = NUM_TRAIN,
    epochs: int = EPOCHS,
    repeated=REPEATED,
    references=True,
    chunk: int = CHUNK,
) -> tuple[dict, ...]:
    """Every recipe at its batches on DEVICES devices (`repeated` settings under every seed),
    then batch 128 on each of `device_counts`; seed 002's figures beside if `references`."""
    out = []
    for name, (keys, batches) in (RECIPES if recipes is None else recipes).items():
        for batch in batches:
            label = f"{name} {batch}"
            seeds = SEEDS if (name, batch) in repeated else SEEDS[:1]
            ref = SEED_BY_BATCH.get(batch) if name == "fixed lr" and references else None
            for seed in seeds:
                row_name = label if seed == 0 else f"{label} seed {seed}"
                overrides = {**recipe(keys, batch, DEVICES, num_train, epochs, chunk), "seed": seed}
                out.append(
                    row(row_name, overrides, group=name, scaling="none", label=label, reference=ref)
                )
    for n in device_counts:  # the seed's GPU counts at batch 128 (8 devices: "fixed lr 128")
        name = f"fixed lr 128, {n} device{'s' * (n > 1)}"
        overrides = recipe({}, BASE_BATCH, n, num_train, epochs, chunk)
        out.append(
            row(name, overrides, group="devices", scaling="none", reference=SEED_AT_128_BY_GPUS[n])
        )
    return tuple(out)


def get_config() -> ml_collections.ConfigDict:
    out = suite(
        "configs/base.py",
        {
            "model.name": "lenet",
            "model.width": 0.375,
            "model.batch_norm": False,
            "model.dropout": True,
            "data.name": "digits",
            "data.num_train": NUM_TRAIN,
            "learning_rate": BASE_LR,
            "lr_base_batch_size": BASE_BATCH,
            "lr_schedule": "cosine",
            "optimizer.nesterov": True,
            "weight_decay": 1e-3,
            "eval_every_steps": 0,
            "eval_batch_size": 1000,
            "eval_train_examples": 5000,
            "checkpoint_every_steps": 0,
        },
        rows(),
    )
    out.reference_name = "seed 002 (Keras, MNIST, GPUs)"
    return out
