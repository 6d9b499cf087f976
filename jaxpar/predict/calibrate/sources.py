"""Where calibration runs come from: a bench sweep directory (`python -m jaxpar.bench --out
OUT`), whose measured 1-device rows are the runs, or a config file listing published runs
(configs/predict/dgx1_single_gpu.py). Only single-device figures are runs, so that every
multi-device row stays a check."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from jaxpar import configfile
from jaxpar import suites as suite_lib
from jaxpar.errors import ConfigError
from jaxpar.predict.profiles.records import CalibrationRun
from jaxpar.predict.programs.workload import input_spec

# the keys a run measured by the bench is written with, in order
_SWEEP_KEYS = (
    "model",
    "width",
    "batch_norm",
    "head",
    "dtype",
    "image_shape",
    "num_classes",
    "batch_size",
    "images_per_sec",
    "name",
)


@dataclasses.dataclass(frozen=True)
class MeasuredRun:
    """What calibration takes of a bench results.json row."""

    name: str
    status: str
    num_devices: int
    images_per_sec: float | None

    @classmethod
    def of_record(cls, row: dict[str, Any]) -> MeasuredRun:
        return cls(row["name"], row["status"], row["num_devices"], row.get("images_per_sec"))


@dataclasses.dataclass(frozen=True)
class SweepResults:
    """What calibration takes of a bench results.json: its rows."""

    rows: tuple[MeasuredRun, ...]

    @classmethod
    def of_record(cls, results: dict[str, Any]) -> SweepResults:
        return cls(tuple(MeasuredRun.of_record(row) for row in results["rows"]))


@dataclasses.dataclass(frozen=True)
class RunsFile:
    """A config file of published single-device runs (configs/predict/dgx1_single_gpu.py)."""

    runs: tuple[CalibrationRun, ...]

    @classmethod
    def of_record(cls, config: Any) -> RunsFile:
        return cls(tuple(CalibrationRun.of_record(r) for r in config.get("runs", ())))


@dataclasses.dataclass(frozen=True)
class SweepSource:
    """What calibration takes of a bench sweep.json: its suite and command-line overrides."""

    suite: str
    overrides: dict[str, Any]

    @classmethod
    def of_record(cls, sweep: dict[str, Any]) -> SweepSource:
        return cls(sweep["suite"], sweep.get("overrides", {}))


def run_of(config, images_per_sec: float, name: str = "") -> CalibrationRun:
    """A calibration run (as profiles list them) for a 1-device config and its measured rate."""
    image_shape, classes = input_spec(config)
    return CalibrationRun(
        name=name,
        model=config.model.name,
        width=config.model.width,
        batch_norm=config.model.batch_norm,
        head=config.model.head,
        image_shape=tuple(image_shape),
        num_classes=int(classes),
        dtype=config.model.dtype,
        batch_size=int(config.global_batch_size),
        images_per_sec=float(images_per_sec),
        keys=_SWEEP_KEYS if name else _SWEEP_KEYS[:-1],
    )


def runs_from(source: str) -> list[CalibrationRun]:
    """Calibration runs from a bench sweep directory (its measured 1-device rows) or from a
    config file whose get_config() lists `runs` (published single-device figures)."""
    if os.path.isfile(source) and source.endswith(".py"):
        runs = list(RunsFile.of_record(configfile.load(source)).runs)
        if not runs:
            raise ConfigError(f"{source!r} lists no `runs`")
        return runs
    return runs_from_sweep(source)


def runs_from_sweep(out: str) -> list[CalibrationRun]:
    """The measured 1-device rows of a bench sweep directory as calibration runs."""

    path = os.path.join(out, "results.json")
    if not os.path.exists(path):
        raise ConfigError(f"no bench results in {out!r} (looked for {path})")
    with open(path, encoding="utf-8") as f:
        results = SweepResults.of_record(json.load(f)).rows
    with open(os.path.join(out, "sweep.json"), encoding="utf-8") as f:
        sweep = SweepSource.of_record(json.load(f))
    spec = suite_lib.load_suite(os.path.join(suite_lib.ROOT, sweep.suite))
    entries = {suite_lib.SuiteRow.of_record(r).name: r for r in spec.rows}
    runs = []
    for row in results:
        if row.status != "ok" or row.num_devices != 1 or row.name not in entries:
            continue
        config = suite_lib.row_config(spec, entries[row.name], sweep.overrides)
        runs.append(run_of(config, row.images_per_sec, row.name))
    if not runs:
        raise ConfigError(f"{out!r} has no measured 1-device row to calibrate on")
    return runs
