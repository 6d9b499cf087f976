"""PNG plots of a bench sweep (matplotlib, Agg): each picture is drawn when the rows it needs
are present, so any suite gets the plots that make sense for it. One module a picture;
common.py holds what they share.

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
  `python -m jaxpar.bench --predict PROFILE`);
- time_to_target.png: steps to target against global batch on the steps model's curve from
  the reference row, and time to target per setup, measured beside predicted (rows of a
  time-to-target suite, annotated by jaxpar.bench.time_to_target).
"""

from __future__ import annotations

import logging
import os

from jaxpar.bench.plots.accuracy_vs_batch import accuracy_vs_batch
from jaxpar.bench.plots.bubble import bubble
from jaxpar.bench.plots.memory_vs_bytes import memory_vs_bytes
from jaxpar.bench.plots.predicted_vs_measured import predicted_vs_measured
from jaxpar.bench.plots.scaling import scaling, unplaced
from jaxpar.bench.plots.time_to_target import time_to_target
from jaxpar.bench.row_record import BenchRow

__all__ = [
    "accuracy_vs_batch",
    "bubble",
    "memory_vs_bytes",
    "plot_all",
    "predicted_vs_measured",
    "scaling",
    "time_to_target",
    "unplaced",
]
logger = logging.getLogger(__name__)


def plot_all(rows: list[BenchRow], out: str) -> list[str]:
    """Draw every plot these rows support into `out`; return the files written. Rows a
    scaling or memory plot cannot place are named in one logged line per plot."""
    made = []
    strong: dict[str, str] = {}  # the rows each plot leaves out, with why
    weak: dict[str, str] = {}
    memory: dict[str, str] = {}
    left_out = {"scaling_strong": strong, "scaling_weak": weak, "memory_vs_bytes": memory}
    for name, draw in (
        ("scaling_strong.png", lambda p: scaling(rows, "strong", p, strong)),
        ("scaling_weak.png", lambda p: scaling(rows, "weak", p, weak)),
        ("memory_vs_bytes.png", lambda p: memory_vs_bytes(rows, p, memory)),
        ("bubble.png", lambda p: bubble(rows, p)),
        ("accuracy_vs_batch.png", lambda p: accuracy_vs_batch(rows, p)),
        ("predicted_vs_measured.png", lambda p: predicted_vs_measured(rows, p)),
        ("time_to_target.png", lambda p: time_to_target(rows, p)),
    ):
        path = os.path.join(out, name)
        if draw(path):
            made.append(path)
    for plot, missing in left_out.items():
        if missing:
            named = "; ".join(f"{row} ({why})" for row, why in missing.items())
            logger.info(f"{plot}.png does not place {len(missing)} rows: {named}")
    return made
