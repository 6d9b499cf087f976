"""How long a run is: `num_train_steps` steps, or, under an adapting rate (AdaScale), that many
steps of progress.

AdaScale's run length is scale-invariant (Johnson et al. 2020): `num_train_steps` is the
steps the schedule would take at `lr_base_batch_size`, and a run at another batch ends at the
first step whose progress (the sum of its gains) reaches it. The steps that takes are known
only as the run goes, so the loop asks `Length.final` after each step. The progress of the
step before is read once its outputs are ready (the loop waits for them anyway to time it);
only when that step plus the largest possible gain could reach the end does the loop wait
for the step just dispatched, so a run pays that wait for its last step or two alone.
"""

from __future__ import annotations

import math
from typing import Any

import jax

from jaxpar import adascale
from jaxpar.run_spec import RunSpec


class Length:
    """The end of a run that started after step `start` with `progress` done (0, or what a
    resumed checkpoint holds)."""

    def __init__(self, spec: RunSpec, start: int, progress: float = 0.0):
        self.adaptive = spec.rate.adaptation != "none"
        self.total = spec.train_steps  # steps, or progress when adaptive
        self.base = spec.rate.base_batch
        self.progress = progress  # after the last step whose outputs were read
        self.rebase(start, spec.batches.global_size)

    def rebase(self, step: int, batch: int) -> None:
        """From `step` on the run's batch is `batch` (a goodput schedule moved it)."""
        scale = batch / self.base
        # every gain lies between min(1, S) and max(1, S) (jaxpar/gain.py)
        self.max_gain, self.min_gain = max(1.0, scale), min(1.0, scale)
        # the most steps the run can take: at the smallest gain every step
        left = max(self.total - self.progress, 0.0)
        self.max_steps = step + math.ceil(left / self.min_gain) if self.adaptive else self.total

    def done(self, step: int) -> bool:
        """Whether a run at `step` with `progress` (a restored one) has nothing left."""
        return self.progress >= self.total if self.adaptive else step >= self.total

    def final(self, step: int, metrics: Any, previous: Any) -> bool:
        """Whether `step` (dispatched, its `metrics` maybe still computing) ends the run;
        `previous`: the metrics of the step before, already computed, or None."""
        if not self.adaptive:
            return step >= self.total
        if previous is not None:
            self.progress = float(previous["progress"])
        if self.progress + self.max_gain < self.total and step < self.max_steps:
            return False
        self.progress = float(jax.device_get(metrics["progress"]))
        return self.progress >= self.total or step >= self.max_steps


def restored_progress(host_state) -> float:
    """The progress a restored canonical state has made (0 without an adapting rate)."""
    found = adascale.find(host_state.opt_state)
    return 0.0 if found is None else float(found.progress)
