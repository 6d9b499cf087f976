"""The one timer of the predictor's measurements: a call repeated for a time budget, its results
waited for, wall seconds and CPU seconds per call.

A call is a function of no arguments that dispatches some work and returns what to wait for
(an array, a tuple of them, or None where the work is done when it returns); a call that
carries a state (a donated buffer, a training state) keeps it in its closure. `measure` calls it
once or more to compile and warm up, once more waited for to size the repeats, then `repeats`
times `calls` calls. `window` says how many calls may be in flight: 0 waits for each (and times
each alone: `Timing.each`), n waits for the call n back, None only for the last of a repeat (the
host's dispatch overlaps the device's work, as a trainer dispatches).
"""

from __future__ import annotations

import collections
import dataclasses
import statistics
import time
from collections.abc import Callable
from typing import Any

MAX_CALLS = 200_000  # a repeat's calls, at most


@dataclasses.dataclass(frozen=True)
class Timing:
    """One measurement: per repeat, seconds per call (wall, process CPU of every thread, CPU of
    the calling thread while it dispatched), and each call's wall seconds where each was
    waited for."""

    calls: int  # a repeat's
    wall: tuple[float, ...]
    cpu: tuple[float, ...]
    thread: tuple[float, ...]
    each: tuple[float, ...] = ()

    @property
    def best(self) -> float:
        """Wall seconds per call of the fastest repeat."""
        return min(self.wall)

    @property
    def fastest(self) -> float:
        """The least disturbed call's wall seconds (other jobs share these cores); the best
        repeat's mean where calls were not timed alone."""
        return min(self.each) if self.each else self.best

    @property
    def median(self) -> float:
        """The median call's (or repeat's) wall seconds."""
        return statistics.median(self.each or self.wall)

    @property
    def cpu_s(self) -> float:
        """Process CPU seconds per call over every repeat."""
        return statistics.fmean(self.cpu)

    @property
    def thread_s(self) -> float:
        """The calling thread's CPU seconds per call while dispatching, the least repeat's."""
        return min(self.thread)


def wait(out: Any) -> None:
    """Block until `out` (arrays, a tree of them, or None) is computed."""
    if out is not None:
        import jax

        jax.block_until_ready(out)


def carrying(step: Callable, state: Any, *args: Any) -> Callable[[], Any]:
    """A call of `step(state, *args) -> (state, anything)` (a training step) that carries the
    state from call to call (a donated state is written in place) and returns it."""
    held = [state]

    def call() -> Any:
        held[0], _ = step(held[0], *args)
        return held[0]

    return call


def measure(
    call: Callable[[], Any],
    seconds: float,
    *,
    repeats: int = 1,
    min_calls: int = 1,
    calls: int | None = None,
    window: int | None = 0,
    warmup: int = 1,
) -> Timing:
    """Time `call` (see the module's docstring): `repeats` repeats of `calls` calls each (by
    default as many as fill seconds / repeats at the warmed-up call's time, at least
    `min_calls`), at most `window` calls in flight (None: waited for at the end only)."""
    for _ in range(warmup):
        wait(call())
    if calls is None:
        start = time.perf_counter()
        wait(call())
        once = max(time.perf_counter() - start, 1e-7)
        calls = max(min_calls, min(MAX_CALLS, int(seconds / repeats / once)))
    walls, cpus, threads, each = [], [], [], []
    for _ in range(repeats):
        pending: collections.deque = collections.deque()
        wall, cpu, thread = time.perf_counter(), time.process_time(), time.thread_time()
        for _ in range(calls):
            t = time.perf_counter()
            pending.append(call())
            if window == 0:
                wait(pending.pop())
                each.append(time.perf_counter() - t)
            elif window is not None and len(pending) > window:
                wait(pending.popleft())
            elif window is None:  # only the last is waited for: hold no other
                pending = collections.deque([pending.pop()])
        dispatched = time.thread_time() - thread
        while pending:
            wait(pending.popleft())
        walls.append((time.perf_counter() - wall) / calls)
        cpus.append((time.process_time() - cpu) / calls)
        threads.append(dispatched / calls)
    return Timing(calls, tuple(walls), tuple(cpus), tuple(threads), tuple(each))
