"""A profile's calibration run as a typed record: a model, its input and batch size on one
device, and the images/sec measured or published for it (configs/hardware/dgx1_p100.py lists
some). Profile files and --calibrate-here's output hold them as dicts; `of_record` reads one
and `as_record` writes it back with the keys it was read with, in their order."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class CalibrationRun:
    """One single-device run. The fields after `batch_size` are optional in a profile file;
    a run read without them takes these defaults (and writes back without them)."""

    name: str  # how a report names it ("" where the file gives none)
    model: str
    width: float
    batch_norm: bool
    head: str
    image_shape: tuple[int, ...]
    num_classes: int
    dtype: str
    batch_size: int
    images_per_sec: float | None = None  # None: not timed yet (model_runs.parse_row)
    source: str | None = None  # where a published figure comes from
    memory_bytes: float | None = None  # the device memory it used, where measured
    # the keys the record was read with, in order: as_record writes them first, then any
    # field that differs from its default
    keys: tuple[str, ...] = dataclasses.field(default=(), compare=False, repr=False)

    def identity(self) -> CalibrationRun:
        """The run less what it measured: equal for every run of one program."""
        return dataclasses.replace(
            self, name="", images_per_sec=None, source=None, memory_bytes=None
        )

    @property
    def step_s(self) -> float:
        """The measured seconds a step (batch over images/sec)."""
        return self.batch_size / float(self.images_per_sec)

    def as_record(self) -> dict[str, Any]:
        """The run as a profile file lists it."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        del values["keys"]
        order = [*self.keys, *(k for k in values if k not in self.keys)]
        return {k: values[k] for k in order if k in self.keys or values[k] != _DEFAULTS[k]}

    @classmethod
    def of_record(cls, record: Any) -> CalibrationRun:
        """A run from a profile file's dict (or ConfigDict)."""
        record = dict(record)
        known = {f.name for f in dataclasses.fields(cls)} - {"keys"}
        if unknown := [k for k in record if k not in known]:
            raise ValueError(f"calibration run: no field {unknown[0]!r}")
        return cls(
            name=record.get("name", _DEFAULTS["name"]),
            model=record["model"],
            width=record.get("width", _DEFAULTS["width"]),
            batch_norm=record.get("batch_norm", _DEFAULTS["batch_norm"]),
            head=record.get("head", _DEFAULTS["head"]),
            image_shape=tuple(record["image_shape"]),
            num_classes=record["num_classes"],
            dtype=record.get("dtype", _DEFAULTS["dtype"]),
            batch_size=record["batch_size"],
            images_per_sec=record.get("images_per_sec"),
            source=record.get("source"),
            memory_bytes=record.get("memory_bytes"),
            keys=tuple(record),
        )


# what a run read without the field takes (None: a required field)
_DEFAULTS: dict[str, Any] = {
    "name": "",
    "model": None,
    "width": 1.0,
    "batch_norm": False,
    "head": "auto",
    "image_shape": None,
    "num_classes": None,
    "dtype": "float32",
    "batch_size": None,
    "images_per_sec": None,
    "source": None,
    "memory_bytes": None,
}


@dataclasses.dataclass(frozen=True)
class ProfileFits:
    """What a profile file says to fit its costs to (configs/hardware/*.py): a kernel table,
    calibration runs and the costs they fit, models with their own run, runs held out of the
    fit, the suites it is validated on. The costs themselves are hardware.from_config's."""

    kernel_benchmarks: str | None = None  # a kernel table (kernel_table.py)
    kernel_fit: tuple[str, ...] | None = None  # the costs fitted to it (None: its default)
    kernel_dtype: str = "float32"
    price_measured: bool = False  # a step's kernels of the table's layers at their times
    calibration: CalibrationRun | None = None  # the one run compute_efficiency is set from
    calibration_runs: tuple[CalibrationRun, ...] = ()
    fit: tuple[str, ...] = ("compute_efficiency",)  # the costs fitted to calibration_runs
    calibrations: tuple[CalibrationRun, ...] = ()  # models priced at their own efficiency
    calibration_candidates: tuple[CalibrationRun, ...] = ()  # never fitted: --validate's
    validation: tuple[str, ...] = ()  # suite files --validate checks the profile on

    @classmethod
    def of_record(cls, c: Any) -> ProfileFits:
        """From a profile's ConfigDict, dict or object; a key given as None takes its default."""
        get = c.get if hasattr(c, "get") else (lambda k, d=None: getattr(c, k, d))
        runs = lambda key: tuple(CalibrationRun.of_record(r) for r in get(key) or ())
        return cls(
            kernel_benchmarks=get("kernel_benchmarks") or None,
            kernel_fit=tuple(get("kernel_fit")) if get("kernel_fit") else None,
            kernel_dtype=str(get("kernel_dtype") or "float32"),
            price_measured=bool(get("price_measured", False)),
            calibration=CalibrationRun.of_record(get("calibration"))
            if get("calibration")
            else None,
            calibration_runs=runs("calibration_runs"),
            fit=tuple(get("fit") or ("compute_efficiency",)),
            calibrations=runs("calibrations"),
            calibration_candidates=runs("calibration_candidates"),
            validation=tuple(get("validation") or ()),
        )
