"""PNG plots of a bench sweep (matplotlib, Agg): each picture is drawn when the rows it needs
are present, so any suite gets the plots that make sense for it.

- scaling_strong.png / scaling_weak.png: images/sec and efficiency against devices, one line
  per partitioning (rows with a `group`; the 1-device baseline starts every line); rows it
  cannot place (failed, no group, no baseline) are named on the figure and printed;
- memory_vs_bytes.png: memory per device against communication per device per step (the
  collectives plus, for pipelines, the stage-to-stage bytes one device receives), one point
  per row: the trade-off in one picture;
- bubble.png: pipeline bubble against micro-batches, analytic curve per K, measured points
  per schedule;
- accuracy_vs_batch.png: test error against global batch, one line per recipe (group), seeds'
  spread as bars and the published figures beside, for rows that are not throughput studies
  (scaling "none", as in the batch_size suite);
- predicted_vs_measured.png: predicted against measured images/sec (log-log), one point per
  row coloured by partitioning family, the y = x line and a +-15% band, the worst rows named,
  the median |error| and Spearman's rank correlation in the title (rows predicted with
  `python -m jaxpar.bench --predict PROFILE`).
"""

from __future__ import annotations

import logging
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from jaxpar import axes

logger = logging.getLogger(__name__)

MIB = 2**20
# One marker per family of partitioning (`_family`); an axis registered later gets a spare.
MARKERS = {"1 device": "*", "data": "o", "pipeline": "s", "tensor": "^", "fsdp": "v",
           "node": "P", "hybrid": "D"}  # fmt: skip
_SPARE = ("X", "h", "<", ">", "p", "d")


def _markers(rows: list[dict]) -> dict[str, str]:
    """MARKERS for the families in `rows`, with a spare marker for any other."""
    out = dict(MARKERS)
    spare = iter(_SPARE)
    for fam in dict.fromkeys(_family(r) for r in rows):
        if fam not in out:
            out[fam] = next(spare, "o")
    return out


def _ok(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r["status"] == "ok"]


def _finish(fig, ax, path: str, title: str, legend_fontsize: float | None = None, **legend) -> bool:
    """Grid, legend and title on `ax`; write the figure to `path` and free it."""
    ax.grid(alpha=0.3)
    ax.legend(fontsize=legend_fontsize, **legend)
    ax.set_title(title)
    return _save(fig, path)


def _save(fig, path: str) -> bool:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _shape(r: dict) -> dict[str, int]:
    """A row's mesh, {axis: size} (rows written before mesh_axes: (data, stage, tensor))."""
    sizes = r.get("mesh_shape") or (1, 1, 1)
    names = r.get("mesh_axes") or axes.DEFAULT
    return dict(zip(names, sizes))


def _family(r: dict) -> str:
    """ "1 device", one axis' word ("data", "pipeline", "tensor", "fsdp", "node", ...), or
    "hybrid"."""
    used = [a for a, n in _shape(r).items() if n > 1]
    if not used:
        return "1 device"
    if len(used) > 1:
        return "hybrid"
    return axes.get(used[0]).label if axes.registered(used[0]) else used[0]


def unplaced(rows: list[dict], kind: str) -> dict[str, str]:
    """The rows of a `kind` ("strong"/"weak") scaling study that its plot cannot place, or
    places only in part, with why: failed rows, rows without a group (not on a scaling line:
    e.g. a bubble study's), rows without images/sec, baseline rows after the first (the first
    starts every line), and rows without an efficiency (no baseline: their throughput is
    drawn, their efficiency is not)."""
    out: dict[str, str] = {}
    base_seen = False
    for r in rows:
        if r.get("scaling") != kind:
            continue
        if r["status"] != "ok":
            out[r["name"]] = "failed"
        elif not r["group"]:
            out[r["name"]] = "no group in the suite"
        elif not r["images_per_sec"]:
            out[r["name"]] = "no images/sec"
        elif r["group"] == "baseline":
            if base_seen:
                out[r["name"]] = "a second baseline; the first starts every line"
            base_seen = True
        elif r["efficiency"] is None:
            out[r["name"]] = "no baseline: images/sec drawn, not efficiency"
    return out


def scaling(rows: list[dict], kind: str, path: str, left_out: dict | None = None) -> bool:
    """Images/sec and efficiency against devices, one line per group. Rows it cannot place
    (`unplaced`) are named in a note on the figure and in `left_out`, never dropped
    silently."""
    missing = unplaced(rows, kind)
    rows = [r for r in _ok(rows) if r["scaling"] == kind and r["group"] and r["images_per_sec"]]
    base = [r for r in rows if r["group"] == "baseline"]
    groups = sorted({r["group"] for r in rows} - {"baseline"})
    if not groups:
        return False
    if left_out is not None:
        left_out.update(missing)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for g in groups:
        line = sorted(
            base[:1] + [r for r in rows if r["group"] == g], key=lambda r: r["num_devices"]
        )
        n = [r["num_devices"] for r in line]
        ax1.errorbar(
            n,
            [r["images_per_sec"] for r in line],
            marker="o",
            label=g,
            capsize=3,
            yerr=[r["images_per_sec_stderr"] or 0 for r in line],
        )
        rated = [r for r in line if r["efficiency"] is not None]
        ax2.plot([r["num_devices"] for r in rated], [r["efficiency"] for r in rated], marker="o",
                 label=g)  # fmt: skip
    top = max(r["num_devices"] for r in rows)
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
        fig.text(0.01, 0.01, f"not placed ({len(names)} rows, named in the sweep's output): "
                 f"{shown}", fontsize=7, color="dimgrey")  # fmt: skip
        fig.tight_layout(rect=(0, 0.05, 1, 1))
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return True
    return _save(fig, path)


