"""scaling_strong.png / scaling_weak.png: images/sec and efficiency against devices, one
line per partitioning group; rows it cannot place are named (`unplaced`)."""

from __future__ import annotations

from jaxpar.bench.plots import common
from jaxpar.bench.plots.common import plt  # pyplot, with the Agg backend set
from jaxpar.bench.row_record import BenchRow


def unplaced(rows: list[BenchRow], kind: str) -> dict[str, str]:
    """The rows of a `kind` ("strong"/"weak") scaling study that its plot cannot place, or
    places only in part, with why: failed rows, rows without a group (not on a scaling line:
    e.g. a bubble study's), rows without images/sec, baseline rows after the first (the first
    starts every line), and rows without an efficiency (no baseline: their throughput is
    drawn, their efficiency is not)."""
    out: dict[str, str] = {}
    base_seen = False
    for r in rows:
        if r.scaling != kind:
            continue
        if r.status != "ok":
            out[r.name] = "failed"
        elif not r.group:
            out[r.name] = "no group in the suite"
        elif not r.images_per_sec:
            out[r.name] = "no images/sec"
        elif r.group == "baseline":
            if base_seen:
                out[r.name] = "a second baseline; the first starts every line"
            base_seen = True
        elif r.efficiency is None:
            out[r.name] = "no baseline: images/sec drawn, not efficiency"
    return out


def scaling(rows: list[BenchRow], kind: str, path: str, left_out: dict | None = None) -> bool:
    """Images/sec and efficiency against devices, one line per group. Rows it cannot place
    (`unplaced`) are named in a note on the figure and in `left_out`, never dropped
    silently."""
    missing = unplaced(rows, kind)
    rows = [r for r in common.ok(rows) if r.scaling == kind and r.group and r.images_per_sec]
    base = [r for r in rows if r.group == "baseline"]
    groups = sorted({r.group for r in rows} - {"baseline"})
    if not groups:
        return False
    if left_out is not None:
        left_out.update(missing)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for g in groups:
        line = sorted(base[:1] + [r for r in rows if r.group == g], key=lambda r: r.num_devices)
        n = [r.num_devices for r in line]
        ax1.errorbar(
            n,
            [r.images_per_sec for r in line],
            marker="o",
            label=g,
            capsize=3,
            yerr=[r.images_per_sec_stderr or 0 for r in line],
        )
        rated = [r for r in line if r.efficiency is not None]
        ax2.plot([r.num_devices for r in rated], [r.efficiency for r in rated], marker="o", label=g)
    top = max(r.num_devices for r in rows)
    ax2.axhline(1.0, color="grey", lw=0.8, ls="--")
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xlim(0.8, top * 1.25)  # also where no row has an efficiency to draw
        ax.set_xticks(
            [n for n in (1, 2, 4, 8, 16, 32) if n <= top],
            [str(n) for n in (1, 2, 4, 8, 16, 32) if n <= top],
        )
        ax.set_xlabel("devices")
        ax.grid(alpha=0.3)
    ax1.set_ylabel("images/sec [clock]")
    ax2.set_ylabel(
        "efficiency = speedup / devices" if kind == "strong" else "per-device throughput / 1 device"
    )
    ax1.legend(fontsize=8)
    fig.suptitle(
        f"{kind} scaling ({'same global batch' if kind == 'strong' else 'same batch per device'})"
    )
    if missing:
        names = list(missing)
        shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
        fig.text(
            0.01,
            0.01,
            f"not placed ({len(names)} rows, named in the sweep's output): {shown}",
            fontsize=7,
            color="dimgrey",
        )
        fig.tight_layout(rect=(0, 0.05, 1, 1))
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return True
    return common.save(fig, path)
