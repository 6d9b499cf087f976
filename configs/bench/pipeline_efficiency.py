"""Pipeline efficiency suite (issue 12): schedule x remat at K=4, M in {4, 8}.

Run:  python -m jaxpar.bench --suite pipeline_efficiency
Rows: GPipe, 1F1B and interleaved 1F1B (v=2), each recomputing the forward in the backward
(remat) or storing its residuals, ZB-H1 and ZB-V (residuals, B/W split), all with
FLOP-balanced stages; then 1F1B, ZB-H1 and ZB-V again with stages balanced by measured time
(`pipeline.split=time`: each row times the layers first). The harness records
wall step time, stored bytes per stage and the analytic and timeline bubbles; step FLOPs,
bounds, chunk imbalance and the time/flops wall ratio per row come from
`python -m jaxpar.bench.pipeline_efficiency --split flops time`.
"""

from __future__ import annotations

import ml_collections

from configs.bench import partitionings, row

SCHEDULES = (("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zb-h1", 1), ("zb-v", 1))
TIME_SPLIT = (("1f1b", True), ("1f1b", False), ("zb-h1", False), ("zb-v", False))


def rows() -> tuple[dict, ...]:
    out = []
    for m in (4, 8):
        for schedule, v in SCHEDULES:
            for remat in (True, False):
                if schedule.startswith("zb") and remat:
                    continue  # zero-bubble schedules split the backward over stored residuals
                overrides = {
                    "mesh_shape": (1, 4, 1),
                    "pipeline.schedule": schedule,
                    "pipeline.num_microbatches": m,
                    "pipeline.remat": remat,
                    "pipeline.virtual_stages": v,
                }
                name = f"pipeline 4 {schedule}{f' v={v}' if v > 1 else ''} M={m} remat={remat}"
                out.append(row(name, overrides, group=f"M={m}", scaling="none"))
        for schedule, remat in TIME_SPLIT:
            overrides = {
                "mesh_shape": (1, 4, 1),
                "pipeline.schedule": schedule,
                "pipeline.num_microbatches": m,
                "pipeline.remat": remat,
                "pipeline.split": "time",
            }
            name = f"pipeline 4 {schedule} M={m} remat={remat} split=time"
            out.append(row(name, overrides, group=f"M={m}", scaling="none"))
    return tuple(out)


def get_config() -> ml_collections.ConfigDict:
    suite = partitionings.get_config()
    suite.overrides["model.width"] = 0.125
    suite.rows = rows()
    return suite
