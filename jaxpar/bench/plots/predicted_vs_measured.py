"""predicted_vs_measured.png: predicted against measured images/sec, one point per row."""

from __future__ import annotations

from jaxpar.bench import predicted
from jaxpar.bench.plots import common
from jaxpar.bench.plots.common import plt  # pyplot, with the Agg backend set
from jaxpar.bench.row_record import BenchRow

BAND = 0.15  # the +-15% band around y = x
LABELLED = 3  # the rows with the largest |error| named on the plot


def predicted_vs_measured(rows: list[BenchRow], path: str) -> bool:
    """Predicted against measured images/sec, log-log, for the rows that have both figures."""
    rows = [r for r in common.ok(rows) if r.predicted_error is not None]
    if not rows:
        return False
    fig, ax = plt.subplots(figsize=(7, 5.5))
    x = [r.images_per_sec for r in rows]
    y = [r.predicted_images_per_sec for r in rows]
    lo, hi = min(x + y) / 1.5, max(x + y) * 1.5
    line = [lo, hi]
    ax.plot(line, line, color="black", lw=0.8, label="predicted = measured")
    ax.fill_between(
        line,
        [v * (1 - BAND) for v in line],
        [v * (1 + BAND) for v in line],
        color="grey",
        alpha=0.2,
        label=f"±{100 * BAND:.0f}%",
    )
    markers = common.markers(rows)
    for fam, marker in markers.items():
        sel = [r for r in rows if common.family(r) == fam]
        if sel:
            ax.scatter(
                [r.images_per_sec for r in sel],
                [r.predicted_images_per_sec for r in sel],
                marker=marker,
                s=50,
                label=fam,
                zorder=3,
            )
    worst = sorted(rows, key=lambda r: -abs(r.predicted_error))[:LABELLED]
    for r in worst:
        ax.annotate(
            f"{r.name} ({100 * r.predicted_error:+.0f}%)",
            (r.images_per_sec, r.predicted_images_per_sec),
            fontsize=7,
            xytext=(4, -10),
            textcoords="offset points",
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured images/sec [clock]")
    profile = next((r.predicted_profile for r in rows if r.predicted_profile), "")
    ax.set_ylabel(f"predicted images/sec\n{profile}" if profile else "predicted images/sec")
    s = predicted.prediction_summary(rows)
    rho = "n/a" if s.spearman is None else f"{s.spearman:.2f}"
    title = (
        f"predicted against measured images/sec\n{s.n} rows: median |error| "
        f"{100 * s.median_abs_error:.1f}%, Spearman rho {rho}"
    )
    return common.finish(fig, ax, path, title, 8, loc="upper left")
