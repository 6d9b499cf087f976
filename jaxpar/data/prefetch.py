"""Background prefetch: host batch work and host-to-device copies overlap training.

One daemon thread runs `put(make_batch(step))` ahead of the consumer into a
bounded queue. numpy and the device copy release the GIL, so this runs while
the main thread dispatches and waits on the training step. `InputStats` records what
each batch cost the host and how long the consumer waited for it, so a run can say
whether the input pipeline, not the devices, limits it (metrics.input_pipeline).
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

_POLL_S = 0.05  # How often a blocked thread re-checks for close().


class _Done:
    """Sentinel: the producer finished every step."""


class _Failed:
    """Carries an exception from the producer thread to the consumer."""

    def __init__(self, error: BaseException):
        self.error = error


@dataclasses.dataclass
class InputStats:
    """Host seconds per batch, in step order from the Prefetcher's start step.

    Each list has one writer thread and list.append is atomic, so a reader in another
    thread sees a consistent prefix without a lock; `made[k]` exists once `waited[k]` does
    (a batch is timed before it is queued).
    """

    # Producer thread: (seconds in make_batch, seconds in put) of each batch.
    made: list[tuple[float, float]] = dataclasses.field(default_factory=list)
    # Consumer: seconds next() was blocked before each batch was there.
    waited: list[float] = dataclasses.field(default_factory=list)


class Prefetcher:
    """Iterates `(step, put(make_batch(step)))` for step in [start_step, end_step).

    Exceptions in the thread are re-raised by the consumer's next(). Use as a
    context manager, or call close(), so that leaving the loop early stops the
    thread instead of leaving it blocked on a full queue. `stats` (a new InputStats
    unless given) records each batch's host time and the consumer's wait for it.
    """

    def __init__(
        self,
        make_batch: Callable[[int], dict[str, Any]],
        put: Callable[[dict[str, Any]], Any],
        start_step: int,
        end_step: int,
        depth: int = 2,
        stats: InputStats | None = None,
    ):
        if depth < 1:
            raise ValueError(f"prefetch depth must be >= 1, got {depth}")
        self._make_batch = make_batch
        self._put = put
        self._steps = range(start_step, end_step)
        self.stats = stats if stats is not None else InputStats()
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._finished = False
        self._thread = threading.Thread(target=self._produce, name="jaxpar-prefetch", daemon=True)
        self._thread.start()

    def _offer(self, item: Any) -> bool:
        """Puts `item` unless close() is called first; returns whether it was put."""
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                pass
        return False

    def _timed_batch(self, step: int) -> Any:
        """put(make_batch(step)), each part timed into stats.made before the batch is queued."""
        t0 = time.perf_counter()
        batch = self._make_batch(step)
        t1 = time.perf_counter()
        placed = self._put(batch)
        self.stats.made.append((t1 - t0, time.perf_counter() - t1))
        return placed

    def _produce(self) -> None:
        try:
            for step in self._steps:
                if self._stop.is_set():
                    return
                if not self._offer((step, self._timed_batch(step))):
                    return
        except BaseException as e:  # noqa: BLE001 - handed to the consumer.
            self._offer(_Failed(e))
            return
        self._offer(_Done())

    def __iter__(self) -> Iterator[tuple[int, Any]]:
        return self

    def __next__(self) -> tuple[int, Any]:
        if self._finished:
            raise StopIteration
        t0 = time.perf_counter()
        while True:
            try:
                item = self._queue.get(timeout=_POLL_S)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():
                    self._finished = True  # Closed, or the thread died without a word.
                    raise StopIteration from None
        if isinstance(item, _Done):
            self._finished = True
            raise StopIteration
        if isinstance(item, _Failed):
            self.close()
            raise item.error
        self.stats.waited.append(time.perf_counter() - t0)
        return item

    def close(self, timeout: float | None = 10.0) -> None:
        """Stops the thread (after its current batch) and drops queued batches."""
        self._finished = True
        self._stop.set()
        self._drain()
        self._thread.join(timeout)
        self._drain()

    def _drain(self) -> None:
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                return

    def __enter__(self) -> Prefetcher:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