def _comm(r: dict) -> int:
    """Bytes per device per step: the collectives of the busiest program group plus, for
    pipelines, the most stage-to-stage bytes one device receives (both per device)."""
    return r["collective_bytes_per_device"] + (r.get("stage_transfer_bytes_per_device") or 0)


def _stages(r: dict) -> int:
    shape = _shape(r)
    return axes.num_stages(shape) if all(axes.registered(a) for a in shape) else 1


def _staged(r: dict) -> bool:
    return _stages(r) > 1


def memory_vs_bytes(rows: list[dict], path: str, left_out: dict | None = None) -> bool:
    """Memory per device against communication per device per step (`_comm`). Pipeline rows
    recorded before their per-device stage transfers were (no
    stage_transfer_bytes_per_device) are left out and named in `left_out`."""
    rows = [r for r in _ok(rows) if r["memory_bytes_per_device"] is not None]
    old = {r["name"]: "recorded without stage_transfer_bytes_per_device: measure it again"
           for r in rows if _staged(r) and r.get("stage_transfer_bytes_per_device") is None}  # fmt: skip
    rows = [r for r in rows if r["name"] not in old]
    if len(rows) < 2:
        return False
    if left_out is not None:
        left_out.update(old)
    fig, ax = plt.subplots(figsize=(8, 5.5))
    markers = _markers(rows)
    for fam, marker in markers.items():
        sel = [r for r in rows if _family(r) == fam]
        if not sel:
            continue
        x = [_comm(r) / MIB for r in sel]
        y = [r["memory_bytes_per_device"] / MIB for r in sel]
        ax.scatter(x, y, marker=marker, s=50, label=fam)
        for xi, yi, r in zip(x, y, sel):
            if fam != "pipeline" or r["num_microbatches"] == 8 and r["pipeline_schedule"] == "1f1b":
                ax.annotate(
                    r["name"].replace("pipeline", "pipe"),
                    (xi, yi),
                    fontsize=7,
                    xytext=(3, 3),
                    textcoords="offset points",
                )
    positive = [v for v in (_comm(r) / MIB for r in rows) if v > 0]
    ax.set_xscale("symlog", linthresh=min(positive) / 2 if positive else 1.0)
    ax.set_xlabel(
        "communication per device per step, MiB [exact]\n(collectives + stage-to-stage "
        "bytes received, each the busiest device's)"
    )
    ax.set_ylabel("memory per device, MiB [exact]\n(state + temporaries + stored activations)")
    return _finish(fig, ax, path, "memory against communication, one point per partitioning", 8)


