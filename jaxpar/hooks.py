"""What the training loop does between steps, one small object a job (after Levanter's hooks).

The loop (`trainer.py`) dispatches a step, hands its outputs to the `StepTimer` and the
`LogWindow`, then runs the hooks registered with `Hooks.add_hook(fn, every=N)`: the log line
with its divergence check, the periodic evaluation and the checkpoint save. Each hook gets a
`StepInfo` and owns its own decision, its own output and its own watchdog beats; work that
is not a step (an evaluation, a save) runs `off_clock`, out of the step times and the rate.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np

from jaxpar import console, units
from jaxpar import metrics as metrics_lib
from jaxpar import noise_scale as noise_lib
from jaxpar import watchdog as watchdog_lib
from jaxpar.adapted_rate import AdaptedRate
from jaxpar.checkpoint import Checkpointer
from jaxpar.data.prefetch import InputStats
from jaxpar.divergence import all_finite, diverged, stop_if_diverged

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class StepInfo:
    """What a hook sees after a step: `step` steps are done, `state` is the state after them."""

    step: int
    state: Any
    final: bool  # the run's last step
    stopping: bool  # a stop was requested and agreed on: the run ends after this step


class Hooks:
    """Callables run after steps, in the order they were added."""

    def __init__(self) -> None:
        self._hooks: list[tuple[int, Callable[[StepInfo], None]]] = []

    def add_hook(self, fn: Callable[[StepInfo], None], every: int = 1) -> None:
        """Run `fn` after every `every`-th step and after the last one (`every=0`: only after
        the last, as `eval_every_steps=0` means)."""
        self._hooks.append((every, fn))

    def run(self, info: StepInfo) -> None:
        for every, fn in self._hooks:
            if info.final or (every and info.step % every == 0):
                fn(info)


class StepTimer:
    """Step times without stalling the device (docs/config.md, "Metrics"): once step s is dispatched,
    wait for step s-1, beat the watchdog and time it. `off_clock` work is in no step time."""

    def __init__(self, watch: watchdog_lib.Watchdog):
        self.watch = watch
        self.times: list[float] = []  # seconds between consecutive step ends
        self.excluded_s = 0.0  # time spent off the clock so far
        self._pending = None  # the outputs of the step in flight
        self._last_done: float | None = None

    def dispatched(self, step: int, outputs: Any) -> None:
        """Step `step` was dispatched and returns `outputs`: wait for the step before it."""
        if self._pending is not None:
            jax.block_until_ready(self._pending)
            self.watch.beat(f"step {step - 1}")
            now = time.perf_counter()
            if self._last_done is not None:
                self.times.append(now - self._last_done)
            self._last_done = now
        self._pending = outputs

    @contextlib.contextmanager
    def off_clock(self) -> Iterator[None]:
        """Work between steps: left out of the step times and the logged images/sec."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.excluded_s += time.perf_counter() - t0
            # no step time spans this work: timing starts again after the next step's end
            self._pending, self._last_done = None, None


class LogWindow:
    """The steps since the last log line. As a hook it writes the train line (mean loss and
    accuracy over the window, the learning rate, images/sec and, given the Prefetcher's
    `feed`, the mean host time per batch and the mean wait for it) and the console line, and
    stops a run whose loss is not finite: the losses are read then anyway, so divergence costs
    no extra host sync."""

    def __init__(
        self,
        writer: metrics_lib.MetricWriter,
        progress: console.Progress | None,
        schedule: Callable,
        batch_size: int,
        timer: StepTimer,
        ckpt: Checkpointer | None,
        feed: InputStats | None = None,
        noise: noise_lib.NoiseScale | None = None,
    ):
        self.writer, self.progress, self.schedule = writer, progress, schedule
        self.batch_size, self.timer, self.ckpt, self.feed = batch_size, timer, ckpt, feed
        self.noise = noise  # given: each step's "noise" line, and the smoothed figure shown
        self.adapted = AdaptedRate()  # an adapting rate's gain and progress, when the step has them
        self.last: dict[str, float] = {}  # the last train line
        self._restart()

    def _restart(self) -> None:
        self.metrics: list[Any] = []
        self._t0, self._excluded0 = time.perf_counter(), self.timer.excluded_s
        self._fed0 = len(self.feed.waited) if self.feed is not None else 0

    def add(self, metrics: Any) -> None:
        self.metrics.append(metrics)

    def log(self, info: StepInfo) -> None:
        jax.block_until_ready(self.metrics[-1])
        self.timer.watch.beat(f"step {info.step}")
        seconds = time.perf_counter() - self._t0 - (self.timer.excluded_s - self._excluded0)
        fetched = jax.device_get(self.metrics)
        # an adapting rate reports the rate it applied; else the schedule's at the step
        rate = fetched[-1].get("learning_rate", self.schedule(info.step - 1))
        self.last = {
            "loss": float(np.mean([m["loss"] for m in fetched])),
            "accuracy": float(np.mean([m["accuracy"] for m in fetched])),
            "learning_rate": float(rate),
            "images_per_sec": len(fetched) * self.batch_size / seconds,
            **self._input(),
            **self._noise(fetched, info.step),
        }
        self.writer.write(info.step, "train", **self.last)
        if self.progress is not None:
            shown = {"img/s": self.last["images_per_sec"]}
            if "input_s_per_step" in self.last:  # host time per batch, and the wait for it
                shown.update(
                    input=units.seconds(self.last["input_s_per_step"]),
                    wait=units.seconds(self.last["input_wait_s_per_step"]),
                )
            if self.last.get("noise_scale") is not None:
                shown["B_noise"] = f"{self.last['noise_scale']:.0f}"
            lr = units.rate(self.last["learning_rate"])
            position = info.step
            if "gain" in self.last:  # the bar counts progress; the step and gain beside it
                position = self.last["progress"]
                shown = {"step": info.step, "gain": self.last["gain"], **shown}
            self.progress.update(position, loss=self.last["loss"], lr=lr, **shown)
        stop_if_diverged(fetched, info.step, self.ckpt)
        self._restart()

    def _noise(self, fetched: list[dict], step: int) -> dict[str, float]:
        """Each of the window's steps' noise-scale line (metrics.jsonl "noise", TensorBoard);
        the smoothed B_simple after the last for the train line."""
        if self.noise is None or "grad_sq_small" not in fetched[-1]:
            return {}
        first = step - len(fetched) + 1
        shown = {}
        for j, m in enumerate(fetched):
            record = self.noise.add(first + j, float(m["grad_sq_small"]), float(m["grad_sq_big"]))
            if "gain" in m:
                shown = self.adapted.add(first + j, float(m["gain"]), float(m["progress"]))
                record.update(shown)
            self.writer.write(first + j, "noise", **record)
        return {"noise_scale": record["noise_scale"], **shown}

    def _input(self) -> dict[str, float]:
        """Mean host seconds per batch and mean wait for it, over the batches the window's
        steps took from the Prefetcher (none for the first step, whose batch was made before
        the compile)."""
        if self.feed is None or not (waited := self.feed.waited[self._fed0 :]):
            return {}
        made = self.feed.made[self._fed0 : self._fed0 + len(waited)]
        return {
            "input_s_per_step": float(np.mean([m + p for m, p in made])),
            "input_wait_s_per_step": float(np.mean(waited)),
        }

    def check_finite(self, step: int) -> None:
        """Raise TrainingError if a loss of the steps not logged yet is not finite."""
        stop_if_diverged(jax.device_get(self.metrics), step, self.ckpt)


