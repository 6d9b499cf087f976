"""Bound the computations in flight, at the same points of the program order in every process.

Why, as read in XLA's CPU client (jaxlib 0.10.2) and seen in stack dumps of hung runs: every
computation launched on a CPU device first takes one of that device's 32 admission slots
(`max_inflight_computations_semaphore`), and it waits for the slot *on a thread of the client's
pool*, which has max(cores, local devices) threads. A computation with a collective needs one
pool thread per local participant at once. So when more than 32 computations are queued on a
device, pool threads sit on the semaphore, the next collective cannot gather its participants,
and nothing completes again: in one process a 40 s rendezvous timeout aborts the run ("Expected
8 threads to join the rendezvous, but only 7 of them arrived"); across processes (gloo) both
wait forever. Asynchronous dispatch queues freely (an evaluation over 10,000 images, a pipeline
step with many micro-batches), and a loaded machine lets the queue grow, which is why the abort
came and went with other jobs on the cores.

The rule every dispatch loop follows (evaluation, pipeline steps, moves and gathers between
processes, checkpoint gathers):

1. Every computation the loop dispatches goes through the strategy's one `InFlight`: `add` in a
   process that dispatched it, `skip` in every process that did not (another process's stage).
   The number of calls is therefore the position in the global program order, the same in
   every process, whatever each process runs.
2. A process waits only for its own results that are at least `limit` positions old. Every
   process waits at the same points of the global order, and never for a result that needs
   another process to dispatch something it will only dispatch after its own wait: everything
   before that point was dispatched by every process first.
3. A position is at most one computation on any device (a jnp operation counts: fold several
   into one jitted function), so no device ever queues more than `limit` computations of a
   loop. 16 leaves the other half of the 32 slots for work outside the loops (the train step
   in flight, a metrics reduction).

On GPUs and TPUs there is no such limit: positions are still counted, nothing waits.
"""

from __future__ import annotations

import collections
import os
from typing import Any

import jax

CPU_LIMIT = 16  # half of XLA's 32 admission slots per CPU device (see above)


def default_limit() -> int:
    """Positions allowed in flight: CPU_LIMIT on the CPU backend, unbounded (0) elsewhere.

    `JAXPAR_MAX_IN_FLIGHT` overrides it (0 = unbounded)."""
    env = os.environ.get("JAXPAR_MAX_IN_FLIGHT")
    if env:
        return int(env)
    return CPU_LIMIT if jax.default_backend() == "cpu" else 0


class InFlight:
    """A window over the global program order: `add` and `skip` each take one position, and
    `add` waits for this process's results `limit` or more positions old."""

    def __init__(self, limit: int | None = None):
        self.limit = default_limit() if limit is None else limit
        self.position = 0  # computations dispatched so far by all processes together
        self._pending: collections.deque = collections.deque()  # (position, result), ours
        self.waits = 0  # results the window waited for (for tests and curiosity)

    def add(self, result: Any) -> Any:
        """Register one computation this process dispatched; returns `result` unchanged."""
        self.position += 1
        if self.limit:
            self._pending.append((self.position, result))
            self._wait_older_than(self.position - self.limit)
        return result

    def skip(self) -> None:
        """Count one computation that another process dispatched (this one runs no part)."""
        self.position += 1
        if self.limit:
            self._wait_older_than(self.position - self.limit)

    def _wait_older_than(self, position: int) -> None:
        while self._pending and self._pending[0][0] <= position:
            _wait(self._pending.popleft()[1])
            self.waits += 1

    def drain(self) -> None:
        """Wait for everything registered (e.g. before timing or host reads)."""
        while self._pending:
            _wait(self._pending.popleft()[1])


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
