"""Throughput statistics and the metrics.jsonl/TensorBoard writer (the event files:
jaxpar/events.py; what the console shows: jaxpar/console.py)."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxpar import axes, units
from jaxpar.events import EventFile
from jaxpar.step_report import StepReport
from jaxpar.summary_record import InputCost, RunSummary, Throughput

# The one rule for `input_bound` (docs/results.md, "What the input pipeline costs"): after warm-up the
# training loop spent more than this share of its step time waiting for the next batch.
INPUT_BOUND_WAIT_SHARE = 0.1

# The one definition of the bytes between pipeline stages (metric key
# bytes_between_stages_per_step), as the summary, `--explain` and the stage table print it.
STAGE_TO_STAGE_LABEL = "stage-to-stage bytes / step"
STAGE_TO_STAGE_MEANING = "activations forward + gradients back, whole global batch"


def throughput(step_times: list[float], global_batch_size: int, warmup: int) -> Throughput | None:
    """Global images/sec from per-step times, dropping the first `warmup` steps (None: no
    step times).

    images_per_sec = global_batch_size / median step time; p10/p90 show the spread.
    """
    times = np.asarray(step_times[warmup:] or step_times, dtype=np.float64)
    if times.size == 0:
        return None
    median = float(np.median(times))
    return Throughput(
        images_per_sec=global_batch_size / median,
        step_time_median_s=median,
        step_time_p10_s=float(np.percentile(times, 10)),
        step_time_p90_s=float(np.percentile(times, 90)),
        timed_steps=int(times.size),
    )


def input_pipeline(
    made: Sequence[tuple[float, float]],
    waited: Sequence[float],
    step_times: Sequence[float],
    global_batch_size: int,
    warmup: int,
) -> InputCost | None:
    """What the input pipeline cost per step, from the Prefetcher's InputStats (`made`: host
    seconds in make_batch and put of each batch, `waited`: the loop's wait for each) and the
    step times, each dropping its first `warmup` entries as `throughput` does.

    The host batch time is a median, like the step time, so the loader's capacity (global
    batch / host batch time: what it could feed if training took no time) compares with
    images_per_sec; the wait is a mean, a share of the mean step time, and decides
    `input_bound` (INPUT_BOUND_WAIT_SHARE). None without batches or steps."""
    made, waited = made[warmup:] or made, waited[warmup:] or waited
    times = step_times[warmup:] or step_times
    if not (made and waited and times):
        return None
    host = float(np.median([m + p for m, p in made]))
    share = float(np.mean(waited)) / float(np.mean(times))
    return InputCost(
        input_s_per_step=host,
        input_put_s_per_step=float(np.median([p for _, p in made])),
        input_wait_s_per_step=float(np.mean(waited)),
        input_wait_share=share,
        loader_images_per_sec=global_batch_size / host,
        input_bound=share > INPUT_BOUND_WAIT_SHARE,
    )


def input_line(summary: RunSummary) -> str | None:
    """The summary's verdict on the input pipeline in one sentence (None without figures)."""
    cost, timed = summary.input_cost, summary.throughput
    if cost is None or timed is None:
        return None
    verdict = "input-bound" if cost.input_bound else "not input-bound"
    return (
        f"{verdict}: the loader makes {cost.loader_images_per_sec:,.0f} img/s, training "
        f"consumed {timed.images_per_sec:,.0f} img/s and waited for "
        f"data {cost.input_wait_share:.1%} of its step time (input-bound: more than "
        f"{INPUT_BOUND_WAIT_SHARE:.0%})"
    )


def summary(
    *,
    strategy: str,
    mesh_shape: tuple[int, ...],
    mesh_axes: tuple[str, ...] = axes.DEFAULT,
    partitioning: str = "",
    steps: int,
    global_batch_size: int,
    step_times: list[float],
    warmup: int,
    compile_time_s: float,
    wall_time_s: float,
    train: dict[str, float],
    evaluation: dict[str, float],
    num_params: int,
    flops_per_example: float,
    report: StepReport | None,
    made: Sequence[tuple[float, float]] = (),
    waited: Sequence[float] = (),
) -> RunSummary:
    """The run's final {"split": "summary"} record (docs/config.md, "Metrics"): throughput from the
    `step_times` after `warmup`, what the input pipeline cost (`made`, `waited`: see
    `input_pipeline`), the last `train` line and `evaluation`, the model's size and work, then
    the strategy's `report` (memory, collectives, pipeline figures). The run's other figures
    are added by jaxpar/run_summary.py."""
    timed = throughput(step_times, global_batch_size, warmup)
    nan = float("nan")
    flops_per_image = 3 * flops_per_example  # forward + backward
    return RunSummary(
        strategy=strategy,
        partitioning=partitioning or None,
        num_devices=math.prod(mesh_shape),
        mesh_shape=tuple(mesh_shape),
        mesh_axes=tuple(mesh_axes),
        mesh=units.named_mesh(mesh_axes, mesh_shape),
        steps=steps,
        global_batch_size=global_batch_size,
        throughput=timed,
        input_cost=input_pipeline(made, waited, step_times, global_batch_size, warmup),
        compile_time_s=compile_time_s,
        wall_time_s=wall_time_s,
        final_loss=train.get("loss", nan),
        eval_loss=evaluation.get("loss", nan),
        eval_accuracy=evaluation.get("accuracy", nan),
        num_params=num_params,
        model_flops_per_image=flops_per_image,
        report=report,
        model_tflops_per_sec=(
            timed.images_per_sec * flops_per_image / 1e12 if timed is not None else None
        ),
    )


