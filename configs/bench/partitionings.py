"""The default suite: every partitioning of one model on the devices present, side by side.

Run:  python -m jaxpar.bench [--out DIR] [--repeat N] [--config.model.width=0.125]
Expect 33 rows, about 40 minutes on 2 CPU cores at width 0.125, then the table and plots.

Same model, global batch and optimizer in every row: 1 device; data 2/4/8; the sharded data
parallelisms beside data 8: ZeRO-1 (sync.mode=sharded), FSDP over 8, HSDP (data 2 x fsdp 4)
and two-level data parallelism (node 2 x data 4); pipeline K=2/4/8 under GPipe and 1F1B with
M in {1, 4, 8}; tensor 2/4/8; hybrids (2,2,2), (4,2,1), (2,1,4), (1,4,2). Other studies (synchronisation modes, say) import `rows()` and add their own rows:

    from configs.bench import partitionings, row
    def get_config():
        suite = partitionings.get_config()
        suite.rows = partitionings.rows()[:4] + (
            row("data 8, parameter server", {"mesh_shape": (8, 1, 1),
                                              "sync.mode": "parameter_server"}, group="sync"),
        )
        return suite
"""

from __future__ import annotations

import ml_collections

from configs.bench import row, suite

HYBRIDS = ((2, 2, 2), (4, 2, 1), (2, 1, 4), (1, 4, 2))


def rows() -> tuple[dict, ...]:
    out = [row("1 device", {"mesh_shape": (1, 1, 1)}, group="baseline")]
    out += [row(f"data {n}", {"mesh_shape": (n, 1, 1)}, group="data") for n in (2, 4, 8)]
    out += sharded_data_rows()
    for k in (2, 4, 8):
        for schedule in ("gpipe", "1f1b"):
            for m in (1, 4, 8):
                overrides = {
                    "mesh_shape": (1, k, 1),
                    "pipeline.schedule": schedule,
                    "pipeline.num_microbatches": m,
                }
                group = "pipeline (1f1b, M=8)" if (schedule, m) == ("1f1b", 8) else ""
                out.append(row(f"pipeline {k} {schedule} M={m}", overrides, group=group))
    out += [row(f"tensor {t}", {"mesh_shape": (1, 1, t)}, group="tensor") for t in (2, 4, 8)]
    for shape in HYBRIDS:
        overrides = {"mesh_shape": shape, "pipeline.schedule": "1f1b"}
        if shape[1] > 1:
            overrides["pipeline.num_microbatches"] = 4
        out.append(row(f"hybrid {shape}", overrides))
    return tuple(out)


def sharded_data_rows() -> list[dict]:
    """Data parallelism over 8 devices with the state split four ways: ZeRO-1 (optimizer state
    over data), FSDP (parameters, gradients and optimizer state over fsdp, gathered per
    layer), HSDP (replicas of 2 over data, each sharded over fsdp 4), and node x data (the
    gradient all-reduce in two levels: what crosses node is 1/4 of it)."""
    return [
        row("data 8 ZeRO-1", {"mesh_shape": (8, 1, 1), "sync.mode": "sharded"}),
        row("fsdp 8", {"mesh_axes": ("fsdp",), "mesh_shape": (8,)}),
        row("data 2 x fsdp 4", {"mesh_axes": ("data", "fsdp"), "mesh_shape": (2, 4)}),
        row("node 2 x data 4", {"mesh_axes": ("node", "data"), "mesh_shape": (2, 4)}),
    ]


def get_config() -> ml_collections.ConfigDict:
    return suite(
        "configs/base.py",
        {
            "model.name": "vgg19",
            "model.width": 0.25,
            "global_batch_size": 64,
            "num_train_steps": 12,
            "learning_rate": 0.02,
            "lr_schedule": "constant",
            "warmup_steps": 0,
            "log_every_steps": 4,
            "eval_every_steps": 0,
            "checkpoint_every_steps": 0,
            "data.name": "shapes10",
            "data.num_eval": 512,
        },
        rows(),
    )
