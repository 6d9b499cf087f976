"""Predictions beside measurements: the sweep's rows predicted on a hardware profile
(`predict_table`, python -m jaxpar.predict in its own process), merged into the bench rows with
their errors (`merge_predictions`), summarised (`prediction_summary`) and tabulated
(`predicted_markdown`). Pure functions over the bench's rows, but for the predictor's
process."""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import subprocess
import sys

from jaxpar import configfile
from jaxpar import suites as suite_lib
from jaxpar.bench.records import PredictionSummary
from jaxpar.bench.row_record import BenchRow
from jaxpar.bench.table import mesh_cell, mib_cell, number_cell
from jaxpar.files import write_text
from jaxpar.predict.records import PredictedRow
from jaxpar.stats import spearman

# A predicted row's field (jaxpar.predict.records.PredictedRow) -> the bench row's key
PREDICTED = {
    "profile": "predicted_profile",
    "status": "predicted_status",
    "error": "predicted_failure",
    "images_per_sec": "predicted_images_per_sec",
    "step_time_s": "predicted_step_time_s",
    "compute_s": "predicted_compute_s",
    "comm_s": "predicted_comm_s",
    "bubble_s": "predicted_bubble_s",
    "overhead_s": "predicted_overhead_s",
    "schedule_bubble": "predicted_bubble",
    "memory_bytes_per_device": "predicted_memory_bytes_per_device",
    "fits": "predicted_fits",
    "speedup": "predicted_speedup",
    "efficiency": "predicted_efficiency",
}


def predict_table(
    table: list[BenchRow], suite: str, profile: str, overrides: dict, sweep_out: str
) -> list[BenchRow] | None:
    """Predict the table's rows on `profile` (python -m jaxpar.predict in its
    own process: it compiles for the profile's device count) and merge the predictions and
    their errors into `table` (merge_predictions): the rows merged, or None if the predictor
    failed.
    Only the rows OUT holds are predicted (a suite file of those rows in OUT/predicted)."""
    out = os.path.join(sweep_out, "predicted")
    os.makedirs(out, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "jaxpar.predict",
        "--suite",
        _subset(table, suite, out),
        "--profile",
        profile,
        "--out",
        out,
    ]
    cmd += configfile.override_args(overrides)
    print(f"predicting {len(table)} rows on {profile} ...", flush=True)
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([suite_lib.ROOT, os.environ.get("PYTHONPATH", "")])
    )
    env.pop("XLA_FLAGS", None)  # the predictor sets its own device count
    log = os.path.join(sweep_out, "logs", "predicted.log")
    with open(log, "w", encoding="utf-8") as f:
        rc = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=suite_lib.ROOT)
    if rc != 0:
        print(f"prediction failed (exit {rc}); see {log}", flush=True)
        return None
    with open(os.path.join(out, "predictions.json"), encoding="utf-8") as f:
        rows = json.load(f)["rows"]
    return merge_predictions(table, rows)


def _subset(table: list[BenchRow], suite: str, out: str) -> str:
    """The suite file to predict: the sweep's own, or, when OUT holds only some of its
    rows (--only), OUT/predicted/suite.py with those rows alone (nothing compiled for
    rows that have no measurement to compare with)."""
    names = [r.name for r in table]
    if len(names) == len(suite_lib.load_suite(suite).rows):
        return suite
    path = os.path.join(out, "suite.py")
    write_text(path, _SUBSET.format(suite=suite, names=names))
    return path


_SUBSET = '''"""The rows of {suite} that this OUT holds (written by python -m jaxpar.bench --predict)."""

from jaxpar import suites as suite_lib


def get_config():
    suite = suite_lib.load_suite({suite!r})
    suite.rows = tuple(r for r in suite.rows if r["name"] in {names!r})
    return suite
'''


def merge_predictions(rows: list[BenchRow], predicted: list[dict]) -> list[BenchRow]:
    """Merge predictions.json's rows (jaxpar.predict, by name) into the bench rows as the
    predicted_* keys of PREDICTED, and the errors against the measurement: `predicted_error`
    = predicted / measured images/sec - 1 [clock], `predicted_memory_error` = predicted /
    measured memory per device - 1 (the measured one is the compiled program's, exact); the
    predicted images/sec is capped at the row's measured loader capacity. A row
    the predictor did not return keeps None; one it failed on gets its status and message."""
    by_name = {p.name: p for p in map(PredictedRow.of_record, predicted)}
    return [_merged(r, by_name.get(r.name)) for r in rows]


def _merged(r: BenchRow, p: PredictedRow | None) -> BenchRow:
    """Row `r` with prediction `p` (None: not predicted) and its errors (merge_predictions)."""
    figures = {mine: getattr(p, theirs) if p else None for theirs, mine in PREDICTED.items()}
    if p is None or p.status != "ok":  # a failed prediction carries no figures
        kept = ("predicted_profile", "predicted_status", "predicted_failure")
        figures = {k: v if k in kept else None for k, v in figures.items()}
    else:
        figures = figures | {"predicted_failure": None}
    r = dataclasses.replace(r, **figures)
    rate, loader = r.predicted_images_per_sec, r.loader_images_per_sec
    if rate and loader and rate > loader:  # measured: no step outruns its input
        rate = loader
    measured = r.images_per_sec if r.status == "ok" else None
    return dataclasses.replace(
        r,
        predicted_images_per_sec=rate,
        predicted_error=_ratio(rate, measured),
        predicted_memory_error=_ratio(
            r.predicted_memory_bytes_per_device, r.memory_bytes_per_device
        ),
    )