def _jsonable(value: Any) -> Any:
    if isinstance(value, (np.generic,)):
        return value.item()
    if isinstance(value, tuple):
        return list(value)
    return value


class MetricWriter:
    """Appends one JSON object per line to WORKDIR/metrics.jsonl and mirrors scalars to
    TensorBoard event files in WORKDIR/tensorboard (`EventFile`). Only process 0 writes.

    The two agree across restarts: a run resumed at `resume_step` drops the lines after it
    from metrics.jsonl and marks its event file so that TensorBoard drops the events after it
    (the steps are replayed); a run starting from step 0 moves an earlier run's files aside.
    Each write is in the operating system's hands when it returns, so a kill loses neither
    what a checkpoint covers. A context manager: closed on the way out."""

    def __init__(self, workdir: str, enabled: bool = True, resume_step: int = 0):
        self.enabled = enabled
        self._tb: EventFile | None = None
        self._file = None
        self.archived: str | None = None  # where an earlier run's metrics were moved
        if not enabled:
            return
        os.makedirs(workdir, exist_ok=True)
        self.path = os.path.join(workdir, "metrics.jsonl")
        self.tensorboard = os.path.join(workdir, "tensorboard")
        if resume_step == 0:
            self.archived = self._archive()
        else:
            self._keep_until(resume_step)
        self._file = open(self.path, "a", encoding="utf-8")
        purge = resume_step + 1 if resume_step else None  # replayed: their old events go
        try:
            self._tb = EventFile(self.tensorboard, purge_step=purge)
        except ImportError:  # TensorBoard files are a convenience; metrics.jsonl is the contract
            self._tb = None

    def _archive(self) -> str | None:
        """A run starting from step 0 where metrics exist (checkpoints were off, none was saved
        yet, or none read back) moves them to metrics.N.jsonl, and the TensorBoard files to
        tensorboard.N, instead of overwriting them or mixing its curves with theirs. Returns
        what was moved where, or None."""
        jsonl = os.path.exists(self.path) and os.path.getsize(self.path) > 0
        events = os.path.isdir(self.tensorboard) and bool(os.listdir(self.tensorboard))
        if not (jsonl or events):
            return None
        folder, name = os.path.split(self.path)
        stem, ext = os.path.splitext(name)  # only the file's name changes, never a folder's
        n = 1
        while os.path.lexists(os.path.join(folder, f"{stem}.{n}{ext}")) or os.path.lexists(
            f"{self.tensorboard}.{n}"
        ):
            n += 1
        moved = []
        if jsonl:
            os.replace(self.path, target := os.path.join(folder, f"{stem}.{n}{ext}"))
            moved.append(target)
        if events:
            os.rename(self.tensorboard, target := f"{self.tensorboard}.{n}")
            moved.append(target)
        return " and ".join(moved)

    def _keep_until(self, step: int) -> None:
        """Drop records after `step` (and old summaries): a resumed run replays those steps,
        so the file stays one line per logged step, without gaps or duplicates."""
        if not os.path.exists(self.path):
            return
        with open(self.path, encoding="utf-8") as f:
            lines = [line for line in f if line.strip()]
        kept = []
        for line in lines:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:  # a line cut short by a kill
                continue
            if record.get("step", 0) <= step and record.get("split") != "summary":
                kept.append(json.dumps(record) + "\n")
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.writelines(kept)
        os.replace(tmp, self.path)

    def write(self, step: int, split: str, **values: Any) -> None:
        if not self.enabled:
            return
        record = {"step": int(step), "split": split}
        record.update({k: _jsonable(v) for k, v in values.items()})
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._tb is not None:
            self._tb.scalars(
                int(step),
                {
                    f"{split}/{key}": float(value)
                    for key, value in values.items()
                    if isinstance(value, (int, float, np.number)) and math.isfinite(float(value))
                },
            )

    def __enter__(self) -> MetricWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None


def records(workdir: str, split: str, until: int | None = None) -> list[dict[str, Any]]:
    """The records of one split ("train", "eval", "noise", "summary") of WORKDIR/metrics.jsonl
    in file order, up to step `until` if given (a line cut short by a kill is skipped)."""
    path = os.path.join(workdir, "metrics.jsonl")
    found = []
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if record.get("split") == split and (until is None or record["step"] <= until):
                    found.append(record)
    return found


def last_summary(workdir: str) -> RunSummary | None:
    """The last "summary" record of WORKDIR/metrics.jsonl, or None."""
    found = records(workdir, "summary")
    return RunSummary.of_record(found[-1]) if found else None
