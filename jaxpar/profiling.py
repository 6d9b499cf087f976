"""`--profile`: a JAX profiler trace of a few training steps after warm-up.

The trace lands in WORKDIR/profile. Open it with TensorBoard's profile plugin
(`tensorboard --logdir WORKDIR/profile`) or drop `plugins/profile/*/*.trace.json.gz` onto
https://ui.perfetto.dev: one track per device with compute, collectives and pipeline stages.
"""

from __future__ import annotations

import logging
import os

import jax

logger = logging.getLogger(__name__)
PROFILE_STEPS = 3  # steps recorded by --profile


class StepTrace:
    """A JAX profiler trace of PROFILE_STEPS steps from step `first` (after warm-up) into
    WORKDIR/profile; open it with TensorBoard's profile plugin or ui.perfetto.dev."""

    def __init__(self, workdir: str, first: int, total: int, enabled: bool):
        self.dir = os.path.join(workdir, "profile")
        self.first = max(0, min(first, total - PROFILE_STEPS))
        self.last = min(self.first + PROFILE_STEPS, total) - 1
        self.enabled, self.on = enabled, False

    def before(self, i: int, state) -> None:
        if self.enabled and i == self.first:
            jax.block_until_ready(state)  # start on an idle device: only these steps recorded
            jax.profiler.start_trace(self.dir)
            self.on = True

    def after(self, i: int, outputs) -> None:
        if self.on and i == self.last:
            jax.block_until_ready(outputs)
            self.stop()

    def stop(self) -> None:
        if self.on:
            jax.profiler.stop_trace()
            self.on = False
            logger.info(f"profiler trace of steps {self.first + 1}-{self.last + 1}: {self.dir}")
