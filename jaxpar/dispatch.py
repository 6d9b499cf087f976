"""Bound the computations in flight on simulated CPU devices.

XLA's CPU runtime (JAX 0.10.2) aborts the process ("Termination timeout for 'all reduce' ...
Expected 8 threads to join the rendezvous") when more than about 32 computations that contain
collectives are queued on simulated devices. Asynchronous dispatch queues them freely: an
evaluation over 10,000 images or a pipeline step with many micro-batches dispatches hundreds.
`InFlight` keeps a sliding window: once more than `limit` results are pending, it waits for the
oldest. Later work stays queued behind it, so dispatch still runs ahead of the devices (the
one-step-behind overlap is kept). On GPUs and TPUs there is no limit and nothing waits.
"""

from __future__ import annotations

import collections
import os
from typing import Any

import jax

CPU_LIMIT = 16  # aborts were seen at a queue depth of 64 and above, never at 2 to 32


def default_limit() -> int:
    """Computations allowed in flight: CPU_LIMIT on the CPU backend, unbounded (0) elsewhere.

    `JAXPAR_MAX_IN_FLIGHT` overrides it (0 = unbounded)."""
    env = os.environ.get("JAXPAR_MAX_IN_FLIGHT")
    if env:
        return int(env)
    return CPU_LIMIT if jax.default_backend() == "cpu" else 0


class InFlight:
    """A sliding window over dispatched results: `add` waits for the oldest beyond `limit`."""

    def __init__(self, limit: int | None = None):
        self.limit = default_limit() if limit is None else limit
        self._pending: collections.deque = collections.deque()
        self.waits = 0  # how often the window made the host wait (for tests and curiosity)

    def add(self, result: Any) -> Any:
        """Register one dispatched computation's output; returns it unchanged."""
        if self.limit:
            self._pending.append(result)
            while len(self._pending) > self.limit:
                _wait(self._pending.popleft())
                self.waits += 1
        return result

    def drain(self) -> None:
        """Wait for everything registered (e.g. before timing or host reads)."""
        while self._pending:
            _wait(self._pending.popleft())


def _wait(tree: Any) -> None:
    """Block on every live array of `tree`. An array donated to a later computation is gone;
    that computation is in the window itself, so skipping it loses no bound."""
    for leaf in jax.tree.leaves(tree):
        if isinstance(leaf, jax.Array) and not leaf.is_deleted():
            try:
                leaf.block_until_ready()
            except jax.errors.JaxRuntimeError as e:  # donated after the is_deleted check
                if "deleted or donated" not in str(e):
                    raise