def bubble(rows: list[dict], path: str) -> bool:
    rows = [r for r in _ok(rows) if r["analytic_bubble"] is not None and _family(r) == "pipeline"]
    if not rows:
        return False
    fig, ax = plt.subplots(figsize=(7, 4.5))
    stages = sorted({_stages(r) for r in rows})
    colors = dict(zip(stages, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    top = max(r["num_microbatches"] for r in rows)
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
                if r["pipeline_schedule"] == schedule
                and _stages(r) == k
                and r["measured_bubble"] is not None
            ]
            if sel:
                ax.scatter(
                    [r["num_microbatches"] for r in sel],
                    [r["measured_bubble"] for r in sel],
                    marker=marker,
                    color=colors[k],
                    label=f"K={k} {schedule} measured",
                )
    ax.set_xlabel("micro-batches M")
    ax.set_ylabel("bubble (idle fraction of the step)")
    ax.set_ylim(0, 1)
    title = "pipeline bubble: analytic curve, measured stage-time timeline points"
    return _finish(fig, ax, path, title, 7, ncol=2)


def accuracy_vs_batch(rows: list[dict], path: str) -> bool:
    """Test error (1 - accuracy, log scale, so that 1.5% and 50% both read) against global
    batch, one line per recipe (group) with two batches or more; bars span the seeds' min-max;
    the published figures (a suite's `reference`) in black."""
    from jaxpar.bench import accuracy  # the study folds repeated seeds

    entries = [e for e in accuracy.study(_ok(rows)) if e["accuracy"] is not None]
    batches = lambda es: {e["global_batch_size"] for e in es}
    lines = {}
    for e in entries:
        lines.setdefault(e["group"], []).append(e)
    lines = {g: es for g, es in lines.items() if len(batches(es)) >= 2}
    if not lines:
        return False
    fig, ax = plt.subplots(figsize=(7, 4.8))
    for g, es in lines.items():
        es = sorted(es, key=lambda e: e["global_batch_size"])
        x = [e["global_batch_size"] for e in es]
        y = [1 - e["accuracy"] for e in es]  # test error: 1.5% and 50% on one axis
        err = [[e["accuracy_max"] - e["accuracy"] for e in es],
               [e["accuracy"] - e["accuracy_min"] for e in es]]  # fmt: skip
        ax.errorbar(x, y, yerr=err, marker="o", capsize=3, label=g)
    refs = {}
    for es in lines.values():
        for e in es:
            if (ref := e["reference"]) is not None:
                lo, hi = ref if isinstance(ref, (list, tuple)) else (ref, ref)
                refs[e["global_batch_size"]] = (lo, hi)
    if refs:
        x = sorted(refs)
        mid = [1 - (refs[b][0] + refs[b][1]) / 2 for b in x]
        half = [(refs[b][1] - refs[b][0]) / 2 for b in x]
        ax.errorbar(x, mid, yerr=half, color="black", ls="--", marker="s", capsize=3,
                    label="published (reference)")  # fmt: skip
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    sizes = sorted(batches(entries))
    ax.set_xticks(sizes, [str(b) for b in sizes])
    ax.set_xlabel("global batch size (same number of epochs)")
    ax.set_ylabel("test error = 1 - accuracy (log scale)")
    return _finish(fig, ax, path, "accuracy against batch size, per recipe", 8)


BAND = 0.15  # the +-15% band around y = x in predicted_vs_measured
LABELLED = 3  # the rows with the largest |error| named on the plot


def predicted_vs_measured(rows: list[dict], path: str) -> bool:
    """Predicted against measured images/sec, log-log, for the rows that have both figures."""
    from jaxpar.bench import predicted  # the errors' summary (pure functions)

    rows = [r for r in _ok(rows) if r.get("predicted_error") is not None]
    if not rows:
        return False
    fig, ax = plt.subplots(figsize=(7, 5.5))
    x = [r["images_per_sec"] for r in rows]
    y = [r["predicted_images_per_sec"] for r in rows]
    lo, hi = min(x + y) / 1.5, max(x + y) * 1.5
    line = [lo, hi]
    ax.plot(line, line, color="black", lw=0.8, label="predicted = measured")
    ax.fill_between(line, [v * (1 - BAND) for v in line], [v * (1 + BAND) for v in line],
                    color="grey", alpha=0.2, label=f"±{100 * BAND:.0f}%")  # fmt: skip
    markers = _markers(rows)
    for fam, marker in markers.items():
        sel = [r for r in rows if _family(r) == fam]
        if sel:
            ax.scatter([r["images_per_sec"] for r in sel],
                       [r["predicted_images_per_sec"] for r in sel],
                       marker=marker, s=50, label=fam, zorder=3)  # fmt: skip
    worst = sorted(rows, key=lambda r: -abs(r["predicted_error"]))[:LABELLED]
    for r in worst:
        ax.annotate(f"{r['name']} ({100 * r['predicted_error']:+.0f}%)",
                    (r["images_per_sec"], r["predicted_images_per_sec"]), fontsize=7,
                    xytext=(4, -10), textcoords="offset points")  # fmt: skip
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured images/sec [clock]")
    profile = next((r["predicted_profile"] for r in rows if r.get("predicted_profile")), "")
    ax.set_ylabel(f"predicted images/sec\n{profile}" if profile else "predicted images/sec")
    s = predicted.prediction_summary(rows)
    rho = "n/a" if s["spearman"] is None else f"{s['spearman']:.2f}"
    title = (f"predicted against measured images/sec\n{s['n']} rows: median |error| "
             f"{100 * s['median_abs_error']:.1f}%, Spearman rho {rho}")  # fmt: skip
    return _finish(fig, ax, path, title, 8, loc="upper left")


def plot_all(rows: list[dict], out: str) -> list[str]:
    """Draw every plot these rows support into `out`; return the files written. Rows a
    scaling or memory plot cannot place are named in one logged line per plot."""
    made = []
    left_out: dict[str, dict[str, str]] = {"scaling_strong": {}, "scaling_weak": {},
                                           "memory_vs_bytes": {}}  # fmt: skip
    for name, draw in (
        ("scaling_strong.png", lambda p: scaling(rows, "strong", p, left_out["scaling_strong"])),
        ("scaling_weak.png", lambda p: scaling(rows, "weak", p, left_out["scaling_weak"])),
        ("memory_vs_bytes.png", lambda p: memory_vs_bytes(rows, p, left_out["memory_vs_bytes"])),
        ("bubble.png", lambda p: bubble(rows, p)),
        ("accuracy_vs_batch.png", lambda p: accuracy_vs_batch(rows, p)),
        ("predicted_vs_measured.png", lambda p: predicted_vs_measured(rows, p)),
    ):
        path = os.path.join(out, name)
        if draw(path):
            made.append(path)
    for plot, missing in left_out.items():
        if missing:
            named = "; ".join(f"{row} ({why})" for row, why in missing.items())
            logger.info(f"{plot}.png does not place {len(missing)} rows: {named}")
    return made