class Evaluation:
    """Evaluates the state (`evaluate(state)`), writes the eval line and logs it."""

    def __init__(
        self,
        evaluate: Callable[[Any], dict[str, float]],
        writer: metrics_lib.MetricWriter,
        timer: StepTimer,
        target=None,
        clock: Callable[[], float] | None = None,
    ):
        self.evaluate, self.writer, self.timer = evaluate, writer, timer
        self.last: dict[str, float] = {}  # the last evaluation
        # given: each evaluation is checked against the target (target.Target), with the
        # training seconds so far (`clock`, once the step evaluated has finished)
        self.target, self.clock = target, clock
        self.seconds, self.count = 0.0, 0  # what the evaluations cost, and how many ran
        self.reached_now = False  # this evaluation reached the target for the first time

    def __call__(self, info: StepInfo) -> None:
        trained = None
        if self.target is not None and self.target.wanted:
            jax.block_until_ready(info.state)  # the step is done: its time is training time
            trained = self.clock()
        t0 = time.perf_counter()
        with self.timer.off_clock():
            self.timer.watch.doing(f"evaluating at step {info.step}", compiling=not self.last)
            self.last = self.evaluate(info.state)
            self.writer.write(info.step, "eval", **self.last)
            logger.info(
                f"eval at step {info.step}: loss {self.last['loss']:.4f}  "
                f"accuracy {self.last['accuracy']:.4f}"
            )
        self.seconds += time.perf_counter() - t0
        self.count += 1
        self.reached_now = trained is not None and self.target.check(info.step, self.last, trained)


class Checkpoints:
    """Saves when Orbax's policy says so (every `checkpoint_every_steps`, or the step the
    processes agreed to stop at) and always after the last step or at a stop. A state is saved
    only if it is finite: the losses since the last log line and the parameters are checked
    first. At a stop the save is waited for, so that the line saying it was saved is true
    (`Checkpointer.saved_step`; preemption.Preemption.stopped_line)."""

    def __init__(
        self,
        ckpt: Checkpointer,
        canonical: Callable,
        schedule_meta: dict,
        window: LogWindow,
        timer: StepTimer,
        position: Callable[[int], dict] | None = None,
    ):
        self.ckpt, self.canonical, self.schedule_meta = ckpt, canonical, schedule_meta
        self.window, self.timer = window, timer
        # what the checkpoint of a step records of the run's position (examples taken, ...)
        self.position = position or (lambda step: {})

    def __call__(self, info: StepInfo) -> None:
        step = info.step
        if not self.ckpt.due(step, force=info.final or info.stopping):
            return
        with self.timer.off_clock():
            self.timer.watch.doing(f"saving the checkpoint of step {step}", compiling=True)
            self.window.check_finite(step)
            canonical = self.canonical(info.state)
            if not all_finite((canonical.params, canonical.batch_stats)):
                raise diverged(step, "the parameters", self.ckpt)
            self.ckpt.save(step, canonical, self.schedule_meta, self.position(step))
            if info.stopping and not info.final:  # the run ends here: say so once it is on disk
                self.ckpt.wait()
            self.timer.watch.beat(f"the checkpoint of step {step}")
