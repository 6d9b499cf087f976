"""time_to_target.png: steps to the target against global batch (the steps model's curve from
the reference row, the measured rows on it) and time to the target per setup (measured beside
predicted)."""

from __future__ import annotations

from matplotlib.ticker import FuncFormatter

from jaxpar.bench import time_to_target as ttt
from jaxpar.bench.plots import common
from jaxpar.bench.plots.common import plt  # pyplot, with the Agg backend set
from jaxpar.bench.row_record import BenchRow, TargetRow


def time_to_target(rows: list[BenchRow], path: str) -> bool:
    """Left: steps to target against batch (log-log): the steps model's curves from the
    reference row (along its noise trace, and with one B_noise, dashed), measured points by
    family and sync mode. Right: time to target per row, measured and predicted bars. For
    rows annotated by jaxpar.bench.time_to_target (a time-to-target suite)."""
    ref = next((r for r in common.ok(rows) if _target(r).model_curve), None)
    if ref is None:
        return False
    rows = [r for r in common.ok(rows) if _target(r).reference_row == ref.name]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 6.2))
    batches = sorted({r.global_batch_size for r in rows})
    grid, trace, one = zip(*ref.target.model_curve)
    ax.plot(grid, trace, color="black", lw=1, label="predicted along the reference's noise trace")
    ax.plot(grid, one, color="grey", ls="--", lw=1, label="predicted with one B_noise")
    markers = common.markers(rows)
    kinds: dict[str, list[BenchRow]] = {}
    for r in rows:
        mode = r.sync_mode or "allreduce"
        key = common.family(r) + ("" if mode == "allreduce" else f", {mode}")
        if r.target.schedule_phases:
            key += ", goodput schedule"
        elif r.target.lr_adaptation == "adascale":
            key += ", AdaScale"
        kinds.setdefault(key, []).append(r)
    for key, sel in kinds.items():
        sel = [r for r in sel if r.steps_to_target]
        if sel:
            multiplied = [
                r
                for r in sel
                if r.target.sync_factor not in (None, 1.0) and r.predicted_steps_to_target
            ]
            if multiplied:  # the curve x the sync mode's multiplier, hollow
                ax.scatter(
                    [r.global_batch_size for r in multiplied],
                    [r.predicted_steps_to_target for r in multiplied],
                    marker=markers.get(key.split(",")[0], "o"),
                    s=50,
                    zorder=3,
                    facecolors="none",
                    edgecolors="grey",
                    label=f"predicted: {key} (x its step factor)",
                )
            ax.scatter(
                [r.global_batch_size for r in sel],
                [r.steps_to_target for r in sel],
                marker=markers.get(key.split(",")[0], "o"),
                s=50,
                zorder=3,
                label=f"measured: {key}",
            )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.set_xlabel("global batch size")
    ax.set_ylabel("steps to target")
    ax.grid(alpha=0.3)
    # under the axes: the points fill every corner
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2)
    ax.set_title("steps to target against batch\n(model from the reference row)")
    timed = [r for r in rows if r.time_to_target_s]
    names = [r.name for r in timed]
    y = range(len(timed))
    bx.barh(
        [i + 0.2 for i in y],
        [r.time_to_target_s for r in timed],
        height=0.4,
        label="measured [clock]",
    )
    bx.barh(
        [i - 0.2 for i in y],
        [r.predicted_time_to_target_s or 0 for r in timed],
        height=0.4,
        label="predicted (steps model x measured s/step)",
    )
    bx.set_yticks(list(y), names, fontsize=7)
    bx.invert_yaxis()
    bx.set_xscale("log")
    # plain seconds at 1, 2 and 5 of each decade (not 2x10^0, 3x10^0, ... crowding)
    plain = FuncFormatter(lambda v, _: f"{v:g}" if f"{v:.0e}"[0] in "125" else "")
    bx.xaxis.set_major_formatter(plain)
    bx.xaxis.set_minor_formatter(plain)
    bx.set_xlabel("training seconds to target (evaluations and compile excluded)")

    rho = ttt.summary(rows).spearman_time
    rho_text = "n/a" if rho is None else f"{rho:.2f}"
    return common.finish(fig, bx, path, f"time to target per setup (Spearman rho {rho_text})", 7)


def _target(r: BenchRow) -> TargetRow:
    """A row's time-to-target figures (none outside a time-to-target study)."""
    return r.target or TargetRow()
