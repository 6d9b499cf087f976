"""Stop requests: SIGTERM (preemption) and Ctrl-C save the current step and end the run.

Several processes must stop after the same step, whichever of them was signalled. There
JAX's preemption sync manager (started by `jax.distributed.initialize`) installs its own
SIGTERM handler and agrees on the step; `check` asks it every step through Orbax's
`reached_preemption` (the same question `CheckpointManager.reached_preemption` and its
preemption save policy ask). Orbax's helper alone does not cover what jaxpar promises:

- In one process there is no sync manager (Orbax's helper then always answers False), so
  SIGTERM and SIGINT are handled here.
- JAX's notifier listens to SIGTERM only, so a Ctrl-C in any process is passed on to it as a
  SIGTERM to this process.
- A second Ctrl-C stops at once, even in a run stuck in a C++ wait; that, and ending a run
  that cannot reach the end of its step within `stop_grace_s`, is the progress watchdog's
  job (jaxpar/watchdog.py), which reads the same signals from its own thread.
"""

from __future__ import annotations

import logging
import os
import signal
import threading

import jax
import orbax.checkpoint as ocp

from jaxpar import watchdog as watchdog_lib

logger = logging.getLogger(__name__)


class Preemption:
    """Turns SIGTERM and SIGINT (Ctrl-C) into a request to checkpoint and stop after the
    current step, from `__enter__` (or construction) until `__exit__`/`restore`. A second
    SIGINT without a watchdog aborts at once (KeyboardInterrupt)."""

    def __init__(self, watch: watchdog_lib.Watchdog | None = None):
        self.watch = watch
        self.asked = False
        self.signal_name = ""
        self._previous: dict = {}
        self.multi = jax.process_count() > 1
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT,) if self.multi else (signal.SIGTERM, signal.SIGINT):
                self._previous[sig] = signal.signal(sig, self._ask)

    def _ask(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.asked and signum == signal.SIGINT:
            if self.watch is None:
                raise KeyboardInterrupt  # second Ctrl-C: stop now
            return  # the watchdog's thread stops the run at once, even a stuck one
        self.asked, self.signal_name = True, name
        if self.multi:  # tell every process, through JAX's preemption notifier
            os.kill(os.getpid(), signal.SIGTERM)
        logger.info(
            f"{name}: finishing this step, then saving a checkpoint and stopping"
            + (" (Ctrl-C again aborts at once)" if signum == signal.SIGINT else "")
        )

    def check(self, step: int) -> bool:
        """Whether to save and stop after `step` (the same answer on every process). Ask it
        after every step, in every process: the processes agree on a step after the notice."""
        if not self.multi:
            stopping = self.asked
        else:
            stopping = ocp.multihost.reached_preemption(step)
            if stopping:
                self.signal_name = self.signal_name or "preemption notice (SIGTERM)"
        if stopping and self.watch is not None:
            self.watch.stopping()  # saving now is progress, not a stall
        return stopping

    def stopped_line(self, step: int, saved) -> str:
        """What the run says when it stops after `step`: which step it saved, if any. `saved`
        is the run's Checkpointer (its `saved_step` and newest checkpoint say what was saved;
        None or False: checkpoints are off), or True where the caller knows `step` was saved."""
        if saved is None or saved is False:
            return (
                f"{self.signal_name}: stopped at step {step} (checkpoints are off, so a rerun "
                "starts again)"
            )
        if saved is True or saved.saved_step == step:
            where = "" if saved is True else f" in {saved.directory}"
            return (
                f"{self.signal_name}: saved the checkpoint of step {step}; stopped. Run the "
                f"same command again to resume from it{where}."
            )
        newest = saved.latest_step()
        resumes = (
            f"a rerun resumes from the checkpoint of step {newest} in {saved.directory}"
            if newest is not None
            else "there is no checkpoint, so a rerun starts again"
        )
        return f"{self.signal_name}: stopped at step {step} without saving it; {resumes}"

    def restore(self) -> None:
        """Put back the signal handlers that were there before."""
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous = {}

    def __enter__(self) -> Preemption:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.restore()
