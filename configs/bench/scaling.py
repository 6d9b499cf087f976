"""Strong scaling (fixed global batch) and weak scaling (fixed batch per device) over 1, 2, 4
and 8 devices, for data, pipeline (1F1B, M=8) and tensor partitioning (seed 003's table).

Run:  python -m jaxpar.bench --suite scaling --out runs/scaling [--repeat 3]
Expect 20 rows and scaling_strong.png / scaling_weak.png (about 20 minutes on 2 cores).
"""

from __future__ import annotations

import ml_collections

from configs.bench import partitionings, row

PER_DEVICE_BATCH = 16


def _mesh(kind: str, n: int) -> tuple[int, int, int]:
    return {"data": (n, 1, 1), "pipeline": (1, n, 1), "tensor": (1, 1, n)}[kind]


def rows() -> tuple[dict, ...]:
    pipe = {"pipeline.schedule": "1f1b", "pipeline.num_microbatches": 8}
    out = [row("strong 1 device", {"mesh_shape": (1, 1, 1)}, group="baseline")]
    out.append(
        row(
            "weak 1 device",
            {"mesh_shape": (1, 1, 1), "global_batch_size": PER_DEVICE_BATCH},
            group="baseline",
            scaling="weak",
        )
    )
    for kind in ("data", "pipeline", "tensor"):
        extra = pipe if kind == "pipeline" else {}
        for n in (2, 4, 8):
            out.append(
                row(f"strong {kind} {n}", {"mesh_shape": _mesh(kind, n), **extra}, group=kind)
            )
            # Weak scaling: the batch grows with the devices, so each device's work per step
            # stays that of one device on PER_DEVICE_BATCH images (a stage does 1/K of the
            # layers over K times the images); pipelines keep 8 micro-batches.
            batch = PER_DEVICE_BATCH * n
            out.append(
                row(
                    f"weak {kind} {n}",
                    {"mesh_shape": _mesh(kind, n), "global_batch_size": batch, **extra},
                    group=kind,
                    scaling="weak",
                )
            )
    return tuple(out)


def get_config() -> ml_collections.ConfigDict:
    suite = partitionings.get_config()
    suite.rows = rows()
    return suite
