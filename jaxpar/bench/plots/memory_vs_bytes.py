"""memory_vs_bytes.png: memory per device against communication per device per step, one
point per row."""

from __future__ import annotations

from jaxpar.bench.plots import common
from jaxpar.bench.plots.common import plt  # pyplot, with the Agg backend set
from jaxpar.bench.row_record import BenchRow


def _comm(r: BenchRow) -> int:
    """Bytes per device per step: the collectives of the busiest program group plus, for
    pipelines, the most stage-to-stage bytes one device receives (both per device)."""
    return r.collective_bytes_per_device + (r.stage_transfer_bytes_per_device or 0)


def _staged(r: BenchRow) -> bool:
    return common.num_stages(r) > 1


def memory_vs_bytes(rows: list[BenchRow], path: str, left_out: dict | None = None) -> bool:
    """Memory per device against communication per device per step (`_comm`). Pipeline rows
    recorded before their per-device stage transfers were (no
    stage_transfer_bytes_per_device) are left out and named in `left_out`."""
    rows = [r for r in common.ok(rows) if r.memory_bytes_per_device is not None]
    old = {
        r.name: "recorded without stage_transfer_bytes_per_device: measure it again"
        for r in rows
        if _staged(r) and r.stage_transfer_bytes_per_device is None
    }
    rows = [r for r in rows if r.name not in old]
    if len(rows) < 2:
        return False
    if left_out is not None:
        left_out.update(old)
    fig, ax = plt.subplots(figsize=(8, 5.5))
    markers = common.markers(rows)
    for fam, marker in markers.items():
        sel = [r for r in rows if common.family(r) == fam]
        if not sel:
            continue
        x = [_comm(r) / common.MIB for r in sel]
        y = [r.memory_bytes_per_device / common.MIB for r in sel]
        ax.scatter(x, y, marker=marker, s=50, label=fam)
        for xi, yi, r in zip(x, y, sel):
            if fam != "pipeline" or r.num_microbatches == 8 and r.pipeline_schedule == "1f1b":
                ax.annotate(
                    r.name.replace("pipeline", "pipe"),
                    (xi, yi),
                    fontsize=7,
                    xytext=(3, 3),
                    textcoords="offset points",
                )
    positive = [v for v in (_comm(r) / common.MIB for r in rows) if v > 0]
    ax.set_xscale("symlog", linthresh=min(positive) / 2 if positive else 1.0)
    ax.set_xlabel(
        "communication per device per step, MiB [exact]\n(collectives + stage-to-stage "
        "bytes received, each the busiest device's)"
    )
    ax.set_ylabel("memory per device, MiB [exact]\n(state + temporaries + stored activations)")
    return common.finish(
        fig, ax, path, "memory against communication, one point per partitioning", 8
    )
