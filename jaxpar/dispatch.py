"""Bound the computations in flight, at the same points of the program order in every process.

The rule every dispatch loop follows (evaluation, pipeline steps, moves and gathers between
processes, checkpoint gathers): every computation goes through the strategy's one `InFlight`,
`add` where a process dispatched it and `skip` where it did not, so the count is the position
in the global program order in every process; a process waits only for its own results at
least `limit` positions old; a position is at most one computation on any device. On GPUs and
TPUs nothing waits. Why (XLA's CPU client hangs with more than 32 computations queued on a
device) and why each step of the rule: docs/cluster.md, "Why dispatch is bounded".
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

    def settle(self, result: Any) -> Any:
        """Wait for `result` now where the window is bounded (the CPU backend); returns it.
        For a computation that XLA's CPU client runs outside its order of collectives (a move
        across processes whose local part is one device: docs/cluster.md, "Why dispatch is
        bounded")."""
        if self.limit:
            _wait(result)
        return result

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
