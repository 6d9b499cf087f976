"""Suite `cifar_models`: seed 003's CIFAR-10 table. Does a model parallelise over 2 GPUs, and
is it too small to? For each CIFAR model of tf_cnn_benchmarks, 1 against 2 data-parallel
devices at the same batch per device (weak scaling, as tf_cnn_benchmarks runs), with the
model's parameters, the exact bytes each device exchanges per step, and (predicted.md) the
step predicted on two Tesla M60s beside the speedup the seed measured on them.

Run:  python -m jaxpar.bench --suite cifar_models --out runs/cifar_models
Expect 16 rows, results.md and predicted.md (about 20 minutes on 2 CPU cores; the
prediction compiles every row again for 2 abstract devices, about 3 of those minutes).

Rows: full-width models on synthetic CIFAR-shaped data (32x32x3, 10 classes), float32,
batch 128 per device (64 for the DenseNets: tf_cnn_benchmarks' defaults for these models, as
we read its model files), SGD with momentum; 12 steps, the first 2 not timed. The measured
speedup is of 2 simulated devices sharing this machine's cores [clock]; the bytes are the
compiled step's own [exact]. The seed ran TensorFlow 1.3 with the variables on the CPU
(parameter server) on Azure's 2x M60 (configs/hardware/m60_x2.py says how that is priced).
"""

from __future__ import annotations

import ml_collections

from configs.bench import row, suite

# Seed 003: az-2x-m60, TensorFlow 1.3.0, parameter server on the CPU, 2 GPUs.
SEED_EFFICIENCY = {
    "alexnet": 0.5870,
    "resnet20": 0.7565,
    "resnet32": 0.9993,
    "resnet44": 1.0328,
    "resnet56": 0.9983,
    "resnet110": 0.9604,
    "densenet40": 0.9994,
    "densenet100": 0.9889,
}
BATCH = {"densenet40": 64, "densenet100": 64}  # per device; 128 otherwise
STEPS = 12


def rows() -> tuple[dict, ...]:
    out = []
    for model, eff in SEED_EFFICIENCY.items():
        per_device = BATCH.get(model, 128)
        for n in (1, 2):
            out.append(
                row(
                    f"{model} {n}",
                    {
                        "model.name": model,
                        "mesh_shape": (n, 1, 1),
                        "global_batch_size": per_device * n,
                    },
                    group=model,
                    scaling="weak",
                    baseline=f"{model} 1",
                    reference_efficiency=eff if n == 2 else None,
                )
            )
    return tuple(out)


def get_config() -> ml_collections.ConfigDict:
    out = suite(
        "configs/base.py",
        {
            "model.width": 1.0,
            "sync.batch_norm": "local",  # tf_cnn_benchmarks: BatchNorm over each GPU's batch
            "data.name": "synthetic",
            "data.image_shape": (32, 32, 3),
            "data.num_classes": 10,
            "data.num_train": 512,
            "data.num_eval": 256,
            "num_train_steps": STEPS,
            "warmup_steps": 0,
            "log_every_steps": 4,
            "eval_every_steps": 0,
            "checkpoint_every_steps": 0,
        },
        rows(),
    )
    out.predict_profile = "configs/hardware/m60_x2.py"
    return out
