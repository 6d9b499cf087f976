"""Spatial partitioning beside the other splits: ResNet-50 at 224x224 on 8 devices.

Run:  python -m jaxpar.bench --suite spatial --out runs/bench_spatial
      python -m jaxpar.predict --suite configs/bench/spatial.py \\
          --profile configs/hardware/h100_sxm_x8.py --config.model.width=1.0 \\
          --config.model.dtype=bfloat16 --config.global_batch_size=256

Rows: 1 device; data 8; tensor 8; a 1F1B pipeline of 4 stages x data 2; spatial 2, 4 and 8
(the maps split by rows: ResNet-50's run on bands down to 14x14, 28x28 and 56x56 rows, then
join); and spatial with each other axis: data 2 x spatial 4 (the issue's command), spatial 4 x
tensor 2, stage 2 x spatial 4, fsdp 2 x spatial 4. Memory and bytes per device are exact (read
from the compiled programs), times are this machine's. At width 1/8 and batch 32 on 2 CPU cores
expect about 25 minutes.
"""

from __future__ import annotations

import ml_collections

from configs.bench import row, suite


def rows() -> tuple[dict, ...]:
    one = {"mesh_axes": ("data",), "mesh_shape": (1,)}
    return (
        row("1 device", one, group="baseline"),
        row("data 8", {"mesh_axes": ("data",), "mesh_shape": (8,)}, group="data"),
        row("tensor 8", {"mesh_axes": ("tensor",), "mesh_shape": (8,)}, group="tensor"),
        row(
            "data 2 x pipeline 4 1f1b M=4",
            {
                "mesh_axes": ("data", "stage"),
                "mesh_shape": (2, 4),
                "pipeline.schedule": "1f1b",
                "pipeline.num_microbatches": 4,
            },
            group="pipeline",
        ),
        *(
            row(f"spatial {n}", {"mesh_axes": ("spatial",), "mesh_shape": (n,)}, group="spatial")
            for n in (2, 4, 8)
        ),
        row("data 2 x spatial 4", {"mesh_axes": ("data", "spatial"), "mesh_shape": (2, 4)}),
        row("spatial 4 x tensor 2", {"mesh_axes": ("spatial", "tensor"), "mesh_shape": (4, 2)}),
        row(
            "stage 2 x spatial 4 1f1b M=4",
            {
                "mesh_axes": ("stage", "spatial"),
                "mesh_shape": (2, 4),
                "pipeline.schedule": "1f1b",
                "pipeline.num_microbatches": 4,
            },
        ),
        row("fsdp 2 x spatial 4", {"mesh_axes": ("fsdp", "spatial"), "mesh_shape": (2, 4)}),
    )


def get_config() -> ml_collections.ConfigDict:
    return suite(
        "configs/resnet50.py",
        {
            "model.width": 0.125,
            "global_batch_size": 32,
            "num_train_steps": 6,
            "log_every_steps": 2,
            "eval_every_steps": 0,
            "checkpoint_every_steps": 0,
            "data.num_eval": 64,
        },
        rows(),
    )
