"""jaxpar's one logger: what a run tells its user, as plain lines on stdout from process 0.

Modules log through `logging.getLogger(__name__)` (children of the "jaxpar" logger); the
entry points (train, bench, plan) call `setup()` once. INFO lines then print as they are, just
the message on stdout, as `print` would; a process other than 0 of a multi-process run shows
only warnings and errors (the MaxText and big_vision habit: process 0 speaks for the run).
Before `setup()` (a library call from a notebook, say) Python's defaults apply: warnings only.
"""

from __future__ import annotations

import logging
import sys

from jaxpar import jax_internals

ROOT = "jaxpar"


class _Stdout(logging.StreamHandler):
    """A handler on whatever sys.stdout is when a line is written (as `print` does), so a
    redirected or captured stdout gets the line; flushed after each (StreamHandler.emit)."""

    def __init__(self) -> None:
        super().__init__(sys.stdout)

    @property
    def stream(self):
        return sys.stdout

    @stream.setter
    def stream(self, value) -> None:  # StreamHandler sets it; the current stdout wins
        pass


def _process_index() -> int:
    """JAX's process index once its backends have started, else 0. Asking earlier would start
    them (before jax.distributed joins a run, or in the bench's parent process, which never
    starts them)."""
    if "jax" not in sys.modules:
        return 0
    if not jax_internals.backends_started():
        return 0
    import jax

    return jax.process_index()


class _Lead(logging.Filter):
    """Below WARNING, only process 0's records pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or _process_index() == 0


def setup(level: int = logging.INFO) -> logging.Logger:
    """Configure the "jaxpar" logger once: records at `level` and above as plain lines on
    stdout (process 0; other processes warnings and errors only). Not passed on to the root
    logger, so absl's handler does not print them again. Calling it again changes nothing but
    the level."""
    logger = logging.getLogger(ROOT)
    logger.setLevel(level)
    logger.propagate = False
    if not any(isinstance(h, _Stdout) for h in logger.handlers):
        handler = _Stdout()
        handler.setFormatter(logging.Formatter("%(message)s"))
        handler.addFilter(_Lead())
        logger.addHandler(handler)
    return logger
