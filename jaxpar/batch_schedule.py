"""A run whose batch (batch_schedule=goodput) and mesh (mesh_schedule=goodput) follow the
measured noise: every `goodput.every_steps` steps the loop asks `Schedule.decide` which setup
makes the most progress per second now (jaxpar/target/goodput.py), and moves the run there.

The candidates are the global batches of `goodput.batches` (by default lr_base_batch_size
x 1/4 .. x 32 in powers of two) on the config's mesh, or on each of `goodput.meshes` as well,
each batch cut into accumulation slices of at most `goodput.max_device_rows` rows per device
(the memory bound; on a pipeline, micro-batches of at most that many), less those a mesh
cannot run (the config's own checks say which). A setup's step time is measured on its first
use (the median of its warm steps); before that it is fitted over the batches its mesh has
run, or guessed so that the schedule tries one neighbour at a time (goodput.StepTimes).

The learning rate follows by AdaScale (lr_adaptation=adascale is required): a batch change
is a change of scale, and the progress carries on. The run's position in the data, its phase
and the measured step times go into each checkpoint, so that a resumed run continues where
and how the schedule left it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from jaxpar import axes, configfile, parallel
from jaxpar import mesh as mesh_lib
from jaxpar.errors import ConfigError
from jaxpar.run_spec import DEFAULTS
from jaxpar.target import goodput

MODES = ("fixed", "goodput")
WARM_STEPS = 2  # steps of a phase left out of its step time (compile, caches)


def wanted(config) -> bool:
    """Whether the run's batch or mesh follows goodput."""
    return "goodput" in (
        config.get("batch_schedule", DEFAULTS.batch_schedule),
        config.get("mesh_schedule", DEFAULTS.mesh_schedule),
    )


def check(config) -> None:
    """One-line refusals of the schedule's keys, before anything is built."""
    for key in ("batch_schedule", "mesh_schedule"):
        value = config.get(key, DEFAULTS[key])
        if value not in MODES:
            raise ConfigError(f"unknown {key} {value!r}; choose one of {', '.join(MODES)}")
    if not wanted(config):
        return
    if config.get("lr_adaptation", DEFAULTS.lr_adaptation) != "adascale":
        raise ConfigError(
            "a goodput schedule changes the batch, and the rate follows by AdaScale: add "
            "--config.lr_adaptation=adascale"
        )
    every, log = config.goodput.every_steps, config.log_every_steps
    if every <= WARM_STEPS or every % log:
        raise ConfigError(
            f"goodput.every_steps={every} must be above {WARM_STEPS} and a multiple of "
            f"log_every_steps={log} (a decision reads the noise scale of the last log line)"
        )
    if config.goodput.max_device_rows < 1:
        raise ConfigError("goodput.max_device_rows must be >= 1")
    if (
        config.get("mesh_schedule", DEFAULTS.mesh_schedule) == "goodput"
        and len(config.goodput.meshes) < 2
    ):
        raise ConfigError(
            "mesh_schedule=goodput moves between the meshes of goodput.meshes: name two or "
            "more, e.g. --config.goodput.meshes='((8,1,1),(2,1,4))'"
        )


def setup_of(config) -> goodput.Setup:
    """The setup a config runs."""
    shape = tuple(int(s) for s in config.mesh_shape)
    return goodput.Setup(int(config.global_batch_size), shape, int(config.grad_accum_steps))


def changes(setup: goodput.Setup) -> dict[str, Any]:
    """The config keys that run `setup`."""
    return {
        "global_batch_size": setup.batch,
        "mesh_shape": setup.mesh_shape,
        "grad_accum_steps": setup.accum,
    }


