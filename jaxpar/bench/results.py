"""Turn per-repeat row records into the sweep's results: mean and standard error over repeats,
speedup and efficiency against each row's baseline, every row's keys, and results.csv
(table.py draws results.md). Pure functions over the typed rows (tested on known inputs)."""

from __future__ import annotations

import csv
import dataclasses
import io
import math

from jaxpar import axes
from jaxpar.bench import row_record
from jaxpar.bench.records import Repeat, SuiteRow
from jaxpar.bench.row_record import BenchRow
from jaxpar.metrics import INPUT_BOUND_WAIT_SHARE

# The columns every row carries, in the files' order (None where a figure does not apply or
# the row failed).
KEYS = row_record.KEYS


def mean_stderr(values: list[float]) -> tuple[float | None, float | None]:
    """Mean, and standard error of the mean (None with fewer than two values)."""
    if not values:
        return None, None
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, None
    var = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return mean, math.sqrt(var / len(values))


def aggregate(spec: SuiteRow, repeats: list[Repeat]) -> BenchRow:
    """One row from its suite entry and its repeats (in repeat order): the first repeat's
    figures, the suite entry's keys, and the figures over every repeat."""
    first = repeats[0] if repeats else Repeat.of_record({})
    out = dataclasses.replace(
        first.figures,
        name=spec.name,
        group=spec.group,
        scaling=spec.scaling,
        baseline=spec.baseline or None,
        label=spec.label or spec.name,
        reference=spec.reference,
        seed=spec.seed,
        reference_efficiency=spec.reference_efficiency,
        repeats=len(repeats),
        bytes_between_stages=first.bytes_between_stages_per_step,
        target=None,
    )
    if out.mesh_shape is None and spec.mesh_shape is not None:  # a failed row: as asked
        shape = list(spec.mesh_shape)
        out = dataclasses.replace(
            out,
            mesh_shape=shape,
            mesh_axes=list(spec.mesh_axes or axes.DEFAULT),
            num_devices=math.prod(shape) if -1 not in shape else None,
        )
    if out.global_batch_size is None:  # a failed row: as asked
        out = dataclasses.replace(out, global_batch_size=spec.global_batch_size)
    failed = [r for r in repeats if not r.ok]
    if failed or not repeats:
        error = failed[0].figures.error if failed else "not run"
        return dataclasses.replace(out, status="failed", error=error)
    rates = [r.figures.images_per_sec for r in repeats if r.figures.images_per_sec]
    batch = first.figures.global_batch_size
    slow = [batch / r.step_time_p90_s for r in repeats if r.step_time_p90_s]
    fast = [batch / r.step_time_p10_s for r in repeats if r.step_time_p10_s]
    mean, stderr = mean_stderr(rates)
    out = dataclasses.replace(
        out,
        status="ok",
        error=None,
        images_per_sec=mean,
        images_per_sec_stderr=stderr,
        images_per_sec_p10=mean_stderr(slow)[0],
        images_per_sec_p90=mean_stderr(fast)[0],
        step_time_median_s=mean_stderr([r.figures.step_time_median_s for r in repeats])[0],
    )
    out = _input(out, repeats, batch)
    shape = dict(zip(out.mesh_axes or axes.DEFAULT, out.mesh_shape or [1, 1, 1]))
    used = [a for a, n in shape.items() if n > 1]
    # replicas of the whole model over one batch axis, nothing else split (node x data's
    # gradient mean is three collectives, fsdp's is reduce-scatters: not one all-reduce)
    data_only = (
        len(used) == 1
        and axes.registered(used[0])
        and (axes.get(used[0]).role == "batch" and not axes.get(used[0]).shards_params)
    )
    if data_only and out.param_bytes:  # the gradient all-reduce against the parameters
        out = dataclasses.replace(
            out, data_allreduce_over_params=out.data_allreduce_bytes / out.param_bytes
        )
    if out.images_per_sec and out.model_flops_per_image:
        flops = out.images_per_sec * out.model_flops_per_image
        out = dataclasses.replace(out, model_flops_per_sec=flops)
    return out


def _input(row: BenchRow, repeats: list[Repeat], batch: int) -> BenchRow:
    """`row` with the input pipeline's figures over repeats: mean host batch time, wait and
    wait share; the loader's capacity from the mean host time; input-bound by the mean share
    (the rule of jaxpar.metrics.input_pipeline). As it was for records made before they were
    measured."""
    if not all(r.figures.input_s_per_step for r in repeats):
        return row
    host = mean_stderr([r.figures.input_s_per_step for r in repeats])[0]
    wait = mean_stderr([r.figures.input_wait_s_per_step for r in repeats])[0]
    share = mean_stderr([r.figures.input_wait_share for r in repeats])[0]
    return dataclasses.replace(
        row,
        input_s_per_step=host,
        input_wait_s_per_step=wait,
        input_wait_share=share,
        loader_images_per_sec=batch / host,
        input_bound=share > INPUT_BOUND_WAIT_SHARE,
    )


def add_scaling(rows: list[BenchRow]) -> list[BenchRow]:
    """Speedup = images/sec over the baseline's; efficiency = speedup / devices.

    The baseline is the row named by `baseline`, else the first 1-device row of the same
    scaling kind; rows with scaling "none" get neither. Strong scaling (same global batch):
    efficiency is the usual speedup / N. Weak scaling (same batch per device): it is the
    per-device throughput ratio.
    """
    by_name = {r.name: r for r in rows}
    out = []
    for r in rows:
        if r.scaling == "none":  # not a throughput study (e.g. accuracy against batch)
            out.append(r)
            continue
        if r.baseline:
            base = by_name.get(r.baseline)
        else:
            ones = [b for b in rows if b.num_devices == 1 and b.scaling == r.scaling]
            base = ones[0] if ones else None
            r = dataclasses.replace(r, baseline=base.name if base else None)
        ok = base and base.status == "ok" and base.images_per_sec
        if r.status == "ok" and ok and r.images_per_sec:
            speedup = r.images_per_sec / base.images_per_sec
            efficiency = speedup / r.num_devices * base.num_devices
            r = dataclasses.replace(r, speedup=speedup, efficiency=efficiency)
        out.append(r)
    return out


def to_csv(rows: list[BenchRow]) -> str:
    """One line per row, every column; breakdowns as JSON in their cell."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(KEYS))
    writer.writeheader()
    for r in rows:
        writer.writerow(r.csv_cells())
    return buf.getvalue()


def of_csv(text: str) -> list[BenchRow]:
    """results.csv's rows read back."""
    return [BenchRow.of_csv(cells) for cells in csv.DictReader(io.StringIO(text))]