def _ratio(predicted, measured) -> float | None:
    """predicted / measured - 1, or None when either is missing (or measured is 0)."""
    if predicted is None or not measured:
        return None
    return predicted / measured - 1


def prediction_summary(rows: list[BenchRow]) -> PredictionSummary:
    """Over the rows with both a measured and a predicted images/sec: their count, the median
    and mean |predicted_error|, the worst row and its (signed) error, and Spearman's rho of
    predicted against measured images/sec. None figures where no row has both."""
    both = [r for r in rows if r.predicted_error is not None]
    if not both:
        return PredictionSummary(n=0)
    errors = [abs(r.predicted_error) for r in both]
    worst = max(both, key=lambda r: abs(r.predicted_error))
    return PredictionSummary(
        n=len(both),
        median_abs_error=statistics.median(errors),
        mean_abs_error=sum(errors) / len(errors),
        worst=worst.name,
        worst_error=worst.predicted_error,
        spearman=spearman(
            [r.images_per_sec for r in both], [r.predicted_images_per_sec for r in both]
        ),
    )


def summary_line(rows: list[BenchRow]) -> str:
    """prediction_summary in one line, for under the table (and the plot's title)."""
    s = prediction_summary(rows)
    if not s.n:
        return "images/sec error: no row has both a measured and a predicted images/sec"
    rho = "n/a (fewer than 2 rows, or all equal)"
    if s.spearman is not None:
        rho = f"{s.spearman:.2f}"
    return (
        f"images/sec error over the {s.n} row{'s' if s.n != 1 else ''} with both "
        f"figures: median |error| {100 * s.median_abs_error:.1f}%, mean |error| "
        f"{100 * s.mean_abs_error:.1f}%, worst {s.worst} "
        f"({_signed(s.worst_error)}); Spearman rank correlation of predicted against "
        f"measured images/sec: {rho}"
    )


def predicted_markdown(rows: list[BenchRow], profile: str) -> str:
    """Measured here against predicted on `profile`, one line per row, the summary below; a
    row's published efficiency (`reference_efficiency`) beside where the suite gives one."""
    name = next((r.predicted_profile for r in rows if r.predicted_profile), profile)
    published = any(r.reference_efficiency is not None for r in rows)
    head = (
        "| row | mesh | measured img/s [clock] | predicted img/s | error | "
        "measured step ms [clock] | predicted step ms (compute / comm / bubble / overhead) | "
        "bubble measured [clock] / predicted | memory MiB measured [exact] / predicted |"
    )
    if published:
        head += " predicted eff. | published eff. | predicted - published |"
    lines = [
        (
            f"Predicted on {name} ({profile}) against this machine's measurement. Measured "
            "images/sec, step time and bubble are this machine's wall clock [clock]; measured "
            "memory per device is read from the compiled programs [exact]. Predicted figures are "
            "the model's, from the programs' exact FLOPs and bytes and the profile's rates. "
            "error = predicted / measured - 1."
        ),
        "",
        head,
        "|" + "---|" * (12 if published else 9),
    ]
    for r in rows:
        ok, pok = r.status == "ok", r.predicted_status == "ok"
        measured = number_cell(r.images_per_sec, ",.1f") if ok else f"failed: {r.error}"
        if pok:
            guess = number_cell(r.predicted_images_per_sec, ",.1f")
            parts = [
                r.predicted_compute_s,
                r.predicted_comm_s,
                r.predicted_bubble_s,
                r.predicted_overhead_s,
            ]
            step = f"{_ms(r.predicted_step_time_s)} (" + " / ".join(map(_ms, parts)) + ")"
        else:
            why = r.predicted_failure or "not predicted"
            guess, step = f"failed: {why}" if r.predicted_status else "", ""
        bubble = ""
        if r.measured_bubble is not None or r.predicted_bubble is not None:
            bubble = f"{number_cell(r.measured_bubble, '.3f')} / {number_cell(r.predicted_bubble, '.3f')}"
        memory = ""
        if r.memory_bytes_per_device is not None or r.predicted_memory_bytes_per_device is not None:
            memory = (
                f"{mib_cell(r.memory_bytes_per_device)} / "
                f"{mib_cell(r.predicted_memory_bytes_per_device)}"
            )
            if r.predicted_memory_error is not None:
                memory += f" ({_signed(r.predicted_memory_error)})"
        cells = [
            r.name,
            mesh_cell(r),
            measured,
            guess,
            _signed(r.predicted_error),
            _ms(r.step_time_median_s) if ok else "",
            step,
            bubble,
            memory,
        ]
        if published:
            ref, eff = r.reference_efficiency, r.predicted_efficiency
            delta = f"{100 * (eff - ref):+.1f} pt" if ref is not None and eff is not None else ""
            cells += [_pct(eff), _pct(ref), delta]
        lines.append("| " + " | ".join(str(c).replace("|", "/") for c in cells) + " |")
    return "\n".join(lines) + "\n\n" + summary_line(rows) + "\n"


def _signed(x) -> str:
    return "" if x is None else f"{100 * x:+.1f}%"


def _ms(seconds) -> str:
    """Milliseconds, with more digits below one millisecond."""
    if seconds is None:
        return ""
    return (
        f"{1e3 * seconds:.1f}" if abs(seconds) >= 1e-3 or seconds == 0 else f"{1e3 * seconds:.3f}"
    )


def _pct(x) -> str:
    return "" if x is None else f"{100 * x:.1f}%"
