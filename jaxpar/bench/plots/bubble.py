"""bubble.png: pipeline bubble against micro-batches, the analytic curve per K and the
measured points per schedule."""

from __future__ import annotations

from jaxpar.bench.plots import common
from jaxpar.bench.plots.common import plt  # pyplot, with the Agg backend set
from jaxpar.bench.row_record import BenchRow


def bubble(rows: list[BenchRow], path: str) -> bool:
    rows = [
        r
        for r in common.ok(rows)
        if r.analytic_bubble is not None and common.family(r) == "pipeline"
    ]
    if not rows:
        return False
    fig, ax = plt.subplots(figsize=(7, 4.5))
    stages = sorted({common.num_stages(r) for r in rows})
    colors = dict(zip(stages, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    top = max(r.num_microbatches for r in rows)
    ms = [m / 4 for m in range(4, 4 * top + 1)]
    for k in stages:
        ax.plot(
            ms,
            [(k - 1) / (m + k - 1) for m in ms],
            color=colors[k],
            lw=1,
            label=f"K={k} analytic (K-1)/(M+K-1)",
        )
    for schedule, marker in (("gpipe", "o"), ("1f1b", "x"), ("naive", "s")):
        for k in stages:
            sel = [
                r
                for r in rows
                if r.pipeline_schedule == schedule
                and common.num_stages(r) == k
                and r.measured_bubble is not None
            ]
            if sel:
                ax.scatter(
                    [r.num_microbatches for r in sel],
                    [r.measured_bubble for r in sel],
                    marker=marker,
                    color=colors[k],
                    label=f"K={k} {schedule} measured",
                )
    ax.set_xlabel("micro-batches M")
    ax.set_ylabel("bubble (idle fraction of the step)")
    ax.set_ylim(0, 1)
    title = "pipeline bubble: analytic curve, measured stage-time timeline points"
    return common.finish(fig, ax, path, title, 7, ncol=2)
