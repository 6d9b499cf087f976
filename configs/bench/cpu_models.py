"""Suite `cpu_models`: one device, seven models: what this machine's profile
(configs/hardware/cpu_2core.py, fitted to VGG19 alone) is checked against across models.

Run:  python -m jaxpar.bench --suite cpu_models --out runs/cpu_models --repeat 2
      python -m jaxpar.predict --validate --profile configs/hardware/cpu_2core.py

Each row is one model on one simulated device at a width and input size this machine trains
in a fraction of a second a step (synthetic data, 10 classes, float32, BatchNorm), with the
default suite's optimizer and steps. The first row is the default suite's own 1-device row
(VGG19 at width 0.25, batch 64) on synthetic data in place of shapes10: it says whether the
two harnesses agree. The measured images/sec [clock] are the profile's
`calibration_candidates`: never fitted, each predicted by `--validate` from a fit on the
other models' rows.
"""

from __future__ import annotations

import ml_collections

from configs.bench import partitionings, row, suite

# (model, width, image side, batch)
MODELS = (
    ("vgg19", 0.25, 32, 64),
    ("resnet20", 1.0, 32, 64),
    ("vgg16", 0.25, 32, 64),
    ("resnet50", 0.25, 64, 32),
    ("alexnet", 0.25, 64, 64),
    ("inception_v3", 0.25, 75, 16),
    ("densenet40", 1.0, 32, 32),
)


def rows() -> tuple[dict, ...]:
    return tuple(
        row(
            f"{model} {width:g} {side} b{batch}",
            {
                "model.name": model,
                "model.width": width,
                "data.image_shape": (side, side, 3),
                "global_batch_size": batch,
                "mesh_shape": (1, 1, 1),
            },
            group="models",
            scaling="none",
        )
        for model, width, side, batch in MODELS
    )


def get_config() -> ml_collections.ConfigDict:
    common = dict(partitionings.get_config().overrides)
    common |= {
        "data.name": "synthetic",
        "data.num_classes": 10,
        "data.num_train": 512,
        "data.num_eval": 256,
    }
    return suite("configs/base.py", common, rows())