def candidates(config, num_devices: int) -> list[goodput.Setup]:
    """Every setup the schedule may move to, checked as a run of it would be."""
    meshes = [tuple(config.mesh_shape)]
    if config.get("mesh_schedule", DEFAULTS.mesh_schedule) == "goodput":
        meshes = [tuple(m) for m in config.goodput.meshes]
    base = int(config.lr_base_batch_size)
    batches = config.goodput.batches or tuple(
        int(base * 2.0**k) for k in range(-2, 6) if base * 2.0**k >= 1
    )
    out = []
    for shape in meshes:
        names = mesh_lib.axis_names(config)
        sizes = dict(zip(names, mesh_lib.resolve_shape(shape, num_devices), strict=True))
        replicas = axes.num_replicas(sizes)
        for batch in sorted(set(batches)):
            if batch % replicas:
                continue
            rows, most = batch // replicas, int(config.goodput.max_device_rows)
            if axes.num_stages(sizes) > 1:  # a pipeline's slices are its micro-batches
                if rows > most * max(int(config.pipeline.num_microbatches), 1):
                    continue
                accum = 1
            else:  # one replica measures the noise between its slices: at least two
                accum = _slices(rows, most if replicas > 1 or rows < 2 else min(most, rows // 2))
            setup = goodput.Setup(int(batch), tuple(sizes.values()), accum)
            trial = configfile.override(config.copy_and_resolve_references(), changes(setup))
            try:
                parallel.validate(trial, num_devices)
            except ConfigError:
                continue
            out.append(setup)
    if not out:
        raise ConfigError(
            "the goodput schedule has no batch its meshes can run; give goodput.batches "
            "divisible by the replicas"
        )
    return out


def _slices(rows: int, most: int) -> int:
    """The fewest equal slices of `rows` of at most `most` rows each (rows itself at worst)."""
    need = math.ceil(rows / most)
    return next(k for k in range(need, rows + 1) if rows % k == 0)


@dataclasses.dataclass
class Schedule:
    """The schedule of one run: its candidates, what their steps have taken, its phases."""

    candidates: list[goodput.Setup]
    base_batch: int
    every: int
    phases: list[tuple[int, goodput.Setup]]  # (steps done when it took over, setup)
    times: goodput.StepTimes = dataclasses.field(default_factory=goodput.StepTimes)
    first_time: int = 0  # the phase's first step time in the loop's list

    @classmethod
    def of(cls, config, num_devices: int, start: int, meta: dict | None = None) -> Schedule:
        """The run's schedule, continued from a checkpoint's record (`meta`) on a resume."""
        record = (meta or {}).get("goodput") or {}
        phases = [(int(step), _setup(fields)) for step, fields in record.get("phases", [])]
        schedule = cls(
            candidates(config, num_devices),
            int(config.lr_base_batch_size),
            int(config.goodput.every_steps),
            phases or [(start, setup_of(config))],
        )
        for measured in record.get("measured_step_s", []):
            schedule.times.measured[_setup(measured["setup"])] = float(measured["seconds"])
        return schedule

    @property
    def current(self) -> goodput.Setup:
        return self.phases[-1][1]

    def due(self, step: int) -> bool:
        return step % self.every == 0

    def decide(
        self, step: int, noise_scale: float, step_times: list[float]
    ) -> goodput.Choice | None:
        """The best setup after `step` at this noise scale, the current phase's step times
        recorded first (`step_times`: the loop's, from the run's start); None while the noise
        scale is not settled (no positive |G|^2 estimate yet: every batch would look like pure noise), or
        while the current setup has no timed step (the step timer leaves out every step that
        follows an evaluation)."""
        warm = step_times[self.first_time + WARM_STEPS :]
        if warm:
            self.times.record(self.current, warm)
        if not (math.isfinite(noise_scale) and noise_scale > 0):
            return None
        if self.times.estimate(self.current, self.candidates, self.current) is None:
            return None  # no timed step in this phase yet (evaluations between all of them)
        return goodput.choose(
            self.candidates, self.times, self.base_batch, noise_scale, self.current
        )

    def moved(self, step: int, setup: goodput.Setup, timed: int) -> None:
        """The run moved to `setup` after `step` steps; `timed`: step times so far."""
        self.phases.append((step, setup))
        self.first_time = timed

    def record(self) -> dict[str, Any]:
        """What a checkpoint keeps of the schedule: its phases and measured step times."""
        return {
            "phases": [[step, _fields(s)] for step, s in self.phases],
            "measured_step_s": [
                {"setup": _fields(s), "seconds": t} for s, t in sorted(self.times.measured.items())
            ],
        }


def _fields(setup: goodput.Setup) -> dict[str, Any]:
    return {"batch": setup.batch, "mesh_shape": list(setup.mesh_shape), "accum": setup.accum}


def _setup(fields: dict[str, Any]) -> goodput.Setup:
    return goodput.Setup(int(fields["batch"]), tuple(fields["mesh_shape"]), int(fields["accum"]))


def resumed_phase(meta: dict) -> goodput.Setup | None:
    """The setup a checkpoint's run was on (None for a checkpoint without a schedule)."""
    phases = (meta.get("goodput") or {}).get("phases")
    return _setup(phases[-1][1]) if phases else None
