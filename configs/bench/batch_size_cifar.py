"""Suite `batch_size_cifar`: seed 002's question on the CIFAR-shaped side. Does a VGG with
BatchNorm lose accuracy at a 16x larger batch, and which recipe holds it?

Run:  python -m jaxpar.bench --suite batch_size_cifar --out runs/batch_size_cifar
Expect 4 rows, then accuracy.md and the plot (not yet run to the end: its timing is unmeasured,
and rows at batch 2048 run slowly per image on CPUs). On CIFAR-10: --config.data.name=cifar10
(TFDS, prepared; its first 10,000 images with this suite's data.num_train).

VGG11 at width 1/8 with BatchNorm (145,898 parameters) on shapes10 (10,000 train images, 32x32x3,
2,000 test), 15 epochs at global batch 128 and 2048 on 8 data-parallel devices, SGD with
Nesterov momentum 0.9, weight decay 5e-4, cosine decay. The recipes of configs/bench/batch_size.py
(base lr 0.05 at batch 128): fixed lr at both batches; linear scaling with 2 epochs of warmup
and LARS (lr 15) with warmup at 2048.
"""

from __future__ import annotations

import ml_collections

from configs.bench import batch_size as digits_study
from configs.bench import suite

EPOCHS = 15
NUM_TRAIN = 10_000
RECIPES = {
    "fixed lr": (digits_study.RECIPES["fixed lr"][0], (128, 2048)),
    "linear + warmup": (digits_study.RECIPES["linear + warmup"][0], (2048,)),
    "LARS + warmup": (digits_study.RECIPES["LARS + warmup"][0], (2048,)),
}


def get_config() -> ml_collections.ConfigDict:
    rows = digits_study.rows(
        RECIPES,
        device_counts=(),
        num_train=NUM_TRAIN,
        epochs=EPOCHS,
        repeated=(),
        references=False,
        chunk=0,
    )
    # chunk=0: each device's batch in one piece (slices would give BatchNorm per-slice
    # statistics, which grad_accum_steps refuses)
    return suite(
        "configs/base.py",
        {
            "model.name": "vgg11",
            "model.width": 0.125,
            "model.batch_norm": True,
            "data.name": "shapes10",
            "data.num_train": NUM_TRAIN,
            "learning_rate": digits_study.BASE_LR,
            "lr_base_batch_size": digits_study.BASE_BATCH,
            "lr_schedule": "cosine",
            "optimizer.nesterov": True,
            "weight_decay": 5e-4,
            "eval_every_steps": 0,
            "eval_batch_size": 400,
            "eval_train_examples": 2000,
            "checkpoint_every_steps": 0,
        },
        rows,
    )
